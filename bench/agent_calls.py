"""The agent's CPU per window call exchange, by server: its own HTTP/1.1 server
on asyncio's loop or uvloop's, and uvicorn (uvloop, httptools) with a
Starlette app over the same AgentServer (the library the hand-written
server must beat by more than 20% to stay: docs/performance-decisions.md).

    python -m bench.agent_calls [--rounds 5 --exchanges 3000]
        -> bench/results/agent-calls.json

Starts `telemetry.agent` in a process of its own (estimate meter) with each
server in turn, sends it open and close batches of one call each over one
keep-alive connection, one at a time (what a gateway at one connection
sends), and reads the agent process's CPU from /proc. Rounds alternate the
loops, so that this VM's drifting speed affects both alike.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from app.tools.embedded import free_port
from bench.gpu_common import project_commit
from bench.process import cpu_s
from workers.local import ROOT

LOOPS = ("asyncio", "uvloop", "uvicorn-starlette")


def serve(loop: str, port: int) -> None:
    from prometheus_client import CollectorRegistry

    from telemetry.agent import start_agent
    from telemetry.devices import DeviceSpec, metered_device
    from telemetry.metrics import Metrics

    new_loop = asyncio.new_event_loop
    if loop != "asyncio":
        import uvloop
        new_loop = uvloop.new_event_loop
    device = metered_device(DeviceSpec("cpu", "local", "estimate", 0, 10.0, 50.0, 10.0), 0.1)
    if loop == "uvicorn-starlette":
        _serve_uvicorn(port, {"cpu": device}, new_loop)
        return
    start_agent("127.0.0.1", port, {"cpu": device}, Metrics(CollectorRegistry()), new_loop)
    print("ready", flush=True)
    time.sleep(3600)


def _serve_uvicorn(port: int, devices: dict[str, Any], new_loop: Any) -> None:
    """The same AgentServer's answers, served by uvicorn with a Starlette app."""
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    from telemetry.agent import AgentServer
    from telemetry.metrics import Metrics

    agent = AgentServer(devices, Metrics(), new_loop)

    async def endpoint(request: Request) -> Response:
        status, body, content_type = await agent.answer(request.method, request.url.path,
                                                        await request.body())
        return Response(body, status, media_type=content_type)

    app = Starlette(routes=[Route("/{path:path}", endpoint, methods=["GET", "POST"])])
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, loop="none",
                                           http="httptools", lifespan="off",
                                           log_level="warning", access_log=False))
    asyncio.set_event_loop(agent.loop)
    agent.loop.call_later(1.0, lambda: print("ready", flush=True))
    agent.loop.run_until_complete(server.serve())


class Client:
    """Batches of one call over one keep-alive connection, one at a time."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.file = self.sock.makefile("rb")

    def call(self, call: dict[str, Any]) -> Any:
        """The call's answer body, or None when the agent refused it."""
        body = json.dumps({"calls": [call]}).encode()
        self.sock.sendall(b"POST /v1/windows/batch HTTP/1.1\r\nhost: agent\r\n"
                          b"content-length: %d\r\n\r\n" % len(body) + body)
        length = 0
        while (line := self.file.readline()) not in (b"\r\n", b""):
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        try:
            result = json.loads(self.file.read(length))["results"][0]
        except (ValueError, KeyError, IndexError, TypeError):
            return None
        return result["body"] if result.get("status") == 200 else None

    def close(self) -> None:
        self.file.close()
        self.sock.close()


def measure(loop: str, exchanges: int) -> dict[str, Any]:
    """One round; failed calls are counted, a broken connection ends the round
    with its error."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "bench.agent_calls", "--serve", loop,
                             "--port", str(port)], cwd=ROOT, stdout=subprocess.PIPE)
    failed = 0
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
        client = Client(port)
        for _ in range(200):  # warm up
            client.call({"call": "open", "device": "cpu"})
        before, start = cpu_s(proc.pid), time.perf_counter()
        for _ in range(exchanges // 2):
            opened = client.call({"call": "open", "device": "cpu"})
            closed = opened and client.call({"call": "close", "device": "cpu",
                                             "window": opened["window"],
                                             "points": [[0.001, 9, 1]]})
            failed += (not opened) + (not closed)
        seconds = time.perf_counter() - start
        cpu = cpu_s(proc.pid) - before
        client.close()
        return {"exchanges_per_s": round(exchanges / seconds),
                "agent_cpu_us_per_exchange": round(1e6 * cpu / exchanges, 1),
                "failed_calls": failed}
    except OSError as exc:
        return {"error": f"{type(exc).__name__}: {exc}", "failed_calls": failed}
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--exchanges", type=int, default=3000)
    parser.add_argument("--serve", choices=LOOPS, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "agent-calls.json")
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.port)
        return
    rounds: dict[str, list[dict[str, Any]]] = {loop: [] for loop in LOOPS}
    results: dict[str, Any] = {"commit": project_commit(),
                               "exchanges_per_round": args.exchanges, "rounds": rounds}
    try:
        for _ in range(args.rounds):
            for loop in LOOPS:
                rounds[loop].append(measure(loop, args.exchanges))
                print(loop, rounds[loop][-1], flush=True)
    finally:
        results["median_agent_cpu_us_per_exchange"] = {
            loop: statistics.median(measured) if (measured := [
                r["agent_cpu_us_per_exchange"] for r in rs if "agent_cpu_us_per_exchange" in r])
            else None for loop, rs in rounds.items()}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=2) + "\n")
        print(json.dumps(results["median_agent_cpu_us_per_exchange"]))

if __name__ == "__main__":
    main()
