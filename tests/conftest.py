"""Fixtures shared by every test folder: the keys-and-usage database, run on
SQLite and on a real PostgreSQL (the same tests on both)."""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from app.tenancy.spend import period_end

# A PostgreSQL role allowed to create databases; .ci/run starts Debian's server
# and sets it. Each test gets a database of its own, dropped after.
POSTGRES = "JOULEGATE_TEST_POSTGRES_URL"


@pytest.fixture(params=["sqlite", "postgresql"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'joulegate.db'}"
        return
    admin = os.environ.get(POSTGRES)
    if not admin:
        if os.environ.get("JOULEGATE_REQUIRE_POSTGRES") == "1":
            pytest.fail(f"{POSTGRES} is not set (.ci/run starts PostgreSQL)")
        pytest.skip(f"no PostgreSQL: set {POSTGRES} (a role with CREATEDB)")
    name = f"jg_test_{secrets.token_hex(6)}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield admin.rsplit("/", 1)[0] + "/" + name
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


@pytest.fixture
def redis_url(tmp_path: Path) -> Iterator[str]:
    """A real Redis, empty: .ci/run's, or a redis-server started for the test."""
    from tests.redis_server import shared_redis_url

    url, server = shared_redis_url(tmp_path)
    try:
        yield url
    finally:
        if server is not None:
            server.stop()


@pytest.fixture
def one_utc_day() -> None:
    """For a test whose joule arithmetic must fall in one budget day: a test
    started within a minute of UTC midnight waits for the new day (spent
    joules rightly start again at zero there, and the test would count them
    across two days)."""
    left_s = period_end("day", time.time()) - time.time()
    if left_s < 60:
        time.sleep(left_s + 0.5)
