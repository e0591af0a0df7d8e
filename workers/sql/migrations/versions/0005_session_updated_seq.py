"""sessions: updated_seq

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-27 12:00:00.000000
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A session's updated_at is the timestamp of its newest event in stream
    # order (ADK's last_update_time), written only over an older updated_seq,
    # so replicas committing out of order agree; it was the largest timestamp.
    with op.batch_alter_table("memq_sessions", schema=None) as batch_op:
        batch_op.add_column(sa.Column("updated_seq", sa.BigInteger(), nullable=False, server_default="0"))
    # Existing rows keep their updated_at until a newer message than any they hold.
    op.execute("UPDATE memq_sessions SET updated_seq = last_seq")


def downgrade() -> None:
    with op.batch_alter_table("memq_sessions", schema=None) as batch_op:
        batch_op.drop_column("updated_seq")
