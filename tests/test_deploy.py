"""Static checks of the deployment files: the compose file against the Compose
specification schema, every Dockerfile with hadolint, every image pinned, the
Prometheus config with promtool, and the dashboards being up to date. The
compose stack itself runs in tests/integration/test_compose.py."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
SCHEMA_WHEEL = ROOT / ".cache" / "schema" / "docker_compose-1.29.2-py2.py3-none-any.whl"


def compose_validator() -> jsonschema.Draft7Validator:
    with zipfile.ZipFile(SCHEMA_WHEEL) as z:
        schema = json.loads(z.read("compose/config/compose_spec.json"))
    return jsonschema.Draft7Validator(schema)


def test_compose_file_matches_the_compose_specification() -> None:
    doc = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    errors = [f"{list(e.path)}: {e.message}" for e in compose_validator().iter_errors(doc)]
    assert errors == []
    # and the validator does catch mistakes
    bad = {**doc, "services": {**doc["services"], "gateway": {**doc["services"]["gateway"],
                                                              "restart": 5}}}
    assert list(compose_validator().iter_errors(bad))


def test_compose_profiles_and_order() -> None:
    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    for profile in ("gpu", "vllm", "cpu"):
        names = {n for n, s in services.items() if profile in s.get("profiles", [])}
        gateways = [n for n in names if n.startswith("gateway")]
        assert len(gateways) == 1, profile
        deps = services[gateways[0]]["depends_on"]
        assert all(v["condition"] == "service_healthy" for v in deps.values())
        assert any(n.startswith("agent") for n in names)
        assert sum(n.startswith("worker") for n in names) == 2
    assert services["worker-small"]["image"].startswith("ghcr.io/ggml-org/llama.cpp:server-cuda")
    assert services["worker-small-vllm"]["image"].startswith("vllm/vllm-openai")
    assert "--metrics" in services["worker-large"]["command"]
    assert "profiles" not in services["prometheus"]  # every stack has its metrics
    assert "profiles" not in services["redis"]  # and its shared limits
    assert services["grafana"]["profiles"] == ["grafana"]  # optional: no offline image
    assert "grafana" in (ROOT / ".env").read_text()  # but on by default
    for name, svc in services.items():  # the agent binds all of its container's addresses,
        if name.startswith("agent"):     # so it needs the token the gateways read
            assert "--host" in svc["command"], name
            assert "JOULEGATE_AGENT_TOKEN_FILE" in svc["environment"], name
        if name.startswith("gateway"):
            env = svc["environment"]
            assert env["JOULEGATE_AGENT_TOKEN_FILE"] == services["agent"]["environment"][
                "JOULEGATE_AGENT_TOKEN_FILE"], name
            assert env["JOULEGATE_REDIS_URL"] == "redis://redis:6379/0", name


DOCKERFILES = ["Dockerfile", "workers/llama-server.Dockerfile", "deploy/ci/prometheus.Dockerfile",
               "deploy/ci/redis.Dockerfile"]


@pytest.mark.parametrize("name", DOCKERFILES)
def test_dockerfiles_lint_clean(name: str) -> None:
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    # DL3008: apt packages come from the pinned Debian release of the base image
    out = subprocess.run([hadolint, "--no-color", "--ignore", "DL3008", str(ROOT / name)],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    text = (ROOT / name).read_text()
    assert "USER " in text and "USER root" not in text and "# syntax" not in text
    assert "ARG BASE_IMAGE=" in text  # CI builds on a base made with debootstrap


def test_gateway_image_is_non_root_with_a_health_check() -> None:
    text = (ROOT / "Dockerfile").read_text()
    assert "HEALTHCHECK" in text and "USER 10001" in text and text.count("FROM ") == 2


def test_every_third_party_image_is_pinned() -> None:
    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    images = {s["image"] for s in services.values() if "image" in s}
    k8s = "\n".join(p.read_text() for p in (ROOT / "deploy" / "k8s").glob("*.yaml"))
    images |= set(re.findall(r"image: ([^\s]+/[^\s]+)", k8s))
    bases = {m for name in DOCKERFILES
             for m in re.findall(r"ARG BASE_IMAGE=(\S+)", (ROOT / name).read_text())}
    for image in images | bases:
        tag = image.rsplit(":", 1)[1] if ":" in image.split("/")[-1] else ""
        assert tag and tag != "latest" and any(c.isdigit() for c in tag), image


def test_promtool_accepts_the_prometheus_config() -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool missing: .ci/run installs Debian's prometheus package"
    out = subprocess.run([promtool, "check", "config", str(ROOT / "deploy" / "prometheus.yml")],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_dashboards_are_generated_from_the_builder(tmp_path: Path) -> None:
    folder = ROOT / "deploy" / "grafana" / "dashboards"
    k8s = ROOT / "deploy" / "k8s" / "dashboards.yaml"
    before = {p.name: p.read_text() for p in folder.glob("*.json")}
    before_k8s = k8s.read_text()
    out = subprocess.run([sys.executable, str(ROOT / "deploy" / "grafana" /
                                              "build_dashboards.py")],
                         capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0
    assert before == {p.name: p.read_text() for p in folder.glob("*.json")}, "run the builder"
    assert before_k8s == k8s.read_text(), "run the builder"
    for name in ("energy", "gateway"):
        d = json.loads((ROOT / "deploy" / "grafana" / "dashboards" / f"{name}.json").read_text())
        assert d["uid"] == f"joulegate-{name}"
        assert _overlaps(d["panels"]) == [], f"{name}: panels overlap"
        assert {v["name"] for v in d["templating"]["list"]} >= {"tier", "backend"}


def _overlaps(panels: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """Pairs of panels whose grid rectangles overlap, or that leave the 24-wide grid."""
    boxes = [(p["title"], p["gridPos"]) for p in panels]
    out = [(t, "the grid") for t, g in boxes if g["x"] < 0 or g["x"] + g["w"] > 24]
    for i, (a, ga) in enumerate(boxes):
        for b, gb in boxes[i + 1:]:
            if ga["x"] < gb["x"] + gb["w"] and gb["x"] < ga["x"] + ga["w"] \
                    and ga["y"] < gb["y"] + gb["h"] and gb["y"] < ga["y"] + ga["h"]:
                out.append((a, b))
    return out
