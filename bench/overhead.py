"""Latency the gateway adds in front of a real worker, seen from the client and
as the gateway reports it (`x-joulegate-overhead-ms`).

Starts its own llama-server with the real SmolLM2-135M-Instruct
(workers/local.real_model) and `joulegate serve` (both tiers on that worker,
the `estimate` source) on free ports, then sends N chat requests one at a
time over keep-alive connections, in turns direct to the worker and through
the gateway forced to the small tier (routing is timed by
bench/route_latency.py), and direct streamed (what the gateway asks the
worker for), greedy, one answer token by default (the same prompt
each time: the worker's prompt cache leaves one decoding step, the least
worker time to hide the gateway's in). Also the gateway process's CPU share
of one core over the timed part, its background threads included.

    python -m bench.overhead [--requests N] [--tokens T]  ->  bench/results/overhead.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from app.tools.embedded import free_port
from bench.gateways import joulegate
from bench.gpu_common import project_commit
from bench.process import tree_cpu_s
from workers.local import ROOT, llama_server, real_model, spawn, stop, wait_healthy

PROMPT = "What is the capital of France? Answer in one word."


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def summary(xs: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(xs), 3), "p99": round(pct(xs, 0.99), 3)}


def measure(worker: str, gateway: str, gateway_pid: int, n: int, tokens: int
            ) -> dict[str, object]:
    body = {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": tokens,
            "temperature": 0, "seed": 1}
    direct_ms: list[float] = []
    streamed_ms: list[float] = []  # what the gateway asks the worker for
    via_ms: list[float] = []
    header_ms: list[float] = []
    failed: dict[str, int] = {}  # a turn with a failed request is counted, not timed
    with httpx.Client(timeout=60) as client:
        def timed(name: str, url: str, payload: dict[str, object]
                  ) -> tuple[float, httpx.Response] | None:
            t0 = time.perf_counter()
            try:
                r = client.post(url + "/v1/chat/completions", json=payload)
            except httpx.HTTPError:
                r = None
            if r is None or r.status_code != 200:
                failed[name] = failed.get(name, 0) + 1
                return None
            return 1000.0 * (time.perf_counter() - t0), r

        for _ in range(20):  # warm-up: connections, caches, the worker's prompt cache
            timed("warm-up", worker, body)
            timed("warm-up", gateway, {**body, "model": "small"})
        failed.clear()
        cpu0, wall0 = tree_cpu_s(gateway_pid), time.monotonic()
        for _ in range(n):
            d = timed("direct", worker, body)
            s = timed("direct streamed", worker, {**body, "stream": True})
            v = timed("gateway", gateway, {**body, "model": "small"})
            if d is None or s is None or v is None:
                continue
            direct_ms.append(d[0])
            streamed_ms.append(s[0])
            via_ms.append(v[0])
            header_ms.append(float(v[1].headers["x-joulegate-overhead-ms"]))
        cpu_s, wall_s = tree_cpu_s(gateway_pid) - cpu0, time.monotonic() - wall0
    if not via_ms:
        return {"failed": failed}
    added = [v - d for d, v in zip(direct_ms, via_ms, strict=True)]
    return {"direct_ms": summary(direct_ms), "direct_streamed_ms": summary(streamed_ms),
            "gateway_ms": summary(via_ms),
            "added_ms_pairwise": summary(added),
            "added_ms_median_of_medians": round(statistics.median(via_ms)
                                                - statistics.median(direct_ms), 3),
            "added_over_streamed_ms_median_of_medians": round(
                statistics.median(via_ms) - statistics.median(streamed_ms), 3),
            "overhead_header_ms": summary(header_ms),
            "gateway_cpu_share_of_a_core": round(cpu_s / wall_s, 4), "failed": failed}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--tokens", type=int, default=1, help="answer tokens (max_tokens)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "overhead.json")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="joulegate-overhead-"))
    wport, gport = free_port(), free_port()
    worker = f"http://127.0.0.1:{wport}"
    procs = [spawn([str(llama_server()), "-m", str(real_model()), "--host", "127.0.0.1",
                    "--port", str(wport), "-c", "2048", "-np", "1", "-t", "1", "--metrics",
                    "--no-webui"], work / "worker.log")]
    try:
        wait_healthy(worker + "/health", 120, procs[0])
        procs.append(joulegate(gport, wport, work, url=worker))
        gateway = f"http://127.0.0.1:{gport}"
        wait_healthy(gateway + "/readyz", 60, procs[1])
        result = {"commit": project_commit(), "machine": f"{os.cpu_count()} cores",
                  "worker": "llama-server, SmolLM2-135M-Instruct Q4_1, 1 thread, CPU",
                  "requests_each": args.requests, "answer_tokens": args.tokens,
                  "order": "in turns: direct, direct streamed, through the gateway",
                  **measure(worker, gateway, procs[1].pid, args.requests, args.tokens)}
    finally:
        stop(procs)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
