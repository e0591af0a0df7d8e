"""token counts, checkpoints, session pages

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22 12:32:20.340364
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql


# Frozen copies of the column types of this revision (see workers/sql/models.py).
def ID():
    return sa.String(256).with_variant(
        mysql.VARCHAR(256, charset="utf8mb4", collation="utf8mb4_bin"), "mysql", "mariadb"
    )


def DIGEST():
    return sa.String(64).with_variant(mysql.CHAR(64, charset="ascii", collation="ascii_bin"), "mysql", "mariadb")


def LONGTEXT():
    return sa.Text().with_variant(mysql.LONGTEXT(), "mysql", "mariadb")


revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "memq_checkpoints",
        sa.Column("session_key", DIGEST(), nullable=False),
        sa.Column("checkpoint_id", ID(), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("up_to_seq", sa.BigInteger(), nullable=False),
        sa.Column("summary", LONGTEXT(), nullable=False),
        sa.Column("tokens", sa.Integer(), nullable=False),
        sa.Column("author", ID(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("session_key", "checkpoint_id"),
    )
    with op.batch_alter_table("memq_checkpoints", schema=None) as batch_op:
        batch_op.create_index("ix_memq_checkpoints_latest", ["session_key", "up_to_seq", "seq"], unique=False)

    with op.batch_alter_table("memq_events", schema=None) as batch_op:
        # Events stored before this revision were not counted: they read as 0.
        batch_op.add_column(sa.Column("tokens", sa.Integer(), nullable=False, server_default="0"))

    with op.batch_alter_table("memq_sessions", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_memq_sessions_user"))
        batch_op.create_index("ix_memq_sessions_app_updated", ["app", "updated_at", "key"], unique=False)
        batch_op.create_index("ix_memq_sessions_user_updated", ["user_key", "updated_at", "key"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("memq_sessions", schema=None) as batch_op:
        batch_op.drop_index("ix_memq_sessions_user_updated")
        batch_op.drop_index("ix_memq_sessions_app_updated")
        batch_op.create_index(batch_op.f("ix_memq_sessions_user"), ["user_key", "last_seq"], unique=False)

    with op.batch_alter_table("memq_events", schema=None) as batch_op:
        batch_op.drop_column("tokens")

    with op.batch_alter_table("memq_checkpoints", schema=None) as batch_op:
        batch_op.drop_index("ix_memq_checkpoints_latest")

    op.drop_table("memq_checkpoints")
