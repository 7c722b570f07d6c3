"""Where a gateway process spends its time under load: py-spy samples of
`joulegate serve` in front of the fixed-answer nginx upstream (bench.gateways)
while wrk sends non-streamed chat requests, grouped by the package each
sample's innermost frame is in, and by our own functions.

    python -m bench.profile_gateway [--connections 50] [--model small] [--seconds 15] [--gil]
        ->  bench/results/profile-<model>-c<N>[-gil].json (collapsed stacks: .cache/profiles/)

Needs nginx-light, wrk (Debian) and py-spy (PyPI); run as root (ptrace).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from app.tools.embedded import free_port
from bench.gateways import joulegate, start_nginx, stop_nginx, wrk
from bench.gpu_common import project_commit
from workers.local import wait_healthy

ROOT = Path(__file__).resolve().parent.parent
OURS = ("app", "router", "telemetry")


@contextlib.contextmanager
def loaded_gateway(model: str, connections: int, warm_s: int, python: list[str] | None = None,
                   stop: int = signal.SIGTERM
                   ) -> Iterator[tuple[subprocess.Popen[bytes], Callable[[int], dict[str, Any]]]]:
    """`joulegate serve` in front of the fixed-answer nginx, warmed up with
    `warm_s` of wrk: its process, and a load of `seconds` of non-streamed chat
    at `connections` (wrk's figures). Stopped with `stop` (SIGINT: a clean exit,
    which a profiler under it needs to write its output)."""
    work = Path(tempfile.mkdtemp(prefix="jg-profile-"))
    upstream = start_nginx(work)
    port = free_port()
    proc = joulegate(port, upstream, work, python=python)
    try:
        wait_healthy(f"http://127.0.0.1:{port}/readyz", 60, proc)
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        body = {"model": model, "max_tokens": 16,
                "messages": [{"role": "user", "content": "What is the capital of France?"}]}
        wrk(url, connections, warm_s, body, work)
        yield proc, lambda seconds: wrk(url, connections, seconds, body, work)
    finally:
        proc.send_signal(stop)
        proc.wait(timeout=60)
        stop_nginx(work)


def package(frame: str) -> str:
    """A py-spy frame "func (pkg/module.py:12)" -> its top-level package."""
    path = frame.rsplit(" (", 1)[-1].rstrip(")").rsplit(":", 1)[0]
    top = path.split("/", 1)[0]
    return "<native>" if not path or path.startswith("<") else top.removesuffix(".py")


def summarize(collapsed: str) -> dict[str, Any]:
    """Shares of samples by the innermost frame's package, and our functions'
    inclusive shares (a frame counted once per sample)."""
    own: collections.Counter[str] = collections.Counter()
    ours: collections.Counter[str] = collections.Counter()
    total = 0
    for line in collapsed.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = stack.split(";")
        total += n
        own[package(frames[-1])] += n
        for f in {re.sub(r":\d+\)$", ")", f) for f in frames if package(f) in OURS}:
            ours[f] += n  # by function: line numbers dropped

    def share(c: collections.Counter[str]) -> dict[str, float]:
        return {k: round(v / total, 4) for k, v in c.most_common(25)}

    return {"samples": total, "by_package_innermost": share(own),
            "our_functions_inclusive": share(ours)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--connections", type=int, default=50)
    parser.add_argument("--model", default="small", help="small (forced tier) or auto")
    parser.add_argument("--seconds", type=int, default=15)
    parser.add_argument("--gil", action="store_true",
                        help="only samples of the thread holding the interpreter (py-spy "
                             "--gil): who keeps the event loop waiting")
    args = parser.parse_args()
    raw = Path(tempfile.mkdtemp(prefix="jg-pyspy-")) / "stacks.txt"
    with loaded_gateway(args.model, args.connections, 3) as (proc, load_for):
        pyspy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
        spy = subprocess.Popen([pyspy, "record", "--format", "raw", "--rate", "250",
                                "--duration", str(args.seconds), "--nonblocking",
                                *(["--gil"] if args.gil else []),
                                "--pid", str(proc.pid), "--output", str(raw)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        time.sleep(1)
        load: dict[str, Any] = {}
        t = threading.Thread(target=lambda: load.update(load_for(args.seconds - 2)))
        t.start()
        t.join()
        spy.wait(timeout=args.seconds + 60)
        result = {"commit": project_commit(), "model": args.model,
                  "connections": args.connections, "load": load,
                  **summarize(raw.read_text())}
    gil = "-gil" if args.gil else ""
    out = ROOT / "bench" / "results" / f"profile-{args.model}-c{args.connections}{gil}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    stacks = ROOT / ".cache" / "profiles" / out.with_suffix(".stacks.txt").name
    stacks.parent.mkdir(parents=True, exist_ok=True)
    stacks.write_text(raw.read_text())  # raw profiler output stays out of bench/results
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
