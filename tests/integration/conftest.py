"""Real llama-server workers and an in-process gateway for integration tests."""

from __future__ import annotations

import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from app.catalog import Catalog, parse_catalog
from app.factory import Seams, create_app
from app.settings import Settings
from workers.local import WorkerSpec, llama_server, start_worker, stop


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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

    return parse_catalog({
        "tiers": ["small", "large"],
        "devices": [{"name": "cpu", "source": source, "max_power_w": 40,
                     "estimate_idle_power_w": 8}],
        "backends": [
            {"name": "small-llamacpp", "kind": "llamacpp", "tier": "small",
             "model": "tiny-small", "replicas": replicas(small)},
            {"name": "large-llamacpp", "kind": "llamacpp", "tier": "large",
             "model": "tiny-large", "replicas": replicas(large)},
        ],
        "defaults": {"max_tokens": 32, **defaults},
    })


@dataclass
class RunningGateway:
    url: str
    app: Any
    seams: Seams

    @property
    def v1(self) -> str:
        return self.url + "/v1"


@contextmanager
def run_gateway(catalog: Catalog, seams: Seams | None = None,
                **settings: Any) -> Iterator[RunningGateway]:
    """Start the real app under uvicorn in a thread; stop it on exit."""
    seams = seams or Seams()
    port = free_port()
    app = create_app(Settings(port=port, health_interval_seconds=0.5, **settings),
                     catalog, seams)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port,
                                           log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 15
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("gateway did not start")
        time.sleep(0.02)
    try:
        yield RunningGateway(f"http://127.0.0.1:{port}", app, seams)
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@pytest.fixture(scope="module")
def gateway(workers: Workers) -> Iterator[RunningGateway]:
    with run_gateway(catalog_for([workers.small], [workers.large])) as gw:
        yield gw
