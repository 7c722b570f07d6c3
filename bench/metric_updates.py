"""What a request's metric updates cost the gateway: the eight counter and
histogram updates of one forced request, written by prometheus_client one by
one (`direct`) or added up and flushed together (`batched`, telemetry.metrics,
one flush per 200 requests: ~FLUSH_EVERY_S at 2,000 req/s), in one process and
under prometheus_client's multiprocess mode (`serve --workers N`).

    python -m bench.metric_updates   ->  bench/results/metric-updates.json
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.gpu_common import project_commit

ROOT = Path(__file__).resolve().parent.parent
REQUESTS = 40_000
FLUSH_EVERY = 200  # requests


def _one_mode(way: str) -> float:
    """Microseconds per request's updates (run in a process of its own: the
    multiprocess mode is chosen by the environment before the import)."""
    from prometheus_client import CollectorRegistry

    from telemetry.metrics import Metrics
    from telemetry.timeline import EnergyFigure

    m = Metrics(CollectorRegistry())
    fig = EnergyFigure(net_j=1.0, gross_j=2.0, source="estimate", final=True, prefill_j=0.3,
                       decode_j=0.7, standalone_j=1.0)
    children = m._requests, m._upstream_s, m._tokens, m._overhead_s, m._request_energy, m._energy

    def batched() -> None:
        m.request("small", "small-1b", "forced", "forced", "ok")
        m.observe_upstream("small", "small-1b", 0.002)
        m.tokens("small", "small-1b", 10, 5)
        m.observe_overhead(0.0002)
        m.request_energy("small", "small-1b", fig)

    def direct() -> None:
        requests, upstream, tokens, overhead, energy, phases = children
        requests("small", "small-1b", "forced", "forced", "ok").inc()
        upstream("small", "small-1b").observe(0.002)
        tokens("small", "small-1b", "prompt").inc(10)
        tokens("small", "small-1b", "completion").inc(5)
        overhead().observe(0.0002)
        energy("small", "small-1b", "estimate").observe(fig.net_j)
        phases("small", "small-1b", "prefill", "estimate").inc(fig.prefill_j)
        phases("small", "small-1b", "decode", "estimate").inc(fig.decode_j)

    update = batched if way == "batched" else direct
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for i in range(REQUESTS):
            update()
            if i % FLUSH_EVERY == 0:
                m.flush()
        m.flush()
        best = min(best, (time.perf_counter() - start) / REQUESTS * 1e6)
    return best


def main() -> None:
    if len(sys.argv) == 2:  # a child: one mode
        print(_one_mode(sys.argv[1]))
        return
    results: dict[str, Any] = {"commit": project_commit(), "requests": REQUESTS,
                               "flush_every_requests": FLUSH_EVERY, "us_per_request": {}}
    for mode in ("one process", "multiprocess"):
        for way in ("direct", "batched"):
            env = dict(os.environ, PYTHONPATH=str(ROOT))
            env.pop("PROMETHEUS_MULTIPROC_DIR", None)
            with tempfile.TemporaryDirectory() as files:
                if mode == "multiprocess":
                    env["PROMETHEUS_MULTIPROC_DIR"] = files
                out = subprocess.run([sys.executable, "-m", "bench.metric_updates", way],
                                     env=env, cwd=ROOT, capture_output=True, text=True,
                                     check=True).stdout
            results["us_per_request"][f"{mode}, {way}"] = round(float(out), 2)
    path = ROOT / "bench" / "results" / "metric-updates.json"
    path.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
