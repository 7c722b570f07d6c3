"""`joulegate serve --workers 2`: two gateway processes on one port, energy
metered once by the agent the parent starts, metrics merged across them."""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

import httpx
import openai
import pytest

from app.tools.embedded import free_port
from telemetry.metrics import FLUSH_EVERY_S
from tests.integration.conftest import Workers, models_file, serve
from workers.local import wait_healthy

pytestmark = pytest.mark.integration


def _serve_two(workers: Workers, tmp_path: Path) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    proc = serve(models_file(workers, tmp_path), port, tmp_path / "state", tmp_path / "log",
                 "--workers", "2")
    return proc, port


def _children(pid: int) -> set[int]:
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.add(int(stat.parent.name))
        except (OSError, ValueError):
            continue
    return found


def test_two_processes_answer_meter_and_count_together(workers: Workers,
                                                         tmp_path: Path) -> None:
    proc, port = _serve_two(workers, tmp_path)
    try:
        wait_healthy(f"http://127.0.0.1:{port}/readyz", 90, proc)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x",
                               max_retries=0)
        for model in ("small", "large", "auto", "small", "large", "auto"):
            r = client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": "Say hi."}], max_tokens=4)
            usage = r.usage.model_dump()  # type: ignore[union-attr]
            assert usage["energy_source"] == "estimate" and usage["energy_joules"] is not None
        # Both processes' requests, whichever one answers the scrape (each
        # writes its counts every FLUSH_EVERY_S).
        deadline = time.monotonic() + 10 * FLUSH_EVERY_S
        while True:
            text = httpx.get(f"http://127.0.0.1:{port}/metrics").text
            counted = sum(float(v) for v in re.findall(
                r'^joulegate_requests_total\{[^}]*status="ok"[^}]*\} ([\d.e+]+)$', text, re.M))
            if counted == 6 or time.monotonic() > deadline:
                break
            time.sleep(FLUSH_EVERY_S / 4)
        assert counted == 6
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert "energy metered by the agent" in (tmp_path / "log").read_text()


def test_a_gateway_process_that_dies_is_replaced_and_no_request_is_lost(
        workers: Workers, tmp_path: Path) -> None:
    """Each process accepts on a socket of its own; the parent keeps them open,
    so connections the kernel sends to a dead process's socket wait for its
    replacement instead of being refused."""
    proc, port = _serve_two(workers, tmp_path)
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    body = {"model": "small", "messages": [{"role": "user", "content": "Say hi."}],
            "max_tokens": 2}
    try:
        wait_healthy(f"http://127.0.0.1:{port}/readyz", 90, proc)
        gateways = {p for p in _children(proc.pid)
                    if b"multiprocessing" in Path(f"/proc/{p}/cmdline").read_bytes()
                    and b"resource_tracker" not in Path(f"/proc/{p}/cmdline").read_bytes()}
        assert len(gateways) == 2
        victim = min(gateways)
        os.kill(victim, 9)
        for _ in range(12):  # fresh connections: some hash to the dead process's socket
            with httpx.Client(timeout=60) as client:
                assert client.post(url, json=body).status_code == 200
        deadline = time.monotonic() + 10  # the parent notices within its poll
        while victim in _children(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert victim not in _children(proc.pid)
        assert "exited with -9; restarting in" in (tmp_path / "log").read_text()
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_a_gateway_killed_under_load_loses_no_usage_row(workers: Workers,
                                                        tmp_path: Path) -> None:
    """Every request a client got an answer for has its usage row after kill -9
    and the next start (the journal), with its final figure where the counter
    had settled it, the response's otherwise."""
    from concurrent.futures import ThreadPoolExecutor

    from app.tenancy.spend import SpendLedger

    port, state = free_port(), tmp_path / "state"
    proc = serve(models_file(workers, tmp_path), port, state, tmp_path / "log")
    answered: list[str] = []
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    try:
        wait_healthy(f"http://127.0.0.1:{port}/readyz", 90, proc)

        def client_loop(model: str) -> None:
            with httpx.Client(timeout=30) as client:
                while proc.poll() is None:
                    try:
                        r = client.post(url, json={"model": model, "max_tokens": 3, "messages": [
                            {"role": "user", "content": "Say hi."}]})
                    except httpx.HTTPError:
                        return  # the gateway is gone
                    if r.status_code == 200:
                        answered.append(r.headers["x-joulegate-energy-id"])

        with ThreadPoolExecutor(8) as pool:
            for i in range(8):
                pool.submit(client_loop, ("small", "large")[i % 2])
            deadline = time.monotonic() + 60
            while len(answered) < 60 and time.monotonic() < deadline:
                time.sleep(0.05)
            os.kill(proc.pid, 9)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert len(answered) >= 60
    ledger = SpendLedger(f"sqlite:///{state / 'joulegate.db'}", journal=state / "journal")
    rows = {r["request_id"]: r for r in ledger.rows(None, 0.0)}
    ledger.close()
    assert set(answered) <= set(rows), f"{len(set(answered) - set(rows))} rows lost"
    assert all(rows[i]["energy_net_j"] is not None for i in answered)
    assert "stopped gateway had journaled" not in (tmp_path / "log").read_text()
