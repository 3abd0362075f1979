"""The `episodes`, `replay`, `rerun`, `verify` and `rebuild` commands, end to end on a SQLite file."""

from __future__ import annotations

import json

import pytest
import sqlalchemy as sa

from companyos.commands import projections as commands
from eventstore import EventStore
from tests import tamper
from tests.conftest import command_runner, two_at_a_time


@pytest.fixture(scope="module")
def cli():
    return command_runner(commands.register)


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    from tests.test_projections import play

    url = f"sqlite:///{tmp_path_factory.mktemp('cli') / 'store.db'}"
    store = EventStore.open(url)
    ids = [play(store, task, seed, chaos, agent)["episode_id"]
           for task, seed, chaos, agent in (("expense_report", 1, "medium", "expert"),
                                            ("bug_escalation", 2, "high", "random"),
                                            ("license_renewal", 3, "low", "expert"))]
    store.close()
    return url, ids


def test_episodes_lists_filters_and_prints_json(cli, db):
    url, ids = db
    out = cli("episodes", "--db", url, "--json")
    assert out.exit_code == 0
    listed = json.loads(out.stdout)["episodes"]
    assert [e["episode_id"] for e in listed] == ids[::-1]
    out = cli("episodes", "--db", url, "--json", "--agent", "expert", "--task", "license_renewal")
    assert [e["episode_id"] for e in json.loads(out.stdout)["episodes"]] == [ids[2]]
    out = cli("episodes", "--db", url, "--limit", "2")
    assert out.exit_code == 0 and ids[2] in out.stdout and ids[0] not in out.stdout
    wrong = cli("episodes", "--db", url, "--outcome", "won")
    assert wrong.exit_code == 2 and "unknown outcome 'won'" in wrong.stderr
    assert "success, failure, truncated, running" in wrong.stderr and not wrong.stdout
    wrong = cli("episodes", "--db", url, "--task", "license_renwal")  # a typo lists nothing
    assert wrong.exit_code == 2 and "unknown task 'license_renwal'" in wrong.stderr
    assert "license_renewal" in wrong.stderr and not wrong.stdout


def test_episodes_names_an_unlabelled_agent_as_its_filter_finds_it(cli, tmp_path):
    """An episode logged without an agent showed as "-", which no filter finds (nor told it from
    an agent labelled "-"); `(unknown)` is the name the filter and the analytics use."""
    from companyos.env import CompanyEnv

    url = f"sqlite:///{tmp_path / 'store.db'}"
    with CompanyEnv(url) as env:
        env.reset(seed=1, options={"task": "expense_report", "chaos": "none"})
    table = cli("episodes", "--db", url)
    found = cli("episodes", "--db", url, "--agent", "(unknown)", "--json")
    assert table.exit_code == 0 and "(unknown)" in table.stdout
    assert found.exit_code == 0 and json.loads(found.stdout)["total"] == 1
    episode_id = json.loads(found.stdout)["episodes"][0]["episode_id"]
    replayed = cli("replay", episode_id, "--db", url)
    assert replayed.exit_code == 0 and " agent (unknown) rules " in replayed.stdout


def test_episodes_pages_through_the_list_and_says_which_page_it_shows(cli, db):
    """`--limit 50` cut the table of 34,000 episodes without a word, and there was no way to the
    next page but `--limit 0` (GET /episodes has `offset`)."""
    url, ids = db
    out = cli("episodes", "--db", url, "--limit", "1", "--offset", "1")
    assert out.exit_code == 0, out.output
    assert ids[1] in out.stdout and ids[0] not in out.stdout and ids[2] not in out.stdout
    assert "episodes 2–2 of 3; --offset 2 for the next, --limit 0 for all" in out.stdout
    doc = json.loads(cli("episodes", "--db", url, "--json", "--limit", "2").stdout)
    assert [e["episode_id"] for e in doc["episodes"]] == [ids[2], ids[1]]
    assert (doc["total"], doc["offset"], doc["next_offset"]) == (3, 0, 2)
    last = json.loads(cli("episodes", "--db", url, "--json", "--limit", "2", "--offset", "2").stdout)
    assert [e["episode_id"] for e in last["episodes"]] == [ids[0]] and last["next_offset"] is None
    whole = cli("episodes", "--db", url)  # all of them on one page: no page line
    assert "of 3" not in whole.stdout
    past = cli("episodes", "--db", url, "--offset", "5")
    assert past.exit_code == 0 and "no episodes past the first 3 that match" in past.stdout


@pytest.mark.parametrize("agent", ["[/]", "[bold red]expert", "a :smile: b"])
def test_stored_text_is_printed_as_it_is_stored(cli, tmp_path, agent):
    """Anyone can name the agent (a reset over HTTP takes any string): rich read "[/]" as
    markup and crashed every later listing, and showed "[bold red]expert" as "expert"."""
    from companyos.env import CompanyEnv

    url = f"sqlite:///{tmp_path / 'odd.db'}"
    with CompanyEnv(url, agent=agent) as env:
        env.reset(seed=1, options={"task": "expense_report", "chaos": "none"})
        env.step({"app": "ticketdesk", "method": "add_comment",
                  "params": {"ticket_id": "T-101", "text": "[/] [red]x"}})
        episode_id = env.state["episode_id"]
    out = cli("episodes", "--db", url)
    assert out.exit_code == 0 and agent in out.stdout
    engine = sa.create_engine(url)
    version = tamper.versions_of_type(engine, episode_id, "ActionTaken")[0]
    tamper.edit_event(engine, episode_id, version, "data", lambda data: data.replace("T-101", "T-1[/]"))
    engine.dispose()
    out = cli("rerun", episode_id, "--db", url)
    assert out.exit_code == 1 and "MISMATCH" in out.stdout
    assert "[/] [red]x" in out.stdout and "T-1[/]" in out.stdout


def test_replay_prints_the_apps_at_a_step(cli, db):
    url, ids = db
    out = cli("replay", ids[1], "--step", "2", "--db", url, "--json")
    assert out.exit_code == 0
    doc = json.loads(out.stdout)
    assert doc["step"] == 2 and doc["action"] is not None
    assert {"ticketdesk", "datahub", "approvalflow"} <= set(doc)
    text = cli("replay", ids[1], "--db", url).stdout
    assert "TicketDesk board" in text and "DataHub catalogue" in text and "episode ended" in text
    missing = cli("replay", "nope", "--db", url)
    assert missing.exit_code == 2 and "no episode" in missing.stderr
    assert cli("replay", ids[1], "--step", "999", "--db", url).exit_code == 2


def test_replay_shows_the_action_an_agent_sent_even_when_it_was_null(cli, tmp_path):
    from companyos.env import CompanyEnv

    url = f"sqlite:///{tmp_path / 'null.db'}"
    with CompanyEnv(url) as env:
        env.reset(seed=1, options={"task": "expense_report"})
        env.step(None)
        episode_id = env.state["episode_id"]
    text = cli("replay", episode_id, "--step", "1", "--db", url).stdout
    assert "action: null" in text and "rejected [malformed_action]" in text
    assert "action:" not in cli("replay", episode_id, "--step", "0", "--db", url).stdout


def test_rerun_exits_0_on_a_match_and_1_on_a_mismatch(cli, db, tmp_path):
    import shutil

    url, ids = db
    out = cli("rerun", ids[0], "--db", url)
    assert out.exit_code == 0 and "match" in out.stdout
    copy = tmp_path / "copy.db"
    shutil.copy(sa.make_url(url).database, copy)
    engine = sa.create_engine(f"sqlite:///{copy}")
    for version in tamper.versions_of_type(engine, ids[0], "ActionTaken"):
        tamper.edit_event(engine, ids[0], version, "data",
                          lambda data: data.replace('"step":3', '"step":4'))
    engine.dispose()
    out = cli("rerun", ids[0], "--db", f"sqlite:///{copy}")
    assert out.exit_code == 1
    assert "MISMATCH" in out.stdout and "stored" in out.stdout and "re-simulated" in out.stdout
    # the digest columns were left alone: "stored digest X, re-simulated X" read as a contradiction
    digest = cli("rerun", ids[0], "--db", url, "--json")
    said = " ".join(out.stdout.split())
    assert f"both chains end in digest {json.loads(digest.stdout)['rerun_digest']}" in said, said
    assert "but the stored stream is not the re-simulated one" in said
    doc = json.loads(cli("rerun", ids[0], "--db", f"sqlite:///{copy}", "--json").stdout)
    assert doc["match"] is False and doc["stored"]["type"] == "ActionTaken"

    # data damaged past JSON: said, in the table and in the JSON, not a traceback
    engine = sa.create_engine(f"sqlite:///{copy}")
    reward = tamper.versions_of_type(engine, ids[0], "RewardGranted")[0]
    tamper.edit_event(engine, ids[0], reward, "data", lambda data: data.replace('"value":', '"value":1'))
    engine.dispose()
    out = cli("rerun", ids[0], "--db", f"sqlite:///{copy}")
    assert out.exit_code == 1 and "(not JSON)" in out.stdout
    doc = json.loads(cli("rerun", ids[0], "--db", f"sqlite:///{copy}", "--json").stdout)
    assert doc["first_difference"] == reward and '"value":1' in doc["stored"]["data"]  # the stored text


def test_verify_and_rebuild(cli, db, tmp_path):
    import shutil

    url, ids = db
    copy = tmp_path / "copy.db"
    shutil.copy(sa.make_url(url).database, copy)
    url = f"sqlite:///{copy}"
    out = cli("rebuild", "--db", url)
    assert out.exit_code == 0 and "rebuilt episodes, views" in out.stdout
    assert cli("rebuild", "views", "--workers", "2", "--db", url).exit_code == 0
    assert cli("rebuild", "nonsense", "--db", url).exit_code == 2
    out = cli("verify", "--db", url)
    assert out.exit_code == 0 and out.stdout.strip().endswith("ok")
    engine = sa.create_engine(url)
    tamper.delete_commit(engine, tamper.stream_commits(engine, ids[1])[1][0])
    engine.dispose()
    out = cli("verify", "--db", url, "--workers", "2")
    assert out.exit_code == 1 and f"BROKEN {ids[1]}" in out.stdout and ids[0] not in out.stdout
    doc = json.loads(cli("verify", "--db", url, "--json").stdout)
    assert doc["ok"] is False and [b["episode_id"] for b in doc["broken"]] == [ids[1]]


def test_a_rebuild_of_one_read_model_counts_the_log_once(cli, db, tmp_path):
    """With the episodes read model behind the log, `rebuild views` caught it up too and counted
    its events in: "rebuilt views: 252883 events" of a log of 252,848."""
    import re
    import shutil

    from tests.test_projections import play

    url, _ = db
    copy = tmp_path / "copy.db"
    shutil.copy(sa.make_url(url).database, copy)
    url = f"sqlite:///{copy}"
    assert cli("rebuild", "--db", url).exit_code == 0
    with EventStore.open(url) as store:
        play(store, "expense_report", 9, "low", "expert")  # the read models are behind it now
        events = store.count_events()
    out = cli("rebuild", "views", "--workers", "2", "--db", url)  # as on a big store: in parallel
    assert out.exit_code == 0, out.output
    assert int(re.search(r"rebuilt views: (\d+) events", out.stdout).group(1)) == events
    listed = json.loads(cli("episodes", "--db", url, "--json").stdout)
    assert listed["total"] == 4  # and the episodes read model catches up at its next use


def test_verify_says_a_read_model_holds_an_unfinished_rebuild(cli, db, tmp_path):
    """The state an interrupted `rebuild --workers 2` leaves: rows written, checkpoint still 0."""
    url, ids = db
    url, engine = _copy(url, tmp_path)
    assert cli("rebuild", "--db", url).exit_code == 0
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE projection_checkpoints SET position = 0 WHERE name = 'views'"))
    engine.dispose()
    out = cli("verify", "--db", url)
    assert out.exit_code == 0 and out.stdout.strip().endswith("ok"), out.stdout
    assert (f"views not compared (it holds {len(ids)} rows of an unfinished rebuild, still running "
            "in another process or interrupted; once it ends, or after `companyos rebuild` or "
            "`companyos episodes`, verify compares it)") in out.stdout
    assert f"episodes {len(ids)} rows" in out.stdout
    assert cli("episodes", "--db", url).exit_code == 0
    assert f"views {len(ids)} rows" in cli("verify", "--db", url).stdout


def test_a_read_only_listing_of_an_interrupted_rebuild_lists_no_part_folded_rows(cli, db, tmp_path):
    """After a `rebuild --workers 2` cut short, `mode=ro` listed the rows it had written as if
    they were the log's: finished episodes as running, part-way (2 of 3 tries)."""
    url, ids = db
    url, engine = _copy(url, tmp_path)
    assert cli("rebuild", "--db", url).exit_code == 0
    with engine.begin() as conn:  # as a cut-short rebuild leaves it: rows, checkpoint still 0
        conn.execute(sa.text("UPDATE projection_checkpoints SET position = 0 WHERE name = 'episodes'"))
    engine.dispose()
    ro = f"sqlite:///file:{url.removeprefix('sqlite:///')}?mode=ro&uri=true"
    out = cli("episodes", "--db", ro, "--json")
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout)["episodes"] == [] and json.loads(out.stdout)["total"] == 0
    assert "holds the rows of an unfinished rebuild (still running in another process, or " \
           "interrupted)" in out.stderr and "nothing is listed" in out.stderr


def test_rebuild_of_a_damaged_log_names_what_it_left_out_and_exits_1(cli, db, tmp_path):
    url, ids = db
    url, engine = _copy(url, tmp_path)
    tamper.edit_event(engine, ids[1], 2, "data", lambda _data: '{"broken')
    engine.dispose()
    for workers in ("1", "2"):
        out = cli("rebuild", "--workers", workers, "--db", url)
        assert out.exit_code == 1 and "rebuilt episodes, views" in out.stdout
        assert "1 episode(s) left out of the views read model" in out.stderr
        assert ids[1] in out.stderr and "the log is damaged" in out.stderr


def test_rebuild_names_an_episode_whose_first_commit_is_gone(cli, db, tmp_path):
    """Its later events fold into no row (they do not start an episode); the rebuild used to
    leave the episode out of both read models without a word and exit 0."""
    url, ids = db
    url, engine = _copy(url, tmp_path)
    tamper.delete_commit(engine, tamper.stream_commits(engine, ids[1])[0][0])
    engine.dispose()
    for workers in ("1", "2"):
        out = cli("rebuild", "--workers", workers, "--db", url)
        assert out.exit_code == 1 and "the log is damaged" in out.stderr, out.stderr
        for name in ("episodes", "views"):
            assert f"1 episode(s) left out of the {name} read model" in out.stderr
        assert ids[1] in out.stderr and ids[0] not in out.stderr
        listed = json.loads(cli("episodes", "--db", url, "--json").stdout)["episodes"]
        assert sorted(row["episode_id"] for row in listed) == sorted(set(ids) - {ids[1]})


def _writer_always_ahead(url: str, monkeypatch) -> list:
    """Make every page the read models fetch come after one more append by another writer, as a
    `run --workers 2` on a loaded machine logs faster than they fold; the pages fetched."""
    from eventstore import NewEvent
    from projections import runner

    writer = EventStore.open(url)
    real = runner.fetch_page
    pages: list = []

    def fetch_page_while_logging(store, after, limit, upto=None):
        pages.append(after)
        assert len(pages) < 40, "the catch-up chases the writer"
        writer.append(f"noted-{len(pages)}", [NewEvent("Noted", {})], None)
        return real(store, after, limit, upto)

    monkeypatch.setattr(runner, "fetch_page", fetch_page_while_logging)
    return pages


@pytest.mark.parametrize("command", [("episodes", "--json", "--limit", "0"),
                                     ("rebuild", "--workers", "1")], ids=["episodes", "rebuild"])
def test_a_catch_up_folds_the_log_as_asked_while_a_writer_keeps_logging(cli, db, tmp_path,
                                                                       monkeypatch, command):
    """A writer logging faster than the read models fold kept `companyos episodes` (and `rebuild`)
    catching up until it stopped: a listing during a long run waited for the whole run. They fold
    the log as it stood when asked."""
    url, ids = db
    url, engine = _copy(url, tmp_path)
    engine.dispose()
    pages = _writer_always_ahead(url, monkeypatch)
    out = cli(command[0], "--db", url, *command[1:])
    assert out.exit_code == 0, out.stderr
    assert 1 <= len(pages) <= 3, pages
    if command[0] == "episodes":
        assert sorted(e["episode_id"] for e in json.loads(out.stdout)["episodes"]) == sorted(ids)


def test_the_server_lists_the_log_as_asked_while_a_writer_keeps_logging(db, tmp_path, monkeypatch):
    from tests.test_api import client

    url, ids = db
    url, engine = _copy(url, tmp_path)
    engine.dispose()
    pages = _writer_always_ahead(url, monkeypatch)
    with client(url) as c:
        listed = c.get("/episodes", params={"limit": 10})
    assert listed.status_code == 200, listed.text
    assert sorted(e["episode_id"] for e in listed.json()["episodes"]) == sorted(ids)
    assert 1 <= len(pages) <= 3, pages


def _copy(url: str, tmp_path) -> tuple[str, sa.Engine]:
    import shutil

    copy = tmp_path / "copy.db"
    shutil.copy(sa.make_url(url).database, copy)
    return f"sqlite:///{copy}", sa.create_engine(f"sqlite:///{copy}")


def test_verify_reports_a_damaged_commit_against_its_episode_when_read_models_exist(cli, db, tmp_path):
    """verify compares read-model rows with their rebuild; a differing row of an episode whose
    commit no longer unpacks stopped the whole report at that commit."""
    url, ids = db
    url, engine = _copy(url, tmp_path)
    assert cli("rebuild", "--db", url).exit_code == 0  # read models built, as after any listing
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE commits SET payload = substr(payload, 1, 50) WHERE position = :p"),
                     {"p": tamper.stream_commits(engine, ids[1])[2][0]})
    tamper.edit_event(engine, ids[2], 0, "data", lambda data: data.replace('"seed":3', '"seed":4'))
    engine.dispose()
    doc = json.loads(cli("verify", "--db", url, "--json").stdout)
    assert doc["ok"] is False and sorted(b["episode_id"] for b in doc["broken"]) == sorted(ids[1:])


def test_a_read_model_table_dropped_by_hand_is_made_again_by_rebuild(cli, db, tmp_path):
    """docs/projections.md: a damaged read model can always be rebuilt from the log; with its
    table gone, `rebuild` failed as `episodes` did (no such table)."""
    url, ids = db
    url, engine = _copy(url, tmp_path)
    assert cli("rebuild", "--db", url).exit_code == 0
    with engine.begin() as conn:
        conn.execute(sa.text("DROP TABLE episodes"))
        conn.execute(sa.text("DROP TABLE episode_views"))
        conn.execute(sa.text("UPDATE projection_checkpoints SET position = 0"))  # so a catch-up folds
    engine.dispose()
    out = companyos("episodes", "--db", url)
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    assert "no such table: episodes; `companyos rebuild` makes the read model's table again" in out.stderr
    out = companyos("rebuild", "--db", url)
    assert out.returncode == 0, out.stderr
    listed = json.loads(companyos("episodes", "--db", url, "--json").stdout)
    assert sorted(e["episode_id"] for e in listed["episodes"]) == sorted(ids)
    assert json.loads(companyos("verify", "--db", url, "--json").stdout)["ok"] is True


@pytest.mark.parametrize(("damage", "words"), [
    # SQLite keeps what a hand-made UPDATE writes. A text first_version reached the folds, which
    # compared it with numbers (a traceback); a payload that is not UTF-8 failed sqlite3's decoding
    # as the row was fetched, which stopped verify, rebuild and every listing for the whole store
    ("first_version = 'x'", "its first_version 'x' is no integer"),
    ("payload = CAST(x'80' AS TEXT) || payload", "its payload is not UTF-8 text"),
])
def test_a_commit_row_edited_by_hand_is_named_against_its_episode(cli, db, tmp_path, damage, words):
    url, ids = db
    url, engine = _copy(url, tmp_path)
    assert cli("rebuild", "--db", url).exit_code == 0
    position = tamper.stream_commits(engine, ids[1])[1][0]
    with engine.begin() as conn:
        conn.execute(sa.text(f"UPDATE commits SET {damage} WHERE position = :p"), {"p": position})
    engine.dispose()
    *verified, replayed = two_at_a_time(lambda args: companyos(*args), (
        *(("verify", "--db", url, "--workers", workers, "--json") for workers in ("1", "2")),
        ("replay", ids[1], "--db", url)))
    for out in verified:
        assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
        doc = json.loads(out.stdout)
        assert [b["episode_id"] for b in doc["broken"]] == [ids[1]]
        assert any(f"the commit at position {position}" in problem and words in problem
                   for problem in doc["broken"][0]["problems"]), doc
    assert replayed.returncode == 1 and f"the commit at position {position}" in replayed.stderr
    out = companyos("rebuild", "--db", url)
    assert out.returncode == 1 and ids[1] in out.stderr and "Traceback" not in out.stderr
    assert "left out" in out.stderr
    listed = json.loads(companyos("episodes", "--db", url, "--json").stdout)
    assert sorted(e["episode_id"] for e in listed["episodes"]) == sorted(set(ids) - {ids[1]})


@pytest.mark.parametrize(("column", "change", "words"), [
    ("type", lambda _: "Bogus", "unknown event type 'Bogus'"),
    ("schema", lambda _: 99, "schema version 99 is newer than this code"),
    ("data", lambda _: '{"step":5}', "missing 1 required positional argument: 'action'"),
    ("data", lambda _: "[1,2]", "must be a mapping"),
])
def test_an_event_that_does_not_decode_is_named_not_a_traceback(cli, db, tmp_path, column, change, words):
    url, ids = db
    url, engine = _copy(url, tmp_path)
    version = tamper.versions_of_type(engine, ids[0], "ActionTaken")[1]
    tamper.edit_event(engine, ids[0], version, column, change)
    engine.dispose()
    out = companyos("replay", ids[0], "--db", url)
    assert out.returncode == 1 and not out.stdout and "Traceback" not in out.stderr
    assert f"the event at version {version}" in out.stderr and words in out.stderr
    assert "companyos verify" in out.stderr
    out = companyos("rerun", ids[0], "--db", url)  # a renamed type is just not an action to re-run
    assert out.returncode == 1 and "MISMATCH" in out.stdout and "Traceback" not in out.stderr
    assert column == "type" or "the log is damaged" in out.stdout


def test_replay_of_a_stream_whose_first_commit_is_gone_names_the_damage(cli, db, tmp_path):
    url, ids = db
    url, engine = _copy(url, tmp_path)
    tamper.delete_commit(engine, tamper.stream_commits(engine, ids[0])[0][0])
    engine.dispose()
    for step in ([], ["--step", "0"]):
        out = companyos("replay", ids[0], "--db", url, *step)
        assert out.returncode == 1 and "an episode starts with EpisodeStarted" in out.stderr


def companyos(*args: str):
    """The real entry point: damage is mapped to one error line there, not in the commands."""
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "companyos", *args], capture_output=True, text=True)


@pytest.mark.parametrize("args", [["replay", "\udcff\udcfe"], ["rerun", "\udcff"],
                                  ["episodes", "--agent", "x\udcff"]])
def test_text_that_is_not_utf8_is_refused_in_words(cli, db, args):
    """Bytes that are not UTF-8 in argv arrive as lone surrogates; the driver raised on them."""
    url, _ = db
    out = cli(*args, "--db", url)
    assert out.exit_code == 2 and "is not UTF-8 text" in out.output


@pytest.mark.parametrize("command", ["replay", "rerun"])
@pytest.mark.parametrize(("episode", "words"), [("", "an episode id cannot be empty"),
                                                ("e" * 201, "no episode id is longer than 200")])
def test_an_episode_id_no_stream_can_have_is_refused_in_words(cli, db, command, episode, words):
    """The store's own check of the id reached the user as a traceback (exit 1)."""
    url, _ = db
    out = cli(command, episode, "--db", url)
    assert out.exit_code == 2 and words in out.output and "Traceback" not in out.output, out.output
    out = cli(command, "e" * 200, "--db", url)  # the longest a stream id can be: looked up
    assert out.exit_code == 2 and "no episode 'eeee" in out.output, out.output


def test_a_store_named_by_a_sqlite_uri_is_the_same_store(cli, db, tmp_path, monkeypatch):
    """`sqlite:///file:x.db?uri=true` (and `mode=ro`, to look without writing) names the file x.db:
    the commands that read the log find it, and the writer lock is the plain spelling's."""
    import shutil

    from eventstore.engine import sqlite_file

    url, ids = db
    shutil.copy(sa.make_url(url).database, tmp_path / "my store.db")
    monkeypatch.chdir(tmp_path)
    for uri in ("sqlite:///file:my%20store.db?uri=true", "sqlite:///file:my%20store.db?mode=ro&uri=true",
                f"sqlite:///file:{(tmp_path / 'my%20store.db').as_posix()}?mode=ro&uri=true"):
        assert sqlite_file(uri).endswith("my store.db")
        out = cli("verify", "--db", uri)
        assert out.exit_code == 0 and out.stdout.strip().endswith("ok"), (uri, out.output)
        listed = json.loads(cli("episodes", "--db", uri, "--json").stdout)["episodes"]
        assert sorted(e["episode_id"] for e in listed) == sorted(ids)
    assert not list(tmp_path.glob("file:*")), "no lock or store file is made under the URI's text"


def _listed_then_one_more(cli, path) -> tuple[str, str, int]:
    """A store whose read models list one episode, and a second logged after that listing: the
    URL, the first episode's id, and the log's last position."""
    from tests.test_projections import play

    url = f"sqlite:///{path}"
    with EventStore.open(url) as store:
        first = play(store, "expense_report", 1, "none", "expert")["episode_id"]
    assert json.loads(cli("episodes", "--db", url, "--json").stdout)["episodes"][0]["episode_id"] == first
    with EventStore.open(url) as store:
        play(store, "bug_escalation", 2, "none", "expert")
        return url, first, store.last_position()


@pytest.mark.parametrize("read_only", ["mode=ro", "immutable=1"])
def test_a_read_only_url_lists_what_the_read_models_hold_and_refuses_to_write(cli, tmp_path, monkeypatch,
                                                                              read_only):
    """`mode=ro` is the README's way to look without writing, yet `episodes` right after a run
    failed ("attempt to write a readonly database", exit 1) catching the read models up, and so
    did `rebuild`, `run` and every route of `serve` (503, while /ready said ready). `immutable=1`
    (read-only media) still did, until it was taken for read-only as well."""
    from companyos.commands import run as run_command
    from companyos.commands import serve

    url, first, _ = _listed_then_one_more(cli, tmp_path / "store.db")
    ro = f"sqlite:///file:{tmp_path / 'store.db'}?{read_only}&uri=true"
    out = cli("episodes", "--db", ro, "--json")
    assert out.exit_code == 0, out.output
    assert [e["episode_id"] for e in json.loads(out.stdout)["episodes"]] == [first]
    assert "the read models are" in out.stderr and "behind the log" in out.stderr
    out = cli("rebuild", "--db", ro)
    assert out.exit_code == 2 and "a rebuild writes the read models" in out.output
    run = command_runner(run_command.register)("run", "--episodes", "1", "--db", ro)
    assert run.exit_code == 2 and "opens the store read-only" in run.output, run.output
    monkeypatch.setattr("uvicorn.run", lambda *a, **k: pytest.fail("the server started"))
    served = command_runner(serve.register)("--port", "0", "--db", ro)
    assert served.exit_code == 2 and "opens the store read-only" in served.output, served.output
    assert json.loads(cli("episodes", "--db", url, "--json").stdout)["episodes"][0]["episode_id"] != first


def test_a_store_on_read_only_media_is_refused_with_the_url_that_opens_it(cli, tmp_path, monkeypatch):
    """SQLite makes the WAL's shared-memory file beside the store even to read, so on a read-only
    mount every command said only "unable to open database file". (The mount is stood in for by
    `os.access` and SQLite's refusal: a read-only mount needs privileges tests lack; by hand, on a
    read-only bind mount, the URL named opened the store.)"""
    import os
    import sqlite3

    import sqlalchemy as sa

    from eventstore import StoreUnreachable, migrate
    from eventstore import store as store_module

    path = tmp_path / "store.db"
    url, _, _ = _listed_then_one_more(cli, path)
    real_access = os.access
    monkeypatch.setattr(store_module.os, "access", lambda p, mode: False if str(p) == str(tmp_path)
                        and mode == os.W_OK else real_access(p, mode))
    refusal = sqlite3.OperationalError("unable to open database file")
    refusal.sqlite_errorcode = 14  # SQLITE_CANTOPEN, as SQLite says it there

    def cannot_open(*args, **kwargs):
        raise sa.exc.OperationalError("PRAGMA journal_mode=WAL", {}, refusal)

    monkeypatch.setattr(migrate, "upgrade", cannot_open)
    with pytest.raises(StoreUnreachable) as refused:  # the entry point says it as `error: ...`, exit 1
        cli("episodes", "--db", url)
    said = str(refused.value)
    assert "unable to open database file; its directory cannot be written (read-only media?)" in said
    assert said.endswith(f"open it as sqlite:///file:{path}?immutable=1&uri=true")
    with pytest.raises(StoreUnreachable) as refused:
        cli("episodes", "--db", f"sqlite:///file:{path}?immutable=1&uri=true")
    assert str(refused.value).endswith("unable to open database file")  # named already: no hint


def test_a_store_file_this_process_may_not_write_is_listed_as_a_read_only_url_is(cli, tmp_path,
                                                                                 monkeypatch):
    """A store file on a read-only mount (or another user's) without `mode=ro` in the URL: SQLite
    opens it read-only by itself, and `episodes` failed at its first write ("attempt to write a
    readonly database", exit 1) where `verify`, `replay` and `rerun` worked. It now lists what the
    read models hold, saying why it cannot bring them up to date. (The file system's refusal is
    `os.access`'s answer, stood in for here: a read-only mount needs privileges tests lack.)"""
    import os

    from eventstore import store as store_module

    path = tmp_path / "store.db"
    url, first, behind = _listed_then_one_more(cli, path)
    real_access = os.access

    def access(p, mode):  # the store's file refuses writes, as on a read-only mount
        return False if str(p) == str(path) and mode == os.W_OK else real_access(p, mode)

    monkeypatch.setattr(store_module.os, "access", access)
    out = cli("episodes", "--db", url, "--json")
    assert out.exit_code == 0, out.output
    assert [e["episode_id"] for e in json.loads(out.stdout)["episodes"]] == [first]
    assert "may not write the store's file" in out.stderr and "behind the log" in out.stderr
    with EventStore.open(url) as store:  # nothing was written: the read models stay behind
        from projections import ProjectionRunner, default_projections

        assert min(ProjectionRunner(store, default_projections()).stored_checkpoints().values()) < behind


def test_a_read_only_url_lists_a_store_whose_read_models_were_never_built(cli, tmp_path):
    """The README's `episodes --db sqlite:///file:x.db?mode=ro&uri=true` straight after the quick
    start's `run` (no `episodes` before it) failed with "attempt to write a readonly database",
    exit 1: creating the missing checkpoint rows wrote to the store."""
    from tests.test_projections import play

    url = f"sqlite:///{tmp_path / 'store.db'}"
    with EventStore.open(url) as store:
        play(store, "expense_report", 1, "none", "expert")
    ro = f"sqlite:///file:{tmp_path / 'store.db'}?mode=ro&uri=true"
    out = cli("episodes", "--db", ro, "--json")
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout)["episodes"] == []
    assert "behind the log" in out.stderr
    assert len(json.loads(cli("episodes", "--db", url, "--json").stdout)["episodes"]) == 1


def test_a_read_only_postgresql_database_lists_what_the_read_models_hold(cli, fresh_pg_url):
    """A hot standby (here `default_transaction_read_only`, which reads the same to a session):
    `episodes` failed with "cannot execute INSERT in a read-only transaction" bringing the read
    models up to date. It lists what they hold (on a standby, what the primary folded) and says
    what it could not fold, as a SQLite `mode=ro` URL does."""
    from tests.conftest import _pg_engine
    from tests.test_projections import play

    with EventStore.open(fresh_pg_url) as store:
        first = play(store, "expense_report", 1, "none", "expert")["episode_id"]
    assert [e["episode_id"] for e in json.loads(cli("episodes", "--db", fresh_pg_url, "--json").stdout)[
        "episodes"]] == [first]
    with EventStore.open(fresh_pg_url) as store:
        play(store, "bug_escalation", 2, "none", "expert")
    admin = _pg_engine()
    database = sa.make_url(fresh_pg_url).database
    with admin.connect() as conn:
        conn.exec_driver_sql(f"ALTER DATABASE {database} SET default_transaction_read_only = on")
    try:
        out = cli("episodes", "--db", fresh_pg_url, "--json")
        assert out.exit_code == 0, out.output
        assert [e["episode_id"] for e in json.loads(out.stdout)["episodes"]] == [first]
        assert "behind the log" in out.stderr and "the database takes no writes" in out.stderr, out.stderr
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f"ALTER DATABASE {database} RESET default_transaction_read_only")
        admin.dispose()
    assert len(json.loads(cli("episodes", "--db", fresh_pg_url, "--json").stdout)["episodes"]) == 2


def test_a_role_with_select_grants_only_lists_what_the_read_models_hold(cli, fresh_pg_url):
    """A reporting role that may only read: `episodes` failed with "permission denied for table
    projection_checkpoints" bringing the read models up to date; it lists what they hold, as on
    a standby, and says why it could not fold the rest."""
    import uuid

    from tests.conftest import _pg_engine
    from tests.test_projections import play

    with EventStore.open(fresh_pg_url) as store:
        first = play(store, "expense_report", 1, "none", "expert")["episode_id"]
    assert len(json.loads(cli("episodes", "--db", fresh_pg_url, "--json").stdout)["episodes"]) == 1
    with EventStore.open(fresh_pg_url) as store:
        play(store, "bug_escalation", 2, "none", "expert")
    role = f"reader_{uuid.uuid4().hex[:8]}"
    owner = sa.create_engine(sa.make_url(fresh_pg_url).set(drivername="postgresql+psycopg"))
    admin = _pg_engine()
    with admin.connect() as conn:
        conn.exec_driver_sql(f"CREATE ROLE {role} LOGIN")
    try:
        with owner.begin() as conn:
            conn.exec_driver_sql(f"GRANT SELECT ON ALL TABLES IN SCHEMA public TO {role}")
        as_reader = sa.make_url(fresh_pg_url).set(username=role).render_as_string(hide_password=False)
        out = cli("episodes", "--db", as_reader, "--json")
        assert out.exit_code == 0, out.output
        assert [e["episode_id"] for e in json.loads(out.stdout)["episodes"]] == [first]
        assert "a role with SELECT grants only" in out.stderr, out.stderr
    finally:
        with owner.begin() as conn:
            conn.exec_driver_sql(f"REVOKE ALL ON ALL TABLES IN SCHEMA public FROM {role}")
        owner.dispose()
        with admin.connect() as conn:
            conn.exec_driver_sql(f"DROP ROLE {role}")
        admin.dispose()


def test_verify_waits_for_an_older_transaction_and_never_says_a_bare_ok_over_a_part(cli, fresh_pg_url):
    """PostgreSQL readers stop below the oldest running transaction of the whole cluster: a
    transaction held open anywhere made verify check nothing and print "ok", exit 0."""
    import threading

    from tests.test_projections import play

    store = EventStore.open(fresh_pg_url)
    holder = sa.create_engine(store.engine.url)
    try:
        with holder.connect() as conn:
            conn.exec_driver_sql("SELECT pg_current_xact_id()")  # holds the high-water mark
            episode = play(store, "expense_report", 5, "medium", "expert")["episode_id"]
            out = cli("verify", "--db", fresh_pg_url, "--wait", "0.3")
            assert out.exit_code == 0, out.output
            lines = out.stdout.strip().splitlines()
            assert lines[0].startswith("0 streams, 0 events checked")
            assert "still running after 0.3 s" in out.stdout
            assert lines[-1].startswith("ok up to position "), lines
            threading.Timer(0.5, conn.rollback).start()  # it ends while verify waits
            out = cli("verify", "--db", fresh_pg_url, "--json")
        report = json.loads(out.stdout)
        assert out.exit_code == 0 and report["ok"] and not report["waiting"]
        assert report["streams"] == 1 and report["events"] == len(list(store.read_stream(episode)))
    finally:
        holder.dispose()
        store.close()


@pytest.mark.parametrize("encoding", ["latin-1", "ascii"])
def test_output_to_a_terminal_that_cannot_show_every_character(tmp_path, encoding):
    """A legacy locale (LANG=de_DE.ISO-8859-1, or PYTHONIOENCODING) gives stdout an encoding
    that lacks characters the output holds: `rerun` crashed with a UnicodeEncodeError traceback
    on its em dash even for a match, `replay` on the action an agent wrote, and `--json` too."""
    import os
    import subprocess
    import sys

    from companyos.env import CompanyEnv

    url = f"sqlite:///{tmp_path / 'store.db'}"
    comment = "Grüße — 😀"
    with CompanyEnv(url) as env:
        env.reset(seed=1, options={"task": "expense_report", "chaos": "none"})
        env.step({"app": "ticketdesk", "method": "add_comment",
                  "params": {"ticket_id": "T-101", "text": comment}})
        episode_id = env.state["episode_id"]

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "companyos", *args, "--db", url],
                              capture_output=True, env={**os.environ, "PYTHONIOENCODING": encoding})

    calls = (("rerun", episode_id), ("replay", episode_id), ("replay", episode_id, "--step", "1"),
             ("run", "--agent", "random", "--episodes", "2"), ("replay", episode_id, "--step", "1", "--json"))
    outs = two_at_a_time(lambda args: run(*args), calls)
    for args, out in zip(calls, outs, strict=True):
        assert out.returncode == 0 and b"Traceback" not in out.stderr, (args, out.stderr.decode())
        assert out.stdout
    out = outs[-1]
    # JSON in its own encoding, UTF-8, whatever the terminal's
    assert json.loads(out.stdout.decode("utf-8"))["action"]["params"]["text"] == comment


def _judged_by_each_version(url: str) -> dict[int, str]:
    """An episode judged by each rules version; their ids."""
    from companyos.env import CompanyEnv

    with CompanyEnv(url) as env:
        return {rules: env.reset(seed=5, options={"rules": rules})[1]["episode_id"] for rules in (1, 2)}


def test_episodes_are_listed_with_their_rules_version_and_filtered_by_it(cli, tmp_path):
    url = f"sqlite:///{tmp_path / 's.db'}"
    ids = _judged_by_each_version(url)
    for rules, episode_id in ids.items():
        out = cli("episodes", "--db", url, "--json", "--rules", str(rules))
        listed = json.loads(out.stdout)
        assert [(e["episode_id"], e["rules"]) for e in listed["episodes"]] == [(episode_id, rules)]
        assert listed["total"] == 1
    table = cli("episodes", "--db", url).stdout.splitlines()  # the table says it too, not only --json
    header = table[0].split()
    assert header[:5] == ["episode", "task", "seed", "chaos", "rules"]
    assert {line.split()[0]: int(line.split()[4]) for line in table[1:]} == {v: k for k, v in ids.items()}
    out = cli("episodes", "--db", url, "--rules", "9")
    assert out.exit_code == 2 and "no rules version 9; the versions are 1, 2" in out.stderr
    for rules, episode_id in ids.items():  # re-run and replayed under the version each names
        assert f"rules version {rules}, digest" in cli("rerun", episode_id, "--db", url).stdout
        assert json.loads(cli("rerun", episode_id, "--db", url, "--json").stdout)["rules"] == rules
        assert cli("replay", episode_id, "--db", url).stdout.splitlines()[0].endswith(f" rules {rules}")


def test_a_store_from_before_rules_versions_is_upgraded_and_lists_each_episode_s_version(cli, tmp_path):
    """Migration 0006 adds the column (1 for rows already there) and the projection's new version
    refolds the read model, so an episode judged by version 2 says 2, not the column's default."""
    url = f"sqlite:///{tmp_path / 's.db'}"
    ids = _judged_by_each_version(url)
    assert cli("episodes", "--db", url).exit_code == 0  # the read model as it was then
    engine = sa.create_engine(url)
    with engine.begin() as conn:  # as the code before this column left the store
        conn.execute(sa.text("DROP INDEX ix_episodes_rules"))
        conn.execute(sa.text("ALTER TABLE episodes DROP COLUMN rules"))
        conn.execute(sa.text("UPDATE alembic_version SET version_num = '0005_separated_payloads'"))
        conn.execute(sa.text("UPDATE projection_checkpoints SET version = 1 WHERE name = 'episodes'"))
    engine.dispose()
    listed = json.loads(cli("episodes", "--db", url, "--json").stdout)["episodes"]
    assert {e["episode_id"]: e["rules"] for e in listed} == {i: rules for rules, i in ids.items()}


def test_verify_json_on_a_terminal_is_json_alone(db, tmp_path):
    """With a terminal for stdout whose output is kept (`docker run -t … > file`, `script`), the
    progress bar's escape codes were written into the JSON of `verify --json`. The bar is drawn on
    stderr, and only when stderr is a terminal."""
    import os
    import pty
    import subprocess
    import sys

    url, _ = db
    main, child = pty.openpty()
    done = subprocess.run([sys.executable, "-m", "companyos", "verify", "--db", url, "--json"],
                          stdout=child, stderr=subprocess.DEVNULL, timeout=120)
    os.close(child)
    out = b""
    while True:
        try:
            chunk = os.read(main, 65536)
        except OSError:  # the terminal closed: all is read
            break
        if not chunk:
            break
        out += chunk
    os.close(main)
    assert done.returncode == 0
    assert json.loads(out.decode())["ok"] is True, out[:200]


@pytest.mark.parametrize("command", [["rebuild"], ["verify"], ["episodes"], ["analytics", "sync"]])
def test_sigterm_stops_a_long_command_as_ctrl_c_does(db, tmp_path, monkeypatch, capsys, command):
    """SIGTERM (`timeout`, `docker stop`, systemd) ended `rebuild`, `verify`, `episodes` catching
    up and the analytics' sync in silence (exit 143); they now stop as for Ctrl-C: `error:
    interrupted`, exit 130."""
    import os
    import shutil
    import signal
    import time

    import analytics.sync
    from companyos import cli
    from projections import runner, verify

    url, _ = db
    copy = tmp_path / "store.db"
    shutil.copy(url.removeprefix("sqlite:///"), copy)
    if command == ["episodes"]:  # its read models behind the log, so it catches up first
        with EventStore.open(f"sqlite:///{copy}") as store, store.engine.begin() as conn:
            conn.exec_driver_sql("DELETE FROM projection_checkpoints")

    def terminated(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler runs at once; were it the default, the process would be gone
        raise AssertionError("SIGTERM did not stop the command")

    monkeypatch.setattr(runner.ProjectionRunner, "rebuild", terminated)
    monkeypatch.setattr(runner.ProjectionRunner, "catch_up", terminated)
    monkeypatch.setattr(verify, "verify", terminated)
    monkeypatch.setattr(analytics.sync, "sync", terminated)
    monkeypatch.setattr("sys.argv", ["companyos", *command, "--db", f"sqlite:///{copy}"])
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(SystemExit) as stopped:
        cli.main()
    assert stopped.value.code == 130
    assert capsys.readouterr().err == "error: interrupted\n"
    assert signal.getsignal(signal.SIGTERM) is before  # put back once the work is done


def test_a_forked_worker_ends_at_sigterm_as_it_would_without_the_parents_handler():
    """The parent stops its workers with SIGTERM; inheriting the parent's handler, a worker would
    raise KeyboardInterrupt (a traceback each) instead of ending."""
    import multiprocessing
    import os
    import signal

    from companyos.commands.output import sigterm_as_ctrl_c
    from projections import parallel

    def worker(where) -> None:
        parallel._worker_store(where)
        os.kill(os.getpid(), signal.SIGTERM)

    with sigterm_as_ctrl_c():
        proc = multiprocessing.get_context("fork").Process(target=worker, args=(("sqlite://", {}, 0),))
        proc.start()
        proc.join(30)
    assert proc.exitcode == -signal.SIGTERM
