"""Quality targets -> per-query tolerances, calibrated on a reference workload.

A target t for `balanced` means: over traffic like the reference workload,
keep t of the expected quality of sending everything to the largest tier as
it answers when asked by name (direct; a reasoning model thinking to its own
end). The per-query tolerance that does it is found by a sweep: for each
tolerance, the policy's own choice for every reference request, then the
largest tolerance below which every tolerance meets the target (the sweep is
noisy: a later isolated point that meets it is not used).

Pure: candidates in, numbers out.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from router.policy import Candidate, Policy, baseline_of

TARGETS = (0.8, 0.85, 0.9, 0.95, 0.97, 0.99)


def baseline(cands: Sequence[Candidate], largest: str) -> Candidate:
    """The largest tier's answer when it is asked for by name (policy.baseline_of)."""
    found = baseline_of(cands, largest)
    if found is None:
        raise ValueError(f"no answer of the {largest} tier as asked by name among the actions")
    return found


def sweep(policy: Policy, assessed: Sequence[Sequence[Candidate]], largest: str,
          steps: int = 101) -> tuple[dict[str, float], list[dict[str, float]]]:
    """(target -> tolerance, the sweep) over the reference requests' candidates."""
    base = [baseline(cands, largest) for cands in assessed]
    base_q = sum(c.expected_quality for c in base)
    base_e = sum(c.expected_joules or 0.0 for c in base)
    rows: list[dict[str, float]] = []
    for tol in np.linspace(0, 0.5, steps):
        picks = [policy.choose(list(cands), "balanced", None, float(tol)).chosen
                 for cands in assessed]
        rows.append({"tolerance": round(float(tol), 4),
                     "quality_ratio": round(sum(p.expected_quality for p in picks) / base_q, 4),
                     "energy_saved": round(1 - sum(p.expected_joules or 0.0 for p in picks)
                                           / base_e, 4) if base_e else 0.0})
    targets: dict[str, float] = {}
    for target in TARGETS:
        tol = 0.0
        for row in rows:
            if row["quality_ratio"] < target:
                break
            tol = row["tolerance"]
        targets[str(target)] = tol
    return targets, rows
