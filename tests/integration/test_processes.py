"""`joulegate serve --workers 2`: two gateway processes on one port, energy
metered once by the agent the parent starts, metrics merged across them."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import openai
import pytest

from app.embedded import free_port
from tests.integration.conftest import Workers, models_file
from workers.local import ROOT, wait_healthy

pytestmark = pytest.mark.integration


def test_two_processes_answer_meter_and_count_together(workers: Workers,
                                                         tmp_path: Path) -> None:
    models = models_file(workers, tmp_path)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JOULEGATE_", "PROMETHEUS_"))}
    env.update(JOULEGATE_MODELS_FILE=str(models), JOULEGATE_PORT=str(port))
    proc = subprocess.Popen([sys.executable, "-m", "app.cli", "serve", "--workers", "2"],
                            env=env, cwd=ROOT, stdout=(tmp_path / "log").open("wb"),
                            stderr=subprocess.STDOUT)
    try:
        wait_healthy(f"http://127.0.0.1:{port}/readyz", 90, proc)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x",
                               max_retries=0)
        for model in ("small", "large", "auto", "small", "large", "auto"):
            r = client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": "Say hi."}], max_tokens=4)
            usage = r.usage.model_dump()  # type: ignore[union-attr]
            assert usage["energy_source"] == "estimate" and usage["energy_joules"] is not None
        text = httpx.get(f"http://127.0.0.1:{port}/metrics").text
        counted = sum(float(v) for v in re.findall(
            r'^joulegate_requests_total\{[^}]*status="ok"[^}]*\} ([\d.e+]+)$', text, re.M))
        assert counted == 6  # both processes' requests, whichever one answered the scrape
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert "energy metered by the agent" in (tmp_path / "log").read_text()
