"""Alembic's entry: runs the revisions in versions/ on the URL it is given.

On PostgreSQL the whole upgrade holds an advisory lock, so gateways starting
together migrate one after the other. A SQLite file has one gateway (whose
worker processes are started after it migrated).
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine, pool, text

LOCK_ID = 7_358_041_226  # pg_advisory_xact_lock key: "joulegate migrations"


def run() -> None:
    url = context.config.attributes["url"]
    engine = create_engine(url, poolclass=pool.NullPool)
    with engine.connect() as connection:
        context.configure(connection=connection, transactional_ddl=True)
        with context.begin_transaction():
            if connection.dialect.name == "postgresql":
                connection.execute(text(f"SELECT pg_advisory_xact_lock({LOCK_ID})"))
            context.run_migrations()
    engine.dispose()


run()
