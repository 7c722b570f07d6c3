"""Whether the gateway's cost per request changes as its process ages: one
`joulegate serve` kept running while it serves ever more requests, its CPU
per request at one connection measured again and again, in turns with the
bare pass-through (bench/passthrough.py) on the same cores, in front of the
fixed-answer nginx (bench.gateways).

    python -m bench.aging [--rounds 4 --seconds 5 --load-s 20 --pin]
        ->  bench/results/aging.json (and .png)

Steps: `--rounds` measurements on a fresh gateway (it ages by these alone),
then `--load-s` seconds at 50 connections (asking for `--load-model`),
`--rounds` more, the same load again, `--rounds` more, and last `--rounds`
on a gateway started afresh. Each measurement records the gateway's CPU per
request (its event loop's thread and its other threads apart), the
latencies, its resident memory and how many requests it had served before.
bench.gateways keeps one gateway process through all its rounds: a cost that
grows with age shows there as rounds after the first costing more. With
`--siblings`, the other gateways bench.gateways runs beside it (`serve
--workers 2` and `--workers 4`, on the cores --pin gives them, shared with
this one) run too, each loaded as long at 50 connections after each load of
the measured one.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from app.tools.embedded import free_port
from bench.gateways import (
    NGINX_CORES,
    PINNED,
    WRK_CORES,
    joulegate,
    passthrough,
    start_nginx,
    stop_nginx,
    wrk,
)
from bench.gpu_common import project_commit
from bench.process import rss_mb, thread_cpu_s, tree_cpu_s
from workers.local import ROOT, wait_healthy

BODY = {"model": "small", "messages": [{"role": "user", "content": "What is the capital?"}]}
PT_BODY = {**BODY, "model": "x"}


def _cpu_split(pid: int) -> tuple[float, float]:
    """(the main thread's, the other threads') CPU seconds of process `pid`."""
    threads = thread_cpu_s(pid)
    main = threads.pop(pid, 0.0)
    return main, sum(threads.values())


def _measure(url: str, pid: int, connections: int, seconds: int, body: dict[str, Any],
             work: Path, cores: set[int] | None) -> dict[str, Any]:
    before, (main0, rest0) = tree_cpu_s(pid), _cpu_split(pid)
    out = wrk(url, connections, seconds, body, work, cores=cores)
    n = (out["req_per_s"] or 0) * seconds
    main1, rest1 = _cpu_split(pid)
    if n:
        out["cpu_ms_per_request"] = round(1000 * (tree_cpu_s(pid) - before) / n, 4)
        out["loop_thread_cpu_ms_per_request"] = round(1000 * (main1 - main0) / n, 4)
        out["other_threads_cpu_ms_per_request"] = round(1000 * (rest1 - rest0) / n, 4)
    out["requests"] = int(n)
    out["rss_mb"] = round(rss_mb(pid), 1)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seconds", type=int, default=5)
    parser.add_argument("--load-s", type=int, default=20)
    parser.add_argument("--pin", action="store_true",
                        help="cores as bench.gateways --pin (a machine of 8+ cores)")
    parser.add_argument("--load-model", default="small",
                        help="the model the loads ask for (`auto`: routed requests)")
    parser.add_argument("--siblings", action="store_true",
                        help="bench.gateways' 2- and 4-process gateways beside it, loaded too")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "aging.json")
    args = parser.parse_args()
    pin = (lambda c: c) if args.pin else (lambda c: None)
    work = Path(tempfile.mkdtemp(prefix="joulegate-aging-"))
    upstream = start_nginx(work, pin(NGINX_CORES))
    chat = "/v1/chat/completions"
    results: dict[str, Any] = {"commit": project_commit(), "seconds": args.seconds,
                               "load_s": args.load_s, "pinned": args.pin,
                               "siblings": args.siblings, "load_model": args.load_model,
                               "steps": []}
    pt_port = free_port()
    pt = passthrough(pt_port, upstream, work, pin(PINNED[1]))
    procs = [pt]
    siblings: dict[int, int] = {}  # port -> processes
    for n in (2, 4) if args.siblings else ():
        siblings[free_port()] = n
        procs.append(joulegate(list(siblings)[-1], upstream, work, workers=n,
                               cores=pin(PINNED[n])))
    try:
        wait_healthy(f"http://127.0.0.1:{pt_port}/readyz", 60, pt)
        for sib_port, proc in zip(siblings, procs[1:], strict=True):
            wait_healthy(f"http://127.0.0.1:{sib_port}/readyz", 60, proc)
        for life in ("first", "fresh"):
            port = free_port()
            gw = joulegate(port, upstream, work, cores=pin(PINNED[1]))  # a state dir of its own
            procs.append(gw)
            wait_healthy(f"http://127.0.0.1:{port}/readyz", 60, gw)
            served = 0
            phases = ["c1", "load", "c1", "load", "c1"] if life == "first" else ["c1"]
            for phase in phases:
                if phase == "load":
                    run = _measure(f"http://127.0.0.1:{port}{chat}", gw.pid, 50, args.load_s,
                                   {**BODY, "model": args.load_model}, work, pin(WRK_CORES))
                    served += run["requests"]
                    results["steps"].append({"life": life, "what": "joulegate c=50",
                                             "model": args.load_model, **run})
                    print(life, "load", run, flush=True)
                    for sib_port, n in siblings.items():
                        wrk(f"http://127.0.0.1:{sib_port}{chat}", 50, args.load_s, BODY, work,
                            cores=pin(WRK_CORES))
                        print(life, f"sibling of {n} processes loaded", flush=True)
                    continue
                for _ in range(args.rounds):
                    run = _measure(f"http://127.0.0.1:{port}{chat}", gw.pid, 1, args.seconds,
                                   BODY, work, pin(WRK_CORES))
                    ref = _measure(f"http://127.0.0.1:{pt_port}{chat}", pt.pid, 1,
                                   args.seconds, PT_BODY, work, pin(WRK_CORES))
                    step = {"life": life, "what": "joulegate c=1", "served_before": served,
                            **run, "passthrough": ref}
                    if run.get("cpu_ms_per_request") and ref.get("cpu_ms_per_request"):
                        step["cpu_over_passthrough"] = round(
                            run["cpu_ms_per_request"] / ref["cpu_ms_per_request"], 3)
                    served += run["requests"]
                    results["steps"].append(step)
                    print(life, served, step.get("cpu_over_passthrough"), run, flush=True)
            gw.terminate()
            gw.wait(timeout=30)
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=30)
        stop_nginx(work)
        shutil.rmtree(work, ignore_errors=True)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=2) + "\n")
        _plot(results, args.out.with_suffix(".png"))
        print(f"wrote {args.out}")


def _plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [s for s in results["steps"] if s["what"] == "joulegate c=1"]
    if not steps:
        return
    fig, ax = plt.subplots(figsize=(8, 4))
    xs = list(range(len(steps)))
    ax.plot(xs, [s.get("cpu_ms_per_request") for s in steps], "o-", label="joulegate")
    ax.plot(xs, [s.get("loop_thread_cpu_ms_per_request") for s in steps], "o--",
            label="joulegate, event loop thread")
    ax.plot(xs, [s["passthrough"].get("cpu_ms_per_request") for s in steps], "s-",
            label="pass-through")
    ax.set_xticks(xs, [f"{s['life']}\n{s['served_before'] // 1000}k" for s in steps],
                  fontsize=7)
    ax.set_xlabel("gateway process, requests it had served before (thousands)")
    ax.set_ylabel("CPU ms per request, c=1")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
