"""API keys and the usage ledger.

Revision ID: 0001
Revises:
`IF NOT EXISTS`: SQLite files written before migrations moved to Alembic
already hold these tables.
"""

from __future__ import annotations

from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""CREATE TABLE IF NOT EXISTS api_keys (
        id TEXT PRIMARY KEY, name TEXT NOT NULL UNIQUE, hash TEXT NOT NULL UNIQUE,
        created DOUBLE PRECISION NOT NULL, revoked DOUBLE PRECISION, rpm INTEGER,
        tpm INTEGER, joule_budget DOUBLE PRECISION,
        budget_period TEXT NOT NULL DEFAULT 'month', models TEXT)""")
    op.execute("""CREATE TABLE IF NOT EXISTS usage (
        time DOUBLE PRECISION NOT NULL, key_id TEXT, key_name TEXT, route TEXT, tier TEXT,
        backend TEXT, strategy TEXT, category TEXT, status TEXT, prompt_tokens INTEGER,
        completion_tokens INTEGER, energy_net_j DOUBLE PRECISION,
        energy_gross_j DOUBLE PRECISION, source TEXT, latency_s DOUBLE PRECISION)""")
    op.execute("CREATE INDEX IF NOT EXISTS usage_key_time ON usage (key_id, time)")


def downgrade() -> None:
    op.execute("DROP INDEX IF EXISTS usage_key_time")
    op.execute("DROP TABLE IF EXISTS usage")
    op.execute("DROP TABLE IF EXISTS api_keys")
