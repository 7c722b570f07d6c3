"""`docker compose` for real: the CPU profile of the file users run, built from
this repository, answers the OpenAI client with metered energy, scraped by its
own Prometheus, and keeps its learned state across a restart.

Needs a Docker engine (deploy/ci/dockerd.sh starts one as root) and Debian's
docker.io, docker-compose and debootstrap packages; deploy/ci/build_images.sh
builds the images. Without an engine the test is skipped, unless
JOULEGATE_REQUIRE_DOCKER=1 (CI sets it), where that is a failure. Grafana is the
one service not started: its image cannot be pulled here and Debian has no
package; its dashboards' queries are run against the composed Prometheus.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.integration.conftest import free_port
from tests.integration.panels import panel_failures, workload

pytestmark = [pytest.mark.integration, pytest.mark.timeout(2400)]
ROOT = Path(__file__).resolve().parents[2]
DOCKER = os.environ.get("DOCKER", "/usr/bin/docker")
PROJECT = "joulegate-ci"
STATE = "/srv/joulegate/state"


@dataclass(frozen=True)
class Stack:
    env: dict[str, str]
    gateway: str
    prometheus: str
    agent: str

    def compose(self, *args: str, timeout_s: float = 600) -> str:
        out = subprocess.run(
            ["docker-compose", "-p", PROJECT, "-f", "docker-compose.yml",
             "-f", "deploy/ci/compose.ci.yml", "--profile", "cpu", *args],
            cwd=ROOT, env=self.env, capture_output=True, text=True, timeout=timeout_s)
        assert out.returncode == 0, f"compose {args}: {out.stdout[-3000:]}{out.stderr[-3000:]}"
        return out.stdout

    def read(self, path: str) -> str:
        return self.compose("exec", "-T", "gateway-cpu", "cat", path)


def _engine() -> None:
    usable = shutil.which("docker-compose") and Path(DOCKER).exists() and subprocess.run(
        [DOCKER, "info"], capture_output=True).returncode == 0
    if not usable:
        if os.environ.get("JOULEGATE_REQUIRE_DOCKER") == "1":
            pytest.fail("no Docker engine or docker-compose (.ci/run installs and starts them)")
        pytest.skip("no Docker engine (deploy/ci/dockerd.sh starts one as root)")


def _wait_healthy(stack: Stack, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        ids = stack.compose("ps", "-q").split()
        states = json.loads(subprocess.run([DOCKER, "inspect", *ids], capture_output=True,
                                           text=True, check=True).stdout)
        failed = [s["Name"] for s in states
                  if s["State"]["Status"] == "exited" and s["State"]["ExitCode"] != 0]
        assert not failed, f"{failed} exited with an error:\n{stack.compose('logs')[-6000:]}"
        pending = {s["Name"]: s["State"].get("Health", {}).get("Status")
                   for s in states if s["State"].get("Health")
                   and s["State"]["Health"]["Status"] != "healthy"}
        if not pending:
            return
        if time.monotonic() > deadline:
            logs = stack.compose("logs", "--tail", "30")
            pytest.fail(f"not healthy after {timeout_s:.0f} s: {pending}\n{logs[-6000:]}")
        time.sleep(2)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    _engine()
    log = tmp_path_factory.mktemp("compose") / "build.log"
    with log.open("w") as f:
        built = subprocess.run(["bash", str(ROOT / "deploy" / "ci" / "build_images.sh")],
                               stdout=f, stderr=subprocess.STDOUT, timeout=1800)
    assert built.returncode == 0, log.read_text()[-5000:]
    ports = {name: free_port() for name in
             ("GATEWAY_PORT", "AGENT_PORT", "PROMETHEUS_PORT", "GRAFANA_PORT")}
    env = {**os.environ, "GATEWAY_ADDR": "127.0.0.1", "ADMIN_ADDR": "127.0.0.1",
           **{k: str(v) for k, v in ports.items()}}
    s = Stack(env, f"http://127.0.0.1:{ports['GATEWAY_PORT']}",
              f"http://127.0.0.1:{ports['PROMETHEUS_PORT']}",
              f"http://127.0.0.1:{ports['AGENT_PORT']}")
    s.compose("down", "-v", "--remove-orphans")
    try:
        # As deploy/compose-offline.sh starts it: the cpu profile and what has
        # no profile (Prometheus); Grafana's profile stays off.
        s.compose("up", "-d", "--no-build")
        _wait_healthy(s)
        yield s
    finally:
        s.compose("down", "-v", "--remove-orphans")


def _client(stack: Stack, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=stack.gateway + "/v1", api_key=key, max_retries=0,
                         timeout=60)


def test_the_composed_gateway_answers_the_openai_client_with_metered_energy(
        stack: Stack) -> None:
    key = stack.read(f"{STATE}/first-key").strip()
    assert key.startswith("jg-")
    bad = openai.OpenAI(base_url=stack.gateway + "/v1", api_key="jg-wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.chat.completions.create(model="auto", messages=[{"role": "user", "content": "hi"}])
    client = _client(stack, key)
    for model in ("auto", "small", "large"):
        out = client.chat.completions.create(
            model=model, max_tokens=8,
            messages=[{"role": "user", "content": "Prove that the square root of 2 is "
                                                  "irrational."}])
        assert out.choices[0].message.content is not None
        usage = out.usage.model_dump() if out.usage else {}
        assert usage["energy_joules"] > 0, usage
        assert usage["energy_source"] in ("estimate", "rapl"), usage
    chunks = list(client.chat.completions.create(
        model="auto", max_tokens=8, stream=True, stream_options={"include_usage": True},
        messages=[{"role": "user", "content": "hello"}]))
    last = chunks[-1].usage.model_dump() if chunks[-1].usage else {}
    assert last["energy_joules"] > 0 and last["energy_source"] in ("estimate", "rapl")
    # the figure came from the agent container: the gateway has no meter of its own
    agent_devices = httpx.get(stack.prometheus + "/api/v1/query", params={
        "query": 'joulegate_device_energy_joules_total{job="joulegate-agent"}'}).json()
    assert agent_devices["data"]["result"], agent_devices
    # ... which takes window calls only with the token it shares with the gateway
    forged = httpx.post(stack.agent + "/v1/windows/batch", json={"calls": []})
    assert forged.status_code == 401, forged.text
    # the gateway's limits live in the stack's Redis
    assert "\njoulegate_shared_state_up 1.0" in httpx.get(stack.gateway + "/metrics").text


def test_grafana_is_optional_and_the_key_reads_without_a_terminal(stack: Stack) -> None:
    running = subprocess.run([DOCKER, "ps", "--format", "{{.Names}}"], capture_output=True,
                             text=True, check=True).stdout
    assert PROJECT in running and "grafana" not in running
    key = stack.read(f"{STATE}/first-key")
    assert key.endswith("\n") and "\r" not in key
    assert "exec -T gateway" in stack.compose("logs", "gateway-cpu")


def test_prometheus_scrapes_every_target_and_every_panel_has_data(stack: Stack) -> None:
    key = stack.read(f"{STATE}/first-key").strip()
    workload(stack.gateway + "/v1", key)
    deadline = time.monotonic() + 60
    while True:  # scrape interval 5 s; final energy figures settle within seconds
        time.sleep(5)
        targets = httpx.get(stack.prometheus + "/api/v1/targets").json()["data"]
        active: list[dict[str, Any]] = targets["activeTargets"]
        failures = panel_failures(stack.prometheus)
        down = [t["scrapeUrl"] for t in active if t["health"] != "up"]
        if (not failures and not down) or time.monotonic() > deadline:
            break
    assert {t["labels"]["job"] for t in active} == {"joulegate", "joulegate-agent", "workers"}
    assert len(active) == 4 and down == []
    assert failures == []


def _learned(stack: Stack) -> int:
    doc = json.loads(stack.read(f"{STATE}/expected-lengths.json"))
    return sum(int(n) for per_action in doc["counts"].values() for n in per_action.values())


def test_learned_lengths_survive_a_restart_of_the_gateway(stack: Stack) -> None:
    key = stack.read(f"{STATE}/first-key").strip()
    client = _client(stack, key)
    ask = lambda: client.chat.completions.create(  # noqa: E731
        model="auto", max_tokens=8, messages=[{"role": "user", "content": "What is 2+2?"}])
    ask()
    stack.compose("restart", "gateway-cpu")
    _wait_healthy(stack)
    before = _learned(stack)
    assert before > 0
    for _ in range(3):
        ask()
    stack.compose("restart", "gateway-cpu")  # SIGTERM: saved at shutdown
    _wait_healthy(stack)
    assert _learned(stack) == before + 3  # loaded at start, then added to
    assert stack.read(f"{STATE}/first-key").strip() == key  # keys live in the volume too
