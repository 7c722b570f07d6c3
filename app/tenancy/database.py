"""The SQL database behind API keys and the usage ledger.

SQLite in the state directory by default (one file, WAL: readers never wait
for the writer); PostgreSQL when several gateways share keys, budgets and the
ledger (`JOULEGATE_DATABASE_URL=postgresql://user:password@host/db`). The
schema is migrated by Alembic (app/migrations) when a database is opened.

Statements are written once, with `?` placeholders; each store holds one
connection, used under a lock. Driver errors are translated here, once:
a unique constraint is `Conflict`, anything else `DatabaseError`; a dropped
PostgreSQL connection is reopened and the statement tried once more.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

# Bound values in one statement: SQLite's lowest default limit (builds before
# 3.32); PostgreSQL takes 65,535.
MAX_VARIABLES = 999


class DatabaseError(Exception):
    """The database could not run a statement."""


class Conflict(DatabaseError):
    """A row with the same unique value exists."""


@dataclass(frozen=True)
class Result:
    rows: list[tuple[Any, ...]]
    rowcount: int


def _sqlite_path(url: str) -> Path:
    return Path(url.removeprefix("sqlite:///"))


def is_postgres(url: str) -> bool:
    return url.startswith(("postgresql://", "postgres://"))


def migrate(url: str) -> None:
    """Bring the schema to the newest revision (Alembic; idempotent, and safe
    when several gateways start at once)."""
    from app.tenancy.migrations import upgrade

    if not is_postgres(url):
        _sqlite_path(url).parent.mkdir(parents=True, exist_ok=True)
    upgrade(url)


class Database:
    """One connection to the keys-and-usage database, safe across threads."""

    def __init__(self, url: str) -> None:
        if not (is_postgres(url) or url.startswith("sqlite:///")):
            raise ValueError(f"unsupported database URL {url.split(':', 1)[0]}:// "
                             "(sqlite:///PATH or postgresql://...)")
        self.url = url
        self.postgres = is_postgres(url)
        self._lock = threading.Lock()
        self._conn: Any = None
        with self._lock:
            self._connect()

    @classmethod
    def open(cls, url: str) -> Database:
        migrate(url)
        return cls(url)

    def _connect(self) -> None:
        if self.postgres:
            try:
                self._conn = psycopg.connect(self.url, autocommit=True, connect_timeout=10)
            except psycopg.Error as exc:
                raise DatabaseError(f"cannot connect to PostgreSQL: {exc}") from None
            return
        path = _sqlite_path(self.url)
        path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        # WAL's own recommendation: no fsync per commit (a power loss may undo the
        # last commits, never corrupt the file; a process crash loses nothing).
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("PRAGMA busy_timeout=5000")
        self._conn = conn

    def _sql(self, statement: str) -> str:
        return statement.replace("?", "%s") if self.postgres else statement

    def execute(self, statement: str, args: Sequence[Any] = ()) -> Result:
        result: Result = self._run(lambda: self._one(self._sql(statement), args))
        return result

    def insert(self, table: str, columns: Sequence[str], rows: Iterable[Sequence[Any]]
               ) -> None:
        """All rows in one transaction (all are written or none), as INSERTs of
        many rows each: one database step per statement, where a row each
        would make the sqlite3 module give up and take back the GIL per row
        (the event loop's thread waits for it each time)."""
        batch = list(rows)
        per = max(1, MAX_VARIABLES // len(columns))
        one = "(" + ", ".join("?" * len(columns)) + ")"
        head = f"INSERT INTO {table} ({', '.join(columns)}) VALUES "
        statements = [(self._sql(head + ", ".join([one] * len(chunk))),
                       [v for row in chunk for v in row])
                      for chunk in (batch[i:i + per] for i in range(0, len(batch), per))]
        self._run(lambda: self._many(statements))

    def _one(self, statement: str, args: Sequence[Any]) -> Result:
        cur = self._conn.execute(statement, args)
        rows = cur.fetchall() if cur.description is not None else []
        return Result(rows, int(cur.rowcount))

    def _many(self, statements: list[tuple[str, list[Any]]]) -> None:
        """The statements in one transaction."""
        if self.postgres:
            with self._conn.transaction(), self._conn.cursor() as cur:
                for statement, args in statements:
                    cur.execute(statement, args)
            return
        self._conn.execute("BEGIN")
        try:
            for statement, args in statements:
                self._conn.execute(statement, args)
        except BaseException:
            self._conn.execute("ROLLBACK")
            raise
        self._conn.execute("COMMIT")

    def _run(self, work: Any) -> Any:
        with self._lock:
            for attempt in (1, 2):
                try:
                    return work()
                except (sqlite3.IntegrityError, psycopg.errors.UniqueViolation) as exc:
                    raise Conflict(str(exc)) from None
                except psycopg.OperationalError as exc:
                    if attempt == 2 or not self._conn.closed:
                        raise DatabaseError(str(exc)) from None
                    self._connect()  # the server went away: reconnect, try once more
                except (sqlite3.Error, psycopg.Error) as exc:
                    raise DatabaseError(str(exc)) from None
        raise AssertionError("unreachable")

    def close(self) -> None:
        with self._lock:
            self._conn.close()
