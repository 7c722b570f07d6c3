"""The Kubernetes manifests (deploy/k8s): every object validates strictly
against the Kubernetes API schemas (kubernetes-validate), and the pieces fit
together: selectors, services, config maps, probes, scrape annotations, the
models file and the Prometheus configuration they carry."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from app.catalog import load_catalog

ROOT = Path(__file__).resolve().parent.parent
K8S = ROOT / "deploy" / "k8s"
VERSION = "1.33.0"  # a release current clusters run; the schemas are bundled


def objects() -> list[dict[str, Any]]:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    docs = []
    for name in kustomization["resources"]:
        docs += [d for d in yaml.safe_load_all((K8S / name).read_text()) if d]
    return docs


def by_kind(kind: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in objects() if o["kind"] == kind}


def pod_specs() -> dict[str, dict[str, Any]]:
    return {name: o["spec"]["template"] for kind in ("Deployment", "DaemonSet")
            for name, o in by_kind(kind).items()}


def test_kustomization_lists_every_manifest() -> None:
    listed = set(yaml.safe_load((K8S / "kustomization.yaml").read_text())["resources"])
    assert listed == {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}


@pytest.mark.parametrize("obj", objects(), ids=lambda o: f"{o['kind']}/{o['metadata']['name']}")
def test_every_object_validates_against_the_kubernetes_schema(obj: dict[str, Any]) -> None:
    kubernetes_validate.validate(obj, VERSION, strict=True)


def test_the_validator_rejects_mistakes() -> None:
    deployment = by_kind("Deployment")["joulegate-gateway"]
    wrong = {**deployment, "spec": {**deployment["spec"], "replica": 2}}  # a typo
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(wrong, VERSION, strict=True)
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    bad_port = {**container, "ports": [{"containerPort": "http"}]}
    spec = {**deployment["spec"]["template"]["spec"], "containers": [bad_port]}
    wrong = {**deployment, "spec": {**deployment["spec"], "template": {
        **deployment["spec"]["template"], "spec": spec}}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(wrong, VERSION, strict=True)


def test_selectors_services_and_references_fit() -> None:
    pods = pod_specs()
    config_maps, secrets_optional = by_kind("ConfigMap"), True
    for kind in ("Deployment", "DaemonSet"):
        for name, o in by_kind(kind).items():
            labels = o["spec"]["template"]["metadata"]["labels"]
            assert o["spec"]["selector"]["matchLabels"].items() <= labels.items(), name
    for name, svc in by_kind("Service").items():
        matched = [p for p in pods.values()
                   if svc["spec"]["selector"].items() <= p["metadata"]["labels"].items()]
        assert matched, f"service {name} selects no pod"
        ports = {p["name"] for c in matched[0]["spec"]["containers"] for p in c["ports"]}
        assert all(p["targetPort"] in ports for p in svc["spec"]["ports"]), name
    for name, pod in pods.items():
        for vol in pod["spec"].get("volumes", []):
            if "configMap" in vol:
                assert vol["configMap"]["name"] in config_maps, (name, vol)
        for c in pod["spec"]["containers"]:
            for e in c.get("env", []):
                ref = e.get("valueFrom", {}).get("secretKeyRef")
                assert ref is None or (ref["optional"] is secrets_optional), (name, e)
            named = {p["name"] for p in c["ports"]}
            for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
                port = c.get(probe, {}).get("httpGet", c.get(probe, {}).get("tcpSocket", {}))
                if port:
                    assert port["port"] in named, (name, probe)
        port = pod["metadata"].get("annotations", {}).get("prometheus.io/port")
        if port is not None:
            assert int(port) in {p["containerPort"] for c in pod["spec"]["containers"]
                                 for p in c["ports"]}, name
    for hpa in by_kind("HorizontalPodAutoscaler").values():
        assert hpa["spec"]["scaleTargetRef"]["name"] in by_kind("Deployment")
    accounts = set(by_kind("ServiceAccount"))
    assert all(p["spec"].get("serviceAccountName", "prometheus") in accounts
               for p in pods.values())


def test_everything_that_exports_metrics_is_scraped() -> None:
    pods = pod_specs()
    scraped = {n for n, p in pods.items()
               if p["metadata"].get("annotations", {}).get("prometheus.io/scrape") == "true"}
    assert scraped == {"joulegate-gateway", "joulegate-agent", "worker-small", "worker-large"}


def test_the_models_file_loads_and_each_device_names_its_agent(tmp_path: Path) -> None:
    text = by_kind("ConfigMap")["joulegate-models"]["data"]["models.yaml"]
    path = tmp_path / "models.yaml"
    path.write_text(text.replace("/srv/joulegate/", f"{ROOT}/"))  # the image's layout
    catalog = load_catalog(path)
    assert all(d.agent is not None and d.source == "nvml" for d in catalog.devices)
    services = by_kind("Service")
    for b in catalog.backends:
        for r in b.replicas:
            host, port = r.base.split("//")[1].split(":")
            assert host in services and int(port) in {
                p["port"] for p in services[host]["spec"]["ports"]}
    agent = by_kind("DaemonSet")["joulegate-agent"]["spec"]["template"]["spec"]
    assert "$(NODE_NAME)" in agent["containers"][0]["args"]  # each meters its own node
    assert {d.host for d in catalog.devices} <= {
        p["spec"]["nodeSelector"]["kubernetes.io/hostname"]
        for n, p in pod_specs().items() if n.startswith("worker")}


def test_promtool_accepts_the_cluster_prometheus_config(tmp_path: Path) -> None:
    """Debian's promtool is built without Kubernetes discovery, so the
    discovery block is swapped for a static target; everything else (the
    relabelling rules above all) is checked as written."""
    promtool = shutil.which("promtool")
    assert promtool, "promtool missing: .ci/run installs Debian's prometheus package"
    doc = yaml.safe_load(by_kind("ConfigMap")["prometheus-config"]["data"]["prometheus.yml"])
    for job in doc["scrape_configs"]:
        assert job.pop("kubernetes_sd_configs")[0]["role"] == "pod"
        job["static_configs"] = [{"targets": ["10.0.0.1:8080"]}]
        rewrite = next(r for r in job["relabel_configs"]
                       if r.get("target_label") == "__address__")
        for address in ("10.1.2.3:8080", "10.1.2.3"):  # with and without a declared port
            m = re.fullmatch(rewrite["regex"], f"{address};8000")  # Prometheus anchors
            assert m is not None
            assert rewrite["replacement"].replace("$1", m[1]).replace("$2", m[2]) \
                == "10.1.2.3:8000"
    cfg = tmp_path / "prometheus.yml"
    cfg.write_text(yaml.safe_dump(doc))
    out = subprocess.run([promtool, "check", "config", str(cfg)], capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stdout + out.stderr
