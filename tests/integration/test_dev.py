"""`joulegate dev`, what the README's `make run` starts: two local llama.cpp
workers and the gateway under one supervisor, an answer with its energy
through the openai client, and Ctrl-C (SIGINT) stopping every process; a
port already taken stops it before anything starts."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import openai
import pytest
import yaml

from app.tools.dev import port_taken
from app.tools.embedded import free_port
from workers.local import ROOT

pytestmark = pytest.mark.integration

BANNER_S = 120  # two workers loading their models and the gateway on this 2-core VM


def _models(directory: Path, ports: tuple[int, int]) -> Path:
    """The shipped models.yaml with its two local replicas on `ports`."""
    shipped = yaml.safe_load((ROOT / "models.yaml").read_text())
    for b, port in zip(shipped["backends"], ports, strict=True):
        b["replicas"][0]["url"] = f"http://127.0.0.1:{port}"
        b["curves"] = str(ROOT / b["curves"])
    shipped["devices"][0]["source"] = "estimate"
    path = directory / "models.yaml"
    path.write_text(yaml.safe_dump(shipped))
    return path


def _dev(models: Path, port: int, state: Path, out: Path) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JOULEGATE_", "PROMETHEUS_"))}
    env.update(JOULEGATE_PORT=str(port), JOULEGATE_STATE_DIR=str(state))
    if "JOULEGATE_CACHE" in os.environ:  # where llama-server and the test models are
        env["JOULEGATE_CACHE"] = os.environ["JOULEGATE_CACHE"]
    if "JOULEGATE_LLAMA_SERVER" in os.environ:
        env["JOULEGATE_LLAMA_SERVER"] = os.environ["JOULEGATE_LLAMA_SERVER"]
    return subprocess.Popen([sys.executable, "-m", "app.cli", "dev", "--models", str(models)],
                            env=env, cwd=ROOT, stdout=out.open("wb"), stderr=subprocess.STDOUT)


def _wait_for(out: Path, text: str, proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while text not in out.read_text(errors="replace"):
        assert proc.poll() is None, out.read_text(errors="replace")[-2000:]
        assert time.monotonic() < deadline, out.read_text(errors="replace")[-2000:]
        time.sleep(0.2)


def test_dev_serves_two_workers_and_ctrl_c_stops_every_process(llama_bin: str,
                                                               tmp_path: Path) -> None:
    ports = (free_port(), free_port())
    gateway = free_port()
    out = tmp_path / "dev.out"
    proc = _dev(_models(tmp_path, ports), gateway, tmp_path / "state", out)
    try:
        _wait_for(out, f"gateway: http://127.0.0.1:{gateway}/v1", proc, BANNER_S)
        text = out.read_text()
        assert f"http://127.0.0.1:{ports[0]} (tiny-small)" in text
        assert f"http://127.0.0.1:{ports[1]} (tiny-large)" in text
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{gateway}/v1", api_key="unused",
                               max_retries=0)
        r = client.chat.completions.create(
            model="auto", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
        usage = r.usage.model_dump()  # type: ignore[union-attr]
        assert usage["energy_source"] == "estimate" and usage["energy_joules"] > 0
        proc.send_signal(signal.SIGINT)  # Ctrl-C
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "gateway and workers stopped" in out.read_text()
    # nothing of it is left listening: workers and gateway are gone
    assert not any(port_taken("127.0.0.1", p) for p in (*ports, gateway))


def test_dev_refuses_a_port_already_taken_before_starting_anything(llama_bin: str,
                                                                   tmp_path: Path) -> None:
    ports = (free_port(), free_port())
    out = tmp_path / "dev.out"
    with socket.socket() as other:  # a colleague's server on the large worker's port
        other.bind(("127.0.0.1", ports[1]))
        other.listen()
        proc = _dev(_models(tmp_path, ports), free_port(), tmp_path / "state", out)
        assert proc.wait(timeout=60) == 2  # a configuration error: never restarted
    text = out.read_text()
    assert f"port {ports[1]} is in use by another process (large-llamacpp's replica" in text
    assert "gateway:" not in text  # no banner: nothing was started
    assert not port_taken("127.0.0.1", ports[0])  # the other worker was never started
