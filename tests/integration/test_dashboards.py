"""Every Grafana panel query returns data from a real Prometheus.

A real Prometheus (Debian's package) scrapes the gateway, a `joulegate agent`
and the real llama-server workers with the project's deploy/prometheus.yml,
rewritten to local ports. After a short workload that exercises every panel
(routing to both tiers, streams, a loop-guard stop, a thinking budget, a
rejected request, all with an API key), each query of each panel, with the dashboard variables
substituted, is evaluated through Prometheus's HTTP API.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from app.tenancy.keys import KeyStore
from tests.integration.conftest import (
    Workers,
    catalog_for,
    free_port,
    run_gateway,
    running_agent,
)
from tests.integration.panels import panel_failures, render_panels, workload

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def prometheus_config(targets: dict[str, list[str]]) -> dict[str, Any]:
    cfg = yaml.safe_load((ROOT / "deploy" / "prometheus.yml").read_text())
    cfg["global"]["scrape_interval"] = "1s"
    jobs = []
    for job in cfg["scrape_configs"]:
        if job["job_name"] in targets:
            job["static_configs"] = [{"targets": targets[job["job_name"]]}]
            jobs.append(job)
    cfg["scrape_configs"] = jobs
    return cfg


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    binary = shutil.which("prometheus")
    assert binary, "prometheus missing: .ci/run installs Debian's prometheus package"
    port = free_port()
    cfg = tmp_path / "prometheus.yml"
    cfg.write_text("global: {}\n")
    proc = subprocess.Popen(
        [binary, f"--config.file={cfg}", f"--storage.tsdb.path={tmp_path / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}", "--web.enable-lifecycle"],
        stdout=(tmp_path / "prom.log").open("wb"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(url + "/-/ready").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, (tmp_path / "prom.log").read_text()[-2000:]
            time.sleep(0.2)
        yield url, cfg
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_every_panel_query_returns_data(workers: Workers, prometheus: tuple[str, Path],
                                        tmp_path: Path) -> None:
    prom, cfg_path = prometheus
    store = KeyStore(f"sqlite:///{tmp_path / 'state' / 'joulegate.db'}")
    _, key = store.create("team-a")
    store.close()
    catalog = catalog_for([workers.small], [workers.large])
    # The large backend is marked as a reasoning model so the thinking-budget
    # panel has requests to show (the tiny model ignores the budget field).
    catalog = catalog.model_copy(update={"backends": [
        b.model_copy(update={"reasoning": b.tier == "large"}) for b in catalog.backends]})
    with running_agent(catalog) as (agent_url, _), \
            run_gateway(catalog, agent_url=agent_url, state_dir=tmp_path / "state") as gw:
        host = lambda url: url.split("//", 1)[1]  # noqa: E731
        cfg_path.write_text(yaml.safe_dump(prometheus_config({
            "joulegate": [host(gw.url)], "joulegate-agent": [host(agent_url)],
            "workers": [host(workers.small), host(workers.large)]})))
        assert httpx.post(prom + "/-/reload").status_code == 200
        time.sleep(2)
        workload(gw.v1, key)
        time.sleep(5)  # final energy figures settle; several scrapes
        targets = httpx.get(prom + "/api/v1/targets").json()["data"]["activeTargets"]
        assert targets and all(t["health"] == "up" for t in targets), targets
        failures = panel_failures(prom)
        assert failures == []
        out = os.environ.get("JOULEGATE_PANEL_PNG")
        if out:  # a picture for the README: a minute of steady traffic first
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                workload(gw.v1, key)
            time.sleep(3)
            render_panels(prom, Path(out))
