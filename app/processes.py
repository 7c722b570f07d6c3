"""`joulegate serve --workers N`: N gateway processes on one port, each
accepting on a listening socket of its own (SO_REUSEPORT).

uvicorn's own supervisor gives every process the one socket it bound: the
process whose event loop wakes first accepts every connection waiting (an
asyncio server accepts up to its backlog per wake-up), so a burst of
keep-alive clients can land on one process and leave the others idle (50
connections split 50/0, 31/19, 37/13 in three tries here). With a socket per
process in one reuse-port group the kernel spreads connections over them by
a hash of their addresses.

The parent binds the sockets (a port in use fails here, at once), starts a
process per socket, restarts one that exits, and on SIGINT or SIGTERM asks
each to stop (uvicorn's graceful shutdown: the meter drained, the usage rows
written) and waits for them.
"""

from __future__ import annotations

import logging
import multiprocessing
import signal
import socket
import threading
import time
from dataclasses import dataclass
from multiprocessing.process import BaseProcess

log = logging.getLogger("joulegate.processes")

STARTUP_FAILURE = 3  # uvicorn's exit status for an app that cannot start
STOP_TIMEOUT_S = 30.0
RESTART_BACKOFF_S = (0.5, 1.0, 2.0, 5.0)
STEADY_S = 60.0  # a process that served this long before exiting restarts the backoff


def restart_delay_s(restarts: int, ran_s: float) -> tuple[float, int]:
    """The wait before starting again a process that exited after `ran_s`,
    `restarts` times restarted in a row; and the count with this one. A
    process that ran STEADY_S or more was not crash-looping: the count restarts."""
    if ran_s >= STEADY_S:
        restarts = 0
    return RESTART_BACKOFF_S[min(restarts, len(RESTART_BACKOFF_S) - 1)], restarts + 1


@dataclass(frozen=True)
class ServeConfig:
    """What each process's uvicorn needs (picklable: processes are spawned)."""

    app: str  # "module:factory"
    host: str
    port: int
    log_level: str


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

    # proxy_headers: no X-Forwarded-* rewriting per request (no client address is read)
    uvicorn.Server(uvicorn.Config(
        config.app, factory=True, host=config.host, port=config.port,
        log_level=config.log_level, access_log=False, server_header=False,
        proxy_headers=False)).run(sockets=[sock])


class Processes:
    """A gateway process per socket (`listening_socket`, bound by the caller)."""

    def __init__(self, config: ServeConfig, sockets: list[socket.socket]) -> None:
        self.config = config
        self.sockets = sockets
        self._stop = threading.Event()
        self._context = multiprocessing.get_context("spawn")

    def _start(self, sock: socket.socket) -> BaseProcess:
        process = self._context.Process(target=_serve, args=(self.config, sock),
                                        name="joulegate-gateway")
        process.start()
        return process

    def run(self) -> int:
        """Serve until SIGINT or SIGTERM; 1 when a process could not start."""
        sockets = self.sockets
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: self._stop.set())
        processes = [self._start(s) for s in sockets]
        restarts = [0] * len(sockets)
        started = [time.monotonic()] * len(sockets)
        status = 0
        while not self._stop.wait(0.5):
            for i, process in enumerate(processes):
                if process.is_alive():
                    continue
                if process.exitcode == STARTUP_FAILURE:
                    log.error("gateway process %s could not start: stopping", process.pid)
                    self._stop.set()
                    status = 1
                    break
                log.warning("gateway process %s exited (%s): starting another", process.pid,
                            process.exitcode)
                delay_s, restarts[i] = restart_delay_s(restarts[i],
                                                       time.monotonic() - started[i])
                time.sleep(delay_s)
                processes[i] = self._start(sockets[i])
                started[i] = time.monotonic()
        self._stop_all(processes)
        for s in sockets:
            s.close()
        return status

    @staticmethod
    def _stop_all(processes: list[BaseProcess]) -> None:
        for process in processes:
            if process.is_alive():
                process.terminate()  # SIGTERM: uvicorn's graceful shutdown
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for process in processes:
            process.join(max(0.0, deadline - time.monotonic()))
            if process.is_alive():
                log.warning("gateway process %s did not stop in %.0f s: killed",
                            process.pid, STOP_TIMEOUT_S)
                process.kill()
                process.join()
