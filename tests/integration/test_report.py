"""`GET /v1/report` and `joulegate report` on a live gateway with real workers:
the per-category table, every field, the admin's alone when keys are on."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest

from app.factory import Seams
from app.tools.embedded import run_gateway
from tests.integration.conftest import Workers, catalog_for
from tests.integration.test_energy import fake_gpu
from tests.integration.test_keys import _cli, _until_rows

pytestmark = pytest.mark.integration
PROMPTS = {"chat": "Hi there, how are you today?",
           "math": "A train travels 60 km in 45 minutes. What is its speed in km/h? "
                   "Show each step of the calculation."}


def test_the_report_on_a_live_gateway(workers: Workers, tmp_path: Path, database: str
                                      ) -> None:
    admin = "jg-admin-" + "r" * 40
    h = {"authorization": f"Bearer {admin}"}
    with run_gateway(catalog_for([workers.small], [workers.large]),
                     Seams(device_factory=fake_gpu), state_dir=tmp_path,
                     database_url=database, admin_key=admin) as gw:
        for text in PROMPTS.values():
            for _ in range(3):
                r = httpx.post(gw.v1 + "/chat/completions", headers=h, timeout=60, json={
                    "model": "auto", "messages": [{"role": "user", "content": text}],
                    "max_tokens": 16, "ignore_eos": True})
                assert r.status_code == 200, r.text
        usage = _until_rows(gw.v1, admin, 6)
        deadline = time.monotonic() + 5
        while True:  # the final figures reach the ledger a counter step later
            report = httpx.get(gw.v1 + "/report", headers=h, params={"since": "1h"}).json()
            if report["totals"]["requests"] == 6 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert report["totals"]["requests"] == usage["totals"]["requests"] == 6
        assert report["totals"]["completion_tokens"] == usage["totals"]["completion_tokens"]
        assert report["totals"]["energy_net_j"] == pytest.approx(
            usage["totals"]["energy_net_j"], abs=1e-3)  # rounded to mJ
        assert report["totals"]["sources"] == ["nvml"]
        cats = report["by_category"]
        assert sum(f["requests"] for f in cats.values()) == 6
        ref = report["reference_category"]
        assert cats[ref]["token_multiplier"] == pytest.approx(1.0)
        for f in cats.values():
            for field in ("prompt_tokens", "completion_tokens", "energy_net_j",
                          "energy_gross_j", "joules_per_token", "loop_stops",
                          "token_multiplier", "energy_multiplier", "divergence"):
                assert field in f
            p = f["predictions"]
            assert p["measured_gross_j"] > 0 and p["token_linear_j"] > 0
            assert p["curve_alone_j"] > 0  # the CPU test workers' curves
        assert set(report["by_backend"]) <= {"small-llamacpp", "large-llamacpp"}
        assert report["mean_divergence_by_backend"]
        # each device's split since start: idle + attributed + tail = measured
        ((dev_name, dev),) = report["devices"]["data"].items()
        assert dev["source"] == "nvml" and dev["measured_j"] > 0
        assert dev["idle_j"] + dev["attributed_j"] + dev["tail_j"] == pytest.approx(
            dev["measured_j"], abs=0.01)
        bad = httpx.get(gw.v1 + "/report", headers=h, params={"since": "soon"})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "since"
        new = httpx.post(gw.v1 + "/admin/keys", headers=h, json={"name": "team"}).json()
        time.sleep(2.5)  # the new key is read within 2 s
        theirs = httpx.get(gw.v1 + "/report", headers={"authorization": f"Bearer {new['key']}"})
        assert theirs.status_code == 403  # every key's requests: the admin's alone
        # the CLI on the live gateway: the same table, and the devices' tail
        live = _cli(tmp_path, "report", "--since", "1h", "--gateway", gw.url, "--key", admin)
        assert live.returncode == 0, live.stderr
        assert "reference category" in live.stdout and " tail" in live.stdout
        live_js = _cli(tmp_path, "report", "--since", "1h", "--json", "--gateway", gw.url,
                       "--key", admin)
        assert json.loads(live_js.stdout)["devices"]["data"].keys() == {dev_name}
        refused = _cli(tmp_path, "report", "--gateway", gw.url, "--key", new["key"])
        assert refused.returncode == 1 and "403" in refused.stderr
    cli = _cli(tmp_path, "report", "--since", "1h", database=database)
    assert cli.returncode == 0, cli.stderr
    assert "reference category" in cli.stdout and ref in cli.stdout
    plot = tmp_path / "report.png"
    js = _cli(tmp_path, "report", "--since", "1h", "--json", "--plot", str(plot),
              database=database)
    assert js.returncode == 0, js.stderr
    assert json.loads(js.stdout)["totals"]["requests"] == 6
    assert plot.stat().st_size > 10_000
