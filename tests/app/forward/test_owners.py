"""The recent energy ids' owners (GET /v1/energy): bounded, oldest dropped first."""

from __future__ import annotations

from collections import OrderedDict

from app.forward.exchange import remember


def test_owners_keep_the_newest_up_to_the_limit() -> None:
    owners: OrderedDict[str, str] = OrderedDict()
    for i in range(10):
        remember(owners, f"w{i}", f"k{i % 3}", limit=4)
    assert list(owners.items()) == [("w6", "k0"), ("w7", "k1"), ("w8", "k2"), ("w9", "k0")]


def test_owners_stay_bounded_through_many_requests() -> None:
    owners: OrderedDict[str, str] = OrderedDict()
    for i in range(50_000):
        remember(owners, f"w{i}", "k", limit=1_000)
    assert len(owners) == 1_000 and next(iter(owners)) == "w49000"
