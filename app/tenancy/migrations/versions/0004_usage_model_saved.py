"""Usage rows carry the model name the client asked for and the joules the
router expected to save against always-large (its baseline, the largest
tier answering directly), for the console and the report: what was asked,
and what routing it saved, per request and summed over any window.

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("usage", sa.Column("model", sa.Text()))
    op.add_column("usage", sa.Column("saved_j", sa.Float()))


def downgrade() -> None:
    op.drop_column("usage", "saved_j")
    op.drop_column("usage", "model")
