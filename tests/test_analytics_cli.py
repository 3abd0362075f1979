"""Analytics over real environment episodes: the warehouse agrees with `companyos run`, and the
CLI, the report, the Parquet export and the HTTP route work end to end."""

from __future__ import annotations

import contextlib
import html
import json
import math
import os
import pathlib
import re
import shutil
import signal
import sqlite3
import stat
import subprocess
import sys
import time

import duckdb
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from analytics.export import MARKER
from analytics.sync import sync
from analytics.warehouse import Warehouse
from api.analytics_routes import analytics_router
from companyos.batch import RunPlan
from companyos.batch import run as run_plan
from companyos.commands import analytics as commands
from domain import CURRENT_RULES, FAILURE_MODES
from eventstore import EventStore
from eventstore.engine import normalise_url
from tests.conftest import command_runner, live_server, start_slow_sync


@pytest.fixture(scope="module")
def logged(tmp_path_factory):
    """A store with episodes of three agents, as `companyos run` logs them, and what run reported."""
    url = f"sqlite:///{tmp_path_factory.mktemp('real') / 'companyos.db'}"
    results = []
    for agent, chaos, n, seed in (("random", "medium", 60, 0), ("expert", "high", 60, 0),
                                  ("noop", "low", 20, 100), ("expert", "high", 60, 0)):
        results += run_plan(RunPlan(url, agent, "all", chaos, n, seed, "episode"), workers=1)
    return url, [r.to_json() for r in results]


@pytest.fixture(scope="module")
def cli():
    return command_runner(commands.register, "analytics")


def test_warehouse_agrees_with_what_run_reported(logged, tmp_path):
    url, reported = logged
    with Warehouse(tmp_path / "w.duckdb") as wh:
        sync(url, wh, batch_events=3_001)
        rows = {r[0]: r[1:] for r in wh.con.execute(
            "SELECT episode_id, task, seed, chaos, agent, outcome, failure_mode, steps, total_return, digest "
            "FROM episodes").fetchall()}
        assert len(rows) == len(reported)
        for r in reported:
            assert rows[r["episode_id"]] == (r["task"], r["seed"], r["chaos"], r["agent"], r["outcome"],
                                             r["failure_mode"], r["steps"], r["return"], r["digest"])
        # exactly one failure mode for every non-success, none for a success
        assert wh.con.execute("SELECT count(*) FROM episodes WHERE (outcome = 'success') = "
                              "(failure_mode IS NOT NULL)").fetchone()[0] == 0
        steps = wh.con.execute("SELECT count(*) FROM steps").fetchone()[0]
        assert steps == sum(r["steps"] for r in reported)
        # the return is the sum of the step rewards
        assert wh.con.execute("SELECT count(*) FROM episodes e JOIN (SELECT episode_id, sum(reward) AS r "
                              "FROM steps GROUP BY 1) s USING (episode_id) "
                              "WHERE abs(e.total_return - s.r) > 1e-6").fetchone()[0] == 0


def test_run_and_compare_agents_state_one_spread_of_returns(tmp_path):
    """`run` gave the population deviation of the returns, compare_agents the sample one."""
    from analytics.service import run_named
    from companyos.batch import summarise

    url = f"sqlite:///{tmp_path / 's.db'}"
    results = run_plan(RunPlan(url, "random", "all", "medium", 30, 5, "episode"), workers=1)
    said = summarise(results)
    with Warehouse(tmp_path / "w.duckdb") as wh:
        sync(url, wh)
        (row,) = run_named(wh, "compare_agents")
    std = row["std_return"]
    assert said["std_return"] > 0 and std == pytest.approx(said["std_return"], abs=5e-4)


def test_run_and_the_queries_state_one_interval_of_the_success_rate(tmp_path):
    """`run`'s summary, compare_agents and success_by_task_and_chaos bound a success rate by the
    same 95% Wilson interval of the same counts."""
    from analytics.intervals import wilson_interval
    from analytics.service import run_named
    from companyos.batch import summarise

    url = f"sqlite:///{tmp_path / 's.db'}"
    said = {agent: summarise(run_plan(RunPlan(url, agent, "all", "low", n, seed, "episode"), workers=1))
            for agent, n, seed in (("expert", 12, 0), ("random", 23, 100))}
    with Warehouse(tmp_path / "w.duckdb") as wh:
        sync(url, wh)
        agents = run_named(wh, "compare_agents")
        cells = run_named(wh, "success_by_task_and_chaos")
    assert [r["agent"] for r in agents] == ["expert", "random"]
    for row in agents:
        summary = said[row["agent"]]
        wins = summary["outcomes"].get("success", 0)
        bounds = wilson_interval(wins, summary["episodes"])
        assert (summary["success_rate_low"], summary["success_rate_high"]) == bounds
        assert (row["success_rate_low"], row["success_rate_high"]) == bounds
    assert len(cells) == 5 and any(0 < c["successes"] < c["episodes"] for c in cells)
    for cell in cells:  # both agents pooled per task
        assert (cell["success_rate_low"], cell["success_rate_high"]) == wilson_interval(
            cell["successes"], cell["episodes"])


def test_a_seed_run_again_is_one_instance_and_narrows_no_interval(tmp_path):
    """The same 23 seeds run three times by a deterministic agent are 23 instances: counted as 69
    independent trials, the interval narrowed with every rerun of the very same episodes."""
    from analytics.intervals import wilson_interval
    from analytics.service import run_named

    url = f"sqlite:///{tmp_path / 's.db'}"
    for agent in ("random", "random", "random", "expert"):
        run_plan(RunPlan(url, agent, "all", "low", 23, 100, "episode"), workers=1)
    with Warehouse(tmp_path / "w.duckdb") as wh:
        sync(url, wh)
        agents = {r["agent"]: r for r in run_named(wh, "compare_agents")}
        once = wh.con.execute("SELECT count(*) FILTER (WHERE outcome = 'success') FROM episodes "
                              "WHERE agent = 'expert'").fetchone()[0]
    random, expert = agents["random"], agents["expert"]
    assert (random["episodes"], random["instances"]) == (69, 23)
    assert (expert["episodes"], expert["instances"]) == (23, 23)
    assert random["chaos_levels"] == expert["chaos_levels"] == [0.25]
    wins = random["successes"]
    assert wins % 3 == 0 and (random["success_rate_low"], random["success_rate_high"]) == \
        wilson_interval(wins // 3, 23)  # as one run of those seeds
    assert (expert["success_rate_low"], expert["success_rate_high"]) == wilson_interval(once, 23)


def test_the_report_sets_repeated_trials_side_by_side_as_pass_hat_k(tmp_path):
    """A flaky agent reads as any agent of its success rate until its trials of one instance are
    set side by side; the report had no place for pass^k. Deterministic agents stay level."""
    from analytics import report

    url = f"sqlite:///{tmp_path / 's.db'}"
    run_plan(RunPlan(url, "expert", "all", "low", 10, 0, "episode"), workers=1)
    with Warehouse(tmp_path / "w.duckdb") as wh:
        sync(url, wh)
        once = report.build(wh)
    assert once["pass_at_k"] == [] and "ran once, so there is no pass^k" in once["notes"]["pass_at_k"]
    for _ in range(3):
        run_plan(RunPlan(url, "random", "all", "low", 10, 100, "episode"), workers=1)
    with Warehouse(tmp_path / "w.duckdb") as wh:
        sync(url, wh)
        data = report.build(wh)
        tally = wh.con.execute("SELECT task, count(*) FILTER (WHERE outcome = 'success') / count(*) "
                               "FROM episodes WHERE agent = 'random' GROUP BY task").fetchall()
    rows = data["pass_at_k"]
    assert {r["agent"] for r in rows} == {"random"} and len(rows) == 5  # the expert ran each seed once
    for r in rows:
        assert (r["instances"], r["instances_left_out"], r["mean_trials"]) == (2, 0, 3)
        assert r["pass^1"] == r["pass^2"] == r["pass^3"] == pytest.approx(dict(tally)[r["task"]], abs=5e-5)
    assert "over the 10 instances run at least twice" in data["notes"]["pass_at_k"]
    assert "## Consistency over repeated trials (pass^k)" in report.to_markdown(data)


def test_query_command_prints_json_csv_and_clear_errors(logged, tmp_path, cli):
    url, reported = logged
    wh = str(tmp_path / "w.duckdb")
    out = cli("query", "failure_modes", "--param", "agent=random", "--format", "json", "--db", url,
              "--warehouse", wh)
    assert out.exit_code == 0, out.output
    rows = json.loads(out.stdout)
    failed = [r for r in reported if r["agent"] == "random" and r["outcome"] != "success"]
    assert sum(r["episodes"] for r in rows) == len(failed)
    assert sum(r["share"] for r in rows) == pytest.approx(1.0, abs=1e-4)
    out = cli("query", "success_by_task_and_chaos", "--format", "csv", "--db", url, "--warehouse", wh)
    assert out.stdout.splitlines()[0] == ("task,chaos,episodes,instances,successes,success_rate,"
                                          "success_rate_low,success_rate_high,mean_return")
    out = cli("query", "--format", "json", "--db", url, "--warehouse", wh)
    listed = json.loads(out.stdout)
    assert {q["name"] for q in listed} >= {"pass_at_k", "chaos_impact"}
    # the list in CSV, a row per query and parameter (it printed the text listing), no other format
    out = cli("query", "--format", "csv", "--db", url, "--warehouse", wh)
    lines = out.stdout.splitlines()
    assert lines[0].startswith("query,description,param_name,param_type,param_required,param_default")
    assert len(lines) == 1 + sum(len(q["params"]) or 1 for q in listed)
    out = cli("query", "--format", "xml", "--db", url, "--warehouse", wh)
    assert out.exit_code == 2 and "--format must be table, json or csv, not 'xml'" in out.output
    assert "(optional)" in cli("query").stdout and "None" not in cli("query").stdout
    out = cli("query", "nope", "--db", url, "--warehouse", wh)
    assert out.exit_code == 2 and "no named query 'nope'" in out.output
    out = cli("query", "pass_at_k", "--param", "k=two", "--db", url, "--warehouse", wh)
    assert out.exit_code == 2 and "'k' must be an integer" in out.output
    out = cli("query", "pass_at_k", "--param", "k", "--db", url, "--warehouse", wh)
    assert out.exit_code == 2 and "NAME=VALUE" in out.output


def test_a_param_without_a_query_name_is_refused_not_ignored(logged, tmp_path, cli):
    """`analytics query -p k=3` (the name forgotten) listed the queries and exited 0, the
    parameter silently dropped: a script reading the output took the list for an answer."""
    url, _ = logged
    out = cli("query", "--param", "k=3", "--db", url, "--warehouse", str(tmp_path / "w.duckdb"))
    assert out.exit_code == 2
    assert "--param needs a query name" in out.output and "pass_at_k" in out.output
    assert not (tmp_path / "w.duckdb").exists()  # refused before any sync


def test_pass_at_k_over_repeated_seeds(logged, tmp_path, cli):
    url, _ = logged
    out = cli("query", "pass_at_k", "--param", "k=2", "--param", "agent=expert", "--format", "json",
              "--db", url, "--warehouse", str(tmp_path / "w.duckdb"))
    rows = json.loads(out.stdout)
    assert {r["k"] for r in rows} == {1, 2}
    assert all(r["mean_trials"] == 2 for r in rows)  # each expert instance ran twice
    assert "note:" not in out.stderr
    # every expert instance ran twice: asking for k=3 answers rows with no instance, and says why
    out = cli("query", "pass_at_k", "--param", "k=3", "--param", "agent=expert",
              "--db", url, "--warehouse", str(tmp_path / "w.duckdb"))
    assert out.exit_code == 0, out.output
    assert ("note: no instance (agent, task, seed, chaos, step budget, reward profile, rules version) "
            "has 3 trials") in out.stderr, out.stderr


def test_head_to_head_says_why_it_has_no_rows(logged, tmp_path, cli):
    """The random agent ran at medium, the expert at high, the noop agent other seeds: they met on
    no instance, and "(no rows)" alone read as a broken query."""
    url, _ = logged
    where = ("--db", url, "--warehouse", str(tmp_path / "w.duckdb"))
    out = cli("query", "head_to_head", "--param", "agent=expert", "--format", "json", *where)
    assert out.exit_code == 0 and json.loads(out.stdout) == []
    assert "note: 'expert' and any other agent ran no instance" in out.stderr
    out = cli("query", "head_to_head", "--param", "agent=expert", "--param", "other=expert", *where)
    assert "note: agent and other both name 'expert'" in out.stderr
    out = cli("query", "head_to_head", "--param", "other=expert", *where)
    assert out.exit_code == 2 and "needs parameter 'agent'" in out.stderr


def test_answers_that_leave_out_logged_events_say_so(fresh_pg_url, tmp_path, cli):
    """On PostgreSQL a transaction held open anywhere in the cluster keeps a sync below it: the
    sync said "synced 0 events" and every answer silently left out the episodes just run."""
    import sqlalchemy as sa

    wh = str(tmp_path / "w.duckdb")
    run_plan(RunPlan(fresh_pg_url, "expert", "all", "none", 2, 0, "episode"))
    assert not json.loads(cli("sync", "--json", "--db", fresh_pg_url, "--warehouse", wh).stdout)["waiting"]
    holder = sa.create_engine(normalise_url(fresh_pg_url))
    try:
        with holder.connect() as conn:
            conn.exec_driver_sql("SELECT pg_current_xact_id()")  # holds the high-water mark
            run_plan(RunPlan(fresh_pg_url, "expert", "all", "none", 2, 100, "episode"))
            out = cli("sync", "--json", "--db", fresh_pg_url, "--warehouse", wh)
            assert json.loads(out.stdout)["waiting"] and json.loads(out.stdout)["tables"]["episodes"] == 2
            assert "are not in the warehouse yet" in out.stderr
            out = cli("query", "compare_agents", "--format", "json", "--db", fresh_pg_url, "--warehouse", wh)
            assert out.exit_code == 0 and "are not in the warehouse yet" in out.stderr
            conn.rollback()
        out = cli("sync", "--json", "--db", fresh_pg_url, "--warehouse", wh)
        assert json.loads(out.stdout)["tables"]["episodes"] == 4 and "not in the warehouse" not in out.stderr
    finally:
        holder.dispose()


def test_sync_sql_report_and_export(logged, tmp_path, cli):
    url, reported = logged
    wh = str(tmp_path / "w.duckdb")
    out = cli("sync", "--json", "--db", url, "--warehouse", wh)
    doc = json.loads(out.stdout)
    assert doc["tables"]["episodes"] == len(reported) and doc["events_synced"] > 0
    out = cli("sql", "SELECT count(*) AS n FROM episodes", "--format", "json", "--db", url, "--warehouse", wh)
    assert json.loads(out.stdout) == [{"n": len(reported)}]
    # a self-join comparing agents: a repeated name kept only the last column's value
    out = cli("sql", "SELECT 1 AS a, 2 AS a, 3 AS a_1, 4 AS a", "--format", "json", "--db", url,
              "--warehouse", wh)
    assert json.loads(out.stdout) == [{"a": 1, "a_2": 2, "a_1": 3, "a_3": 4}]
    # values JSON and CSV have no type for are written as a reader can parse them back, not as
    # Python's repr ("3 days, 0:00:01.500000", b'...', True, Decimal('1.5'))
    typed = ("SELECT INTERVAL 3 DAY + INTERVAL 10 HOUR + INTERVAL 1 MILLISECOND AS i, "
             "'\\x00\\xff'::BLOB AS b, true AS t, {'x': 1.5::DECIMAL(4,1), 'y': [1, 2]} AS s, "
             "{'at': TIMESTAMP '2024-01-01', 'in': INTERVAL 36 HOUR} AS n")
    out = cli("sql", typed, "--format", "json", "--db", url, "--warehouse", wh)
    assert json.loads(out.stdout) == [{"i": "3 days 10:00:00.001", "b": "\\x00\\xFF", "t": True,
                                       "s": {"x": 1.5, "y": [1, 2]},
                                       "n": {"at": "2024-01-01 00:00:00", "in": "P1DT43200S"}}]
    out = cli("sql", typed, "--format", "csv", "--db", url, "--warehouse", wh)
    assert out.stdout.splitlines()[1] == ('3 days 10:00:00.001,\\x00\\xFF,true,"{""x"":1.5,""y"":[1,2]}",'
                                          '"{""at"":""2024-01-01 00:00:00"",""in"":""P1DT43200S""}"')
    # what Python's values lose is kept as DuckDB writes it: an interval's months (a timedelta
    # made a month 30 days), nanoseconds, infinite dates; a 10^9-day interval was a traceback
    kept = ("SELECT INTERVAL 14 MONTH + INTERVAL 3 DAY AS m, 'infinity'::DATE AS d, "
            "'-infinity'::TIMESTAMP AS t, TIMESTAMP_NS '2024-01-01 00:00:00.123456789' AS ns, "
            "INTERVAL 1000000000 DAY AS big, 2 AS m")
    out = cli("sql", kept, "--format", "json", "--db", url, "--warehouse", wh)
    assert json.loads(out.stdout) == [{"m": "1 year 2 months 3 days", "d": "infinity", "t": "-infinity",
                                       "ns": "2024-01-01 00:00:00.123456789",
                                       "big": "1000000000 days", "m_1": 2}]
    out = cli("sql", "SELECT [INTERVAL 1000000000 DAY] AS l", "--db", url, "--warehouse", wh)
    assert out.exit_code == 2 and "no Python equivalent" in out.output and "Traceback" not in out.output
    # a table shows the text the other formats give, not Python's reprs
    out = cli("sql", "SELECT '\\x00\\xff'::BLOB AS b, [1, NULL] AS l, {'at': TIMESTAMP '2024-01-01'} AS s",
              "--db", url, "--warehouse", wh)
    assert "\\x00\\xFF" in out.stdout and "1, NULL" in out.stdout
    assert '{"at":"2024-01-01 00:00:00"}' in out.stdout and "datetime" not in out.stdout
    out = cli("sql", "SELECT * FROM nowhere", "--db", url, "--warehouse", wh)
    assert out.exit_code == 2 and "nowhere" in out.output
    # ad-hoc SQL only reads: a write is refused and the warehouse still agrees with its checkpoint
    for statement in ("DELETE FROM events", "DROP TABLE episodes", "UPDATE steps SET reward = 0"):
        out = cli("sql", statement, "--db", url, "--warehouse", wh)
        assert out.exit_code == 2 and "read-only" in out.output, out.output
    with Warehouse(wh, read_only=True) as opened:
        assert opened.counts()["events"] == opened.checkpoint  # SQLite positions are dense
        assert opened.counts()["episodes"] == len(reported)
    out = cli("report", "--markdown", "--db", url, "--warehouse", wh)
    assert "## Failure modes" in out.stdout and "| failure_mode |" in out.stdout
    page = tmp_path / "report.html"
    out = cli("report", "--html", str(page), "--agent", "random", "--db", url, "--warehouse", wh)
    assert out.exit_code == 0, out.output
    text = page.read_text()
    assert text.count("<svg") >= 3 and "http" not in text.replace('xmlns="http://www.w3.org/2000/svg"', "")
    assert "<a " not in text  # example episode ids are links in the UI only, where they open
    assert "Success rate by chaos level" in text and "Step of the first mistake" in text
    target = tmp_path / "export"
    out = cli("export", str(target), "--db", url, "--warehouse", wh)
    assert out.exit_code == 0, out.output
    assert {p.name for p in (target / "episodes").iterdir()} == {f"task_family={t}" for t in
                                                                 {r["task"] for r in reported}}
    con = duckdb.connect()
    n = con.execute(f"SELECT count(*) FROM read_parquet('{target}/episodes/*/*.parquet', "
                    "hive_partitioning = true)").fetchone()[0]
    assert n == len(reported)
    manifest = json.loads((target / MARKER).read_text())
    assert manifest["tables"]["episodes"]["rows"] == n
    # a second export replaces the first
    assert cli("export", str(target), "--db", url, "--warehouse", wh).exit_code == 0


def test_a_task_filter_naming_no_family_is_refused_not_answered_empty(logged, tmp_path, cli):
    url, _ = logged
    wh = tmp_path / "w.duckdb"
    out = cli("report", "--task", "expens_report", "--markdown", "--db", url, "--warehouse", str(wh))
    assert out.exit_code == 2 and "unknown task 'expens_report'" in out.output, out.output
    assert "expense_report" in out.output and not wh.exists()  # said before any sync
    out = cli("query", "failure_modes", "--param", "task=expens_report", "--db", url, "--warehouse", str(wh))
    assert out.exit_code == 2 and "must be a task family" in out.output, out.output


def test_the_markdown_report_shows_an_agents_label_as_text_where_it_is_rendered(tmp_path, cli):
    """Labels come from any client: `<script>` went into the Markdown as raw HTML, which a
    CommonMark renderer (a notebook, a wiki) emitted as a live element."""
    from markdown_it import MarkdownIt

    from companyos.env import CompanyEnv

    url = f"sqlite:///{tmp_path / 's.db'}"
    label = "<script>alert(1)</script> *bold* `code` [a](b) x|y _e_"
    with CompanyEnv(url, agent=label) as env:
        env.reset(seed=1, options={"max_steps": 1})
        env.step({"app": "ticketdesk", "method": "list_tickets", "params": {}})
    out = cli("report", "--markdown", "--db", url, "--warehouse", str(tmp_path / "w.duckdb"))
    assert out.exit_code == 0, out.output
    rendered = MarkdownIt("commonmark").enable("table").render(out.output)
    assert "<script>" not in rendered and "<em>" not in rendered and "<code>" not in rendered
    assert "<a " not in rendered
    assert "&lt;script&gt;alert(1)&lt;/script&gt; *bold* `code` [a](b) x|y _e_" in rendered
    assert "| step_budget_exhausted |" in out.output  # names with underscores read as they are


def test_a_tool_name_with_control_characters_keeps_the_markdown_tables_whole(tmp_path, cli):
    """Tool names are what the agent sent: `"\r\nCRLF"` as an app split the tool error table's row
    over three lines of Markdown. Control characters are written as escapes."""
    from markdown_it import MarkdownIt

    from companyos.env import CompanyEnv

    url = f"sqlite:///{tmp_path / 's.db'}"
    with CompanyEnv(url) as env:
        env.reset(seed=1, options={"max_steps": 2})
        env.step({"app": "\r\nCRLF", "method": "m|0\n\u2028<b>", "params": {}})
        env.step({"app": "ticketdesk", "method": "list_tickets", "params": {}})
    out = cli("report", "--markdown", "--db", url, "--warehouse", str(tmp_path / "w.duckdb"))
    assert out.exit_code == 0, out.output
    rows = [line for line in out.output.splitlines() if "CRLF" in line]
    assert rows and all(line.startswith("| ") and line.endswith(" |") for line in rows), rows
    assert "\\r\\nCRLF.m\\|0\\n\\u2028\\<b\\>" in rows[0], rows
    tables = MarkdownIt("commonmark").enable("table").render(out.output)
    assert "<b>" not in tables and "\\r\\nCRLF.m|0\\n\\u2028&lt;b&gt;" in tables


def test_an_html_report_to_dash_is_printed_and_no_file_named_dash_is_written(logged, tmp_path, cli,
                                                                             monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = cli("report", "--html", "-", "--db", logged[0], "--warehouse", str(tmp_path / "w.duckdb"))
    assert out.exit_code == 0, out.output
    assert out.stdout.startswith("<!doctype html>") and "<svg" in out.stdout, out.stdout[:200]
    assert not (tmp_path / "-").exists()


def test_an_empty_agent_filter_is_refused_everywhere(logged, tmp_path, cli):
    """An empty --agent (an unset shell variable) listed every episode in `episodes` but gave an
    empty report and empty query rows: no episode has an empty label, so each refuses it."""
    url, _ = logged
    wh = tmp_path / "w.duckdb"
    for agent in ("", "  "):
        out = cli("report", "--agent", agent, "--markdown", "--db", url, "--warehouse", str(wh))
        assert out.exit_code == 2 and "--agent is empty" in out.output, out.output
        assert not wh.exists()  # said before any sync
        out = cli("query", "failure_modes", "--param", f"agent={agent}", "--db", url,
                  "--warehouse", str(wh))
        assert out.exit_code == 2 and "'agent' must be non-empty text" in out.output, out.output
    listed = _companyos("episodes", "--agent", "", "--db", url, cwd=tmp_path)
    assert listed.returncode == 2 and "no episode has that agent" in listed.stderr, listed.stderr
    app = FastAPI()
    app.include_router(analytics_router(url, str(wh)))
    bad = TestClient(app).get("/analytics/failure_modes", params={"agent": ""})
    assert bad.status_code == 400 and "non-empty text" in bad.json()["detail"]


def test_report_and_export_to_places_they_cannot_write_fail_in_words(logged, tmp_path, cli):
    url, _ = logged
    wh = str(tmp_path / "w.duckdb")
    blocker = tmp_path / "blocker"
    blocker.write_text("a file, not a directory")
    out = cli("report", "--html", str(blocker / "report.html"), "--db", url, "--warehouse", wh)
    assert out.exit_code == 1, out.output
    assert f"error: cannot write the report to {blocker / 'report.html'}: {blocker} is a file, " \
           "not a directory" in out.output, out.output  # not the OS's bare "File exists"
    out = cli("export", str(blocker), "--db", url, "--warehouse", wh)
    assert out.exit_code == 2 and "is a file, not a directory" in out.output, out.output
    out = cli("export", str(blocker / "sub"), "--db", url, "--warehouse", wh)
    assert out.exit_code == 1, out.output
    assert f"error: cannot export to {blocker / 'sub'}: {blocker} is a file, not a directory" \
           in out.output, out.output
    foreign = tmp_path / "foreign"
    (foreign / "episodes").mkdir(parents=True)
    out = cli("export", str(foreign), "--db", url, "--warehouse", wh)
    assert out.exit_code == 2 and "did not export" in out.output, out.output
    assert blocker.read_text() == "a file, not a directory"


def test_a_report_never_overwrites_the_store_the_warehouse_or_another_file(logged, tmp_path, cli):
    """`--html companyos.db` (a tab completion away) wrote the report over the event store: every
    episode gone. The same over the warehouse, or any file that is no report."""
    url, _ = logged
    wh = tmp_path / "w.duckdb"
    store = pathlib.Path(url.removeprefix("sqlite:///"))
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes")
    dashboard = tmp_path / "index.html"  # a page of someone's own: HTML, but no report
    dashboard.write_text("<!doctype html><html><head><title>CompanyOS dashboard</title></head></html>")
    assert cli("sync", "--db", url, "--warehouse", str(wh)).exit_code == 0
    for target in (store, wh, notes, dashboard):
        before = target.read_bytes()
        out = cli("report", "--html", str(target), "--db", url, "--warehouse", str(wh))
        assert out.exit_code == 2 and f"--html {target}: it is " in out.output, out.output
        assert target.read_bytes() == before
    page = tmp_path / "report.html"
    for _ in range(2):  # a new file, then the earlier report it replaces
        out = cli("report", "--html", str(page), "--db", url, "--warehouse", str(wh))
        assert out.exit_code == 0 and page.read_text().startswith("<!doctype html"), out.output
    loop = tmp_path / "loop.html"
    loop.symlink_to(loop)  # a link to itself: replaced, as before, not a traceback
    out = cli("report", "--html", str(loop), "--db", url, "--warehouse", str(wh))
    assert out.exit_code == 0 and loop.read_text().startswith("<!doctype html"), out.output
    link = tmp_path / "latest.html"
    link.symlink_to(page)
    page.write_text(page.read_text().replace("</body>", "<p>the last one</p></body>"))
    out = cli("report", "--html", str(link), "--db", url, "--warehouse", str(wh))
    assert out.exit_code == 0 and link.is_symlink() and "the last one" not in page.read_text()
    assert page.read_text().startswith("<!doctype html><html lang='en'><head><meta charset='utf-8'>"
                                       "<meta name='viewport'")  # a phone draws it at its width
    old = tmp_path / "old.html"  # as releases before the language and viewport wrote one
    old.write_text("<!doctype html><html><head><meta charset='utf-8'><title>CompanyOS failure-mode "
                   "report</title></head><body>old</body></html>")
    assert cli("report", "--html", str(old), "--db", url, "--warehouse", str(wh)).exit_code == 0
    assert "old</body>" not in old.read_text()
    (tmp_path / "adir.html").mkdir()  # the caller's path, as a directory for --warehouse is (it was 1)
    out = cli("report", "--html", str(tmp_path / "adir.html"), "--db", url, "--warehouse", str(wh))
    assert out.exit_code == 2 and "adir.html: it is a directory; name a new file" in out.output, out.output
    assert not list(tmp_path.glob(".*.tmp"))  # nothing half-written left behind
    # a link planted where the report was staged (a fixed `.NAME.tmp`): the file it named was
    # overwritten with the report, and the link put in the report's place
    precious = tmp_path / "precious.txt"
    precious.write_text("keep me")
    planted = tmp_path / ".fresh.html.tmp"
    planted.symlink_to(precious)
    fresh = tmp_path / "fresh.html"
    out = cli("report", "--html", str(fresh), "--db", url, "--warehouse", str(wh))
    assert out.exit_code == 0, out.output
    assert precious.read_text() == "keep me" and planted.is_symlink()
    assert not fresh.is_symlink() and fresh.read_text().startswith("<!doctype html")
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o666 & ~umask  # as a plain new file's


def test_a_report_into_a_pipe_is_written_through_and_an_empty_file_only_when_named_html(logged, tmp_path,
                                                                                       cli):
    """`--html` onto a FIFO (or /dev/stdout piped) waited for ever reading it as "an earlier
    report?", and onto a device replaced it with a plain file (as root, /dev/null itself). An empty
    file of any name was replaced, a lock file included."""
    import stat
    import threading

    url, _ = logged
    wh = str(tmp_path / "w.duckdb")
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    read: list[bytes] = []
    reader = threading.Thread(target=lambda: read.append(fifo.read_bytes()), daemon=True)
    reader.start()
    out = cli("report", "--html", str(fifo), "--db", url, "--warehouse", wh)
    reader.join(timeout=60)
    assert out.exit_code == 0, out.output
    assert read and read[0].startswith(b"<!doctype html") and read[0].rstrip().endswith(b"</html>")
    assert stat.S_ISFIFO(fifo.stat().st_mode)  # still the pipe, not a file put in its place
    lock = tmp_path / "store.db-writer.lock"
    lock.touch()
    out = cli("report", "--html", str(lock), "--db", url, "--warehouse", wh)
    assert out.exit_code == 2 and "it is an empty file not named .html" in out.output, out.output
    assert lock.read_bytes() == b""
    disguised = tmp_path / "lock.html"  # judged by the name of the file it would replace
    disguised.symlink_to(lock)
    out = cli("report", "--html", str(disguised), "--db", url, "--warehouse", wh)
    assert out.exit_code == 2 and "it is an empty file not named .html" in out.output, out.output
    assert lock.read_bytes() == b""
    made = tmp_path / "made-by-mktemp.html"
    made.touch()
    out = cli("report", "--html", str(made), "--db", url, "--warehouse", wh)
    assert out.exit_code == 0 and made.read_text().startswith("<!doctype html"), out.output


def _cpu_seconds(pid: int) -> float:
    """User and system CPU a process has used so far (Linux's /proc)."""
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_ctrl_c_stops_a_long_query(logged, tmp_path, stop):
    """A signal reaches Python between bytecodes of the main thread only, and DuckDB looks for one
    only now and then: a cross join went on for ever after Ctrl-C three times in four (SIGTERM
    ended it in silence, exit 143). The query now runs on a thread, and the signal interrupts it."""
    url, _ = logged
    wh = str(tmp_path / "w.duckdb")
    subprocess.run([sys.executable, "-m", "companyos", "analytics", "sync", "--db", url, "--warehouse", wh],
                   check=True, capture_output=True)
    query = subprocess.Popen(
        [sys.executable, "-m", "companyos", "analytics", "sql", "--db", url, "--warehouse", wh,
         "SELECT sum(a.range * b.range) FROM range(1000000) a, range(1000000) b"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        started, deadline = _cpu_seconds(query.pid), time.monotonic() + 120
        while query.poll() is None and _cpu_seconds(query.pid) < started + 4:  # the join is running
            assert time.monotonic() < deadline, "the command used no CPU for two minutes"
            time.sleep(0.2)
        query.send_signal(stop)
        _, err = query.communicate(timeout=60)
    finally:
        query.kill()
    assert query.returncode == 130 and err.strip().splitlines() == ["error: interrupted"], err


def _replace_refused(self, target):
    raise OSError("the rename was refused")


def test_an_export_leaves_out_the_token_hash_of_a_served_episode(tmp_path):
    """The API never shows an episode's token hash; the Parquet export, which gets handed around,
    held it in the events' meta."""
    from analytics import export as exporting
    from api.app import create_app
    from api.config import ServerConfig

    url = f"sqlite:///{tmp_path / 'store.db'}"
    with TestClient(create_app(ServerConfig(db=url))) as c:
        assert c.post("/reset", json={"seed": 4, "agent": "served"}).status_code == 200
    with Warehouse(tmp_path / "w.duckdb") as wh:
        sync(url, wh)
        assert wh.con.execute("SELECT count(*) FROM events WHERE meta LIKE '%token_sha256%'"
                              ).fetchone()[0] == 1  # the store's, kept where the store is
        exporting.export(wh, tmp_path / "out")
    metas = [json.loads(m) for (m,) in duckdb.connect().execute(
        f"SELECT meta FROM read_parquet('{tmp_path / 'out'}/events/*/*.parquet') WHERE meta IS NOT NULL"
    ).fetchall()]
    assert metas and not any("token_sha256" in meta for meta in metas)
    assert {"served"} == {meta["agent"] for meta in metas if "agent" in meta}


def test_an_export_leaves_a_users_own_files_of_look_alike_names(logged, tmp_path):
    """The recovery from a killed export ran in any directory, and took `.steps.backup.tmp` for its
    staging (removed), `.events.mine.old` for a table set aside (swapped in, then removed)."""
    from analytics import export as exporting

    url, _ = logged
    for target in (tmp_path / "new", tmp_path / "exported"):
        target.mkdir()
        if target.name == "exported":
            with Warehouse(tmp_path / "w.duckdb") as wh:
                sync(url, wh)
                exporting.export(wh, target)
        (target / ".steps.2024-backup.tmp").mkdir()
        (target / ".steps.2024-backup.tmp" / "important.txt").write_text("mine")
        (target / ".events.mine.old").mkdir()
        (target / ".events.mine.old" / "data.txt").write_text("mine too")
        (target / f".{exporting.MARKER}.draft.tmp").write_text("a draft")
        with Warehouse(tmp_path / "w.duckdb") as wh:
            sync(url, wh)
            exporting.export(wh, target)
        assert (target / ".steps.2024-backup.tmp" / "important.txt").read_text() == "mine"
        assert (target / ".events.mine.old" / "data.txt").read_text() == "mine too"
        assert (target / f".{exporting.MARKER}.draft.tmp").read_text() == "a draft"
        assert not (target / "events" / "data.txt").exists()


def test_an_export_that_fails_midway_leaves_the_previous_export_and_no_staging(logged, tmp_path,
                                                                                 monkeypatch):
    from analytics import export as exporting

    url, reported = logged
    target = tmp_path / "export"

    def files() -> list[tuple]:  # the inode tells a file swapped in from the one it replaced
        return sorted((p.relative_to(target), p.stat().st_ino) for p in target.rglob("*"))

    with Warehouse(tmp_path / "w.duckdb") as wh:
        sync(url, wh)
        exporting.export(wh, target)
        before = files()
        # the last table fails: the tables before it were swapped in, a mix of two exports under
        # a manifest describing neither
        monkeypatch.setitem(exporting._TABLES, "events",
                            "SELECT *, CASE WHEN version > 3 THEN error('disk gone') ELSE type END "
                            "AS task_family FROM events")
        with pytest.raises(duckdb.Error, match="disk gone"):
            exporting.export(wh, target)
        assert files() == before
        # the manifest cannot be replaced: the tables swapped in are put back, and a first
        # export's are removed (left without a manifest, the next export refused the directory)
        monkeypatch.undo()
        monkeypatch.setattr(exporting.Path, "replace", _replace_refused)
        with pytest.raises(OSError, match="refused"):
            exporting.export(wh, target)
        assert files() == before
        first = tmp_path / "first"
        with pytest.raises(OSError, match="refused"):
            exporting.export(wh, first)
        assert list(first.iterdir()) == []
        monkeypatch.undo()
        exporting.export(wh, first)
        # an export killed mid-swap: its staging left, and a table set aside but not replaced
        (target / ".events.0badc0de.tmp" / "task_family=x").mkdir(parents=True)
        (target / "steps").rename(target / ".steps.0badc0de.old")
        exporting.export(wh, target)
    assert not list(target.glob(".*"))
    n = duckdb.connect().execute(f"SELECT count(*) FROM read_parquet('{target}/steps/*/*.parquet')"
                                 ).fetchone()[0]
    assert n > 0
    # a first export killed among its renames: two tables in place, the rest still staged, its
    # manifest written aside and no marker. The next export refused the directory as another
    # tool's, for good; it is this export's own, and the next one completes it
    killed = tmp_path / "killed"
    killed.mkdir()
    for table in ("episodes", "steps"):
        shutil.copytree(target / table, killed / table)
    shutil.copytree(target / "rewards", killed / ".rewards.0badc0de.tmp")
    shutil.copy(target / exporting.MARKER, killed / f".{exporting.MARKER}.0badc0de.tmp")
    foreign = tmp_path / "foreign"  # a manifest left aside vouches only for the tables it lists
    shutil.copytree(killed, foreign)
    (foreign / "jobs").mkdir()
    shutil.copytree(foreign / "episodes", foreign / "events")
    (foreign / f".{exporting.MARKER}.0badc0de.tmp").write_text('{"tables": {"episodes": {}}}')
    with Warehouse(tmp_path / "w.duckdb") as wh:
        exporting.export(wh, killed)
        with pytest.raises(exporting.ExportRefused, match="did not export"):
            exporting.export(wh, foreign)
    assert not list(killed.glob(".*")) and (killed / exporting.MARKER).exists()
    assert {p.name for p in killed.iterdir()} == {exporting.MARKER, *exporting._TABLES}
    n = duckdb.connect().execute(f"SELECT count(*) FROM read_parquet('{target}/episodes/*/*.parquet')"
                                 ).fetchone()[0]
    assert n == len(reported)


def test_a_filter_with_surrounding_spaces_is_the_filter_throughout_the_report(logged, tmp_path, cli):
    """The sections stripped `--agent "expert "` as every query does, the summary did not: "0
    episodes" above tables of expert episodes. `--task " x"` was refused where the query took it."""
    url, reported = logged
    wh = str(tmp_path / "w.duckdb")
    experts = sum(r["agent"] == "expert" and r["task"] == "expense_report" for r in reported)
    for agent, task in (("expert", "expense_report"), (" expert ", " expense_report\t")):
        out = cli("report", "--markdown", "--agent", agent, "--task", task, "--db", url, "--warehouse", wh)
        assert out.exit_code == 0, out.output
        assert f"{experts} episodes" in out.stdout


def test_the_report_narrows_to_one_chaos_level(logged, tmp_path, cli):
    """`report --chaos` (the queries all took `-p chaos=`, the report did not): every section,
    the summary and the agents compared, counts only that level's episodes; a level that is none
    is refused before any sync."""
    from analytics.report import counted

    url, reported = logged
    wh = tmp_path / "w.duckdb"
    for chaos, number in (("high", 0.8), (" low", 0.25), ("0.5", 0.5)):
        out = cli("report", "--markdown", "--chaos", chaos, "--db", url, "--warehouse", str(wh))
        assert out.exit_code == 0, out.output
        level = [r for r in reported if r["chaos"] == number]
        assert level and re.search(rf"\b{len(level)} episodes", out.stdout), out.stdout
        assert f"chaos={chaos.strip()}" in out.stdout
        agents = {r["agent"] for r in level}
        assert counted(len(agents), "agent") in out.stdout
    out = cli("report", "--chaos", "extreme", "--db", url, "--warehouse", str(tmp_path / "x.duckdb"))
    assert out.exit_code == 2 and "unknown chaos level 'extreme'" in out.output, out.output
    assert not (tmp_path / "x.duckdb").exists()


def test_levels_that_differ_in_the_last_bits_are_shown_apart_and_found_by_what_is_shown(tmp_path, cli):
    """NumPy's linspace gives 0.30000000000000004 where a person types 0.3: two levels, two logs.
    Tables, the Markdown report and its chart showed both alike (as "high (0.8)" here), and a
    filter by what they showed found only one of them."""
    url = f"sqlite:///{tmp_path / 'c.db'}"
    near = math.nextafter(0.8, 1)  # 0.8000000000000002, one bit above "high"
    for chaos, n in (("high", 2), (repr(near), 3)):
        run_plan(RunPlan(url, "expert", "vendor_onboarding", chaos, n, 0, "episode"), workers=1)
    wh = str(tmp_path / "w.duckdb")
    out = cli("query", "success_by_task_and_chaos", "--db", url, "--warehouse", wh)
    assert out.exit_code == 0, out.output
    shown = re.findall(r"│ vendor_onboarding\s+│ (\S+)\s+│ (\d+)", out.stdout)
    assert sorted(shown) == [("0.8", "2"), ("0.8000000000000002", "3")], out.stdout
    for label, episodes in shown:  # what the table shows finds that level, and only it
        out = cli("query", "success_by_task_and_chaos", "--param", f"chaos={label}", "--format", "json",
                  "--db", url, "--warehouse", wh)
        assert [r["episodes"] for r in json.loads(out.stdout)] == [int(episodes)], out.output
    out = cli("report", "--markdown", "--db", url, "--warehouse", wh)
    assert "| 0.8 | 2 |" in out.stdout and "| 0.8000000000000002 | 3 |" in out.stdout, out.stdout
    html = tmp_path / "r.html"
    out = cli("report", "--html", str(html), "--db", url, "--warehouse", wh)
    assert out.exit_code == 0, out.output
    chart = html.read_text().split("<svg", 1)[1].split("</svg>", 1)[0]  # success by chaos level
    assert "high (0.8)" in chart and "0.8000000000000002" in chart, chart
    assert "high (0.8000000000000002)" not in chart, chart


def test_the_report_and_queries_narrow_to_one_reward_profile(tmp_path, cli):
    """The same episodes scored by both profiles: `report --profile` and `-p profile=` count and
    average one profile's episodes, as `run --json` reported them; a profile that is none is
    refused before any sync."""
    url = f"sqlite:///{tmp_path / 's.db'}"
    reported = {profile: [r.to_json() for r in run_plan(
        RunPlan(url, "expert", "all", "medium", 12, 0, "episode", profile), workers=1)]
        for profile in ("default", "sparse")}
    wh = str(tmp_path / "w.duckdb")
    for profile, results in reported.items():
        out = cli("report", "--markdown", "--profile", profile, "--db", url, "--warehouse", wh)
        assert out.exit_code == 0, out.output
        assert re.search(rf"\b{len(results)} episodes", out.stdout) and f"profile={profile}" in out.stdout
        out = cli("query", "compare_agents", "-p", f"profile={profile}", "--format", "json",
                  "--db", url, "--warehouse", wh)
        (row,) = json.loads(out.stdout)
        mean = sum(r["return"] for r in results) / len(results)
        assert row["episodes"] == len(results) and row["mean_return"] == pytest.approx(mean, abs=1e-3)
    assert reported["default"][0]["return"] != reported["sparse"][0]["return"]
    out = cli("report", "--profile", "dense", "--db", url, "--warehouse", str(tmp_path / "x.duckdb"))
    assert out.exit_code == 2 and "no reward profile 'dense'" in out.output, out.output
    assert not (tmp_path / "x.duckdb").exists()
    out = cli("query", "failure_modes", "-p", "profile=dense", "--db", url, "--warehouse", wh)
    assert out.exit_code == 2 and "must be a reward profile (default, sparse)" in out.output, out.output


def test_the_report_narrows_to_one_rules_version_and_says_when_it_mixes_them(tmp_path, cli):
    url = f"sqlite:///{tmp_path / 's.db'}"
    for seed, rules in ((0, 1), (6, None)):
        run_plan(RunPlan(url, "random", "all", "none", 6, seed, "episode", "default", rules), workers=1)
    wh = str(tmp_path / "w.duckdb")
    mixed = f"judged by rules versions 1 and {CURRENT_RULES}"
    out = cli("report", "--db", url, "--warehouse", wh)
    assert out.exit_code == 0 and mixed in " ".join(out.stdout.split())
    out = cli("report", "--markdown", "--rules", "1", "--db", url, "--warehouse", wh)
    assert out.exit_code == 0 and "rules=1" in out.stdout and "6 episodes" in out.stdout, out.output
    assert "rules versions" not in out.stdout
    out = cli("report", "--rules", "9", "--db", url, "--warehouse", str(tmp_path / "x.duckdb"))
    assert out.exit_code == 2 and "no rules version 9; the versions are 1, 2, 3, 4" in out.output, out.output
    assert not (tmp_path / "x.duckdb").exists()
    # a named query pooled them without a word; JSON stays one document on stdout
    out = cli("query", "failure_modes", "--format", "json", "--db", url, "--warehouse", wh)
    assert json.loads(out.stdout) and mixed in out.stderr, out.stderr
    assert "`-p rules=V` keeps one" in out.stderr
    # one version, or each row says which
    for narrowed in (["failure_modes", "-p", f"rules={CURRENT_RULES}"], ["compare_agents"]):
        out = cli("query", *narrowed, "--format", "json", "--db", url, "--warehouse", wh)
        assert out.exit_code == 0 and json.loads(out.stdout) and "rules versions" not in out.stderr
    run_plan(RunPlan(url, "noop", "all", "none", 2, 20, "episode", "default", None), workers=1)
    out = cli("query", "failure_modes", "-p", "agent=noop", "--format", "json",
              "--db", url, "--warehouse", wh)
    assert out.exit_code == 0 and json.loads(out.stdout)[0]["episodes"] == 2
    assert "rules versions" not in out.stderr  # the episodes it covers were judged by one


def test_a_report_over_no_matching_episodes_says_n_a_not_none(logged, tmp_path, cli):
    url, _ = logged
    out = cli("report", "--markdown", "--agent", "nobody", "--db", url,
              "--warehouse", str(tmp_path / "w.duckdb"))
    assert out.exit_code == 0, out.output
    assert "0 episodes" in out.stdout and "success n/a, mean return n/a, mean steps n/a" in out.stdout
    assert "None" not in out.stdout
    page = tmp_path / "empty.html"
    out = cli("report", "--html", str(page), "--agent", "nobody", "--db", url,
              "--warehouse", str(tmp_path / "w.duckdb"))
    assert out.exit_code == 0, out.output
    assert "mean return<b>n/a</b>" in page.read_text() and "None" not in page.read_text()


def _unfit_warehouse(case: str, tmp: pathlib.Path, store: str) -> pathlib.Path:
    """A --warehouse path that cannot hold a warehouse, made as `case` says."""
    if case == "the-sqlite-store":
        return pathlib.Path(shutil.copyfile(store, tmp / "store-copy.db"))
    if case == "not-duckdb":
        (tmp / "junk.duckdb").write_text("not a database")
        return tmp / "junk.duckdb"
    if case == "a-csv-file":  # DuckDB opens a data file as an empty in-memory database
        (tmp / "export.csv").write_text("a,b\n1,2\n")
        return tmp / "export.csv"
    if case == "a-json-file":
        (tmp / "rows.json").write_text('[{"a": 1}]')
        return tmp / "rows.json"
    if case == "a-directory":
        (tmp / "adir").mkdir()
        return tmp / "adir"
    if case == "not-duckdb-under-blocks":  # "lock" in the path is no lock held by another process
        (tmp / "blocks").mkdir()
        (tmp / "blocks" / "w.duckdb").write_text("hi")
        return tmp / "blocks" / "w.duckdb"
    if case == "another-apps-duckdb":  # its own `episodes`: a sync wrote into it, --rebuild emptied it
        con = duckdb.connect(str(tmp / "analysis.duckdb"))
        con.execute("CREATE TABLE episodes AS SELECT 'expert' AS agent, 1.0 AS success_rate")
        con.close()
        return tmp / "analysis.duckdb"
    if case == "another-apps-sync-state":  # a table of that name is not the warehouse's own
        con = duckdb.connect(str(tmp / "jobs.duckdb"))
        con.execute("CREATE TABLE sync_state AS SELECT 1 AS id, 'yesterday' AS last_run")
        con.close()
        return tmp / "jobs.duckdb"
    (tmp / "afile").write_text("x")
    return tmp / "afile" / "w.duckdb"


@pytest.mark.parametrize("case, words", [
    ("the-sqlite-store", "is a SQLite database"), ("not-duckdb", "not a valid DuckDB"),
    ("not-duckdb-under-blocks", "not a valid DuckDB"), ("a-csv-file", "not a valid DuckDB"),
    ("a-json-file", "not a valid DuckDB"),
    ("another-apps-duckdb", "is a DuckDB database of something else, not a CompanyOS warehouse (it "
                            "holds episodes); pass another --warehouse"),
    ("another-apps-sync-state", "is a DuckDB database of something else, not a CompanyOS warehouse "
                                "(it holds sync_state)"),
    ("a-directory", "is a directory"), ("under-a-file", "cannot create the warehouse")])
def test_a_warehouse_path_that_cannot_hold_one_is_refused_and_left_alone(logged, tmp_path, cli, case, words):
    url, _ = logged
    path = _unfit_warehouse(case, tmp_path, url.removeprefix("sqlite:///"))
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    for command in (("query", "failure_modes"), ("sync", "--rebuild"), ("report", "--markdown")):
        out = cli(*command, "--db", url, "--warehouse", str(path))
        assert out.exit_code == 2 and "error: " in out.output and words in out.output, (command, out.output)
    if case == "under-a-file":  # the file in the way is named, not the OS's bare "File exists"
        assert f"{path.parent} is a file, not a directory" in out.output, out.output
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before


@pytest.fixture(scope="module")
def reports(logged, tmp_path_factory):
    """What run reported, and the report built over all its episodes and over the random agent's."""
    from analytics import report

    url, reported = logged
    with Warehouse(tmp_path_factory.mktemp("reports") / "w.duckdb") as wh:
        sync(url, wh)
        return reported, report.build(wh), report.build(wh, agent="random")


def _successes(reported: list[dict], *keys: str) -> list[dict]:
    """Rows of episodes, instances (distinct agent, task, seed and chaos: one profile and rules
    version here), successes, success rate and its interval per distinct value of `keys` in run's
    own report, sorted, as the report's success tables give them."""
    from analytics.intervals import wilson_interval

    tally: dict[tuple, list] = {}
    for r in reported:
        counts = tally.setdefault(tuple(r[k] for k in keys), [0, set(), 0])
        counts[0] += 1
        counts[1].add((r["agent"], r["task"], r["seed"], r["chaos"]))
        counts[2] += r["outcome"] == "success"
    rows = []
    for key, (n, instances, wins) in sorted(tally.items()):
        low, high = wilson_interval(wins, n, len(instances))
        rows.append({**dict(zip(keys, key, strict=True)), "episodes": n, "instances": len(instances),
                     "successes": wins, "success_rate": round(wins / n, 4),
                     "success_rate_low": low, "success_rate_high": high})
    return rows


def test_report_success_by_chaos_agrees_with_what_run_reported(reports):
    reported, data, only_random = reports
    assert data["success_by_chaos"] == _successes(reported, "chaos")
    assert [r["chaos"] for r in only_random["success_by_chaos"]] == [0.5]  # random ran at medium only
    assert data["summary"]["episodes"] == len(reported)


def test_the_report_reads_mechanisms_the_agent_springs_apart_even_for_one_agent_and_level(reports):
    """Narrowed to one agent and one level, as the pooled note advises, a flawed agent that stopped
    before submitting still made random_rejection read as help: those rows get a note of their own."""
    from analytics.report import listed
    from domain.chaos import SPRUNG_BY_THE_AGENT

    _, _, only_random = reports
    assert {r["chaos"] for r in only_random["success_by_chaos"]} == {0.5}
    sprung = [r["mechanism"] for r in only_random["chaos_impact"] if r["mechanism"] in SPRUNG_BY_THE_AGENT]
    assert sprung, "the random agent at medium chaos meets some of them"
    note = only_random["notes"]["chaos_impact"]
    assert note.startswith(f"{listed(sprung)} fire only when the agent makes a call that springs them")
    assert "pool" not in note  # one agent, one level: nothing pooled to warn of


def test_the_report_draws_success_by_chaos_per_agent_when_it_covers_several(reports):
    """The expert ran at high chaos and the random agent at medium: pooled, high chaos read as the
    easier level. Over several agents the report draws (and tabulates) each agent at each level,
    and says which charts pool them; narrowed to one agent it keeps the plain chart."""
    from analytics import report

    reported, data, only_random = reports
    assert data["success_by_agent_and_chaos"] == _successes(reported, "agent", "chaos")
    page = report.to_html(data)
    assert "Success rate by chaos level and agent" in page
    # which tasks each agent fails: a bar per agent at each task, not every agent pooled
    assert data["success_by_agent_and_task"] == _successes(reported, "agent", "task")
    assert "Success rate by task and agent" in page and "Success rate by task and chaos level" not in page
    for agent in ("expert", "random", "noop"):
        assert f">{agent}</text>" in page  # in the chart's legend
    assert "## Success by agent and chaos level" in report.to_markdown(data)
    assert "## Success by agent and task" in report.to_markdown(data)
    levels, note = len(data["success_by_chaos"]), data["notes"]["chaos_impact"]
    assert note.startswith(f"Read with care: these rates pool 3 agents and {levels} chaos levels")
    assert "to one agent and one chaos level" in note and "fire only when the agent makes a call" in note
    assert only_random["success_by_agent_and_chaos"] == []
    assert "pool" not in only_random["notes"]["chaos_impact"]  # one agent at one level
    assert only_random["success_by_agent_and_task"] == []
    page = report.to_html(only_random)
    assert "Success rate by chaos level<" in page and "and agent" not in page
    assert "Success rate by task and chaos level<" in page


def test_the_report_says_what_its_shares_are_of_and_warns_before_a_pooled_table(reports, logged,
                                                                                tmp_path, cli):
    """The first-mistake shares (of episodes with a mistake) were read as shares of every failure;
    the chaos-impact warning came after the numbers, named chaos none where no episode ran at it
    and agents an agent's own report never pooled; the lead-ins into each failure mode were only
    a query away; and an expert's report said "top failure mode none", a mode of that name."""
    from analytics import report
    from analytics.service import run_named

    reported, data, _ = reports
    finished = [r for r in reported if r["outcome"] is not None]
    with_one = sum(r["episodes"] for r in data["first_mistake_step"])
    failed = sum(r["outcome"] != "success" for r in finished)
    assert data["notes"]["first_mistake_step"].startswith(
        f"The shares are of the {with_one:,} finished episodes with a counted mistake, of "
        f"{len(finished):,} finished ({failed:,} not successful)")
    page = report.to_html(data)
    assert f"Step of the first mistake (share of the {with_one} episodes with one)" in page
    markdown = report.to_markdown(data)
    impact = markdown.split("## Chaos impact")[1]
    assert impact.index("Read with care") < impact.index("| mechanism")  # the warning first
    assert "chaos none" not in data["notes"]["chaos_impact"]  # no episode ran at none
    assert "agents it never met" in data["notes"]["chaos_impact"]
    assert "<p class='warning'>Read with care" in page
    url, _ = logged
    with Warehouse(tmp_path / "w.duckdb") as wh:
        sync(url, wh)
        lead_ins = run_named(wh, "actions_before_failure", {"k": 3, "top": 3})
        expert = report.build(wh, agent="expert")
    assert data["actions_before_failure"] == lead_ins and lead_ins
    assert "## Actions leading into each failure mode (the last 3 tools up to the step" in markdown
    assert html.escape(lead_ins[0]["sequence"]) in page
    one_agent = report._pooled_chaos_note(0, {0.0, 0.8})  # one agent's report, over two levels
    assert one_agent.startswith("Read with care: these rates pool 2 chaos levels.")
    assert "those at chaos none (where no mechanism fires) included" in one_agent
    assert "agents it never met" not in one_agent
    # an agent with no failure: said in words, not by sections that vanish
    assert expert["summary"]["successes"] == expert["summary"]["finished"] > 0
    expert_md = report.to_markdown(expert)
    assert (f"## Failure modes (share of non-successful episodes)\n\nNone: all "
            f"{expert['summary']['finished']} finished episodes succeeded.") in expert_md
    assert "No counted mistake in" in expert_md
    assert "top failure mode<b>no failures</b>" in report.to_html(expert)
    assert "<th scope='col'>success_<wbr>rate</th>" in page  # a long column name may break after `_`
    # the terms said where they are read: each mode present with its meaning, the tool columns
    assert [(r["failure_mode"], r["meaning"]) for r in data["failure_mode_meanings"]] == [
        (r["failure_mode"], FAILURE_MODES[r["failure_mode"]]) for r in data["failure_modes"]]
    assert "## What these failure modes mean" in markdown
    assert "chaos_rejections: those a chaos mechanism caused" in data["notes"]["tool_error_rates"]
    out = cli("report", "--db", url, "--warehouse", str(tmp_path / "w.duckdb")).output
    heading, warning = out.index("Chaos impact (success with"), out.index("Read with care")
    assert heading < warning < out.index("┃ mechanism")  # in the terminal too


def test_a_note_lists_three_rules_versions_as_a_list(tmp_path, cli):
    """It read "rules versions 1 and 2 and 4"."""
    from analytics import report

    url = f"sqlite:///{tmp_path / 'three.db'}"
    for rules in (1, 2, 4):
        run_plan(RunPlan(url, "random", "license_renewal", "low", 3, 0, "episode", rules=rules), workers=1)
    out = cli("query", "failure_modes", "--db", url, "--warehouse", str(tmp_path / "w.duckdb"))
    assert out.exit_code == 0, out.output
    assert "judged by rules versions 1, 2 and 4, which" in " ".join(out.output.split())
    with Warehouse(tmp_path / "w.duckdb") as wh:
        assert "judged by rules versions 1, 2 and 4, which" in report.build(wh)["notes"]["summary"]


def test_http_route_answers_named_queries_only(logged, tmp_path):
    url, reported = logged
    app = FastAPI()
    app.include_router(analytics_router(url, str(tmp_path / "w.duckdb")))
    client = TestClient(app)
    listing = client.get("/analytics").json()
    assert "failure_modes" in {q["name"] for q in listing}
    # the first answer syncs ~18,000 events, which on a loaded machine outlasts the 2 s a request
    # waits by default (a 202)
    rows = client.get("/analytics/compare_agents", headers={"Prefer": "wait=120"}).json()
    assert {r["agent"] for r in rows} == {"random", "expert", "noop"}
    assert sum(r["episodes"] for r in rows) == len(reported)
    rows = client.get("/analytics/failure_modes", params={"chaos": "medium", "examples": "1"}).json()
    assert all(len(r["example_episode_ids"]) <= 1 for r in rows)
    bad = client.get("/analytics/drop_everything")
    assert bad.status_code == 404 and bad.json()["code"] == "unknown_query"
    bad = client.get("/analytics/failure_modes", params={"examples": "lots"})
    assert bad.status_code == 400 and "'examples' must be an integer" in bad.json()["detail"]
    bad = client.get("/analytics/failure_modes", params={"sql": "SELECT 1"})
    assert bad.status_code == 400 and "no parameter 'sql'" in bad.json()["detail"]
    bad = client.get("/analytics/failure_modes", params={"agent": "a\x00b"})
    assert bad.status_code == 400 and "text without control characters" in bad.json()["detail"]


def test_http_route_answers_202_while_a_long_sync_runs(logged, tmp_path, monkeypatch, held_sync):
    """A store far ahead of its warehouse: the caller hears how far the sync got and when to ask
    again, instead of a request hanging for minutes; `Prefer: wait=N` waits for the rows; a bad
    query is refused before any sync."""
    import threading

    from api import analytics_routes

    url, reported = logged
    release, calls = held_sync
    monkeypatch.setattr(analytics_routes, "SYNC_WAIT_S", 0.2)
    app = FastAPI()
    app.include_router(analytics_router(url, str(tmp_path / "w.duckdb")))
    client = TestClient(app)
    assert client.get("/analytics/drop_everything").status_code == 404
    assert client.get("/analytics/failure_modes", params={"examples": "lots"}).status_code == 400
    assert calls == []
    assert client.get("/analytics/compare_agents").status_code == 202
    _until(lambda: calls)  # begun: on a loaded machine opening the files outlasts the 0.2 s wait
    for _ in range(2):
        waiting = client.get("/analytics/compare_agents")
        assert waiting.status_code == 202 and waiting.headers["retry-after"] == "2"
        body = waiting.json()
        assert body["code"] == "syncing" and (body["synced_events"], body["total_events"]) == (1500, 3000)
        assert "1,500 of 3,000 events so far (50.0%)" in body["detail"]
        assert "Prefer: wait=" in body["detail"]
    assert len(calls) == 1  # every request joins the one sync under way
    threading.Timer(0.5, release.set).start()
    answered = client.get("/analytics/compare_agents", headers={"Prefer": "respond-async, wait=30"})
    assert answered.status_code == 200 and answered.headers["preference-applied"] == "wait=30"
    assert sum(r["episodes"] for r in answered.json()) == len(reported)
    # synced: `wait=0` still lets the sync that finds nothing new end (it was always 202), and a
    # wait spelled with other digits ("²" passed str.isdigit, then float() failed: a 500) is no wait
    monkeypatch.setattr(analytics_routes, "MIN_WAIT_S", 10.0)  # a guard for a loaded machine
    for prefer in (b"wait=0", b"wait=\xb2"):  # as a client sends the byte (latin-1 "²")
        answered = client.get("/analytics/compare_agents", headers={"Prefer": prefer})
        assert answered.status_code == 200, (prefer, answered.text)


def test_a_request_is_answered_after_a_sync_begun_for_it_not_one_begun_before(logged, tmp_path,
                                                                              held_sync):
    """A sync begun before the request (another request's) ended within its wait, and the route
    then synced what the store had gained meanwhile on its own, unbounded: 200 after 18.5 s on a
    `Prefer: wait=1` while a run was writing. Another sync begins within the same wait instead."""
    import asyncio
    import threading

    from analytics import service

    url, _ = logged
    warehouse = str(tmp_path / "w.duckdb")
    release, calls = held_sync
    earlier = asyncio.run(service.sync_in_background(url, warehouse, 0.05))  # another request's
    assert earlier is not None
    _until(lambda: calls)
    assert calls == [url]
    threading.Timer(0.3, release.set).start()
    assert asyncio.run(service.sync_in_background(url, warehouse, 30)) is None
    assert earlier.ended() and len(calls) == 2  # a second sync began, and ended, within the wait


def test_a_prefer_wait_is_read_as_rfc_7240_delta_seconds():
    from api.analytics_routes import MAX_WAIT_S, MIN_WAIT_S, SYNC_WAIT_S, preferred_wait

    assert preferred_wait("wait=0") == (MIN_WAIT_S, True)
    assert preferred_wait("respond-async, wait=30") == (30.0, True)
    assert preferred_wait("wait=99999") == (MAX_WAIT_S, True)
    for unreadable in ("wait=\u00b2", "wait=\u0663", "wait=-1", "wait=1.5", None):
        assert preferred_wait(unreadable) == (SYNC_WAIT_S, False)


@contextlib.contextmanager
def _held(path: pathlib.Path):
    """Another process holding the DuckDB file, as a CLI query or a second server would."""
    holder = subprocess.Popen([sys.executable, "-c", "import duckdb, sys; c = duckdb.connect(sys.argv[1]); "
                               "print('held', flush=True); sys.stdin.read()", str(path)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        yield
    finally:
        holder.communicate("")


def _job(logged, path):
    """The background sync of this test's warehouse (another test's may still be running)."""
    from analytics import service

    return service._JOBS[(logged[0], str(path))]


def _until(condition, within: float = 30.0) -> None:
    """Wait for `condition()` to hold: a background sync on a loaded machine takes its time."""
    deadline = time.monotonic() + within
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        time.sleep(0.02)


def _ended(job, within: float = 30.0) -> None:
    deadline = time.monotonic() + within
    while not job.ended() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert job.ended()


@pytest.fixture
def busy_route(logged, tmp_path, monkeypatch):
    """The analytics route over a fresh warehouse, waiting 0.1 s for a sync and 0.5 s for the file."""
    from analytics import warehouse
    from api import analytics_routes

    path = tmp_path / "w.duckdb"
    Warehouse(path).close()
    monkeypatch.setattr(analytics_routes, "SYNC_WAIT_S", 0.1)
    monkeypatch.setattr(warehouse, "BUSY_WAIT_S", 0.5)
    app = FastAPI()
    app.include_router(analytics_router(logged[0], str(path)))
    return TestClient(app), path


def test_a_warehouse_held_by_another_process_is_said_and_retried_once_free(logged, busy_route):
    """While another process holds the file, the 202 says the sync is waiting for it (it said
    "0 events so far"); a sync that gave up waiting is not the answer to a later request, which
    tries again (it got the old 503 after the file had been freed)."""

    client, path = busy_route
    with _held(path):
        waiting = client.get("/analytics/compare_agents")
        assert waiting.status_code == 202, waiting.text
        assert "waiting to open the warehouse, which another process may hold" in waiting.json()["detail"]
        job = _job(logged, path)
        _ended(job)
        assert job.error is not None  # it gave up waiting while the file was held
    answered = client.get("/analytics/compare_agents", headers={"Prefer": "wait=30"})
    assert answered.status_code == 200, answered.text
    assert sum(r["episodes"] for r in answered.json()) == len(logged[1])


def test_a_request_waiting_while_the_file_stays_held_is_told_to_wait_not_refused(logged, busy_route):
    """A sync gives up on a held file after a while (30 s; 0.5 s here), and the request waiting when
    it did answered 503 "in use by another process", a page that stopped reloading, where every
    other visit waits with a 202 until the file is free (README)."""
    client, path = busy_route
    with _held(path):
        assert client.get("/analytics/compare_agents").status_code == 202
        waited = client.get("/analytics/compare_agents", headers={"Prefer": "wait=2"})  # 3+ give-ups
        assert waited.status_code == 202, waited.text
        assert "waiting to open the warehouse" in waited.json()["detail"]
    answered = client.get("/analytics/compare_agents", headers={"Prefer": "wait=30"})
    assert answered.status_code == 200 and sum(r["episodes"] for r in answered.json()) == len(logged[1])


def test_a_process_that_exits_during_a_background_sync_exits_cleanly_and_loses_nothing(logged, tmp_path):
    """A server stopped while its background sync ran: the interpreter unwound the sync's threads
    inside DuckDB by force, which DuckDB's C++ does not let through, and the process aborted
    ("terminate called ... FATAL: exception not rethrown", exit code 134) in a third of the
    exits. The sync now stops after its batch in flight, and the next one resumes."""
    url, reported = logged
    wh = tmp_path / "w.duckdb"
    script = ("import sys, time; from analytics.service import BackgroundSync; "
              "BackgroundSync(sys.argv[1], sys.argv[2]); time.sleep(float(sys.argv[3]))")
    for i in range(4):  # exits at different moments of the sync, the first ones before it ends
        wh.unlink(missing_ok=True)
        done = subprocess.run([sys.executable, "-c", script, url, str(wh), str(0.05 + 0.15 * i)],
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0 and "terminate called" not in done.stderr, (i, done.stderr)
        assert done.stderr == "", done.stderr  # a sync stopped on the way out is no news
    with Warehouse(wh) as opened:
        sync(url, opened)
        assert opened.counts()["episodes"] == len(reported)


def test_a_sync_that_ended_unseen_is_not_the_answer_while_the_file_is_held_again(logged, busy_route):
    """A background sync that ended well with nobody asking after it was handed to the next
    request, which then waited for a file another process held and answered 503 (the UI's
    report page hung 30 s) instead of the 202 every other visit gets."""

    client, path = busy_route
    with _held(path):
        assert client.get("/analytics/compare_agents").status_code == 202
        job = _job(logged, path)
    _ended(job)
    assert job.error is None  # it synced once the file was free, and nobody asked again
    with _held(path):
        again = client.get("/analytics/compare_agents")
        assert again.status_code == 202, again.text
        _ended(_job(logged, path))
    answered = client.get("/analytics/compare_agents", headers={"Prefer": "wait=30"})
    assert answered.status_code == 200 and sum(r["episodes"] for r in answered.json()) == len(logged[1])


def test_a_sync_that_failed_between_two_polls_is_reported_to_the_next(logged, busy_route, monkeypatch):
    """Only a sync that ended well, or gave up on a busy file, is restarted unseen: any other
    failure (a damaged store, another store's warehouse) reaches the next request once."""
    from analytics import service
    from analytics.warehouse import WarehouseError

    def failing_sync(*args, **kwargs):
        time.sleep(0.3)
        raise WarehouseError("the warehouse w.duckdb was built from another store")

    monkeypatch.setattr(service, "sync", failing_sync)
    client, path = busy_route
    assert client.get("/analytics/compare_agents").status_code == 202
    _ended(_job(logged, path))
    told = client.get("/analytics/compare_agents")
    assert told.status_code == 503 and "built from another store" in told.json()["detail"], told.text
    assert (logged[0], str(path)) not in service._JOBS  # handed out once


def test_requests_waiting_for_a_sync_hold_no_server_thread(logged, tmp_path, held_sync):
    """`Prefer: wait=N` may keep a request open for minutes: it waits on the event loop, so a
    server with a few dozen worker threads still answers everything else meanwhile."""
    import anyio
    import anyio.to_thread
    import httpx

    url, reported = logged
    release, calls = held_sync
    app = FastAPI()
    app.include_router(analytics_router(url, str(tmp_path / "w.duckdb")))
    answers: list[httpx.Response] = []

    async def main() -> tuple[int, int]:
        threads = anyio.to_thread.current_default_thread_limiter()
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            async def ask() -> None:
                answers.append(await client.get("/analytics/compare_agents", headers={"Prefer": "wait=30"}))

            try:
                async with anyio.create_task_group() as group:
                    for _ in range(3):
                        group.start_soon(ask)
                    with anyio.fail_after(10):
                        while not calls:
                            await anyio.sleep(0.01)
                    await anyio.sleep(0.3)  # every request is waiting now
                    borrowed, syncs = threads.borrowed_tokens, len(calls)
                    release.set()
            finally:
                release.set()
        return borrowed, syncs

    assert anyio.run(main) == (0, 1)  # no thread held; all three joined the one sync
    assert [a.status_code for a in answers] == [200, 200, 200]
    assert all(sum(r["episodes"] for r in a.json()) == len(reported) for a in answers)


def test_the_html_report_counts_one_episode_in_the_singular(tmp_path, cli):
    """Its confirmation read "(1 episodes, ...)", though the report itself said "1 episode"."""
    url = f"sqlite:///{tmp_path / 'one.db'}"
    run_plan(RunPlan(url, "expert", "all", "medium", 1, 0, "episode"), workers=1)
    page = tmp_path / "one.html"
    out = cli("report", "--html", str(page), "--db", url, "--warehouse", str(tmp_path / "w.duckdb"))
    assert out.exit_code == 0, out.output
    assert f"wrote {page} (1 episode, " in out.output


def test_python_client_answers_named_queries_of_a_server(logged, tmp_path):
    """`RemoteAnalytics` against a live server: the catalogue, rows as the CLI's JSON gives them,
    and the server's refusals as the errors RemoteCompanyEnv raises."""
    from companyos.analytics_client import RemoteAnalytics
    from companyos.client import RemoteRequestError

    url, reported = logged
    with live_server(url, warehouse=str(tmp_path / "w.duckdb")) as base, RemoteAnalytics(base) as remote:
        assert "failure_modes" in {q["name"] for q in remote.queries()}
        rows = remote.query("compare_agents")
        assert sum(r["episodes"] for r in rows) == len(reported)
        # None is "not given" (it was sent as the text "None": chaos level none, agent "None")
        assert remote.query("compare_agents", agent=None, chaos=None, task=None) == rows
        assert remote.query("failure_modes", agent="random", examples=1) == [
            {**r, "example_episode_ids": r["example_episode_ids"][:1]}
            for r in remote.query("failure_modes", agent="random")]
        with pytest.raises(RemoteRequestError) as unknown:
            remote.query("drop everything")
        assert (unknown.value.status, unknown.value.code) == (404, "unknown_query")
        with pytest.raises(RemoteRequestError, match="'examples' must be an integer") as bad:
            remote.query("failure_modes", examples="lots")
        assert bad.value.status == 400
        # a list went as its repr, "['random', 'expert']": a filter that matched no row
        for value in (["random", "expert"], {"agent": "random"}, b"random"):
            with pytest.raises(ValueError, match="'agent' must be text, a number or a boolean"):
                remote.query("failure_modes", agent=value)


def test_python_client_says_when_a_server_gives_no_answer():
    """A server that takes the connection but never answers: a RemoteConnectionError after the
    timeout, without the doubt an unanswered step leaves (a question changes nothing)."""
    import socket

    from companyos.analytics_client import RemoteAnalytics
    from companyos.client import RemoteConnectionError

    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        base = f"http://127.0.0.1:{silent.getsockname()[1]}"
        with RemoteAnalytics(base, timeout=0.5) as remote, pytest.raises(RemoteConnectionError) as none:
            remote.queries()
    assert none.value.code == "timeout" and "no answer from" in none.value.detail
    assert "may or may not" not in none.value.detail


def test_python_client_waits_out_a_long_sync_or_says_how_far_it_got(logged, tmp_path, held_sync):
    """A server still syncing when the client's timeout ends: a RemoteServerError with the sync's
    progress; given time, the rows, however many 202s came first."""
    import threading

    from companyos.analytics_client import RemoteAnalytics
    from companyos.client import RemoteServerError

    url, reported = logged
    release, calls = held_sync
    with live_server(url, warehouse=str(tmp_path / "w.duckdb")) as base:
        try:
            with RemoteAnalytics(base, timeout=1) as remote, pytest.raises(RemoteServerError) as syncing:
                remote.query("compare_agents")
            assert (syncing.value.status, syncing.value.code) == (202, "syncing")
            assert "1,500 of 3,000 events so far (50.0%)" in syncing.value.detail
            threading.Timer(1.5, release.set).start()
            with RemoteAnalytics(base, timeout=30) as remote:
                assert sum(r["episodes"] for r in remote.query("compare_agents")) == len(reported)
        finally:
            release.set()
    assert calls[0] == url


@pytest.mark.parametrize("header, wait, asked", [
    (None, 2.0, False), ("wait=10", 10.0, True), ("respond-async, WAIT = 5", 5.0, True),
    ('wait="7"', 7.0, True), ("wait=99999", 600.0, True), ("wait=-1", 2.0, False),
    ("wait=soon", 2.0, False), ("handling=lenient", 2.0, False), ("wait=3;foo=bar", 3.0, True)])
def test_prefer_wait_is_read_as_rfc_7240_says(header, wait, asked):
    from api.analytics_routes import preferred_wait

    assert preferred_wait(header) == (wait, asked)


def test_a_command_waits_for_another_process_syncing_the_warehouse(logged, tmp_path, cli, monkeypatch):
    """`companyos analytics query` while a server (or another `analytics sync`) syncs the same
    warehouse: the command waits for that sync, however long it takes, and then answers; it does
    not give up after the fixed wait it gives a file held for anything else."""
    from analytics import warehouse as warehouse_module

    url, reported = logged
    path = tmp_path / "w.duckdb"
    monkeypatch.setattr(warehouse_module, "BUSY_WAIT_S", 0.2)
    other = start_slow_sync(url, path, batch_events=2_000, pause_s=0.4)
    try:
        out = cli("query", "compare_agents", "--format", "json", "--db", url, "--warehouse", str(path))
        assert other.wait(30) == 0
    finally:
        other.kill()
    assert out.exit_code == 0, out.output
    assert sum(r["episodes"] for r in json.loads(out.stdout)) == len(reported)


def test_a_parameter_given_twice_is_refused_in_words(logged, tmp_path, cli):
    url, _ = logged
    out = cli("query", "failure_modes", "--param", "agent=random", "--param", "agent=expert",
              "--db", url, "--warehouse", str(tmp_path / "w.duckdb"))
    assert out.exit_code == 2 and "error: parameter 'agent' is given more than once" in out.output, out.output


READING = ["PIVOT episodes ON outcome USING count(*) GROUP BY agent", "DESCRIBE episodes",
           "EXPLAIN ANALYZE SELECT count(*) FROM steps", "PRAGMA show_tables", "SHOW TABLES"]


def _refused(tmp: pathlib.Path) -> list[tuple[list[str], str]]:
    """Ad-hoc SQL that is not one statement that only reads, and the words refusing it."""
    return [([""], "no SQL statement to run"), ([";"], "no SQL statement to run"),
            (["--", "-- a comment"], "no SQL statement to run"),
            (["SELECT 1; SELECT 2"], "one statement at a time"),
            ([f"COPY episodes TO '{tmp / 'leak.csv'}'"], "COPY is refused: `analytics sql` is read-only "
                                                         "and writes no files"),
            ([f"EXPLAIN ANALYZE COPY steps TO '{tmp / 'leak2.csv'}'"], "writes no files"),
            ([f"EXPORT DATABASE '{tmp / 'dump'}'"], "EXPORT is refused"),
            ([f"IMPORT DATABASE '{tmp}'"], "IMPORT is refused: `analytics sql` is read-only"),
            ([f"ATTACH '{tmp / 'nope' / 'other.duckdb'}' AS other"], "opens no other database"),
            (["INSTALL sqlite"], "loads no extensions"), (["LOAD sqlite"], "loads no extensions"),
            (["SET threads = 1"], "does not change DuckDB's settings"),
            (["PRAGMA enable_profiling"], "does not change DuckDB's settings"),
            (["SELECT * FRM episodes"], "syntax error"),
            # a kind DuckDB's Python enum lacks: a traceback ("29 is not a valid StatementType")
            (["UPDATE EXTENSIONS"], "UPDATE is refused: `analytics sql` runs one query")]


def test_sql_runs_one_statement_that_only_reads_and_refuses_the_rest_in_words(logged, tmp_path, cli):
    """A read-only file still lets DuckDB write files, attach, load and set: refused by kind."""
    url, reported = logged
    wh = str(tmp_path / "w.duckdb")
    for statement in READING:
        out = cli("sql", statement, "--format", "json", "--db", url, "--warehouse", wh)
        assert out.exit_code == 0 and json.loads(out.stdout), (statement, out.output)
    before = sorted(tmp_path.rglob("*"))
    for args, words in _refused(tmp_path):
        out = cli("sql", "--db", url, "--warehouse", wh, *args)
        assert out.exit_code == 2, (args, out.output)
        assert out.output.startswith("error: ") and out.output.count("\n") == 1, (args, out.output)
        assert words in out.output, (args, out.output)
        if "ATTACH" in args[0]:  # not DuckDB's "read-only mode" with a hint about rebuilding
            assert "read-only" not in out.output and "rebuild" not in out.output, out.output
    assert sorted(tmp_path.rglob("*")) == before  # no file written, none left behind
    with Warehouse(wh, read_only=True) as opened:
        assert opened.counts()["episodes"] == len(reported)


def _companyos(*args: str, cwd: pathlib.Path, env: dict | None = None) -> subprocess.CompletedProcess:
    """`companyos ...` as a user runs it: what main() prints for errors it handles."""
    return subprocess.run([sys.executable, "-m", "companyos", *args], capture_output=True, text=True,
                          cwd=cwd, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), **(env or {})},
                          timeout=120)


@pytest.mark.parametrize("damage, command, words", [
    ("payload = '{\"garbage\": '", ("query", "failure_modes"), "unpack"),
    # SQLite keeps what a hand-made UPDATE writes: each of these was Arrow's or sqlite3's traceback
    # or error, naming no episode
    ("first_version = 'x'", ("sync",), "unpack: its first_version 'x' is no int32"),
    ("payload = CAST(x'80' AS TEXT) || payload", ("sync",),
     "unpack: its payload or stream id is not UTF-8 text"),
])
def test_a_damaged_commit_is_one_error_line_naming_it(logged, tmp_path, damage, command, words):
    url, _ = logged
    copy = pathlib.Path(shutil.copyfile(url.removeprefix("sqlite:///"), tmp_path / "s.db"))
    con = sqlite3.connect(copy)
    position, stream = con.execute("SELECT position, stream_id FROM commits ORDER BY position "
                                   "LIMIT 1 OFFSET 40").fetchone()
    con.execute(f"UPDATE commits SET {damage} WHERE position = ?", (position,))
    con.commit()
    con.close()
    out = _companyos("analytics", *command, "--db", f"sqlite:///{copy}", cwd=tmp_path)
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.startswith(f"error: stream '{stream}': the commit at position {position} does not "
                                 f"{words}") and out.stderr.count("\n") == 1, out.stderr


@pytest.mark.parametrize("command, db", [
    ("sync", "{tmp}/s.db"),  # a path, not a URL
    ("report", "COMPANYOS_DB={tmp}/s.db"),
    ("export", "sqlte:///{tmp}/s.db"),  # a typo'd scheme
    ("sync", "sqlite:///{tmp}/adir"),
    ("query", "sqlite:///{tmp}/notes.txt"),
    ("sync", "sqlite://"),  # in memory: lives in one process
    ("sync", ""),  # empty, as an unset shell variable gives: not quietly the default store
])
def test_a_store_that_cannot_be_synced_is_one_error_line_and_leaves_no_file(logged, tmp_path, command, db):
    (tmp_path / "adir").mkdir()
    (tmp_path / "notes.txt").write_text("not a database")
    shutil.copyfile(logged[0].removeprefix("sqlite:///"), tmp_path / "s.db")
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    args = {"sync": ["sync"], "report": ["report", "--markdown"], "export": ["export", "out"],
            "query": ["query", "failure_modes"]}[command]
    db = db.format(tmp=tmp_path)
    env = dict([db.split("=", 1)]) if db.startswith("COMPANYOS_DB=") else None
    out = _companyos("analytics", *args, *([] if env else ["--db", db]), cwd=tmp_path, env=env)
    assert out.returncode == 2, out.stderr
    assert out.stderr.startswith("error: ") and out.stderr.count("\n") == 1, out.stderr
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before


def _tool(action) -> str:
    ok = isinstance(action, dict) and type(action.get("app")) is str and type(action.get("method")) is str
    return f"{action['app']}.{action['method']}" if ok else "(malformed)"


def _decisive_lead_ins(url: str) -> tuple[dict[str, list[str]], int]:
    """Each episode's lead-in as the domain decides its failure mode (fold + outcomes), and how
    many failed episodes were decided elsewhere than at their first mistake."""
    import collections

    from domain.episode import fold
    from domain.events import from_envelope
    from domain.outcomes import _resolved
    from eventstore import EventStore

    streams = collections.defaultdict(list)
    store = EventStore.open(url)
    try:
        for r in store.read_all():
            streams[r.stream_id].append(r)
    finally:
        store.close()
    lead_ins, elsewhere = {}, 0
    for sid, records in streams.items():
        state = fold(from_envelope(r.type, r.data, r.schema_version) for r in records)
        tools = {r.data["step"]: _tool(r.data["action"]) for r in records if r.type == "ActionTaken"}
        decisive = max(tools, default=0)
        if state.outcome == "failure":
            decisive = next(m.step for m in state.mistakes if m.irreversible)
        elif state.outcome == "truncated":
            decisive = next((m.step for m in state.mistakes if not _resolved(m, state.world)), decisive)
        if state.outcome != "success" and state.mistakes and state.mistakes[0].step != decisive:
            elsewhere += 1
        lead_ins[sid] = [tools[s] for s in range(max(1, decisive - 4), decisive + 1)]
    return lead_ins, elsewhere


def test_lead_in_ends_where_the_domain_decided_the_failure_mode(logged, tmp_path):
    from companyos.agents import make_agent
    from companyos.env import CompanyEnv

    url = f"sqlite:///{shutil.copyfile(logged[0].removeprefix('sqlite:///'), tmp_path / 's.db')}"
    # the expert escalates a random rejection (put right), then runs out of steps: no mistake decides
    with CompanyEnv(url, durability="episode", agent="expert") as env:
        for max_steps in (13, 14):
            agent = make_agent("expert", 55)
            obs, _ = env.reset(seed=55, options={"task": "vendor_onboarding", "chaos": "medium",
                                                 "max_steps": max_steps})
            agent.reset(obs)
            done = False
            while not done:
                obs, _, terminated, truncated, _ = env.step(agent.act(obs))
                done = terminated or truncated
    expected, elsewhere = _decisive_lead_ins(url)
    assert elsewhere >= 2  # cases where the first mistake is not the decisive one
    with Warehouse(tmp_path / "w.duckdb") as wh:
        sync(url, wh, batch_events=3_001)
        assert dict(wh.con.execute("SELECT episode_id, lead_in FROM episodes").fetchall()) == expected


def _markup_store(tmp: pathlib.Path) -> str:
    from eventstore import EventStore, NewEvent

    url = f"sqlite:///{tmp / 'markup.db'}"
    store = EventStore.open(url)
    try:
        for agent in ("[/]", "[bold]x", "[red]"):
            start = {"task": "expense_report", "seed": 1, "chaos": 0.0, "reward_profile": "default",
                     "max_steps": 5, "goal": "g", "target": {}}
            store.append(f"ep-{agent}", [
                NewEvent("EpisodeStarted", start, meta={"agent": agent}),
                NewEvent("ActionTaken", {"step": 1, "action": {"app": "[b]app", "method": "m"}}),
                NewEvent("EpisodeEnded", {"outcome": "truncated", "failure_mode": "step_budget_exhausted",
                                          "steps": 1, "total_return": 0.0})], None)
    finally:
        store.close()
    return url


def test_stored_text_that_looks_like_markup_is_printed_as_is(tmp_path, cli):
    url = _markup_store(tmp_path)
    wh = str(tmp_path / "m.duckdb")
    out = cli("query", "compare_agents", "--db", url, "--warehouse", wh)
    assert out.exit_code == 0, out.output
    assert all(name in out.stdout for name in ("[/]", "[bold]x", "[red]")), out.stdout
    out = cli("sql", "SELECT agent AS \"[i]agent\", lead_in FROM episodes ORDER BY agent", "--db", url,
              "--warehouse", wh)
    assert out.exit_code == 0, out.output
    assert all(text in out.stdout for text in ("[i]agent", "[/]", "[bold]x", "[b]app.m")), out.stdout
    out = cli("report", "--agent", "[bold]x", "--db", url, "--warehouse", wh)
    assert out.exit_code == 0, out.output
    # the title is bold, not "[bold]...[/bold]" spelt out, and the filter in it is shown as typed
    assert out.stdout.startswith("CompanyOS failure-mode report (agent=[bold]x)\n"), out.stdout
    assert "[b]app.m" in out.stdout, out.stdout


def test_every_format_names_repeated_columns_alike(logged, tmp_path, cli):
    """A self-join's `a.agent, b.agent`: JSON suffixed the second (`agent_1`), while the CSV header
    and the table kept `agent` twice, so the same query read differently by format."""
    wh = str(tmp_path / "w.duckdb")
    query = "SELECT 1 AS agent, 2 AS agent, 3 AS agent_1"
    names = ["agent", "agent_2", "agent_1"]  # agent_1 is taken by a later column
    out = cli("sql", query, "--format", "json", "--db", logged[0], "--warehouse", wh)
    assert list(json.loads(out.stdout)[0]) == names, out.output
    out = cli("sql", query, "--format", "csv", "--db", logged[0], "--warehouse", wh)
    assert out.stdout.splitlines()[0] == ",".join(names), out.output
    out = cli("sql", query, "--db", logged[0], "--warehouse", wh)
    assert re.search(r"agent\s+┃ agent_2\s+┃ agent_1", out.stdout), out.stdout


def test_a_terminal_table_shows_its_first_thousand_rows_and_says_how_many_more(logged, tmp_path, cli):
    """20,000 rows as a table took 90 s and 400 MB before its first line (CSV: 2 s)."""
    from companyos.commands.analytics import TABLE_ROWS

    wh, query = str(tmp_path / "w.duckdb"), f"SELECT range AS n FROM range({TABLE_ROWS + 500})"
    out = cli("sql", query, "--db", logged[0], "--warehouse", wh)
    assert out.exit_code == 0, out.output
    shown = [int(n) for n in re.findall(r"│ (\d+)\s+│", out.stdout)]
    assert shown == list(range(TABLE_ROWS)), shown[-3:]
    assert out.stdout.rstrip().endswith(f"(500 more rows not shown: --format csv or json prints all "
                                        f"{TABLE_ROWS + 500:,})"), out.stdout[-200:]
    out = cli("sql", query, "--format", "csv", "--db", logged[0], "--warehouse", wh)
    assert len(out.stdout.splitlines()) == TABLE_ROWS + 501


def test_tables_print_floats_with_their_magnitude(logged, tmp_path, cli):
    out = cli("sql", "SELECT 1234567.891::DOUBLE AS x, -0.1565::DOUBLE AS y", "--db", logged[0],
              "--warehouse", str(tmp_path / "w.duckdb"))
    assert out.exit_code == 0, out.output
    assert "1234567.891" in out.stdout and "-0.1565" in out.stdout and "e+06" not in out.stdout


def test_json_keeps_integers_past_64_bits_exact(logged, tmp_path, cli):
    """`sum` over UBIGINT or hash() gives DuckDB's HUGEINT: a traceback from the JSON writer before."""
    others = ("1.5::DOUBLE AS x, 'a' AS s, 'nan'::DOUBLE AS n, TIMESTAMP '2024-01-01 12:00:00' AS t, "
              "[1, 2] AS l")
    wh = str(tmp_path / "w.duckdb")
    out = cli("sql", f"SELECT (1::HUGEINT << 100) + 7 AS big, {others}", "--format", "json",
              "--db", logged[0], "--warehouse", wh)
    assert out.exit_code == 0, out.output
    row = json.loads(out.stdout)[0]
    assert row.pop("big") == 2**100 + 7
    # everything else as it is written without a big integer in the document
    usual = json.loads(cli("sql", f"SELECT {others}", "--format", "json", "--db", logged[0],
                           "--warehouse", wh).stdout)[0]
    # a time as SQL and the CSV write it (orjson's own ISO form had a `T`)
    assert row == usual == {"x": 1.5, "s": "a", "n": None, "t": "2024-01-01 12:00:00", "l": [1, 2]}
    csv = cli("sql", f"SELECT {others}", "--format", "csv", "--db", logged[0], "--warehouse", wh).stdout
    assert ",2024-01-01 12:00:00," in csv, csv


def test_json_writes_decimals_as_exact_numbers(logged, tmp_path, cli):
    """DuckDB's DECIMAL (a literal, `sum` over one) came out as text ("1.50"): a JSON reader
    got strings where it sums numbers. Now numbers, every digit kept, beside a big integer too."""
    from decimal import Decimal

    query = ("SELECT 1.50::DECIMAL(10, 2) AS d, 12345678901234567.123456789::DECIMAL(38, 9) AS p, "
             "sum(x) AS s FROM (VALUES (0.1::DECIMAL(4, 1)), (0.2::DECIMAL(4, 1))) v(x)")
    wh = str(tmp_path / "w.duckdb")
    for extra in ("", ", (1::HUGEINT << 100) AS big"):
        out = cli("sql", query.replace(" FROM", f"{extra} FROM", 1), "--format", "json",
                  "--db", logged[0], "--warehouse", wh)
        assert out.exit_code == 0, out.output
        row = json.loads(out.stdout, parse_float=Decimal)[0]
        assert row.pop("big", 2**100) == 2**100
        assert row == {"d": Decimal("1.50"), "p": Decimal("12345678901234567.123456789"),
                       "s": Decimal("0.3")}, out.stdout


def test_an_export_of_an_empty_store_reads_back_as_empty_tables(logged, tmp_path, cli):
    """With no partition DuckDB wrote no file, and the documented read-back failed ("No files
    found"); now each table reads back with no rows and the columns of a full export."""
    empty = f"sqlite:///{tmp_path / 'empty.db'}"
    EventStore.open(empty).close()
    target, full = tmp_path / "empty-export", tmp_path / "full-export"
    for root, url, wh in ((target, empty, "e.duckdb"), (full, logged[0], "f.duckdb")):
        assert cli("export", str(root), "--db", url, "--warehouse", str(tmp_path / wh)).exit_code == 0
    con = duckdb.connect()
    for table in ("episodes", "steps", "rewards", "events"):
        def read(root, table=table):
            return con.execute(f"SELECT * FROM read_parquet('{root}/{table}/*/*.parquet', "
                               "hive_partitioning = true)")
        got = read(target)
        assert got.fetchall() == [] and [d[0] for d in got.description] == \
            [d[0] for d in read(full).description], table


def _file_size_limited(limit: int):
    """For a child process: files it writes stop growing at `limit` bytes, as on a full disk."""
    import resource
    import signal

    def apply() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # write() fails (EFBIG) instead of a kill
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


def test_a_warehouse_that_cannot_be_written_is_one_error_line_and_the_next_sync_resumes(
        logged, tmp_path):
    """A full disk (or a read-only directory) under the warehouse gave DuckDB's traceback at COMMIT."""
    url, reported = logged
    wh = tmp_path / "w.duckdb"
    args = [sys.executable, "-m", "companyos", "analytics", "query", "failure_modes", "--db", url,
            "--warehouse", str(wh), "--format", "json"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    full = subprocess.run(args, capture_output=True, text=True, env=env, timeout=120,
                          preexec_fn=_file_size_limited(64 * 1024))
    assert full.returncode == 1 and not full.stdout
    assert full.stderr.startswith(f"error: cannot write the warehouse {wh}: ")
    assert "File too large" in full.stderr and full.stderr.count("\n") == 1, full.stderr
    after = subprocess.run(args, capture_output=True, text=True, env=env, timeout=120)
    assert after.returncode == 0, after.stderr
    fresh = subprocess.run([*args[:-4], "--warehouse", str(tmp_path / "fresh.duckdb"),
                            "--format", "json"], capture_output=True, text=True, env=env, timeout=120)
    assert json.loads(after.stdout) == json.loads(fresh.stdout)
    with Warehouse(wh, read_only=True) as opened:
        assert opened.counts()["episodes"] == len(reported)


@pytest.mark.parametrize("written", [b"", b"DUCK" * 1_000], ids=["empty", "part of a header"])
def test_a_warehouse_the_disk_had_no_room_to_create_is_made_by_the_next_command(
        logged, tmp_path, cli, monkeypatch, written):
    """A full disk as the warehouse was created left an empty file there (DuckDB makes the file,
    then fails to write its header), said as a wrong call (exit 2); every later command, with
    room on the disk again, was refused with "not a valid DuckDB database file" until the user
    found and deleted it."""
    from analytics import warehouse

    url, reported = logged
    wh = tmp_path / "w.duckdb"
    connect = duckdb.connect

    def full_disk(database, *args, **kwargs):  # as DuckDB fails on a full disk
        if not pathlib.Path(database).exists():
            pathlib.Path(database).write_bytes(written)  # a file size limit stops it part-way
            raise duckdb.IOException(f'IO Error: Could not write file "{database}": No space left on device')
        return connect(database, *args, **kwargs)

    monkeypatch.setattr(warehouse.duckdb, "connect", full_disk)
    full = cli("query", "failure_modes", "--db", url, "--warehouse", str(wh), "--format", "json")
    assert full.exit_code == 1, full.output
    assert full.output.startswith(f"error: cannot write the warehouse {wh}: ")
    assert "No space left on device" in full.output and full.output.count("\n") == 1, full.output
    assert not wh.exists()
    monkeypatch.setattr(warehouse.duckdb, "connect", connect)  # room on the disk again
    after = cli("query", "failure_modes", "--db", url, "--warehouse", str(wh), "--format", "json")
    assert after.exit_code == 0, after.output
    with Warehouse(wh, read_only=True) as opened:
        assert opened.counts()["episodes"] == len(reported)


@pytest.mark.parametrize("args", [["export", ""], ["report", "--html", ""],
                                  ["query", "failure_modes", "--warehouse", ""]])
def test_an_empty_path_is_refused_not_taken_for_the_current_directory(logged, tmp_path, args):
    """`analytics export ""` (an unset shell variable) wrote its tables into the current directory."""
    out = _companyos("analytics", *args, "--db", logged[0], cwd=tmp_path)
    assert out.returncode == 2 and "is empty (an unset shell variable?)" in out.stderr, out.stderr
    assert list(tmp_path.iterdir()) == []


def test_the_server_syncs_the_warehouse_it_was_given(logged, tmp_path):
    """`serve --warehouse` reaches both the JSON analytics and the UI's report: the answers come from
    that file, and none is made beside the store."""
    from api.app import create_app
    from api.config import ServerConfig

    url, reported = logged
    copy = tmp_path / "store" / "companyos.db"
    copy.parent.mkdir()
    shutil.copy(url.removeprefix("sqlite:///"), copy)
    elsewhere = tmp_path / "analytics" / "w.duckdb"
    config = ServerConfig.from_env({"COMPANYOS_DB": f"sqlite:///{copy}",
                                    "COMPANYOS_WAREHOUSE": str(elsewhere)})
    with TestClient(create_app(config)) as client:
        rows = client.get("/analytics/compare_agents", headers={"Prefer": "wait=120"}).json()
        assert sum(r["episodes"] for r in rows) == len(reported)
        page = client.get("/ui/analytics")  # synced by the request before
        words = " ".join(re.sub("<[^>]+>", " ", page.text).split())
        assert page.status_code == 200 and f"episodes {len(reported)} success rate" in words
    assert elsewhere.exists() and not (copy.parent / "companyos.duckdb").exists()
    with Warehouse(elsewhere, read_only=True) as wh:
        assert wh.con.execute("SELECT count(*) FROM episodes").fetchone()[0] == len(reported)


def test_serve_hands_its_workers_an_absolute_warehouse_and_refuses_what_holds_none(tmp_path, monkeypatch):
    """Its banner names the UI, and never the store's password: banners end up in logs."""
    import uvicorn

    from companyos.commands import serve

    started = {}
    monkeypatch.setattr(uvicorn, "run", lambda *a, **k: started.update(os.environ, port=k["port"]))
    monkeypatch.chdir(tmp_path)
    for var in ("DB", "WAREHOUSE", "MAX_SESSIONS", "CACHE_SIZE", "IDLE_TIMEOUT", "MAX_BODY", "EXIT_WITH"):
        monkeypatch.setenv(f"COMPANYOS_{var}", "")  # serve sets them; monkeypatch undoes it after
    monkeypatch.setattr(serve, "_open_store_once", lambda url: None)  # no database behind the URL
    runner = command_runner(serve.register)  # its only command: typer calls it without its name
    out = runner("--port", "0", "--db", "postgresql://cos:s3cret@db.example/cos", "--warehouse", "w/a.duckdb")
    assert out.exit_code == 0, out.output
    assert started["COMPANYOS_WAREHOUSE"] == str(tmp_path / "w" / "a.duckdb")
    assert "store postgresql://cos:***@db.example/cos" in out.output and "s3cret" not in out.output
    port = started["port"]  # --port 0: the free port the kernel picked, served and shown
    base = f"http://127.0.0.1:{port}"
    assert port > 0 and f"web UI {base}/ui, API docs {base}/docs" in out.output
    assert started["COMPANYOS_DB"] == "postgresql://cos:s3cret@db.example/cos"  # the workers need it
    (tmp_path / "d").mkdir()
    out = runner("--port", "0", "--db", "sqlite:///s.db", "--warehouse", "d")
    assert out.exit_code == 2 and f"the warehouse {tmp_path / 'd'} is a directory" in out.output
    # the store itself, or a file that is no DuckDB database: refused at start as the analytics
    # commands refuse them (the server started, and every analytics request was a 503)
    sqlite3.connect(tmp_path / "s.db").execute("CREATE TABLE t (x)").connection.commit()
    (tmp_path / "notes.txt").write_text("my notes")
    for target, words in (("s.db", "is a SQLite database (the event store?)"),
                          ("notes.txt", "is not a valid DuckDB database file")):
        before = (tmp_path / target).read_bytes()
        out = runner("--port", "0", "--db", "sqlite:///s.db", "--warehouse", target)
        assert out.exit_code == 2 and words in " ".join(out.output.split()), out.output
        assert (tmp_path / target).read_bytes() == before
    # another application's DuckDB database too (it was found out only at the first request)
    other = duckdb.connect(str(tmp_path / "other.duckdb"))
    other.execute("CREATE TABLE invoices (id INTEGER)")
    other.close()
    before = (tmp_path / "other.duckdb").read_bytes()
    out = runner("--port", "0", "--db", "sqlite:///s.db", "--warehouse", "other.duckdb")
    assert out.exit_code == 2, out.output
    assert "is a DuckDB database of something else, not a CompanyOS warehouse (it holds invoices)" \
        in " ".join(out.output.split())
    assert (tmp_path / "other.duckdb").read_bytes() == before
    # a warehouse, and one that is empty, start the server
    Warehouse(tmp_path / "ours.duckdb").close()
    (tmp_path / "empty.duckdb").touch()
    for target in ("ours.duckdb", "empty.duckdb"):
        out = runner("--port", "0", "--db", "sqlite:///s.db", "--warehouse", target)
        assert out.exit_code == 0, out.output


@pytest.fixture
def unwritable():
    """Make files this process may not write, even as root (`chattr +i`); undone after the test."""
    made: list[pathlib.Path] = []

    def make(path: pathlib.Path) -> None:
        if shutil.which("chattr") is None or subprocess.run(["chattr", "+i", str(path)],
                                                           capture_output=True).returncode:
            pytest.skip("this file system cannot make a file immutable (chattr +i)")
        made.append(path)
        assert not os.access(path, os.W_OK)

    yield make
    for path in made:
        subprocess.run(["chattr", "-i", str(path)], check=True)


def test_a_warehouse_this_process_may_not_write_answers_while_it_is_up_to_date(tmp_path, cli, unwritable):
    """A warehouse on a read-only file system, or another user's: opened for writing, it was refused
    as "cannot open the warehouse" (exit 2) even when nothing was new. It answers now, and says in
    words why it cannot sync once the store holds more (exit 1)."""
    url = f"sqlite:///{tmp_path / 'store.db'}"
    run_plan(RunPlan(url, "expert", "all", "medium", 12, 0, "episode"), workers=1)
    wh = str(tmp_path / "w.duckdb")
    before = cli("query", "compare_agents", "--format", "json", "--db", url, "--warehouse", wh)
    assert before.exit_code == 0, before.output
    unwritable(tmp_path / "w.duckdb")
    after = cli("query", "compare_agents", "--format", "json", "--db", url, "--warehouse", wh)
    assert after.exit_code == 0, after.output
    assert json.loads(after.stdout) == json.loads(before.stdout)
    assert cli("sync", "--db", url, "--warehouse", wh).exit_code == 0  # nothing new: nothing to write
    run_plan(RunPlan(url, "expert", "all", "medium", 1, 50, "episode"), workers=1)
    stale = cli("query", "compare_agents", "--db", url, "--warehouse", wh)
    assert stale.exit_code == 1 and "this process may not write the file" in stale.stderr, stale.output
    assert "events after its checkpoint" in stale.stderr and not stale.stdout
    rebuild = cli("sync", "--rebuild", "--db", url, "--warehouse", wh)
    assert rebuild.exit_code == 1 and "cannot rebuild the warehouse" in rebuild.stderr, rebuild.output


def test_a_new_warehouse_in_a_directory_that_takes_no_file_is_the_machines_error(logged, tmp_path, cli,
                                                                                 unwritable):
    """A read-only directory (or file system) under a new warehouse is the machine's condition, as a
    full disk is (exit code 1); it was refused as a bad path (exit code 2)."""
    url, _ = logged
    sealed = tmp_path / "sealed"
    sealed.mkdir()
    unwritable(sealed)
    out = cli("sync", "--db", url, "--warehouse", str(sealed / "w.duckdb"))
    assert out.exit_code == 1, out.output
    assert out.stderr.startswith(f"error: cannot create the warehouse {sealed / 'w.duckdb'}: "), out.stderr
    assert "Operation not permitted" in out.stderr and not list(sealed.iterdir())
    under_a_file = cli("sync", "--db", url, "--warehouse", url.removeprefix("sqlite:///") + "/w.duckdb")
    assert under_a_file.exit_code == 2, under_a_file.output  # the caller's path: still a usage error


def test_a_path_beginning_with_a_tilde_means_one_place(logged, tmp_path, cli, monkeypatch):
    """A quoted `'~/exports'` reached Python as a directory named `~` and DuckDB as the home
    directory: the export failed, leaving four tables' staging copies in the home directory, and
    `--warehouse '~/w.duckdb'` built a file the messages placed elsewhere. The command line expands
    `~` as a shell would; the Python API takes a path literally, DuckDB included."""
    from analytics.export import export

    url, reported = logged
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    out = cli("export", "~/exports", "--db", url, "--warehouse", "~/w.duckdb")
    assert out.exit_code == 0, out.output
    assert (home / "w.duckdb").exists() and (home / "exports" / "_companyos_export.json").exists()
    assert list(work.iterdir()) == []
    with Warehouse(pathlib.Path("~/literal.duckdb")) as wh:  # a directory named `~`, here
        sync(url, wh)
        export(wh, pathlib.Path("~") / "exports")
        assert wh.counts()["episodes"] == len(reported)
    assert sorted(p.name for p in (work / "~").iterdir()) == ["exports", "literal.duckdb"]
    assert sorted(p.name for p in home.iterdir()) == ["exports", "w.duckdb"]
    assert not [p for p in home.rglob(".*.tmp")]
