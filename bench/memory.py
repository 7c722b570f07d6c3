"""Gateway memory over many requests: RSS after the first 10,000 and after 100,000.

    python -m bench.memory [--requests 100000]   ->  bench/results/memory.json

`joulegate serve` (one process, estimate meter) in front of the fixed-answer
nginx upstream of bench.gateways, driven by wrk at 50 connections with the
forced tier and `auto` alternating, streamed and not; RSS is read at each
request-count mark from joulegate_requests_total. Goal (issue 11): RSS after
100,000 within 5% of RSS after 10,000.
"""

from __future__ import annotations

import argparse
import json
import re
import tempfile
from pathlib import Path
from typing import Any

import httpx

from app.tools.embedded import free_port
from bench.gateways import joulegate, start_nginx, stop_nginx, wrk
from bench.gpu_common import project_commit
from bench.process import rss_mb
from workers.local import ROOT, wait_healthy

MSG = [{"role": "user", "content": "What is the capital of France?"}]
BODIES: list[dict[str, Any]] = [
    {"model": "small", "messages": MSG}, {"model": "auto", "messages": MSG},
    {"model": "auto", "messages": MSG, "stream": True}]


def served(base: str) -> int:
    text = httpx.get(base + "/metrics", timeout=10).text
    return int(sum(float(v) for v in re.findall(
        r"^joulegate_requests_total\{[^}]*\} ([\d.e+]+)$", text, re.M)))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "memory.json")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="joulegate-memory-"))
    upstream = start_nginx(work)
    port = free_port()
    proc = joulegate(port, upstream, work)
    base = f"http://127.0.0.1:{port}"
    marks = sorted({1_000, 10_000, args.requests // 2, args.requests})
    result: dict[str, Any] = {"commit": project_commit(), "connections": 50,
                              "bodies": BODIES, "rss_mb_at": {}}
    try:
        wait_healthy(base + "/readyz", 60, proc)
        i = 0
        for mark in marks:
            while served(base) < mark:
                wrk(base + "/v1/chat/completions", 50, 5, BODIES[i % len(BODIES)], work)
                i += 1
            result["rss_mb_at"][str(served(base))] = round(rss_mb(proc.pid), 1)
            print(result["rss_mb_at"], flush=True)
        rss = list(result["rss_mb_at"].values())
        at_10k = next(v for k, v in result["rss_mb_at"].items() if int(k) >= 10_000)
        result["growth_10k_to_last"] = round(rss[-1] / at_10k - 1, 4)
        result["goal"] = "RSS after 100,000 within 5% of RSS after 10,000"
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        stop_nginx(work)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
        print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
