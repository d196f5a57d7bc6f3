"""Alembic environment: runs migrations against the URL handed in by longrun.db.migrate."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine, pool

from longrun.db.schema import metadata

config = context.config
engine = create_engine(config.get_main_option("sqlalchemy.url"), poolclass=pool.NullPool)
with engine.connect() as connection:
    context.configure(connection=connection, target_metadata=metadata, compare_type=True,
                      transaction_per_migration=True)
    with context.begin_transaction():
        context.run_migrations()
engine.dispose()
