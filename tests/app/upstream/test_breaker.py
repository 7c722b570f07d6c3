"""The circuit breaker's states, driven by request and probe outcomes."""

from __future__ import annotations

from app.upstream.breaker import Breaker


def test_one_failure_never_opens_it() -> None:
    b = Breaker(threshold=3)
    b.failure(0.0)
    b.failure(0.1)
    assert b.state == "closed" and b.available(0.2)
    b.success()
    b.failure(0.3)
    b.failure(0.4)
    assert b.state == "closed"  # consecutive failures only


def test_opens_then_half_open_trial_closes_it() -> None:
    b = Breaker(threshold=3, base_cooldown_s=2.0)
    for t in (0.0, 0.1, 0.2):
        b.failure(t)
    assert b.state == "open" and not b.available(1.0)
    assert b.retry_after_s(1.0) >= 1.0
    assert b.available(2.3) and b.state == "half_open"
    b.take()
    assert not b.available(2.4)  # one trial at a time
    b.success()
    assert b.state == "closed" and b.available(2.5)


def test_failed_trial_doubles_the_cooldown() -> None:
    b = Breaker(threshold=1, base_cooldown_s=2.0, max_cooldown_s=5.0)
    b.failure(0.0)
    assert b.available(2.0)
    b.take()
    b.failure(2.0)
    assert b.state == "open" and b.cooldown_s == 4.0
    assert not b.available(5.0) and b.available(6.0)
    b.take()
    b.failure(6.0)
    assert b.cooldown_s == 5.0  # capped


def test_failing_probes_eject_a_hung_replica_until_it_answers() -> None:
    b = Breaker(probe_threshold=2, base_cooldown_s=1.0)
    b.probe(False, 0.0)
    assert b.available(0.1)
    b.probe(False, 1.0)
    assert b.state == "open"
    assert not b.available(10.0)  # no trial while its probes still fail
    b.probe(True, 11.0)
    assert b.state == "half_open" and b.available(11.0)


def test_answering_probes_do_not_end_a_cooldown_that_requests_began() -> None:
    """A worker that answers its health check but fails requests (garbage)
    waits out its cooldown; one its probes ejected comes back when they answer."""
    b = Breaker(threshold=3, base_cooldown_s=2.0)
    for t in (0.0, 0.1, 0.2):
        b.failure(t)
    b.probe(True, 0.5)
    assert b.state == "open" and not b.available(0.6)
    assert b.available(2.3) and b.state == "half_open"
    hung = Breaker(probe_threshold=2)
    hung.probe(False, 0.0)
    hung.probe(False, 0.1)
    assert hung.state == "open"
    hung.probe(True, 0.2)
    assert hung.state == "half_open"
