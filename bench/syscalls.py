"""System calls per forwarded request: joulegate (forced tier and `auto`)
against the bare pass-through (bench/passthrough.py), in front of the same
fixed-answer nginx (bench.gateways), wrk at `--connections`, each process
traced by `strace -c -f` while loaded. strace slows what it traces several
fold, so the counts per request are the figure, not the rates; the cost of
one system call on this machine is timed beside them (os.getpid, os.write to
/dev/null) to turn counts into time.

    python -m bench.syscalls [--seconds 5 --connections 50]  ->  bench/results/syscalls.json

Needs strace (apt-get install strace) and what bench.gateways needs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from app.tools.embedded import free_port
from bench.gateways import joulegate, passthrough, start_nginx, stop_nginx, wrk
from bench.gpu_common import project_commit
from workers.local import ROOT, wait_healthy

MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]


def syscall_cost_us(n: int = 200_000) -> dict[str, float]:
    """Microseconds per call of two cheap system calls, in this process."""
    t0 = time.perf_counter()
    for _ in range(n):
        os.getpid()
    getpid = (time.perf_counter() - t0) / n
    fd = os.open(os.devnull, os.O_WRONLY)
    try:
        t0 = time.perf_counter()
        for _ in range(n):
            os.write(fd, b"x" * 100)
        write = (time.perf_counter() - t0) / n
    finally:
        os.close(fd)
    return {"getpid": round(getpid * 1e6, 3), "write_100_bytes": round(write * 1e6, 3)}


def parse_strace(text: str, requests: float) -> dict[str, float]:
    """`strace -c` totals as calls per request, the frequent ones by name."""
    per: dict[str, float] = {}
    for line in text.splitlines():
        fields = line.split()
        # % time, seconds, usecs/call, calls, [errors,] syscall (the last row: total)
        if len(fields) >= 5 and fields[3].isdigit():
            per[fields[-1]] = int(fields[3]) / requests
    return {k: round(v, 2) for k, v in sorted(per.items(), key=lambda kv: -kv[1])
            if v >= 0.01 or k == "total"}


def traced(proc: subprocess.Popen[bytes], url: str, body: dict[str, Any], seconds: int,
           connections: int, work: Path, name: str) -> dict[str, Any]:
    wrk(url, connections, 2, body, work)  # warm
    out = work / f"strace-{name}.txt"
    tracer = subprocess.Popen(["strace", "-c", "-f", "-q", "-o", str(out), "-p", str(proc.pid)])
    time.sleep(0.5)  # attached to every thread
    try:
        load = wrk(url, connections, seconds, body, work)
    finally:
        tracer.terminate()
        tracer.wait(timeout=30)
    requests = (load["req_per_s"] or 0.0) * seconds
    return {"requests": round(requests), "non_2xx": load["non_2xx"],
            "calls_per_request": parse_strace(out.read_text(), max(requests, 1.0))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=int, default=5)
    ap.add_argument("--connections", type=int, default=50)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "syscalls.json")
    args = ap.parse_args()
    if shutil.which("strace") is None:
        ap.error("needs strace (apt-get install strace)")
    work = Path(tempfile.mkdtemp(prefix="joulegate-syscalls-"))
    upstream = start_nginx(work)
    ports = {"passthrough": free_port(), "joulegate": free_port()}
    procs = {"passthrough": passthrough(ports["passthrough"], upstream, work),
             "joulegate": joulegate(ports["joulegate"], upstream, work)}
    cases = [("FastAPI pass-through", "passthrough", {"model": "x"}),
             ("joulegate forced tier", "joulegate", {"model": "small"}),
             ("joulegate auto", "joulegate", {"model": "auto"})]
    result: dict[str, Any] = {"commit": project_commit(), "machine": f"{os.cpu_count()} cores",
                              "seconds": args.seconds, "connections": args.connections,
                              "tool": "strace -c -f, wrk -t1",
                              "syscall_cost_us": syscall_cost_us(), "cases": {}}
    try:
        for name, proc in procs.items():
            wait_healthy(f"http://127.0.0.1:{ports[name]}/readyz", 60, proc)
        for case, name, body in cases:
            url = f"http://127.0.0.1:{ports[name]}/v1/chat/completions"
            result["cases"][case] = traced(procs[name], url, {**body, "messages": MESSAGES},
                                           args.seconds, args.connections, work,
                                           case.replace(" ", "-"))
            print(case, result["cases"][case], flush=True)
    finally:
        for proc in procs.values():
            proc.terminate()
        stop_nginx(work)
    args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
