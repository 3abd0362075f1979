"""Bring a database to the newest Alembic revision; safe when several processes open it at once.

Opening a store that is already at the newest revision is the common case, and it checks the
revision with one query: Alembic (an eighth of a second to import) loads only when a migration
is due, so every `companyos` command starts that much sooner.
"""

from __future__ import annotations

from functools import cache
from importlib.resources import files
from typing import TYPE_CHECKING

import sqlalchemy as sa

from eventstore.engine import sqlite_read_only

if TYPE_CHECKING:
    from alembic.config import Config

# The newest revision in migrations/versions; a test holds it equal to Alembic's one head, so a
# new migration that forgets to move it fails the suite instead of going unapplied.
HEAD_REVISION = "0007_checkpoint_generation"

# Any constant works; it only has to be the same in every process that migrates this database.
_PG_MIGRATION_LOCK = 7_411_502_311


def alembic_config() -> Config:
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(files("migrations")))
    return config


def current_revision(connection: sa.Connection) -> str | None:
    """The revision the database is at (None: no store yet), read without loading Alembic."""
    if not sa.inspect(connection).has_table("alembic_version"):
        return None
    versions = connection.execute(sa.text("SELECT version_num FROM alembic_version")).scalars().all()
    if len(versions) > 1:
        raise NewerStore(f"several migration heads {sorted(versions)}, which this companyos "
                         f"never writes (its newest is {HEAD_REVISION!r})")
    return versions[0] if versions else None


class NewerStore(Exception):
    """The store was migrated by a newer companyos: this code must not read or write it."""


@cache
def known_revisions() -> frozenset[str]:
    from alembic.script import ScriptDirectory

    return frozenset(s.revision for s in ScriptDirectory.from_config(alembic_config()).walk_revisions())


class OutdatedStore(Exception):
    """The store needs a migration that the URL (read-only) does not allow."""


class MigrationFailed(Exception):
    """The database refused a migration of an older store (a read-only database, a role that
    may not create tables, a lock held too long): `error` says why, `revision` where it stands."""

    def __init__(self, revision: str, error: sa.exc.DBAPIError) -> None:
        super().__init__(revision)
        self.revision, self.error = revision, error


class NoStore(Exception):
    """The database holds no store, and the caller only reads one: creating it would be wrong. Its
    argument: the tables it holds (another application's), so the refusal can say so."""


class ForeignTables(Exception):
    """The database holds tables of the store's names that another application made: migrating
    would fail on them half-way, or take another application's revision for a newer companyos."""


STORE_TABLES = frozenset({"commits", "event_ids", "events", "projection_checkpoints", "episodes",
                          "episode_views"})
"""Every table a migration creates (0001's `events` included, which 0003 replaces)."""


def named(tables: list[str]) -> str:
    """Sorted table names for a message: the first five, then how many more."""
    return ", ".join(tables[:5]) + (f" and {len(tables) - 5} more" if len(tables) > 5 else "")


def foreign(tables: set[str], current: str | None, create: bool) -> str | None:
    """Why a database holding `tables` (and the revision `current` in its alembic_version, None for
    none) is not a store, or None: store tables without the store's revision table, a revision
    table (another Alembic user's) with none of the store's tables, or, where a store would be
    created (`create`), another application's tables only: a mistyped `--db` naming another
    application's SQLite file (or a PostgreSQL schema in use) got the store's tables beside its own.
    A pure function of the names, so SQLite's file can be judged before anything connects to it."""
    if current is None:
        clash = sorted(tables & STORE_TABLES)
        if clash:
            return (f"it holds tables named {', '.join(clash)} but no alembic_version, so they are "
                    "not the store's")
        others = sorted(tables - {"alembic_version"})
        if not others or not create:
            return None
        return (f"it holds another application's tables ({named(others)}) and none of the "
                "store's, so creating the store there would mix the two")
    if "commits" not in tables and current not in known_revisions():  # a store's skips loading Alembic
        return (f"its alembic_version (revision {current!r}) is another application's: it holds no "
                "commits table")
    return None


def check_tables(tables: set[str], current: str | None, create: bool) -> None:
    """ForeignTables when a database holding `tables` (at revision `current`) is not a store (see
    `foreign`); NoStore when it holds none and `create` is False. Names only, so the migration and
    a look at a SQLite file before anything connects to it judge alike."""
    reason = foreign(tables, current, create)
    if reason is not None:
        raise ForeignTables(reason)
    if current is None and not create:
        raise NoStore(sorted(tables))


def upgrade(engine: sa.Engine, create: bool = True) -> None:
    """Run pending migrations inside one write transaction so concurrent openers queue, not clash.

    `create=False`: a database without the store's tables is NoStore, not a new empty store."""
    with engine.connect() as probe:
        current = current_revision(probe)
        if current == HEAD_REVISION:
            return
        check_tables(set(sa.inspect(probe).get_table_names()), current, create)
        if current is not None and current not in known_revisions():
            raise NewerStore(f"migration {current!r}, which this companyos does not know (its "
                             f"newest is {HEAD_REVISION!r}): upgrade companyos to use it")
    from alembic import command

    if current is not None and sqlite_read_only(engine.url):  # the README's way to read a
        # store without writing to it
        raise OutdatedStore(f"its tables are at revision {current!r}, older than this companyos's "
                            f"{HEAD_REVISION!r}, and a read-only URL cannot migrate them: run "
                            "`companyos db upgrade` on it once, with a URL that may write")
    try:
        with engine.connect().execution_options(companyos_write=True) as conn, conn.begin():
            if conn.dialect.name == "postgresql":
                conn.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": _PG_MIGRATION_LOCK})
            config = alembic_config()
            config.attributes["connection"] = conn
            command.upgrade(config, "head")
    except sa.exc.DBAPIError as exc:
        if current is None:  # creating a store: the database's words say it all
            raise
        raise MigrationFailed(current, exc) from exc
