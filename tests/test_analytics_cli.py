"""Analytics over real environment episodes: the warehouse agrees with `companyos run`, and the
CLI, the report, the Parquet export and the HTTP route work end to end."""

from __future__ import annotations

import json
import pathlib
import shutil

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
from tests.conftest import command_runner


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
    assert out.stdout.splitlines()[0] == "task,chaos,episodes,successes,success_rate,mean_return"
    out = cli("query", "--format", "json", "--db", url, "--warehouse", wh)
    assert {q["name"] for q in json.loads(out.stdout)} >= {"pass_at_k", "chaos_impact"}
    out = cli("query", "nope", "--db", url, "--warehouse", wh)
    assert out.exit_code == 2 and "no named query 'nope'" in out.output
    out = cli("query", "pass_at_k", "--param", "k=two", "--db", url, "--warehouse", wh)
    assert out.exit_code == 2 and "'k' must be an integer" in out.output
    out = cli("query", "pass_at_k", "--param", "k", "--db", url, "--warehouse", wh)
    assert out.exit_code == 2 and "NAME=VALUE" in out.output


def test_pass_at_k_over_repeated_seeds(logged, tmp_path, cli):
    url, _ = logged
    out = cli("query", "pass_at_k", "--param", "k=2", "--param", "agent=expert", "--format", "json",
              "--db", url, "--warehouse", str(tmp_path / "w.duckdb"))
    rows = json.loads(out.stdout)
    assert {r["k"] for r in rows} == {1, 2}
    assert all(r["mean_trials"] == 2 for r in rows)  # each expert instance ran twice


def test_sync_sql_report_and_export(logged, tmp_path, cli):
    url, reported = logged
    wh = str(tmp_path / "w.duckdb")
    out = cli("sync", "--json", "--db", url, "--warehouse", wh)
    doc = json.loads(out.stdout)
    assert doc["tables"]["episodes"] == len(reported) and doc["events_synced"] > 0
    out = cli("sql", "SELECT count(*) AS n FROM episodes", "--format", "json", "--db", url, "--warehouse", wh)
    assert json.loads(out.stdout) == [{"n": len(reported)}]
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


def test_report_and_export_to_places_they_cannot_write_fail_in_words(logged, tmp_path, cli):
    url, _ = logged
    wh = str(tmp_path / "w.duckdb")
    blocker = tmp_path / "blocker"
    blocker.write_text("a file, not a directory")
    out = cli("report", "--html", str(blocker / "report.html"), "--db", url, "--warehouse", wh)
    assert out.exit_code == 1 and "error: cannot write the report" in out.output, out.output
    out = cli("export", str(blocker), "--db", url, "--warehouse", wh)
    assert out.exit_code == 2 and "is a file, not a directory" in out.output, out.output
    out = cli("export", str(blocker / "sub"), "--db", url, "--warehouse", wh)
    assert out.exit_code == 1 and "error: cannot export" in out.output, out.output
    foreign = tmp_path / "foreign"
    (foreign / "episodes").mkdir(parents=True)
    out = cli("export", str(foreign), "--db", url, "--warehouse", wh)
    assert out.exit_code == 2 and "did not export" in out.output, out.output
    assert blocker.read_text() == "a file, not a directory"


def test_an_export_that_fails_midway_leaves_the_previous_export_and_no_staging(logged, tmp_path,
                                                                                 monkeypatch):
    from analytics import export as exporting

    url, reported = logged
    target = tmp_path / "export"
    with Warehouse(tmp_path / "w.duckdb") as wh:
        sync(url, wh)
        exporting.export(wh, target)
        before = sorted(p.relative_to(target) for p in target.rglob("*"))
        monkeypatch.setitem(exporting._TABLES, "steps",
                            "SELECT *, CASE WHEN step > 3 THEN error('disk gone') ELSE task END "
                            "AS task_family FROM steps")
        with pytest.raises(duckdb.Error, match="disk gone"):
            exporting.export(wh, target)
    assert sorted(p.relative_to(target) for p in target.rglob("*")) == before
    n = duckdb.connect().execute(f"SELECT count(*) FROM read_parquet('{target}/episodes/*/*.parquet')"
                                 ).fetchone()[0]
    assert n == len(reported)


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
    if case == "a-directory":
        (tmp / "adir").mkdir()
        return tmp / "adir"
    (tmp / "afile").write_text("x")
    return tmp / "afile" / "w.duckdb"


@pytest.mark.parametrize("case, words", [
    ("the-sqlite-store", "is a SQLite database"), ("not-duckdb", "not a valid DuckDB"),
    ("a-directory", "is a directory"), ("under-a-file", "cannot create the warehouse")])
def test_a_warehouse_path_that_cannot_hold_one_is_refused_and_left_alone(logged, tmp_path, cli, case, words):
    url, _ = logged
    path = _unfit_warehouse(case, tmp_path, url.removeprefix("sqlite:///"))
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    out = cli("query", "failure_modes", "--db", url, "--warehouse", str(path))
    assert out.exit_code == 2 and "error: " in out.output and words in out.output, out.output
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before


def test_report_success_by_chaos_agrees_with_what_run_reported(logged, tmp_path):
    from analytics import report

    url, reported = logged
    tally: dict[float, list[int]] = {}
    for r in reported:
        counts = tally.setdefault(r["chaos"], [0, 0])
        counts[0] += 1
        counts[1] += r["outcome"] == "success"
    with Warehouse(tmp_path / "w.duckdb") as wh:
        sync(url, wh)
        data = report.build(wh)
        only_random = report.build(wh, agent="random")
    assert data["success_by_chaos"] == [
        {"chaos": chaos, "episodes": n, "success_rate": round(wins / n, 4)}
        for chaos, (n, wins) in sorted(tally.items())]
    assert [r["chaos"] for r in only_random["success_by_chaos"]] == [0.5]  # random ran at medium only
    assert data["summary"]["episodes"] == len(reported)


def test_http_route_answers_named_queries_only(logged, tmp_path):
    url, reported = logged
    app = FastAPI()
    app.include_router(analytics_router(url, str(tmp_path / "w.duckdb")))
    client = TestClient(app)
    listing = client.get("/analytics").json()
    assert "failure_modes" in {q["name"] for q in listing}
    rows = client.get("/analytics/compare_agents").json()
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
