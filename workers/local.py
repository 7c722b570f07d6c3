"""Start and stop local llama.cpp workers (and the gateway) for `make run` and tests.

    python -m workers.local            # two workers + gateway on :8000, Ctrl-C stops all

Workers: `small` (tiny-small.gguf on :8101) and `large` (tiny-large.gguf on
:8102), CPU llama-server built by build_llama_server.sh. All processes are
stopped on Ctrl-C / SIGTERM, workers last.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("JOULEGATE_CACHE", Path.home() / ".cache" / "joulegate"))


@dataclass(frozen=True)
class WorkerSpec:
    name: str
    shape: str
    port: int
    parallel: int = 4
    ctx: int = 8192


WORKERS = (WorkerSpec("small", "tiny-small", 8101), WorkerSpec("large", "tiny-large", 8102))


def llama_server() -> Path:
    """Path to llama-server, building it once (minutes) if it is not cached."""
    env_bin = os.environ.get("JOULEGATE_LLAMA_SERVER")
    if env_bin:
        return Path(env_bin)
    out = subprocess.run(
        ["bash", str(ROOT / "workers" / "build_llama_server.sh")],
        check=True, stdout=subprocess.PIPE, text=True)
    return Path(out.stdout.strip().splitlines()[-1])


def model_path(shape: str) -> Path:
    from workers.make_models import write_model

    path = CACHE / "models" / f"{shape}.gguf"
    if not path.exists():
        write_model(shape, path)
    return path


def wait_healthy(url: str, timeout_s: float, proc: subprocess.Popen[bytes] | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{url}: process exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"{url} not healthy after {timeout_s}s")


def start_worker(spec: WorkerSpec, binary: Path, log_dir: Path,
                 threads: int = 1) -> subprocess.Popen[bytes]:
    log_dir.mkdir(parents=True, exist_ok=True)
    log = (log_dir / f"worker-{spec.name}.log").open("wb")
    cmd = [str(binary), "-m", str(model_path(spec.shape)), "--host", "127.0.0.1",
           "--port", str(spec.port), "-c", str(spec.ctx), "-np", str(spec.parallel),
           "-t", str(threads), "--metrics", "--no-webui"]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    wait_healthy(f"http://127.0.0.1:{spec.port}/health", 120, proc)
    return proc


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()


def main() -> None:
    binary = llama_server()
    log_dir = ROOT / ".cache" / "logs"
    procs: list[subprocess.Popen[bytes]] = []
    stopping = False

    def on_signal(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        for spec in WORKERS:
            procs.append(start_worker(spec, binary, log_dir))
            print(f"worker {spec.name}: http://127.0.0.1:{spec.port} ({spec.shape})", flush=True)
        env = dict(os.environ, JOULEGATE_MODELS_FILE=str(ROOT / "models.yaml"))
        gateway = subprocess.Popen(
            [sys.executable, "-m", "app.cli", "serve"], env=env, cwd=ROOT,
            start_new_session=True)
        procs.insert(0, gateway)
        print("gateway: http://127.0.0.1:8000/v1  (Ctrl-C stops everything)", flush=True)
        while not stopping and all(p.poll() is None for p in procs):
            time.sleep(0.2)
    finally:
        print("stopping gateway and workers", flush=True)
        stop(procs)


if __name__ == "__main__":
    main()
