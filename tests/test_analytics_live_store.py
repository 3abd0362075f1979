"""Syncing a store that writers keep appending to: a sync ends at the head it saw when it began."""

from __future__ import annotations

import pytest

from analytics.sync import sync
from analytics.warehouse import Warehouse
from eventstore import EventStore
from tests.test_analytics import fill, tally


@pytest.mark.parametrize("prefer", [None, "store"])
def test_a_sync_stops_at_the_head_it_began_with_while_writers_append(empty_store_url, tmp_path, prefer):
    """A run writing all along kept a sync (and every analytics command behind it) chasing the
    log in small batches until the run ended; now it ends at its start's head, and the next one
    takes the rest."""
    fill(empty_store_url, 0, 60)
    with EventStore.open(empty_store_url) as store:
        head = store.last_position()
    written = []

    def writer_appends(_checkpoint: int) -> None:
        if len(written) < 4:  # a few rounds (the old reader chased them; an endless writer forever)
            written.append(len(written))
            fill(empty_store_url, 1_000 + 20 * len(written), 20, seed=len(written))

    path = tmp_path / "w.duckdb"
    first = sync(empty_store_url, path, batch_events=211, after_batch=writer_appends, prefer=prefer)
    assert written and first.checkpoint == head
    second = sync(empty_store_url, path, prefer=prefer)
    assert second.checkpoint > head and second.events > 0
    expected = tally(empty_store_url)
    with Warehouse(path) as wh:
        assert wh.counts()["episodes"] == len(expected["episodes"])
        assert wh.counts()["steps"] == expected["actions"]


def _interrupt_then_cleanup_fails() -> BaseException:
    """Ctrl-C inside DuckDB, then unregistering a table of the aborted transaction fails in turn:
    the interrupt is only the second error's context (a 90-line traceback, exit 1)."""
    import duckdb

    try:
        raise RuntimeError("Query interrupted")
    except RuntimeError:
        raise duckdb.TransactionException("Current transaction is aborted (please ROLLBACK)")  # noqa: B904


@pytest.mark.parametrize("interrupt", [KeyboardInterrupt, lambda: RuntimeError("Query interrupted"),
                                       _interrupt_then_cleanup_fails],
                         ids=["keyboard", "duckdb", "masked"])
def test_ctrl_c_during_a_sync_is_one_line_and_the_next_sync_resumes(sqlite_url, tmp_path, monkeypatch,
                                                                     capsys, interrupt):
    """Ctrl-C reaches a sync as KeyboardInterrupt, or as the RuntimeError DuckDB raises when the
    signal lands while it scans Arrow; both printed a traceback (one with a second error from
    rolling back a transaction the interrupted COMMIT had ended).

    Each run raises a fresh exception: one made at collection lives as long as the session, and
    its traceback kept the sync's closed DuckDB objects alive until DuckDB's bindings reported
    them as leaked at exit."""
    import analytics.transfer as syncing
    from companyos import cli

    fill(sqlite_url, 0, 40)
    path = tmp_path / "w.duckdb"
    derive, calls = syncing.derive_batch, []

    def derive_then_interrupted(con, lo, fresh):
        calls.append(lo)
        if len(calls) == 1:
            raise interrupt()
        return derive(con, lo, fresh)

    monkeypatch.setattr(syncing, "derive_batch", derive_then_interrupted)
    monkeypatch.setattr("sys.argv", ["companyos", "analytics", "sync", "--db", sqlite_url,
                                     "--warehouse", str(path)])
    with pytest.raises(SystemExit) as stopped:
        cli.main()
    assert stopped.value.code == 130
    assert capsys.readouterr().err.strip() == "error: interrupted"
    monkeypatch.undo()
    with Warehouse(path) as wh:
        assert wh.checkpoint == 0 and wh.counts()["events"] == 0  # nothing of the batch is kept
    assert sync(sqlite_url, path).events > 0
    with Warehouse(path) as wh:
        assert wh.counts()["episodes"] == len(tally(sqlite_url)["episodes"])


def test_a_sync_in_a_writers_process_leaves_its_store_shared(tmp_path):
    """A server syncs its warehouse in the process that writes the store. Reading the store
    through a second SQLite library (the ADBC driver's) dropped that process's locks on the
    file when it closed, so the next process to close the store deleted the live WAL: the
    writer's later episodes were seen by no other process, and the store ended damaged."""
    import subprocess
    import sys

    from companyos.batch import RunPlan, run_range

    path = tmp_path / "store.db"
    url = f"sqlite:///{path}"
    plan = RunPlan(url, "expert", "all", "medium", 6, 0, "episode")
    count = [sys.executable, "-c", "import sys; from eventstore import EventStore; "
             "s = EventStore.open(sys.argv[1]); print(s.count_events()); s.close()", url]
    with EventStore.open(url) as store:
        run_range(plan, 0, 3, store)
        sync(url, tmp_path / "w.duckdb")
        subprocess.run(count, check=True, capture_output=True)  # another process opens and closes
        run_range(plan, 3, 6, store)
        assert (tmp_path / "store.db-wal").exists()
        seen = subprocess.run(count, check=True, capture_output=True, text=True).stdout
        assert int(seen) == store.count_events()
    verified = subprocess.run([sys.executable, "-m", "companyos", "verify", "--db", url],
                              capture_output=True, text=True)
    assert verified.returncode == 0, verified.stdout + verified.stderr
