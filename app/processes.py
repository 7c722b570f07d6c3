"""The one process supervisor: `joulegate serve --workers N` (N gateway
processes) and `make run` (`joulegate dev`: local llama-server workers and a
gateway) both run their children under `Supervisor`.

A child that exits is started again after a backoff (0.5, 1, 2, then 5 s; a
child that ran a minute or more before exiting starts over at 0.5 s). A child
that exits with a status that says it can never start (2: a configuration
error, 3: uvicorn's "the app could not start") is not restarted: everything
stops and that status is returned. On SIGINT or SIGTERM each child is asked
to stop (SIGTERM: uvicorn's graceful shutdown drains the meter and writes the
usage rows), the last started first, and killed after STOP_TIMEOUT_S.

`serve --workers`: a listening socket per process in one reuse-port group.
uvicorn's own supervisor gives every process the one socket it bound: the
process whose event loop wakes first accepts every connection waiting, so a
burst of keep-alive clients can land on one process and leave the others idle
(50 connections split 50/0, 31/19, 37/13 in three tries here). With a socket
per process the kernel spreads connections over them by a hash of their
addresses. The parent binds the sockets (a port in use fails at once) and
keeps them open, so connections sent to a dead process's socket wait for its
replacement.
"""

from __future__ import annotations

import logging
import multiprocessing
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Protocol

log = logging.getLogger("joulegate.processes")

CONFIG_ERROR = 2  # a child's exit status for a configuration error: never restarted
STARTUP_FAILURE = 3  # uvicorn's exit status for an app that cannot start
FATAL = frozenset({CONFIG_ERROR, STARTUP_FAILURE})
STOP_TIMEOUT_S = 30.0
RESTART_BACKOFF_S = (0.5, 1.0, 2.0, 5.0)
STEADY_S = 60.0  # a process that served this long before exiting restarts the backoff
TEND_EVERY_S = 0.2


def restart_delay_s(restarts: int, ran_s: float) -> tuple[float, int]:
    """The wait before starting again a process that exited after `ran_s`,
    `restarts` times restarted in a row; and the count with this one. A
    process that ran STEADY_S or more was not crash-looping: the count restarts."""
    if ran_s >= STEADY_S:
        restarts = 0
    return RESTART_BACKOFF_S[min(restarts, len(RESTART_BACKOFF_S) - 1)], restarts + 1


class Child(Protocol):
    """A process the supervisor can start, watch and stop."""

    name: str

    def start(self) -> None: ...
    def exitcode(self) -> int | None: ...  # None while it runs
    def terminate(self) -> None: ...
    def kill(self) -> None: ...
    def wait(self, timeout_s: float) -> bool: ...  # True once it has exited


@dataclass
class Command:
    """A child that is a command line (`make run`'s workers and gateway)."""

    name: str
    argv: list[str]
    log_path: Path | None = None  # None: this terminal
    env: dict[str, str] | None = None
    cwd: Path | None = None
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        if self.log_path is None:
            self.proc = subprocess.Popen(self.argv, env=self.env, cwd=self.cwd,
                                         start_new_session=True)
            return
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as out:
            self.proc = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT,
                                         env=self.env, cwd=self.cwd, start_new_session=True)

    def exitcode(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def terminate(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()

    def wait(self, timeout_s: float) -> bool:
        if self.proc is None:
            return True
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return False
        return True


@dataclass(frozen=True)
class ServeConfig:
    """What each gateway process's uvicorn needs (picklable: processes are spawned)."""

    app: str  # "module:factory"
    host: str
    port: int
    log_level: str
    head_timeout_s: float = 10.0
    max_connections: int = 0  # app/http/connection.py; 0: no cap
    max_connections_per_client: int = 0


def listening_socket(host: str, port: int) -> socket.socket:
    """A socket bound to host:port in a reuse-port group, not yet listening."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def _serve(config: ServeConfig, sock: socket.socket) -> None:
    """One gateway process (spawned): uvicorn on its own socket."""
    import uvicorn

    from app.http.connection import uvicorn_options

    uvicorn.Server(uvicorn.Config(
        config.app, factory=True, host=config.host, port=config.port,
        log_level=config.log_level,
        **uvicorn_options(config.head_timeout_s, config.max_connections,
                          config.max_connections_per_client),
    )).run(sockets=[sock])


@dataclass
class GatewayProcess:
    """A child that is one gateway process on its own socket (`serve --workers`)."""

    config: ServeConfig
    sock: socket.socket
    name: str = "gateway process"
    process: BaseProcess | None = None

    def start(self) -> None:
        self.process = multiprocessing.get_context("spawn").Process(
            target=_serve, args=(self.config, self.sock), name="joulegate-gateway")
        self.process.start()
        self.name = f"gateway process {self.process.pid}"

    def exitcode(self) -> int | None:
        return None if self.process is None else self.process.exitcode

    def terminate(self) -> None:
        if self.process is not None and self.process.is_alive():
            self.process.terminate()

    def kill(self) -> None:
        if self.process is not None and self.process.is_alive():
            self.process.kill()

    def wait(self, timeout_s: float) -> bool:
        if self.process is None:
            return True
        self.process.join(timeout_s)
        return not self.process.is_alive()


@dataclass
class _Watched:
    child: Child
    restarts: int = 0
    started_at: float = 0.0
    restart_at: float | None = None


@dataclass
class Supervisor:
    """Children started in order, restarted with backoff, stopped in reverse."""

    children: list[Child]
    say: Callable[[str], None] = log.warning  # how restarts are told (make run: stderr)
    clock: Callable[[], float] = time.monotonic
    stopping: threading.Event = field(default_factory=threading.Event)
    _watched: list[_Watched] = field(default_factory=list)

    def start(self) -> None:
        for child in self.children:
            child.start()
            self._watched.append(_Watched(child, started_at=self.clock()))

    def tend(self) -> int | None:
        """Restart what exited and waited out its backoff; a fatal exit's status."""
        now = self.clock()
        for w in self._watched:
            if w.restart_at is not None:
                if now >= w.restart_at:
                    w.child.start()
                    w.started_at, w.restart_at = now, None
                    self.say(f"{w.child.name} restarted (restart {w.restarts})")
                continue
            code = w.child.exitcode()
            if code is None:
                continue
            if code in FATAL:
                self.say(f"{w.child.name} exited with {code} (it cannot start): stopping")
                return code
            delay_s, w.restarts = restart_delay_s(w.restarts, now - w.started_at)
            w.restart_at = now + delay_s
            self.say(f"{w.child.name} exited with {code}; restarting in {delay_s:g} s")
        return None

    def run(self, on_signals: bool = True, each_tick: Callable[[], None] | None = None) -> int:
        """Start, tend until SIGINT/SIGTERM (or `stopping`) or a fatal exit, stop all.
        0, or the fatal status. `each_tick` runs after every round of tending."""
        if on_signals:
            for sig in (signal.SIGINT, signal.SIGTERM):
                signal.signal(sig, lambda *_: self.stopping.set())
        status = 0
        try:
            self.start()
            while not self.stopping.wait(TEND_EVERY_S):
                fatal = self.tend()
                if fatal is not None:
                    status = fatal
                    break
                if each_tick is not None:
                    each_tick()
        finally:
            self.stop_all()
        return status

    def stop_all(self) -> None:
        """SIGTERM to each child, the last started first; kill what outlives the timeout."""
        children = [w.child for w in reversed(self._watched)]
        for child in children:
            child.terminate()
        deadline = self.clock() + STOP_TIMEOUT_S
        for child in children:
            if not child.wait(max(0.0, deadline - self.clock())):
                self.say(f"{child.name} did not stop in {STOP_TIMEOUT_S:.0f} s: killed")
                child.kill()
                child.wait(5.0)


def serve_processes(config: ServeConfig, sockets: list[socket.socket]) -> int:
    """`serve --workers`: a gateway process per socket; 1 when one could not start."""
    status = Supervisor([GatewayProcess(config, s) for s in sockets]).run()
    for s in sockets:
        s.close()
    return 1 if status else 0
