"""Every table comes from Alembic, and the migrations agree with the SQLAlchemy table definitions."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

from eventstore import GENESIS_DIGEST, EventStore, NewEvent, StoreUnavailable, chain_digest
from eventstore.engine import create_engine
from eventstore.migrate import HEAD_REVISION, alembic_config
from migrations.target import target_metadata
from tests.conftest import poll_count


def test_migrations_have_one_head_and_it_is_the_revision_the_store_checks_for():
    # opening a store compares its revision with HEAD_REVISION without loading Alembic: a new
    # migration that did not move HEAD_REVISION would never be applied
    assert ScriptDirectory.from_config(alembic_config()).get_heads() == [HEAD_REVISION]


def _assert_no_drift(url: str) -> None:
    store = EventStore.open(url)
    with store.engine.connect() as conn:
        context = MigrationContext.configure(conn)
        assert context.get_current_revision() == HEAD_REVISION
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
    assert {"commits", "event_ids", "alembic_version"} <= tables
    store.close()


def test_opening_a_store_at_the_newest_revision_does_not_load_alembic(sqlite_url):
    # every `companyos` command opens the store: Alembic loads only when a migration is due
    EventStore.open(sqlite_url).close()
    probe = ("import sys\nfrom eventstore import EventStore\n"
             f"EventStore.open({sqlite_url!r}).close()\n"
             "print(sorted(m for m in sys.modules if m.startswith('alembic')))")
    shown = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert shown.stdout.strip() == "[]"


def _fill_one_row_per_event_store(url: str) -> list[tuple]:
    """A database at revision 0002, when the store kept one `events` row per event."""
    engine = create_engine(url, None)
    rows = []
    for stream in ("ep-a", "ep-b"):
        digest = GENESIS_DIGEST
        for version in range(3):
            data = f'{{"n":{version},"s":"{stream}"}}'
            digest = chain_digest(digest, "Stepped", 1, data)
            rows.append([stream, version, f"{stream}-id-{version}", "Stepped", 1, data,
                         f'{{"recorded_at":"t{version}"}}', digest])
    rows.sort(key=lambda r: (r[1], r[0]))  # interleave the two streams in the global order
    rows = [(10 + 3 * i, *row) for i, row in enumerate(rows)]  # gaps, as PostgreSQL leaves them
    with engine.begin() as conn:
        config = alembic_config()
        config.attributes["connection"] = conn
        command.upgrade(config, "0002_projections")
        conn.execute(sa.text(
            "INSERT INTO events (position, stream_id, version, event_id, type, schema_version, "
            "data, meta, digest) VALUES (:p, :s, :v, :i, :t, :sv, :d, :m, :g)"),
            [dict(zip(("p", "s", "v", "i", "t", "sv", "d", "m", "g"), row, strict=True))
             for row in rows])
    engine.dispose()
    return rows


def _upgrade_keeps_every_event(url: str) -> None:
    rows = _fill_one_row_per_event_store(url)
    store = EventStore.open(url)
    try:
        assert [tuple(r) for r in store.read_all()] == rows
        assert [r.position for r in store.read_all(after_position=rows[2][0])] == \
            [r[0] for r in rows[3:]]
        assert store.stream_digest("ep-a") == [r for r in rows if r[1] == "ep-a"][-1][8]
        # an old event id is still idempotent, and the chain continues from the migrated head
        again = store.append("ep-a", [NewEvent("Stepped", {"n": 2, "s": "ep-a"},
                                               event_id="ep-a-id-2")], 1)
        assert again[0].position == [r for r in rows if r[3] == "ep-a-id-2"][0][0]
        new = store.append("ep-a", [NewEvent("Stepped", {"n": 3})], 2)
        assert new[0].position > rows[-1][0] and new[0].version == 3
        old_head = [r for r in rows if r[1] == "ep-a"][-1][8]
        assert new[0].digest == chain_digest(old_head, "Stepped", 1, '{"n":3}')
    finally:
        store.close()


def test_upgrading_a_one_row_per_event_sqlite_store_keeps_every_event(sqlite_url):
    _upgrade_keeps_every_event(sqlite_url)


def test_upgrading_a_one_row_per_event_postgres_store_keeps_every_event(fresh_pg_url):
    _upgrade_keeps_every_event(fresh_pg_url)


def test_an_event_an_older_writer_commits_during_the_upgrade_is_kept_not_dropped(fresh_pg_url):
    """An older companyos writing while a newer one upgraded the store: the migration copied the
    events, the writer committed one more, and the migration then dropped the table with it.
    Here the writer's transaction is open as the upgrade begins and commits once the upgrade
    waits for it."""
    rows = _fill_one_row_per_event_store(fresh_pg_url)
    engine = create_engine(fresh_pg_url, None)
    writer = engine.connect()
    writer.execute(sa.text(
        "INSERT INTO events (position, stream_id, version, event_id, type, schema_version, data, "
        "meta, digest) VALUES (1000, 'ep-c', 0, 'ep-c-id-0', 'Stepped', 1, :d, '{}', :g)"),
        {"d": '{"n":0}', "g": chain_digest(GENESIS_DIGEST, "Stepped", 1, '{"n":0}')})
    upgraded: list = []
    upgrade = threading.Thread(target=lambda: upgraded.append(EventStore.open(fresh_pg_url)))
    upgrade.start()
    try:
        with engine.connect() as probe:  # until the upgrade waits for the writer's lock
            assert poll_count(probe, "SELECT count(*) FROM pg_stat_activity WHERE datname = "
                              "current_database() AND wait_event_type = 'Lock'", tries=600), \
                "the upgrade never waited for the older writer"
        writer.commit()
    finally:
        writer.close()
        upgrade.join(timeout=60)
        engine.dispose()
    store = upgraded[0]
    try:
        assert [r.stream_id for r in store.read_all()] == [r[1] for r in rows] + ["ep-c"]
    finally:
        store.close()


def test_an_older_store_opened_read_only_says_it_needs_an_upgrade(tmp_path):
    """`sqlite:///file:x.db?mode=ro&uri=true` reads a store without writing: one at an older
    revision failed with "attempt to write a readonly database", which did not say why."""
    path = tmp_path / "old.db"
    EventStore.open(f"sqlite:///{path}").close()
    engine = create_engine(f"sqlite:///{path}", None)
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE alembic_version SET version_num = '0003_commits'"))
    engine.dispose()
    read_only = f"sqlite:///file:{path}?mode=ro&uri=true"
    for url in (read_only, f"sqlite:///file:{path}?immutable=1&uri=true"):  # read-only media too
        with pytest.raises(StoreUnavailable, match=f"older than this companyos's '{HEAD_REVISION}'.*"
                                                   "`companyos db upgrade`"):
            EventStore.open(url)
    EventStore.open(f"sqlite:///{path}").close()  # upgraded with a URL that may write, it reads
    EventStore.open(read_only).close()
    from eventstore.engine import sqlite_uri_mode

    assert sqlite_uri_mode(read_only) == "ro" and sqlite_uri_mode(f"sqlite:///{path}?mode=ro") == "ro"
    assert sqlite_uri_mode("sqlite:////data/mode=rollout/x.db") is None  # a path is no mode


def test_an_older_store_the_database_will_not_let_migrate_says_so(fresh_pg_url):
    """A read-only database (or a role that may not create tables) holding an older store: the
    user ran `episodes` and read "cannot execute CREATE TABLE in a read-only transaction", with
    no word of a migration or where the store stands."""
    from tests.conftest import _pg_engine

    _fill_one_row_per_event_store(fresh_pg_url)
    admin = _pg_engine()
    database = sa.make_url(fresh_pg_url).database
    with admin.connect() as conn:
        conn.exec_driver_sql(f"ALTER DATABASE {database} SET default_transaction_read_only = on")
    try:
        with pytest.raises(StoreUnavailable, match="is at migration '0002_projections', older than "
                           f"this companyos's '{HEAD_REVISION}', and upgrading it failed: .*read-only "
                           "transaction; run `companyos db upgrade` once"):
            EventStore.open(fresh_pg_url)
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f"ALTER DATABASE {database} RESET default_transaction_read_only")
        admin.dispose()
    EventStore.open(fresh_pg_url).close()  # and upgraded where it may write


def test_a_store_from_a_newer_companyos_is_refused_in_words_and_left_alone(sqlite_url):
    EventStore.open(sqlite_url).close()
    engine = create_engine(sqlite_url, None)
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE alembic_version SET version_num = '9999_future'"))
    try:
        with pytest.raises(StoreUnavailable, match="migration '9999_future', which this companyos "
                                                   "does not know"):
            EventStore.open(sqlite_url)
        with engine.connect() as conn:
            assert conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalar() \
                == "9999_future"
    finally:
        engine.dispose()


@pytest.mark.parametrize("create", [True, False], ids=["run", "episodes"])
@pytest.mark.parametrize("foreign", [
    ("CREATE TABLE alembic_version (version_num VARCHAR(32) PRIMARY KEY)",
     "INSERT INTO alembic_version VALUES ('a1b2c3d4e5f6')"),
    ("CREATE TABLE commits (id INTEGER PRIMARY KEY, message TEXT)",),
], ids=["another-alembic-user", "a-commits-table"])
def test_another_applications_tables_are_said_to_be_not_a_store_and_left_alone(empty_store_url, foreign,
                                                                               create):
    """Another Alembic user's revision was blamed on an older companyos ("upgrade companyos"); an
    unrelated commits table was "no store: `companyos db upgrade` creates one", which then failed
    half-way on it."""
    store_url = empty_store_url
    engine = create_engine(store_url, None)
    try:
        with engine.begin() as conn:
            for statement in foreign:
                conn.execute(sa.text(statement))
        refused = "is not a store: .*(another application's|not the store's)"
        with pytest.raises(StoreUnavailable, match=refused):
            EventStore.open(store_url, create=create)
        with engine.connect() as conn:
            assert set(sa.inspect(conn).get_table_names()) <= {"alembic_version", "commits"}
    finally:
        engine.dispose()


def test_every_table_a_migration_makes_is_one_the_store_knows_by_name(sqlite_url):
    from eventstore.migrate import STORE_TABLES

    with EventStore.open(sqlite_url) as store, store.engine.connect() as conn:
        tables = set(sa.inspect(conn).get_table_names()) - {"alembic_version"}
    assert tables and tables <= STORE_TABLES


def test_a_sqlite_store_of_text_payloads_upgrades_and_reads_beside_compressed_ones(sqlite_url, tmp_path):
    """Revision 0003 kept SQLite payloads as JSON text; from 0004 they are written lz4-compressed.
    An old store upgrades without rewriting a row, and the store, its chain and the warehouse
    sync read both forms side by side."""
    import lz4.block

    from analytics.sync import sync
    from analytics.warehouse import Warehouse

    store = EventStore.open(sqlite_url)
    store.append("old", [NewEvent("A", {"n": 1}), NewEvent("B", {"n": 2, "pad": "y" * 3000})], None)
    store.close()
    engine = create_engine(sqlite_url, None)
    with engine.begin() as conn:  # as revision 0003 wrote it
        blob = conn.execute(sa.text("SELECT payload FROM commits")).scalar_one()
        conn.execute(sa.text("UPDATE commits SET payload = :text"),
                     {"text": lz4.block.decompress(blob).decode()})
        conn.execute(sa.text("UPDATE alembic_version SET version_num = '0003_commits'"))
    store = EventStore.open(sqlite_url)
    try:
        before = list(store.read_all())
        store.append("old", [NewEvent("C", {"n": 3})], 1)
        store.append("new", [NewEvent("A", {"n": 1, "pad": "x" * 3000})], None)
        records = list(store.read_all())
        assert records[:2] == before and [r.type for r in records] == ["A", "B", "C", "A"]
        assert store.stream_digest("old") == chain_digest(before[-1].digest, "C", 1, '{"n":3}')
        assert records[-1].data == {"n": 1, "pad": "x" * 3000}
    finally:
        store.close()
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT typeof(payload) FROM commits ORDER BY position")
                            ).scalars().all() == ["text", "text", "blob"]  # compressed above 2 KB
        assert conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalar() \
            == HEAD_REVISION
    engine.dispose()
    assert sync(sqlite_url, tmp_path / "wh.duckdb").events == 4
    with Warehouse(tmp_path / "wh.duckdb", read_only=True) as wh:
        assert wh.con.execute("SELECT stream_id, type, data FROM events ORDER BY position").fetchall() \
            == [(r.stream_id, r.type, r.data_json) for r in records]
