"""A/B of joulegate's own cost per request: this checkout against an earlier
commit, taking turns, so that a machine whose speed drifts (this VM varies by
1.5x between runs) affects both alike.

    python -m bench.ab --base ca6d843 [--rounds 3 --seconds 8 --connections 1]
                       [--model small|auto] [--stream] [--workers N]
        # -> bench/results/ab-overhead.json (--out to write elsewhere)

Each round starts the base's gateway and this checkout's, in turns (ABBA:
the first of a round alternates), in front of the
same fixed-answer nginx (bench/gateways.py), and measures a chat (streamed with --stream)
to the forced `small` tier (or `auto`) with wrk (one connection unless told).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from app.tools.embedded import free_port
from bench.gateways import joulegate, start_nginx, stop_nginx, wrk
from bench.gpu_common import commit_of, project_commit, worktree_at
from bench.process import tree_cpu_s
from workers.local import ROOT, wait_healthy

MESSAGES = [{"role": "user", "content": "What is the capital?"}]


def _measure(root: Path, upstream: int, work: Path, seconds: int, connections: int,
             model: str, workers: int, stream: bool = False) -> dict[str, Any]:
    port = free_port()
    body = {"model": model, "messages": MESSAGES, **({"stream": True} if stream else {})}
    return measure_gateway(joulegate(port, upstream, work, root, workers), port, work,
                           seconds, connections, body)


FIELDS = ("req_per_s", "p50_ms", "p99_ms", "cpu_ms_per_request")


def measure_gateway(proc: subprocess.Popen[bytes], port: int, work: Path, seconds: int,
                    connections: int, body: dict[str, Any],
                    wrk_cores: set[int] | None = None) -> dict[str, Any]:
    """wrk's figures for `body` against the gateway `proc` serves on `port`
    (warmed up first), with its CPU per request; `proc` is stopped after. A
    gateway that never gets ready (or a wrk that hangs) gives a run with no
    figures and the error: the other runs still count."""
    try:
        try:
            wait_healthy(f"http://127.0.0.1:{port}/readyz", 60, proc)
        except (RuntimeError, TimeoutError) as e:
            return {**dict.fromkeys(FIELDS), "non_2xx": 0, "error": str(e)}
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        wrk(url, connections, 2, body, work, cores=wrk_cores)  # warm up
        before = tree_cpu_s(proc.pid)
        out = wrk(url, connections, seconds, body, work, cores=wrk_cores)
        # the gateway's own CPU per request: less sensitive than req/s to what
        # else the machine runs at the moment (wrk and nginx share its cores)
        requests = (out["req_per_s"] or 0) * seconds
        out["cpu_ms_per_request"] = round(1000 * (tree_cpu_s(proc.pid) - before) / requests, 4) \
            if requests else None
        return out
    except subprocess.TimeoutExpired as e:
        return {**dict.fromkeys(FIELDS), "non_2xx": 0, "error": f"wrk: {e}"}
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def median_of(runs: list[dict[str, Any]], field: str) -> float | None:
    """The median of `field` over the runs that measured it (None: none did)."""
    values = [r[field] for r in runs if r.get(field) is not None]
    return statistics.median(values) if values else None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--base", required=True, help="the earlier commit")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=int, default=8)
    parser.add_argument("--connections", type=int, default=1)
    parser.add_argument("--model", default="small", help="small (a forced tier) or auto")
    parser.add_argument("--stream", action="store_true", help="streamed chat")
    parser.add_argument("--workers", type=int, default=1, help="gateway processes (serve "
                        "--workers N; CPU per request then counts them all and the agent)")
    parser.add_argument("--out", type=Path,
                        default=ROOT / "bench" / "results" / "ab-overhead.json")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="joulegate-ab-"))
    runs: dict[str, list[dict[str, Any]]] = {"base": [], "this": []}
    with worktree_at(args.base, work / "base") as base:
        upstream = start_nginx(work)
        try:
            pair = (("base", base), ("this", ROOT))
            for i in range(args.rounds):
                # ABBA: this machine slows (or speeds up) through a run, so the
                # side that always ran first would always be favoured.
                for name, root in (pair if i % 2 == 0 else pair[::-1]):
                    runs[name].append(_measure(root, upstream, work, args.seconds,
                                               args.connections, args.model, args.workers,
                                               args.stream))
                    print(name, runs[name][-1], flush=True)
        finally:
            stop_nginx(work)
    shutil.rmtree(work, ignore_errors=True)  # the base's worktree is gone already
    summary = {name: {f"{field}_median": median_of(rs, field) for field in FIELDS}
               for name, rs in runs.items()}
    rates = (summary["base"]["req_per_s_median"], summary["this"]["req_per_s_median"])
    result = {"commit": project_commit(), "base": commit_of(args.base), "rounds": args.rounds,
              "seconds": args.seconds,
              "case": f"model {args.model}, {'streamed' if args.stream else 'non-streamed'}, "
                      f"wrk -t1 -c{args.connections}, "
                      f"{args.workers} gateway process(es)",
              "runs": runs, "summary": summary,
              "added_ms_per_request": round(1000 / rates[1] - 1000 / rates[0], 3)
              if rates[0] and rates[1] else None,
              "failed_runs": sum("error" in r for rs in runs.values() for r in rs)}
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["summary"]), result["added_ms_per_request"])


if __name__ == "__main__":
    main()
