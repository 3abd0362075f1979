"""head_to_head: two agents compared seed by seed, with an exact sign test, and the report's use of it."""

from __future__ import annotations

import math
import random
from decimal import ROUND_HALF_UP, Decimal
from fractions import Fraction

import duckdb
import pytest

from analytics import report, service
from analytics.named import QueryError
from analytics.sign_test import SIGN_TEST_MACRO
from analytics.warehouse import ROUND_DECIMAL
from tests.test_analytics import _episode, _warehouse_of


def _exact_p(wins: int, losses: int) -> float:
    """The two-sided sign test's p-value as an exact fraction, rounded half up to 4 places."""
    n, k = wins + losses, min(wins, losses)
    tail = Fraction(sum(math.comb(n, i) for i in range(k + 1)), 2 ** n)
    p = min(Fraction(1), 2 * tail)
    return float((Decimal(p.numerator) / Decimal(p.denominator)).quantize(Decimal("0.0001"), ROUND_HALF_UP))


def _rounded(x: Fraction) -> float:
    return float((Decimal(x.numerator) / Decimal(x.denominator)).quantize(Decimal("0.0001"), ROUND_HALF_UP))


def test_the_sign_test_gives_the_exact_p_value_to_its_last_place():
    """Summed in logarithms, yet equal to the exact rational p-value rounded half up, including
    the half-way ones (6 splits to none: 2/64 = 0.03125 must read 0.0313)."""
    con = duckdb.connect()
    con.execute(ROUND_DECIMAL)
    con.execute(SIGN_TEST_MACRO)
    rows = con.execute("SELECT w, l, sign_test_p(w, l) "
                       "FROM range(0, 121) a(w), range(0, 121) b(l)").fetchall()
    assert len(rows) == 121 * 121
    for wins, losses, p in rows:
        assert p == _exact_p(wins, losses), (wins, losses)
    assert con.execute("SELECT sign_test_p(6, 0)").fetchone()[0] == 0.0313
    assert con.execute("SELECT sign_test_p(0, 0)").fetchone()[0] == 1.0  # no split: nothing to tell


AGENTS = {"a": 0.7, "b": 0.5, "c": 0.6, None: 0.4}
"""Each agent's chance of success on an instance it can pass; None logs no agent at all."""


def _write_episodes(store) -> list[dict]:
    """Four agents over overlapping seeds, two tasks, two chaos levels and 1-3 trials an instance;
    some instances run by one agent only, some episodes still running. Returns what was written."""
    rng = random.Random(20261128)
    written, n = [], 0
    for seed in range(40):
        for task in ("expense_report", "vendor_onboarding"):
            chaos = (0.0, 0.5)[seed % 2]
            hard = rng.random() < 0.3  # an instance no agent passes: the seeds' difficulty
            for agent, skill in AGENTS.items():
                if rng.random() < 0.2:
                    continue  # this agent never ran this instance
                for _ in range(rng.choice((1, 1, 2, 3))):
                    n += 1
                    running = rng.random() < 0.03
                    ok = not hard and rng.random() < skill
                    end = None if running else (("success", None) if ok else ("failure", "wrong_approver"))
                    _episode(store, f"e{n:04}", [[]], end, agent=agent, task=task, seed=seed, chaos=chaos)
                    written.append({"agent": agent or "(unknown)", "task": task, "seed": seed,
                                    "chaos": chaos, "finished": not running, "ok": ok})
    return written


def _tally(written: list[dict], agent: str, other: str, task: str | None) -> dict | None:
    """The head_to_head row of `agent` against `other`, counted from what was written."""
    trials: dict[tuple, list[int]] = {}
    for e in written:
        if e["finished"] and (task is None or e["task"] == task):
            t = trials.setdefault((e["agent"], e["task"], e["seed"], e["chaos"]), [0, 0])
            t[0] += 1
            t[1] += e["ok"]
    pairs = [(Fraction(c, n), Fraction(*trials[(other, *key)][::-1]))
             for (who, *key), (n, c) in trials.items() if who == agent and (other, *key) in trials]
    if not pairs:
        return None
    ahead = sum(x > y for x, y in pairs)
    behind = sum(x < y for x, y in pairs)
    mine, theirs = sum(x for x, _ in pairs) / len(pairs), sum(y for _, y in pairs) / len(pairs)
    return {"agent": agent, "other": other, "task": task or "(all)", "instances": len(pairs),
            "agent_ahead": ahead, "other_ahead": behind, "even": len(pairs) - ahead - behind,
            "agent_success_rate": _rounded(mine), "other_success_rate": _rounded(theirs),
            "difference": _rounded(mine - theirs), "p_value": _exact_p(ahead, behind)}


def test_head_to_head_counts_what_a_tally_of_the_written_episodes_counts(tmp_path):
    written: list[dict] = []
    with _warehouse_of(tmp_path, lambda store: written.extend(_write_episodes(store))) as wh:
        every = service.run_named(wh, "head_to_head", {"agent": "a"})
        against_b = service.run_named(wh, "head_to_head", {"agent": "a", "other": "b"})
        unknown = service.run_named(wh, "head_to_head", {"agent": "(unknown)", "other": "c"})
        one_task = service.run_named(wh, "head_to_head", {"agent": "b", "task": "vendor_onboarding"})
    tasks = ("expense_report", "vendor_onboarding")
    expected = [_tally(written, "a", other, task) for other in ("(unknown)", "b", "c")
                for task in (None, *tasks)]
    assert every == expected
    assert against_b == [r for r in expected if r["other"] == "b"]
    assert unknown == [_tally(written, "(unknown)", "c", task) for task in (None, *tasks)]
    # narrowed to one task: its (all) row is that task's
    assert one_task == [{**_tally(written, "b", other, "vendor_onboarding"), "task": task}
                        for other in ("(unknown)", "a", "c") for task in ("(all)", "vendor_onboarding")]
    # the instances both ran and whose rates split them: some each way, some even
    whole = every[3]
    assert whole["other"] == "b" and whole["agent_ahead"] and whole["other_ahead"] and whole["even"]
    assert whole["agent_ahead"] + whole["other_ahead"] + whole["even"] == whole["instances"]


def test_head_to_head_needs_the_agent_and_says_so(tmp_path):
    with _warehouse_of(tmp_path, _write_episodes) as wh:
        with pytest.raises(QueryError, match="query 'head_to_head' needs parameter 'agent' \\(varchar\\)"):
            service.run_named(wh, "head_to_head", {"other": "b"})
        # an agent that ran nothing has no instance in common with anyone: no rows, not an error
        assert service.run_named(wh, "head_to_head", {"agent": "nobody"}) == []


def _agents_written(results: dict[str, dict[int, bool]]):
    """A writer of one episode per (agent, seed) with the given outcomes, all at one task and level."""
    def write(store):
        for agent, seeds in results.items():
            for seed, ok in seeds.items():
                end = ("success", None) if ok else ("failure", "wrong_approver")
                _episode(store, f"{agent}-{seed}", [[]], end, agent=agent, seed=seed)
    return write


def test_the_report_tells_agents_apart_seed_by_seed_where_the_intervals_overlap(tmp_path):
    """40 of 60 against 30 of 60: the intervals overlap, but on the same 60 seeds b never passed
    one that a failed, and 10 splits to none is no coin toss (p = 0.002)."""
    seeds = range(60)
    paired = {"a": {s: s < 40 for s in seeds}, "b": {s: s < 30 for s in seeds}}
    (tmp_path / "paired").mkdir()
    with _warehouse_of(tmp_path / "paired", _agents_written(paired)) as wh:
        data = report.build(wh)
    (row,) = data["head_to_head"]
    assert row == {"agent": "a", "other": "b", "instances": 60, "agent_ahead": 10, "other_ahead": 0,
                   "even": 50, "agent_success_rate": 0.6667, "other_success_rate": 0.5,
                   "difference": 0.1667, "p_value": 0.002}
    a, b = data["compare_agents"]
    assert a["success_rate_low"] <= b["success_rate_high"]  # the intervals alone cannot tell
    assert "These episodes tell a apart from every other agent" in data["notes"]["compare_agents"]
    assert "Each agent against a, the best-rated" in data["notes"]["head_to_head"]
    assert "Head to head" in report.to_markdown(data) and "Head to head" in report.to_html(data)

    # the same rates on different seeds: no pair, so only the intervals speak, and they overlap
    apart = {"a": {s: s < 40 for s in seeds}, "b": {s: s < 130 for s in range(100, 160)}}
    (tmp_path / "apart").mkdir()
    with _warehouse_of(tmp_path / "apart", _agents_written(apart)) as wh:
        data = report.build(wh)
    assert data["head_to_head"] == []
    assert "No other agent ran an instance" in data["notes"]["head_to_head"]
    assert "do not tell a apart from b: their intervals overlap" in data["notes"]["compare_agents"]


def test_the_report_says_when_the_best_rate_loses_where_the_agents_met(tmp_path):
    """a's higher rate comes from seeds b never ran; on the 20 they share, b passed 10 that a failed."""
    results = {"a": {s: s < 10 or s >= 20 for s in range(60)},
               "b": {**{s: True for s in range(20)}, **{s: False for s in range(100, 140)}}}
    with _warehouse_of(tmp_path, _agents_written(results)) as wh:
        data = report.build(wh)
    (row,) = data["head_to_head"]
    assert (row["agent"], row["other"], row["instances"]) == ("a", "b", 20)
    assert (row["agent_ahead"], row["other_ahead"], row["p_value"]) == (0, 10, 0.002)
    assert "Yet on the instances they share, b did better than a" in data["notes"]["compare_agents"]


def test_head_to_head_over_http_answers_rows_and_refuses_a_missing_agent_in_words(tmp_path):
    from fastapi.testclient import TestClient

    from api.app import create_app
    from api.config import ServerConfig

    url = f"sqlite:///{tmp_path / 'hand.db'}"
    _warehouse_of(tmp_path, _agents_written({"a": {1: True, 2: True}, "b": {1: False, 2: True}})).close()
    with TestClient(create_app(ServerConfig(db=url, warehouse=str(tmp_path / "hand.duckdb")))) as c:
        missing = c.get("/analytics/head_to_head?other=b")
        rows = c.get("/analytics/head_to_head?agent=a&other=b")
    assert missing.status_code == 400
    assert "needs parameter 'agent'" in missing.json()["detail"]
    assert rows.status_code == 200
    assert [(r["task"], r["agent_ahead"], r["other_ahead"], r["even"], r["p_value"])
            for r in rows.json()] == [("(all)", 1, 0, 1, 1.0), ("expense_report", 1, 0, 1, 1.0)]
