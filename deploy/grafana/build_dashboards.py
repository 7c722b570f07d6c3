"""Writes the provisioned Grafana dashboards (energy.json, gateway.json), and
the same dashboards and provisioning files as Kubernetes ConfigMaps
(deploy/k8s/dashboards.yaml).

The dashboards are generated so every panel follows one shape and the CI
test (tests/integration/test_dashboards.py) can evaluate every query:

    python deploy/grafana/build_dashboards.py
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parent / "dashboards"
PROVISIONING = Path(__file__).resolve().parent / "provisioning"
K8S = Path(__file__).resolve().parents[1] / "k8s" / "dashboards.yaml"
DS = {"type": "prometheus", "uid": "prometheus"}
R = "$__rate_interval"
T = 'tier=~"$tier"'
B = 'backend=~"$backend"'
D = 'device=~"$device"'


def var(name: str, metric: str, label: str) -> dict[str, Any]:
    return {"name": name, "label": name, "type": "query", "datasource": DS,
            "query": {"query": f"label_values({metric}, {label})", "refId": name},
            "definition": f"label_values({metric}, {label})", "refresh": 2,
            "includeAll": True, "multi": True, "allValue": ".*",
            "current": {"selected": True, "text": "All", "value": "$__all"}}


def panel(title: str, exprs: list[tuple[str, str]], unit: str, kind: str = "timeseries",
          description: str = "") -> dict[str, Any]:
    return {"title": title, "type": kind, "datasource": DS, "description": description,
            "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
            "options": {"legend": {"displayMode": "list", "placement": "bottom"}},
            "targets": [{"refId": chr(65 + i), "expr": e, "legendFormat": lf, "datasource": DS}
                        for i, (e, lf) in enumerate(exprs)]}


def layout(panels: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Panels left to right in rows of 24 units: stats 8 wide, graphs 12; a
    panel that does not fit starts the next row, below the row's tallest."""
    x = y = row_h = 0
    for i, p in enumerate(panels):
        w, h = (8, 5) if p["type"] == "stat" else (12, 8)
        if x + w > 24:
            x, y, row_h = 0, y + row_h, 0
        p["id"] = i + 1
        p["gridPos"] = {"h": h, "w": w, "x": x, "y": y}
        x, row_h = x + w, max(row_h, h)
    return panels


def dashboard(uid: str, title: str, panels: list[dict[str, Any]],
              variables: list[dict[str, Any]]) -> dict[str, Any]:
    return {"uid": uid, "title": title, "tags": ["joulegate"], "timezone": "browser",
            "schemaVersion": 39, "version": 1, "refresh": "10s",
            "time": {"from": "now-1h", "to": "now"},
            "templating": {"list": variables}, "panels": layout(panels)}


def energy() -> dict[str, Any]:
    p = [
        panel("Energy per request by tier (p50, p95)", [
            (f'histogram_quantile(0.5, sum by (le, tier) (rate(joulegate_request_energy_joules_bucket{{{T},{B}}}[{R}])))', "p50 {{tier}}"),
            (f'histogram_quantile(0.95, sum by (le, tier) (rate(joulegate_request_energy_joules_bucket{{{T},{B}}}[{R}])))', "p95 {{tier}}"),
        ], "joule", description="Net joules per request (final figures), label source says how measured"),
        panel("Energy per output token by tier and backend", [
            (f'sum by (tier, backend) (rate(joulegate_energy_joules_total{{{T},{B}}}[{R}])) / sum by (tier, backend) (rate(joulegate_tokens_total{{kind="completion",{T},{B}}}[{R}]))', "{{tier}} {{backend}}"),
        ], "joule"),
        panel("Total energy measured", [
            (f'sum(joulegate_device_energy_joules_total{{{D}}}) / 3.6e6', "kWh"),
        ], "kwatth", "stat"),
        panel("Energy saved against always-large (expected, from the curves)", [
            ('sum by (baseline) (joulegate_energy_saved_joules_total) / 3.6e6', "{{baseline}}"),
            ('(sum(joulegate_energy_saved_joules_total) - sum(joulegate_own_energy_joules_total)) / 3.6e6',
             "net of joulegate's own (estimate)"),
        ], "kwatth", "stat", description="Net: less what joulegate's processes (gateways, agents) "
                                        "spent themselves, their CPU seconds x watts per core"),
        panel("Idle share of measured energy", [
            (f'sum(joulegate_idle_energy_joules_total{{{D}}}) / sum(joulegate_device_energy_joules_total{{{D}}})', "idle share"),
        ], "percentunit", "stat"),
        panel("Power per device", [
            (f'joulegate_device_power_watts{{{D}}}', "{{device}} power ({{source}})"),
            (f'joulegate_device_idle_power_watts{{{D}}}', "{{device}} idle ({{source}})"),
        ], "watt"),
        panel("Energy by account", [
            (f'sum by (device) (rate(joulegate_attributed_energy_joules_total{{{D}}}[{R}]))', "{{device}} attributed"),
            (f'sum by (device) (rate(joulegate_idle_energy_joules_total{{{D}}}[{R}]))', "{{device}} idle"),
            (f'sum by (device) (rate(joulegate_tail_energy_joules_total{{{D}}}[{R}]))', "{{device}} tail"),
        ], "watt", description="attributed + idle + tail = measured"),
        panel("Routing mix (category -> tier x strategy)", [
            (f'sum by (category, tier, strategy) (increase(joulegate_routing_decisions_total{{{T}}}[$__range]))', "{{category}} -> {{tier}}:{{strategy}}"),
        ], "short", "barchart"),
        panel("Joules by key", [
            ('sum by (key) (increase(joulegate_key_energy_joules_total[$__range]))', "{{key}}"),
        ], "J", description="Net joules of each API key's finished requests (the key's "
                            "name as its admin set it; never the key)."),
        panel("Thinking-budget requests and loop-guard stops", [
            (f'sum by (tier, backend) (increase(joulegate_thinking_budget_requests_total{{{T},{B}}}[$__range]))', "thinking budget {{backend}}"),
            (f'sum by (tier, backend, reason) (increase(joulegate_generation_stops_total{{{T},{B}}}[$__range]))', "stopped: {{reason}} {{backend}}"),
        ], "short"),
        panel("Seconds since each energy counter was read", [
            (f'joulegate_counter_read_age_seconds{{{D}}}', "{{device}} ({{source}})"),
        ], "s", description="Read every 0.1 s or faster; a failing counter's grows, and "
                            "past 5 s /readyz says energy stale (requests are still answered, "
                            "their figures provisional until it reads again)"),
        panel("Requests given up: their counter unread for 30 s", [
            (f'sum by (device) (increase(joulegate_windows_given_up_total{{{D}}}[$__range]))', "{{device}}"),
        ], "short", "stat", description="Requests whose energy figure stays provisional: "
                                        "their device's counter could not be read for 30 s "
                                        "while they ran or waited for their final figure"),
        panel("Energy source in use", [
            (f'count by (device, source) (joulegate_device_energy_joules_total{{{D}}})', "{{device}}: {{source}}"),
        ], "short", "stat"),
    ]
    return dashboard("joulegate-energy", "joulegate - Energy", p, [
        var("tier", "joulegate_requests_total", "tier"),
        var("backend", "joulegate_requests_total", "backend"),
        var("device", "joulegate_device_energy_joules_total", "device")])


def gateway() -> dict[str, Any]:
    p = [
        panel("Requests per second", [
            (f'sum by (tier, route) (rate(joulegate_requests_total{{{T},{B}}}[{R}]))', "{{tier}} {{route}}"),
        ], "reqps"),
        panel("Upstream latency (p50, p99)", [
            (f'histogram_quantile(0.5, sum by (le, backend) (rate(joulegate_upstream_seconds_bucket{{{T},{B}}}[{R}])))', "p50 {{backend}}"),
            (f'histogram_quantile(0.99, sum by (le, backend) (rate(joulegate_upstream_seconds_bucket{{{T},{B}}}[{R}])))', "p99 {{backend}}"),
        ], "s"),
        panel("Added overhead (p50, p99) and routing time (p99)", [
            (f'histogram_quantile(0.5, sum by (le) (rate(joulegate_overhead_seconds_bucket[{R}])))', "overhead p50"),
            (f'histogram_quantile(0.99, sum by (le) (rate(joulegate_overhead_seconds_bucket[{R}])))', "overhead p99"),
            (f'histogram_quantile(0.99, sum by (le) (rate(joulegate_route_seconds_bucket[{R}])))', "route p99"),
        ], "s"),
        panel("Errors by type", [
            (f'sum by (status) (increase(joulegate_requests_total{{status!="ok",{T},{B}}}[$__range]))', "{{status}}"),
            ('sum by (code) (increase(joulegate_rejected_requests_total[$__range]))', "rejected: {{code}}"),
        ], "short"),
        panel("Backend up", [
            (f'joulegate_backend_up{{{B}}}', "{{backend}}"),
        ], "short", "stat"),
        panel("Tokens per second", [
            (f'sum by (backend, kind) (rate(joulegate_tokens_total{{{T},{B}}}[{R}]))', "{{backend}} {{kind}}"),
        ], "short"),
    ]
    return dashboard("joulegate-gateway", "joulegate - Gateway", p, [
        var("tier", "joulegate_requests_total", "tier"),
        var("backend", "joulegate_requests_total", "backend")])


def config_maps(dashboards: dict[str, str]) -> str:
    """Two ConfigMaps: the provisioning files (keys `<folder>-<file>`) and the
    dashboards; deploy/k8s/grafana.yaml mounts them where compose does."""
    import yaml

    provisioning = {f"{p.parent.name}-{p.name}": p.read_text()
                    for p in sorted(PROVISIONING.glob("*/*.yml"))}
    docs = [{"apiVersion": "v1", "kind": "ConfigMap",
             "metadata": {"name": name, "labels": {"app.kubernetes.io/part-of": "joulegate"}},
             "data": data}
            for name, data in (("grafana-provisioning", provisioning),
                               ("grafana-dashboards", dashboards))]
    class Literal(yaml.SafeDumper):  # multi-line files as readable | blocks
        pass

    Literal.add_representer(str, lambda d, v: d.represent_scalar(
        "tag:yaml.org,2002:str", v, style="|" if "\n" in v else None))
    head = "# Generated by deploy/grafana/build_dashboards.py from deploy/grafana; do not edit.\n"
    return head + "---\n".join(yaml.dump(d, Dumper=Literal, sort_keys=False, width=100) for d in docs)


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    texts = {}
    for name, d in (("energy", energy()), ("gateway", gateway())):
        texts[f"{name}.json"] = json.dumps(d, indent=2) + "\n"
        (OUT / f"{name}.json").write_text(texts[f"{name}.json"])
        print(OUT / f"{name}.json")
    K8S.write_text(config_maps(texts))
    print(K8S)


if __name__ == "__main__":
    main()
