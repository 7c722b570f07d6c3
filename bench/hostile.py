"""Hostile clients against a keyed gateway with real workers and a real agent.

    python -m bench.hostile [--slow 600] [--fuzz 5000] [--out bench/results/hostile.json]

Starts two CPU llama-server workers (the test models), `joulegate agent` with
a token, and `joulegate serve` metered by it, with two API keys (a victim and
an attacker), then measures three attacks of the hostile pass (issue 25):

1. slowloris: the attacker opens `--slow` connections that send a request's
   head a byte every 2 s, and as many that send a body a byte every 2 s,
   while the victim sends requests one after another. Reported: the victim's
   statuses and latencies, and how long the gateway let the slow
   connections live (the head and body deadlines, 10 s each by default).
2. agent spoofing: the victim's requests' final charges alone, then while a
   forger opens and closes windows at the agent claiming 5,000,000 tokens
   each (without the token, with a wrong one, and with the real token but
   claims no request can make). Reported: the forger's calls by status, and
   the victim's median final joules before and during.
3. a mutation fuzz: `--fuzz` chat bodies with llama.cpp fields, mutated
   (wrong types, huge and negative numbers, lone surrogates, nested junk),
   8 at a time. Reported: statuses, 5xx (each with its body), and requests
   over 30 s that asked for few tokens.

Results are written as JSON even when a phase fails.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import yaml

from app.tools.embedded import free_port
from bench.gpu_common import project_commit
from bench.load import _catalog, _pct
from workers.local import ROOT, WorkerSpec, llama_server, start_worker, stop, wait_healthy

TOKEN = "bench-agent-token-" + "x" * 24
MSG = [{"role": "user", "content": "hello there, how are you today?"}]


# -- 1. slowloris -------------------------------------------------------------
def _slow_connections(port: int, n: int, key: str) -> list[tuple[socket.socket, bytes]]:
    """n connections sending a head slowly and n sending a body slowly."""
    head = b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\nx-slow: "  # no end
    body = (b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\n"
            b"authorization: Bearer " + key.encode() + b"\r\n"
            b"content-type: application/json\r\ncontent-length: 500\r\n\r\n{\"mo")
    out = []
    for kind, prefix in ((b"slow head", head), (b"slow body", body)):
        for _ in range(n):
            s = socket.create_connection(("127.0.0.1", port))
            s.setblocking(False)
            s.sendall(prefix)
            out.append((s, kind))
    return out


def _slowloris(base: str, port: int, n: int, victim: str, attacker: str) -> dict[str, Any]:
    opened = time.monotonic()
    conns = _slow_connections(port, n, attacker)
    alive = {id(s): s for s, _ in conns}
    closed_after: dict[int, float] = {}
    answers: Counter[str] = Counter()
    statuses: Counter[int] = Counter()
    latencies: list[float] = []
    next_byte = time.monotonic() + 2.0
    with httpx.Client(timeout=60) as client:
        while alive and time.monotonic() - opened < 60:
            start = time.perf_counter()
            try:
                r = client.post(base + "/v1/chat/completions", json={
                    "model": "small", "messages": MSG, "max_tokens": 4},
                    headers={"authorization": f"Bearer {victim}"})
                statuses[r.status_code] += 1
            except httpx.HTTPError as exc:
                statuses[-1] += 1
                answers[f"victim_error:{type(exc).__name__}"] += 1
            latencies.append(time.perf_counter() - start)
            now = time.monotonic()
            for s, kind in conns:
                if id(s) not in alive:
                    continue
                try:
                    got = s.recv(4096)
                except BlockingIOError:
                    got = None
                except OSError:
                    got = b""
                if got is not None:  # an answer (408) or the close
                    first = got.split(b"\r\n", 1)[0].decode("latin-1", "replace")
                    answers[f"{kind.decode()}: {first or 'closed'}"] += 1
                    closed_after[id(s)] = now - opened
                    del alive[id(s)]
                    s.close()
                elif now >= next_byte:
                    with contextlib.suppress(OSError):
                        s.send(b"a")
            if now >= next_byte:
                next_byte = now + 2.0
    for s in alive.values():
        s.close()
    lives = sorted(closed_after.values())
    return {
        "slow_connections": len(conns), "byte_every_s": 2.0,
        "victim_statuses": dict(statuses),
        "victim_latency_ms": {"n": len(latencies), "p50": _pct(latencies, 0.5),
                              "p99": _pct(latencies, 0.99), "max": _pct(latencies, 1.0)},
        "slow_answers": dict(answers),
        "slow_closed_after_s": {"n": len(lives),
                                "min": round(lives[0], 1) if lives else None,
                                "median": round(statistics.median(lives), 1) if lives else None,
                                "max": round(lives[-1], 1) if lives else None},
        "still_open_after_60_s": len(alive),
    }


# -- 2. agent spoofing --------------------------------------------------------
def _victim_charges(base: str, key: str, n: int) -> list[float]:
    figures = []
    with httpx.Client(timeout=60) as client:
        for _ in range(n):
            r = client.post(base + "/v1/chat/completions", json={
                "model": "large", "messages": MSG, "max_tokens": 32},
                headers={"authorization": f"Bearer {key}"})
            energy_id = r.headers.get("x-joulegate-energy-id")
            if r.status_code != 200 or not energy_id:
                continue
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                fig = client.get(f"{base}/v1/energy/{energy_id}",
                                 headers={"authorization": f"Bearer {key}"}).json()
                if fig.get("final"):
                    figures.append(fig["net_j"])
                    break
                time.sleep(0.1)
    return figures


FORGERS: dict[str, dict[str, str]] = {
    "none": {}, "wrong token": {"authorization": "Bearer not-the-token"},
    "real token": {"authorization": f"Bearer {TOKEN}", "x-joulegate-gateway": "forger"}}


async def _forge(agent: str, device: str, stop_at: float, who: list[str]) -> Counter[str]:
    """Open and close windows claiming 5,000,000 tokens, as fast as the agent answers."""
    tried: Counter[str] = Counter()
    headers = {name: FORGERS[name] for name in who}
    i, prefix = 0, f"f{random.getrandbits(32):08x}"
    async with httpx.AsyncClient(timeout=10) as client:
        while time.monotonic() < stop_at:
            for name, h in headers.items():
                i += 1
                wid = f"{prefix}-{i}"
                calls = [{"call": "open", "device": device, "windows": [wid]},
                         {"call": "close", "device": device, "window": wid,
                          "points": [[0.0, 5_000_000, 0], [0.05, 5_000_000, 5_000_000]]}]
                r = await client.post(agent + "/v1/windows/batch", json={"calls": calls},
                                      headers=h)
                if r.status_code != 200:
                    tried[f"{name}: {r.status_code}"] += 1
                    continue
                results = r.json()["results"]
                opened = results[0]["body"]["windows"] if results[0]["status"] == 200 else []
                tried[f"{name}: open {'accepted' if opened else 'refused'}, close "
                      f"{results[1]['status']}"] += 1
            await asyncio.sleep(0.01)
    return tried


def _charges_while(base: str, agent: str, device: str, victim: str, n: int,
                   who: list[str], tried: Counter[str]) -> list[float]:
    """The victim's final charges while forgers of the kinds `who` call the agent."""
    async def run() -> list[float]:
        done = asyncio.Event()

        async def forging() -> None:
            while not done.is_set():
                tried.update(await _forge(agent, device, time.monotonic() + 0.5, who))

        task = asyncio.create_task(forging())
        charges = await asyncio.to_thread(_victim_charges, base, victim, n)
        done.set()
        await task
        return charges

    return asyncio.run(run())


def _median(xs: list[float]) -> dict[str, Any]:
    return {"n": len(xs), "median": round(statistics.median(xs), 3) if xs else None}


def _spoofing(base: str, agent: str, device: str, victim: str, n: int) -> dict[str, Any]:
    """Alone; beside forgers without the token (as much load on this machine,
    whose `estimate` meters all of it); beside a holder of the token (a rogue
    gateway: trusted by design, its claims bounded). In turns, twice."""
    runs: dict[str, list[float]] = {"alone": [], "forgers_without_token": [],
                                    "rogue_gateway_with_token": []}
    tried: Counter[str] = Counter()
    for _ in range(2):
        runs["alone"] += _victim_charges(base, victim, n)
        runs["forgers_without_token"] += _charges_while(
            base, agent, device, victim, n, ["none", "wrong token"], tried)
        runs["rogue_gateway_with_token"] += _charges_while(
            base, agent, device, victim, n, ["real token"], tried)
    return {
        "victim_requests": 2 * n, "model": "large", "max_tokens": 32,
        "victim_final_net_j": {name: _median(xs) for name, xs in runs.items()},
        "forged_calls": dict(tried),
        "forged_calls_accepted_without_token": sum(
            v for k, v in tried.items() if not k.startswith("real") and ": 401" not in k),
        "forged_windows_accepted_with_claims": sum(
            v for k, v in tried.items() if "open accepted, close 200" in k),
    }


# -- 3. mutation fuzz ---------------------------------------------------------
LLAMA_FIELDS: dict[str, list[Any]] = {
    "n_predict": [4, 16, -1, 0], "top_k": [0, 40], "top_p": [0.9], "min_p": [0.05],
    "temperature": [0.0, 0.7], "repeat_penalty": [1.1], "repeat_last_n": [64],
    "mirostat": [0, 2], "mirostat_tau": [5.0], "seed": [1, 42], "n_probs": [0, 3],
    "cache_prompt": [True, False], "stop": [["\n"], "END"], "ignore_eos": [False],
    "n_keep": [0, -1], "samplers": [["top_k", "temperature"]], "grammar": ['root ::= "a"'],
    "json_schema": [{"type": "object"}], "logit_bias": [[[15043, 1.0]]],
    "id_slot": [-1, 0], "typical_p": [1.0], "presence_penalty": [0.0],
    "frequency_penalty": [0.0], "dry_multiplier": [0.0], "t_max_predict_ms": [2000],
    "n_indent": [0], "return_tokens": [False], "timings_per_token": [False],
    "max_tokens": [4, 16], "max_completion_tokens": [8], "stream": [False, True],
}
JUNK: list[Any] = [None, "", "abc", "\ud800", -1, -(10 ** 30), 10 ** 30, 1e308, 0.5,
                   True, [], [1, "a"], {}, {"a": {"b": [None]}}, "NaN", "9" * 5000]


def _mutated(rng: random.Random) -> dict[str, Any]:
    body: dict[str, Any] = {"model": rng.choice(["auto", "small", "large"]),
                            "messages": [{"role": "user", "content": rng.choice([
                                "hello", "What is 2+2?", "Write a haiku about rain."])}],
                            "max_tokens": rng.choice([4, 8, 16])}
    for name in rng.sample(sorted(LLAMA_FIELDS), rng.randint(1, 6)):
        body[name] = rng.choice(LLAMA_FIELDS[name])
    for _ in range(rng.randint(0, 3)):
        name = rng.choice([*LLAMA_FIELDS, "messages", "model", "max_tokens"])
        body[name] = rng.choice(JUNK)
    if rng.random() < 0.1:
        body["messages"] = [{"role": rng.choice(["user", "system", "tool", "x"]),
                             "content": rng.choice(JUNK)}]
    return body


def _asked_few(body: dict[str, Any]) -> bool:
    asked = [body.get(k) for k in ("max_tokens", "max_completion_tokens", "n_predict")]
    return any(type(v) is int and 0 < v <= 64 for v in asked)


async def _fuzz(base: str, key: str, n: int, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    bodies = [_mutated(rng) for _ in range(n)]
    statuses: Counter[str] = Counter()
    server_errors: list[dict[str, Any]] = []
    slow: list[dict[str, Any]] = []
    sem = asyncio.Semaphore(8)
    headers = {"authorization": f"Bearer {key}", "content-type": "application/json"}

    async def one(client: httpx.AsyncClient, body: dict[str, Any]) -> None:
        raw = json.dumps(body).encode("utf-8", "surrogatepass")
        async with sem:
            start = time.perf_counter()
            try:
                r = await client.post(base + "/v1/chat/completions", content=raw,
                                      headers=headers)
                status = str(r.status_code)
                text = r.text
            except httpx.HTTPError as exc:
                status, text = f"client_error:{type(exc).__name__}", ""
            took = time.perf_counter() - start
        statuses[status] += 1
        if status.startswith("5"):
            server_errors.append({"status": status, "body": raw.decode("utf-8", "replace")[:400],
                                  "answer": text[:400]})
        if took > 30 and _asked_few(body):
            slow.append({"seconds": round(took, 1), "body": raw.decode("utf-8", "replace")[:400]})

    start = time.perf_counter()
    async with httpx.AsyncClient(timeout=120) as client:
        await asyncio.gather(*(one(client, b) for b in bodies))
    return {"bodies": n, "seed": seed, "concurrency": 8,
            "wall_s": round(time.perf_counter() - start, 1),
            "statuses": dict(statuses), "server_errors": len(server_errors),
            "server_error_examples": server_errors[:20],
            "over_30_s_asking_few_tokens": slow}


# -- the run --------------------------------------------------------------------
def _keys(state: Path) -> tuple[str, str]:
    from app.tenancy.database import migrate
    from app.tenancy.keys import KeyStore

    url = f"sqlite:///{state / 'joulegate.db'}"
    migrate(url)
    store = KeyStore(url)
    try:
        return store.create("victim")[1], store.create("attacker")[1]
    finally:
        store.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--slow", type=int, default=600,
                        help="slow-head connections, and as many slow-body ones")
    parser.add_argument("--spoof-requests", type=int, default=10)
    parser.add_argument("--fuzz", type=int, default=5000)
    parser.add_argument("--seed", type=int, default=25)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "hostile.json")
    args = parser.parse_args()
    binary = llama_server()
    logs = Path(tempfile.mkdtemp(prefix="joulegate-hostile-"))
    state = logs / "state"
    state.mkdir()
    specs = [WorkerSpec("small", "tiny-small", free_port()),
             WorkerSpec("large", "tiny-large", free_port())]
    procs: list[subprocess.Popen[bytes]] = []
    result: dict[str, Any] = {"commit": project_commit(),
                              "machine": f"{platform.machine()}, {os.cpu_count()} cores",
                              "workers": "2 CPU llama-server (tiny test models, -np 4)",
                              "energy_source": "estimate (this VM has no counter)"}
    try:
        procs += [start_worker(s, binary, logs) for s in specs]
        catalog = _catalog(specs[0].port, specs[1].port)
        device = catalog["devices"][0]["name"]
        models = logs / "models.yaml"
        models.write_text(yaml.safe_dump(catalog))
        agent_port, port = free_port(), free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("JOULEGATE_")}
        env.update(JOULEGATE_MODELS_FILE=str(models), JOULEGATE_LOG_LEVEL="warning",
                   JOULEGATE_AGENT_TOKEN=TOKEN, JOULEGATE_STATE_DIR=str(state))
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "app.cli", "agent", "--port", str(agent_port)], env=env,
            cwd=ROOT, stdout=(logs / "agent.log").open("wb"), stderr=subprocess.STDOUT))
        agent = f"http://127.0.0.1:{agent_port}"
        wait_healthy(agent + "/healthz", 30, procs[-1])
        victim, attacker = _keys(state)
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "app.cli", "serve"], cwd=ROOT,
            env=dict(env, JOULEGATE_PORT=str(port), JOULEGATE_AGENT_URL=agent),
            stdout=(logs / "gateway.log").open("wb"), stderr=subprocess.STDOUT))
        base = f"http://127.0.0.1:{port}"
        wait_healthy(base + "/readyz", 60, procs[-1])
        phases: list[tuple[str, Callable[[], dict[str, Any]]]] = [
            ("slowloris", lambda: _slowloris(base, port, args.slow, victim, attacker)),
            ("agent_spoofing", lambda: _spoofing(base, agent, device, victim,
                                                 args.spoof_requests)),
            ("mutation_fuzz", lambda: asyncio.run(_fuzz(base, victim, args.fuzz, args.seed)))]
        for name, phase in phases:
            started = time.monotonic()
            try:
                result[name] = phase()
            except Exception as exc:  # the run still writes what it has
                result[name] = {"error": f"{type(exc).__name__}: {exc}"}
            result[name]["phase_s"] = round(time.monotonic() - started, 1)
            print(name, json.dumps(result[name])[:600], flush=True)
    finally:
        stop(list(reversed(procs)))
        result["gateway_log_tail"] = (logs / "gateway.log").read_text()[-2000:] \
            if (logs / "gateway.log").exists() else ""
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
