"""What authentication, rate limits and the joule budget add to a request.

Times the gateway's own check (`app.http.auth.authorize`: Bearer header, key
lookup by hash with a constant-time compare, budget from memory, requests per
minute) on a real SQLite state database with 1,000 keys, every key with a
budget and limits, against the open gateway's check (no keys); and the same
on PostgreSQL when given one (a role that may create databases).

    python -m bench.auth_latency [--postgres postgresql://...]
        ->  bench/results/auth-latency.json
Goal (issue 12): <= 0.1 ms p50 on SQLite.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, cast

from starlette.requests import Request

from app.http.auth import authorize
from app.http.gateway import Gateway
from app.tenancy.admission import Admission
from app.tenancy.keys import KeyRing, KeyStore
from app.tenancy.spend import SpendLedger
from bench.gpu_common import project_commit

ROOT = Path(__file__).resolve().parent.parent
CALLS = 20_000
SECONDS = 5.0  # the keys are reloaded (every 2 s) while the checks are timed


class _Gw:
    def __init__(self, keys: KeyRing | None, spend: SpendLedger | None) -> None:
        self.keys, self.spend, self.admission = keys, spend, Admission()


def _request(secret: str | None) -> Request:
    headers = [(b"authorization", f"Bearer {secret}".encode())] if secret else []
    return Request({"type": "http", "method": "POST", "path": "/v1/chat/completions",
                    "headers": headers, "query_string": b""})


def _time(gw: Any, request: Request, n: int) -> dict[str, float]:
    """At least `n` checks and at least SECONDS of them, so that the keys'
    refresher thread (every 2 s) runs while they are timed."""
    return asyncio.run(_timed(gw, request, n))


async def _timed(gw: Any, request: Request, n: int) -> dict[str, float]:
    for _ in range(200):
        await authorize(cast(Gateway, gw), request)
    times: list[float] = []
    end = time.perf_counter() + SECONDS
    while len(times) < n or time.perf_counter() < end:
        t0 = time.perf_counter()
        await authorize(cast(Gateway, gw), request)
        times.append(time.perf_counter() - t0)
    times.sort()
    return {"calls": len(times), "p50_ms": 1000 * statistics.median(times),
            "p99_ms": 1000 * times[int(0.99 * len(times))],
            "p99_9_ms": 1000 * times[int(0.999 * len(times))],
            "max_ms": 1000 * times[-1]}


def _keyed(url: str) -> dict[str, Any]:
    store = KeyStore(url)
    secrets = [store.create(f"team-{i}", rpm=10**9, tpm=10**9, joule_budget=1e12)[1]
               for i in range(1000)]
    spend = SpendLedger(url)
    ring = KeyRing(store)  # the gateway's refresh interval (2 s), its thread running
    spend.prime(ring.active_keys())
    ring.start()
    try:
        return _time(_Gw(ring, spend), _request(secrets[500]), CALLS)
    finally:
        spend.close()
        ring.close()


def main() -> None:
    import argparse

    import psycopg

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--postgres", help="postgresql://... (a role with CREATEDB)")
    args = parser.parse_args()
    result: dict[str, Any] = {"keys": 1000, "min_calls": CALLS, "min_seconds": SECONDS,
                              "refresh_s": 2.0, "commit": project_commit(),
                              "goal": "<= 0.1 ms p50 on SQLite"}
    with tempfile.TemporaryDirectory() as tmp:
        result["with_keys"] = _keyed(f"sqlite:///{Path(tmp) / 'joulegate.db'}")
    result["open_gateway"] = _time(_Gw(None, None), _request(None), CALLS)
    result["storage"] = "sqlite"
    if args.postgres:
        name = f"jg_bench_{int(time.time())}"
        with psycopg.connect(args.postgres, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        try:
            result["with_keys_postgresql"] = _keyed(args.postgres.rsplit("/", 1)[0] + "/" + name)
        finally:
            with psycopg.connect(args.postgres, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
    out = ROOT / "bench" / "results" / "auth-latency.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
