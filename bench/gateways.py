"""Gateway overhead side by side: nginx direct (the floor), joulegate, LiteLLM.

    python -m bench.gateways [--seconds 10]   # bench/results/gateways.json and .png

Starts a fixed-answer upstream (Debian's nginx: a JSON chat answer and an SSE
one, which joulegate needs since it always streams from workers), joulegate
in front of it (`joulegate serve`, its own process, estimate meter), and the
LiteLLM proxy (one worker, installed by this script into its own venv under
~/.cache/joulegate/litellm-venv, never a project dependency), then runs wrk
(one thread) at 1 and 50 connections: joulegate with a forced tier and
`auto`, each streamed and not, and `serve --workers 2` with a forced tier;
LiteLLM non-streamed. Needs `apt-get install nginx-light
wrk` (root: done by the script when missing). All in one run, same machine.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from app.embedded import free_port
from bench.gpu_common import project_commit
from bench.process import rss_mb
from workers.local import CACHE, ROOT, wait_healthy

ANSWER = {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "fixed",
          "choices": [{"index": 0, "finish_reason": "stop",
                       "message": {"role": "assistant", "content": "Paris."}}],
          "usage": {"prompt_tokens": 9, "completion_tokens": 2, "total_tokens": 11}}
NGINX = "/usr/sbin/nginx"  # Debian's, not on root's PATH everywhere
LITELLM_KEY = "sk-joulegate-bench-0123456789abcdef"  # a local benchmark's throwaway key
CHUNK = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "fixed"}


def _sse() -> str:
    events = [{**CHUNK, "choices": [{"index": 0, "delta": {"content": "Paris."},
                                     "finish_reason": None}]},
              {**CHUNK, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
              {**CHUNK, "choices": [], "usage": ANSWER["usage"]}]
    return "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"


def _nginx_conf(port: int, work: Path) -> str:
    def quoted(text: str) -> str:
        return "'" + text.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n") + "'"
    return f"""
worker_processes 1;
pid {work}/nginx.pid;
error_log {work}/nginx-error.log;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  client_body_temp_path {work}/body; proxy_temp_path {work}/proxy;
  fastcgi_temp_path {work}/fcgi; uwsgi_temp_path {work}/uwsgi; scgi_temp_path {work}/scgi;
  keepalive_requests 1000000;
  server {{
    listen 127.0.0.1:{port};
    location = /json/v1/chat/completions {{ default_type application/json;
      return 200 {quoted(json.dumps(ANSWER))}; }}
    location = /sse/v1/chat/completions {{ default_type text/event-stream;
      return 200 {quoted(_sse())}; }}
    location = /sse/health {{ default_type application/json; return 200 '{{"status":"ok"}}'; }}
  }}
}}
"""


def wrk(url: str, connections: int, seconds: int, body: dict[str, Any], work: Path,
         key: str | None = None) -> dict[str, Any]:
    script = work / "post.lua"
    auth = f'wrk.headers["Authorization"] = "Bearer {key}"\n' if key else ""
    script.write_text(
        'wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\n'
        f"{auth}wrk.body = {json.dumps(json.dumps(body))}\n")
    out = subprocess.run(["wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "--latency",
                          "-s", str(script), url], capture_output=True, text=True,
                         timeout=seconds + 60).stdout
    rps = re.search(r"Requests/sec:\s+([\d.]+)", out)
    lat = dict(re.findall(r"^\s+(50|99)%\s+([\d.]+\w+)", out, re.M))
    non2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    return {"req_per_s": float(rps.group(1)) if rps else None,
            "p50_ms": _ms(lat.get("50")), "p99_ms": _ms(lat.get("99")),
            "non_2xx": int(non2xx.group(1)) if non2xx else 0}


def _ms(text: str | None) -> float | None:
    if text is None:
        return None
    value, unit = re.match(r"([\d.]+)(\w+)", text).groups()  # type: ignore[union-attr]
    return float(value) * {"us": 1e-3, "ms": 1.0, "s": 1000.0, "m": 60000.0}[unit]


def _litellm(port: int, upstream: int, work: Path) -> subprocess.Popen[bytes]:
    venv = CACHE / "litellm-venv"
    if not (venv / "bin" / "litellm").exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "litellm[proxy]"],
                       check=True)
    config = work / "litellm.yaml"
    config.write_text(yaml.safe_dump({
        "model_list": [{"model_name": "small", "litellm_params": {
            "model": "openai/fixed", "api_base": f"http://127.0.0.1:{upstream}/json/v1",
            "api_key": "unused"}}],
        "general_settings": {"master_key": LITELLM_KEY}}))
    return subprocess.Popen([str(venv / "bin" / "litellm"), "--config", str(config), "--port",
                             str(port), "--num_workers", "1"],
                            stdout=(work / "litellm.log").open("wb"), stderr=subprocess.STDOUT)


def joulegate(port: int, upstream: int, work: Path, root: Path = ROOT, workers: int = 1
              ) -> subprocess.Popen[bytes]:
    """`joulegate serve [--workers N]` of the checkout at `root`, both tiers on the
    fixed upstream."""
    shipped = yaml.safe_load((root / "models.yaml").read_text())
    # Checkouts from before admission control have no per-replica limit to set.
    limit = "max_concurrency" in (root / "app" / "catalog.py").read_text()
    for b in shipped["backends"]:
        replica = {"url": f"http://127.0.0.1:{upstream}/sse", "device": "local-cpu"}
        b["replicas"] = [{**replica, "max_concurrency": 256} if limit else replica]
        b["curves"] = str(root / b["curves"])
    shipped["devices"][0]["source"] = "estimate"
    shipped["routing"]["lengths_file"] = None
    models = work / f"models-{port}.yaml"
    models.write_text(yaml.safe_dump(shipped))
    # A state directory of its own: the checkout's .joulegate (keys, usage
    # database) is neither read nor grown by benchmarks.
    state = work / f"state-{port}"
    env = dict(os.environ, JOULEGATE_MODELS_FILE=str(models), JOULEGATE_PORT=str(port),
               JOULEGATE_LOG_LEVEL="warning", JOULEGATE_STATE_DIR=str(state),
               PYTHONPATH=str(root))
    extra = ["--workers", str(workers)] if workers > 1 else []
    return subprocess.Popen([sys.executable, "-m", "app.cli", "serve", *extra], env=env, cwd=root,
                            stdout=(work / f"joulegate-{port}.log").open("wb"),
                            stderr=subprocess.STDOUT)


def start_nginx(work: Path) -> int:
    """The fixed-answer upstream, on a free port; stop it with stop_nginx(work)."""
    for d in ("body", "proxy", "fcgi", "uwsgi", "scgi"):
        (work / d).mkdir(exist_ok=True)
    port = free_port()
    (work / "nginx.conf").write_text(_nginx_conf(port, work))
    subprocess.run([_nginx(), "-c", str(work / "nginx.conf")], check=True)
    return port


def stop_nginx(work: Path) -> None:
    subprocess.run([_nginx(), "-c", str(work / "nginx.conf"), "-s", "stop"], check=False)


def _nginx() -> str:
    if not shutil.which("wrk") or not (shutil.which("nginx") or Path(NGINX).exists()):
        subprocess.run(["apt-get", "install", "-y", "-q", "--no-install-recommends",
                        "nginx-light", "wrk"], check=True)
    return shutil.which("nginx") or NGINX


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "gateways.json")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="joulegate-gateways-"))
    ports = {"nginx": start_nginx(work), "joulegate": free_port(), "litellm": free_port(),
             "joulegate2": free_port()}
    procs = [joulegate(ports["joulegate"], ports["nginx"], work),
             _litellm(ports["litellm"], ports["nginx"], work),
             joulegate(ports["joulegate2"], ports["nginx"], work, workers=2)]
    msg = [{"role": "user", "content": "What is the capital of France?"}]
    base = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
    results: dict[str, Any] = {"commit": project_commit(),
                               "machine": f"{os.cpu_count()} cores", "seconds": args.seconds,
                               "tool": "wrk -t1", "runs": {}}
    try:
        wait_healthy(base["joulegate"] + "/readyz", 60, procs[0])
        wait_healthy(base["litellm"] + "/health/liveliness", 180, procs[1])
        wait_healthy(base["joulegate2"] + "/readyz", 60, procs[2])
        results["litellm_version"] = subprocess.run(
            [str(CACHE / "litellm-venv" / "bin" / "python"), "-c",
             "from importlib.metadata import version; print(version('litellm'))"],
            capture_output=True, text=True).stdout.strip()
        cases = [
            ("nginx direct", base["nginx"] + "/json/v1/chat/completions",
             {"model": "x", "messages": msg}),
            ("joulegate forced tier", base["joulegate"] + "/v1/chat/completions",
             {"model": "small", "messages": msg}),
            ("joulegate auto", base["joulegate"] + "/v1/chat/completions",
             {"model": "auto", "messages": msg}),
            ("joulegate forced tier, streamed", base["joulegate"] + "/v1/chat/completions",
             {"model": "small", "messages": msg, "stream": True}),
            ("joulegate auto, streamed", base["joulegate"] + "/v1/chat/completions",
             {"model": "auto", "messages": msg, "stream": True}),
            ("joulegate forced tier, 2 processes", base["joulegate2"] + "/v1/chat/completions",
             {"model": "small", "messages": msg}),
            ("LiteLLM proxy, 1 worker", base["litellm"] + "/v1/chat/completions",
             {"model": "small", "messages": msg}),
        ]
        for name, url, body in cases:
            for connections in (1, 50):
                key = f"{name} c={connections}"
                bearer = LITELLM_KEY if name.startswith("LiteLLM") else None
                results["runs"][key] = wrk(url, connections, args.seconds, body, work, bearer)
                print(key, results["runs"][key], flush=True)
        results["joulegate_rss_mb"] = round(rss_mb(procs[0].pid), 1)
        floor = results["runs"]["nginx direct c=1"]["p50_ms"]
        results["added_p50_ms_c1"] = {
            name: round(results["runs"][f"{name} c=1"]["p50_ms"] - floor, 3)
            for name, _, _ in cases[1:] if results["runs"][f"{name} c=1"]["p50_ms"]}
    finally:
        for p in procs:
            p.terminate()
            p.wait(timeout=30)
        stop_nginx(work)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=2) + "\n")
        _plot(results, args.out.with_suffix(".png"))
        print(f"wrote {args.out}")


def _plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = results.get("runs", {})
    names = list(dict.fromkeys(k.rsplit(" c=", 1)[0] for k in runs))
    if not names:
        return
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, c in zip(axes, (1, 50), strict=True):
        rps = [runs.get(f"{n} c={c}", {}).get("req_per_s") or 0 for n in names]
        ax.barh(names, rps, color="tab:blue")
        ax.set_xscale("log")
        ax.set_xlabel("requests/s (log)")
        ax.set_title(f"{c} connection{'s' if c > 1 else ''}")
        for y, (n, v) in enumerate(zip(names, rps, strict=True)):
            p50 = runs.get(f"{n} c={c}", {}).get("p50_ms")
            ax.text(v, y, f" {v:,.0f}/s, p50 {p50} ms", va="center", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
