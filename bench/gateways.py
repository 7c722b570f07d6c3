"""Gateway overhead side by side: nginx direct (the floor), a bare FastAPI +
aiohttp pass-through (the Python floor, bench/passthrough.py), joulegate, LiteLLM.

    python -m bench.gateways [--seconds 10] [--rounds 3]   # bench/results/gateways.json, .png

Starts a fixed-answer upstream (Debian's nginx: a JSON chat answer and an SSE
one, which joulegate needs since it always streams from workers), joulegate
in front of it (`joulegate serve`, its own process, estimate meter), and the
LiteLLM proxy (one worker, installed by this script into its own venv under
~/.cache/joulegate/litellm-venv, never a project dependency), then runs wrk
(one thread) at 1 and 50 connections: joulegate with a forced tier and
`auto`, each streamed and not, one process metered by `joulegate agent`
(a process of its own, as compose and Kubernetes deploy it; its CPU counted
with the gateway's), and `serve --workers 2` with a forced tier;
LiteLLM non-streamed. Needs `apt-get install nginx-light
wrk` (root: done by the script when missing). All in one run, same machine.

    python -m bench.gateways --pin [--no-litellm] --out bench/results/X.json

On a machine of 8 cores or more, `--pin` gives each part cores of its own
(sched_setaffinity, inherited by children): the gateways share cores 0-1
(one process, and `serve --workers 2` with its agent), `--workers 4` gets
0-3, nginx and wrk one core each beyond them. Then "2 processes on 2 cores"
is what it says, with the load generator and the upstream elsewhere. The
result says whether the machine held the pins (`pins_held`: some hosts
accept the affinity and run each process anywhere).
`bench/run_gateways_device.sh` runs it on the GPU host (no network there:
no LiteLLM).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from app.tools.embedded import free_port
from bench.gpu_common import project_commit
from bench.process import rss_mb, tree_cpu_s
from workers.local import CACHE, ROOT, wait_healthy

ANSWER = {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "fixed",
          "choices": [{"index": 0, "finish_reason": "stop",
                       "message": {"role": "assistant", "content": "Paris."}}],
          "usage": {"prompt_tokens": 9, "completion_tokens": 2, "total_tokens": 11}}
NGINX = "/usr/sbin/nginx"  # Debian's, not on root's PATH everywhere
LITELLM_KEY = "sk-joulegate-bench-0123456789abcdef"  # a local benchmark's throwaway key
# --pin: the gateways' cores by process count, then nginx's and wrk's
PINNED = {1: {0, 1}, 2: {0, 1}, 4: {0, 1, 2, 3}}
NGINX_CORES, WRK_CORES = {6}, {7}
COMPANION = {"joulegate_agent": "agent"}  # a target's other process, whose CPU counts too
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
    # as root, workers as root too (nginx's default user may not exist there)
    user = "user root root;" if os.geteuid() == 0 else ""
    return f"""
{user}
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


def pins_hold(core: int = 5, n: int = 30_000_000) -> bool:
    """Whether this machine enforces CPU affinity: two processes spinning on
    one core take about twice as long as one alone (some hosts accept
    sched_setaffinity and run the process anywhere)."""
    def spin() -> float:
        t = time.perf_counter()
        sum(range(n))
        return time.perf_counter() - t

    alone = spin()
    pid = os.fork()
    if pid == 0:
        os.sched_setaffinity(0, {core})
        spin()
        os._exit(0)
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {core})
    try:
        both = spin()
    finally:
        os.sched_setaffinity(0, before)
        os.waitpid(pid, 0)
    return both > 1.6 * alone


def pinned(cores: set[int] | None) -> Any:
    """A Popen preexec_fn that keeps the process (and its children) on `cores`."""
    return None if cores is None else (lambda: os.sched_setaffinity(0, cores))


def wrk(url: str, connections: int, seconds: int, body: dict[str, Any], work: Path,
         key: str | None = None, cores: set[int] | None = None) -> dict[str, Any]:
    script = work / "post.lua"
    auth = f'wrk.headers["Authorization"] = "Bearer {key}"\n' if key else ""
    script.write_text(
        'wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\n'
        f"{auth}wrk.body = {json.dumps(json.dumps(body))}\n")
    out = subprocess.run(["wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "--latency",
                          "-s", str(script), url], capture_output=True, text=True,
                         timeout=seconds + 60, preexec_fn=pinned(cores)).stdout
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


def models_file(port: int, upstream: int, work: Path, root: Path = ROOT,
                url: str | None = None) -> Path:
    """The models.yaml of the gateway on `port`: the checkout's, both tiers on the
    fixed upstream (`url`: on that worker instead), metered by the estimate."""
    shipped = yaml.safe_load((root / "models.yaml").read_text())
    # Checkouts from before admission control have no per-replica limit to set.
    limit = "max_concurrency" in (root / "app" / "catalog.py").read_text()
    for b in shipped["backends"]:
        replica = {"url": url or f"http://127.0.0.1:{upstream}/sse", "device": "local-cpu"}
        b["replicas"] = [{**replica, "max_concurrency": 256} if limit else replica]
        b["curves"] = str(root / b["curves"])
    shipped["devices"][0]["source"] = "estimate"
    shipped["routing"]["lengths_file"] = None
    models = work / f"models-{port}.yaml"
    models.write_text(yaml.safe_dump(shipped))
    return models


def joulegate(port: int, upstream: int, work: Path, root: Path = ROOT, workers: int = 1,
              cores: set[int] | None = None, python: list[str] | None = None,
              url: str | None = None, agent: tuple[int, str] | None = None,
              models: Path | None = None) -> subprocess.Popen[bytes]:
    """`joulegate serve [--workers N]` of the checkout at `root`, both tiers on the
    fixed upstream (`url`: on that worker instead), or with `models` (a file
    models_file wrote); `python`: the interpreter's command line (e.g. under
    cProfile); `agent`: (port, token) of a `joulegate agent` on this machine
    that meters it (else it meters itself)."""
    models = models or models_file(port, upstream, work, root, url)
    # A state directory of its own: the checkout's .joulegate (keys, usage
    # database) is neither read nor grown by benchmarks.
    state = work / f"state-{port}"
    env = dict(os.environ, JOULEGATE_MODELS_FILE=str(models), JOULEGATE_PORT=str(port),
               JOULEGATE_LOG_LEVEL="warning", JOULEGATE_STATE_DIR=str(state),
               PYTHONPATH=os.pathsep.join(filter(None, [str(root),
                                                        os.environ.get("PYTHONPATH")])))
    if agent is not None:
        env.update(JOULEGATE_AGENT_URL=f"http://127.0.0.1:{agent[0]}",
                   JOULEGATE_AGENT_TOKEN=agent[1])
    extra = ["--workers", str(workers)] if workers > 1 else []
    return subprocess.Popen([*(python or [sys.executable]), "-m", "app.cli", "serve", *extra],
                            env=env, cwd=root,
                            stdout=(work / f"joulegate-{port}.log").open("wb"),
                            stderr=subprocess.STDOUT, preexec_fn=pinned(cores))


def agent_process(port: int, models: Path, token: str, work: Path,
                  cores: set[int] | None = None) -> subprocess.Popen[bytes]:
    """`joulegate agent` on `port`, metering the devices of `models` for gateways
    that send `token` (compose's and Kubernetes' layout: the agent a process
    of its own next to the devices)."""
    env = dict(os.environ, JOULEGATE_AGENT_TOKEN=token, JOULEGATE_LOG_LEVEL="warning")
    return subprocess.Popen([sys.executable, "-m", "app.cli", "agent", "--models", str(models),
                             "--port", str(port)], env=env, cwd=ROOT,
                            stdout=(work / f"agent-{port}.log").open("wb"),
                            stderr=subprocess.STDOUT, preexec_fn=pinned(cores))


def passthrough(port: int, upstream: int, work: Path, cores: set[int] | None = None,
                workers: int = 1, python: str = sys.executable) -> subprocess.Popen[bytes]:
    """The bare FastAPI pass-through (bench/passthrough.py) to the fixed upstream,
    in `workers` processes (under `python`, an interpreter of an environment
    with the project's dependencies)."""
    return subprocess.Popen(
        [python, "-m", "bench.passthrough", "--port", str(port),
         "--upstream", f"http://127.0.0.1:{upstream}", "--workers", str(workers)], cwd=ROOT,
        stdout=(work / f"passthrough-{port}.log").open("wb"), stderr=subprocess.STDOUT,
        preexec_fn=pinned(cores))


def start_nginx(work: Path, cores: set[int] | None = None) -> int:
    """The fixed-answer upstream, on a free port; stop it with stop_nginx(work)."""
    for d in ("body", "proxy", "fcgi", "uwsgi", "scgi"):
        (work / d).mkdir(exist_ok=True)
    port = free_port()
    (work / "nginx.conf").write_text(_nginx_conf(port, work))
    subprocess.run([_nginx(), "-c", str(work / "nginx.conf")], check=True,
                   preexec_fn=pinned(cores))
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
    parser.add_argument("--pin", action="store_true",
                        help="cores of their own for each part (8 cores or more)")
    parser.add_argument("--no-litellm", action="store_true", help="leave LiteLLM out")
    parser.add_argument("--rounds", type=int, default=1,
                        help="every case this many times, in turns (the order reversed every "
                             "other round); medians, and each ratio's median over the rounds")
    args = parser.parse_args()
    cpus = os.cpu_count() or 1
    if args.pin and cpus < 8:
        parser.error(f"--pin needs 8 cores or more; this machine has {cpus}")
    pin = (lambda cores: cores) if args.pin else (lambda cores: None)
    work = Path(tempfile.mkdtemp(prefix="joulegate-gateways-"))
    upstream = start_nginx(work, pin(NGINX_CORES))
    ports = {"nginx": upstream}
    procs: dict[str, subprocess.Popen[bytes]] = {}
    gateways = [1, 2, 4] if args.pin else [1, 2]  # processes of each joulegate
    for n in gateways:
        name = "joulegate" if n == 1 else f"joulegate{n}"
        ports[name] = free_port()
        procs[name] = joulegate(ports[name], upstream, work, workers=n, cores=pin(PINNED[n]))
    # One gateway process metered by `joulegate agent`, a process of its own (the
    # deployed layout), on the one-process gateway's cores.
    ports["joulegate_agent"], agent_port = free_port(), free_port()
    token = secrets.token_urlsafe(24)
    agent_models = models_file(ports["joulegate_agent"], upstream, work)  # one file, both read it
    procs["agent"] = agent_process(agent_port, agent_models, token, work, pin(PINNED[1]))
    procs["joulegate_agent"] = joulegate(ports["joulegate_agent"], upstream, work,
                                         cores=pin(PINNED[1]), agent=(agent_port, token),
                                         models=agent_models)
    ports["agent"] = agent_port
    for n in gateways:  # the pass-through in as many processes, for like-for-like ratios
        name = "passthrough" if n == 1 else f"passthrough{n}"
        ports[name] = free_port()
        procs[name] = passthrough(ports[name], upstream, work, pin(PINNED[n]), n)
    if not args.no_litellm:
        ports["litellm"] = free_port()
        procs["litellm"] = _litellm(ports["litellm"], upstream, work)
    msg = [{"role": "user", "content": "What is the capital of France?"}]
    base = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
    results: dict[str, Any] = {"commit": project_commit(), "machine": f"{cpus} cores",
                               "seconds": args.seconds, "tool": "wrk -t1",
                               "rounds": args.rounds, "runs": {}}
    if args.pin:
        results["pins_held"] = pins_hold()  # else every part ran on any core
        print("pins held" if results["pins_held"] else "pins NOT held", flush=True)
        results["cores"] = {"joulegate, 1 process (and the one with an agent, and that agent)":
                            sorted(PINNED[1]),
                            "joulegate, 2 processes and their agent": sorted(PINNED[2]),
                            "joulegate, 4 processes and their agent": sorted(PINNED[4]),
                            "nginx": sorted(NGINX_CORES), "wrk": sorted(WRK_CORES)}
    try:
        for name, proc in procs.items():
            path = {"litellm": "/health/liveliness", "agent": "/healthz"}.get(name, "/readyz")
            wait_healthy(base[name] + path, 180 if name == "litellm" else 60, proc)
        if "litellm" in procs:
            results["litellm_version"] = subprocess.run(
                [str(CACHE / "litellm-venv" / "bin" / "python"), "-c",
                 "from importlib.metadata import version; print(version('litellm'))"],
                capture_output=True, text=True).stdout.strip()
        chat = "/v1/chat/completions"
        cases = [("nginx direct", "nginx", "/json" + chat, {"model": "x", "messages": msg}),
                 ("FastAPI pass-through", "passthrough", chat, {"model": "x"}),
                 ("FastAPI pass-through, streamed", "passthrough", chat,
                  {"model": "x", "stream": True}),
                 ("joulegate forced tier", "joulegate", chat, {"model": "small"}),
                 ("joulegate auto", "joulegate", chat, {"model": "auto"}),
                 ("joulegate forced tier, streamed", "joulegate", chat,
                  {"model": "small", "stream": True}),
                 ("joulegate auto, streamed", "joulegate", chat, {"model": "auto", "stream": True}),
                 ("joulegate forced tier, with an agent", "joulegate_agent", chat,
                  {"model": "small"}),
                 *((f"joulegate forced tier, {n} processes", f"joulegate{n}", chat,
                    {"model": "small"}) for n in gateways[1:]),
                 *((f"FastAPI pass-through, {n} processes", f"passthrough{n}", chat,
                    {"model": "x"}) for n in gateways[1:]),
                 *((("LiteLLM proxy, 1 worker", "litellm", chat, {"model": "small"}),)
                   if "litellm" in procs else ())]
        rounds: list[dict[str, dict[str, Any]]] = []
        for r in range(args.rounds):
            runs: dict[str, dict[str, Any]] = {}
            for name, target, path, body in (cases if r % 2 == 0 else cases[::-1]):
                body = {"messages": msg, **body}
                for connections in (1, 50):
                    key = f"{name} c={connections}"
                    bearer = LITELLM_KEY if target == "litellm" else None
                    # CPU of the target's processes (its agent's with it)
                    measured = [procs[t] for t in (target, COMPANION.get(target)) if t in procs]
                    before = sum(tree_cpu_s(m.pid) for m in measured)
                    run = wrk(base[target] + path, connections, args.seconds, body, work,
                              bearer, pin(WRK_CORES))
                    if measured and run["req_per_s"]:
                        run["cpu_ms_per_request"] = round(
                            1000 * (sum(tree_cpu_s(m.pid) for m in measured) - before)
                            / (run["req_per_s"] * args.seconds), 4)
                    runs[key] = run
                    print(f"round {r + 1}", key, run, flush=True)
            rounds.append(runs)
        names = [c[0] for c in cases]
        keys = [f"{n} c={c}" for n in names for c in (1, 50)]
        results["runs"] = {k: _medians([r[k] for r in rounds], 4) for k in keys}
        results["joulegate_rss_mb"] = round(rss_mb(procs["joulegate"].pid), 1)
        floor = results["runs"]["nginx direct c=1"]["p50_ms"]
        results["added_p50_ms_c1"] = {
            name: round(results["runs"][f"{name} c=1"]["p50_ms"] - floor, 3)
            for name, *_ in cases[1:] if results["runs"][f"{name} c=1"]["p50_ms"]}
        one = results["runs"]["joulegate forced tier c=50"]["req_per_s"]
        more = {n: results["runs"][f"joulegate forced tier, {n} processes c=50"]["req_per_s"]
                for n in gateways[1:]}
        results["processes_speedup_c50"] = {str(n): round(rps / one, 2)
                                            for n, rps in more.items() if rps and one}
        if args.rounds == 1:
            results["ratios"] = ratios(results["runs"], names)
        else:  # each round's ratios (its rows ran minutes apart at most), then their medians
            results["by_round"] = rounds
            results["ratios_by_round"] = [ratios(r, names) for r in rounds]
            results["ratios"] = {n: _medians([r[n] for r in results["ratios_by_round"]], 3)
                                 for n in results["ratios_by_round"][0]}
    finally:
        for proc in procs.values():
            proc.terminate()
            proc.wait(timeout=30)
        stop_nginx(work)
        shutil.rmtree(work, ignore_errors=True)  # logs, databases, journals: ~70 MB
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=2) + "\n")
        _plot(results, args.out.with_suffix(".png"))
        print(f"wrote {args.out}")


def _medians(rows: list[dict[str, Any]], digits: int) -> dict[str, Any]:
    """Each field's median over the rounds' rows (a case's figures, or a
    row's ratios); a field no round measured keeps the first round's value."""
    out: dict[str, Any] = {}
    for field in rows[0]:
        values = [v for r in rows if isinstance(v := r.get(field), int | float)]
        out[field] = round(statistics.median(values), digits) if values else rows[0][field]
    return out


def ratios(runs: dict[str, dict[str, Any]], names: list[str]) -> dict[str, Any]:
    """Each row against the floors of the same run: p50 and p99 at c=1 and
    req/s at c=50 over the pass-through's (the streamed one for streamed
    rows, the one of as many processes for N-process rows) and nginx's; the
    gateway boards' figure, added p99 at c=1 over nginx (a zero-delay
    upstream); and joulegate's c=50 over LiteLLM's."""
    def get(name: str, c: int, field: str) -> float | None:
        run = runs.get(f"{name} c={c}")
        return None if run is None else run.get(field)

    def over(a: float | None, b: float | None) -> float | None:
        return round(a / b, 3) if a and b else None

    out: dict[str, Any] = {}
    litellm = get("LiteLLM proxy, 1 worker", 50, "req_per_s")
    for name in names:
        processes = re.search(r", (\d+) processes$", name)
        floor = f"FastAPI pass-through, {processes.group(1)} processes" if processes \
            else "FastAPI pass-through, streamed" if "streamed" in name \
            else "FastAPI pass-through"
        row = {
            "p50_c1_over_passthrough": over(get(name, 1, "p50_ms"), get(floor, 1, "p50_ms")),
            "p99_c1_over_passthrough": over(get(name, 1, "p99_ms"), get(floor, 1, "p99_ms")),
            "rps_c50_over_passthrough": over(get(name, 50, "req_per_s"),
                                             get(floor, 50, "req_per_s")),
            "rps_c50_over_nginx": over(get(name, 50, "req_per_s"),
                                       get("nginx direct", 50, "req_per_s")),
            "added_p99_ms_c1": None if get(name, 1, "p99_ms") is None else round(
                get(name, 1, "p99_ms") - get("nginx direct", 1, "p99_ms"), 3),  # type: ignore[operator]
        }
        if name.startswith("joulegate") and litellm:
            row["rps_c50_over_litellm"] = over(get(name, 50, "req_per_s"), litellm)
        out[name] = row
    return out


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
