"""Load benchmark: 1,000 concurrent requests against real llama-server workers.

    python -m bench.load [--n 1000] [--out bench/results/load.json]

Starts two CPU llama-server workers (the test models) and the gateway as its
own process (`joulegate serve`), then sends N non-streamed and then N streamed
chat requests (`auto`, max_tokens 1) all at once. Meanwhile /healthz is polled
every 20 ms from a separate process. Every request must get an answer or a fast 429/503, none may
hang; the gateway's RSS is read before and after, and its
`joulegate_requests_total` must equal what was sent. Results are written as
JSON even when requests fail.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from app.tools.embedded import free_port
from bench.gpu_common import project_commit
from bench.overhead import pct
from bench.process import cpu_s, rss_mb
from workers.local import ROOT, WorkerSpec, llama_server, start_worker, stop, wait_healthy

CLIENT_TIMEOUT_S = 120.0
MSG = [{"role": "user", "content": "hello there, how are you today?"}]


def _catalog(small: int, large: int) -> dict[str, Any]:
    shipped = yaml.safe_load((ROOT / "models.yaml").read_text())
    for b, port in zip(shipped["backends"], (small, large), strict=True):
        b["replicas"][0]["url"] = f"http://127.0.0.1:{port}"
        b["curves"] = str(ROOT / b["curves"])
    shipped["routing"]["lengths_file"] = None
    return dict(shipped)


def _pct(xs: list[float], q: float) -> float | None:
    """The q-quantile of seconds, in ms (None for no samples)."""
    return round(pct(xs, q) * 1000, 1) if xs else None


async def _one(session: aiohttp.ClientSession, url: str, stream: bool
               ) -> tuple[str, float]:
    body = {"model": "auto", "messages": MSG, "max_tokens": 1, "stream": stream}
    start = time.perf_counter()
    try:
        async with session.post(url, json=body) as r:
            data = await r.read()
            status = str(r.status)
            if r.status == 200 and stream and not data.rstrip().endswith(b"[DONE]"):
                status = "200-incomplete"
    except TimeoutError:
        status = "client_timeout"
    except aiohttp.ClientError as exc:
        status = f"client_error:{type(exc).__name__}"
    return status, time.perf_counter() - start


def _poll_health(url: str, seconds: float, out: Any) -> None:
    """In a process of its own, so that the load generator's busy event loop does
    not delay the probes: /healthz every 20 ms, latencies sent back."""
    import http.client
    from urllib.parse import urlparse

    u = urlparse(url)
    deadline = time.monotonic() + seconds
    latencies = []
    while time.monotonic() < deadline and not out.poll():
        start = time.perf_counter()
        try:
            conn = http.client.HTTPConnection(u.hostname or "127.0.0.1", u.port, timeout=10)
            conn.request("GET", u.path)
            conn.getresponse().read()
            conn.close()
            latencies.append(time.perf_counter() - start)
        except OSError:
            latencies.append(float("inf"))
        time.sleep(0.02)
    out.send(latencies)


async def _phase(base: str, n: int, stream: bool) -> dict[str, Any]:
    timeout = aiohttp.ClientTimeout(total=CLIENT_TIMEOUT_S)
    conn = aiohttp.TCPConnector(limit=0, force_close=True)
    mine, theirs = multiprocessing.Pipe()
    poller = multiprocessing.Process(target=_poll_health,
                                     args=(base + "/healthz", CLIENT_TIMEOUT_S + 30, theirs))
    poller.start()
    await asyncio.sleep(0.3)
    async with aiohttp.ClientSession(timeout=timeout, connector=conn) as session:
        start = time.perf_counter()
        results = await asyncio.gather(*(_one(session, base + "/v1/chat/completions", stream)
                                         for _ in range(n)))
        wall_s = time.perf_counter() - start
    await asyncio.sleep(0.5)
    mine.send("stop")
    health: list[float] = mine.recv()
    poller.join()
    by_status: dict[str, list[float]] = {}
    for status, seconds in results:
        by_status.setdefault(status, []).append(seconds)
    return {
        "sent": n, "stream": stream, "wall_s": round(wall_s, 2),
        "statuses": dict(Counter(s for s, _ in results)),
        "latency_ms": {s: {"p50": _pct(xs, 0.5), "p99": _pct(xs, 0.99),
                           "max": _pct(xs, 1.0)} for s, xs in by_status.items()},
        "healthz_ms": {"n": len(health), "p50": _pct(health, 0.5), "p99": _pct(health, 0.99),
                       "max": _pct(health, 1.0)},
        "hung": sum(1 for s, _ in results if s == "client_timeout"),
    }


def _requests_total(base: str) -> float:
    import urllib.request

    with urllib.request.urlopen(base + "/metrics", timeout=10) as r:
        text = r.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("joulegate_requests_total{"))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "load.json")
    parser.add_argument("--profile", type=Path, default=None,
                        help="record the gateway with py-spy (collapsed stacks) to this file")
    args = parser.parse_args()
    binary = llama_server()
    logs = Path(tempfile.mkdtemp(prefix="joulegate-load-"))
    specs = [WorkerSpec("small", "tiny-small", free_port()),
             WorkerSpec("large", "tiny-large", free_port())]
    workers = [start_worker(s, binary, logs) for s in specs]
    models = logs / "models.yaml"
    models.write_text(yaml.safe_dump(_catalog(specs[0].port, specs[1].port)))
    port = free_port()
    env = dict(os.environ, JOULEGATE_MODELS_FILE=str(models), JOULEGATE_PORT=str(port),
               JOULEGATE_LOG_LEVEL="warning")
    gateway = subprocess.Popen([sys.executable, "-m", "app.cli", "serve"], env=env, cwd=ROOT,
                               stdout=(logs / "gateway.log").open("wb"),
                               stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    result: dict[str, Any] = {"commit": project_commit(),
                              "machine": f"{platform.machine()}, {os.cpu_count()} cores",
                              "n": args.n, "client_timeout_s": CLIENT_TIMEOUT_S,
                              "workers": "2 CPU llama-server (tiny test models, -np 4)"}
    try:
        wait_healthy(base + "/readyz", 60, gateway)
        result["rss_mb_before"] = round(rss_mb(gateway.pid), 1)
        spy = None
        if args.profile is not None:
            spy = subprocess.Popen([str(Path(sys.executable).parent / "py-spy"), "record",
                                    "--pid", str(gateway.pid), "--format", "raw", "--rate",
                                    "200", "--output", str(args.profile)])
            time.sleep(1)
        phases = []
        for stream in (False, True):
            before, cpu_before = _requests_total(base), cpu_s(gateway.pid)
            phase = asyncio.run(_phase(base, args.n, stream))
            phase["gateway_cpu_s"] = round(cpu_s(gateway.pid) - cpu_before, 2)
            time.sleep(1.0)
            phase["requests_total_delta"] = _requests_total(base) - before
            phase["rss_mb_after"] = round(rss_mb(gateway.pid), 1)
            phases.append(phase)
            print(json.dumps(phase), flush=True)
        result["phases"] = phases
        if spy is not None:
            spy.send_signal(2)
            spy.wait(timeout=30)
    except Exception as exc:  # the run still writes what it has
        result["error"] = f"{type(exc).__name__}: {exc}"
        raise
    finally:
        stop([gateway, *workers])
        result["gateway_log_tail"] = (logs / "gateway.log").read_text()[-2000:]
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
