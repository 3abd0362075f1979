"""The PostgreSQL store behind a transaction pooler (PgBouncer, `pool_mode = transaction`), which hands
each transaction to whichever server connection is free: nothing a client leaves on a server
connection (a prepared statement, a `SET`) is there for its next transaction.

These run when `COMPANYOS_TEST_PGBOUNCER_URL` names a PgBouncer in transaction mode in front of the
server of `COMPANYOS_TEST_PG_URL`, serving every database (`* = host=...`); `.ci/run` starts one.
"""

from __future__ import annotations

import os
import threading

import pytest
import sqlalchemy as sa

from companyos.batch import RunPlan
from companyos.batch import run as run_plan
from eventstore import EventStore, NewEvent
from tests.conftest import _pg_engine, _throwaway_pg_database, append_behind_a_held_lock, unique_stream

POOLER_URL = os.environ.get("COMPANYOS_TEST_PGBOUNCER_URL")

pytestmark = [pytest.mark.pg,
              pytest.mark.skipif(not POOLER_URL, reason="COMPANYOS_TEST_PGBOUNCER_URL is not set")]


@pytest.fixture
def through_pooler():
    """A throwaway database, as (its URL through the pooler, as the README says to write it behind
    one, and its direct URL)."""
    with _throwaway_pg_database() as direct:
        name = sa.make_url(direct).database
        pooled = sa.make_url(POOLER_URL).set(database=name).update_query_dict({"prepare_threshold": "none"})
        yield pooled.render_as_string(hide_password=False), direct


def test_the_store_works_behind_a_transaction_pooler_with_prepare_threshold_none(through_pooler):
    """psycopg prepares a statement on its sixth run; behind the pooler a later transaction ran on
    another server connection, and appends failed: prepared statement "_pg3_0" does not exist.
    With `?prepare_threshold=none`, as the README says, four threads append 40 times each and
    `run` logs episodes from two processes."""
    url, _ = through_pooler
    assert url.endswith("?prepare_threshold=none")
    streams = [unique_stream() for _ in range(4)]
    failed: list[BaseException] = []
    with EventStore.open(url) as store:

        def appending(stream: str) -> None:
            try:
                for version in range(40):
                    expected = version - 1 if version else None
                    store.append(stream, [NewEvent("Noted", {"n": version})], expected)
            except BaseException as exc:  # noqa: BLE001 - the test reports it
                failed.append(exc)

        threads = [threading.Thread(target=appending, args=(s,)) for s in streams]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not failed, failed
        for stream in streams:
            assert [e.data["n"] for e in store.read_stream(stream)] == list(range(40))
    results = run_plan(RunPlan(url, "expert", "all", "medium", 20, 0, "step"), workers=2)
    assert len(results) == 20
    with EventStore.open(url) as store:
        for r in results:
            assert [e.type for e in store.read_stream(r.episode_id)][-1] == "EpisodeEnded"


def test_a_lock_timeout_set_on_the_database_holds_behind_a_transaction_pooler(through_pooler):
    """The store's own `SET lock_timeout` reaches only the server connection it ran on, so behind
    the pooler an append could wait for a held lock for ever; set on the database (as the README
    says to), it holds on every server connection, and the append fails in words."""
    from api.sessions import outage_classes

    url, direct = through_pooler
    name = sa.make_url(direct).database
    admin = _pg_engine()
    with admin.connect() as conn:
        conn.exec_driver_sql(f"ALTER DATABASE {name} SET lock_timeout = '300ms'")
    admin.dispose()
    stream = unique_stream()
    with EventStore.open(url) as store:
        store.append(stream, [NewEvent("Opened", {})], None)
        failed = append_behind_a_held_lock(store, stream, direct)
        assert len(failed) == 1 and isinstance(failed[0], outage_classes()), failed
        assert "lock timeout" in str(failed[0])
        store.append(stream, [NewEvent("Noted", {})], 0)
        assert [e.type for e in store.read_stream(stream)] == ["Opened", "Noted"]
