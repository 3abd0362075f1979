"""Bring a database to the newest Alembic revision; safe when several processes open it at once."""

from __future__ import annotations

from functools import cache
from importlib.resources import files

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

# Any constant works; it only has to be the same in every process that migrates this database.
_PG_MIGRATION_LOCK = 7_411_502_311


def alembic_config() -> Config:
    config = Config()
    config.set_main_option("script_location", str(files("migrations")))
    return config


@cache
def head_revision() -> str:
    heads = ScriptDirectory.from_config(alembic_config()).get_heads()
    if len(heads) != 1:
        raise RuntimeError(f"migrations must have exactly one head, found {heads}")
    return heads[0]


def current_revision(connection: sa.Connection) -> str | None:
    return MigrationContext.configure(connection).get_current_revision()


class NewerStore(Exception):
    """The store was migrated by a newer companyos: this code must not read or write it."""


@cache
def known_revisions() -> frozenset[str]:
    return frozenset(s.revision for s in ScriptDirectory.from_config(alembic_config()).walk_revisions())


class NoStore(Exception):
    """The database holds no store, and the caller only reads one: creating it would be wrong."""


def upgrade(engine: sa.Engine, create: bool = True) -> None:
    """Run pending migrations inside one write transaction so concurrent openers queue, not clash.

    `create=False`: a database without the store's tables is NoStore, not a new empty store."""
    with engine.connect() as probe:
        current = current_revision(probe)
        if current == head_revision():
            return
        if current is None and not create:
            raise NoStore
        if current is not None and current not in known_revisions():
            raise NewerStore(f"migration {current!r}, which this companyos does not know (its "
                             f"newest is {head_revision()!r}): upgrade companyos to use it")
    with engine.connect().execution_options(companyos_write=True) as conn, conn.begin():
        if conn.dialect.name == "postgresql":
            conn.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": _PG_MIGRATION_LOCK})
        config = alembic_config()
        config.attributes["connection"] = conn
        command.upgrade(config, "head")
