"""The sockets of `serve --workers N`: one per process, in one reuse-port group."""

from __future__ import annotations

import socket

import pytest

from app.processes import STEADY_S, listening_socket, restart_delay_s


def test_connections_spread_over_the_processes_sockets() -> None:
    first = listening_socket("127.0.0.1", 0)
    port = first.getsockname()[1]
    second = listening_socket("127.0.0.1", port)
    clients = []
    try:
        for s in (first, second):
            s.listen(64)
            s.setblocking(False)
        clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(32)]
        accepted = []
        for s in (first, second):
            n = 0
            while True:
                try:
                    conn, _ = s.accept()
                except BlockingIOError:
                    break
                conn.close()
                n += 1
            accepted.append(n)
        assert sum(accepted) == 32
        assert min(accepted) >= 4  # by a hash of the addresses: never all on one
    finally:
        for c in clients:
            c.close()
        first.close()
        second.close()


def test_a_port_in_use_without_reuse_port_is_refused() -> None:
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    try:
        with pytest.raises(OSError):
            listening_socket("127.0.0.1", taken.getsockname()[1])
    finally:
        taken.close()


def test_restarts_back_off_while_crash_looping_and_start_over_after_a_steady_run() -> None:
    delays, restarts = [], 0
    for _ in range(6):  # each process died at once
        delay, restarts = restart_delay_s(restarts, 0.2)
        delays.append(delay)
    assert delays == [0.5, 1.0, 2.0, 5.0, 5.0, 5.0]
    assert restart_delay_s(restarts, STEADY_S) == (0.5, 1)  # after an hour's service
