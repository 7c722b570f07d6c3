"""Run the real gateway inside this process, on a thread (tests and benchmarks)."""

from __future__ import annotations

import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvicorn

from app.catalog import Catalog
from app.factory import Seams, create_app
from app.http.asgi import GatewayApp
from app.http.connection import uvicorn_options
from app.settings import Settings


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class RunningGateway:
    url: str
    app: GatewayApp
    seams: Seams

    @property
    def v1(self) -> str:
        return self.url + "/v1"


@contextmanager
def run_gateway(catalog: Catalog, seams: Seams | None = None,
                **settings: Any) -> Iterator[RunningGateway]:
    """Start the app under uvicorn on a free port; stop it on exit. Its state
    (keys, usage) is in a fresh directory unless `state_dir` is given."""
    with tempfile.TemporaryDirectory(prefix="joulegate-state-") as fresh:
        settings.setdefault("state_dir", Path(fresh))
        with _serving(catalog, seams, settings) as running:
            yield running


@contextmanager
def _serving(catalog: Catalog, seams: Seams | None, settings: dict[str, Any]
             ) -> Iterator[RunningGateway]:
    seams = seams or Seams()
    port = free_port()
    settings.setdefault("health_interval_seconds", 0.5)
    configured = Settings(port=port, **settings)
    app = create_app(configured, catalog, seams)
    server = uvicorn.Server(uvicorn.Config(
        app, host="127.0.0.1", port=port, log_level="warning", lifespan="on",
        **uvicorn_options(configured.head_timeout_seconds, configured.max_connections,
                          configured.max_connections_per_client)))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("gateway did not start")
        time.sleep(0.02)
    try:
        yield RunningGateway(f"http://127.0.0.1:{port}", app, seams)
    finally:
        server.should_exit = True
        thread.join(timeout=10)
