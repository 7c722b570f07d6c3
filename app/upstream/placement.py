"""Which replica of a backend takes a request: the one where it adds the
fewest joules, within a latency bound.

A backend's curve (router/curves.py) prices a request at concurrency n as
a + s/n: `a` its own prefill and decode work, `s` the step's weight reads
that the n requests of a batch share. n requests cost n*a + s together, so
one more costs `a` on a replica that is already running a batch and a + s on
an idle one: joining a batch is the cheap place, and spreading a burst evenly
(least outstanding) the dearest. A replica takes at most `max_batch`
(beyond it each token of the batch waits longer) before another is woken,
and, where the backend sets `max_seconds_per_token`, none whose measured
pace at the batch it would have (app/upstream/pace.py) is slower than that:
the latency bound in the unit a client feels. A device running nothing at
all is priced at its marginal cost above idle where its idle power is paid
anyway (the default), or also `wake_j` (its idle power for `wake_s`) where
the deployment can power it down (`power_down: true` in models.yaml). Ties
go to the busier replica (the other then drains and may idle or power
down), then to the first.
Pure: the pool gives the loads, this gives the choice and its reason.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from router.curves import Curve

# The request a placement is priced for: only the order of the replicas'
# prices matters for the choice (all replicas of a backend share its curve);
# the figures in the reason are for this size.
REFERENCE_PROMPT_TOKENS = 512
REFERENCE_COMPLETION_TOKENS = 256


@dataclass(frozen=True)
class Candidate:
    """One free replica: its position, the backend's requests on it, and
    every backend's requests on its device."""

    order: int
    running: int
    device_running: int
    wake_j: float = 0.0  # the idle power a wake commits to (devices that power down)
    # measured seconds per answer token in a batch of running + 1 (None: not known)
    pace_s: float | None = None


@dataclass(frozen=True)
class Placement:
    order: int
    marginal_j: float | None  # None: placed by least outstanding
    reason: str


def marginal_j(curve: Curve, c: Candidate) -> float:
    """The joules one more request adds on `c`: a (+ s when the replica is idle)
    (+ the device's wake, when it runs nothing and can power down)."""
    p, q = REFERENCE_PROMPT_TOKENS, REFERENCE_COMPLETION_TOKENS
    n = c.running
    added = (n + 1) * curve.joules(p, q, n + 1) - n * curve.joules(p, q, max(1, n))
    return added + (c.wake_j if c.device_running == 0 else 0.0)


def least_outstanding(free: Sequence[Candidate]) -> Placement:
    c = min(free, key=lambda c: (c.running, c.order))
    return Placement(c.order, None, f"replica {c.order}: least outstanding ({c.running} running)")


def place(free: Sequence[Candidate], curve: Curve | None, max_batch: int,
          max_s_per_token: float | None = None) -> Placement:
    """The replica for the next request among `free` (non-empty)."""
    below = [c for c in free if c.running < max_batch]
    slow = [c.order for c in below if _too_slow(c, max_s_per_token)]
    within = [c for c in below if c.order not in slow]
    if curve is None or not within:
        chosen = least_outstanding(free)
        if curve is None:
            return chosen
        bound = f"max_batch {max_batch}" if max_s_per_token is None else (
            f"max_batch {max_batch} or {max_s_per_token:.3g} s a token")
        return Placement(chosen.order, None, chosen.reason + f", every replica at its {bound}")
    priced = [(marginal_j(curve, c), -c.running, c.order, c) for c in within]
    cost, _, _, c = min(priced)
    alone = [p[0] for p in priced if p[3].running == 0]
    if c.running:
        why = f"joins a batch of {c.running}: {cost:.3g} J marginal"
        if alone:
            why += f" (an idle replica: {min(alone):.3g} J)"
    else:
        batches = [(p[0], p[3].running) for p in priced if p[3].running]
        best = min(batches) if batches else None
        why = f"an idle replica, {cost:.3g} J marginal " + (
            f"(joining the batch of {best[1]}: {best[0]:.3g} J)" if best
            else "(none running below max_batch)")
    if slow:
        which = "replica" if len(slow) == 1 else "replicas"
        why += (f"; {which} {', '.join(map(str, slow))} slower than "
                f"{max_s_per_token:.3g} s a token or not measured near that batch")
    return Placement(c.order, cost, f"replica {c.order}: {why}")


def _too_slow(c: Candidate, max_s_per_token: float | None) -> bool:
    return max_s_per_token is not None and c.pace_s is not None and c.pace_s > max_s_per_token
