"""The usage journal: answered requests' rows on local disk until the
database has them, so a gateway killed with kill -9 loses none.

A request's row is appended when its answer is ready to leave (with the
figure the response carries, provisional), its final figure when the counter
settles it, and the ids of rows the database committed after each batch.
Appends are single `write` calls on a file opened with O_APPEND: once the
call returns, the kernel holds the bytes, and a killed process cannot lose
them (a power cut can: nothing is fsynced, which would cost a disk flush
per request).

Each gateway process writes its own segment files (`usage-<uuid>-<n>.jsonl`
in the state directory's `journal/`) and holds an exclusive `flock` on its
lock file (`usage-<uuid>.lock`) while it lives: a few descriptors however
many segments wait for the database (the segment being written and the
OPEN_OLD before it keep theirs; older ones are opened for each line they
get). A new segment starts
every `segment_bytes`; a segment is deleted once every row answered in it is
committed. At start-up a gateway `recover`s the segments whose lock no
living process holds (or, written by a version that locked each segment,
whose own lock is free): rows answered and
not committed are written, with their final figure where one was journaled,
else the response's (`energy_final` false); rows the database already has
(the process died between a commit and its journal line) are skipped by
their request id.
"""

from __future__ import annotations

import fcntl
import logging
import os
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app import jsonio
from app.outage import Outage

log = logging.getLogger("joulegate.usage")
SEGMENT_BYTES = 4 << 20
LOCK_SUFFIX = ".lock"
# Segments before the current one kept open: the final figures of the rows
# answered last in a segment come within seconds, in it.
OPEN_OLD = 2


@dataclass
class _Segment:
    path: Path
    fd: int | None  # open while it is the segment being written
    size: int = 0
    pending: set[str] = field(default_factory=set)  # answered here, not committed
    untracked: bool = False  # holds rows `forget` let go of: kept until they are written


class UsageJournal:
    """Append-only record of one process's answered rows (dicts with a
    `request_id`). Thread-safe: the event loop appends rows and figures, the
    ledger's writer thread appends commits."""

    def __init__(self, folder: Path, segment_bytes: int = SEGMENT_BYTES) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self._folder = folder
        self._prefix = f"usage-{uuid.uuid4().hex[:12]}"
        self._segment_bytes = segment_bytes
        self._lock = threading.Lock()
        self._lock_path = folder / f"{self._prefix}{LOCK_SUFFIX}"
        self._held = _hold(self._lock_path)
        self._n = 0
        self._where: dict[str, _Segment] = {}  # request id -> its segment
        self._old: list[_Segment] = []
        self._current = self._new_segment()
        self._failing = Outage(log, f"usage journal in {folder}",
                               "rows still go to the database, but a kill -9 may lose the "
                               "ones not written yet")

    def answered(self, row: dict[str, Any]) -> None:
        """A request's row as its answer leaves (energy: the response's figure)."""
        line = _line({"a": row})
        with self._lock:
            seg = self._current
            self._append(seg, line)
            seg.pending.add(row["request_id"])
            self._where[row["request_id"]] = seg
            if seg.size >= self._segment_bytes:
                try:
                    fresh = self._new_segment()
                except OSError as exc:  # a full disk: this segment goes on
                    self._failing.fail(f"no new segment: {exc}")
                else:
                    self._old.append(seg)
                    for older in self._old[:-OPEN_OLD]:
                        self._let_go(older)
                    self._current = fresh

    def final(self, request_id: str, net_j: float | None, gross_j: float | None,
              source: str, final: bool) -> None:
        line = _line({"f": request_id, "net": net_j, "gross": gross_j, "source": source,
                      "final": final})
        with self._lock:
            seg = self._where.get(request_id)
            if seg is not None:
                self._append(seg, line)

    def committed(self, request_ids: Iterable[str]) -> None:
        """Rows the database now holds; segments left with none pending go."""
        ids = [i for i in request_ids if i]
        if not ids:
            return
        with self._lock:
            by_segment: dict[int, list[str]] = {}
            for rid in ids:
                seg = self._where.pop(rid, None)
                if seg is not None:
                    seg.pending.discard(rid)
                    by_segment.setdefault(id(seg), []).append(rid)
            for seg in [self._current, *self._old]:
                done = by_segment.get(id(seg))
                if done:
                    self._append(seg, _line({"c": done}))
            self._drop_done()

    def forget(self, request_ids: Iterable[str]) -> None:
        """Rows the ledger no longer holds in memory (a long outage): no longer
        tracked here either, so this index stays as bounded as the ledger;
        their segments stay until `left_out` has handed them back."""
        with self._lock:
            touched: dict[int, _Segment] = {}
            for rid in request_ids:
                seg = self._where.pop(rid, None)
                if seg is not None:
                    seg.pending.discard(rid)
                    seg.untracked = True
                    touched[id(seg)] = seg
            for seg in touched.values():  # a set keeps its largest table: copied small
                seg.pending = set(seg.pending)

    def left_out(self, batch: int) -> Iterator[list[dict[str, Any]]]:
        """The rows `forget` let go of, complete as `recover` writes them (with
        their final figures), read back from the segment files one segment at
        a time, in lists of at most `batch`. Once the caller asks for the next
        list, the last one counts as written (a commit line); a caller that
        stops on an error leaves it, and those after it, for the next call."""
        with self._lock:
            segments = [s for s in (*self._old, self._current) if s.untracked]
        for seg in segments:
            with self._lock:
                seg.untracked = False  # a row forgotten from now on marks it again
            done = False
            try:
                rows: dict[str, dict[str, Any]] = {}
                finals: dict[str, dict[str, Any]] = {}
                committed: set[str] = set()
                try:
                    _read(seg.path, rows, finals, committed)
                except OSError as exc:
                    self._failing.fail(f"{seg.path.name} unreadable: {exc}")
                    continue
                with self._lock:  # tracked rows are in the ledger's memory, or in flight
                    out = [_completed(rows[rid], fig) for rid, fig in finals.items()
                           if rid in rows and rid not in committed and rid not in self._where]
                for i in range(0, len(out), batch):
                    part = out[i:i + batch]
                    yield part
                    with self._lock:
                        self._append(seg, _line({"c": [r["request_id"] for r in part]}))
                done = True
            finally:
                with self._lock:
                    if done:
                        self._drop_done()
                    else:
                        seg.untracked = True  # kept: the next call, or the next start

    def _drop_done(self) -> None:
        """Old segments whose rows are all committed go (under the lock)."""
        for seg in [s for s in self._old if not s.pending and not s.untracked]:
            self._old.remove(seg)
            _remove(seg)

    def close(self) -> None:
        """Closed after the ledger's last write: segments with nothing
        pending are removed, the others stay for the next start."""
        with self._lock:
            kept = False
            for seg in [self._current, *self._old]:
                if not seg.pending and not seg.untracked:
                    _remove(seg)
                else:
                    self._let_go(seg)
                    kept = True
            self._old = []
            if not kept:
                self._lock_path.unlink(missing_ok=True)
            os.close(self._held)  # releases the lock: what is kept is recovered next time

    def _new_segment(self) -> _Segment:
        self._n += 1
        path = self._folder / f"{self._prefix}-{self._n}.jsonl"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        return _Segment(path, fd)

    @staticmethod
    def _let_go(seg: _Segment) -> None:
        """A segment no longer written to: its descriptor closed (lines it
        still gets open it again for each one)."""
        if seg.fd is not None:
            os.close(seg.fd)
            seg.fd = None

    def _append(self, seg: _Segment, line: bytes) -> None:
        try:
            if seg.fd is not None:
                seg.size += os.write(seg.fd, line)
            else:
                fd = os.open(seg.path, os.O_WRONLY | os.O_APPEND)
                try:
                    seg.size += os.write(fd, line)
                finally:
                    os.close(fd)
        except OSError as exc:  # a full disk: the row still goes to the database
            self._failing.fail(f"{seg.path.name}: {exc}")
        else:
            self._failing.answered()


def recover(folder: Path, have: Callable[[list[dict[str, Any]]], set[str]],
            write: Callable[[list[dict[str, Any]]], None]) -> int:
    """Write the rows of dead processes' segments that the database lacks;
    returns how many. `have` says which of some rows (their request ids) the
    database holds; `write` commits rows (it raises if it cannot: the segments then
    stay for the next start)."""
    if not folder.is_dir():
        return 0
    held: list[int] = []
    rows: dict[str, dict[str, Any]] = {}
    finals: dict[str, dict[str, Any]] = {}
    committed: set[str] = set()
    taken: list[Path] = []  # segments of dead processes
    locks: list[Path] = []  # and their lock files
    try:
        for lock, segments in _by_process(folder).items():
            if lock.exists():
                fd = _lock_if_dead(lock)
                if fd is None:
                    continue  # its process lives
                held.append(fd)
                locks.append(lock)
                taken.extend(segments)
            else:  # an older version's: each segment locked on its own
                for path in segments:
                    fd = _lock_if_dead(path)
                    if fd is not None:
                        held.append(fd)
                        taken.append(path)
        for path in taken:
            _read(path, rows, finals, committed)
        todo = [rid for rid in rows if rid not in committed]
        present = have([rows[rid] for rid in todo]) if todo else set()
        out = [_completed(rows[rid], finals.get(rid)) for rid in todo if rid not in present]
        if out:
            write(out)
        for path in [*taken, *locks]:
            path.unlink(missing_ok=True)
        return len(out)
    finally:
        for fd in held:
            os.close(fd)


def _by_process(folder: Path) -> dict[Path, list[Path]]:
    """Each process's lock file (which may be gone, or predate lock files)
    with its segments, oldest first; lock files with no segment left too."""
    found: dict[Path, list[Path]] = {p: [] for p in folder.glob(f"usage-*{LOCK_SUFFIX}")}
    for path in sorted(folder.glob("usage-*.jsonl"),
                       key=lambda p: (p.name.rsplit("-", 1)[0], _number(p))):
        prefix = path.name.rsplit("-", 1)[0]
        found.setdefault(folder / f"{prefix}{LOCK_SUFFIX}", []).append(path)
    return found


def _number(path: Path) -> int:
    try:
        return int(path.stem.rsplit("-", 1)[1])
    except (IndexError, ValueError):
        return 0


def _hold(lock: Path) -> int:
    """The process's lock file, created locked: made under another name,
    locked, then renamed, so `recover` never finds it unlocked while its
    process lives."""
    making = lock.with_suffix(".new")
    fd = os.open(making, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    making.rename(lock)
    return fd


def _completed(row: dict[str, Any], fig: dict[str, Any] | None) -> dict[str, Any]:
    if fig is None:
        return {**row, "energy_final": False}
    return {**row, "energy_net_j": fig["net"], "energy_gross_j": fig["gross"],
            "source": fig["source"], "energy_final": fig["final"]}


def _read(path: Path, rows: dict[str, dict[str, Any]], finals: dict[str, dict[str, Any]],
          committed: set[str]) -> None:
    with path.open("rb") as f:
        for raw in f:
            try:
                rec = jsonio.loads(raw)
            except ValueError:
                continue  # a line cut off by the kill
            if "a" in rec:
                rows[rec["a"]["request_id"]] = rec["a"]
            elif "f" in rec:
                finals[rec["f"]] = rec
            elif "c" in rec:
                committed.update(rec["c"])


def _lock_if_dead(path: Path) -> int | None:
    """An fd holding the segment's lock, or None while its process lives."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def _remove(seg: _Segment) -> None:
    seg.path.unlink(missing_ok=True)
    if seg.fd is not None:
        os.close(seg.fd)
        seg.fd = None


def _line(record: dict[str, Any]) -> bytes:
    return jsonio.dumps(record) + b"\n"  # orjson: ~1 us, on the event loop
