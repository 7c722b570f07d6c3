"""Every Grafana panel query returns data from a real Prometheus.

A real Prometheus (Debian's package) scrapes the gateway, a `joulegate agent`
and the real llama-server workers with the project's deploy/prometheus.yml,
rewritten to local ports. After a short workload that exercises every panel
(routing to both tiers, streams, a loop-guard stop, a thinking budget, a
rejected request), each query of each panel, with the dashboard variables
substituted, is evaluated through Prometheus's HTTP API.
"""

from __future__ import annotations

import json
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

from tests.integration.conftest import (
    Workers,
    catalog_for,
    free_port,
    run_gateway,
    running_agent,
)

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
DASHBOARDS = ROOT / "deploy" / "grafana" / "dashboards"


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


def workload(v1: str) -> None:
    msg = lambda text: [{"role": "user", "content": text}]  # noqa: E731
    with httpx.Client(timeout=60) as c:
        for _ in range(3):
            c.post(v1 + "/chat/completions", json={"model": "auto", "messages": msg("hi!"),
                                                   "max_tokens": 8}).raise_for_status()
        for _ in range(2):
            c.post(v1 + "/chat/completions", json={
                "model": "auto", "max_tokens": 8,
                "messages": msg("Write a Python function that merges two sorted lists.")}
            ).raise_for_status()
        with c.stream("POST", v1 + "/chat/completions", json={
                "model": "small", "messages": msg("hello"), "max_tokens": 8, "stream": True,
                "stream_options": {"include_usage": True}}) as r:
            r.read()
        with c.stream("POST", v1 + "/completions", json={
                "model": "large", "prompt": "go", "max_tokens": 1000, "stream": True,
                "grammar": 'root ::= ("again " )+', "ignore_eos": True}) as r:
            r.read()  # stopped by the loop guard
        assert c.post(v1 + "/chat/completions", json={"model": "nope", "messages": msg("x")}
                      ).status_code == 404


def query(prom: str, expr: str) -> list[Any]:
    r = httpx.get(prom + "/api/v1/query", params={"query": expr}).json()
    assert r["status"] == "success", (expr, r)
    result: list[Any] = r["data"]["result"]
    return result


def substitute(expr: str) -> str:
    for var in ("$tier", "$backend", "$device"):
        expr = expr.replace(var, ".*")
    return expr.replace("$__rate_interval", "30s").replace("$__range", "10m")


def render_panels(prom: str, out: Path) -> None:
    """Plot the Energy dashboard's time-series panels from the same PromQL."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dash = json.loads((DASHBOARDS / "energy.json").read_text())
    panels = [p for p in dash["panels"] if p["type"] == "timeseries"]
    fig, axes = plt.subplots(2, 2, figsize=(13, 7))
    end = time.time()
    for ax, panel in zip(axes.flat, panels, strict=False):
        for target in panel["targets"]:
            expr = substitute(target["expr"]).replace("[30s]", "[15s]")
            r = httpx.get(prom + "/api/v1/query_range", params={
                "query": expr, "start": end - 60, "end": end, "step": 1}).json()
            for series in r["data"]["result"]:
                label = target["legendFormat"]
                for k, v in series["metric"].items():
                    label = label.replace("{{" + k + "}}", v)
                ts = [float(t) - end for t, _ in series["values"]]
                ax.plot(ts, [float(v) for _, v in series["values"]], label=label)
        ax.set_title(panel["title"], fontsize=9)
        ax.set_xlabel("seconds", fontsize=8)
        ax.set_ylabel(panel["fieldConfig"]["defaults"]["unit"], fontsize=8)
        ax.legend(fontsize=6)
    fig.suptitle("joulegate - Energy dashboard panels, rendered from a live Prometheus "
                 "(CPU test workers, estimate source)", fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


def test_every_panel_query_returns_data(workers: Workers,
                                        prometheus: tuple[str, Path]) -> None:
    prom, cfg_path = prometheus
    catalog = catalog_for([workers.small], [workers.large])
    # The large backend is marked as a reasoning model so the thinking-budget
    # panel has requests to show (the tiny model ignores the budget field).
    catalog = catalog.model_copy(update={"backends": [
        b.model_copy(update={"reasoning": b.tier == "large"}) for b in catalog.backends]})
    with running_agent(catalog) as (agent_url, _), \
            run_gateway(catalog, agent_url=agent_url) as gw:
        host = lambda url: url.split("//", 1)[1]  # noqa: E731
        cfg_path.write_text(yaml.safe_dump(prometheus_config({
            "joulegate": [host(gw.url)], "joulegate-agent": [host(agent_url)],
            "llamacpp": [host(workers.small), host(workers.large)]})))
        assert httpx.post(prom + "/-/reload").status_code == 200
        time.sleep(2)
        workload(gw.v1)
        time.sleep(5)  # final energy figures settle; several scrapes
        targets = httpx.get(prom + "/api/v1/targets").json()["data"]["activeTargets"]
        assert targets and all(t["health"] == "up" for t in targets), targets
        failures = []
        for path in sorted(DASHBOARDS.glob("*.json")):
            dash = json.loads(path.read_text())
            for var in dash["templating"]["list"]:
                metric, label = var["definition"][len("label_values("):-1].split(", ")
                values = httpx.get(f"{prom}/api/v1/label/{label}/values",
                                   params={"match[]": metric}).json()["data"]
                if not values:
                    failures.append(f"{path.name} variable {var['name']}: no values")
            for panel in dash["panels"]:
                for target in panel["targets"]:
                    if not query(prom, substitute(target["expr"])):
                        failures.append(f"{path.name} '{panel['title']}': "
                                        f"{target['expr']}")
        assert failures == []
        out = os.environ.get("JOULEGATE_PANEL_PNG")
        if out:  # a picture for the README: a minute of steady traffic first
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                workload(gw.v1)
            time.sleep(3)
            render_panels(prom, Path(out))
