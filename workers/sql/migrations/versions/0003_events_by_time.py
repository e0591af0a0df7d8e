"""events by time

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23 11:40:00.000000
"""

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # session.get / history with ``after``: the last hours of a long session
    # are an index range on (session_key, timestamp), not a walk of the session.
    with op.batch_alter_table("memq_events", schema=None) as batch_op:
        batch_op.create_index("ix_memq_events_session_time", ["session_key", "timestamp"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("memq_events", schema=None) as batch_op:
        batch_op.drop_index("ix_memq_events_session_time")
