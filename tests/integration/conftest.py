"""Real llama-server workers and an in-process gateway for integration tests."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client import CollectorRegistry

from app.catalog import Catalog, parse_catalog
from app.factory import device_spec
from app.tools.embedded import RunningGateway, free_port, run_gateway
from telemetry.agent import AgentServer, start_agent
from telemetry.devices import metered_device, start_samplers
from telemetry.metrics import Metrics
from workers.local import ROOT, WorkerSpec, llama_server, start_worker, stop


@dataclass
class Workers:
    small: str
    large: str
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)


@pytest.fixture(scope="session")
def llama_bin() -> str:
    return str(llama_server())


@pytest.fixture(scope="session")
def workers(llama_bin: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Workers]:
    logs = tmp_path_factory.mktemp("logs")
    specs = {"small": WorkerSpec("small", "tiny-small", free_port()),
             "large": WorkerSpec("large", "tiny-large", free_port())}
    procs = {k: start_worker(s, Path(llama_bin), logs) for k, s in specs.items()}
    try:
        yield Workers(f"http://127.0.0.1:{specs['small'].port}",
                      f"http://127.0.0.1:{specs['large'].port}", procs)
    finally:
        stop(list(procs.values()))


def catalog_for(small: list[str], large: list[str], source: str = "estimate",
                **defaults: Any) -> Catalog:
    def replicas(urls: list[str]) -> list[dict[str, str]]:
        return [{"url": u, "device": "cpu"} for u in urls]

    shipped = yaml.safe_load((ROOT / "models.yaml").read_text())
    curves = {b["name"]: b.get("curves") for b in shipped["backends"]}
    return parse_catalog({
        "base_dir": str(ROOT),
        "quality": shipped["quality"],
        "routing": {**shipped["routing"], "lengths_file": None},
        "tiers": ["small", "large"],
        "devices": [{"name": "cpu", "source": source, "max_power_w": 40,
                     "estimate_idle_power_w": 8}],
        "backends": [
            {"name": "small-llamacpp", "kind": "llamacpp", "tier": "small",
             "model": "tiny-small", "replicas": replicas(small),
             "curves": curves["small-llamacpp"]},
            {"name": "large-llamacpp", "kind": "llamacpp", "tier": "large",
             "model": "tiny-large", "replicas": replicas(large),
             "curves": curves["large-llamacpp"]},
        ],
        "defaults": {"max_tokens": 32, **defaults},
    })


@pytest.fixture(scope="module")
def gateway(workers: Workers) -> Iterator[RunningGateway]:
    with run_gateway(catalog_for([workers.small], [workers.large])) as gw:
        yield gw


__all__ = ["RunningGateway", "Workers", "catalog_for", "final_energy", "free_port",
           "run_gateway", "running_agent"]


@contextmanager
def running_agent(catalog: Catalog, token: str | None = None
                  ) -> Iterator[tuple[str, AgentServer]]:
    """A real `joulegate agent` (samplers, ledgers, HTTP) for the catalog's
    devices; `token`: required of window calls."""
    devices = {d.name: metered_device(device_spec(d), 0.1) for d in catalog.devices}
    samplers = start_samplers(devices.values(), 20)
    port = free_port()
    server, _ = start_agent("127.0.0.1", port, devices, Metrics(CollectorRegistry()),
                            token=token)
    try:
        yield f"http://127.0.0.1:{port}", server
    finally:
        server.shutdown()
        for s in samplers:
            s.stop()


def final_energy(v1: str, energy_id: str, timeout_s: float = 3.0) -> dict[str, Any]:
    """Poll GET /v1/energy/{id} until the figure is final (or the timeout)."""
    deadline = time.monotonic() + timeout_s
    fig: dict[str, Any] = httpx.get(f"{v1}/energy/{energy_id}").json()
    while not fig["final"] and time.monotonic() < deadline:
        time.sleep(0.05)
        fig = httpx.get(f"{v1}/energy/{energy_id}").json()
    return fig


def serve(models: Path, port: int, state: Path, log: Path, *args: str,
          **settings: str) -> subprocess.Popen[bytes]:
    """`joulegate serve [args]` as a process of its own: the test's models
    file, port and state directory, and `settings` (JOULEGATE_ variables);
    none of this process's JOULEGATE_ or PROMETHEUS_ variables."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JOULEGATE_", "PROMETHEUS_"))}
    env.update(JOULEGATE_MODELS_FILE=str(models), JOULEGATE_PORT=str(port),
               JOULEGATE_STATE_DIR=str(state), **settings)
    return subprocess.Popen([sys.executable, "-m", "app.cli", "serve", *args], env=env,
                            cwd=ROOT, stdout=log.open("wb"), stderr=subprocess.STDOUT)


def models_file(workers: Workers, directory: Path) -> Path:
    """models.yaml for a `joulegate serve` subprocess in front of the test
    workers (estimate meter, the CPU curves, no learned lengths)."""
    shipped = yaml.safe_load((ROOT / "models.yaml").read_text())
    for b in shipped["backends"]:
        url = workers.small if b["tier"] == "small" else workers.large
        b["replicas"] = [{"url": url, "device": shipped["devices"][0]["name"]}]
        b["curves"] = str(ROOT / b["curves"])
    shipped["devices"][0]["source"] = "estimate"
    shipped["routing"]["lengths_file"] = None
    path = directory / "models.yaml"
    path.write_text(yaml.safe_dump(shipped))
    return path
