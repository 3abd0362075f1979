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
from analytics.sign_test import SIGN_TEST_MACRO, sign_test_p
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
    """The head_to_head row of `agent` against `other`, counted from what was written (in log
    order): on each instance both ran, each side's first m outcomes, m the fewer of their counts."""
    trials: dict[tuple, list[bool]] = {}
    for e in written:
        if e["finished"] and (task is None or e["task"] == task):
            trials.setdefault((e["agent"], e["task"], e["seed"], e["chaos"]), []).append(e["ok"])
    pairs = []
    for (who, *key), mine in trials.items():
        theirs = trials.get((other, *key))
        if who == agent and theirs is not None:
            m = min(len(mine), len(theirs))
            pairs.append((Fraction(sum(mine[:m]), m), Fraction(sum(theirs[:m]), m), m))
    if not pairs:
        return None
    ahead = sum(x > y for x, y, _ in pairs)
    behind = sum(x < y for x, y, _ in pairs)
    mine, theirs = sum(x for x, _, _ in pairs) / len(pairs), sum(y for _, y, _ in pairs) / len(pairs)
    return {"agent": agent, "other": other, "task": task or "(all)", "instances": len(pairs),
            "trials": sum(m for _, _, m in pairs),
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


def _agents_written(results: dict[str, dict[int, bool | list[bool]]]):
    """A writer of an episode per (agent, seed) with the given outcome (a list: one trial each, in
    that order), all at one task and level."""
    def write(store):
        for agent, seeds in results.items():
            for seed, oks in seeds.items():
                for n, ok in enumerate(oks if isinstance(oks, list) else [oks]):
                    end = ("success", None) if ok else ("failure", "wrong_approver")
                    _episode(store, f"{agent}-{seed}-{n}", [[]], end, agent=agent, seed=seed)
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
    assert row == {"agent": "a", "other": "b", "instances": 60, "trials": 60, "agent_ahead": 10,
                   "other_ahead": 0, "even": 50, "agent_success_rate": 0.6667, "other_success_rate": 0.5,
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
    note = data["notes"]["compare_agents"]
    assert "But on the instances they share, b did better than a, beyond chance" in note
    assert "tell a apart" not in note  # the intervals alone would have: 50 of 60 against 20 of 60


def test_alike_agents_run_a_seed_a_different_number_of_times_are_not_told_apart(tmp_path):
    """x and y both pass two thirds of their trials; x ran each seed once, y three times. Rate
    against rate, y's 2/3 on every seed set x "ahead" on its 40 passes and "behind" on its 20
    failures (p = 0.013): alike agents told apart. Each side's first trials, as many as the other
    ran, count: one against one, 10 splits each way."""
    y_first = {s: s < 30 or 40 <= s < 50 for s in range(60)}
    results = {"x": {s: s < 40 for s in range(60)},
               "y": {s: [True, True, False] if y_first[s] else [False, True, True] for s in range(60)}}
    with _warehouse_of(tmp_path, _agents_written(results)) as wh:
        (row,) = service.run_named(wh, "head_to_head", {"agent": "x", "other": "y"})[:1]
        data = report.build(wh)
    assert (row["instances"], row["trials"], row["agent_ahead"], row["other_ahead"]) == (60, 60, 10, 10)
    assert (row["p_value"], row["agent_success_rate"], row["other_success_rate"]) == (1.0, 0.6667, 0.6667)
    assert "do not tell x apart from y" in data["notes"]["compare_agents"]


def test_a_few_shared_seeds_do_not_overrule_intervals_far_apart(tmp_path):
    """a passes 95 of its own 100 seeds, b 5 of its own 100; they share 3 (a ahead on all, p =
    0.25). The note said the episodes do not tell them apart: both must leave them alike."""
    results = {"a": {**{s: s < 95 for s in range(100)}, **{s: True for s in range(500, 503)}},
               "b": {**{s: s < 205 for s in range(200, 300)}, **{s: False for s in range(500, 503)}}}
    with _warehouse_of(tmp_path, _agents_written(results)) as wh:
        data = report.build(wh)
    assert data["head_to_head"][0]["p_value"] == 0.25
    assert "tell a apart from every other agent" in data["notes"]["compare_agents"]


def test_the_note_decides_on_the_unrounded_p_value_and_corrects_for_several_comparisons(tmp_path):
    """150 splits to 117 is p = 0.049983, shown as 0.05 and then read as "not below 0.05"; and two
    comparisons at p = 0.039 each are not both beyond chance once made at once (Holm)."""
    near = {"a": {s: s < 150 for s in range(300)},
            "b": {s: 150 <= s < 267 for s in range(300)}}
    (tmp_path / "near").mkdir()
    with _warehouse_of(tmp_path / "near", _agents_written(near)) as wh:
        data = report.build(wh)
    (row,) = data["head_to_head"]
    assert (row["agent_ahead"], row["other_ahead"], row["p_value"]) == (150, 117, 0.05)
    a, b = data["compare_agents"]
    assert b["success_rate_high"] >= a["success_rate_low"]  # the intervals alone cannot tell
    assert "tell a apart from every other agent" in data["notes"]["compare_agents"]

    # b and c each lose 8 splits to 1 against a: p = 0.039 alone, but not below 0.05 / 2
    seeds = range(60)
    results = {"a": {s: s < 40 for s in seeds},
               "b": {s: s < 32 or s == 59 for s in seeds}, "c": {s: s < 32 or s == 58 for s in seeds}}
    (tmp_path / "holm").mkdir()
    with _warehouse_of(tmp_path / "holm", _agents_written(results)) as wh:
        data = report.build(wh)
    assert [(r["other"], r["agent_ahead"], r["other_ahead"], r["p_value"])
            for r in data["head_to_head"]] == [("b", 8, 1, 0.0391), ("c", 8, 1, 0.0391)]
    assert "do not tell a apart from b and c" in data["notes"]["compare_agents"]
    assert "Holm's correction for the 2 comparisons" in data["notes"]["head_to_head"]


def test_the_sign_test_refuses_counts_that_are_no_counts():
    con = duckdb.connect()
    con.execute(ROUND_DECIMAL)
    con.execute(SIGN_TEST_MACRO)
    assert con.execute("SELECT sign_test_p(NULL, 5), sign_test_p(-1, 5), sign_test_p(2.5, 3), "
                       "sign_test_p(4, 0.0)").fetchone() == (None, None, None, 0.125)
    assert sign_test_p(150, 117) == pytest.approx(0.049983176, abs=1e-9)  # unrounded, as scipy's
    assert sign_test_p(0, 0) == 1.0


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
