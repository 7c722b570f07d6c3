"""`joulegate dev` (what `make run` runs): the gateway and a local llama.cpp
worker for every replica of the models file whose URL is on this machine,
under the one supervisor (app.processes).

Each local replica's port is checked before anything starts: a port taken by
another process (a colleague's `make run`, another server) stops it with one
line, so a worker that is not ours is never used. A replica's `model` names a
test model (`workers/make_models.py`: written once, random weights) or a
GGUF file. The banner gives the gateway's real address (JOULEGATE_HOST,
JOULEGATE_PORT). Worker logs go to .cache/logs/.
"""

from __future__ import annotations

import socket
import sys
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

from app.catalog import Backend, Catalog
from app.processes import CONFIG_ERROR, Child, Command, Supervisor
from app.settings import Settings, is_loopback
from workers.local import ROOT, WorkerSpec, llama_server, model_path, worker_command
from workers.make_models import SHAPES


def port_taken(host: str, port: int) -> bool:
    """Whether something listens on host:port, or it cannot be bound."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def local_workers(catalog: Catalog) -> list[tuple[Backend, str, int]]:
    """(backend, model file or test shape, port) of each replica on this machine."""
    found = []
    for b in catalog.backends:
        for r in b.replicas:
            url = urlsplit(str(r.url))
            if is_loopback(url.hostname) and url.port is not None:
                found.append((b, b.model, url.port))
    return found


def _model_file(model: str) -> Path | None:
    if model in SHAPES:
        return model_path(model)
    path = Path(model)
    return path if path.suffix == ".gguf" and path.is_file() else None


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as r:
            return bool(r.status == 200)
    except OSError:
        return False


def run(models_file: Path, catalog: Catalog, settings: Settings) -> int:
    workers = local_workers(catalog)
    problems = [f"port {port} is in use by another process ({b.name}'s replica in "
                f"{models_file}): stop it, or give the replica another url"
                for b, _, port in workers if port_taken("127.0.0.1", port)]
    if port_taken(settings.host, settings.port):
        problems.append(f"port {settings.port} is in use by another process (the gateway): "
                        "stop it, or set JOULEGATE_PORT")
    files = {model: _model_file(model) for _, model, _ in workers}
    problems += [f"{model}: not a test model ({', '.join(SHAPES)}) nor a .gguf file"
                 for model, path in files.items() if path is None]
    if problems:
        for line in problems:
            print(f"joulegate dev: {line}", file=sys.stderr)
        return CONFIG_ERROR
    binary = llama_server()
    logs = ROOT / ".cache" / "logs"
    children: list[Child] = []
    for b, model, port in workers:
        argv = worker_command(WorkerSpec(b.name, model, port), binary)
        argv[argv.index("-m") + 1] = str(files[model])
        children.append(Command(f"worker {b.name}", argv, logs / f"worker-{b.name}.log",
                                cwd=ROOT))
    children.append(Command("gateway", [sys.executable, "-m", "app.cli", "serve", "--models",
                                        str(models_file)], None, cwd=ROOT))
    base = f"http://{settings.host}:{settings.port}"
    checks = [f"http://127.0.0.1:{port}/health" for _, _, port in workers] + [base + "/readyz"]
    told = False

    def banner() -> None:
        nonlocal told
        if not told and all(_healthy(u) for u in checks):
            told = True
            for b, model, port in workers:
                print(f"worker {b.name}: http://127.0.0.1:{port} ({model})", flush=True)
            print(f"gateway: {base}/v1  (Ctrl-C stops everything; a process that exits "
                  f"is restarted; logs in {logs})", flush=True)
            print(f"console: {base}/console", flush=True)

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    status = Supervisor(children, say=say).run(each_tick=banner)
    print("gateway and workers stopped", flush=True)
    return status
