"""The SQL database behind API keys and the usage ledger, on SQLAlchemy Core.

SQLite in the state directory by default (one file, WAL: readers never wait
for the writer); PostgreSQL (psycopg 3) when several gateways share keys,
budgets and the ledger (`JOULEGATE_DATABASE_URL=postgresql://user:password@host/db`).
The schema is migrated by Alembic (app/tenancy/migrations) when a database is
opened; `TABLES` describes the same tables for building statements.

Statements are SQLAlchemy expressions (or, for tests and one-off tools, plain
SQL text). A connection the server dropped (a PostgreSQL restart) is replaced
and the statement tried once more. Driver errors are
translated here, once: a unique constraint is `Conflict`, anything else
`DatabaseError`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import (
    Boolean,
    Column,
    Connection,
    Engine,
    Executable,
    Float,
    Index,
    Integer,
    MetaData,
    Table,
    Text,
    create_engine,
    event,
    exc,
    text,
)

from app.tenancy.migrations import sqlalchemy_url

METADATA = MetaData()
API_KEYS = Table(
    "api_keys", METADATA,
    Column("id", Text, primary_key=True), Column("name", Text, nullable=False, unique=True),
    Column("hash", Text, nullable=False, unique=True), Column("created", Float, nullable=False),
    Column("revoked", Float), Column("rpm", Integer), Column("tpm", Integer),
    Column("joule_budget", Float),
    Column("budget_period", Text, nullable=False, server_default="month"),
    Column("models", Text))
USAGE = Table(
    "usage", METADATA,
    Column("time", Float, nullable=False), Column("key_id", Text), Column("key_name", Text),
    Column("route", Text), Column("tier", Text), Column("backend", Text),
    Column("strategy", Text), Column("category", Text), Column("status", Text),
    Column("prompt_tokens", Integer), Column("completion_tokens", Integer),
    Column("energy_net_j", Float), Column("energy_gross_j", Float), Column("source", Text),
    Column("latency_s", Float), Column("request_id", Text), Column("energy_final", Boolean),
    Column("model", Text), Column("saved_j", Float), Column("cached_tokens", Integer),
    Index("usage_key_time", "key_id", "time"))
TABLES = {t.name: t for t in (API_KEYS, USAGE)}
# Bound values in one statement: SQLite's lowest default limit (builds before
# 3.32); PostgreSQL takes 65,535.
MAX_VARIABLES = 999
T = TypeVar("T")


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


def _engine(url: str) -> Engine:
    if is_postgres(url):
        return create_engine(sqlalchemy_url(url), pool_size=2,
                             max_overflow=4, connect_args={"connect_timeout": 10})
    path = _sqlite_path(url)
    path.parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 5.0})

    @event.listens_for(engine, "connect")
    def _pragmas(dbapi_conn: Any, _: Any) -> None:
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        # WAL's own recommendation: no fsync per commit (a power loss may undo the
        # last commits, never corrupt the file; a process crash loses nothing).
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.close()

    return engine


class Database:
    """The keys-and-usage database, safe across threads (a pool of connections)."""

    def __init__(self, url: str) -> None:
        if not (is_postgres(url) or url.startswith("sqlite:///")):
            raise ValueError(f"unsupported database URL {url.split(':', 1)[0]}:// "
                             "(sqlite:///PATH or postgresql://...)")
        self.url = url
        self.postgres = is_postgres(url)
        self._engine = _engine(url)
        # One statement needs no transaction of its own: a round trip, not three.
        self._autocommit = self._engine.execution_options(isolation_level="AUTOCOMMIT")

    @classmethod
    def open(cls, url: str) -> Database:
        migrate(url)
        return cls(url)

    def execute(self, statement: Executable | str,
                params: Mapping[str, Any] | None = None) -> Result:
        """One statement, committed as it runs."""
        stmt = text(statement) if isinstance(statement, str) else statement

        def work(conn: Connection) -> Result:
            cur = conn.execute(stmt, dict(params or {}))
            if cur.returns_rows:
                rows = [tuple(r) for r in cur]
                return Result(rows, len(rows))
            return Result([], int(cur.rowcount))

        return self._run(work, self._autocommit)

    def insert(self, table: str, columns: Sequence[str], rows: Iterable[Sequence[Any]]
               ) -> None:
        """All rows in one transaction (all are written or none), as INSERTs of
        many rows each, sent as the driver's own SQL through SQLAlchemy's
        connection. Not SQLAlchemy's executemany: on SQLite that is the
        driver's executemany, a row each, and the sqlite3 module gives up and
        takes back the GIL per row, which the event loop's thread waits for
        each time (`auto` at c=50: 0.60 -> 0.75 ms of CPU per request,
        docs/performance-decisions.md); nor a multi-row `insert().values()`,
        whose statement of thousands of bound parameters is built anew each
        time (~30 ms per 200 rows)."""
        into = TABLES[table]
        unknown = set(columns) - set(into.c.keys())
        if unknown:
            raise ValueError(f"{table} has no columns {sorted(unknown)}")
        batch = [tuple(row) for row in rows]
        if not batch:
            return
        mark = "?" if self._engine.dialect.paramstyle == "qmark" else "%s"
        one = "(" + ", ".join([mark] * len(columns)) + ")"
        head = f"INSERT INTO {into.name} ({', '.join(columns)}) VALUES "
        per = max(1, MAX_VARIABLES // len(columns))

        def work(conn: Connection) -> None:
            for i in range(0, len(batch), per):
                chunk = batch[i:i + per]
                conn.exec_driver_sql(head + ", ".join([one] * len(chunk)),
                                     tuple(v for row in chunk for v in row))

        self._run(work, self._engine)

    def _run(self, work: Callable[[Connection], T], engine: Engine) -> T:
        """`work` in a transaction of `engine`'s; a connection the server dropped (a restart)
        is replaced and the work tried once more (SQLAlchemy invalidates the
        pool's connections when it sees a disconnect; no ping per statement)."""
        for attempt in (1, 2):
            try:
                with engine.begin() as conn:
                    return work(conn)
            except exc.IntegrityError as e:
                raise Conflict(str(e.orig)) from None
            except exc.DBAPIError as e:
                if attempt == 1 and e.connection_invalidated:
                    continue
                raise DatabaseError(str(e.orig)) from None
            except exc.SQLAlchemyError as e:
                raise DatabaseError(str(e)) from None
        raise AssertionError("unreachable")

    def close(self) -> None:
        self._engine.dispose()
