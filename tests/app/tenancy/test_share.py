"""Keys' shares of the gateway's capacity while they contend."""

from __future__ import annotations

from app.tenancy.share import FairShare


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_a_key_alone_may_use_everything() -> None:
    share = FairShare(clock=Clock())
    for load in range(10):
        assert not share.over_share("be", "a", load, 10)
        share.take("be", "a")


def test_a_key_filling_the_gateway_is_held_to_its_share_once_another_asks() -> None:
    clock = Clock()
    share = FairShare(active_s=10, clock=clock)
    for _ in range(10):
        share.take("be", "a")
    assert share.over_share("be", "b", 10, 10) is False  # b holds nothing: below its share
    # b was refused by the full gateway; a's next asks are over its share (5 of 10)
    assert share.over_share("be", "a", 10, 10)
    for _ in range(5):
        share.give("be", "a")
    assert share.over_share("be", "a", 5, 10)  # still at its share: 5 >= ceil(10 / 2)
    share.give("be", "a")
    assert not share.over_share("be", "a", 4, 10)
    # b went away: after active_s, a may fill the gateway again
    clock.t += 11
    for _ in range(5):
        share.take("be", "a")
    assert not share.over_share("be", "a", 9, 10)


def test_below_contention_nobody_is_refused() -> None:
    share = FairShare(contended_at=0.5, clock=Clock())
    for _ in range(4):
        share.take("be", "a")
    share.over_share("be", "b", 0, 10)
    assert not share.over_share("be", "a", 4, 10)  # 4 of 10: not contended


def test_shares_are_per_backend() -> None:
    share = FairShare(clock=Clock())
    for _ in range(10):
        share.take("be", "a")
    share.over_share("be", "b", 10, 10)
    assert share.over_share("be", "a", 10, 10)
    assert not share.over_share("other", "a", 9, 10)  # nobody else wants `other`


def test_keys_that_left_are_forgotten() -> None:
    clock = Clock()
    share = FairShare(active_s=1, clock=clock)
    for i in range(1000):
        share.over_share("be", f"k{i}", 9, 10)
    clock.t += 5
    share.over_share("be", "x", 9, 10)
    assert len(share._asked) == 1
    assert share.held == {}
