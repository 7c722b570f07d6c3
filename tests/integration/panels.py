"""The dashboards' queries against a live Prometheus: a workload that feeds
every panel, the check that each query returns data, and a rendering of the
Energy dashboard's time series (shared by the local and the compose tests)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx

DASHBOARDS = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "dashboards"


def workload(v1: str, key: str | None = None) -> None:
    """A few requests that give every panel something to show: both tiers, a
    stream, a loop-guard stop, a thinking budget (where the large backend is a
    reasoning one), a refused model."""
    msg = lambda text: [{"role": "user", "content": text}]  # noqa: E731
    headers = {"authorization": f"Bearer {key}"} if key else {}
    with httpx.Client(timeout=60, headers=headers) as c:
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


def panel_failures(prom: str) -> list[str]:
    """Each dashboard variable with no values and each panel query with no data."""
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
                    failures.append(f"{path.name} '{panel['title']}': {target['expr']}")
    return failures
