"""initial schema

Revision ID: 0001
Revises:
Create Date: 2026-11-22 11:54:29.668140
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


def BLOB():
    return sa.LargeBinary().with_variant(mysql.LONGBLOB(), "mysql", "mariadb")


revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "memq_app_state",
        sa.Column("app", ID(), nullable=False),
        sa.Column("key", ID(), nullable=False),
        sa.Column("value", LONGTEXT(), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("app", "key"),
    )
    op.create_table(
        "memq_artifacts",
        sa.Column("session_key", DIGEST(), nullable=False),
        sa.Column("artifact_id", ID(), nullable=False),
        sa.Column("filename", ID(), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("mime_type", sa.String(length=255), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("sha256", DIGEST(), nullable=False),
        sa.Column("inline", BLOB(), nullable=True),
        sa.Column("object_bucket", sa.String(length=64), nullable=True),
        sa.Column("object_name", sa.Text(), nullable=True),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("session_key", "artifact_id"),
    )
    with op.batch_alter_table("memq_artifacts", schema=None) as batch_op:
        batch_op.create_index("ix_memq_artifacts_file", ["session_key", "filename", "seq"], unique=False)

    op.create_table(
        "memq_events",
        sa.Column("session_key", DIGEST(), nullable=False),
        sa.Column("event_id", ID(), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("invocation_id", ID(), nullable=False),
        sa.Column("author", ID(), nullable=False),
        sa.Column("branch", sa.Text(), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=True),
        sa.Column("timestamp", sa.Float(), nullable=False),
        sa.Column("data", LONGTEXT(), nullable=False),
        sa.PrimaryKeyConstraint("session_key", "event_id"),
    )
    with op.batch_alter_table("memq_events", schema=None) as batch_op:
        batch_op.create_index("ix_memq_events_session_seq", ["session_key", "seq"], unique=True)

    op.create_table(
        "memq_session_state",
        sa.Column("session_key", DIGEST(), nullable=False),
        sa.Column("key", ID(), nullable=False),
        sa.Column("value", LONGTEXT(), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("session_key", "key"),
    )
    op.create_table(
        "memq_sessions",
        sa.Column("key", DIGEST(), nullable=False),
        sa.Column("user_key", DIGEST(), nullable=False),
        sa.Column("app", ID(), nullable=False),
        sa.Column("user_id", ID(), nullable=False),
        sa.Column("session_id", ID(), nullable=False),
        sa.Column("last_seq", sa.BigInteger(), nullable=False),
        sa.Column("deleted_seq", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("key"),
    )
    with op.batch_alter_table("memq_sessions", schema=None) as batch_op:
        batch_op.create_index("ix_memq_sessions_user", ["user_key", "last_seq"], unique=False)

    op.create_table(
        "memq_user_state",
        sa.Column("user_key", DIGEST(), nullable=False),
        sa.Column("key", ID(), nullable=False),
        sa.Column("value", LONGTEXT(), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("user_key", "key"),
    )
    op.create_table(
        "memq_users",
        sa.Column("key", DIGEST(), nullable=False),
        sa.Column("app", ID(), nullable=False),
        sa.Column("user_id", ID(), nullable=False),
        sa.Column("deleted_seq", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("key"),
    )


def downgrade() -> None:
    op.drop_table("memq_users")
    op.drop_table("memq_user_state")
    with op.batch_alter_table("memq_sessions", schema=None) as batch_op:
        batch_op.drop_index("ix_memq_sessions_user")

    op.drop_table("memq_sessions")
    op.drop_table("memq_session_state")
    with op.batch_alter_table("memq_events", schema=None) as batch_op:
        batch_op.drop_index("ix_memq_events_session_seq")

    op.drop_table("memq_events")
    with op.batch_alter_table("memq_artifacts", schema=None) as batch_op:
        batch_op.drop_index("ix_memq_artifacts_file")

    op.drop_table("memq_artifacts")
    op.drop_table("memq_app_state")
