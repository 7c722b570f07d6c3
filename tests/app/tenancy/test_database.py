"""The database adapter on SQLite and PostgreSQL: conflicts, atomic batches,
and a PostgreSQL server that drops its connections."""

from __future__ import annotations

import psycopg
import pytest

from app.tenancy.database import Conflict, Database, DatabaseError
from app.tenancy.keys import KeyStore
from app.tenancy.spend import COLUMNS

ROW = (1.0, "k", "n", "auto", "small", "b", "direct", "chat", "ok", 10, 5, 1.0, 2.0, "nvml", 0.1,
       "r", True, "auto", 0.5, 3)


def test_a_batch_is_written_whole_or_not_at_all(database: str) -> None:
    db = Database.open(database)
    db.insert("usage", COLUMNS, [ROW] * 1200)  # more rows than one statement binds on SQLite
    assert db.execute("SELECT COUNT(*) FROM usage").rows == [(1200,)]
    with pytest.raises(DatabaseError):
        db.insert("usage", COLUMNS, [ROW] * 10 + [(None, *ROW[1:])])  # time is NOT NULL
    assert db.execute("SELECT COUNT(*) FROM usage").rows == [(1200,)]
    db.close()


def test_a_taken_name_is_a_conflict(database: str) -> None:
    store = KeyStore(database)
    store.create("team-a")
    with pytest.raises(ValueError, match="exists"):
        store.create("team-a")
    db = Database(database)
    with pytest.raises(Conflict):
        db.execute("INSERT INTO api_keys (id, name, hash, created) "
                   "SELECT 'x', name, 'h', 0 FROM api_keys")
    db.close()
    store.close()


def test_dropped_postgresql_connections_are_replaced(database: str) -> None:
    if not database.startswith("postgresql"):
        pytest.skip("PostgreSQL only")
    db = Database.open(database)
    db.insert("usage", COLUMNS, [ROW])
    with psycopg.connect(database, autocommit=True) as admin:  # a server restart, for us
        admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                      "WHERE datname = current_database() AND pid <> pg_backend_pid()")
    assert db.execute("SELECT COUNT(*) FROM usage").rows == [(1,)]
    db.insert("usage", COLUMNS, [ROW])
    assert db.execute("SELECT COUNT(*) FROM usage").rows == [(2,)]
    db.close()
