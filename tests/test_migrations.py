"""Every table comes from Alembic, and the migrations agree with the SQLAlchemy table definitions."""

from __future__ import annotations

import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

from eventstore import EventStore
from eventstore.migrate import alembic_config, head_revision
from migrations.target import target_metadata


def test_migrations_have_one_head():
    assert len(ScriptDirectory.from_config(alembic_config()).get_heads()) == 1


def _assert_no_drift(url: str) -> None:
    store = EventStore.open(url)
    with store.engine.connect() as conn:
        context = MigrationContext.configure(conn)
        assert context.get_current_revision() == head_revision()
        diff = compare_metadata(context, target_metadata)
    store.close()
    assert diff == [], f"tables and migrations drifted apart: {diff}"


def test_opening_an_empty_sqlite_database_migrates_it_without_drift(sqlite_url):
    _assert_no_drift(sqlite_url)


def test_opening_an_empty_postgres_database_migrates_it_without_drift(fresh_pg_url):
    _assert_no_drift(fresh_pg_url)


def test_reopening_is_a_no_op(sqlite_url):
    EventStore.open(sqlite_url).close()
    store = EventStore.open(sqlite_url)
    with store.engine.connect() as conn:
        tables = set(sa.inspect(conn).get_table_names())
    assert {"events", "alembic_version"} <= tables
    store.close()
