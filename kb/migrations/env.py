"""Alembic environment: run with the connection kb.db hands over (no alembic.ini needed)."""

from alembic import context

from kb.db import VERSION_TABLE
from kb.models import Base

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=Base.metadata, render_as_batch=True,
                  version_table=VERSION_TABLE)
with context.begin_transaction():
    context.run_migrations()
