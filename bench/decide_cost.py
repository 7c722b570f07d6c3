"""What one routing decision costs, without a gateway around it: the real
router (this checkout's models.yaml, its classifier and complexity model)
deciding a fixed set of requests as a forwarded request asks (no
explanation), in CPU microseconds (medians of the rounds, the base checkout
and this tree in turns) and, where valgrind is installed, in instructions
(cachegrind: a run less a run that builds the router and decides nothing, so
imports and loading cancel; deterministic, where this VM's timings drift by
half between runs). Per request kind, and their mean.

    python -m bench.decide_cost --base REV [--rounds 6]  ->  bench/results/decide-cost.json
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
from pathlib import Path
from typing import Any

# Only the standard library at module level: the child runs this file against
# another checkout's packages (the base's).
ROOT = Path(__file__).resolve().parent.parent
_TURN = ("Could you look at this function and explain why the cache misses so often when "
         "the keys are tuples of floats, and suggest a fix? ")
REQUESTS = {  # kind -> the conversation's text as the gateway hands it to the router
    "greeting": "user: Hi there! How are you doing today?",
    "fact": "user: What is the capital of Australia?",
    "rewrite": "user: Rewrite this to sound more formal: gonna be late, traffic is awful, sorry",
    "math": "user: A train leaves at 3:15 pm and travels 240 km at 80 km/h, then 90 km at "
            "60 km/h. At what time does it arrive? Show your steps.",
    "code": "user: Write a Python function that merges two sorted lists into one sorted list "
            "without using sort(), and explain its complexity.",
    "conversation": "\n".join(f"user: {_TURN * 3}\nassistant: Here is what happens: {_TURN * 3}"
                              for _ in range(6)) + "\nuser: Thanks. Now write the unit tests.",
}


def decide(n: int) -> dict[str, float]:
    """CPU microseconds per decision of each kind, `n` decisions each (0: only
    build the router and its queries)."""
    import gc
    import time

    from app.catalog import load_catalog
    from app.routing import LengthBook, build_router
    from router.decision import Query
    from router.features import estimate_tokens

    router = build_router(load_catalog(Path("models.yaml")), LengthBook(None))
    out: dict[str, float] = {}
    gc.collect()
    gc.disable()  # a collection falls where allocations put it: noise, not the decision's
    for kind, text in REQUESTS.items():
        q = Query(text, estimate_tokens(text), None)
        if n:
            router.decide(q, explain=False)  # the caches a first decision fills
        t = time.thread_time()
        for _ in range(n):
            router.decide(q, explain=False)
        out[kind] = (time.thread_time() - t) / n * 1e6 if n else 0.0
    return out


def instructions(root: Path, n: int) -> float:
    """Instructions per decision, over every kind."""
    from bench.child_runs import child_output, instruction_refs

    def refs(k: int) -> int:
        return instruction_refs(child_output(Path(__file__).resolve(), root, [str(k)], True))

    # n decisions of each kind, and the first one each that fills the caches
    return (refs(n) - refs(0)) / ((n + 1) * len(REQUESTS))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", help="the checkout compared with this tree")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--decisions", type=int, default=2000, help="of each kind per round")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "decide-cost.json")
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child is not None:
        print(json.dumps(decide(args.child)))
        return
    if not args.base:
        ap.error("--base is required")
    from bench.child_runs import child_output, in_turns
    from bench.gpu_common import commit_of, project_commit, worktree_at
    with tempfile.TemporaryDirectory(prefix="jg-decide-") as tmp, \
            worktree_at(args.base, Path(tmp) / "base") as base:
        roots = {"base": base, "this tree": ROOT}
        cpu: dict[str, list[dict[str, float]]] = {n: [] for n in roots}
        for name in in_turns(list(roots), args.rounds):
            out = child_output(Path(__file__).resolve(), roots[name], [str(args.decisions)],
                               False)
            cpu[name].append(json.loads(out.strip().splitlines()[-1]))
        counted = {n: round(instructions(root, 100)) for n, root in roots.items()} \
            if shutil.which("valgrind") else None
    summary: dict[str, Any] = {}
    for name, runs in cpu.items():
        kinds = {k: round(statistics.median(r[k] for r in runs), 1) for k in REQUESTS}
        summary[name] = {"cpu_us": kinds,
                         "cpu_us_mean": round(statistics.mean(kinds.values()), 1),
                         **({"instructions": counted[name]} if counted else {})}
    result = {"commit": project_commit(), "base": commit_of(args.base), "rounds": args.rounds,
              "decisions_per_kind": args.decisions, "requests": REQUESTS, "cpu_runs": cpu,
              "summary": summary}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
