"""Where the one-connection tail lands in time: one keep-alive connection
sends chat requests back to back to the forced tier (in front of the
fixed-answer nginx, bench/gateways.py) and times each; the requests at or
above the run's p99 are then placed on the energy sampler's period (20 Hz:
50 ms). Slow requests spread evenly put a tenth of themselves in each tenth
of the period; a per-step cost (the counter step settling the windows of
the requests just answered, their usage rows, metrics and journal lines)
piles them into one tenth. The bare pass-through (bench/passthrough.py) runs
in turns with the gateway, as the floor; with --base, that commit's gateway
too.

    python -m bench.tail_phase [--seconds 10 --rounds 2 --base REV]
        -> bench/results/tail-phase.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import socket
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from app.settings import Settings
from app.tools.embedded import free_port
from bench.gateways import joulegate, passthrough, start_nginx, stop_nginx
from bench.gpu_common import project_commit, worktree_at
from workers.local import ROOT, wait_healthy

BINS = 10
TIMEOUT_S = 10.0  # a request silent this long counts as failed


class Client:
    """One keep-alive HTTP/1.1 connection, a request at a time: no client
    library between the clock and the socket."""

    def __init__(self, port: int, body: bytes) -> None:
        self._port = port
        self._sock: socket.socket | None = None
        self._request = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                         f"Content-Type: application/json\r\nContent-Length: {len(body)}"
                         "\r\n\r\n").encode() + body

    def send(self) -> int:
        """One request; its status, or 0 where the connection failed, closed
        or went silent for TIMEOUT_S (the next request opens a new one)."""
        try:
            if self._sock is None:
                self._sock = socket.create_connection(("127.0.0.1", self._port), TIMEOUT_S)
                self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return self._exchange(self._sock)
        except (OSError, ValueError, StopIteration):
            self.close()
            return 0

    def _exchange(self, sock: socket.socket) -> int:
        sock.sendall(self._request)
        buf = b""
        while b"\r\n\r\n" not in buf:
            chunk = sock.recv(65536)
            if not chunk:
                raise ConnectionError("closed")
            buf += chunk
        head, _, rest = buf.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        length = next(int(line.split(b":", 1)[1]) for line in lines
                      if line.lower().startswith(b"content-length:"))
        while len(rest) < length:
            chunk = sock.recv(65536)
            if not chunk:
                raise ConnectionError("closed")
            rest += chunk
        return int(lines[0].split()[1])

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def measure(port: int, body: bytes, seconds: float, period_s: float) -> dict[str, Any]:
    client = Client(port, body)
    try:
        warm_until = time.perf_counter() + 2
        while time.perf_counter() < warm_until:
            client.send()
        starts: list[float] = []
        lat_ms: list[float] = []
        failed = 0
        end = time.perf_counter() + seconds
        while (t0 := time.perf_counter()) < end:
            failed += client.send() != 200
            starts.append(t0)
            lat_ms.append((time.perf_counter() - t0) * 1000)
    finally:
        client.close()
    return summarise(starts, lat_ms, period_s) | {"non_200": failed}


def summarise(starts: list[float], lat_ms: list[float], period_s: float) -> dict[str, Any]:
    """Quantiles, and the share of the slow requests (>= p99) in each tenth of
    the sampler's period (of the requests started in that tenth)."""
    ordered = sorted(lat_ms)
    n = len(ordered)
    p99 = ordered[int(n * 0.99)]
    in_bin = [0] * BINS
    slow_in_bin = [0] * BINS
    for t, ms in zip(starts, lat_ms, strict=True):
        b = min(BINS - 1, int((t - starts[0]) % period_s / period_s * BINS))
        in_bin[b] += 1
        slow_in_bin[b] += ms >= p99
    slow = sum(slow_in_bin)
    return {"requests": n, "p50_ms": round(ordered[n // 2], 3), "p99_ms": round(p99, 3),
            "p999_ms": round(ordered[int(n * 0.999)], 3),
            "slow_share_by_tenth": [round(s / slow, 3) for s in slow_in_bin],
            "slow_share_busiest_tenth": round(max(slow_in_bin) / slow, 3),
            "slow_rate_busiest_tenth": round(max(s / max(1, c) for s, c in
                                                 zip(slow_in_bin, in_bin, strict=True)), 4)}


def _stop(procs: dict[str, subprocess.Popen[bytes]]) -> None:
    for proc in procs.values():
        proc.terminate()
    for proc in procs.values():
        proc.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--base", help="an earlier commit, measured in turns as well")
    parser.add_argument("--out", type=Path,
                        default=ROOT / "bench" / "results" / "tail-phase.json")
    args = parser.parse_args()
    period_s = 1 / Settings().sample_hz
    work = Path(tempfile.mkdtemp(prefix="joulegate-tail-"))
    procs: dict[str, subprocess.Popen[bytes]] = {}
    ports: dict[str, int] = {}
    with contextlib.ExitStack() as stack:  # on the way out: gateways, nginx, the worktree
        roots = {"joulegate": ROOT}
        if args.base:
            roots["joulegate base"] = stack.enter_context(worktree_at(args.base, work / "base"))
        upstream = start_nginx(work)
        stack.callback(stop_nginx, work)
        stack.callback(_stop, procs)
        ports["pass-through"] = free_port()
        procs["pass-through"] = passthrough(ports["pass-through"], upstream, work)
        for name, root in roots.items():
            ports[name] = free_port()
            procs[name] = joulegate(ports[name], upstream, work, root)
        for name, proc in procs.items():
            wait_healthy(f"http://127.0.0.1:{ports[name]}/readyz", 60, proc)
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in procs}
        names = list(procs)
        for r in range(args.rounds):
            for name in names if r % 2 == 0 else names[::-1]:
                model = "x" if name == "pass-through" else "small"
                body = json.dumps({"model": model, "messages": [
                    {"role": "user", "content": "What is the capital of France?"}]}).encode()
                runs[name].append(measure(ports[name], body, args.seconds, period_s))
                print(name, runs[name][-1], flush=True)
    fields = ("p50_ms", "p99_ms", "p999_ms", "slow_share_busiest_tenth")
    summary = {name: {f"{f}_median": round(statistics.median(r[f] for r in rs), 3)
                      for f in fields}
               for name, rs in runs.items()}
    result = {"commit": project_commit(), "base": args.base, "rounds": args.rounds,
              "seconds": args.seconds, "sampler_period_s": period_s,
              "case": "one keep-alive connection, non-streamed chat, forced small tier "
                      "(the pass-through: its one upstream)",
              "runs": runs, "summary": summary,
              "p99_over_passthrough": {
                  name: round(statistics.median(
                      r["p99_ms"] / p["p99_ms"] for r, p in
                      zip(rs, runs["pass-through"], strict=True)), 3)
                  for name, rs in runs.items() if name != "pass-through"},
              "even_share": round(1 / BINS, 3)}
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
