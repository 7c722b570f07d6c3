"""An index on the usage ledger's time, for GET /v1/usage over all keys.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("CREATE INDEX IF NOT EXISTS usage_time ON usage (time)")


def downgrade() -> None:
    op.execute("DROP INDEX IF EXISTS usage_time")
