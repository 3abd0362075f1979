"""The DuckDB warehouse: counts against an independent tally, incremental and interrupted syncs."""

from __future__ import annotations

import collections
import itertools
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading

import duckdb
import orjson
import pytest

from analytics import report, service, synthetic
from analytics.intervals import wilson_interval
from analytics.named import QueryError, UnknownQuery
from analytics.sync import sync
from analytics.warehouse import DERIVE_VERSION, Warehouse, WarehouseError, store_label
from eventstore import GENESIS_DIGEST, CorruptCommit, EventStore, NewEvent, chain_digest
from eventstore.migrate import HEAD_REVISION
from eventstore.packing import SEPARATOR, payload_columns, payload_text
from tests.conftest import start_slow_sync

TABLES = {
    "events": "SELECT position, stream_id, version, type, schema_version, data, meta FROM events "
              "ORDER BY position",
    "episodes": "SELECT * EXCLUDE (lead_in, chaos_mechanisms), lead_in::VARCHAR, chaos_mechanisms::VARCHAR "
                "FROM episodes ORDER BY episode_id",
    "steps": "SELECT * EXCLUDE (chaos_now, chaos_active), chaos_now::VARCHAR, chaos_active::VARCHAR "
             "FROM steps ORDER BY position",
    "rewards": "SELECT * FROM rewards ORDER BY episode_id, rule",
}


def fill(url: str, start: int, count: int, open_every: int = 0, seed: int = 0) -> dict[str, list]:
    """Append synthetic episodes; every `open_every`-th is written half now, half later.

    Returns the unwritten halves (stream id -> (version, events)) to finish with `finish`.
    """
    pending: dict[str, list] = {}
    store = EventStore.open(url)
    try:
        for ep in synthetic.episodes(count, seed=seed, start=start):
            events = ep.events
            if open_every and ep.seed % open_every == 0:
                cut = len(events) // 2
                store.append(ep.episode_id, events[:cut], None)
                pending[ep.episode_id] = [cut - 1, events[cut:]]
            else:
                # a few appends per episode, like per-step durability
                head = None
                for i in range(0, len(events), 7):
                    head = store.append(ep.episode_id, events[i:i + 7], head)[-1].version
    finally:
        store.close()
    return pending


def finish(url: str, pending: dict[str, list]) -> None:
    store = EventStore.open(url)
    try:
        for stream, (version, events) in pending.items():
            store.append(stream, events, version)
    finally:
        store.close()


def tally(url: str) -> dict:
    """What the warehouse must say, counted straight from the store in Python."""
    store = EventStore.open(url)
    episodes: dict[str, dict] = {}
    actions = rejected = 0
    rule_totals: collections.Counter = collections.Counter()
    try:
        for r in store.read_all():
            if r.type == "EpisodeStarted":
                d = r.data
                episodes[r.stream_id] = {"task": d["task"], "chaos": d["chaos"], "agent": r.meta.get("agent"),
                                         "outcome": None, "failure_mode": None, "steps": 0,
                                         "first_mistake": None, "events": 0, "chaos_events": 0}
            ep = episodes.get(r.stream_id)
            if ep is None:
                continue
            ep["events"] += 1
            d = r.data
            if r.type == "ActionTaken":
                ep["steps"] += 1
                actions += 1
            elif r.type == "ActionRejected":
                rejected += 1
            elif r.type == "RewardGranted":
                rule_totals[d["rule"]] += d["value"]
            elif r.type == "MistakeRecorded" and ep["first_mistake"] is None:
                ep["first_mistake"] = d["step"]
            elif r.type == "EpisodeEnded":
                ep["outcome"], ep["failure_mode"], ep["steps"] = d["outcome"], d["failure_mode"], d["steps"]
            if d.get("cause") == "chaos":
                ep["chaos_events"] += 1
    finally:
        store.close()
    return {"episodes": episodes, "actions": actions, "rejected": rejected, "rules": rule_totals}


def sync_threads() -> list[str]:
    """The sync's reader and deriver threads still alive."""
    return [t.name for t in threading.enumerate() if t.name.startswith("analytics-sync")]


def dump(path) -> dict[str, list]:
    con = duckdb.connect(str(path), read_only=True)
    try:
        return {name: con.execute(sql).fetchall() for name, sql in TABLES.items()}
    finally:
        con.close()


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    """One filled store per module; each test works on its own copy."""
    path = tmp_path_factory.mktemp("template") / "store.db"
    url = f"sqlite:///{path}"
    pending = fill(url, 0, 1500, open_every=7)
    # episode i + 1940 runs episode i's instance (task, seed, chaos) by another agent: the pairs
    # head_to_head compares
    fill(url, 1940, 200)
    con = sqlite3.connect(path)
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    con.close()
    return path, pending


@pytest.fixture
def filled(template, tmp_path):
    path, pending = template
    copy = tmp_path / "store.db"
    shutil.copyfile(path, copy)
    return f"sqlite:///{copy}", {k: list(v) for k, v in pending.items()}


def test_counts_agree_with_an_independent_tally(filled, tmp_path):
    url, pending = filled
    finish(url, pending)
    wh_path = tmp_path / "w.duckdb"
    result = sync(url, wh_path, batch_events=6_007)  # odd size: episodes straddle batches
    assert result.batches > 3
    expected = tally(url)
    with Warehouse(wh_path) as wh:
        con = wh.con
        assert con.execute("SELECT count(*) FROM events").fetchone()[0] == result.events
        rows = {r[0]: r[1:] for r in con.execute(
            "SELECT episode_id, task, chaos, agent, outcome, failure_mode, steps, first_mistake_step, "
            "event_count, chaos_events FROM episodes").fetchall()}
        assert set(rows) == set(expected["episodes"])
        for eid, e in expected["episodes"].items():
            assert rows[eid] == (e["task"], e["chaos"], e["agent"], e["outcome"], e["failure_mode"],
                                 e["steps"], e["first_mistake"], e["events"], e["chaos_events"]), eid
        steps, not_accepted = con.execute(
            "SELECT count(*), count(*) FILTER (WHERE NOT accepted) FROM steps").fetchone()
        assert steps == expected["actions"]
        assert not_accepted == expected["rejected"]  # synthetic steps reject at most once
        rules = dict(con.execute("SELECT rule, sum(total) FROM rewards GROUP BY rule").fetchall())
        assert rules.keys() == expected["rules"].keys()
        for rule, total in expected["rules"].items():
            assert rules[rule] == pytest.approx(total, abs=1e-6)
        outcomes = collections.Counter(e["outcome"] for e in expected["episodes"].values())
        by_query = {r["failure_mode"]: r["episodes"] for r in service.run_named(wh, "failure_modes", {})}
        assert sum(by_query.values()) == outcomes["failure"] + outcomes["truncated"]


def test_failure_mode_shares_sum_to_one(filled, tmp_path):
    url, pending = filled
    finish(url, pending)
    with Warehouse(tmp_path / "w.duckdb") as wh:
        sync(url, wh)
        for params in ({}, {"agent": "random"}, {"task": "expense_report", "chaos": "medium"}):
            rows = service.run_named(wh, "failure_modes", params)
            assert rows
            assert sum(r["share"] for r in rows) == pytest.approx(1.0, abs=1e-4)
            assert all(len(r["example_episode_ids"]) <= 3 for r in rows)
        # every finished non-success has exactly one failure mode
        assert wh.con.execute("SELECT count(*) FROM episodes WHERE outcome IN ('failure', 'truncated') "
                              "AND failure_mode IS NULL").fetchone()[0] == 0


FILTERS = {"agent": "random", "task": "expense_report", "chaos": "medium"}
REQUIRED = {"head_to_head": {"agent": "random"}}
"""What the queries that need a parameter are given where a test runs them all."""


def test_each_filter_answers_as_the_query_over_those_episodes_alone(filled, tmp_path):
    """A filter (agent, task, chaos) answers exactly what its query answers over a warehouse that
    holds only the episodes it selects. Every query takes all three, but compare_agents, which
    compares agents, takes no agent (four queries had no chaos filter), and head_to_head's agent
    is the one it compares with the others, not a filter."""
    from analytics import named
    from domain.chaos import parse_chaos

    url, pending = filled
    finish(url, pending)
    whole = tmp_path / "whole.duckdb"
    sync(url, whole)
    queries = named.registry()
    for column, value in FILTERS.items():
        alone = tmp_path / f"{column}.duckdb"
        shutil.copyfile(whole, alone)
        stored = parse_chaos(value) if column == "chaos" else value  # a level is kept as its number
        with Warehouse(alone) as wh:
            others = f"SELECT episode_id FROM episodes WHERE {column} IS DISTINCT FROM ?"
            for table in ("steps", "rewards", "episodes"):
                wh.con.execute(f"DELETE FROM {table} WHERE episode_id IN ({others})", [stored])
        takers = sorted(n for n, q in queries.items() if column in {p.name for p in q.params}
                        and not (column == "agent" and n == "head_to_head"))
        comparing = {"compare_agents", "head_to_head"}
        assert takers == sorted(set(queries) - (comparing if column == "agent" else set()))
        with Warehouse(whole) as every, Warehouse(alone) as selected:
            for name in takers:
                compared = REQUIRED.get(name, {})
                answer = service.run_named(every, name, {**compared, column: value})
                assert answer, (name, column)
                assert answer == service.run_named(selected, name, compared), (name, column)
                assert answer != service.run_named(every, name, compared), (name, column)


def test_incremental_sync_equals_fresh_full_sync(filled, tmp_path):
    url, pending = filled
    live = tmp_path / "live.duckdb"
    first = sync(url, live, batch_events=5_003)
    assert first.events > 0
    # more runs: new episodes, and the open ones finish (an episode spanning two syncs)
    finish(url, pending)
    more = fill(url, 1500, 300, open_every=5)
    sync(url, live, batch_events=5_003)
    finish(url, more)
    again = sync(url, live, batch_events=5_003)
    assert again.events == sum(len(v[1]) for v in more.values())
    assert sync(url, live).events == 0  # idempotent: nothing new, nothing moves
    fresh = tmp_path / "fresh.duckdb"
    sync(url, fresh, batch_events=1_000_000)
    assert dump(live) == dump(fresh)


def test_a_sync_that_finds_nothing_new_stops_before_loading_a_reader(filled, tmp_path):
    """Every analytics command syncs first and usually finds nothing new: that sync checks the
    store and stops, and the command does not pay to import Arrow and NumPy for it."""
    url, _ = filled
    path = tmp_path / "w.duckdb"
    synced = sync(url, path)
    probe = textwrap.dedent(f"""
        import sys
        from analytics.sync import sync
        result = sync({url!r}, {str(path)!r})
        loaded = [m for m in ("pyarrow", "numpy", "analytics.sources") if m in sys.modules]
        print(result.events, result.checkpoint, result.source, loaded)
    """)
    shown = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert shown.stdout.split(maxsplit=3) == ["0", str(synced.checkpoint), synced.source, "[]\n"]


def test_sync_progress_names_what_lies_ahead_before_the_first_batch(filled, tmp_path):
    """What the progress bar and the UI's sync page show: the backlog at once, then each batch."""
    url, _ = filled
    seen: list[tuple[int, int | None]] = []
    result = sync(url, tmp_path / "w.duckdb", batch_events=5_003, progress=lambda *p: seen.append(p))
    assert seen[0] == (0, result.events) and seen[-1] == (result.events, result.events)
    assert len(seen) == result.batches + 1 and [d for d, _ in seen] == sorted(d for d, _ in seen)


def test_sync_interrupted_after_a_batch_loses_and_doubles_nothing(filled, tmp_path):
    url, pending = filled
    finish(url, pending)
    path = tmp_path / "w.duckdb"
    seen = []

    def boom(checkpoint: int) -> None:
        seen.append(checkpoint)
        if len(seen) == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        sync(url, path, batch_events=4_001, after_batch=boom)
    assert sync_threads() == []  # the reader and the deriver stopped with it (a server goes on)
    with Warehouse(path) as wh:
        assert wh.checkpoint == seen[1]
        assert wh.counts()["events"] == seen[1]  # SQLite positions are dense
    sync(url, path, batch_events=4_001)
    fresh = tmp_path / "fresh.duckdb"
    sync(url, fresh)
    assert dump(path) == dump(fresh)


_KILLER = textwrap.dedent("""
    import os, signal, sys
    import analytics.derive as derive
    from analytics.sync import sync
    url, path, where = sys.argv[1], sys.argv[2], sys.argv[3]
    calls = []
    if where == "inside":
        real = derive.derive_batch
        def dying(con, lo, fresh):
            calls.append(lo)
            if len(calls) == 3:
                real(con, lo, fresh)  # rows written, transaction still open
                os.kill(os.getpid(), signal.SIGKILL)
            return real(con, lo, fresh)
        import analytics.transfer as s
        s.derive_batch = dying
        sync(url, path, batch_events=3_001)
    else:
        def after(checkpoint):
            calls.append(checkpoint)
            if len(calls) == 3:
                os.kill(os.getpid(), signal.SIGKILL)
        sync(url, path, batch_events=3_001, after_batch=after)
""")


@pytest.mark.parametrize("where", ["between", "inside"])
def test_sync_killed_by_sigkill_resumes_exactly(filled, tmp_path, where):
    url, pending = filled
    finish(url, pending)
    path = tmp_path / "w.duckdb"
    proc = subprocess.run([sys.executable, "-c", _KILLER, url, str(path), where], capture_output=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]
    with Warehouse(path) as wh:
        checkpoint = wh.checkpoint
        events = wh.counts()["events"]
    assert events == checkpoint  # rows and checkpoint committed together, or neither
    assert checkpoint > 0
    sync(url, path)
    fresh = tmp_path / "fresh.duckdb"
    sync(url, fresh)
    assert dump(path) == dump(fresh)


def test_bad_query_names_and_parameters_give_clear_errors(filled, tmp_path):
    url, _ = filled
    with Warehouse(tmp_path / "w.duckdb") as wh:
        sync(url, wh)
        with pytest.raises(UnknownQuery, match="no named query 'nope'; known queries: .*failure_modes"):
            service.run_named(wh, "nope", {})
        with pytest.raises(QueryError, match="has no parameter 'colour'"):
            service.run_named(wh, "failure_modes", {"colour": "red"})
        with pytest.raises(QueryError, match="'examples' must be an integer, got 'many'"):
            service.run_named(wh, "failure_modes", {"examples": "many"})
        with pytest.raises(QueryError, match="unknown chaos level 'wild'"):
            service.run_named(wh, "first_mistake_step", {"chaos": "wild"})
        with pytest.raises(QueryError, match="must be an integer"):
            service.run_named(wh, "pass_at_k", {"k": "1; DROP TABLE episodes"})
        with pytest.raises(QueryError, match="must be an integer"):  # digits of another script
            service.run_named(wh, "pass_at_k", {"k": "\u0663"})
        # a value outside the declared range is refused, not clamped into it
        with pytest.raises(QueryError, match="'k' must be between 1 and 64, got '0'"):
            service.run_named(wh, "pass_at_k", {"k": "0"})
        with pytest.raises(QueryError, match="'examples' must be between 0 and 100, got 101"):
            service.run_named(wh, "failure_modes", {"examples": 101})
        with pytest.raises(QueryError, match="'min_calls' must be between 0 and 2147483647"):
            service.run_named(wh, "tool_error_rates", {"min_calls": "-1"})
        # digits, as every route's numbers: `+5` was 5 here, refused by /episodes and the UI
        with pytest.raises(QueryError, match="'k' must be an integer, got '\\+5'"):
            service.run_named(wh, "pass_at_k", {"k": "+5"})
        # a long number is out of range, not 'not an integer'; the message stays short
        with pytest.raises(QueryError, match=r"'k' must be between 1 and 64, got '9{56}\.\.\.$"):
            service.run_named(wh, "pass_at_k", {"k": "9" * 5000})
        with pytest.raises(QueryError, match=r"'k' must be between 1 and 64, got '-9{55}\.\.\.$"):
            service.run_named(wh, "pass_at_k", {"k": "-" + "9" * 5000})
        # leading zeros are no size: 21 characters of them and a 2 is k=2 (it read as out of range)
        assert {r["k"] for r in service.run_named(wh, "pass_at_k", {"k": "0" * 20 + "2"})} == {1, 2}
        # an end the header leaves open is DuckDB's 32-bit bound, published as such
        with pytest.raises(QueryError, match="'min_calls' must be between 0 and 2147483647"):
            service.run_named(wh, "tool_error_rates", {"min_calls": "99999999999999"})
        assert service.run_named(wh, "tool_error_rates", {"min_calls": 2**31 - 1}) == []
        [min_calls] = [p for q in service.describe() if q["name"] == "tool_error_rates"
                       for p in q["params"] if p["name"] == "min_calls"]
        assert (min_calls["min"], min_calls["max"]) == (0, 2**31 - 1)
        assert [len(r["example_episode_ids"]) for r in service.run_named(wh, "failure_modes", {"examples": 0})
                ] == [0] * len(service.run_named(wh, "failure_modes", {}))
        # a value that looks like SQL is only ever a bound value
        assert service.run_named(wh, "failure_modes", {"agent": "x' OR '1'='1"}) == []  # bound, not spliced
        with pytest.raises(QueryError, match="parameter 'task' must be a task family .*expense_report"):
            service.run_named(wh, "failure_modes", {"task": "expens_report"})  # not an empty answer
        assert wh.counts()["episodes"] > 0


def test_parameter_ranges_are_declared_in_the_header_and_published():
    from analytics.named import parse

    query = parse("q", "-- Counts.\n-- param n INTEGER[2..9] = 3: how many\n"
                       "-- param m INTEGER[..0] = 0: at most 0\nSELECT $n + $m")
    assert query.bind({"n": "9", "m": "-5"}) == {"n": 9, "m": -5}
    with pytest.raises(QueryError, match="'n' must be between 2 and 9, got '1'"):
        query.bind({"n": "1"})
    with pytest.raises(QueryError, match="'m' must be between -2147483647 and 0, got 1"):
        query.bind({"m": 1})  # the open end is DuckDB's 32-bit bound
    assert (query.params[1].lo, query.params[1].hi) == (-(2**31 - 1), 0)
    with pytest.raises(ValueError, match="bad parameter line"):
        parse("q", "-- param s VARCHAR[1..2] = 'a': text has no range\nSELECT $s")
    with pytest.raises(QueryError, match="between 2 and 9"):  # a default outside its own range
        parse("q", "-- param n INTEGER[2..9] = 10: how many\nSELECT $n")
    catalogue = {q["name"]: {p["name"]: p for p in q["params"]} for q in service.describe()}
    assert (catalogue["pass_at_k"]["k"]["min"], catalogue["pass_at_k"]["k"]["max"]) == (1, 64)
    assert catalogue["failure_modes"]["agent"]["min"] is None


def test_every_named_query_runs_and_returns_row_objects(filled, tmp_path):
    url, pending = filled
    finish(url, pending)
    with Warehouse(tmp_path / "w.duckdb") as wh:
        sync(url, wh)
        for entry in service.describe():
            rows = service.run_named(wh, entry["name"], REQUIRED.get(entry["name"], {}))
            assert isinstance(rows, list) and rows, entry["name"]
            assert all(isinstance(r, dict) for r in rows)
        success = service.run_named(wh, "success_by_task_and_chaos", {})
        assert {"task", "chaos", "episodes", "successes", "success_rate"} <= set(success[0])
        finished = wh.con.execute("SELECT count(*) FROM episodes WHERE outcome IS NOT NULL").fetchone()[0]
        assert sum(r["episodes"] for r in success) == finished
        passk = service.run_named(wh, "pass_at_k", {"k": 2})
        for r in passk:  # NULL exactly when no instance of the agent and task had 2 trials
            assert (r["pass_hat_k"] is None) == (r["instances"] == 0)
            assert r["pass_hat_k"] is None or 0.0 <= r["pass_hat_k"] <= 1.0
        by_task = collections.defaultdict(dict)
        for r in passk:
            by_task[(r["agent"], r["task"])][r["k"]] = r["pass_hat_k"]
        assert all(v[1] >= v[2] - 1e-9 for v in by_task.values() if v[1] is not None)  # pass^k falls with k


def test_warehouse_refuses_another_store(filled, tmp_path):
    url, _ = filled
    path = tmp_path / "w.duckdb"
    sync(url, path)
    other = f"sqlite:///{tmp_path / 'other.db'}"
    fill(other, 5000, 5, seed=9)
    with pytest.raises(WarehouseError, match="built from another store") as refused:
        sync(other, path)
    assert f"({url})" in str(refused.value)  # the store's URL as given
    assert store_label("postgresql://cos:s3cret@db/cos") == "postgresql://cos:***@db/cos"  # not +psycopg


def test_every_reader_gives_the_same_warehouse(empty_store_url, tmp_path):
    pending = fill(empty_store_url, 0, 150, open_every=4)
    live = tmp_path / "live.duckdb"
    sync(empty_store_url, live, batch_events=997)
    finish(empty_store_url, pending)
    sync(empty_store_url, live, batch_events=997)
    expected = tally(empty_store_url)
    with Warehouse(live) as wh:
        assert wh.counts()["episodes"] == len(expected["episodes"])
        assert wh.counts()["steps"] == expected["actions"]
    slow = tmp_path / "slow.duckdb"
    sync(empty_store_url, slow, prefer="store")  # EventStore.read_all: the reference reader
    assert dump(live) == dump(slow)


def test_bulk_filled_store_reads_back_as_appended_events(tmp_path):
    """fill_sqlite writes commit rows directly: the store must read them as its own appends."""
    url = f"sqlite:///{tmp_path / 'bulk.db'}"
    written = synthetic.fill_sqlite(url, 40, seed=3, batch=16)
    store = EventStore.open(url)
    try:
        assert [r.position for r in store.read_all()] == list(range(1, written + 1))
        for ep in synthetic.episodes(40, seed=3):
            stream = list(store.read_stream(ep.episode_id))
            assert [(r.type, r.data, r.schema_version) for r in stream] == [
                (e.type, e.data, e.schema_version) for e in ep.events]
            digest = GENESIS_DIGEST
            for r in stream:
                digest = chain_digest(digest, r.type, r.schema_version, r.data_json)
                assert r.digest == digest
            assert store.stream_digest(ep.episode_id) == digest
            assert stream[0].meta["agent"] == ep.agent
            assert "agent" not in stream[1].meta and "recorded_at" in stream[1].meta
    finally:
        store.close()


def test_the_commit_reader_agrees_with_the_reference_reader(tmp_path):
    """Pages smaller than one commit (such a page is then that one whole commit) and larger ones."""
    url = f"sqlite:///{tmp_path / 'bulk.db'}"
    synthetic.fill_sqlite(url, 30, seed=5)
    pending = fill(url, 100, 20, open_every=3)
    reference = tmp_path / "reference.duckdb"
    sync(url, reference, prefer="store")
    tiny = tmp_path / "tiny.duckdb"
    assert sync(url, tiny, batch_events=20).batches >= 24  # commits of 12 to 53
    finish(url, pending)
    sync(url, reference, prefer="store")
    sync(url, tiny, batch_events=20)
    whole = tmp_path / "whole.duckdb"
    sync(url, whole, batch_events=1_000_000)
    assert dump(tiny) == dump(reference)
    assert dump(whole) == dump(reference)


def _set_payload(path: str, where: str, payload: str | None = None) -> tuple[int, str, str]:
    """Overwrite the payload of the commit at position `where` (SQL) with broken JSON, or with
    `payload` to repair it; returns (position, stream id, the payload it held)."""
    con = sqlite3.connect(path)
    try:
        position, stream, old = con.execute(
            f"SELECT position, stream_id, payload FROM commits WHERE position = ({where})").fetchone()
        con.execute("UPDATE commits SET payload = ? WHERE position = ?",
                    ('{"garbage": ' if payload is None else payload, position))
        con.commit()
    finally:
        con.close()
    return position, stream, old


def test_a_damaged_commit_is_named_and_nothing_of_its_batch_is_committed(tmp_path):
    """DuckDB only says some payload of the batch is malformed; the sync names the commit as
    `companyos verify` does, and after a repair it catches up to what a fresh sync builds."""
    path = str(tmp_path / "store.db")
    url = f"sqlite:///{path}"
    fill(url, 0, 60)
    position, stream, payload = _set_payload(
        path, "SELECT min(position) FROM commits WHERE position >= (SELECT max(position) / 2 FROM commits)")
    live = tmp_path / "live.duckdb"
    with pytest.raises(CorruptCommit, match=f"stream '{stream}': the commit at position {position} "):
        sync(url, live, batch_events=501)
    with Warehouse(live) as wh:
        assert 0 < wh.checkpoint < position  # the batches before it are in, its own is not
        assert wh.counts()["events"] == wh.checkpoint  # SQLite positions are dense
    _set_payload(path, str(position), payload)
    sync(url, live, batch_events=501)
    fresh = tmp_path / "fresh.duckdb"
    sync(url, fresh)
    assert dump(live) == dump(fresh)
    # the store's first commit is read on its own first, to know which store this is
    position, stream, _ = _set_payload(path, "SELECT min(position) FROM commits")
    with pytest.raises(CorruptCommit, match=f"stream '{stream}': the commit at position {position} "):
        sync(url, tmp_path / "other.duckdb")


def _damage_a_commit(tmp_path, which: str, damage) -> tuple[str, int, str]:
    """A store of whole episodes (one append each, as `companyos run` writes them) whose commit at
    `which` (ORDER BY ... LIMIT 1 ...) has its lz4 blob replaced by `damage(blob)`; returns
    (url, position, stream id)."""
    path = str(tmp_path / "store.db")
    url = f"sqlite:///{path}"
    with EventStore.open(url) as store:
        for ep in synthetic.episodes(10, seed=0):
            store.append(ep.episode_id, ep.events, None)
    con = sqlite3.connect(path)
    try:
        position, stream, blob = con.execute(
            f"SELECT position, stream_id, payload FROM commits ORDER BY {which}").fetchone()
        assert isinstance(blob, bytes)
        con.execute("UPDATE commits SET payload = ? WHERE position = ?", (damage(blob), position))
        con.commit()
    finally:
        con.close()
    return url, position, stream


def test_a_commit_whose_compression_is_damaged_is_named_by_the_sync_and_the_store(tmp_path):
    """SQLite keeps payloads lz4-compressed: a cut blob is a damaged commit, named with its
    position by the warehouse sync and by the store's own readers, not a crash."""
    url, position, stream = _damage_a_commit(tmp_path, "position DESC LIMIT 1",
                                             lambda blob: blob[:len(blob) // 2])
    named = f"stream '{stream}': the commit at position {position} does not unpack: LZ4BlockError"
    with pytest.raises(CorruptCommit, match=named):
        sync(url, tmp_path / "wh.duckdb")
    with EventStore.open(url) as store, pytest.raises(CorruptCommit, match=named):
        list(store.read_stream(stream))


@pytest.mark.parametrize("claim", [1, 10**6])
def test_a_commit_whose_compressed_size_lies_is_named_by_the_sync(tmp_path, claim):
    """An lz4 block starts with its payload's size, and lz4 allocates that much before it
    decompresses: a header claiming more than the block holds is damage, named, never a payload
    written past its end nor a gigabyte allocated on its word."""
    def lie(blob: bytes) -> bytes:
        size = min(int.from_bytes(blob[:4], "little") * claim + 1, 2**31 - 1)
        return size.to_bytes(4, "little") + blob[4:]

    url, position, stream = _damage_a_commit(tmp_path, "position LIMIT 1 OFFSET 3", lie)
    with pytest.raises(CorruptCommit, match=f"stream '{stream}': the commit at position {position} "
                                            "does not unpack: LZ4BlockError"):
        sync(url, tmp_path / "wh.duckdb")


def test_a_page_kept_by_its_reader_keeps_its_payloads_when_the_next_is_read(tmp_path):
    """Pages are decompressed into a buffer the reader reuses: a page still held elsewhere must not
    see its bytes overwritten by the next page's."""
    from analytics.sources import SqliteSource

    path = str(tmp_path / "store.db")
    url = f"sqlite:///{path}"
    with EventStore.open(url) as store:
        for ep in synthetic.episodes(12, seed=0):
            store.append(ep.episode_id, ep.events, None)  # one compressed commit each
    con = sqlite3.connect(path)
    stored = dict(con.execute("SELECT position, payload FROM commits").fetchall())
    con.close()
    assert all(isinstance(p, bytes) for p in stored.values())

    def payloads(page):
        return dict(zip(page["position"].to_pylist(), page["payload"].to_pylist(), strict=True))

    limit = max(stored) // 4  # events a page: a few commits each
    source = SqliteSource(path)
    try:
        first = source.page(0, limit, 10**9)
        second = source.page(first["position"][-1].as_py(), limit, 10**9)
        assert first.num_rows and second.num_rows
        for page in (first, second):
            assert all(payload_text(stored[k]).decode() == v for k, v in payloads(page).items())
        del first
        third = source.page(second["position"][-1].as_py(), limit, 10**9)  # may reuse the first's
        assert third.num_rows
        for page in (second, third):
            assert all(payload_text(stored[k]).decode() == v for k, v in payloads(page).items())
    finally:
        source.close()


def test_a_page_past_what_32_bit_offsets_reach_is_read_in_chunks(tmp_path, monkeypatch):
    """A page whose payloads pass 2 GiB cannot be one Arrow string array: it becomes a chunked one
    (here the limit is lowered to a few commits' worth), and the warehouse is the same."""
    from analytics import sources

    path = str(tmp_path / "store.db")
    url = f"sqlite:///{path}"
    fill(url, 0, 30)
    whole = tmp_path / "whole.duckdb"
    sync(url, whole)
    monkeypatch.setattr(sources, "_CHUNK_LIMIT", 3000)
    source = sources.SqliteSource(path)
    try:
        page = source.page(0, 10**6, 10**9)
        assert page["payload"].num_chunks > 3
        assert all(payload_columns(p)["type"] for p in page["payload"].to_pylist())
    finally:
        source.close()
    chunked = tmp_path / "chunked.duckdb"
    sync(url, chunked)
    assert dump(chunked) == dump(whole)


def test_a_commit_whose_json_is_not_utf8_is_named_by_the_sync_and_the_store(tmp_path):
    """The sync builds each batch's payloads on one buffer: a payload that decompresses to bytes
    that are not UTF-8 is still named, not handed to DuckDB or taken for another commit's."""
    import lz4.block

    def not_utf8(blob: bytes) -> bytes:
        text = lz4.block.decompress(blob)
        cut = text.index(SEPARATOR.encode()) + 1  # the first event's type begins there
        return lz4.block.compress(text[:cut] + b"\xff\xfe" + text[cut:])

    url, position, stream = _damage_a_commit(tmp_path, "position LIMIT 1 OFFSET 4", not_utf8)
    with pytest.raises(CorruptCommit, match=f"stream '{stream}': the commit at position {position} .*UTF-8"):
        sync(url, tmp_path / "wh.duckdb")
    with EventStore.open(url) as store, pytest.raises(CorruptCommit, match=f"position {position} "):
        list(store.read_stream(stream))


def payload_in(stored: str | bytes, as_json: bool) -> str:
    """A stored payload's text in the JSON format (as revisions 0003-0004 wrote it) or the
    separated one (eventstore.packing.pack), whichever format it is stored in."""
    from eventstore.packing import pack

    text = payload_text(stored)
    text = text.decode() if isinstance(text, bytes) else text
    if text.startswith("{") == as_json:
        return text
    c = payload_columns(text)
    return (orjson.dumps(c).decode() if as_json else
            pack(c["id"], c["type"], c["schema"], c["data"], c["digest"], c["meta"], c.get("event_meta")))


_WRONG_SHAPES = {  # valid JSON of the wrong shape, and what the sync says about it
    "schema not a number": (lambda p: {**p, "schema": ["x"] * len(p["schema"])},
                            "its 'schema' list holds \"x\" where a schema version"),
    # DuckDB's cast took these, rounding 1.5 to 2, and the sync stored what it made of them
    **{f"schema {v}": (lambda p, v=v: {**p, "schema": [v, *p["schema"][1:]]},
                       f"its 'schema' list holds {v} where a schema version") for v in (1.5, -1, 0)},
    "type not a list": (lambda p: {**p, "type": "ActionTaken"}, "columns differ in length"),
    "a list too short": (lambda p: {**p, "data": p["data"][:-1]}, "columns differ in length"),
    "a null type": (lambda p: {**p, "type": [None] * len(p["type"])},
                    "its 'type' list holds null where text belongs"),
    "no events": (lambda p: {**p, **{k: [] for k in ("id", "type", "schema", "data", "digest",
                                                     "event_meta") if k in p}},
                  "it holds no events"),
    "no meta": (lambda p: {k: v for k, v in p.items() if k != "meta"}, "KeyError: 'meta'"),
    "not an object": (lambda p: [1, 2], "it begins with '[1,2]', neither an event count nor a JSON"),
    "data not JSON": (lambda p: {**p, "data": ["not json"] * len(p["data"])}, "is not JSON"),
}


def _separated_fields(change):
    """A damage to a payload of the separated format, done on its fields (n is the count)."""
    def damage(text: str) -> str:
        fields = text.split(SEPARATOR)
        return SEPARATOR.join(change(fields, int(fields[0])))
    return damage


_WRONG_SEPARATED = {  # a payload of the separated format (revision 0005 on) damaged, and the words
    "a count too big": (_separated_fields(lambda f, n: [str(n + 1), *f[1:]]), "columns differ in length"),
    "a count not a number": (_separated_fields(lambda f, n: ["x", *f[1:]]), "it begins with 'x', neither"),
    "a field cut out": (_separated_fields(lambda f, n: f[:-1]), "columns differ in length"),
    "schema not a number": (_separated_fields(lambda f, n: [*f[:n + 1], *["x"] * n, *f[2 * n + 1:]]),
                            "a schema version 'x' is no number"),
    **{f"schema {v}": (_separated_fields(lambda f, n, v=v: [*f[:n + 1], v, *f[n + 2:]]), words)
       for v, words in (("1.5", "a schema version '1.5' is no number"),
                        ("-1", "a schema version '-1' is no number"),
                        ("0", "its 'schema' list holds 0 where a schema version"),
                        # orjson cannot write an integer past 64 bits: the error was a TypeError
                        (str(2**64), f"its 'schema' list holds {2**64} where a schema version"))},
    "no events": (_separated_fields(lambda f, n: ["0", f[3 * n + 1]]), "it holds no events"),
    "data not JSON": (_separated_fields(lambda f, n: [*f[:2 * n + 1], *["not json"] * n, *f[3 * n + 1:]]),
                      "is not JSON"),
}
_DAMAGES = {**{f"json: {k}": (lambda text, d=d: orjson.dumps(d(orjson.loads(text))).decode(), w)
               for k, (d, w) in _WRONG_SHAPES.items()},
            **{f"separated: {k}": v for k, v in _WRONG_SEPARATED.items()}}


@pytest.mark.parametrize("shape", list(_DAMAGES))
def test_a_commit_of_the_wrong_shape_is_named_and_nothing_of_its_batch_is_committed(tmp_path, shape):
    """DuckDB turns a value of the wrong type into NULL and a payload that is no object of lists
    into no rows at all: the sync must neither lose those events quietly nor fail on an insert.
    Damage in the JSON format (commits written before revision 0005) and the separated one."""
    damage, words = _DAMAGES[shape]
    path = str(tmp_path / "store.db")
    url = f"sqlite:///{path}"
    fill(url, 0, 40)
    where = "SELECT min(position) FROM commits WHERE position >= (SELECT max(position) / 2 FROM commits)"
    position, stream, payload = _set_payload(path, where)
    _set_payload(path, str(position), damage(payload_in(payload, as_json=shape.startswith("json"))))
    live = tmp_path / "live.duckdb"
    with pytest.raises(CorruptCommit, match=f"stream '{stream}': the commit at position {position} ") as info:
        sync(url, live, batch_events=301)
    assert words in str(info.value)
    assert sync_threads() == []
    with Warehouse(live) as wh:
        assert 0 < wh.checkpoint < position  # the batches before it are in, its own is not
        assert wh.counts()["events"] == wh.checkpoint


def _rewrite_payloads(url: str, as_json: bool) -> int:
    """Every commit's payload rewritten in one format, stored as its backend keeps it; returns how
    many changed. JSON: as revisions 0003-0004 wrote them."""
    import sqlalchemy as sa

    from eventstore.packing import compress

    changed = 0
    store = EventStore.open(url)
    try:
        with store.engine.begin() as conn:
            rows = conn.execute(sa.text("SELECT position, payload FROM commits")).all()
            for position, stored in rows:
                new, text = payload_in(stored, as_json), payload_text(stored)
                if new == (text.decode() if isinstance(text, bytes) else text):
                    continue
                conn.execute(sa.text("UPDATE commits SET payload = :p WHERE position = :position"),
                             {"p": compress(new) if isinstance(stored, bytes) else new, "position": position})
                changed += 1
    finally:
        store.close()
    return changed


def test_a_store_of_json_payloads_upgrades_and_reads_and_syncs_beside_separated_ones(empty_store_url,
                                                                                     tmp_path):
    """Revision 0005 writes payloads as separated fields (eventstore.packing.pack); what older code
    wrote stays JSON. Such a store upgrades without a row rewritten; the store reads and verifies
    both side by side, episodes that straddle the change included; and the warehouse synced from it
    equals the one synced after every commit is rewritten separated, batch cuts and all."""
    import sqlalchemy as sa

    from projections.verify import verify

    url = empty_store_url
    pending = fill(url, 0, 24, open_every=4)
    assert _rewrite_payloads(url, as_json=True) > 0
    store = EventStore.open(url)
    with store.engine.begin() as conn:
        conn.execute(sa.text("UPDATE alembic_version SET version_num = '0004_lz4_payloads'"))
    store.close()
    before = list(EventStore.open(url).read_all())
    finish(url, pending)  # the straddling episodes' second halves, written separated after the upgrade
    fill(url, 24, 16)
    with EventStore.open(url) as store:
        records = list(store.read_all())
        assert records[:len(before)] == before and len(records) > len(before)
        assert verify(store).ok
        with store.engine.connect() as conn:
            assert conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalar() \
                == HEAD_REVISION
    mixed = tmp_path / "mixed.duckdb"
    sync(url, mixed, batch_events=97)
    with Warehouse(mixed, read_only=True) as wh:
        assert wh.con.execute("SELECT stream_id, version, type, data FROM events ORDER BY position"
                              ).fetchall() == [(r.stream_id, r.version, r.type, r.data_json) for r in records]
    assert _rewrite_payloads(url, as_json=False) > 0
    with EventStore.open(url) as store:
        assert list(store.read_all()) == records
    separated = tmp_path / "separated.duckdb"
    sync(url, separated, batch_events=97)
    assert dump(mixed) == dump(separated)


def test_answering_over_a_store_that_cannot_be_opened_leaves_no_warehouse_file(tmp_path):
    """`GET /analytics/{name}` runs service.answer: the store is opened before the warehouse."""
    from eventstore import StoreUnavailable

    not_sqlite = tmp_path / "notes.txt"
    not_sqlite.write_text("not a database\n" * 100)
    warehouse = tmp_path / "w.duckdb"
    with pytest.raises(StoreUnavailable):
        service.answer(f"sqlite:///{not_sqlite}", "failure_modes", {}, warehouse)
    assert not warehouse.exists()
    url = f"sqlite:///{tmp_path / 'store.db'}"
    fill(url, 0, 5)
    assert service.answer(url, "success_by_task_and_chaos", {}, warehouse)  # the same call works


def test_a_warehouse_held_by_another_process_is_reported_busy(tmp_path):
    """Only DuckDB's lock conflict means "busy": the wait and the message still recognise it."""
    path = tmp_path / "w.duckdb"
    Warehouse(path).close()
    holder = subprocess.Popen([sys.executable, "-c", "import duckdb, sys; c = duckdb.connect(sys.argv[1]); "
                               "print('held', flush=True); sys.stdin.read()", str(path)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(WarehouseError, match="in use by another process"):
            Warehouse(path, wait=0.2)
    finally:
        holder.communicate("")


@pytest.fixture(params=["DuckDB names the holder", "DuckDB does not name the holder"])
def lock_message(request, monkeypatch):
    """Both ways of telling who holds the warehouse: DuckDB's lock-conflict message naming the
    process (as DuckDB 1.x and 2.0 word it), or, should its wording change, the progress file."""
    from analytics import warehouse as warehouse_module

    if request.param.endswith("does not name the holder"):
        monkeypatch.setattr(warehouse_module, "_holder_pid", lambda message: None)
    return request.param


def test_a_sync_in_another_process_is_followed_to_its_end(filled, tmp_path, lock_message):
    """A second server worker finds the warehouse locked by another worker's long sync: it hears
    how far that sync got (to say so on its 202 page) and waits for it to end, not a fixed 30 s
    after which it would give up with a 503."""
    from analytics.sync_progress import progress_file

    url, pending = filled
    finish(url, pending)
    warehouse = tmp_path / "w.duckdb"
    events = tally_events(url)
    other = start_slow_sync(url, warehouse, batch_events=10_000, pause_s=0.5)
    try:
        heard: list[tuple[int, int | None]] = []
        with Warehouse(warehouse, wait=0.3, follow=lambda done, total: heard.append((done, total))) as wh:
            assert wh.checkpoint == events  # opened only once the other sync had ended
        assert other.wait(30) == 0
    finally:
        other.kill()
    assert heard and {total for _, total in heard} == {events}
    # in order; the last may be the end itself: the holder states it until it lets go of the file
    assert [done for done, _ in heard] == sorted(done for done, _ in heard) and heard[-1][0] <= events
    assert not progress_file(warehouse).exists()  # the sync cleans up after itself


@pytest.mark.parametrize("writer", ["this process", "a process that has ended"])
def test_a_progress_file_left_by_another_process_is_not_followed(tmp_path, lock_message, writer):
    """The progress file names its sync's process: one left behind by a killed sync says nothing
    about a process that holds the file for something else, so the usual wait applies."""
    import orjson

    from analytics.sync_progress import SharedProgress, progress_file

    path = tmp_path / "w.duckdb"
    Warehouse(path).close()
    SharedProgress(path)(100, 200)  # written by this process, which does not hold the file
    if writer == "a process that has ended":
        ended = subprocess.Popen([sys.executable, "-c", "pass"])
        ended.wait()
        progress_file(path).write_bytes(orjson.dumps({"pid": ended.pid, "done": 100, "total": 200}))
    holder = subprocess.Popen([sys.executable, "-c", "import duckdb, sys; c = duckdb.connect(sys.argv[1]); "
                               "print('held', flush=True); sys.stdin.read()", str(path)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        heard: list = []
        with pytest.raises(WarehouseError, match="in use by another process"):
            Warehouse(path, wait=0.3, follow=lambda *figures: heard.append(figures))
        assert heard == []
    finally:
        holder.communicate("")


def tally_events(url: str) -> int:
    with EventStore.open(url) as store:
        return store.readable_position()


# -- hand-written episodes: one question each ---------------------------------------------------


def _episode(store: EventStore, eid: str, steps: list[list[tuple[str, dict]]], end: tuple | None,
             agent: str | None = "a", task: str = "expense_report", seed: int = 1, chaos: float = 0.5,
             max_steps: int = 30, profile: str = "default", total_return: float = 0.0) -> None:
    """Append one episode: step n's tool is `t.sN` (so a lead-in shows its steps), then the step's
    events; `end` is (outcome, failure_mode) or None to leave the episode running."""
    meta = {"agent": agent} if agent is not None else {}
    start = {"task": task, "seed": seed, "chaos": chaos, "reward_profile": profile, "max_steps": max_steps,
             "goal": "g", "target": {}}
    events = [NewEvent("EpisodeStarted", start, meta=meta)]
    for n, extra in enumerate(steps, 1):
        events.append(NewEvent("ActionTaken", {"step": n, "action": {"app": "t", "method": f"s{n}",
                                                                     "params": {}}}))
        events += [NewEvent(t, {"step": n, **d} if t != "RewardGranted" else d) for t, d in extra]
    if end is not None:
        events.append(NewEvent("EpisodeEnded", {"outcome": end[0], "failure_mode": end[1],
                                                "steps": len(steps), "total_return": total_return}))
    store.append(eid, events, None)


def _submitted(aid: str, problems: list | None = None) -> tuple[str, dict]:
    return ("ApprovalSubmitted", {"approval_id": aid, "approval_type": "expense", "approver": "x",
                                  "approver_role": "r", "data": {}, "problems": problems or [],
                                  "approver_out_of_office": False})


def _mistake(mode: str, subject: str, irreversible: bool = False) -> tuple[str, dict]:
    return ("MistakeRecorded", {"mode": mode, "subject": subject, "detail": "d",
                                "irreversible": irreversible})


def _refusal(code: str) -> tuple[str, dict]:
    return ("ActionRejected", {"code": code, "reason": "r", "cause": "rules", "mechanism": None})


def _rejected(aid: str) -> list[tuple[str, dict]]:
    return [("ApprovalDecided", {"approval_id": aid, "decision": "rejected", "reason": "no", "cause": "rules",
                                 "mechanism": None}), _mistake("rejection_not_handled", aid)]


def _warehouse_of(tmp_path, write) -> Warehouse:
    url = f"sqlite:///{tmp_path / 'hand.db'}"
    store = EventStore.open(url)
    try:
        write(store)
    finally:
        store.close()
    wh = Warehouse(tmp_path / "hand.duckdb")
    sync(url, wh)
    return wh


def test_lead_in_ends_at_the_step_that_decided_the_failure_mode(tmp_path):
    """As domain/outcomes.py decides the mode: the irreversible mistake, or on truncation the
    first mistake never put right, not merely the first mistake."""
    idle: list[tuple[str, dict]] = []
    a1, a2 = [_submitted("A1")], [_submitted("A2")]
    escalate_a1 = [("ApprovalEscalated", {"approval_id": "A1", "reason": "r"})]
    # name: (steps, (outcome, failure mode), decisive step, first mistake step, mistakes)
    cases = {
        # A1 rejected (2), put right by resubmitting A2 (3), A2 rejected (4) and never handled
        "resubmitted": ([a1, _rejected("A1"), a2, _rejected("A2"), idle, idle],
                        ("truncated", "rejection_not_handled"), 4, 4, 1),
        # both pending, A1 rejected first (3), A2 after (4), neither handled: the first unresolved decides
        "two_pending": ([a1, a2, _rejected("A1"), _rejected("A2"), idle, idle],
                        ("truncated", "rejection_not_handled"), 3, 3, 2),
        # as above, but A1 escalated (5): A2's rejection is the first never put right
        "escalated": ([a1, a2, _rejected("A1"), _rejected("A2"), escalate_a1, idle],
                      ("truncated", "rejection_not_handled"), 4, 4, 1),
        # missing fields (2) fixed by a resubmission (3); the budget ran out with no mistake left
        "fixed_then_slow": ([idle, [_mistake("missing_required_fields", "expense")], [_submitted("A1")],
                             idle, idle, idle, idle], ("truncated", "step_budget_exhausted"), 7, 2, 1),
        # stale figures sent (2, recoverable), later the irreversible stale decision (5) ends it
        "irreversible": ([idle, [_submitted("A1", ["stale"]), _mistake("stale_data_used", "expense")], idle,
                          idle, [_mistake("stale_data_used", "T-1", True)]],
                         ("failure", "stale_data_used"), 5, 2, 2),
        # a sent request with missing fields is a mistake even when it is fixed
        "success": ([idle, [_mistake("missing_required_fields", "expense")], [_submitted("A1")]],
                    ("success", None), 3, 2, 1),
        # a (chaos) rejection handled by escalating it is no mistake of the agent's
        "handled": ([a1, _rejected("A1"), escalate_a1], ("success", None), 3, None, 0),
    }

    def write(store):
        for eid, (steps, end, *_) in cases.items():
            _episode(store, eid, steps, end)

    with _warehouse_of(tmp_path, write) as wh:
        rows = {r[0]: r[1:] for r in wh.con.execute(
            "SELECT episode_id, lead_in, first_mistake_step, mistakes FROM episodes").fetchall()}
        for eid, (_, _, decisive, first, mistakes) in cases.items():
            assert rows[eid][0] == [f"t.s{n}" for n in range(max(1, decisive - 4), decisive + 1)], eid
            assert rows[eid][1:] == (first, mistakes), eid
        sequences = {(r["failure_mode"], r["sequence"]) for r in
                     service.run_named(wh, "actions_before_failure", {"k": 2})}
        assert ("rejection_not_handled", "t.s3 > t.s4") in sequences
        assert ("step_budget_exhausted", "t.s6 > t.s7") in sequences


def test_pass_at_k_averages_every_k_over_the_same_instances(tmp_path):
    """τ-bench: pass^1..pass^K over the instances with at least K trials, so it never rises with k."""
    def write(store):
        _episode(store, "once", [[]], ("failure", "wrong_decision"), seed=1)
        for i in range(3):
            _episode(store, f"thrice-{i}", [[]], ("success", None), seed=2)
        for i in range(2):  # same seed and chaos, another agent: another instance
            _episode(store, f"b-{i}", [[]], ("success", None), seed=2, agent="b")

    with _warehouse_of(tmp_path, write) as wh:
        rows = service.run_named(wh, "pass_at_k", {"k": 3, "agent": "a"})
        assert [(r["k"], r["instances"], r["instances_left_out"], r["pass_hat_k"]) for r in rows] == [
            (1, 1, 1, 1.0), (2, 1, 1, 1.0), (3, 1, 1, 1.0)]
        # no instance of b has 3 trials: one row per k says so, with nothing averaged
        rows = service.run_named(wh, "pass_at_k", {"k": 3, "agent": "b"})
        assert [(r["k"], r["instances"], r["instances_left_out"], r["pass_hat_k"]) for r in rows] == [
            (1, 0, 1, None), (2, 0, 1, None), (3, 0, 1, None)]
        rows = service.run_named(wh, "pass_at_k", {"k": 1, "agent": "a"})
        assert [(r["instances"], r["pass_hat_k"]) for r in rows] == [(2, 0.5)]


def test_rates_and_means_round_as_decimals_do(tmp_path):
    """DuckDB's round of a DOUBLE took a binary value just under a half-way one down: a mean
    return of -9.1625 was -9.162; and pass^1 of 0.28125 was 0.2812 (exp(lgamma) made 3/4
    0.7499999999999998), below the success rate it equals."""
    trials = {"p": (4, 3), "q": (4, 2), "r": (4, 2), "s": (4, 2), "t": (4, 0), "u": (4, 0),
              "v": (1, 0), "w": (1, 0)}

    def write(store):
        for seed, (name, (n, c)) in enumerate(trials.items()):
            for i in range(n):
                end = ("success", None) if i < c else ("failure", "wrong_decision")
                _episode(store, f"{name}-{i}", [[]], end, seed=seed, task="license_renewal")
        for i, value in enumerate((-9.16, -9.165)):
            _episode(store, f"m-{i}", [[]], ("failure", "wrong_decision"), agent="m", total_return=value)

    with _warehouse_of(tmp_path, write) as wh:
        [row] = service.run_named(wh, "pass_at_k", {"k": 1, "agent": "a"})
        assert (row["instances"], row["pass_hat_k"]) == (8, 0.2813)
        [row] = service.run_named(wh, "success_by_task_and_chaos", {"agent": "m"})
        assert row["mean_return"] == -9.163
        [row] = [r for r in service.run_named(wh, "compare_agents", {}) if r["agent"] == "m"]
        assert row["mean_return"] == -9.163


def test_pass_at_k_does_not_pool_other_budgets_or_reward_profiles_as_trials(tmp_path):
    def write(store):
        _episode(store, "short", [[]], ("truncated", "step_budget_exhausted"), max_steps=13)
        _episode(store, "long", [[]], ("success", None), max_steps=16)
        _episode(store, "sparse", [[]], ("success", None), max_steps=16, profile="sparse")
        _episode(store, "long-again", [[]], ("success", None), max_steps=16)

    with _warehouse_of(tmp_path, write) as wh:
        rows = service.run_named(wh, "pass_at_k", {"k": 2})
        assert [(r["k"], r["instances"], r["instances_left_out"], r["pass_hat_k"]) for r in rows] == [
            (1, 1, 2, 1.0), (2, 1, 2, 1.0)]  # only (16 steps, default) ran twice


def test_a_reward_profile_filter_answers_as_a_warehouse_of_that_profile_alone(tmp_path):
    """Returns are only comparable within a reward profile: with `profile`, every query and the
    report answer exactly as they would over a warehouse holding only that profile's episodes (a
    mean return mixing default and sparse episodes was all there was)."""
    from analytics import report

    step = ("RewardGranted", {"rule": "step", "value": -0.1, "cause": 1})
    done = ("RewardGranted", {"rule": "task_completed", "value": 1.0, "cause": 1})

    def write(profiles):
        def into(store):
            for n in range(12):
                profile = ("default", "sparse")[n % 2]
                if profile not in profiles:
                    continue
                rewards = [step] if profile == "default" else []
                steps = [rewards + [_refusal("invalid_params")] * (n % 3 == 0), rewards + [done]]
                end = [("success", None), ("success", None), ("failure", "wrong_decision"),
                       ("truncated", "rejection_not_handled")][n % 4]
                if end[0] != "success":
                    steps[1] = rewards + [_mistake(end[1], "expense")]
                _episode(store, f"e{n:02}", steps, end, agent=("a", "b")[n % 3 == 1],
                         task=("expense_report", "vendor_onboarding")[n % 5 == 0], seed=n % 3,
                         chaos=(0.0, 0.5)[n % 2 == 0 or n > 6], profile=profile,
                         total_return=(-0.2 if profile == "default" else 0.0) + (end[0] == "success"))
        return into

    def answers(wh, profile=None):
        only = {} if profile is None else {"profile": profile}
        compared = {"head_to_head": {"agent": "a"}}
        queries = {name: service.run_named(wh, name, {**only, **compared.get(name, {})})
                   for name in named.registry()}
        whole = report.build(wh, profile=profile)
        del whole["seconds"], whole["filters"]
        return queries, whole

    from analytics import named

    (tmp_path / "both").mkdir()
    with _warehouse_of(tmp_path / "both", write({"default", "sparse"})) as both:
        filtered = {p: answers(both, p) for p in ("default", "sparse")}
        unfiltered = answers(both)
    for profile in ("default", "sparse"):
        (tmp_path / profile).mkdir()
        with _warehouse_of(tmp_path / profile, write({profile})) as alone:
            assert filtered[profile] == answers(alone), profile
    assert unfiltered != filtered["default"] and unfiltered != filtered["sparse"]  # a filter that filters
    assert filtered["sparse"][1]["summary"]["episodes"] == 6


def test_queries_count_finished_episodes_only(tmp_path):
    """A running episode's partial rewards, mistakes and calls are in no query."""
    def write(store):
        reward = ("RewardGranted", {"rule": "step", "value": -0.1, "cause": 1})
        bad = _refusal("invalid_params")
        _episode(store, "done", [[reward], [reward]], ("success", None))
        _episode(store, "running", [[reward, bad, _mistake("missing_required_fields", "expense")]], None)

    with _warehouse_of(tmp_path, write) as wh:
        assert service.run_named(wh, "reward_by_rule", {}) == [
            {"rule": "step", "grants": 2, "episodes_granted": 1, "share_of_episodes": 1.0,
             "total_value": -0.2, "mean_value_per_episode": -0.2}]
        assert service.run_named(wh, "first_mistake_step", {}) == []
        rows = service.run_named(wh, "tool_error_rates", {})
        assert {r["tool"]: (r["calls"], r["rejected"]) for r in rows} == {"t.s1": (1, 0), "t.s2": (1, 0)}


def test_an_action_whose_app_or_method_is_no_string_is_malformed_not_a_tool(tmp_path):
    """The domain rejects {"app": 1, ...} as malformed_action, but the warehouse named a tool after
    the JSON of its app and method ("1.m", "ticketdesk.[\"list_tickets\"]")."""
    from companyos.env import CompanyEnv

    url = f"sqlite:///{tmp_path / 's.db'}"
    actions = ({"app": 1, "method": "m"}, {"app": True, "method": False},
               {"app": "ticketdesk", "method": ["list_tickets"]}, {"app": "ticketdesk", "method": {"a": 1}},
               {"app": "ticketdesk", "method": "list_tickets", "params": {}})
    with CompanyEnv(url, agent="odd") as env:
        env.reset(seed=1, options={"task": "expense_report", "chaos": "none", "max_steps": 5})
        codes = [env.step(action)[-1]["rejected"] for action in actions]
    assert codes == ["malformed_action"] * 4 + [None]
    sync(url, tmp_path / "w.duckdb")
    with Warehouse(tmp_path / "w.duckdb", read_only=True) as wh:
        rows = wh.con.execute("SELECT app, method, tool FROM steps ORDER BY step").fetchall()
        listed = ("ticketdesk", "list_tickets", "ticketdesk.list_tickets")
        assert rows == [(None, None, "(malformed)")] * 4 + [listed]
        rates = service.run_named(wh, "tool_error_rates", {"min_calls": 1})
        assert {r["tool"]: r["calls"] for r in rates} == {"(malformed)": 4, "ticketdesk.list_tickets": 1}


def test_most_common_ties_are_broken_alphabetically(tmp_path):
    """Equal counts: the alphabetically first name, whatever order the episodes were logged in."""
    def write(store):
        n = 0
        for first, second in (("z", "b"), ("b", "z")):
            for mode, code in ((f"{first}_mode", f"{first}_code"), (f"{second}_mode", f"{second}_code")):
                rejected = _refusal(code)
                n += 1
                _episode(store, f"e{n}", [[rejected, _mistake(mode, "x")]], ("truncated", mode),
                         agent=f"agent-{first}")

    with _warehouse_of(tmp_path, write) as wh:
        assert [r["most_common_mode"] for r in service.run_named(wh, "first_mistake_step", {})] == ["b_mode"]
        assert [r["top_reject_code"] for r in service.run_named(wh, "tool_error_rates", {})] == ["b_code"]
        assert {r["agent"]: r["top_failure_mode"] for r in service.run_named(wh, "compare_agents", {})} == {
            "agent-z": "b_mode", "agent-b": "b_mode"}


def test_report_counts_agentless_episodes_as_the_unknown_agent_it_lists(tmp_path):
    from analytics import report

    def write(store):
        _episode(store, "a", [[]], ("success", None), agent="a")
        _episode(store, "nobody", [[]], ("success", None), agent=None)
        _episode(store, "ghost", [[], []], None, agent="ghost", task="bug_escalation")  # still running

    with _warehouse_of(tmp_path, write) as wh:
        data = report.build(wh)
    # counted as the tables list them: a running episode's agent and task are in no table
    assert data["summary"]["agents"] == len(data["compare_agents"]) == 2
    line = report.summary_line(data["summary"])
    assert "2 agents, 1 task" in line and "(2 finished, 1 running)" in line
    assert "mean steps 1," in line and "mean return 0," in line, line  # as the tables print numbers
    assert "1 episode still running is counted in totals but not in rates." in report.html_body(data)
    # the headline's count names them beside the rate that leaves them out (3 beside 100%, before)
    assert '"kpi">episodes<b>3 (1 running)</b>' in report.html_body(data)
    # with none running the footnote said "0 episodes still running are counted ..."
    none_running = {**data, "summary": {**data["summary"], "running": 0}}
    assert "still running" not in report.html_body(none_running)
    assert '"kpi">episodes<b>3</b>' in report.html_body(none_running)


def test_the_unknown_agent_compare_agents_lists_is_a_filter_that_finds_its_episodes(tmp_path):
    """`(unknown)` is how the analytics name episodes logged without an agent; asked for, every
    query answered nothing, without a word."""
    from analytics import report

    def write(store):
        _episode(store, "a", [[]], ("success", None), agent="a")
        _episode(store, "nobody", [[], []], ("truncated", "step_budget_exhausted"), agent=None)

    with _warehouse_of(tmp_path, write) as wh:
        unknown = {"agent": "(unknown)"}
        assert [r["agent"] for r in service.run_named(wh, "compare_agents")] == ["a", "(unknown)"]
        [cell] = service.run_named(wh, "success_by_task_and_chaos", unknown)
        assert (cell["episodes"], cell["successes"]) == (1, 0)
        [mode] = service.run_named(wh, "failure_modes", unknown)
        assert mode["example_episode_ids"] == ["nobody"]
        tools = service.run_named(wh, "tool_error_rates", {**unknown, "min_calls": 1})
        assert sorted(r["tool"] for r in tools) == ["t.s1", "t.s2"]  # the unlabelled episode's steps
        data = report.build(wh, agent="(unknown)")
    assert data["summary"]["episodes"] == 1 and data["summary"]["successes"] == 0


def test_the_reports_success_rate_never_reads_100_or_0_percent_when_it_is_not():
    """1,000,000 episodes of which 5 failed: the report's summary said "success 100.0%"."""
    from analytics import report

    summary = {"episodes": 1_000_000, "finished": 1_000_000, "running": 0, "successes": 999_995,
               "success_rate": 1.0, "mean_return": 19.0, "mean_steps": 12.8, "agents": 1, "tasks": 5}
    assert "success 99.9995%," in report.summary_line(summary)
    assert "success 0.001%," in report.summary_line({**summary, "successes": 5, "success_rate": 0.0})
    assert "success 100.0%," in report.summary_line({**summary, "successes": 1_000_000})
    assert "success 0.0%," in report.summary_line({**summary, "successes": 0, "success_rate": 0.0})
    assert "success 99.9%," in report.summary_line({**summary, "successes": 999_000,
                                                    "success_rate": 0.999})
    # from the counts, not the rate the queries round to 4 places: 1 of 22 is 4.545%, not 4.6%
    assert "success 4.5%," in report.summary_line({**summary, "finished": 22, "successes": 1,
                                                   "success_rate": 0.0455})


def test_the_report_rounds_percentages_as_the_queries_round_rates(tmp_path):
    """5 successes of 16 is 31.25%: the summary said 31.2% (Python's binary half-to-even), where
    49 of 80 (61.25%) said 61.3%; percentages round half away from zero, as the rates do."""
    from analytics import report

    def write(store):
        for i in range(16):
            end = ("success", None) if i < 5 else ("failure", "wrong_decision")
            _episode(store, f"e{i}", [[]], end, seed=i)

    with _warehouse_of(tmp_path, write) as wh:
        data = report.build(wh)
    assert data["summary"]["success_rate"] == 0.3125
    assert "success 31.3%" in report.summary_line(data["summary"])
    assert "success rate<b>31.3%</b>" in report.to_html(data)
    # and so do the charts' labels
    data["failure_modes"] = [{"failure_mode": "m", "episodes": 5, "share": 0.3125}]
    (modes,) = [c for c in report.charts(data) if "Failure modes" in c]
    assert ">31.3%</text>" in modes and "31.2%" not in modes


def test_parameters_drop_surrounding_whitespace_whatever_their_type(tmp_path):
    from analytics import named

    query = named.get("failure_modes")
    assert query.bind(named.parse_assignments(["task= expense_report ", "agent= a", "chaos= medium",
                                               "profile= sparse ", "examples= 2", "rules= 2 "])) == {
        "task": "expense_report", "agent": "a", "chaos": 0.5, "profile": "sparse", "examples": 2,
        "rules": 2}
    assert query.bind({"agent": " a "})["agent"] == "a"  # JSON and query strings too


def test_floats_in_tables_keep_their_magnitude():
    from analytics.report import _cell, number_text

    assert number_text(1234567.891) == "1234567.891"
    assert number_text(-8439.0) == "-8439" and number_text(0.1565) == "0.1565"
    assert number_text(2 / 3) == "0.666667" and number_text(-0.0) == "0"
    assert number_text(1e-9) == "1e-09"  # not rounded away to 0
    assert _cell(-2_200_000.25) == "-2200000.25"


@pytest.mark.parametrize("reader", [None, "store"])
def test_a_store_restored_from_a_backup_is_refused_not_half_synced(empty_store_url, tmp_path, reader):
    """A restored store starts with the same event as the one synced, so only the checkpoint's own
    event tells it apart: the sync refuses instead of keeping episodes the store no longer holds."""
    url = empty_store_url
    path = tmp_path / "w.duckdb"
    fill(url, 0, 6)
    sync(url, path, prefer=reader)
    with EventStore.open(url) as store:
        restored_to = store.last_position()
    fill(url, 6, 6)
    sync(url, path, prefer=reader)
    _roll_back(url, restored_to)  # the backup taken after the first sync, restored
    with pytest.raises(WarehouseError, match="changed history"):
        sync(url, path, prefer=reader)  # the checkpoint now lies past the store's last event
    fill(url, 100, 8)  # new episodes reach past the old checkpoint again (SQLite reuses positions)
    with pytest.raises(WarehouseError, match="changed history"):
        sync(url, path, prefer=reader)
    with Warehouse(path) as wh:
        wh.reset()  # what `analytics sync --rebuild` does
        sync(url, wh, prefer=reader)
        assert wh.counts()["episodes"] == len(tally(url)["episodes"]) == 14


def _roll_back(url: str, position: int) -> None:
    """Drop every commit after `position`, as restoring a backup taken then would."""
    with EventStore.open(url) as store, store.engine.begin() as conn:
        conn.exec_driver_sql(f"DELETE FROM commits WHERE position > {int(position)}")


def test_the_report_says_what_it_leaves_out_and_keeps_the_steps_axis_whole(tmp_path):
    """Its tool table used to stop at 12 rows without a word, and the first-mistake chart drew only
    the steps someone went wrong at, side by side, which hid the distribution's shape."""
    from analytics import report

    def write(store):  # step n's tool is t.sN: 35 tools; first mistakes at steps 2, 3 and 9
        _episode(store, "long", [[] for _ in range(35)], ("truncated", "step_budget_exhausted"))
        for eid, at in (("m2", 2), ("m3", 3), ("m9", 9)):
            steps = [[] for _ in range(at)]
            steps[-1] = [_mistake("wrong_decision", "T-1", True)]
            _episode(store, eid, steps, ("failure", "wrong_decision"))

    with _warehouse_of(tmp_path, write) as wh:
        data = report.build(wh)
        every_tool = service.run_named(wh, "tool_error_rates", {"min_calls": 1})
        narrowed = report.build(wh, agent="a", chaos="0.5")
    assert len(every_tool) == 35 and data["tool_error_rates"] == every_tool[:report.TOOL_ROWS]
    # the tools left out have the same or lower rates (here all 35 have none), and the command that
    # lists them carries the report's filters (it listed another set)
    note = f"{35 - report.TOOL_ROWS} more tools, with the same or lower error rates, are not shown"
    assert note in report.to_markdown(data) and note in report.to_html(data)
    assert data["notes"]["tool_error_rates"].endswith(
        "`companyos analytics query tool_error_rates` lists them all")
    assert narrowed["notes"]["tool_error_rates"].endswith(
        "`companyos analytics query tool_error_rates -p agent=a -p chaos=0.5` lists them all")
    bars = report.first_mistake_bars(data["first_mistake_step"])
    assert [label for label, _, _ in bars] == [str(step) for step in range(2, 10)]
    assert [label for label, share, _ in bars if share] == ["2", "3", "9"]
    (chart,) = [c for c in report.charts(data) if "Step of the first mistake" in c]
    assert all(f">{step}</text>" in chart for step in range(2, 10))  # empty steps keep their place
    # a long tail is one last bar, not cut off: steps 2, 3 and 9 in bars of at most 4
    tail = report.first_mistake_bars(data["first_mistake_step"], most=4)
    assert [label for label, _, _ in tail] == ["2", "3", "4", "5+"]
    assert tail[-1][1] == next(r["share"] for r in data["first_mistake_step"] if r["first_mistake_step"] == 9)
    assert tail[-1][2] == "1 episode at steps 5 to 9"
    assert sum(share for _, share, _ in tail) == pytest.approx(1.0, abs=1e-5)


def test_a_progress_file_that_cannot_be_written_leaves_nothing_beside_the_warehouse(tmp_path, monkeypatch):
    """A full disk lets the scratch file be created but not filled: empty `.syncing.<pid>` files
    piled up beside the warehouse, one per failed sync. The forwarded progress still arrives."""
    import errno
    from pathlib import Path

    from analytics.sync_progress import SharedProgress

    def full_disk(self, data):
        self.touch()
        raise OSError(errno.ENOSPC, "No space left on device")

    heard: list = []
    progress = SharedProgress(tmp_path / "w.duckdb", forward=lambda *figures: heard.append(figures))
    monkeypatch.setattr(Path, "write_bytes", full_disk)
    progress(10, 20)
    monkeypatch.undo()
    progress.close()
    assert heard == [(10, 20)] and list(tmp_path.iterdir()) == []


def test_means_of_returns_do_not_depend_on_the_order_rows_are_summed_in(tmp_path):
    """Two stores holding the same episodes (PostgreSQL and SQLite, or two worker interleavings)
    answered -10.443 and -10.442: floating-point sums depend on their order, and a mean whose
    exact value ends in 5 rounds either way. Returns are summed as decimals now."""
    import random

    returns = [round(random.Random(i).uniform(-20, 5), 1) + 0.0425 for i in range(40)]
    answers = set()
    with Warehouse(tmp_path / "w.duckdb") as wh:
        for order in range(12):
            random.Random(order).shuffle(returns)
            wh.con.execute("DELETE FROM episodes")
            wh.con.executemany(
                "INSERT INTO episodes (episode_id, task, chaos, agent, outcome, steps, total_return, "
                "first_position, last_position, event_count, last_version) "
                "VALUES (?, 'expense_report', 0.5, 'a', 'failure', 3, ?, ?, ?, 1, 0)",
                [(f"e{i}", r, i + 1, i + 1) for i, r in enumerate(returns)])
            answers.add((service.run_named(wh, "success_by_task_and_chaos")[0]["mean_return"],
                         service.run_named(wh, "compare_agents")[0]["mean_return"]))
    exact = sum(round(r * 10**6) for r in returns) / len(returns) / 10**6
    assert len(answers) == 1 and abs(answers.pop()[0] - exact) <= 0.0005


def test_the_agents_chart_keeps_long_model_names_readable():
    """Model names as agent labels were printed over each other under vertical bars, and a long
    one ran past the chart's edge; the chart is a row per agent now, each name cut to its room
    with the whole name in the bar's tooltip."""
    import re

    from analytics import report

    names = ["gpt-4o-2024-08-06-react-with-reflection-and-tools", "claude-3-5-sonnet-tools",
             "llama-3.1-70b-instruct", "random"]
    agents = [{"agent": n, "episodes": 10, "instances": 10, "successes": wins, "success_rate": wins / 10,
               **dict(zip(("success_rate_low", "success_rate_high"), wilson_interval(wins, 10), strict=True))}
              for n, wins in zip(names, (5, 9, 2, 0), strict=True)]
    data = {"success_by_chaos": [], "success_by_task_and_chaos": [], "failure_modes": [],
            "first_mistake_step": [], "compare_agents": agents}
    (chart,) = report.charts(data)
    labels = re.findall(r'<text x="184" y="\d+" text-anchor="end">([^<]*)</text>', chart)
    assert labels == ["claude-3-5-sonnet-tools", "gpt-4o-2024-08-06-r\u2026and-tools",
                      "llama-3.1-70b-instruct", "random"]  # ranked, the long one cut in the middle
    assert all(f"<title>{n}: " in chart for n in names)
    widths = [float(w) for w in re.findall(r'<rect x="190" y="\d+" width="([\d.]+)"', chart)]
    assert widths[0] == pytest.approx(0.9 * (560 - 190 - 60), abs=0.1)  # rates on an absolute scale


def test_agents_whose_names_differ_at_the_end_read_apart_in_the_charts():
    """Model names often differ only in a suffix (a temperature, a date): cut at the end, both read
    "acme/llm-agent-gpt-4o-2024-…", one bar at 100% and one at 0%."""
    import re

    from analytics import report

    names = [f"acme/llm-agent-gpt-4o-2024-08-06-temperature-0.{t}" for t in (2, 9)]
    agents = [{"agent": n, "episodes": 10, "instances": 10, "successes": wins, "success_rate": wins / 10,
               **dict(zip(("success_rate_low", "success_rate_high"), wilson_interval(wins, 10), strict=True))}
              for n, wins in zip(names, (10, 0), strict=True)]
    (chart,) = report.charts({"success_by_chaos": [], "success_by_task_and_chaos": [],
                              "failure_modes": [], "first_mistake_step": [], "compare_agents": agents})
    labels = re.findall(r'text-anchor="end">([^<]*)</text>', chart)
    assert len(labels) == 2 and labels[0] != labels[1], labels
    assert [label[-3:] for label in labels] == ["0.2", "0.9"], labels
    assert all("\u2026" in label for label in labels), labels  # cut, the middle gone


def test_chart_labels_are_cut_by_their_width_not_their_length():
    """A label of 100 capitals, cut to a character count, still ran past the chart's edge (the
    legend) or began before it (the agents' bars), as wide CJK text would."""
    import re

    from analytics import report

    for label in ("A" * 100, "W" * 40 + "-model", "智能体" * 20):
        legend_chart = report.grouped_bar_chart(["none (0)"], {label: [0.5], "b": [0.25]}, title="t")
        width = float(re.search(r'viewBox="0 0 ([\d.]+)', legend_chart)[1])
        for x, text in re.findall(r'<text x="([\d.]+)" y="[\d.]+">([^<]+)</text>', legend_chart):
            assert float(x) + report._text_px(text) <= width, text
        bars = report.hbar_chart([label, "b"], [0.5, 0.25], title="t")
        (x, text), _ = re.findall(r'<text x="([\d.]+)" y="[\d.]+" text-anchor="end">([^<]+)</text>', bars)
        assert "\u2026" in text and float(x) - report._text_px(text) >= 0, text
    assert report._fit("random", 100) == "random"  # one that fits is whole


def test_the_per_agent_chart_draws_the_busiest_agents_and_keeps_its_legend_inside(tmp_path):
    """Twelve agents with long model names: the chart draws the eight with the most episodes, best
    first, each legend entry inside the picture (they wrapped past its bottom edge before), and
    the report says the table lists the rest."""
    import re

    from analytics import report

    def write(store):
        for i in range(12):
            name = f"vendor-model-{i:02d}-instruct-2026-11-react-with-tools"
            for k in range(i + 1):  # agent i has i + 1 episodes, the first of them a success
                outcome = ("success", None) if k == 0 else ("failure", "wrong_decision")
                _episode(store, f"e{i}-{k}", [[]], outcome, agent=name, chaos=0.25 * (k % 3))

    with _warehouse_of(tmp_path, write) as wh:
        data = report.build(wh)
    assert len({r["agent"] for r in data["success_by_agent_and_chaos"]}) == 12
    assert data["notes"]["success_by_agent_and_chaos"] == (
        "The chart above draws the 8 agents with the most episodes; this table lists all 12.")
    note = data["notes"]["success_by_agent_and_chaos"]
    assert note in report.to_html(data) and note not in report.to_markdown(data)  # no chart there
    chart = report.charts(data)[0]
    # said where the eye is, too: the note under the table was a screen away from the chart
    assert "Success rate by chaos level and agent (the 8 busiest of 12)" in chart
    width, height = (float(v) for v in re.search(r'viewBox="0 0 ([\d.]+) ([\d.]+)"', chart).groups())
    legend = re.findall(r'<rect x="([\d.]+)" y="([\d.]+)" width="12" height="12"', chart)
    assert len(legend) == report.CHART_AGENTS
    assert all(float(x) + 12 <= width and float(y) + 12 <= height for x, y in legend), legend
    drawn = re.findall(r"<title>([^<]*) @ ", chart)
    assert {d[:15] for d in drawn} == {f"vendor-model-{i:02d}" for i in range(4, 12)}  # the busiest
    rates = [1 / (i + 1) for i in range(4, 12)]
    assert [n[:15] for n in dict.fromkeys(drawn)] == [
        f"vendor-model-{i:02d}" for _, i in sorted(zip(rates, range(4, 12), strict=True), reverse=True)]


def test_a_chaos_sweep_keeps_its_axis_labels_readable_and_apart():
    """A sweep of 21 chaos levels (0, 0.05, ..., 1): the success chart cut every axis label to
    `0.…` or `me…`, and the task-by-chaos chart printed `low (0.25)` over its neighbours. Labels are
    now spread out, every so many bars, each whole and clear of the next."""
    import re

    from analytics import report

    levels = [round(i / 20, 2) for i in range(21)]
    by_task_and_chaos = [{"task": task, "chaos": c, "episodes": 10, "instances": 10, "successes": 5,
                          "success_rate": 0.5}
                         for task in ("expense_report", "bug_escalation") for c in levels]
    data = {"success_by_chaos": report.success_by_chaos(by_task_and_chaos),
            "success_by_task_and_chaos": by_task_and_chaos, "failure_modes": [],
            "first_mistake_step": [], "compare_agents": []}
    simple, grouped = report.charts(data)
    for chart in (simple, grouped):
        axis_y = max(float(y) for y in re.findall(r'<text x="[\d.]+" y="([\d.]+)" text-anchor="middle" '
                                                  r'fill="#333">', chart))
        labels = [(float(x), text) for x, text in re.findall(
            rf'<text x="([\d.]+)" y="{axis_y}" text-anchor="middle" fill="#333">([^<]*)</text>', chart)]
        assert len(labels) >= 4, labels
        assert all("\u2026" not in text for _, text in labels), labels  # whole, not cut
        assert labels[0][1] == "none (0)"
        for (x1, a), (x2, b) in itertools.pairwise(labels):  # half of each width either side
            assert x2 - x1 >= (report._text_px(a) + report._text_px(b)) / 2, (a, b)


def test_grouped_chart_series_differ_by_pattern_as_well_as_colour():
    """Told apart by colour alone (WCAG 1.4.1), two agents' bars read the same to a reader who
    does not see those colours apart, or on a grey print; each series has its pattern too, and
    the legend shows it."""
    names = [f"agent-{i}" for i in range(8)]
    charts = [report.grouped_bar_chart(["none", "high"], {n: [0.5, 0.25] for n in names}, title=title)
              for title in ("Success rate by chaos level and agent", "Success rate by task and agent")]
    ids = []
    for chart in charts:
        patterns = dict(re.findall(r'<pattern id="([^"]+)"[^>]*>(.*?)</pattern>', chart))
        ids += list(patterns)
        assert len(patterns) == 7  # the first series is plain colour
        assert len({re.sub(r'fill="#[0-9a-f]+"', "", body) for body in patterns.values()}) == 7
        for name in names:  # the bars' fill is the legend's
            bar_fills = set(re.findall(rf'fill="([^"]+)"><title>{name} @', chart))
            (legend,) = re.findall(rf'<rect [^>]*fill="([^"]+)"/><text [^>]*>{name}</text>', chart)
            assert bar_fills == {legend}
    assert len(set(ids)) == 14  # two charts on one page keep their own patterns


def test_chart_bars_label_success_rates_from_the_counts(tmp_path):
    """1 success in 22 episodes is 4.545%: its rate column is rounded to 4 places (0.0455), and the
    bars, labelled from that, read 4.6% in every success chart."""
    import re

    from analytics import report

    def write(store):
        for agent in ("a", "b"):
            for k in range(22):
                outcome = ("success", None) if k == 0 else ("failure", "wrong_decision")
                _episode(store, f"{agent}{k}", [[]], outcome, agent=agent)

    with _warehouse_of(tmp_path, write) as wh:
        data = report.build(wh)
        only_a = report.build(wh, agent="a")
    assert [r["success_rate"] for r in data["compare_agents"]] == [0.0455, 0.0455]
    for built, drawn in ((data, 3), (only_a, 2)):  # agents by chaos, task by chaos, agents; chaos, task
        charts = [c for c in report.charts(built) if 'aria-label="Success rate' in c]
        labels = [re.findall(r"<title>[^<]*: (\d+(?:\.\d+)?%)", c) for c in charts]
        assert len(charts) == drawn and all(labels) and all(set(c) == {"4.5%"} for c in labels), labels


def test_a_percent_axis_shows_its_ticks_as_they_are():
    """An axis to 50% has a tick at 12.5%: rounded half to even it read "12%" beside "38%"."""
    import re

    from analytics import report

    chart = report.bar_chart(["a", "b"], [0.41, 0.2], title="t", zoom=True)  # to a 50% top
    ticks = re.findall(r'fill="#666">([^<]+)</text>', chart)
    assert ticks == ["50%", "37.5%", "25%", "12.5%", "0%"], ticks


def _blind_declines(url: str, seeds: range) -> dict[int, int]:
    """License renewals commented on and closed without a read, judged by rules versions 1 and 2;
    returns the successes per version, as each episode ended."""
    from companyos.env import CompanyEnv

    successes = {1: 0, 2: 0}
    with CompanyEnv(url, agent="blind") as env:
        for rules in successes:
            for seed in seeds:
                env.reset(seed=seed, options={"task": "license_renewal", "chaos": "none", "rules": rules})
                ticket = env.runtime.state.target["ticket"]
                for params in ({"ticket_id": ticket, "text": "no"},
                               {"ticket_id": ticket, "field": "status", "value": "closed"}):
                    if not env.state["done"]:
                        env.step({"app": "ticketdesk", "params": params,
                                  "method": "add_comment" if "text" in params else "update_ticket"})
                successes[rules] += env.state["outcome"] == "success"
    return successes


def test_episodes_judged_by_each_rules_version_are_told_apart(tmp_path):
    from analytics import report

    url = f"sqlite:///{tmp_path / 'store.db'}"
    successes = _blind_declines(url, range(30))
    assert successes[1] > 0 == successes[2]  # a blind decline succeeds under version 1 alone
    with Warehouse(tmp_path / "w.duckdb") as wh:
        sync(url, wh)
        assert dict(wh.con.execute("SELECT rules, count(*) FROM episodes GROUP BY rules").fetchall()) \
            == {1: 30, 2: 30}
        for rules, expected in successes.items():
            rows = service.run_named(wh, "success_by_task_and_chaos", {"rules": rules})
            assert sum(r["successes"] for r in rows) == expected
            agents = service.run_named(wh, "compare_agents", {"rules": str(rules)})  # text, as a URL gives it
            assert sum(r["episodes"] for r in agents) == 30
        mixed = report.build(wh)
        assert "rules versions 1 and 2" in mixed["notes"]["summary"]
        assert "rules versions 1 and 2" in report.to_markdown(mixed) and "--rules" in report.to_html(mixed)
        one = report.build(wh, rules=" 1 ")
        assert one["filters"] == {"rules": 1}
        assert one["notes"]["summary"] == "These episodes were judged by rules version 1."
        assert one["summary"]["successes"] == successes[1] and "rules=1" in report.report_title(one)
        for bad, said in (("0", "no rules version 0; the versions are 1, 2, 3, 4"),  # answered with no rows
                          ("9", "no rules version 9; the versions are 1, 2, 3, 4"),  # before, as a typo
                          ("+1", "rules must be a whole number, one of the versions 1, 2, 3, 4, not '+1'"),
                          ("1.0", "rules must be a whole number, one of the versions 1, 2, 3, 4, not '1.0'")):
            said = f"'rules': {re.escape(said)}"
            with pytest.raises(QueryError, match=said):
                service.run_named(wh, "failure_modes", {"rules": bad})
        compared = service.run_named(wh, "compare_agents")
        assert [(r["agent"], r["rules"]) for r in compared] == [("blind", [1, 2])]
    for bad, said in (("5", "no rules version 5; the versions are 1, 2, 3, 4"),
                      ("one", "rules must be a whole number, one of the versions 1, 2, 3, 4, not 'one'"),
                      (0, "no rules version 0; the versions are 1, 2, 3, 4")):
        with pytest.raises(ValueError, match=re.escape(said)):
            report.check_filters(None, None, rules=bad)


def test_a_warehouse_derived_by_older_code_is_rebuilt_with_the_columns_now_derived(tmp_path):
    """Derivation version 5 had no `rules` column: the sync finds the older version, makes the
    tables anew and fills them, where emptying them kept the old columns."""
    url = f"sqlite:///{tmp_path / 'store.db'}"
    _blind_declines(url, range(4))
    with Warehouse(tmp_path / "fresh.duckdb") as wh:
        sync(url, wh)
        fresh = {name: wh.con.execute(sql).fetchall() for name, sql in TABLES.items()}
    with Warehouse(tmp_path / "old.duckdb") as wh:
        sync(url, wh)
        wh.con.execute("ALTER TABLE episodes DROP COLUMN rules")
        wh.con.execute("UPDATE sync_state SET value = '5' WHERE key = 'derive_version'")
    with Warehouse(tmp_path / "old.duckdb") as wh:
        sync(url, wh)
        assert {name: wh.con.execute(sql).fetchall() for name, sql in TABLES.items()} == fresh
        assert wh.state()["derive_version"] == str(DERIVE_VERSION)


def test_a_warehouse_derived_by_newer_code_is_refused_not_rebuilt_back(tmp_path):
    """Older code rebuilt any warehouse of another derivation version, a newer one's too: two
    versions of companyos sharing a warehouse rebuilt it back and forth, each sync a full one."""
    from analytics.warehouse import WarehousePathError

    url = f"sqlite:///{tmp_path / 'store.db'}"
    _blind_declines(url, range(3))
    newer = str(DERIVE_VERSION + 1)
    with Warehouse(tmp_path / "w.duckdb") as wh:
        sync(url, wh)
        wh.con.execute("UPDATE sync_state SET value = ? WHERE key = 'derive_version'", [newer])
        before = {name: wh.con.execute(sql).fetchall() for name, sql in TABLES.items()}
    _blind_declines(url, range(3, 5))  # something new to sync
    with Warehouse(tmp_path / "w.duckdb") as wh:
        with pytest.raises(WarehousePathError, match=f"derived by a newer companyos .*version {newer}"):
            sync(url, wh)
        assert {name: wh.con.execute(sql).fetchall() for name, sql in TABLES.items()} == before
        assert wh.state()["derive_version"] == newer


def test_the_report_says_when_its_mean_return_mixes_reward_profiles(tmp_path):
    """A sparse episode's return is on another scale than a default one's; the report pooled them
    into one mean return without a word (it warns of mixed rules versions)."""
    from analytics import report

    def write(store):
        _episode(store, "dense", [[]], ("success", None), profile="default", total_return=3.0)
        _episode(store, "sparse", [[]], ("success", None), profile="sparse", total_return=1.0)
        _episode(store, "running", [[]], None, profile="other")  # not finished: not in the mean

    with _warehouse_of(tmp_path, write) as wh:
        mixed = report.build(wh)
        one = report.build(wh, profile="sparse")
    said = "They were scored by reward profiles default and sparse, whose returns are on different scales"
    assert said in mixed["notes"]["summary"] and said in report.to_markdown(mixed)
    assert mixed["notes"]["summary"].startswith("These episodes were judged by rules version 1. ")
    assert "--profile" in report.to_html(mixed) and "reward_profiles" not in mixed["summary"]
    assert one["notes"]["summary"] == "These episodes were judged by rules version 1."


def test_an_old_literal_unknown_label_is_one_agent_with_the_unlabelled_in_compare_agents(tmp_path):
    """Releases before the label was refused logged "(unknown)" as an agent's name; every filter
    pools it with the unlabelled episodes, but compare_agents listed two "(unknown)" rows, and the
    report's note read "do not tell (unknown) apart from (unknown)"."""
    def write(store):
        for n, agent in enumerate((None, None, "(unknown)", "real")):
            _episode(store, f"e{n}", [[]], ("success", None) if n % 2 else ("failure", "wrong_approver"),
                     agent=agent, seed=n)

    with _warehouse_of(tmp_path, write) as wh:
        rows = service.run_named(wh, "compare_agents", {})
        alike = service.run_named(wh, "success_by_task_and_chaos", {"agent": "(unknown)"})
    assert sorted((r["agent"], r["episodes"], r["successes"]) for r in rows) == [("(unknown)", 3, 1),
                                                                              ("real", 1, 1)]
    unknown = next(r for r in rows if r["agent"] == "(unknown)")
    assert unknown["top_failure_mode"] == "wrong_approver"
    assert sum(r["episodes"] for r in alike) == unknown["episodes"]  # as the filter counts them
