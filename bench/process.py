"""What a benchmark reads of a running process, from /proc (Linux)."""

from __future__ import annotations

import os
from pathlib import Path


def rss_mb(pid: int) -> float:
    """Resident memory of a process, in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def cpu_s(pid: int) -> float:
    """User + system CPU seconds a process has used."""
    return _stat_cpu_s(Path(f"/proc/{pid}/stat"))


def _stat_cpu_s(stat: Path) -> float:
    """User + system CPU seconds in a /proc stat file (a process's or a thread's)."""
    fields = stat.read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def tree_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process and its descendants (the gateway
    processes and the agent of `serve --workers N`), reaped ones included."""
    parents: dict[int, int] = {}
    ticks: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # ended meanwhile
        child = int(stat.parent.name)
        parents[child] = int(fields[1])
        ticks[child] = sum(int(f) for f in fields[11:15])  # utime stime cutime cstime
    tree = {pid}
    grew = True
    while grew:
        more = {c for c, p in parents.items() if p in tree} - tree
        tree |= more
        grew = bool(more)
    return sum(ticks.get(p, 0) for p in tree) / os.sysconf("SC_CLK_TCK")


def thread_cpu_s(pid: int) -> dict[int, float]:
    """User + system CPU seconds of each thread of a process, by thread id
    (the main thread's id is the process id)."""
    out: dict[int, float] = {}
    for stat in Path(f"/proc/{pid}/task").glob("[0-9]*/stat"):
        try:
            out[int(stat.parent.name)] = _stat_cpu_s(stat)
        except OSError:
            continue  # ended meanwhile
    return out
