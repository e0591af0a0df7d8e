"""facts: generations, facts, their revisions, sources and cursors

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-03 12:40:00.000000
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


# Frozen copies of the column types of this revision (see workers/sql/models.py).
def ID(length=256):
    return sa.String(length).with_variant(
        mysql.VARCHAR(length, charset="utf8mb4", collation="utf8mb4_bin"), "mysql", "mariadb"
    )


def DIGEST():
    return sa.String(64).with_variant(mysql.CHAR(64, charset="ascii", collation="ascii_bin"), "mysql", "mariadb")


def LONGTEXT():
    return sa.Text().with_variant(mysql.LONGTEXT(), "mysql", "mariadb")


def SECONDS():
    return sa.Float().with_variant(mysql.DOUBLE(asdecimal=False), "mysql", "mariadb")


def upgrade() -> None:
    op.create_table(
        "memq_fact_generations",
        sa.Column("name", ID(64), nullable=False),
        sa.Column("fingerprint", sa.Text(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("created_at", SECONDS(), nullable=False),
        sa.PrimaryKeyConstraint("name"),
    )
    op.create_table(
        "memq_facts",
        sa.Column("generation", ID(64), nullable=False),
        sa.Column("fact_id", sa.String(32), nullable=False),
        sa.Column("user_key", DIGEST(), nullable=False),
        sa.Column("app", ID(), nullable=False),
        sa.Column("user_id", ID(), nullable=False),
        sa.Column("revision", sa.Integer(), nullable=False),
        sa.Column("statement", LONGTEXT(), nullable=False),
        sa.Column("valid_from", SECONDS(), nullable=False),
        sa.Column("invalid_from", SECONDS(), nullable=True),
        sa.Column("data", LONGTEXT(), nullable=False),
        sa.PrimaryKeyConstraint("generation", "fact_id"),
    )
    op.create_index("ix_memq_facts_user", "memq_facts", ["generation", "user_key"])
    op.create_table(
        "memq_fact_revisions",
        sa.Column("generation", ID(64), nullable=False),
        sa.Column("fact_id", sa.String(32), nullable=False),
        sa.Column("revision", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("data", LONGTEXT(), nullable=False),
        sa.Column("written_at", SECONDS(), nullable=False),
        sa.PrimaryKeyConstraint("generation", "fact_id", "revision"),
    )
    op.create_table(
        "memq_fact_sources",
        sa.Column("generation", ID(64), nullable=False),
        sa.Column("fact_id", sa.String(32), nullable=False),
        sa.Column("session_key", DIGEST(), nullable=False),
        sa.Column("event_id", ID(), nullable=False),
        sa.PrimaryKeyConstraint("generation", "fact_id", "session_key", "event_id"),
    )
    op.create_index("ix_memq_fact_sources_event", "memq_fact_sources", ["session_key", "event_id"])
    op.create_table(
        "memq_fact_cursors",
        sa.Column("generation", ID(64), nullable=False),
        sa.Column("session_key", DIGEST(), nullable=False),
        sa.Column("user_key", DIGEST(), nullable=False),
        sa.Column("up_to_seq", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("generation", "session_key"),
    )
    op.create_index("ix_memq_fact_cursors_user", "memq_fact_cursors", ["generation", "user_key"])


def downgrade() -> None:
    for table in ("memq_fact_cursors", "memq_fact_sources", "memq_fact_revisions", "memq_facts"):
        op.drop_table(table)
    op.drop_table("memq_fact_generations")
