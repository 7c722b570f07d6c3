"""Schemathesis over the served OpenAPI document, against the gateway with fake
workers: generated bodies, valid and invalid. No 5xx, every error in the
OpenAI envelope, every response as the document declares it (all checks but
positive-data acceptance: a body valid by the schema can still ask for more
tokens than a backend's context, which is a 400)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from app.tools.embedded import run_gateway
from tests.app.fake_workers import FakeWorkers, fake_catalog

ADMIN = "jg-admin-key-for-the-fuzzer-0123456789"


@pytest.mark.timeout(900)  # ~3.5 min alone on 2 cores for the open run; more when busy
@pytest.mark.parametrize(("auth", "examples", "min_cases"), [
    ("open", 700, 2000),     # no keys: every route served
    ("admin", 150, 500),     # keyed, with the admin key: the admin routes' bodies too
    ("keyless", 40, 150),    # keyed, no key sent: every 401 as documented
])
def test_schemathesis_finds_nothing(tmp_path: Path, auth: str, examples: int,
                                    min_cases: int) -> None:
    report = tmp_path / "st.json"
    st = Path(sys.executable).parent / "st"
    keys = {} if auth == "open" else {"admin_key": ADMIN}
    header = ["-H", f"Authorization: Bearer {ADMIN}"] if auth == "admin" else []
    with run_gateway(fake_catalog(), FakeWorkers().seams(), health_interval_seconds=60,
                     **keys) as gw:
        run = subprocess.run(
            [str(st), "run", gw.url + "/openapi.json", "--max-examples", str(examples),
             "--phases", "examples,fuzzing", "--checks", "all",
             "--exclude-checks", "positive_data_acceptance", "--workers", "2", "--seed", "7",
             *header, "--report", "json", "--report-json-path", str(report)],
            capture_output=True, text=True, timeout=850)
    result = json.loads(report.read_text())
    assert run.returncode == 0 and not result["failures"] and not result["errors"], \
        run.stdout[-4000:]
    assert result["test_cases"]["generated"] >= min_cases, result["test_cases"]
