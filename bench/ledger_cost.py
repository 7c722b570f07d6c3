"""What the meter's ledger costs per request, without a gateway around it: a
simulated device whose counter steps every 10 ms while requests arrive
evenly and run `concurrency` at a time (each with a live token timeline and
a two-point one at its close, as the fixed-answer benchmarks' requests), on a
fake clock. Per request: the counter steps' work (`ingest`, the sampler
thread's) and `close` (the request's own), in CPU microseconds (the
thread's time; medians of the rounds, the base checkout and this tree in
turns) and, where valgrind is installed, in instructions (cachegrind: a run
less an empty run, so imports and start-up cancel; deterministic, where this
VM's timings drift by half between runs).

    python -m bench.ledger_cost --base REV [--rounds 6]  ->  bench/results/ledger-cost.json
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

# Only the standard library at module level: the child runs this file against
# another checkout's packages (the base's), which may not hold what this one's do.
ROOT = Path(__file__).resolve().parent.parent
# (requests at once, arrivals per 10 ms step, steps run first and not counted):
# "c1-aged" measures a ledger that has finished more requests than it keeps
# figures for (20,000), as a gateway's is after its first seconds of load.
CASES = {"c1": (1, 16, 0), "c50": (50, 10, 0), "c1-aged": (1, 16, 1600)}
CURVE = [1.0, 2.0, 3.0, 0.1, 5.0, 0.2, 0.3]


def simulate(concurrency: int, per_step: int, steps: int, warm_steps: int = 0
             ) -> tuple[float, float]:
    """CPU microseconds per request of ingest and of close (after `warm_steps`
    steps that are run and not counted)."""
    from telemetry.ledger import Ledger
    from telemetry.rates import TokenRates
    from telemetry.timeline import Point

    rates = TokenRates.from_curve(CURVE)
    now = [1000.0]
    ledger = Ledger("estimate", idle_power_w=50.0, clock=lambda: now[0])
    counter = 0.0
    ledger.ingest(now[0], counter, now=now[0])
    running: list[tuple[str, float, list[Point]]] = []
    ingest_s = close_s = 0.0
    closed = 0
    for step in range(warm_steps + steps):
        if step == warm_steps:
            ingest_s = close_s = 0.0
            closed = 0
        for _ in range(per_step):
            now[0] += 0.01 / per_step
            if len(running) >= concurrency:
                wid, opened, timeline = running.pop(0)
                timeline.append((now[0] - opened, 20, 2))
                t = time.thread_time()
                ledger.close(wid, list(timeline))
                close_s += time.thread_time() - t
                closed += 1
            points: list[Point] = [(0.0, 20, 0)]

            def progress(i: int, p: list[Point] = points) -> list[Point]:
                return p[i:]

            wid = ledger.open(progress, rates)
            running.append((wid, now[0], points))
        counter += 3.0
        t = time.thread_time()
        ledger.ingest(now[0], counter, now=now[0])
        ingest_s += time.thread_time() - t
    return ingest_s / closed * 1e6, close_s / closed * 1e6


def instructions(root: Path, case: str, steps: int) -> float:
    """Instructions per request of the case's run (simulate's whole loop)."""
    from bench.child_runs import child_output, instruction_refs

    def refs(n: int) -> int:
        return instruction_refs(child_output(Path(__file__).resolve(), root, [case, str(n)],
                                             True))

    concurrency, per_step, warm = CASES[case]
    requests = steps * per_step - (0 if warm else concurrency)
    return (refs(steps) - refs(0)) / requests


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", help="the checkout compared with this tree")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "ledger-cost.json")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        case, steps = args.child[0], int(args.child[1])
        if steps:
            print(json.dumps(simulate(*CASES[case][:2], steps, CASES[case][2])))
        elif CASES[case][2]:  # the warm steps alone
            simulate(*CASES[case][:2], 0, CASES[case][2])
        else:  # what an empty run costs: the same imports
            import telemetry.ledger
            import telemetry.rates  # noqa: F401
        return
    if not args.base:
        ap.error("--base is required")
    from bench.child_runs import child_output, in_turns
    from bench.gpu_common import commit_of, project_commit, worktree_at
    with tempfile.TemporaryDirectory(prefix="jg-ledger-") as tmp, \
            worktree_at(args.base, Path(tmp) / "base") as base:
        roots = {"base": base, "this tree": ROOT}
        cpu: dict[str, dict[str, list[tuple[float, float]]]] = {
            n: {c: [] for c in CASES} for n in roots}
        for name in in_turns(list(roots), args.rounds):
            for case in CASES:
                ingest, close = json.loads(child_output(
                    Path(__file__).resolve(), roots[name], [case, str(args.steps)], False))
                cpu[name][case].append((ingest, close))
        counted = {n: {c: round(instructions(root, c, 100)) for c in CASES}
                   for n, root in roots.items()} if shutil.which("valgrind") else None
    summary: dict[str, Any] = {
        n: {c: {"ingest_cpu_us": round(statistics.median(x[0] for x in runs), 2),
                "close_cpu_us": round(statistics.median(x[1] for x in runs), 2),
                **({"instructions": counted[n][c]} if counted else {})}
            for c, runs in by_case.items()}
        for n, by_case in cpu.items()}
    result = {"commit": project_commit(), "base": commit_of(args.base), "rounds": args.rounds,
              "steps": args.steps,
              "cases": {c: {"concurrency": v[0], "arrivals_per_step": v[1], "warm_steps": v[2]}
                        for c, v in CASES.items()},
              "cpu_runs": cpu, "summary": summary}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
