"""The 95% Wilson interval beside every success rate: right, the same in SQL and Python, and read
for the user where agents are compared."""

from __future__ import annotations

import re

import pytest

from analytics import report
from analytics.intervals import wilson_interval
from analytics.warehouse import Warehouse


@pytest.mark.parametrize(("successes", "trials", "interval"), [
    # Newcombe (1998), "Two-sided confidence intervals for the single proportion", table I
    (81, 263, (0.2553, 0.3662)), (15, 148, (0.0624, 0.1605)), (0, 20, (0.0, 0.1611)),
    (1, 29, (0.0061, 0.1718)),
    (10, 10, (0.7225, 1.0)),  # all successes: the interval still says how few they are
])
def test_wilson_interval_matches_published_values(successes, trials, interval):
    assert wilson_interval(successes, trials) == interval


def test_no_trials_have_no_interval():
    assert wilson_interval(0, 0) == (None, None)


def test_sql_macros_give_the_python_bounds_to_the_last_place(tmp_path):
    """The named queries compute the interval in DuckDB and the report sums some rates in Python:
    one success rate must not get two intervals."""
    cases = [(s, n) for n in range(61) for s in range(n + 1)]
    cases += [(s, n) for n in (999, 1000, 1001, 123_457, 1_000_000) for s in (0, 1, n // 3, n // 2, n - 1, n)]
    with Warehouse(tmp_path / "w.duckdb") as wh:
        rows = wh.con.execute(
            "SELECT s, n, success_rate_low(s, n), success_rate_high(s, n), "
            "success_rate_low(s, n, instances := n // 3), success_rate_high(s, n, instances := n // 3) "
            "FROM (SELECT unnest($s::BIGINT[]) AS s, unnest($n::BIGINT[]) AS n)",
            {"s": [s for s, _ in cases], "n": [n for _, n in cases]}).fetchall()
    assert len(rows) == len(cases)
    for s, n, low, high, low3, high3 in rows:
        assert (low, high) == wilson_interval(s, n), (s, n)
        assert (low3, high3) == wilson_interval(s, n, n // 3), (s, n)
        if n // 3:
            assert low3 <= low and high <= high3  # fewer instances, a wider interval
        if n:
            assert 0.0 <= low <= round(s / n, 4) <= high <= 1.0


def _agent(name: str, successes: int, episodes: int, instances: int | None = None) -> dict:
    low, high = wilson_interval(successes, episodes, instances)
    return {"agent": name, "episodes": episodes, "instances": instances or episodes,
            "successes": successes, "success_rate": round(successes / episodes, 4),
            "success_rate_low": low, "success_rate_high": high}


def _report(*agents: dict, chaos: dict[str, dict] | None = None) -> dict:
    """Report data over `agents`, each at chaos 0.5 unless `chaos` spreads its episodes."""
    spread = chaos or {a["agent"]: {0.5: a["episodes"]} for a in agents}
    return {"compare_agents": list(agents),
            "success_by_agent_and_chaos": [{"agent": agent, "chaos": level, "episodes": n}
                                           for agent, levels in spread.items()
                                           for level, n in levels.items()],
            "success_by_agent_and_task": [{"agent": a["agent"], "task": "t", "episodes": a["episodes"]}
                                          for a in agents]}


def test_the_agents_note_names_those_the_episodes_do_not_tell_apart():
    """31 of 50 against 29 of 50 is no ranking; 45 of 50 against 5 of 50 is."""
    note = report.agents_note(_report(_agent("b", 29, 50), _agent("a", 31, 50), _agent("c", 5, 50)))
    assert "do not tell a apart from b: their intervals overlap" in note
    assert "Wilson" in note
    clear = report.agents_note(_report(_agent("weak", 5, 50), _agent("strong", 45, 50)))
    assert "strong's interval overlaps no other agent's: its lead is beyond the intervals" in clear
    assert report.agents_note(_report(_agent("alone", 5, 50))) is None


def test_a_seed_run_again_does_not_narrow_the_interval():
    """Ten runs of the same 40 seeds by a deterministic agent are 40 instances, not 400 trials:
    counted as 400, two agents with the same flaw read as told apart."""
    once = wilson_interval(24, 40)
    assert wilson_interval(240, 400, instances=40) == once
    assert wilson_interval(240, 400) != once
    a, b = _agent("a", 300, 400, instances=40), _agent("b", 240, 400, instances=40)
    assert "do not tell a apart from b" in report.agents_note(_report(a, b))


def test_agents_run_at_different_chaos_levels_are_not_ranked():
    """An agent run only at chaos none is not ahead of one run only at high."""
    easy, hard = _agent("easy", 45, 50), _agent("hard", 5, 50)
    note = report.agents_note(_report(easy, hard, chaos={"easy": {0.0: 50}, "hard": {0.75: 50}}))
    assert "ran at chaos levels in different proportions" in note and "beyond the intervals" not in note
    # the same levels in like proportions are like episodes
    alike = {"easy": {0.0: 25, 0.75: 25}, "hard": {0.0: 27, 0.75: 23}}
    assert "beyond the intervals" in report.agents_note(_report(easy, hard, chaos=alike))
    # exactly 10 points apart is not more than 10 (as floats, 4/10 - 3/10 was)
    ten = {"easy": {0.0: 4, 0.75: 6}, "hard": {0.0: 3, 0.75: 7}}
    assert "beyond the intervals" in report.agents_note(_report(_agent("easy", 9, 10), _agent("hard", 0, 10),
                                                                chaos=ten))
    unlike = {"easy": {0.0: 40, 0.75: 10}, "hard": {0.0: 10, 0.75: 40}}
    assert "different proportions" in report.agents_note(_report(easy, hard, chaos=unlike))


def test_the_agents_chart_draws_each_interval_as_a_whisker():
    agents = [_agent("a", 31, 50), _agent("b", 29, 50), _agent("c", 0, 20)]
    data = {"success_by_chaos": [], "success_by_task_and_chaos": [], "failure_modes": [],
            "first_mistake_step": [], "compare_agents": agents}
    (chart,) = report.charts(data)
    assert chart.count("<path ") == 3
    assert "a: 62.0% (50 episodes) (95% interval 48.2% to 74.1%)" in chart
    assert "c: 0.0% (20 episodes) (95% interval 0.0% to 16.1%)" in chart
    (chart,) = report.charts({**data, "compare_agents": [_agent("d", 91, 91), _agent("e", 0, 5)]})
    # from the counts, not the columns rounded to 4 places (0.9595 read 96.0%, 0.4345 read 43.5%)
    assert "d: 100.0% (91 episodes) (95% interval 95.9% to 100.0%)" in chart
    assert "e: 0.0% (5 episodes) (95% interval 0.0% to 43.4%)" in chart


def test_runs_summary_rounds_its_rate_and_interval_as_the_report_does(capsys):
    """`:.1%` read 5 of 16 (31.25%) as 31.2%, and the bounds, rounded to 4 places and then to 1,
    read 91 of 91's lower bound (95.9496%) as 96.0%."""
    from types import SimpleNamespace

    from companyos.commands.run import _print_summary

    plan = SimpleNamespace(agent="a", task="all", chaos="medium", rules=4)
    for wins, n, rate, interval in ((5, 16, "31.3%", "14.2% to 55.6%"),
                                    (91, 91, "100.0%", "95.9% to 100.0%")):
        _print_summary(plan, {"episodes": n, "outcomes": {"success": wins, "failure": n - wins},
                              "success_rate": wins / n, "mean_return": 0.0, "std_return": 0.0,
                              "mean_steps": 1.0, "failure_modes": {}})
        table = capsys.readouterr().out
        assert re.search(rf"success rate\s+│\s+{re.escape(rate)} ", table), table
        assert re.search(rf"95% interval\s+│\s+{re.escape(interval)} ", table), table
