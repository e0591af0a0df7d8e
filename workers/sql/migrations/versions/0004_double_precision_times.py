"""double precision times on MySQL/MariaDB

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-23 11:50:00.000000
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

# Unix-seconds columns. MySQL's FLOAT is single precision (24-bit mantissa):
# a time today rounds to a multiple of 128 s, so "events after T" and
# "sessions by last update" were off by minutes there. PostgreSQL's FLOAT
# and SQLite's REAL are double precision: nothing to do on those.
TIMES = (
    ("memq_sessions", "created_at"),
    ("memq_sessions", "updated_at"),
    ("memq_events", "timestamp"),
    ("memq_artifacts", "created_at"),
    ("memq_checkpoints", "created_at"),
)


def upgrade() -> None:
    if op.get_bind().dialect.name != "mysql":
        return
    for table, column in TIMES:
        op.alter_column(
            table, column, existing_type=sa.Float(), type_=mysql.DOUBLE(asdecimal=False), existing_nullable=False
        )
    # An event keeps its exact time in its JSON: restore the rounded column from it.
    op.execute(
        "UPDATE memq_events SET `timestamp` = JSON_UNQUOTE(JSON_EXTRACT(data, '$.timestamp')) + 0"
        " WHERE JSON_EXTRACT(data, '$.timestamp') IS NOT NULL"
    )


def downgrade() -> None:
    if op.get_bind().dialect.name != "mysql":
        return
    for table, column in TIMES:
        op.alter_column(
            table, column, existing_type=mysql.DOUBLE(asdecimal=False), type_=sa.Float(), existing_nullable=False
        )
