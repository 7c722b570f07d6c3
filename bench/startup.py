"""What one gateway process costs before it serves: seconds from its start to
its first healthy answer, the CPU seconds that took, and its resident memory
then and after a short burst of `auto` requests (wrk, 10 connections, 5 s,
in front of bench.gateways' fixed-answer nginx). The checkout at `--base`
and this working tree, started in turns.

    python -m bench.startup --base REV [--rounds 5]  ->  bench/results/startup.json

Each process is a `joulegate serve` of one checkout (bench.gateways.joulegate:
the estimate meter, a state directory of its own). Needs nginx-light and wrk.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from app.tools.embedded import free_port
from bench.ab import median_of
from bench.gateways import joulegate, start_nginx, stop_nginx, wrk
from bench.gpu_common import commit_of, project_commit, worktree_at
from bench.process import cpu_s, rss_mb
from workers.local import ROOT, wait_healthy

MSG = [{"role": "user", "content": "What is the capital of France?"}]


def one_start(root: Path, upstream: int, work: Path) -> dict[str, Any]:
    """One process's figures; a start that fails or hangs is a run with its
    error and no figures (the summary takes the medians of the others)."""
    port = free_port()
    started = time.perf_counter()
    proc = joulegate(port, upstream, work, root)
    try:
        try:
            wait_healthy(f"http://127.0.0.1:{port}/healthz", 120, proc)
        except (RuntimeError, TimeoutError) as e:
            return {"error": str(e)}
        ready_s = time.perf_counter() - started
        out: dict[str, Any] = {"ready_s": round(ready_s, 3),
                               "start_cpu_s": round(cpu_s(proc.pid), 3),
                               "rss_ready_mb": round(rss_mb(proc.pid), 1)}
        try:
            load = wrk(f"http://127.0.0.1:{port}/v1/chat/completions", 10, 5,
                       {"model": "auto", "messages": MSG}, work)
        except subprocess.TimeoutExpired as e:  # a hung load: its start's figures stand
            return {**out, "error": f"wrk: {e}"}
        out.update(rss_after_load_mb=round(rss_mb(proc.pid), 1), load=load)
        return out
    finally:
        proc.terminate()
        proc.wait(30)


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    medians = {f: median_of(runs, f)
               for f in ("ready_s", "start_cpu_s", "rss_ready_mb", "rss_after_load_mb")}
    return {**{f: None if m is None else round(m, 3) for f, m in medians.items()},
            "failed_runs": sum("error" in r for r in runs)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True, help="the checkout compared with this tree")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "startup.json")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="jg-startup-") as tmp:
        work = Path(tmp)
        upstream = start_nginx(work)
        runs: dict[str, list[dict[str, Any]]] = {"base": [], "this tree": []}
        try:
            with worktree_at(args.base, work / "base") as base:
                roots = {"base": base, "this tree": ROOT}
                for r in range(args.rounds):  # in turns, the first one alternating
                    order = list(roots) if r % 2 == 0 else list(roots)[::-1]
                    for name in order:
                        runs[name].append(one_start(roots[name], upstream, work))
                        print(name, runs[name][-1], flush=True)
        finally:
            stop_nginx(work)
    result = {"commit": project_commit(), "base": commit_of(args.base), "rounds": args.rounds,
              "runs": runs, "summary": {k: summary(v) for k, v in runs.items()}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["summary"], indent=2))


if __name__ == "__main__":
    main()
