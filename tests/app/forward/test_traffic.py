"""What arrivals meet: a closed loop of one stays alone, a burst is remembered."""

from __future__ import annotations

from app.forward.traffic import Traffic


class Clock:
    t = 0.0

    def __call__(self) -> float:
        return self.t


def test_one_client_at_a_time_is_always_priced_alone() -> None:
    clock = Clock()
    traffic = Traffic(clock=clock)
    for i in range(100):
        clock.t = i * 0.5
        assert traffic.expect({"large": 0, "small": 0}) == {"large": 0, "small": 0}


def test_a_burst_after_a_short_pause_meets_the_batch_it_had() -> None:
    clock = Clock()
    traffic = Traffic(clock=clock)
    for i in range(200):  # eight clients: each arrival meets ~7 on the large model
        clock.t = i * 0.01
        traffic.expect({"large": 7})
    clock.t += 1.0  # a pause; the next burst's first request finds the GPU idle
    assert traffic.expect({"large": 0}, arriving=False)["large"] >= 3
    clock.t += 30.0  # long quiet: forgotten
    assert traffic.expect({"large": 0}) == {"large": 0}


def test_the_instant_count_wins_when_larger_and_dry_runs_record_nothing() -> None:
    clock = Clock()
    traffic = Traffic(clock=clock)
    assert traffic.expect({"small": 5}, arriving=False) == {"small": 5}
    assert traffic.expect({}, arriving=False) == {}
