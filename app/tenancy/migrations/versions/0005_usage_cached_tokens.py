"""Usage rows carry the prompt tokens the worker had cached: `prompt_tokens`
counts the tokens it computed (what energy follows), and with `cached_tokens`
the two add up to the prompt the client's usage shows.

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("usage", sa.Column("cached_tokens", sa.Integer()))


def downgrade() -> None:
    op.drop_column("usage", "cached_tokens")
