"""API keys against a real worker: open without keys, 401 without a valid key,
per-key requests and tokens per minute (429 + Retry-After), model lists,
revocation, the CLI, and the refusal to serve a public address unprotected."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from app.factory import Seams
from app.tenancy.keys import KeyStore
from app.tools.embedded import free_port, run_gateway
from tests.integration.conftest import Workers, catalog_for, models_file
from tests.integration.test_energy import fake_gpu
from workers.local import ROOT

pytestmark = pytest.mark.integration
MSG = [{"role": "user", "content": "Say hi."}]


def chat(url: str, key: str | None, model: str = "small") -> httpx.Response:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    return httpx.post(url + "/chat/completions", headers=headers, timeout=30,
                      json={"model": model, "messages": MSG, "max_tokens": 4})


def test_without_keys_the_gateway_runs_open(workers: Workers, tmp_path: Path) -> None:
    with run_gateway(catalog_for([workers.small], [workers.large]),
                     state_dir=tmp_path) as gw:
        assert chat(gw.v1, None).status_code == 200


def test_keys_authenticate_limit_and_revoke(workers: Workers, tmp_path: Path,
                                            database: str) -> None:
    store = KeyStore(database)
    _, plain = store.create("team-a")
    _, two_a_minute = store.create("team-b", rpm=2)
    _, few_tokens = store.create("team-c", tpm=10)
    _, small_only = store.create("team-d", models=["small", "auto"])
    with run_gateway(catalog_for([workers.small], [workers.large]), state_dir=tmp_path,
                     database_url=database) as gw:
        for key in (None, "jg-not-a-key", plain[:-1]):
            r = chat(gw.v1, key)
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        assert httpx.get(gw.v1 + "/models").status_code == 401
        # the OpenAI SDK, unchanged: its api_key is the Bearer token
        client = openai.OpenAI(base_url=gw.v1, api_key=plain, max_retries=0)
        r = client.chat.completions.create(model="auto", messages=MSG, max_tokens=4)  # type: ignore[arg-type]
        assert r.choices[0].message is not None
        assert chat(gw.v1, two_a_minute).status_code == 200
        dry_run = httpx.post(gw.v1 + "/route", json={"model": "auto", "messages": MSG},
                             headers={"authorization": f"Bearer {two_a_minute}"}, timeout=30)
        assert dry_run.status_code == 200  # a dry run counts against the rate too
        refused = chat(gw.v1, two_a_minute)
        assert refused.status_code == 429
        assert refused.json()["error"]["code"] == "rpm_limit_exceeded"
        assert 1 <= int(refused.headers["retry-after"]) <= 60
        assert chat(gw.v1, few_tokens).status_code == 200  # spends > 10 tokens
        over = chat(gw.v1, few_tokens)
        assert over.status_code == 429 and over.json()["error"]["code"] == "tpm_limit_exceeded"
        r = chat(gw.v1, small_only, model="large")
        assert r.status_code == 403 and r.json()["error"]["code"] == "model_not_allowed"
        dry = httpx.post(gw.v1 + "/route", headers={"authorization": f"Bearer {small_only}"},
                         json={"model": "large", "messages": MSG}, timeout=30)
        assert dry.status_code == 403  # the dry run obeys the key's model list too
        assert chat(gw.v1, small_only, model="small").status_code == 200
        assert store.revoke("team-a")
        time.sleep(2.5)  # the gateway re-reads the keys every 2 s
        assert chat(gw.v1, plain).status_code == 401
        assert chat(gw.v1, small_only).status_code == 200
        metrics = httpx.get(gw.url + "/metrics").text
    assert plain not in metrics and "jg-" not in metrics
    store.close()


def _env(tmp_path: Path, database: str | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOULEGATE_")}
    env["JOULEGATE_STATE_DIR"] = str(tmp_path)
    if database is not None:
        env["JOULEGATE_DATABASE_URL"] = database
    return env


def _cli(tmp_path: Path, *args: str, database: str | None = None
         ) -> subprocess.CompletedProcess[str]:
    env = _env(tmp_path, database)
    return subprocess.run([sys.executable, "-m", "app.cli", *args], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=60)


def test_cli_shows_a_key_once_and_refuses_public_binds_without_one(tmp_path: Path,
                                                                  database: str) -> None:
    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return _cli(tmp_path, *args, database=database)

    refused = cli("serve", "--host", "0.0.0.0", "--port", str(free_port()))
    assert refused.returncode == 2 and "refusing to serve" in refused.stderr
    created = cli("keys", "create", "--name", "team-a", "--rpm", "600")
    assert created.returncode == 0
    secret = json.loads(created.stdout)["key"]
    assert secret.startswith("jg-") and len(secret) > 40
    listed = cli("keys", "list")
    assert secret not in listed.stdout and json.loads(listed.stdout)[0]["rpm"] == 600
    assert cli("keys", "update", "--name", "team-a", "--rpm", "5").returncode == 0
    assert json.loads(cli("keys", "list").stdout)[0]["rpm"] == 5
    assert cli("keys", "revoke", "--name", "team-a").returncode == 0
    assert cli("keys", "revoke", "--name", "team-a").returncode == 1


def test_first_start_on_a_public_address_can_create_a_key(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOULEGATE_")}
    env.update(JOULEGATE_STATE_DIR=str(tmp_path), JOULEGATE_BOOTSTRAP_KEY="true",
               JOULEGATE_PORT=str(free_port()), JOULEGATE_HOST="0.0.0.0")
    proc = subprocess.Popen([sys.executable, "-m", "app.cli", "serve"], env=env, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 30
        while not (tmp_path / "first-key").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        secret = (tmp_path / "first-key").read_text().strip()
        admin = (tmp_path / "admin-key").read_text().strip()
        assert secret.startswith("jg-") and admin.startswith("jg-") and admin != secret
        for name in ("first-key", "admin-key"):
            assert oct((tmp_path / name).stat().st_mode & 0o777) == "0o600"
        url = f"http://127.0.0.1:{env['JOULEGATE_PORT']}/v1/admin/keys"
        while time.monotonic() < deadline:  # the admin key from the file manages keys
            try:
                r = httpx.get(url, headers={"authorization": f"Bearer {admin}"}, timeout=5)
                break
            except httpx.TransportError:
                time.sleep(0.2)
        assert r.status_code == 200 and [k["name"] for k in r.json()["data"]] == ["first"]
        assert httpx.get(url, headers={"authorization": f"Bearer {secret}"}).status_code == 403
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=30)
    # where they are, never the keys themselves
    assert "first-key" in out and "admin-key" in out and secret not in out and admin not in out


def _usage(url: str, key: str) -> dict[str, Any]:
    r = httpx.get(url + "/usage", params={"since": "1d"},
                  headers={"authorization": f"Bearer {key}"}, timeout=10)
    assert r.status_code == 200
    body: dict[str, Any] = r.json()
    return body


def _until_rows(url: str, key: str, n: int) -> dict[str, Any]:
    """Rows are written once each request's energy is final (the next step)."""
    deadline = time.monotonic() + 10
    while True:
        u = _usage(url, key)
        if u["totals"].get("requests", 0) >= n or time.monotonic() > deadline:
            return u
        time.sleep(0.1)


def test_joule_budgets_and_the_usage_ledger_survive_a_restart(workers: Workers,
                                                               tmp_path: Path,
                                                               database: str) -> None:
    store = KeyStore(database)
    _, tiny = store.create("tiny", joule_budget=0.001, budget_period="day")
    _, other = store.create("other")
    store.close()
    catalog = catalog_for([workers.small], [workers.large])
    seams = Seams(device_factory=fake_gpu)
    with run_gateway(catalog, seams, state_dir=tmp_path, database_url=database) as gw:
        # the gateway serves once the counter has been read (a request answered
        # before the first reading would keep 0 J: once in CI)
        assert seams.devices[0].ledger.last_counter_j is not None
        first = chat(gw.v1, tiny)
        assert first.status_code == 200
        u = _until_rows(gw.v1, tiny, 1)
        energy = gw.v1 + "/energy/" + first.headers["x-joulegate-energy-id"]
        assert httpx.get(energy, headers={"authorization": f"Bearer {tiny}"}).status_code == 200
        assert httpx.get(energy, headers={"authorization": f"Bearer {other}"}).status_code == 404
        metrics = httpx.get(gw.url + "/metrics").text
        assert 'joulegate_key_energy_joules_total{key="tiny"}' in metrics
        assert tiny not in metrics
        assert u["totals"]["requests"] == 1 and u["totals"]["energy_net_j"] > 0.001
        row = u["data"][0]
        assert row["key_name"] == "tiny" and row["source"] == "nvml" and row["status"] == "ok"
        assert row["energy_gross_j"] >= row["energy_net_j"] > 0 and row["completion_tokens"] > 0
        over = chat(gw.v1, tiny)
        assert over.status_code == 429
        assert over.json()["error"]["code"] == "joule_budget_exceeded"
        assert int(over.headers["retry-after"]) <= 86400
        assert "x-joulegate-budget-reset" in over.headers
        assert chat(gw.v1, other).status_code == 200
        theirs = _until_rows(gw.v1, other, 1)
        assert theirs["totals"]["requests"] == 1  # a key sees its own rows only
        assert list(theirs["by_model"]) == ["small-llamacpp"]
    with run_gateway(catalog, Seams(device_factory=fake_gpu), state_dir=tmp_path,
                     database_url=database) as gw:
        assert chat(gw.v1, tiny).status_code == 429  # the spend was persisted
        assert _usage(gw.v1, tiny)["totals"]["requests"] == 1
    cli = _cli(tmp_path, "usage", "--since", "1d", database=database)
    assert cli.returncode == 0 and json.loads(cli.stdout)["totals"]["requests"] == 2


def test_usage_rows_committed_before_a_kill_9_are_all_there(workers: Workers,
                                                             tmp_path: Path,
                                                             database: str) -> None:
    import signal

    from app.tenancy.database import Database
    from app.tenancy.spend import SpendLedger

    store = KeyStore(database)
    key, secret = store.create("team-a")
    store.close()
    models = models_file(workers, tmp_path)
    port = free_port()
    env = _env(tmp_path, database)
    env.update(JOULEGATE_PORT=str(port), JOULEGATE_MODELS_FILE=str(models))
    proc = subprocess.Popen([sys.executable, "-m", "app.cli", "serve"], env=env, cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        from workers.local import wait_healthy

        wait_healthy(f"http://127.0.0.1:{port}/readyz", 60, proc)
        url = f"http://127.0.0.1:{port}/v1"
        for i in range(30):
            assert chat(url, secret, model="small" if i % 2 else "large").status_code == 200
            if i == 19:
                time.sleep(3.0)  # the first 20 are final and written by now
        db = Database(database)
        committed = db.execute("SELECT COUNT(*), SUM(energy_net_j) FROM usage").rows[0]
        db.close()
        assert committed[0] >= 20
    finally:
        proc.send_signal(signal.SIGKILL)  # under way: the last requests' rows are in flight
        proc.wait(timeout=30)
    ledger = SpendLedger(database)
    ledger.prime([key])  # as a gateway does at start-up
    rows = ledger.rows(key.id, 0.0)
    assert len(rows) >= committed[0]  # nothing committed was lost
    assert len(rows) <= 30  # nor written twice
    assert ledger.spent_j(key) == sum(r["energy_net_j"] or 0.0 for r in rows)
    ledger.close()


def test_the_admin_key_manages_keys_and_sees_all_usage(workers: Workers, tmp_path: Path,
                                                        database: str) -> None:
    admin = "jg-admin-" + "x" * 40
    with run_gateway(catalog_for([workers.small], [workers.large]), state_dir=tmp_path,
                     database_url=database,
                     admin_key=admin) as gw:
        h = {"authorization": f"Bearer {admin}"}
        assert chat(gw.v1, None).status_code == 401  # the admin key alone closes the gateway
        r = httpx.post(gw.v1 + "/admin/keys", headers=h,
                       json={"name": "team-a", "rpm": 100, "models": ["small"]})
        assert r.status_code == 201
        secret = r.json()["key"]
        dup = httpx.post(gw.v1 + "/admin/keys", headers=h, json={"name": "team-a"})
        assert dup.status_code == 409
        for hostile in ({"rpm": 1e30}, {"tpm": 10**40}, {"joule_budget": float("inf")},
                        {"models": ["small,large"]}):
            raw = json.dumps({"name": "team-z", **hostile})  # Infinity as JSON writes it
            r = httpx.post(gw.v1 + "/admin/keys", headers={**h, "content-type":
                                                            "application/json"}, content=raw)
            assert r.status_code == 400, r.text
        bad = httpx.post(gw.v1 + "/admin/keys", headers=h, json={"name": "a b", "rpm": -1})
        assert bad.status_code == 400
        time.sleep(2.5)  # the new key is read within 2 s
        assert chat(gw.v1, secret).status_code == 200
        denied = httpx.get(gw.v1 + "/admin/keys",
                           headers={"authorization": f"Bearer {secret}"})
        assert denied.status_code == 403 and denied.json()["error"]["code"] == "admin_only"
        listed = httpx.get(gw.v1 + "/admin/keys", headers=h).json()["data"]
        assert [k["name"] for k in listed] == ["team-a"] and "hash" not in listed[0]
        assert _until_rows(gw.v1, admin, 1)["totals"]["requests"] == 1  # everyone's rows
        assert httpx.post(gw.v1 + "/admin/keys/team-a/revoke", headers=h).status_code == 200
        time.sleep(2.5)
        assert chat(gw.v1, secret).status_code == 401


def test_a_key_near_its_joule_budget_is_steered_to_the_fewest_joules(
        workers: Workers, tmp_path: Path, database: str) -> None:
    store = KeyStore(database)
    _, secret = store.create("near", joule_budget=1e9, budget_period="month")
    h = {"authorization": f"Bearer {secret}"}
    ask = {"model": "auto", "max_tokens": 8, "messages": [
        {"role": "user", "content": "Prove that there are infinitely many primes."}]}
    catalog = catalog_for([workers.small], [workers.large])
    with run_gateway(catalog, Seams(device_factory=fake_gpu), state_dir=tmp_path,
                     database_url=database) as gw:
        before = httpx.post(gw.v1 + "/route", headers=h, json=ask).json()
        assert before["policy"] == "balanced" and "steered" not in before["reason"]
        first = httpx.post(gw.v1 + "/chat/completions", headers=h, json=ask, timeout=30)
        assert "x-joulegate-budget-used" not in first.headers
        spent = _until_rows(gw.v1, secret, 1)["totals"]["energy_net_j"]
        assert store.update("near", joule_budget=spent / 0.9)  # 90% used
        time.sleep(2.5)  # keys are re-read every 2 s
        after = httpx.post(gw.v1 + "/route", headers=h, json=ask).json()
        assert after["policy"] == "min-energy"
        assert "'near' has used 90% of its joule budget: steered" in after["reason"]
        r = httpx.post(gw.v1 + "/chat/completions", headers=h, json=ask, timeout=30)
        assert r.status_code == 200
        assert float(r.headers["x-joulegate-budget-used"]) == pytest.approx(0.9, abs=0.01)
        forced = httpx.post(gw.v1 + "/route", headers=h, json={**ask, "model": "large"})
        assert "steered" not in forced.json()["reason"]  # a named tier is not steered
    store.close()


def test_no_request_waits_for_the_database(workers: Workers, tmp_path: Path, database: str,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Keys, budgets and spend are answered from memory: across key refreshes,
    a key created while the gateway runs (its spend not loaded yet) and a new
    period's first request, no statement runs on the event loop's thread."""
    import asyncio

    from app.tenancy.database import Database

    on_loop: list[str] = []

    def watched(name: str) -> Any:
        real = getattr(Database, name)

        def call(self: Database, *args: Any, **kwargs: Any) -> Any:
            try:
                asyncio.get_running_loop()
                on_loop.append(f"{name}: {str(args[0])[:60]}")
            except RuntimeError:
                pass  # a thread of its own: where the database belongs
            return real(self, *args, **kwargs)
        return call

    store = KeyStore(database)
    _, budgeted = store.create("team-a", joule_budget=1e9)
    with run_gateway(catalog_for([workers.small], [workers.large]), state_dir=tmp_path,
                     database_url=database) as gw:
        for name in ("execute", "insert"):
            monkeypatch.setattr(Database, name, watched(name))
        _, later = store.create("team-b", joule_budget=1e9)
        deadline = time.monotonic() + 5  # more than two of the keys' 2 s refreshes
        while time.monotonic() < deadline:
            assert chat(gw.v1, budgeted, model="auto").status_code == 200
            assert chat(gw.v1, later).status_code in (200, 401)  # 401 until loaded
            time.sleep(0.2)
        assert chat(gw.v1, later).status_code == 200
    store.close()
    assert on_loop == []


def test_eval_sends_the_api_key(workers: Workers, tmp_path: Path, database: str,
                                capsys: pytest.CaptureFixture[str]) -> None:
    from app.cli import main

    store = KeyStore(database)
    _, secret = store.create("evaluator")
    gsm = tmp_path / "gsm.jsonl"
    gsm.write_text(json.dumps({"question": "2+2?", "answer": "two and two #### 4"}) + "\n")
    args = ["eval", "--gsm8k", str(gsm), "--max-tokens", "2", "--out", str(tmp_path / "e.json")]
    with run_gateway(catalog_for([workers.small], [workers.large]), state_dir=tmp_path,
                     database_url=database) as gw:
        assert main([*args, "--url", gw.v1]) == 2
        assert "answered 401" in capsys.readouterr().err
        assert main([*args, "--url", gw.v1, "--api-key", secret]) == 0
        assert "large:cot: 1/1" in capsys.readouterr().err  # progress
    store.close()


def test_a_database_outage_loses_no_request_and_no_row(workers: Workers, tmp_path: Path,
                                                       database: str) -> None:
    """PostgreSQL refusing connections for a while (as if stopped): keyed
    requests are served from memory, /healthz answers at once, and every
    usage row is written once the database is back."""
    if not database.startswith("postgresql"):
        pytest.skip("PostgreSQL only")
    import psycopg

    from app.tenancy.database import Database

    store = KeyStore(database)
    _, secret = store.create("team-a", joule_budget=1e9)
    name = database.rsplit("/", 1)[1]
    admin = os.environ["JOULEGATE_TEST_POSTGRES_URL"]

    def allow(ok: bool) -> None:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS {str(ok).lower()}')
            if not ok:
                conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                             "WHERE datname = %s", (name,))

    with run_gateway(catalog_for([workers.small], [workers.large]), state_dir=tmp_path,
                     database_url=database) as gw:
        assert chat(gw.v1, secret).status_code == 200
        allow(False)
        try:
            for _ in range(10):
                assert chat(gw.v1, secret).status_code == 200
                started = time.monotonic()
                assert httpx.get(gw.url + "/healthz", timeout=5).status_code == 200
                assert time.monotonic() - started < 0.1
            time.sleep(3)  # the key refresh and the row writer meet the outage
            assert chat(gw.v1, secret).status_code == 200
            ready = httpx.get(gw.url + "/readyz").json()
            assert ready["state"] == "degraded" and ready["database"] == "unreachable"
        finally:
            allow(True)
        deadline = time.monotonic() + 20
        db = Database(database)
        while db.execute("SELECT COUNT(*) FROM usage").rows[0][0] < 12:
            assert time.monotonic() < deadline, "usage rows lost"
            time.sleep(0.2)
        db.close()
    store.close()
