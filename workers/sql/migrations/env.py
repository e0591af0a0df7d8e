"""Alembic environment. memq runs migrations itself (``memq.workers.sql.engine.migrate``),
handing over an open connection; the ``alembic`` CLI is not needed."""

from alembic import context

from memq.workers.sql.models import metadata

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=metadata, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
