"""sessions: forgot_seq

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-27 18:30:00.000000
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # The sequence of the newest forget of one of the session's events: a
    # query replica's cached window of the session is stale once it moves.
    with op.batch_alter_table("memq_sessions", schema=None) as batch_op:
        batch_op.add_column(sa.Column("forgot_seq", sa.BigInteger(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("memq_sessions", schema=None) as batch_op:
        batch_op.drop_column("forgot_seq")
