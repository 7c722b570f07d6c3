"""Usage rows carry their request id (the energy id a response names) and
whether their energy figure is final: rows recovered from the usage journal
after a kill -9 may carry the response's provisional figure, and the id
keeps a recovered row from being written twice. No index on it: one cost
7 us per row written (SQLite, 200-row batches); the recovery's look-up is
bounded by time instead (usage_time).

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("usage", sa.Column("request_id", sa.Text()))
    op.add_column("usage", sa.Column("energy_final", sa.Boolean()))


def downgrade() -> None:
    op.drop_column("usage", "energy_final")
    op.drop_column("usage", "request_id")
