"""Latency the gateway adds: the same request direct to a worker and through joulegate.

Needs the `make run` setup (workers on :8101/:8102, gateway on :8000). Sends
N tiny chat requests (max_tokens 1) alternately direct and through the
gateway (forced to the small tier, so routing is not timed here; see
bench/route_latency.py), one at a time over keep-alive connections.

    python -m bench.overhead [N]   ->  bench/results/overhead.json
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 300
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    direct, via = [], []
    with httpx.Client(timeout=30) as client:
        for _ in range(20):  # warm-up
            client.post("http://127.0.0.1:8101/v1/chat/completions", json=body)
            client.post("http://127.0.0.1:8000/v1/chat/completions",
                        json={**body, "model": "small"})
        for _ in range(n):
            t0 = time.perf_counter()
            client.post("http://127.0.0.1:8101/v1/chat/completions", json=body).raise_for_status()
            direct.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            client.post("http://127.0.0.1:8000/v1/chat/completions",
                        json={**body, "model": "small"}).raise_for_status()
            via.append(time.perf_counter() - t0)
    ms = 1000.0
    result = {
        "requests_each": n,
        "direct_ms_median": ms * statistics.median(direct), "direct_ms_p99": ms * pct(direct, .99),
        "gateway_ms_median": ms * statistics.median(via), "gateway_ms_p99": ms * pct(via, .99),
        "added_ms_median": ms * (statistics.median(via) - statistics.median(direct)),
        "added_ms_p99": ms * (pct(via, .99) - pct(direct, .99)),
        "machine": "2-core development machine, worker tiny-small on CPU, sequential",
    }
    (ROOT / "bench" / "results" / "overhead.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
