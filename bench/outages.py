"""What an outage of a dependency costs the requests that go on meanwhile.

1. The agent killed: one gateway process metered by `joulegate agent` (the
   deployed layout, bench.gateways' row) in front of the fixed-answer nginx;
   wrk at 10 connections while the agent is alive, after it is killed
   (SIGKILL), and after it is started again: statuses, p50 / p99, and the
   gateway's log lines about the agent.
2. The usage database refusing: a SpendLedger whose database raises on
   every call (the seam where app.tenancy.database translates errors),
   200,000 rows waiting; the time of a budget check of a key whose spend is
   not loaded yet, and the memory the waiting rows hold.
3. The usage database back after refusing more rows than memory keeps
   (MAX_UNWRITTEN): a SpendLedger on SQLite with its journal, rows answered
   and recorded as a gateway does while inserts fail, then inserts allowed:
   the memory grown when MAX_UNWRITTEN rows wait and after as many again,
   the seconds until every row is in the table, each once, the journal
   segments at the end of the outage, the descriptors the process grew by
   meanwhile, and the journal's files left.

    python -m bench.outages  ->  bench/results/outages.json

Needs what bench.gateways needs (nginx-light, wrk).
"""

from __future__ import annotations

import json
import os
import resource
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from app.tenancy import spend
from app.tenancy.database import DatabaseError
from app.tenancy.keys import ApiKey
from app.tenancy.spend import SpendLedger, UsageRow
from app.tools.embedded import free_port
from bench.gateways import agent_process, joulegate, models_file, start_nginx, stop_nginx, wrk
from bench.gpu_common import project_commit
from workers.local import ROOT, wait_healthy

BODY = {"model": "small", "messages": [{"role": "user", "content": "hi"}]}
WAITING_ROWS = 200_000
BEYOND = 250_000  # rows past MAX_UNWRITTEN in part 3: memory should not grow


def agent_killed(work: Path, seconds: int = 4) -> dict[str, Any]:
    upstream = start_nginx(work)
    port, agent_port, token = free_port(), free_port(), secrets.token_urlsafe(24)
    models = models_file(port, upstream, work)
    agent = agent_process(agent_port, models, token, work)
    gateway = joulegate(port, upstream, work, agent=(agent_port, token), models=models)
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    out: dict[str, Any] = {"connections": 10, "seconds_each": seconds}
    try:
        wait_healthy(f"http://127.0.0.1:{port}/readyz", 60, gateway)
        wait_healthy(f"http://127.0.0.1:{agent_port}/healthz", 60, agent)
        wrk(url, 10, 1, BODY, work)
        out["agent alive"] = wrk(url, 10, seconds, BODY, work)
        agent.send_signal(signal.SIGKILL)
        agent.wait()
        wrk(url, 10, 1, BODY, work)  # the outage under way
        out["agent killed"] = wrk(url, 10, seconds, BODY, work)
        agent = agent_process(agent_port, models, token, work)
        wait_healthy(f"http://127.0.0.1:{agent_port}/healthz", 60, agent)
        wrk(url, 10, 1, BODY, work)
        out["agent started again"] = wrk(url, 10, seconds, BODY, work)
    finally:
        for proc in (gateway, agent):
            proc.terminate()
            proc.wait(timeout=30)
        stop_nginx(work)
    log = (work / f"joulegate-{port}.log").read_text().splitlines()
    out["gateway_log_lines_about_the_agent"] = sum("joulegate.meter" in line for line in log)
    return out


def database_refusing(work: Path) -> dict[str, Any]:
    ledger = SpendLedger(f"sqlite:///{work / 'usage.db'}", journal=work / "journal")

    def refuse(*_: object, **__: object) -> Any:
        raise DatabaseError("refused (bench.outages)")

    ledger._db.insert = refuse  # type: ignore[method-assign]
    ledger._db.execute = refuse  # type: ignore[method-assign]
    before_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    now = time.time()
    for i in range(WAITING_ROWS):
        ledger.record(UsageRow(now, "other", "b", "auto", "small", "small", "direct", "chat",
                               "ok", 10, 20, 1.0, 2.0, "estimate", 0.1, f"r{i}", True))
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before_kb) / 1024
    key = ApiKey("k1", "a", "h", 0.0, joule_budget=1e9)
    t0 = time.perf_counter()
    ledger.spent_j(key)  # not loaded: what this gateway recorded, and a load asked for
    first_ms = 1000 * (time.perf_counter() - t0)
    time.sleep(1.0)  # the writer tries to load it, and cannot
    t0 = time.perf_counter()
    for _ in range(100):
        ledger.spent_j(key)
    later_us = 1e6 * (time.perf_counter() - t0) / 100
    return {"rows_waiting": WAITING_ROWS, "memory_grown_mb": round(grown_mb, 1),
            "rows_kept_in_memory": len(ledger._unwritten),
            "budget_check_first_ms": round(first_ms, 2),
            "budget_check_after_us": round(later_us, 2)}


def database_back(work: Path) -> dict[str, Any]:
    journal = work / "journal-back"
    ledger = SpendLedger(f"sqlite:///{work / 'back.db'}", journal=journal)
    insert = ledger._db.insert
    refusing = [True]

    def maybe(*args: Any, **kwargs: Any) -> Any:
        if refusing[0]:
            raise DatabaseError("refused (bench.outages)")
        return insert(*args, **kwargs)

    ledger._db.insert = maybe  # type: ignore[method-assign]
    total = spend.MAX_UNWRITTEN + BEYOND
    before_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    fds_before = len(os.listdir("/proc/self/fd"))
    now = time.time()
    for i in range(total):
        row = UsageRow(now, "other", "b", "auto", "small", "small", "direct", "chat", "ok",
                       10, 20, 1.0, 2.0, "estimate", 0.1, f"b{i}", True)
        ledger.answered(row)
        ledger.record(row)
        if i + 1 == spend.MAX_UNWRITTEN:
            at_bound_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before_kb) / 1024
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before_kb) / 1024
    kept = len(ledger._unwritten)
    segments = len(list(journal.glob("*.jsonl")))
    fds_grown = len(os.listdir("/proc/self/fd")) - fds_before
    refusing[0] = False
    t0 = time.monotonic()
    count = 0
    while time.monotonic() - t0 < 120:
        count = ledger._db.execute("SELECT COUNT(*) FROM usage").rows[0][0]
        if count >= total:
            break
        time.sleep(0.05)
    seconds = time.monotonic() - t0
    ledger.close()
    check = SpendLedger(f"sqlite:///{work / 'back.db'}")
    ledger_rows, distinct = check._db.execute(
        "SELECT COUNT(*), COUNT(DISTINCT request_id) FROM usage").rows[0]
    check.close()
    return {"rows": total, "rows_kept_in_memory": kept, "rows_dropped_from_memory": ledger.dropped,
            "memory_grown_mb_at_memory_bound": round(at_bound_mb, 1),
            "memory_grown_mb": round(grown_mb, 1),
            "seconds_until_all_written": round(seconds, 2),
            "rows_in_table": ledger_rows, "distinct_request_ids": distinct,
            "journal_segments_at_the_end_of_the_outage": segments,
            "descriptors_grown_over_the_outage": fds_grown,
            "journal_segments_left": len(list(journal.glob("*.jsonl"))),
            "journal_files_left": len(list(journal.iterdir()))}


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="joulegate-outages-"))
    result: dict[str, Any] = {"commit": project_commit(),
                              "machine": f"{os.cpu_count()} cores",
                              "upstream": "fixed-answer nginx (bench.gateways)"}
    try:
        try:
            result["agent_killed"] = agent_killed(work)
        except (OSError, subprocess.SubprocessError, RuntimeError) as exc:
            result["agent_killed"] = {"error": str(exc)}
        result["database_refusing"] = database_refusing(work)
        result["database_back"] = database_back(work)
    finally:
        shutil.rmtree(work, ignore_errors=True)  # ~70 MB of databases and journals
    out = ROOT / "bench" / "results" / "outages.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
