"""Routing cost and routing mix.

- decision time of the real router (classifier + policy, models.yaml) for a
  2,000-token multi-turn conversation: p50 / p99 over many decisions; the
  same for a thinking pair (deploy/models.thinking.yaml: no thinking and
  four budget rungs per tier, ten candidates instead of four);
- the same cold: each decision after a 32 MB memory sweep, which leaves the
  caches and TLB as a loaded gateway's other work leaves them between two
  decisions (compare a loaded gateway's own `joulegate_route_seconds`);
  and 1, 2, 4 or 8 different prompts decided in a row after each sweep, as
  a loaded gateway plans the routed requests of one turn of its loop;
- what the balanced policy chooses on a mixed set of 100 prompts (counts per
  tier x strategy and per category).

    python bench/route_latency.py   ->  bench/results/route.json
"""

from __future__ import annotations

import json
import statistics
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from app.catalog import load_catalog
from app.routing import LengthBook, build_router
from bench.gpu_common import project_commit
from bench.workload import MIX, mixed_prompts
from router.decision import Query
from router.engine import Router
from router.features import conversation_text, estimate_tokens

ROOT = Path(__file__).resolve().parent.parent


def conversation(tokens: int) -> str:
    turn = ("Could you look at this function and explain why the cache misses so often "
            "when the keys are tuples of floats, and suggest a fix? ")
    turns: list[tuple[str, str]] = []
    while estimate_tokens(" ".join(t for _, t in turns)) < tokens:
        turns.append(("user", turn * 3))
        turns.append(("assistant", "Here is what happens: " + turn * 3))
    turns.append(("user", "Thanks. Now write the unit tests for it."))
    return conversation_text(turns)


SWEEP_BYTES = 32 << 20  # larger than this machine's caches


def sweeper() -> Callable[[], None]:
    """A call that writes every cache line of SWEEP_BYTES: the caches and TLB
    as a loaded gateway's other work leaves them."""
    sweep, ones = bytearray(SWEEP_BYTES), b"\x01" * (SWEEP_BYTES // 64)

    def swept() -> None:
        sweep[::64] = ones
    return swept


def decision_times(router: Router, q: Query, n: int = 5000, cold: bool = False
                   ) -> list[float]:
    """Decision times, sorted; `cold`: each after a sweep (`sweeper`)."""
    for _ in range(200):
        router.decide(q)
    sweep = sweeper() if cold else None
    times = []
    for _ in range(n):
        if sweep is not None:
            sweep()
        t0 = time.perf_counter()
        router.decide(q)
        times.append(time.perf_counter() - t0)
    times.sort()
    return times


def in_a_row(router: Router, queries: list[Query], k: int, n: int = 400) -> float:
    """Median microseconds per decision of `k` different queries decided one
    after another right after a cache sweep: what a turn of the loaded
    gateway's event loop pays for the routed requests it plans together
    (app/forward/turn.py)."""
    sweep = sweeper()
    per = []
    for i in range(n):
        batch = [queries[(i * k + j) % len(queries)] for j in range(k)]
        sweep()
        t0 = time.perf_counter()
        for q in batch:
            router.decide(q, explain=False)
        per.append((time.perf_counter() - t0) / k)
    return round(1e6 * statistics.median(per), 1)


def _ms(times: list[float]) -> dict[str, float]:
    return {"decision_ms_p50": 1000 * statistics.median(times),
            "decision_ms_p99": 1000 * times[int(0.99 * len(times))]}


def main() -> None:
    catalog = load_catalog(ROOT / "models.yaml")
    router = build_router(catalog, LengthBook(None))
    text = conversation(2000)
    q = Query(text, estimate_tokens(text))
    times = decision_times(router, q)
    thinking = decision_times(build_router(
        load_catalog(ROOT / "deploy" / "models.thinking.yaml"), LengthBook(None)), q)
    short = "What is the capital of France?"
    short_q = Query(short, estimate_tokens(short))
    cold = {"sweep_bytes": SWEEP_BYTES,
            "conversation": _ms(decision_times(router, q, 400, cold=True)),
            "short_question": _ms(decision_times(router, short_q, 400, cold=True)),
            "short_question_warm": _ms(decision_times(router, short_q, 2000))}
    mix = mixed_prompts(100)
    mixed = [Query(t, estimate_tokens(t)) for _, t in mix]
    cold["mixed_prompts_in_a_row_us_per_decision"] = {
        str(k): in_a_row(router, mixed, k) for k in (1, 2, 4, 8)}
    decisions = [router.decide(Query(t, estimate_tokens(t))) for _, t in mix]
    result = {
        "conversation_tokens_estimated": estimate_tokens(text),
        "conversation_chars": len(text),
        "decisions": len(times),
        **_ms(times),
        "decision_ms_max": 1000 * times[-1],
        "thinking_pair": {"models": "deploy/models.thinking.yaml", "candidates": 10,
                          **_ms(thinking)},
        "cold": cold,
        "mixed_prompts": {"n": len(mix), "mix": MIX,
                          "tier_x_strategy": dict(Counter(f"{d.tier}:{d.strategy}"
                                                          for d in decisions)),
                          "category": dict(Counter(d.category for d in decisions)),
                          "policy": "balanced", "curves": "CPU test workers (estimate)"},
        "machine": "2-core development machine",
        "commit": project_commit(),
    }
    out = ROOT / "bench" / "results" / "route.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
