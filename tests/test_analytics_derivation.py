"""Every row and column the sync derives equals a plain-Python derivation from the store's events
(tests/derivation_oracle.py), over real episodes of every agent, chaos level, reward profile and
durability, synced in one batch or cut into many."""

from __future__ import annotations

import pytest

from analytics import synthetic
from analytics.sync import sync
from analytics.warehouse import Warehouse
from companyos.batch import RunPlan
from companyos.batch import run as run_plan
from domain import CURRENT_RULES
from eventstore import EventStore
from tests import derivation_oracle as oracle
from tests.test_analytics import _episode as hand_written
from tests.test_analytics import _mistake as mistake

QUERIES = {
    "steps": f"SELECT {', '.join(oracle.STEP_COLUMNS)} FROM steps ORDER BY position",
    "episodes": f"SELECT {', '.join(oracle.EPISODE_COLUMNS)} FROM episodes ORDER BY episode_id",
    "rewards": f"SELECT {', '.join(oracle.REWARD_COLUMNS)} FROM rewards ORDER BY episode_id, rule",
}


@pytest.fixture(scope="module")
def store_url(tmp_path_factory):
    """Episodes as `companyos run` logs them (per-step commits among them, so episodes straddle
    batches), synthetic ones whose appends cut steps in half and episodes left open, and two
    hand-written ones for cases the others do not reach."""
    url = f"sqlite:///{tmp_path_factory.mktemp('derive') / 'companyos.db'}"
    for agent, chaos, n, seed, durability, profile, rules in (
            ("random", "high", 40, 0, "step", "default", None),
            ("expert", "medium", 30, 0, "episode", "default", None),
            ("random", "medium", 30, 500, "episode", "sparse", 1),
            ("noop", "low", 10, 900, "step", "default", None),
            ("expert", "high", 20, 40, "step", "sparse", 1),
            ("random", "low", 20, 60, "episode", "default", None)):
        run_plan(RunPlan(url, agent, "all", chaos, n, seed, durability, profile, rules), workers=1)
    with EventStore.open(url) as store:
        for i, ep in enumerate(synthetic.episodes(40, seed=3, start=0)):
            events = ep.events if i % 5 else ep.events[: len(ep.events) // 2]  # every fifth left open
            for cut in range(0, len(events), 7):
                store.append(ep.episode_id, events[cut:cut + 7], None if cut == 0 else cut - 1)
        # two mistakes in one step (the step names the first), and a failure decided by the
        # irreversible one of two mistakes of its mode (the lead-in ends there, not at the first)
        twice = [mistake("wrong_decision", "T-1"), mistake("stale_data_used", "T-1")]
        hand_written(store, "two-mistakes", [twice], ("truncated", "stale_data_used"))
        late = [[mistake("irreversible_action", "T-1")],
                [mistake("irreversible_action", "T-1", irreversible=True)], [], []]
        hand_written(store, "decided-late", late, ("failure", "irreversible_action"))
    return url


@pytest.fixture(scope="module")
def expected(store_url) -> dict[str, list[tuple]]:
    return oracle.derive(store_url)


def warehouse_rows(url: str, path, batch_events: int) -> dict[str, list[tuple]]:
    with Warehouse(path) as wh:
        result = sync(url, wh, batch_events=batch_events)
        rows = {name: wh.con.execute(sql).fetchall() for name, sql in QUERIES.items()}
    return {"batches": result.batches, **rows}


@pytest.mark.parametrize("batch_events", [1_000_000, 2_003], ids=["one batch", "many batches"])
def test_every_derived_row_equals_a_derivation_in_python(store_url, expected, tmp_path, batch_events):
    got = warehouse_rows(store_url, tmp_path / "w.duckdb", batch_events)
    assert (got["batches"] == 1) == (batch_events == 1_000_000)
    for table in ("episodes", "steps", "rewards"):
        assert len(got[table]) == len(expected[table]), table
        for row, want in zip(got[table], expected[table], strict=True):
            assert row == want, f"{table}: warehouse {row} != python {want}"


def test_the_episodes_cover_what_the_derivation_must_handle(expected):
    """The store holds each case the rules distinguish, so the comparison above means something."""
    steps, episodes = expected["steps"], expected["episodes"]
    column = {name: i for i, name in enumerate(oracle.STEP_COLUMNS)}
    assert any(not s[column["accepted"]] for s in steps)  # rejected actions
    assert any(s[column["mistake"]] for s in steps)
    assert any(s[column["chaos_now"]] for s in steps) and any(s[column["chaos_active"]] for s in steps)
    assert any(s[column["tool"]] == "(malformed)" for s in steps)
    e = {name: i for i, name in enumerate(oracle.EPISODE_COLUMNS)}
    outcomes = {ep[e["outcome"]] for ep in episodes}
    assert {"success", "failure", "truncated", None} <= outcomes  # None: left open
    assert any(ep[e["lead_in"]] for ep in episodes if ep[e["outcome"]] in ("failure", "truncated"))
    assert {ep[e["reward_profile"]] for ep in episodes} >= {"default", "sparse"}
    # runs at each version, synthetic ones name none
    assert {ep[e["rules"]] for ep in episodes} == {1, CURRENT_RULES}
