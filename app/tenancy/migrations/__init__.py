"""Schema migrations of the keys-and-usage database, run with Alembic.

`upgrade(url)` brings a database to the newest revision; gateways call it when
they open the database. A new revision is a file in versions/ (write it by
hand, or `alembic -c app/tenancy/migrations/alembic.ini revision -m "..."`); keep each
one valid on SQLite and PostgreSQL.
"""

from __future__ import annotations

from pathlib import Path


def sqlalchemy_url(url: str) -> str:
    """Our URL in SQLAlchemy's spelling (psycopg 3 for PostgreSQL)."""
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix):]
    return url


def upgrade(url: str, revision: str = "head") -> None:
    import logging

    # Before alembic is imported: its plugins log a line each as they load.
    logging.getLogger("alembic").setLevel(logging.WARNING)
    from alembic import command
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(Path(__file__).parent))
    config.attributes["url"] = sqlalchemy_url(url)
    command.upgrade(config, revision)
