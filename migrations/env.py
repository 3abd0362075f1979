"""Alembic environment: run programmatically by the store (connection passed in) or by the alembic CLI."""

from __future__ import annotations

import os

from alembic import context

from eventstore.engine import create_engine
from eventstore.store import DEFAULT_URL
from migrations.target import target_metadata

config = context.config


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:  # the store runs us on its own connection
        _run(connection)
        return
    url = config.get_main_option("sqlalchemy.url") or os.environ.get("COMPANYOS_DB", DEFAULT_URL)
    with create_engine(url).begin() as conn:  # the alembic CLI: the store's engine rules apply
        _run(conn)


def _run(connection) -> None:
    context.configure(connection=connection, target_metadata=target_metadata,
                      render_as_batch=connection.dialect.name == "sqlite")
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    context.configure(url=config.get_main_option("sqlalchemy.url"), target_metadata=target_metadata,
                      literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()
else:
    run_migrations_online()
