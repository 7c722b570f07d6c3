"""The usage ledger: one row per finished request, and each key's joules per
budget period.

Rows are written by a background thread in batches (every `flush_s`, or
`batch` rows), never on a request's path; a row is written once its energy
figure is final (net and gross joules, source). `close` writes what is left.
Each key's spend in its current period is kept in memory (loaded from the
table when first asked, added to as rows are recorded, and re-read every
few seconds for gateways that share the database), so a budget check is a
dictionary lookup. With a journal (app/tenancy/journal.py), every answered
request's row is on local disk from the moment its answer leaves until the
database has it: a gateway killed with kill -9 loses none.

While the database refuses rows (down, unreachable) they wait in memory, at
most MAX_UNWRITTEN of them (~300 bytes each); beyond that the oldest are
kept only in the journal, read back from it and written once the database
takes rows again (without a journal they are lost, and the log says how
many). A key whose spend
cannot be loaded meanwhile counts what this gateway recorded, kept in
memory like a loaded one (a budget check is still a lookup: summing the
rows waiting for it on every request took 13 ms each with 200,000 of them),
and is loaded again once the database answers.
"""

from __future__ import annotations

import calendar
import datetime as dt
import logging
import operator
import re
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import fields
from pathlib import Path
from typing import Any

from sqlalchemy import ColumnElement, Float, Integer, case, cast, func, select

from app.outage import Outage
from app.tenancy.database import USAGE, Database, DatabaseError
from app.tenancy.journal import UsageJournal, recover
from app.tenancy.keys import ApiKey, BudgetPeriod
from router.record import record

log = logging.getLogger("joulegate.usage")
U = USAGE.c
MAX_UNWRITTEN = 250_000  # rows waiting in memory for the database, at most
DROP_CHUNK = 25_000  # rows left to the journal at once when there are more


@record
class UsageRow:
    time: float
    key_id: str | None
    key_name: str | None
    route: str
    tier: str
    backend: str
    strategy: str
    category: str
    status: str
    prompt_tokens: int
    completion_tokens: int
    energy_net_j: float | None
    energy_gross_j: float | None
    source: str
    latency_s: float
    request_id: str | None = None  # the energy id its response named
    energy_final: bool | None = None  # the counter settled the figure (None: no figure)
    model: str | None = None  # the model name the client asked for
    saved_j: float | None = None  # expected joules saved against always-large (routed)
    # Prompt tokens the worker had cached (not in prompt_tokens, which counts
    # the tokens it computed); with them, the prompt the client was billed.
    cached_tokens: int | None = None

    def with_figure(self, net_j: float | None, gross_j: float | None, source: str,
                    final: bool | None) -> UsageRow:
        """This row with its final energy figure (`dataclasses.replace`
        walks every field by name: ~3x dearer, once per request)."""
        return UsageRow(self.time, self.key_id, self.key_name, self.route, self.tier,
                        self.backend, self.strategy, self.category, self.status,
                        self.prompt_tokens, self.completion_tokens, net_j, gross_j, source,
                        self.latency_s, self.request_id, final, self.model, self.saved_j,
                        self.cached_tokens)


COLUMNS = [f.name for f in fields(UsageRow)]
_values = operator.attrgetter(*COLUMNS)


def period_start(period: BudgetPeriod, now: float) -> float:
    """Start of the UTC day, ISO week (Monday) or month holding `now`."""
    d = dt.datetime.fromtimestamp(now, dt.UTC)
    day = d.replace(hour=0, minute=0, second=0, microsecond=0)
    if period == "day":
        start = day
    elif period == "week":
        start = day - dt.timedelta(days=day.weekday())
    else:
        start = day.replace(day=1)
    return start.timestamp()


def period_end(period: BudgetPeriod, now: float) -> float:
    start = dt.datetime.fromtimestamp(period_start(period, now), dt.UTC)
    if period == "day":
        return (start + dt.timedelta(days=1)).timestamp()
    if period == "week":
        return (start + dt.timedelta(days=7)).timestamp()
    days = calendar.monthrange(start.year, start.month)[1]
    return (start + dt.timedelta(days=days)).timestamp()


class SpendLedger:
    """Usage rows and per-key period spend over app.tenancy.database (SQLite or
    PostgreSQL). Spend cached in memory is re-read from the table every
    `refresh_s` on the writer thread, so gateways sharing one database see
    each other's spending within seconds; a request never waits for it."""

    def __init__(self, url: str, flush_s: float = 0.5, batch: int = 200,
                 clock: Callable[[], float] = time.time, refresh_s: float = 2.0,
                 journal: Path | None = None) -> None:
        self._db = Database.open(url)
        self._journal = None
        if journal is not None:
            self._recover(journal)
            try:
                self._journal = UsageJournal(journal)
            except OSError as exc:
                log.warning("no usage journal (%s): a kill -9 may lose rows not yet "
                            "written", exc)
        self._clock = clock
        self._wake = threading.Event()  # a batch is full, or closing
        self._closing = False
        self._flush_s = flush_s
        self._batch = batch
        self._refresh_s = refresh_s
        self._lock = threading.Lock()
        # key id -> (start of the period last asked about, net joules since then)
        self._spent: dict[str, tuple[float, float]] = {}
        self._unwritten: list[UsageRow] = []  # recorded, not yet committed (FIFO)
        self.dropped = 0  # rows beyond MAX_UNWRITTEN, left to the journal (or lost)
        self._left_out = False  # rows only in the journal, to write from it
        self._wanted: dict[str, float] = {}  # key id -> period start, to load
        self._unloaded: dict[str, float] = {}  # key id -> period start: load when it answers
        self._refusing = Outage(log, "usage database", "rows wait in memory and in the "
                                "journal, and are written once it takes them")
        self._thread = threading.Thread(target=self._write, name="joulegate-usage",
                                        daemon=True)
        self._thread.start()

    # -- budgets ---------------------------------------------------------
    def spent_j(self, key: ApiKey) -> float:
        """Net joules of the key's finished requests in its current period,
        from memory: never a database round trip. A key not loaded yet (new
        since `prime`, or a new period) gets what this gateway recorded, and
        the writer thread loads its committed spend at once."""
        start = period_start(key.budget_period, self._clock())
        with self._lock:
            cached = self._spent.get(key.id)
            if cached is not None and cached[0] == start:
                return cached[1]
            self._wanted[key.id] = start
            known = self._pending(key.id, start)
        self._wake.set()
        return known

    def prime(self, keys: Iterable[ApiKey]) -> None:
        """Load the keys' spend now (start-up, before serving)."""
        now = self._clock()
        for key in keys:
            self._reload(key.id, period_start(key.budget_period, now))

    def _reload(self, key_id: str, start: float) -> float:
        """The key's spend since `start`: committed rows plus ours not yet written."""
        try:
            committed = float(self._db.execute(
                select(func.coalesce(func.sum(U.energy_net_j), 0.0))
                .where(U.key_id == key_id, U.time >= start)).rows[0][0])
        except DatabaseError as exc:
            with self._lock:
                cached = self._spent.get(key_id)
                if cached is not None and cached[0] == start:
                    return cached[1]
                log.warning("cannot read spend of key %s (counting what this gateway "
                            "recorded until it can): %s", key_id, exc)
                # What is known, kept like a loaded spend (records add to it)
                # and loaded again when the database answers.
                known = self._pending(key_id, start)
                self._spent[key_id] = (start, known)
                self._unloaded[key_id] = start
                return known
        with self._lock:
            total = committed + self._pending(key_id, start)
            self._spent[key_id] = (start, total)
            if self._unloaded.get(key_id) == start:
                del self._unloaded[key_id]
            return total

    def _pending(self, key_id: str, start: float) -> float:
        return sum(r.energy_net_j or 0.0 for r in self._unwritten
                   if r.key_id == key_id and r.time >= start)

    # -- rows ------------------------------------------------------------
    def answered(self, row: UsageRow) -> None:
        """A request's row as its answer leaves, before its figure is final:
        journaled, so that it is written even if this process dies now."""
        if self._journal is not None and row.request_id is not None:
            self._journal.answered(dict(zip(COLUMNS, _values(row), strict=True)))

    def record(self, row: UsageRow) -> None:
        """A request's row with its final figure (or none): written soon."""
        with self._lock:
            key_id = row.key_id
            cached = self._spent.get(key_id) if key_id is not None else None
            if key_id is not None and cached is not None and row.time >= cached[0]:
                self._spent[key_id] = (cached[0], cached[1] + (row.energy_net_j or 0.0))
            self._unwritten.append(row)
            if len(self._unwritten) == self._batch:
                self._wake.set()
            elif len(self._unwritten) > MAX_UNWRITTEN:
                self._drop_oldest()
        # After the row is in memory: a final figure in the journal then means
        # the row is in memory, committed, or let go of (_write_left_out).
        if self._journal is not None and row.request_id is not None:
            self._journal.final(row.request_id, row.energy_net_j, row.energy_gross_j,
                                row.source, bool(row.energy_final))

    def _drop_oldest(self) -> None:
        """The database has taken no rows for a long while: leave the oldest
        DROP_CHUNK to the journal (under the lock), after the first batch: the
        writer may be trying those (it removes them itself once written)."""
        gone = self._unwritten[self._batch:self._batch + DROP_CHUNK]
        del self._unwritten[self._batch:self._batch + DROP_CHUNK]
        self.dropped += DROP_CHUNK
        if self._journal is not None:
            self._journal.forget(r.request_id for r in gone if r.request_id)
            self._left_out = True
        where = ("kept in the usage journal, written from it once the database takes rows"
                 if self._journal is not None else "lost: no usage journal")
        log.warning("usage rows: the database has taken none of the last %d; the oldest "
                    "%d are no longer kept in memory (%s; %d so far)", MAX_UNWRITTEN,
                    DROP_CHUNK, where, self.dropped)

    def _write(self) -> None:
        """The writer thread: every `flush_s` (or when a batch is full) commits
        the oldest unwritten rows, a batch at a time, in one transaction each.
        A batch the database refuses stays first in line and is tried again, so
        no committed row is lost and none is written twice."""
        refreshed = time.monotonic()
        while True:
            self._wake.wait(self._flush_s)
            self._wake.clear()
            refused = False
            while True:
                with self._lock:  # only this thread removes rows, from the front
                    rows = self._unwritten[:self._batch]
                    closing = self._closing
                if not rows:
                    break
                try:
                    self._db.insert("usage", COLUMNS, [_values(r) for r in rows])
                except DatabaseError as exc:
                    self._refusing.fail(str(exc))
                    refused = True
                    break
                self._refusing.answered()
                with self._lock:
                    del self._unwritten[:len(rows)]
                if self._journal is not None:
                    self._journal.committed(r.request_id for r in rows if r.request_id)
            if closing:
                return  # what the database refused stays unwritten
            if not refused and self._left_out:
                self._write_left_out()
            with self._lock:  # keys not loaded yet: again once rows go in
                wanted = self._wanted if refused else {**self._unloaded, **self._wanted}
                self._wanted = {}
            for key_id, start in wanted.items():
                self._reload(key_id, start)
            if time.monotonic() - refreshed > self._refresh_s:
                refreshed = time.monotonic()
                with self._lock:
                    cached = list(self._spent.items())
                for key_id, (start, _) in cached:
                    self._reload(key_id, start)

    def _write_left_out(self) -> None:
        """The rows `_drop_oldest` let go of, read back from this process's
        journal and written, a batch at a time (on the writer thread, once the
        database takes rows again); a batch refused is tried again later, with
        those after it, and none is written twice."""
        assert self._journal is not None
        with self._lock:
            self._left_out = False
        written = 0
        try:
            for rows in self._journal.left_out(self._batch):
                self._insert_dicts(rows)
                written += len(rows)
        except DatabaseError as exc:
            self._refusing.fail(str(exc))
            with self._lock:
                self._left_out = True  # again when it takes rows
        if written:
            log.warning("wrote %d usage rows kept only in the journal while the database "
                        "refused them", written)

    def _insert_dicts(self, rows: list[dict[str, Any]]) -> None:
        self._db.insert("usage", COLUMNS, [[r.get(c) for c in COLUMNS] for r in rows])

    def rows(self, key_id: str | None, since: float, limit: int | None = None
             ) -> list[dict[str, Any]]:
        """Finished requests since `since` (a key's own, or all for None),
        oldest first; with `limit`, the newest `limit` of them."""
        stmt = select(*(U[c] for c in COLUMNS)).where(*_where(key_id, since)) \
            .order_by(U.time.desc())
        if limit is not None:
            stmt = stmt.limit(int(limit))
        found = self._db.execute(stmt).rows
        return [dict(zip(COLUMNS, r, strict=True)) for r in reversed(found)]

    def totals(self, key_id: str | None, since: float, key_name: str | None = None
               ) -> dict[str, Any]:
        """Requests, tokens, net joules and the joules routing expected to
        save since `since`: in all, by UTC day and by backend, summed by the
        database (however many rows there are)."""
        where = _where(key_id, since)
        if key_name is not None:
            where.append(U.key_name == key_name)
        day = (func.floor(U.time / 86400) if self._db.postgres
               else cast(U.time / 86400, Integer)).label("day")
        groups = self._db.execute(
            select(day, U.backend, func.count(), func.coalesce(func.sum(U.prompt_tokens), 0),
                   func.coalesce(func.sum(U.cached_tokens), 0),
                   func.coalesce(func.sum(U.completion_tokens), 0),
                   func.coalesce(func.sum(U.energy_net_j), 0.0),
                   func.coalesce(func.sum(U.saved_j), 0.0))
            .where(*where).group_by(day, U.backend)).rows
        total: dict[str, Any] = {}
        by_day: dict[str, dict[str, Any]] = {}
        by_model: dict[str, dict[str, Any]] = {}
        for number, backend, *sums in sorted(groups, key=lambda g: (g[0], str(g[1]))):
            date = dt.datetime.fromtimestamp(int(number) * 86400, dt.UTC).strftime("%Y-%m-%d")
            for into in (total, by_day.setdefault(date, {}),
                         by_model.setdefault(str(backend), {})):
                _add(into, *sums)
        return {"totals": total, "by_day": by_day, "by_model": dict(sorted(by_model.items()))}

    def report_groups(self, since: float) -> list[dict[str, Any]]:
        """Finished requests since `since`, summed by category, backend and
        energy source in the database: requests, tokens, net and gross joules,
        the requests with an energy figure and their tokens (with prompt x
        completion, which a curve's prediction needs), and loop-guard stops
        (app/tenancy/report.py makes the report of them)."""
        ok = U.energy_net_j.is_not(None)
        stmt = select(
            U.category, U.backend, U.source, func.count(),
            func.coalesce(func.sum(U.prompt_tokens), 0),
            func.coalesce(func.sum(U.completion_tokens), 0),
            func.coalesce(func.sum(U.energy_net_j), 0.0),
            func.coalesce(func.sum(U.energy_gross_j), 0.0),
            func.sum(case((ok, 1), else_=0)),
            func.coalesce(func.sum(case((ok, U.prompt_tokens), else_=0)), 0),
            func.coalesce(func.sum(case((ok, U.completion_tokens), else_=0)), 0),
            func.coalesce(func.sum(case((ok, cast(U.prompt_tokens, Float)
                                         * U.completion_tokens), else_=0.0)), 0.0),
            func.sum(case((U.status == "loop_stopped", 1), else_=0)),
        ).where(U.time >= since).group_by(U.category, U.backend, U.source)
        names = ("category", "backend", "source", "requests", "prompt_tokens",
                 "completion_tokens", "energy_net_j",
                 "energy_gross_j", "metered", "metered_prompt_tokens",
                 "metered_completion_tokens", "metered_prompt_x_completion", "loop_stops")
        return [dict(zip(names, r, strict=True)) for r in self._db.execute(stmt).rows]

    def _recover(self, folder: Path) -> None:
        """Rows that a gateway killed before they reached the database
        journaled (a failure leaves them for the next start)."""
        def have(rows: list[dict[str, Any]]) -> set[str]:
            """Which rows the database holds: looked up among rows as recent
            as the oldest (the time index; request_id has none)."""
            since = min(float(r["time"]) for r in rows)
            ids = [r["request_id"] for r in rows]
            found: set[str] = set()
            for i in range(0, len(ids), 500):
                found.update(r[0] for r in self._db.execute(
                    select(U.request_id).where(U.time >= since,
                                               U.request_id.in_(ids[i:i + 500]))).rows)
            return found

        try:
            n = recover(folder, have, self._insert_dicts)
        except (DatabaseError, OSError) as exc:
            log.warning("usage journal not recovered yet (next start): %s", exc)
            return
        if n:
            log.warning("wrote %d usage rows that a stopped gateway had journaled", n)

    def close(self) -> None:
        with self._lock:
            self._closing = True
        self._wake.set()
        self._thread.join(timeout=10)
        if self._journal is not None:
            self._journal.close()
        self._db.close()


def parse_since(text: str) -> float | None:
    """Seconds in "90s", "30m", "24h", "7d"; None if unreadable."""
    m = re.fullmatch(r"([0-9]{1,9}(?:\.[0-9]{1,6})?)([smhd])", text)
    if m is None:
        return None
    return float(m.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]


def _where(key_id: str | None, since: float) -> list[ColumnElement[bool]]:
    if key_id is None:
        return [U.time >= since]
    return [U.key_id == key_id, U.time >= since]


def _add(into: dict[str, Any], requests: int, prompt: int, cached: int, completion: int,
         net_j: float, saved_j: float) -> None:
    into["requests"] = into.get("requests", 0) + int(requests)
    into["prompt_tokens"] = into.get("prompt_tokens", 0) + int(prompt)
    into["cached_tokens"] = into.get("cached_tokens", 0) + int(cached)
    into["completion_tokens"] = into.get("completion_tokens", 0) + int(completion)
    into["energy_net_j"] = into.get("energy_net_j", 0.0) + float(net_j)
    into["saved_expected_j"] = into.get("saved_expected_j", 0.0) + float(saved_j)
