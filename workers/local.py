"""Start and stop local llama.cpp workers (and the gateway) for `make run` and tests.

    python -m workers.local            # two workers + gateway on :8000, Ctrl-C stops all

Workers: `small` (tiny-small.gguf on :8101) and `large` (tiny-large.gguf on
:8102), CPU llama-server built by build_llama_server.sh. A process that exits
is restarted with backoff (the gateway keeps serving the other tier
meanwhile). All processes are stopped on Ctrl-C / SIGTERM, workers last.
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


def worker_command(spec: WorkerSpec, binary: Path, threads: int = 1) -> list[str]:
    return [str(binary), "-m", str(model_path(spec.shape)), "--host", "127.0.0.1",
            "--port", str(spec.port), "-c", str(spec.ctx), "-np", str(spec.parallel),
            "-t", str(threads), "--metrics", "--no-webui"]


def spawn(cmd: list[str], log_path: Path | None, env: dict[str, str] | None = None
          ) -> subprocess.Popen[bytes]:
    """Start a process in its own session; output to `log_path` (None: this terminal)."""
    if log_path is None:
        return subprocess.Popen(cmd, env=env, cwd=ROOT, start_new_session=True)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT,
                                start_new_session=True)


def start_worker(spec: WorkerSpec, binary: Path, log_dir: Path,
                 threads: int = 1) -> subprocess.Popen[bytes]:
    proc = spawn(worker_command(spec, binary, threads), log_dir / f"worker-{spec.name}.log")
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


@dataclass
class Supervised:
    """A child process that is restarted when it exits, with backoff: 1 s, doubling
    up to 30 s, back to 1 s once it has run for a minute."""

    name: str
    cmd: list[str]
    log_path: Path | None
    env: dict[str, str] | None = None
    proc: subprocess.Popen[bytes] | None = None
    backoff_s: float = 1.0
    started_at: float = 0.0
    restart_at: float | None = None
    restarts: int = 0

    def start(self) -> None:
        self.proc = spawn(self.cmd, self.log_path, self.env)
        self.started_at = time.monotonic()
        self.restart_at = None

    def tend(self, now: float) -> None:
        """Restart the process if it exited and its backoff has passed."""
        if self.proc is None:
            return
        if self.restart_at is None:
            code = self.proc.poll()
            if code is None:
                if now - self.started_at > 60:
                    self.backoff_s = 1.0
                return
            self.restart_at = now + self.backoff_s
            where = f" (log: {self.log_path})" if self.log_path else ""
            print(f"{self.name} exited with code {code}; restarting in {self.backoff_s:g} s"
                  f"{where}", file=sys.stderr, flush=True)
            self.backoff_s = min(30.0, self.backoff_s * 2)
        elif now >= self.restart_at:
            self.restarts += 1
            self.start()
            print(f"{self.name} restarted (restart {self.restarts})", file=sys.stderr,
                  flush=True)


def main() -> None:
    binary = llama_server()
    log_dir = ROOT / ".cache" / "logs"
    children: list[Supervised] = []
    stopping = False

    def on_signal(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        for spec in WORKERS:
            child = Supervised(f"worker {spec.name}", worker_command(spec, binary),
                               log_dir / f"worker-{spec.name}.log")
            child.start()
            children.append(child)
            assert child.proc is not None
            wait_healthy(f"http://127.0.0.1:{spec.port}/health", 120, child.proc)
            print(f"worker {spec.name}: http://127.0.0.1:{spec.port} ({spec.shape})", flush=True)
        env = dict(os.environ, JOULEGATE_MODELS_FILE=str(ROOT / "models.yaml"))
        gateway = Supervised("gateway", [sys.executable, "-m", "app.cli", "serve"], None, env)
        gateway.start()
        children.insert(0, gateway)
        print("gateway: http://127.0.0.1:8000/v1  (Ctrl-C stops everything; a process "
              "that exits is restarted)", flush=True)
        while not stopping:
            for child in children:
                child.tend(time.monotonic())
            time.sleep(0.2)
    finally:
        print("stopping gateway and workers", flush=True)
        stop([c.proc for c in children if c.proc is not None])


if __name__ == "__main__":
    main()
