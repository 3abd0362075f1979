"""Projections: replay equals the live world, rerun matches, verify catches damage, rebuild is exact."""

from __future__ import annotations

import contextlib
import re

import orjson
import pytest
import sqlalchemy as sa

import domain
from eventstore import CorruptCommit, EventStore, NewEvent, canonical_json
from projections import ProjectionRunner, default_projections
from projections.episodes import EpisodesProjection, list_episodes, summarize
from projections.replay import StepNotFound, render_replay, replay
from projections.rerun import rerun
from projections.schema import episode_views, episodes, projection_checkpoints
from projections.verify import verify
from tests import tamper

CHAOS = ("none", "low", "medium", "high")


def play(store: EventStore, task: str, seed: int, chaos: str, agent: str,
         durability: str = "step") -> dict:
    """Run one episode through CompanyEnv; return its id and the live views/actions per step."""
    from companyos.agents import make_agent
    from companyos.env import CompanyEnv

    env = CompanyEnv(db=store, durability=durability, agent=agent)
    bot = make_agent(agent, seed)
    obs, info = env.reset(seed=seed, options={"task": task, "chaos": chaos})
    bot.reset(obs)
    live = {"episode_id": info["episode_id"], "views": [domain.views(env.runtime.state)],
            "actions": [None], "rewards": [0.0], "messages": [None]}
    done = False
    while not done:
        action = bot.act(obs)
        obs, reward, terminated, truncated, info = env.step(action)
        live["views"].append(domain.views(env.runtime.state))
        live["actions"].append(domain.events.to_json_value(action))
        live["rewards"].append(reward)
        live["messages"].append(obs["message"])
        done = terminated or truncated
    env.close()
    return live


@pytest.fixture(scope="module")
def logged(tmp_path_factory):
    """A store with an episode of every family at every chaos level, expert and random agents."""
    url = f"sqlite:///{tmp_path_factory.mktemp('proj') / 'store.db'}"
    store = EventStore.open(url)
    played = []
    for i, task in enumerate(domain.TASK_FAMILIES):
        for j, chaos in enumerate(CHAOS):
            agent = "expert" if (i + j) % 2 == 0 else "random"
            played.append({"task": task, "chaos": chaos, "agent": agent,
                           **play(store, task, 100 + 10 * i + j, chaos, agent)})
    store.close()
    return url, played


def copy_store(url: str, tmp_path) -> EventStore:
    """A private copy of the module's store, for tests that damage it."""
    import shutil

    src = sa.make_url(url).database
    dst = tmp_path / "copy.db"
    shutil.copy(src, dst)
    for suffix in ("-wal", "-shm"):
        with contextlib.suppress(FileNotFoundError):
            shutil.copy(src + suffix, str(dst) + suffix)
    return EventStore.open(f"sqlite:///{dst}")


def dump(store: EventStore) -> dict:
    with store.engine.connect() as conn:
        return {t.name: sorted(map(tuple, conn.execute(sa.select(t)).all()))
                for t in (episodes, episode_views)}


# -- replay ----------------------------------------------------------------------------------


def test_replay_at_every_step_equals_the_live_views(logged):
    url, played = logged
    store = EventStore.open(url)
    chosen = [p for p in played if p["chaos"] in ("medium", "high")][:4]
    for p in chosen:
        steps = len(p["views"]) - 1
        for k in range(steps + 1):
            r = replay(store, p["episode_id"], k)
            assert r["step"] == k and r["steps"] == steps
            for app in ("ticketdesk", "datahub", "approvalflow"):
                assert r[app] == p["views"][k][app], (p["episode_id"], k, app)
            assert r["action"] == p["actions"][k]
            if k:
                assert r["reward"] == pytest.approx(p["rewards"][k])
                assert r["result"]["message"] == p["messages"][k]
        assert replay(store, p["episode_id"])["step"] == steps
        with pytest.raises(StepNotFound):
            replay(store, p["episode_id"], steps + 1)
    store.close()


def test_replay_reports_chaos_rewards_and_the_end(logged):
    url, played = logged
    store = EventStore.open(url)
    p = next(p for p in played if p["chaos"] == "high")
    last = replay(store, p["episode_id"])
    assert last["ended"]["outcome"] in ("success", "failure", "truncated")
    assert any(r["rule"] == "step" for r in last["rewards"])
    struck = [c for k in range(last["steps"] + 1)
              for c in replay(store, p["episode_id"], k)["chaos"]]
    assert struck and all(c["cause"] == "chaos" and c["type"] for c in struck)
    store.close()


def test_replay_does_not_take_an_action_that_mentions_chaos_for_chaos(tmp_path):
    from companyos.env import CompanyEnv

    with CompanyEnv(f"sqlite:///{tmp_path / 'store.db'}") as env:
        _, info = env.reset(seed=1, options={"task": "bug_escalation", "chaos": "none"})
        env.step({"app": "ticketdesk", "method": "list_tickets", "params": {"cause": "chaos"}})
        step = replay(env.store, info["episode_id"], 1)
    assert step["events"][0] == "ActionTaken" and step["chaos"] == []


def test_replay_says_what_the_rules_held_against_a_step_that_was_not_refused(tmp_path):
    """Resolving the ticket too soon is accepted and recorded as a mistake: the replay named
    neither the mode nor why ("priority is not critical"), so finding the real omission took SQL."""
    from companyos.env import CompanyEnv

    with CompanyEnv(f"sqlite:///{tmp_path / 'store.db'}") as env:
        obs, info = env.reset(seed=1, options={"task": "bug_escalation", "chaos": "none"})
        ticket = re.search(r"T-\d+", obs["goal"]).group(0)
        env.step({"app": "ticketdesk", "method": "update_ticket",
                  "params": {"ticket_id": ticket, "field": "status", "value": "resolved"}})
        step = replay(env.store, info["episode_id"], 1)
        quiet = replay(env.store, info["episode_id"], 0)
    (mistake,) = step["mistakes"]
    assert step["result"]["rejected"] is None
    assert mistake["mode"] == "premature_resolution" and mistake["subject"] == ticket
    assert "priority is not critical" in mistake["detail"]
    assert f"mistake [premature_resolution]: {mistake['detail']} ({ticket})" in render_replay(step)
    assert quiet["mistakes"] == [] and "mistake [" not in render_replay(quiet)


def test_replay_says_a_rejection_handled_later_is_no_mistake_as_the_analytics_count_it(tmp_path):
    """A chaos rejection the expert escalated showed as "mistake [rejection_not_handled]" in the
    replay, which the analytics (rightly) do not count: checking first_mistake_step against the
    replay found mistakes that were none."""
    from analytics.sync import sync
    from analytics.warehouse import Warehouse
    from companyos.batch import RunPlan
    from companyos.batch import run as run_plan

    url = f"sqlite:///{tmp_path / 'store.db'}"
    run_plan(RunPlan(url, "expert", "all", "high", 40, 0, "episode"), workers=1)
    with Warehouse(tmp_path / "w.duckdb") as wh:
        sync(url, wh)
        counts = dict(wh.con.execute("SELECT episode_id, mistakes FROM episodes").fetchall())
        recorded = {e for (e,) in wh.con.execute(
            "SELECT DISTINCT episode_id FROM steps WHERE mistake IS NOT NULL").fetchall()}
    assert recorded, "the expert at high chaos meets rejections it handles"
    uncounted = 0
    with EventStore.open(url) as store:
        for episode_id in recorded:
            steps = replay(store, episode_id)["steps"]
            shown = [m for k in range(steps + 1) for m in replay(store, episode_id, k)["mistakes"]]
            assert sum(m["counted"] for m in shown) == counts[episode_id], episode_id
            uncounted += sum(not m["counted"] for m in shown)
            assert all(m["counted"] or m["mode"] == "rejection_not_handled" for m in shown)
    assert uncounted


# -- rerun -----------------------------------------------------------------------------------


def test_rerun_matches_every_family_and_chaos_level(logged):
    url, played = logged
    store = EventStore.open(url)
    assert {(p["task"], p["chaos"]) for p in played} == {
        (t, c) for t in domain.TASK_FAMILIES for c in CHAOS}
    for p in played:
        result = rerun(store, p["episode_id"])
        assert result.match, result.to_json()
        assert result.rerun_digest == store.stream_digest(p["episode_id"])
    store.close()


def test_rerun_shows_the_first_differing_event(logged, tmp_path):
    url, played = logged
    store = copy_store(url, tmp_path)
    victim = played[3]["episode_id"]
    for version in tamper.versions_of_type(store.engine, victim, "ActionTaken"):
        tamper.edit_event(store.engine, victim, version, "data",
                          lambda data: data.replace('"step":2', '"step":7'))
    result = rerun(store, victim)
    assert not result.match
    assert result.stored.type == result.rerun.type == "ActionTaken"
    assert '"step":7' in result.stored.data_json and '"step":2' in result.rerun.data_json
    store.close()


def _rerun_edited(logged, tmp_path, which: int, event_type: str, column: str, change, nth: int = 0):
    """`rerun` of played episode `which` once the `nth` event of `event_type` had its `column`
    changed behind the store's back (in a private copy of the log): (result, that event's version)."""
    url, played = logged
    store = copy_store(url, tmp_path)
    try:
        victim = played[which]["episode_id"]
        version = tamper.versions_of_type(store.engine, victim, event_type)[nth]
        tamper.edit_event(store.engine, victim, version, column, change)
        return rerun(store, victim), version
    finally:
        store.close()


def test_rerun_says_a_stored_event_was_altered_when_its_digest_still_chains(logged, tmp_path):
    def pay_more(data_json: str) -> str:
        data = orjson.loads(data_json)
        data["value"] += 100
        return canonical_json(data).decode()

    result, version = _rerun_edited(logged, tmp_path, 2, "RewardGranted", "data", pay_more)
    assert not result.match and result.first_difference == version
    assert result.stored.digest == result.rerun.digest  # the digest column was left alone
    assert any("altered after it was written" in note for note in result.notes)


def test_rerun_names_the_likely_cause_of_an_edited_action_and_a_deleted_commit(logged, tmp_path):
    """An edited action is replayed as stored, so only its digest differs: rerun blamed "the
    digest column or an earlier event"; a deleted commit was blamed on the version column."""
    url, played = logged
    store = copy_store(url, tmp_path)
    edited, gapped = played[0]["episode_id"], played[1]["episode_id"]
    version = tamper.versions_of_type(store.engine, edited, "ActionTaken")[0]

    def other_method(data_json: str) -> str:
        data = orjson.loads(data_json)
        data["action"]["params"] = {"edited": True}
        return canonical_json(data).decode()

    tamper.edit_event(store.engine, edited, version, "data", other_method)
    result = rerun(store, edited)
    assert not result.match and result.first_difference == version
    assert any("e.g. an edited action" in note for note in result.notes), result.notes
    commits = tamper.stream_commits(store.engine, gapped)
    assert len(commits) > 2, "the episode needs a commit in its middle"
    tamper.delete_commit(store.engine, commits[1][0])
    result = rerun(store, gapped)
    assert not result.match
    assert any("missing (a commit deleted)" in note for note in result.notes), result.notes
    store.close()


def test_rerun_says_when_stored_data_is_the_same_value_in_other_bytes(logged, tmp_path):
    """Data re-spaced by hand showed two identical pretty-printed sides and no note at all."""
    result, version = _rerun_edited(logged, tmp_path, 4, "RewardGranted", "data",
                                    lambda data: data.replace(":", ": "))
    assert not result.match and result.first_difference == version
    assert result.stored.to_json()["data"] == result.rerun.to_json()["data"]
    assert any("the re-simulated value in other bytes" in note for note in result.notes), result.notes


def test_rerun_points_at_an_action_that_does_not_decode(logged, tmp_path):
    """Every action was decoded before anything was re-simulated, so an undecodable one made the
    first difference the stream's start (EpisodeStarted against no event)."""
    result, version = _rerun_edited(logged, tmp_path, 0, "ActionTaken", "schema", lambda _: 99, nth=2)
    assert not result.match and result.first_difference == version, result.to_json()
    assert result.stored.schema_version == 99
    assert "schema version 99" in result.error


def test_rerun_does_not_match_a_stream_whose_versions_were_shifted(logged, tmp_path):
    """The content and digests are intact, only the version columns moved: a replayed or
    continued episode would number its steps wrongly, so it is no match."""
    url, played = logged
    store = copy_store(url, tmp_path)
    victim = played[1]["episode_id"]
    with store.engine.begin() as conn:  # two steps, so no moment breaks the unique index
        for shift in (1000, -999):
            conn.execute(sa.text("UPDATE commits SET first_version = first_version + :d, "
                                 "last_version = last_version + :d WHERE stream_id = :s"),
                         {"d": shift, "s": victim})
    result = rerun(store, victim)
    assert not result.match and result.first_difference == 0
    assert any("stored as version 1" in note for note in result.notes)
    store.close()


def test_rerun_is_no_match_when_the_head_columns_name_another_event(logged, tmp_path):
    """It said "match" (exit 0) where verify said broken and `stream_digest` answered the forged
    digest: it read the events by version and never looked at the head writers chain onto."""
    url, played = logged
    store = copy_store(url, tmp_path)
    victim = played[2]["episode_id"]
    last_event = list(store.read_stream(victim))[-1]
    position = tamper.stream_commits(store.engine, victim)[-1][0]
    with store.engine.begin() as conn:
        conn.execute(sa.text("UPDATE commits SET last_digest = :d WHERE position = :p"),
                     {"d": "0" * 32, "p": position})
    result = rerun(store, victim)
    assert not result.match and result.stored_digest == result.rerun_digest == last_event.digest
    assert any(f"its head (version {last_event.version}, digest {'0' * 32}) is not its last event"
               in note for note in result.notes), result.notes
    store.close()


def test_rerun_is_no_match_when_commits_positions_put_the_events_out_of_order(logged, tmp_path):
    """Two of an episode's commits swapped by position: verify, the read models and the
    analytics meet its events out of order, while rerun (reading by version) said "match"."""
    url, played = logged
    store = copy_store(url, tmp_path)
    victim = played[1]["episode_id"]
    commits = tamper.stream_commits(store.engine, victim)
    assert len(commits) > 2, "the episode needs several commits"
    (first, *_), (second, *_) = commits[1], commits[2]
    with store.engine.begin() as conn:  # through a free position, so the key is never shared
        for old, new in ((first, -1), (second, first), (-1, second)):
            conn.execute(sa.text("UPDATE commits SET position = :n WHERE position = :o"),
                         {"n": new, "o": old})
    result = rerun(store, victim)
    assert not result.match
    assert any("before version" in note and "the commits' positions were altered" in note
               for note in result.notes), result.notes
    store.close()


def test_resuming_an_episode_whose_head_columns_were_altered_is_refused(tmp_path):
    """The next honest step chained onto a forged head: the damage became part of the chain, and
    verify and rerun then blamed that step as an altered event."""
    from companyos.env import CompanyEnv

    url = f"sqlite:///{tmp_path / 'store.db'}"
    with CompanyEnv(url) as env:
        _, info = env.reset(seed=3, options={"task": "bug_escalation"})
        env.step({"app": "ticketdesk", "method": "list_tickets", "params": {}})
        episode = info["episode_id"]
        position = tamper.stream_commits(env.store.engine, episode)[-1][0]
        with env.store.engine.begin() as conn:
            conn.execute(sa.text("UPDATE commits SET last_digest = :d WHERE position = :p"),
                         {"d": "f" * 32, "p": position})
        events = env.store.count_events()
    with CompanyEnv(url) as env:
        with pytest.raises(CorruptCommit, match="the commit's head columns were altered"):
            env.resume(episode)
        assert env.store.count_events() == events  # nothing chained onto it
        with pytest.raises(RuntimeError):  # no episode was taken up
            env.step({"app": "ticketdesk", "method": "list_tickets", "params": {}})


# -- verify ----------------------------------------------------------------------------------


@pytest.fixture
def damaged(logged, tmp_path):
    """A caught-up private copy of the log, ready to be damaged behind the store's back."""
    url, played = logged
    store = copy_store(url, tmp_path)
    ProjectionRunner(store, default_projections()).catch_up()
    yield store, played
    store.close()


@pytest.fixture(params=[1, 2], ids=["1-process", "2-processes"])
def workers(request):
    """verify runs in log order in one process, stream by stream in several."""
    return request.param


def test_a_worker_that_dies_is_said_in_words(damaged, monkeypatch):
    """A verify or rebuild worker killed outright (kill -9, the OOM killer) ended the command with
    a RuntimeError traceback naming list indices."""
    import os

    from projections import parallel

    store, _ = damaged
    monkeypatch.setattr(parallel, "_check_range", lambda *args: os._exit(9))  # forked: inherited
    with pytest.raises(parallel.WorkerFailed, match="2 of 2 worker processes ended before their "
                                                    r"streams were done \(exit code 9, 9"):
        verify(store, workers=2)


def test_verify_passes_on_a_sound_log(damaged, workers):
    store, played = damaged
    report = verify(store, workers=workers)
    assert report.ok, report.problems
    assert report.streams == len(played)
    assert report.read_models["episodes"]["rows"] == len(played)
    assert report.read_models["views"]["differing"] == 0


def test_verify_does_not_blame_a_read_model_another_process_caught_up_meanwhile(
        damaged, workers, monkeypatch):
    """`companyos episodes` in another process catches the read models up while verify runs:
    verify compared rows of the later checkpoint with its fold of the earlier one and called
    a sound store broken (every new episode 'row present, but its rebuild has none')."""
    import projections.verify as verifying

    store, played = damaged
    for seed in (31, 32):
        play(store, "expense_report", seed, "low", "random")
    finish = verifying.Checker.finish

    def caught_up_meanwhile(self, store_):
        ProjectionRunner(store_, default_projections()).catch_up()
        return finish(self, store_)

    monkeypatch.setattr(verifying.Checker, "finish", caught_up_meanwhile)
    report = verify(store, workers=workers)
    assert report.ok, report.problems
    assert report.read_models["episodes"]["rows"] is None
    assert report.read_models["episodes"]["moved_to"] > report.read_models["episodes"]["checkpoint"]
    monkeypatch.undo()
    report = verify(store, workers=workers)
    assert report.ok and report.read_models["episodes"]["rows"] == len(played) + 2


def test_the_views_read_model_equals_the_live_world(damaged):
    import orjson

    store, played = damaged
    with store.engine.connect() as conn:
        rows = {r["episode_id"]: r for r in conn.execute(sa.select(episode_views)).mappings()}
    for p in played:
        row = rows[p["episode_id"]]
        assert orjson.loads(row["views"]) == p["views"][-1]
        assert row["step"] == len(p["views"]) - 1


def _sql(store: EventStore, statement: str, **params) -> None:
    with store.engine.begin() as conn:
        conn.execute(sa.text(statement), params)


def test_verify_names_the_episode_whose_event_was_edited(damaged, workers):
    store, played = damaged
    victim = played[5]["episode_id"]
    version = tamper.versions_of_type(store.engine, victim, "ActionTaken")[0]
    tamper.edit_event(store.engine, victim, version, "data",
                      lambda data: data.replace('"step":1', '"step":9'))
    report = verify(store, workers=workers)
    assert not report.ok
    assert set(report.problems) == {victim}
    assert any("digest" in p for p in report.problems[victim])


def _middle_commit(store: EventStore, stream: str) -> tuple[int, int, int]:
    """A commit of the stream that is neither its first nor its last, holding 2 events or more."""
    commits = tamper.stream_commits(store.engine, stream)
    return next(c for c in commits[1:-1] if c[2] > c[1])


def test_verify_catches_a_deleted_commit(damaged, workers):
    store, played = damaged
    victim = played[6]["episode_id"]
    tamper.delete_commit(store.engine, _middle_commit(store, victim)[0])
    report = verify(store, workers=workers)
    assert set(report.problems) == {victim}
    assert any("missing" in p for p in report.problems[victim])


def test_verify_catches_an_event_cut_out_of_a_commit(damaged, workers):
    store, played = damaged
    victim = played[6]["episode_id"]
    position = _middle_commit(store, victim)[0]

    def cut(payload: dict) -> None:
        for key in tamper.EVENT_COLUMNS:
            del payload[key][0]

    tamper.edit_payload(store.engine, position, cut)
    with store.engine.begin() as conn:  # and the row's bounds made to agree with its payload
        conn.execute(sa.text("UPDATE commits SET last_version = last_version - 1 "
                             "WHERE position = :p"), {"p": position})
    report = verify(store, workers=workers)
    assert set(report.problems) == {victim}
    assert any("missing" in p or "digest" in p for p in report.problems[victim])


@pytest.mark.parametrize("how", ["commit-positions", "events", "data"])
def test_verify_catches_two_swapped_events(damaged, how, workers):
    store, played = damaged
    victim = played[7]["episode_id"]
    position, first, last = _middle_commit(store, victim)
    if how == "commit-positions":  # the log's order changes; each row keeps versions and digests
        commits = tamper.stream_commits(store.engine, victim)
        later = commits[commits.index((position, first, last)) + 1][0]
        tamper.swap_commit_positions(store.engine, position, later)
    elif how == "events":  # two events of one commit trade places wholesale
        tamper.swap_events(store.engine, position, 0, 1, tamper.EVENT_COLUMNS)
    else:  # the contents trade places, versions and digests stay
        tamper.swap_events(store.engine, position, 0, 1, ("type", "data"))
    report = verify(store, workers=workers)
    assert victim in report.problems and len(report.problems) == 1, report.problems


def test_verify_in_log_order_names_the_versions_a_reordered_stream_swapped(damaged):
    """With a stream's first and last commits swapped, the log-order pass said "version 0 is
    stored before version -1" and blamed the head columns, which were never touched."""
    store, played = damaged
    victim = played[7]["episode_id"]
    commits = tamper.stream_commits(store.engine, victim)
    tamper.swap_commit_positions(store.engine, commits[0][0], commits[-1][0])
    problems = verify(store, workers=1).problems
    assert set(problems) == {victim}
    said = problems[victim]
    assert not any("head columns" in p for p in said), said
    assert not any("before version -1" in p for p in said), said
    assert any("events out of order" in p for p in said), said


def test_verify_says_a_version_stored_twice_as_such(damaged):
    """A commit whose version columns were shifted back by one repeats its predecessor's last
    version: verify said "version 38 comes after version 38"."""
    store, played = damaged
    victim = played[6]["episode_id"]
    position, first, _last = tamper.stream_commits(store.engine, victim)[2]
    with store.engine.begin() as conn:
        conn.execute(sa.text("UPDATE commits SET first_version = first_version - 1, "
                             "last_version = last_version - 1 WHERE position = :p"), {"p": position})
    said = verify(store, workers=1).problems[victim]
    assert f"version {first - 1} is stored twice" in said, said


def test_verify_checks_episode_shape_and_known_types(damaged, workers):
    store, played = damaged
    ended = played[0]["episode_id"]
    version = store.stream_version(ended)
    store.append(ended, [NewEvent("EpisodeEnded", {"outcome": "success", "failure_mode": None,
                                                   "steps": 1, "total_return": 0.0})], version)
    store.append("stray", [NewEvent("TicketCommentAdded", {"ticket_id": "T-1", "text": "x",
                                                           "step": 1})], None)
    store.append("alien", [NewEvent("EpisodeStarted", played_started(store, played[1])),
                           NewEvent("Teleported", {}),
                           NewEvent("TicketCommentAdded", {"ticket_id": "T-1", "text": "x",
                                                           "step": 1}, schema_version=9)], None)
    report = verify(store, workers=workers)
    assert set(report.problems) == {ended, "stray", "alien"}
    assert any("after EpisodeEnded" in p for p in report.problems[ended])
    assert any("not EpisodeStarted" in p for p in report.problems["stray"])
    text = " ".join(report.problems["alien"])
    assert "unknown event type 'Teleported'" in text and "schema version 9" in text


@pytest.mark.parametrize("column", ["last_digest", "last_version"])
def test_verify_catches_a_forged_head(damaged, workers, column):
    """Writers chain the next step onto the newest commit's head columns and `stream_digest`
    answers from them: forged, verify said ok and later blamed the next honest step."""
    store, played = damaged
    victim = played[2]["episode_id"]
    position = tamper.stream_commits(store.engine, victim)[-1][0]
    value = "f" * 32 if column == "last_digest" else 999
    _sql(store, f"UPDATE commits SET {column} = :v WHERE position = :p", v=value, p=position)
    report = verify(store, workers=workers)
    assert set(report.problems) == {victim}
    assert any("head columns were altered" in p for p in report.problems[victim])


@pytest.mark.parametrize("shift", [-1, 1])
def test_verify_catches_a_middle_commits_altered_last_version(damaged, workers, shift):
    """Lowered by one, `read_stream(s, from_version)` from inside the commit skipped its last
    event, and `count_events` miscounted; verify said ok, since no digest covers the column."""
    store, played = damaged
    victim = played[3]["episode_id"]
    position, first, last = _middle_commit(store, victim)
    _sql(store, "UPDATE commits SET last_version = :v WHERE position = :p", v=last + shift, p=position)
    report = verify(store, workers=workers)
    assert set(report.problems) == {victim}
    assert any(f"commit at position {position} states versions" in p for p in report.problems[victim])


def test_verify_and_the_runner_survive_an_event_that_does_not_decode(damaged, workers):
    store, played = damaged
    victim = played[4]["episode_id"]
    tamper.edit_event(store.engine, victim, 2, "data", lambda _data: '{"broken')
    runner = ProjectionRunner(store, default_projections())
    runner.rebuild()
    report = verify(store, workers=workers)
    assert set(report.problems) == {victim}
    assert any("cannot fold" in p for p in report.problems[victim])


def test_verify_names_a_commit_whose_payload_no_longer_unpacks(damaged, workers):
    store, played = damaged
    victim = played[8]["episode_id"]
    position = _middle_commit(store, victim)[0]
    with store.engine.begin() as conn:
        conn.execute(sa.text("UPDATE commits SET payload = substr(payload, 1, 40) "
                             "WHERE position = :p"), {"p": position})
    ProjectionRunner(store, default_projections()).rebuild()
    report = verify(store, workers=workers)
    assert set(report.problems) == {victim}
    # one line, naming the commit: the versions and digests after it were each blamed in turn
    [problem] = report.problems[victim]
    assert problem.startswith(f"the commit at position {position} (from version ")
    assert "does not unpack" in problem and "not checked past it" in problem
    with pytest.raises(CorruptCommit, match=f"{victim}.*position {position}"):
        list(store.read_stream(victim))


@pytest.mark.parametrize("rebuild_workers", [1, 2], ids=["1-process", "2-processes"])
def test_a_rebuild_names_the_episodes_a_damaged_log_leaves_out(damaged, rebuild_workers):
    """A read model drops an episode whose events it cannot fold; the rebuild says which."""
    store, played = damaged
    undecodable, unpackable = played[4]["episode_id"], played[8]["episode_id"]
    gapped = played[6]["episode_id"]  # a commit deleted from its middle: it folded the rest, exit 0

    def listed() -> set[str]:
        with store.engine.connect() as conn:
            return set(conn.execute(sa.select(episodes.c.episode_id)).scalars())

    sound = listed()
    tamper.edit_event(store.engine, undecodable, 2, "data", lambda _data: '{"broken')
    with store.engine.begin() as conn:
        conn.execute(sa.text("UPDATE commits SET payload = substr(payload, 1, 40) "
                             "WHERE position = :p"), {"p": _middle_commit(store, unpackable)[0]})
    tamper.delete_commit(store.engine, _middle_commit(store, gapped)[0])
    runner = ProjectionRunner(store, default_projections())
    runner.rebuild(workers=rebuild_workers, page=97)
    # the undecodable event is a world event, which only the views read model decodes
    assert runner.unfolded == {"episodes": {unpackable, gapped},
                               "views": {undecodable, unpackable, gapped}}
    assert listed() == sound - {unpackable, gapped}
    with pytest.raises(CorruptCommit, match=f"{gapped}.*follows version .*a commit deleted"):
        replay(store, gapped, 1)
    from companyos.runtime import EpisodeRuntime

    with pytest.raises(CorruptCommit, match="a commit deleted"):  # nor continued by a server
        EpisodeRuntime.load(store, gapped)


def played_started(store: EventStore, p: dict) -> dict:
    return next(store.read_stream(p["episode_id"])).data


def test_verify_catches_a_read_model_that_differs_from_its_rebuild(damaged, workers):
    store, played = damaged
    a, b = played[2]["episode_id"], played[9]["episode_id"]
    _sql(store, "UPDATE episodes SET total_return = 999 WHERE episode_id = :s", s=a)
    _sql(store, "UPDATE episode_views SET views = '{}' WHERE episode_id = :s", s=b)
    report = verify(store, workers=workers)
    assert set(report.problems) == {a, b}
    assert "total_return" in report.problems[a][0]
    assert "views read model" in report.problems[b][0]


# -- the runner ------------------------------------------------------------------------------


@pytest.mark.parametrize("workers", [1, 2])
def test_rebuild_after_an_interrupted_run_equals_a_clean_build(damaged, workers):
    store, played = damaged
    runner = ProjectionRunner(store, default_projections())
    runner.rebuild(workers=1)
    clean = dump(store)

    class Crash(Exception):
        pass

    calls = []

    def crash_after_two(n):
        calls.append(n)
        if len(calls) == (2 if workers == 1 else 1):  # a parallel rebuild may report once
            raise Crash

    runner = ProjectionRunner(store, default_projections())
    with pytest.raises(Crash):
        runner.rebuild(progress=crash_after_two, page=97, workers=workers)
    partial = dump(store)
    if workers == 1:
        assert 0 < len(partial["episodes"]) < len(played)
    # the rows an interrupted parallel rebuild left at checkpoint 0 are not the log's damage:
    # verify called every such episode broken
    report = verify(store, workers=workers)
    assert report.ok, report.problems
    if workers > 1 and partial["episodes"]:
        assert report.read_models["episodes"]["rows"] is None
        assert report.read_models["episodes"]["unfinished_rows"] == len(partial["episodes"])
    ProjectionRunner(store, default_projections()).catch_up(page=113)  # a new process resumes
    assert dump(store) == clean
    assert verify(store).ok


_SLOW_REBUILD = """
import os, sys, time
from projections import parallel

real_scan = parallel.scan_range

def one_commit_at_a_time(store, lo, hi, upto, page):
    print(os.getpid(), flush=True)
    for records in real_scan(store, lo, hi, upto, 1):
        time.sleep(0.2)
        yield records

parallel.scan_range = one_commit_at_a_time
sys.argv = ["companyos", "rebuild", "--workers", "2", "--db", sys.argv[1]]
from companyos import cli
cli.main()
"""


@pytest.mark.parametrize("stop", ["kill-9", "ctrl-c"])
def test_a_parallel_rebuild_stops_its_workers_with_it(damaged, tmp_path, stop):
    """Killed outright, a rebuild's workers wrote on for no one; on Ctrl-C each printed a
    KeyboardInterrupt traceback before the command said it was interrupted."""
    import os
    import signal
    import subprocess
    import sys
    import time

    store, _ = damaged
    script = tmp_path / "slow_rebuild.py"
    script.write_text(_SLOW_REBUILD)
    rebuild = subprocess.Popen([sys.executable, str(script), str(store.engine.url)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True, env={**os.environ, "PYTHONPATH": os.getcwd()})
    workers = [int(rebuild.stdout.readline()) for _ in range(2)]
    if stop == "ctrl-c":
        os.killpg(rebuild.pid, signal.SIGINT)  # as a terminal does: the whole process group
        _, err = rebuild.communicate(timeout=30)
        assert rebuild.returncode == 130
        assert err.strip().splitlines()[-1] == "error: interrupted" and "Traceback" not in err, err
    else:
        os.kill(rebuild.pid, signal.SIGKILL)
        rebuild.wait()
    for _ in range(100):
        alive = []
        for pid in workers:
            with contextlib.suppress(ProcessLookupError, ChildProcessError):
                os.kill(pid, 0)
                alive.append(pid)
        if not alive:
            return
        time.sleep(0.1)
    for pid in alive:
        os.kill(pid, signal.SIGKILL)
    pytest.fail(f"rebuild workers {alive} outlived the command by 10 s")


def test_a_parallel_rebuild_equals_a_single_process_one(damaged):
    store, played = damaged
    runner = ProjectionRunner(store, default_projections())
    runner.rebuild(workers=1)
    clean = dump(store)
    seen = []
    assert runner.rebuild(workers=3, page=64, progress=seen.append) == store.last_position()
    assert sum(seen) == store.last_position()
    assert dump(store) == clean
    with store.engine.connect() as conn:
        positions = set(conn.execute(sa.select(projection_checkpoints.c.position)).scalars())
    assert positions == {store.last_position()}
    assert verify(store).ok


def test_a_crash_inside_the_write_transaction_commits_nothing(damaged, monkeypatch):
    store, _ = damaged
    runner = ProjectionRunner(store, default_projections())
    runner.rebuild()
    clean = dump(store)
    runner = ProjectionRunner(store, default_projections())
    import projections.runner as module

    calls = [0]
    real = module.upsert

    def failing(conn, table, key, rows):
        calls[0] += 1
        if calls[0] == 5:
            raise RuntimeError("disk on fire")
        real(conn, table, key, rows)

    monkeypatch.setattr(module, "upsert", failing)
    with pytest.raises(RuntimeError):
        runner.rebuild(page=101)
    with store.engine.connect() as conn:
        checkpoint = conn.execute(sa.select(projection_checkpoints.c.position)).scalars().all()
    assert max(checkpoint) < store.last_position()
    monkeypatch.setattr(module, "upsert", real)
    runner.catch_up(page=101)  # the same runner object carries on
    assert dump(store) == clean


def test_redelivered_events_change_nothing(damaged):
    store, _ = damaged
    clean = dump(store)
    _sql(store, "UPDATE projection_checkpoints SET position = position - 300")
    assert ProjectionRunner(store, default_projections()).catch_up(page=50) == 300
    assert dump(store) == clean
    assert verify(store).ok


def test_two_runners_never_interleave(damaged):
    store, _ = damaged
    ProjectionRunner(store, default_projections()).rebuild(page=10)
    clean = dump(store)
    _sql(store, "DELETE FROM episodes")
    _sql(store, "DELETE FROM episode_views")
    _sql(store, "UPDATE projection_checkpoints SET position = 0")
    slow = ProjectionRunner(store, default_projections())
    fast = ProjectionRunner(store, default_projections())
    slow.catch_up(page=40, max_pages=2)
    fast.catch_up(page=70)
    slow.catch_up(page=40)  # its checkpoint is stale: the compare-and-set makes it start over
    assert dump(store) == clean


def test_a_page_thrown_away_for_a_rebuild_elsewhere_names_no_episode_left_out(damaged):
    """`companyos rebuild` in another process cleared the read models while this runner folded a
    page: the page found no rows for the streams it continued and was thrown away at the commit,
    but the runner still named those streams as left out, and `rebuild episodes` then called a
    sound log damaged."""
    store, _ = damaged
    clean = dump(store)
    cleared = []

    class RebuiltElsewhere(EpisodesProjection):
        def load(self, store_, conn, stream_ids):
            if not cleared:  # the other process's rebuild clears and restarts between our steps
                _sql(store_, "DELETE FROM episodes")
                _sql(store_, "UPDATE projection_checkpoints SET position = 0")
                cleared.append(True)
            return super().load(store_, conn, stream_ids)

    _sql(store, "UPDATE projection_checkpoints SET position = position - 300")
    runner = ProjectionRunner(store, [RebuiltElsewhere()])
    runner.catch_up(page=100)
    assert cleared
    assert dump(store)["episodes"] == clean["episodes"]
    assert runner.unfolded == {"episodes": set()}


def test_a_clear_whose_pages_bring_the_checkpoint_back_still_voids_a_page_folded_before_it(damaged):
    """Pages count from 0, so a rebuild elsewhere brings the checkpoint back to the very position
    this runner holds: a compare-and-set of the position alone let this runner commit a page it
    had folded after the clear deleted the rows it continued, and delete those episodes' rows."""
    store, _ = damaged
    clean = dump(store)
    page = 150
    other = ProjectionRunner(store, [EpisodesProjection()])
    other.catch_up = lambda **_: 0  # its rebuild clears, and stops there for now
    armed = []

    class RebuiltElsewhere(EpisodesProjection):
        def load(self, store_, conn, stream_ids):
            if armed and not armed.pop():
                other.rebuild(workers=1)  # cleared; its first page not committed yet
                loaded = super().load(store_, conn, stream_ids)  # finds nothing: cleared
                # its first page: the checkpoint is back where ours is
                assert ProjectionRunner.catch_up(other, page=page, max_pages=1) == page
                return loaded
            return super().load(store_, conn, stream_ids)

    _sql(store, "UPDATE projection_checkpoints SET position = 0")
    _sql(store, "DELETE FROM episodes")
    ProjectionRunner(store, [EpisodesProjection()]).catch_up(page=page, max_pages=1)
    runner = ProjectionRunner(store, [RebuiltElsewhere()])  # loads the episode running at 150
    armed.append(False)
    runner.catch_up(page=page)
    assert not armed  # the clear happened where it hurt
    assert runner.unfolded == {"episodes": set()}
    ProjectionRunner(store, [EpisodesProjection()]).catch_up()
    assert dump(store)["episodes"] == clean["episodes"]


def test_a_parallel_rebuild_leaves_alone_the_newer_rows_of_a_runner_that_moved_on(damaged, monkeypatch):
    """The rebuild's workers wrote their rows, folded up to where the rebuild began, over the newer
    rows of a catch-up that had meanwhile folded from 0 past that point: that catch-up's checkpoint
    stood, so a running episode stayed listed at an older step for good."""
    from companyos.env import CompanyEnv
    from projections import parallel

    store, _ = damaged
    env = CompanyEnv(db=store, agent="noop")
    _, info = env.reset(seed=5, options={"task": "expense_report", "chaos": "low"})
    ranges = parallel.stream_ranges

    def a_runner_moves_on_first(store_, parts, upto):
        env.step({"app": "ticketdesk", "method": "list_tickets", "params": {}})  # past upto
        ProjectionRunner(store_, default_projections()).catch_up()  # folds from 0 past upto
        return ranges(store_, parts, upto)

    monkeypatch.setattr(parallel, "stream_ranges", a_runner_moves_on_first)
    ProjectionRunner(store, default_projections()).rebuild(workers=2)
    monkeypatch.undo()
    with store.engine.connect() as conn:
        (row,) = [r for r in list_episodes(conn, limit=None) if r["episode_id"] == info["episode_id"]]
    assert row["steps"] == 1
    report = verify(store)
    assert report.ok, report.problems
    env.close()


def test_a_parallel_rebuild_does_not_seal_a_read_model_another_rebuild_cleared_meanwhile(
        damaged, monkeypatch):
    """The parallel rebuild moved its checkpoint to the end wherever it was still 0, and a rebuild
    elsewhere that had just cleared the read model (its first page not committed) left it 0: the
    empty table was sealed as folded, and every episode was gone from the list."""
    from projections import parallel

    store, played = damaged
    clean = dump(store)
    in_parallel = parallel.rebuild_in_parallel

    def cleared_elsewhere_meanwhile(*args):
        done = in_parallel(*args)
        other = ProjectionRunner(store, [EpisodesProjection()])
        other.catch_up = lambda **_: 0  # cleared; its first page not committed yet
        other.rebuild(workers=1)
        return done

    monkeypatch.setattr(parallel, "rebuild_in_parallel", cleared_elsewhere_meanwhile)
    ProjectionRunner(store, default_projections()).rebuild(workers=2)
    monkeypatch.undo()
    assert dump(store) == clean
    assert len(clean["episodes"]) == len(played)


def test_a_new_projection_version_rebuilds_by_itself(damaged):
    store, _ = damaged
    clean = dump(store)

    class Newer(EpisodesProjection):
        version = EpisodesProjection.version + 1

    _sql(store, "UPDATE episodes SET steps = -1")
    ProjectionRunner(store, [Newer()]).catch_up()
    assert dump(store)["episodes"] == clean["episodes"]


def test_episodes_read_model_lists_and_filters(logged, tmp_path):
    url, played = logged
    store = copy_store(url, tmp_path)
    ProjectionRunner(store, [EpisodesProjection()]).catch_up()
    with store.engine.connect() as conn:
        everything = list_episodes(conn, limit=None)
        experts = list_episodes(conn, agent="expert", limit=None)
        vendor = list_episodes(conn, task="vendor_onboarding", limit=2)
        successes = list_episodes(conn, outcome="success", limit=None)
    assert [r["episode_id"] for r in everything] == [p["episode_id"] for p in reversed(played)]
    assert {r["episode_id"] for r in experts} == {p["episode_id"] for p in played
                                                  if p["agent"] == "expert"}
    assert len(vendor) == 2 and all(r["task"] == "vendor_onboarding" for r in vendor)
    assert successes and all(r["outcome"] == "success" for r in successes)
    row = everything[0]
    stream = list(store.read_stream(row["episode_id"]))
    ended = stream[-1].data
    assert row["steps"] == ended["steps"] and row["total_return"] == ended["total_return"]
    assert row["digest"] == stream[-1].digest and row["events"] == len(stream)
    assert row["chaos"] == domain.CHAOS_LEVELS[played[-1]["chaos"]]
    assert row["started_at"] and row["ended_at"] and row["sim_ended_at"] > row["sim_started_at"]
    assert summarize(row["episode_id"], stream) == row
    store.close()


def test_the_read_model_follows_a_running_episode(sqlite_url):
    store = EventStore.open(sqlite_url)
    runner = ProjectionRunner(store, default_projections())
    from companyos.env import CompanyEnv

    env = CompanyEnv(db=store, agent="noop")
    obs, info = env.reset(seed=3, options={"task": "expense_report", "chaos": "low"})
    runner.catch_up()
    with store.engine.connect() as conn:
        (row,) = list_episodes(conn, outcome="running")
    assert row["steps"] == 0 and row["agent"] == "noop"
    for _ in range(3):
        env.step({"app": "ticketdesk", "method": "list_tickets", "params": {}})
        runner.catch_up()
    with store.engine.connect() as conn:
        (row,) = list_episodes(conn)
        (views,) = conn.execute(sa.select(episode_views)).mappings().all()
    assert row["steps"] == 3 and row["outcome"] is None and views["step"] == 3
    assert verify(store).ok
    env.close()
    store.close()


def test_projections_on_each_backend(empty_store_url):
    store = EventStore.open(empty_store_url)
    lives = [play(store, task, 7, "medium", "expert", durability="episode")
             for task in list(domain.TASK_FAMILIES)[:3]]
    runner = ProjectionRunner(store, default_projections())
    runner.catch_up(page=64)
    clean = dump(store)
    assert len(clean["episodes"]) == 3
    assert verify(store).ok
    runner.rebuild(page=50)
    assert dump(store) == clean
    p = lives[1]
    assert replay(store, p["episode_id"], 2)["datahub"] == p["views"][2]["datahub"]
    assert rerun(store, p["episode_id"]).match
    store.close()


def test_verify_does_not_call_commits_made_while_it_ran_waiting(empty_store_url):
    """On SQLite, verify said steps taken while it ran "wait on an older transaction"."""
    from companyos.env import CompanyEnv

    store = EventStore.open(empty_store_url)
    env = CompanyEnv(db=store, agent="noop")
    env.reset(seed=3, options={"task": "expense_report", "chaos": "none"})
    action = {"app": "ticketdesk", "method": "list_tickets", "params": {}}
    report = verify(store, workers=1, progress=lambda _n: env.step(action))
    assert report.ok and not report.waiting
    assert report.upto < store.last_position()
    env.close()
    store.close()


def test_verify_never_blames_a_stream_stepped_while_an_older_transaction_runs(empty_store_url):
    """On PostgreSQL readers stop below the oldest transaction still running (any database of
    the cluster). verify read the events to there but the head columns to the newest commit, so
    a sound episode stepped meanwhile was reported as tampered with."""
    from companyos.env import CompanyEnv

    store = EventStore.open(empty_store_url)
    env = CompanyEnv(db=store, agent="noop")
    env.reset(seed=3, options={"task": "expense_report", "chaos": "none"})
    action = {"app": "ticketdesk", "method": "list_tickets", "params": {}}
    env.step(action)
    holder = sa.create_engine(store.engine.url)
    with holder.connect() as conn:
        if store.engine.dialect.name == "postgresql":
            conn.exec_driver_sql("SELECT pg_current_xact_id()")  # holds the high-water mark
        env.step(action)
        env.step(action)
        report = verify(store)
        assert report.ok, report.problems
        assert report.waiting == (store.engine.dialect.name == "postgresql")
        conn.rollback()
    report = verify(store)
    assert report.ok and not report.waiting and report.upto == store.last_position()
    env.close()
    holder.dispose()
    store.close()


def test_a_rebuild_while_another_runner_writes_its_page_deadlocks_neither(fresh_pg_url, monkeypatch):
    """On PostgreSQL a rebuild's DELETE of a read model and another runner's upserts into it each
    took row locks the other then waited for: PostgreSQL ended one of them with a deadlock error
    (`companyos rebuild` beside a live `companyos episodes`). Both must finish, one after the other."""
    import threading

    from companyos.env import CompanyEnv
    from projections import runner as running
    from tests.conftest import poll_count

    store = EventStore.open(fresh_pg_url)
    envs = [CompanyEnv(db=store, agent="noop") for _ in range(4)]
    for seed, env in enumerate(envs):
        env.reset(seed=seed, options={"task": "expense_report", "chaos": "low"})
    ProjectionRunner(store, [EpisodesProjection()]).catch_up()  # rows the rebuild will delete
    for env in reversed(envs):  # they go on: the next page upserts those rows, the last first
        env.step({"app": "ticketdesk", "method": "list_tickets", "params": {}})
    other = EventStore.open(fresh_pg_url)
    failed: list[BaseException] = []

    def rebuild_elsewhere() -> None:
        try:
            ProjectionRunner(other, [EpisodesProjection()]).rebuild()
        except BaseException as exc:  # noqa: BLE001 - the test reports it
            failed.append(exc)

    elsewhere = threading.Thread(target=rebuild_elsewhere, daemon=True)
    upsert = running.upsert

    def row_by_row(conn, table, key, rows):  # the rebuild starts once the first row is written
        upsert(conn, table, key, rows[:1])
        if not elsewhere.is_alive() and not failed:
            elsewhere.start()
            with store.engine.connect() as watch:
                assert poll_count(watch, "SELECT count(*) FROM pg_stat_activity "
                                         "WHERE wait_event_type = 'Lock'")
        for row in rows[1:]:
            upsert(conn, table, key, [row])

    monkeypatch.setattr(running, "upsert", row_by_row)
    ProjectionRunner(store, [EpisodesProjection()]).catch_up()
    assert elsewhere.ident is not None, "the page upserted no row"
    elsewhere.join(60)  # a guard, not a measurement
    assert not elsewhere.is_alive() and not failed, failed
    with store.engine.connect() as conn:
        assert [row["steps"] for row in list_episodes(conn)] == [1, 1, 1, 1]
    for env in envs:
        env.close()
    other.close()
    store.close()


def test_verify_names_a_commit_moved_past_every_transaction(fresh_pg_url):
    """PostgreSQL readers stop below the oldest running transaction, so a commit row whose
    position was rewritten past every transaction id begun was never read: verify called such
    a log sound (the episode it belongs to simply looked shorter) and said it was "waiting"."""
    from tests.tamper import stream_commits

    store = EventStore.open(fresh_pg_url)
    moved = play(store, "expense_report", 5, "medium", "random", durability="step")["episode_id"]
    play(store, "license_renewal", 6, "medium", "expert", durability="episode")
    assert verify(store).ok
    position = stream_commits(store.engine, moved)[-1][0]
    with store.engine.begin() as conn:
        future = conn.execute(sa.text(
            "SELECT (pg_snapshot_xmax(pg_current_snapshot())::text::bigint + 1000) << 20")).scalar()
        conn.execute(sa.text("UPDATE commits SET position = :f WHERE position = :p"),
                     {"f": future, "p": position})
    report = verify(store)
    assert not report.ok and list(report.problems) == [moved]
    assert any(f"position {future}" in p and "altered" in p for p in report.problems[moved])
    assert not report.waiting and report.upto < future
    store.close()


@pytest.mark.parametrize("logged, shown", [("old\x00bot", "old\ufffdbot"), (7, "7")])
def test_a_label_logged_before_labels_were_checked_does_not_stop_the_read_model(
        empty_store_url, logged, shown):
    """Older logs may hold a NUL (which PostgreSQL text refuses) or a non-string as the label."""
    from companyos.runtime import EpisodeRuntime

    store = EventStore.open(empty_store_url)
    spec = domain.EpisodeSpec(task="expense_report", seed=1, chaos=0.0)
    EpisodeRuntime.start(store, spec, meta={"agent": logged})
    later = play(store, "expense_report", 2, "none", "expert")
    ProjectionRunner(store, default_projections()).catch_up()
    with store.engine.connect() as conn:
        rows = list_episodes(conn, limit=None)
        assert [r["agent"] for r in rows] == ["expert", shown]
        (row,) = list_episodes(conn, agent=shown)
        assert row["episode_id"] != later["episode_id"] and row["steps"] == 0
    assert verify(store).ok
    store.close()


def test_episodes_and_rebuild_say_when_a_running_transaction_holds_new_episodes_back(empty_store_url):
    """On PostgreSQL the read models stop below the oldest transaction still running, in any
    database of the cluster: a run's new episodes were silently missing from `episodes`, while
    `verify` said why."""
    import subprocess
    import sys

    from companyos.env import CompanyEnv

    store = EventStore.open(empty_store_url)
    holder = sa.create_engine(store.engine.url)
    try:
        with holder.connect() as conn:
            if store.engine.dialect.name == "postgresql":
                conn.exec_driver_sql("SELECT pg_current_xact_id()")  # holds the high-water mark
            with CompanyEnv(db=store, agent="noop") as env:
                env.reset(seed=3, options={"task": "expense_report", "chaos": "none"})
            for command in (["episodes", "--json"], ["rebuild"]):
                out = subprocess.run([sys.executable, "-m", "companyos", *command, "--db", empty_store_url],
                                     capture_output=True, text=True)
                assert out.returncode == 0, out.stderr
                said = "a transaction older than them is still running" in out.stderr
                assert said == (store.engine.dialect.name == "postgresql"), (command, out.stderr)
            conn.rollback()
    finally:
        holder.dispose()
        store.close()


def test_verify_and_the_episode_list_keep_every_digit_whatever_extra_float_digits_says(
        pg_database_url, monkeypatch):
    """PostgreSQL writes floats to text clients with `extra_float_digits` more digits; a role,
    database or PGOPTIONS that set it to 0 (15 significant digits, as before PostgreSQL 12) made
    the stored read models read back rounded: `verify` called a sound log broken ("total_return:
    stored -13.5 != rebuilt -13.499999999999996") and the episode list showed a return other
    than the run's."""
    store = EventStore.open(pg_database_url)
    try:
        # the random agent's -0.1 steps add up to returns with 16-17 significant digits
        played = [play(store, "vendor_onboarding", seed, "medium", "random")["episode_id"]
                  for seed in range(3)]
        ProjectionRunner(store, default_projections()).catch_up()
        with store.engine.connect() as conn:
            returns = {e["episode_id"]: e["total_return"] for e in list_episodes(conn, limit=None)}
        assert any(len(repr(returns[p])) > 16 for p in played)  # digits a rounding would lose
    finally:
        store.close()
    monkeypatch.setenv("PGOPTIONS", "-c extra_float_digits=0")
    store = EventStore.open(pg_database_url)
    try:
        report = verify(store)
        assert not any(p in report.problems for p in played), report.problems
        with store.engine.connect() as conn:
            listed = {e["episode_id"]: e["total_return"] for e in list_episodes(conn, limit=None)}
        assert {p: listed[p] for p in played} == {p: returns[p] for p in played}
    finally:
        store.close()


JSON_NULL = object()


@pytest.mark.parametrize("damage", [
    ("EpisodeStarted", "task", None),  # dropped
    ("EpisodeStarted", "seed", "x"),
    ("EpisodeStarted", "chaos", "high"),
    ("EpisodeStarted", "task", "t" * 150),  # past the column's 100 characters
    ("EpisodeEnded", "outcome", "s" * 30),
    ("EpisodeEnded", "total_return", "x"),
    ("EpisodeEnded", "total_return", JSON_NULL),  # a NOT NULL column
    ("EpisodeEnded", "total_return", 2**63),  # past a 64-bit integer: an OverflowError
    ("EpisodeStarted", "chaos", 2**63),
])
def test_an_episode_whose_start_or_end_the_read_model_cannot_hold_is_left_out_and_named(
        empty_store_url, damage):
    """An EpisodeStarted or EpisodeEnded whose data has a field of the wrong type or size (an
    edit behind the store's back, or a writer other than the environment): the episodes
    projection wrote it as it was, so one such episode failed every `rebuild` and episode list
    (a NOT NULL or type error from the database, `error: the store failed`), or `verify` with a
    ValueError traceback, instead of leaving that episode out and naming it."""
    type_, field, value = damage
    store = EventStore.open(empty_store_url)
    try:
        good = play(store, "expense_report", 1, "none", "expert")["episode_id"]
        started, *_rest, ended = list(store.read_stream(good))
        events = {"EpisodeStarted": started.data, "EpisodeEnded": ended.data}
        data = dict(events[type_])
        if value is None:
            del data[field]
        else:
            data[field] = None if value is JSON_NULL else value
        events[type_] = data
        store.append("damaged", [NewEvent("EpisodeStarted", events["EpisodeStarted"]),
                                 NewEvent("EpisodeEnded", events["EpisodeEnded"])], expected_version=None)
        runner = ProjectionRunner(store, default_projections())
        runner.rebuild()
        assert runner.unfolded["episodes"] == {"damaged"}
        with store.engine.connect() as conn:
            assert [e["episode_id"] for e in list_episodes(conn)] == [good]
        report = verify(store)
        assert set(report.problems) == {"damaged"}
        assert f"{field} " in " ".join(report.problems["damaged"])
    finally:
        store.close()


def test_verify_reports_a_read_model_row_holding_text_in_a_number_column(tmp_path):
    """SQLite keeps what it is given: a read model row edited to hold text where a number
    belongs made `verify` stop with a ValueError traceback, instead of naming the row."""
    store = EventStore.open(f"sqlite:///{tmp_path / 'store.db'}")
    try:
        episode = play(store, "expense_report", 1, "none", "expert")["episode_id"]
        ProjectionRunner(store, default_projections()).catch_up()
        _sql(store, "UPDATE episodes SET seed = 'x', chaos = 'high' WHERE episode_id = :s", s=episode)
        report = verify(store)
        assert set(report.problems) == {episode}
        assert "seed: stored 'x' != rebuilt 1" in report.problems[episode][0]
    finally:
        store.close()


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("reward", [{"rule": "step", "value": "x", "cause": 1}, {"rule": "step", "cause": 1}])
def test_a_running_episode_whose_reward_is_no_number_is_left_out_and_named(
        empty_store_url, reward, workers):
    """The episodes projection sums a running episode's rewards when it writes the row, outside
    the fold that leaves a damaged stream out: one reward edited to text (or without a value)
    failed every rebuild, catch-up and episode list with a TypeError or KeyError traceback."""
    store = EventStore.open(empty_store_url)
    try:
        good = play(store, "expense_report", 1, "none", "expert")["episode_id"]
        started = next(store.read_stream(good)).data
        store.append("damaged", [NewEvent("EpisodeStarted", started), NewEvent("RewardGranted", reward)],
                     expected_version=None)
        runner = ProjectionRunner(store, default_projections())
        runner.rebuild(workers=workers)
        assert runner.unfolded["episodes"] == {"damaged"}
        with store.engine.connect() as conn:
            assert [e["episode_id"] for e in list_episodes(conn)] == [good]
        report = verify(store)
        assert set(report.problems) == {"damaged"}
        assert "not a number" in " ".join(report.problems["damaged"])
        caught_up = ProjectionRunner(store, default_projections())
        _sql(store, "DELETE FROM episodes")
        _sql(store, "UPDATE projection_checkpoints SET position = 0")
        caught_up.catch_up()
        assert caught_up.unfolded["episodes"] == {"damaged"}
    finally:
        store.close()


def test_a_damaged_reward_the_episodes_end_settles_gives_one_read_model_whenever_rows_are_built(
        empty_store_url):
    """A running episode's reward with no number in it has no row while it runs; once its
    EpisodeEnded (which carries the return) comes, it has one. A catch-up while it ran dropped
    the episode for good, so the read model depended on when rows had been built: `verify`
    then said "row missing (its rebuild has one)"."""
    store = EventStore.open(empty_store_url)
    try:
        good = play(store, "expense_report", 1, "none", "expert")["episode_id"]
        started, *_rest, ended = list(store.read_stream(good))
        store.append("damaged", [NewEvent("EpisodeStarted", started.data),
                                 NewEvent("RewardGranted", {"rule": "step", "value": "x", "cause": 1})],
                     expected_version=None)
        runner = ProjectionRunner(store, default_projections())
        runner.catch_up()
        with store.engine.connect() as conn:
            assert [e["episode_id"] for e in list_episodes(conn)] == [good]  # running: no row
        store.append("damaged", [NewEvent("EpisodeEnded", ended.data)], expected_version=1)
        runner.catch_up()
        with store.engine.connect() as conn:
            caught_up = {e["episode_id"]: e["total_return"] for e in list_episodes(conn)}
        assert caught_up == {good: ended.data["total_return"], "damaged": ended.data["total_return"]}
        assert not verify(store).problems
        ProjectionRunner(store, default_projections()).rebuild()
        with store.engine.connect() as conn:
            assert {e["episode_id"]: e["total_return"] for e in list_episodes(conn)} == caught_up
    finally:
        store.close()


def test_rerun_judges_each_episode_by_the_rules_version_it_was_logged_with(tmp_path):
    """A blind decline succeeds under version 1 and fails under 2: both re-run to their own log."""
    from companyos.env import CompanyEnv

    seed = next(s for s in range(400) if domain.reset(domain.EpisodeSpec(
        "license_renewal", s, "none"))[0].target["expected"] == "decline")
    ended = {}
    with CompanyEnv(f"sqlite:///{tmp_path / 'store.db'}") as env:
        for rules in (1, 2):
            obs, info = env.reset(seed=seed, options={"task": "license_renewal", "chaos": "none",
                                                      "rules": rules})
            ticket = env.runtime.state.target["ticket"]
            env.step({"app": "ticketdesk", "method": "add_comment",
                      "params": {"ticket_id": ticket, "text": "does not qualify"}})
            env.step({"app": "ticketdesk", "method": "update_ticket",
                      "params": {"ticket_id": ticket, "field": "status", "value": "closed"}})
            ended[rules] = (info["episode_id"], env.state["outcome"])
        assert ended[1][1] == "success" and ended[2][1] == "failure"
        for rules, (episode_id, _) in ended.items():
            result = rerun(env.store, episode_id)
            assert result.match and result.rerun_digest == env.store.stream_digest(episode_id)
            assert result.rules == rules == result.to_json()["rules"]  # it says which it re-ran under
        started = next(iter(env.store.read_stream(ended[2][0])))
        for named in (9, "2", 2.0):  # a start edited to name a version that is none is run under none
            damaged = {**started.data, "target": {**started.data["target"], "rules": named}}
            stream = f"damaged-{named!r}"
            env.store.append(stream, [NewEvent("EpisodeStarted", damaged)], expected_version=None)
            result = rerun(env.store, stream)
            assert not result.match and result.rules is None and "rules" in result.error, result.error


def _fixture_episodes(name: str) -> list[dict]:
    """A fixture of logged episodes in tests/data: their specs, actions, judgements and digests."""
    from pathlib import Path

    return [orjson.loads(line) for line in (Path(__file__).parent / "data" / name).read_text().splitlines()]


def _reset_as_logged(env, e: dict, rules: int) -> dict:
    """Start logged episode `e` again, under rules version `rules`; the reset's info."""
    return env.reset(seed=e["seed"], options={
        "task": e["task"], "chaos": e["chaos"], "reward_profile": e["reward_profile"],
        "max_steps": e["max_steps"], "rules": rules})[1]


def test_episodes_logged_before_rules_versions_existed_replay_to_their_digests(tmp_path):
    """tests/data/pre_versions_episodes.jsonl holds 46 episodes the code before rules versions
    logged (random and expert agents at four chaos levels; blind declines, which that code let
    succeed; early verifications): their specs, actions and stream digests. Played again under
    version 1 they give the same events, byte for byte; version 2 judges the blind declines apart."""
    from companyos.env import CompanyEnv

    logged = _fixture_episodes("pre_versions_episodes.jsonl")
    assert len(logged) == 46
    outcomes: dict[int, list] = {1: [], 2: []}
    with CompanyEnv(f"sqlite:///{tmp_path / 'store.db'}", durability="episode") as env:
        for rules in outcomes:
            for e in logged:
                info = _reset_as_logged(env, e, rules)
                for action in e["actions"]:
                    if not env.state["done"]:
                        env.step(action)
                outcomes[rules].append(env.state["outcome"])
                if rules == 1:
                    env.reset(seed=0)  # writes the episode, held back with durability "episode"
                    assert env.store.stream_digest(info["episode_id"]) == e["digest"], e
                    assert env.store.stream_version(info["episode_id"]) + 1 == e["events"]
    assert outcomes[1] == [e["outcome"] for e in logged]
    changed = [(a, b) for a, b in zip(outcomes[1], outcomes[2], strict=True) if a != b]
    assert changed.count(("success", "failure")) == 10  # the blind declines


def test_episodes_judged_by_rules_version_3_replay_to_their_digests(tmp_path):
    """tests/data/rules_v3_episodes.jsonl: the 60 specs and actions of the version 2 fixture played
    under version 3 when it was new (the actions up to each episode's end), and two scripted
    episodes where version 3 judges apart (a slow refresh of a fresh metric, then a wrong request:
    `wrong_decision`, not `stale_data_used`; a decline's ticket triaged: no `set_missing_priority`).
    Played again they give the same events and judgement: a change to version 3 must be a new
    version, not an edit of this one."""
    from companyos.env import CompanyEnv

    logged = _fixture_episodes("rules_v3_episodes.jsonl")
    assert len(logged) == 62 and {e["rules"] for e in logged} == {3}
    assert [(e["outcome"], e["failure_mode"]) for e in logged[-2:]] == [
        ("failure", "wrong_decision"), ("success", None)]
    with CompanyEnv(f"sqlite:///{tmp_path / 'store.db'}", durability="episode") as env:
        assert len(list(_replayed_as_logged(env, logged))) == 62


def test_episodes_judged_by_rules_version_4_replay_to_their_digests(tmp_path):
    """tests/data/rules_v4_episodes.jsonl: the 62 specs and actions of the version 3 fixture played
    under version 4 when it was new (one judged apart: a random agent's refused request in a decline,
    no longer `missing_required_fields`), and three scripted episodes where version 4 judges apart
    (a request of another type in a decline and in a task that goes ahead: `unrequested_submission`;
    a decline's request refused for missing fields, then only reads: `step_budget_exhausted`).
    Played again they give the same events and judgement: a change to version 4 must be a new
    version, not an edit of this one."""
    from companyos.env import CompanyEnv

    logged = _fixture_episodes("rules_v4_episodes.jsonl")
    assert len(logged) == 65 and {e["rules"] for e in logged} == {4}
    assert [(e["outcome"], e["failure_mode"]) for e in logged[-3:]] == [
        ("failure", "unrequested_submission"), ("failure", "unrequested_submission"),
        ("truncated", "step_budget_exhausted")]
    with CompanyEnv(f"sqlite:///{tmp_path / 'store.db'}", durability="episode") as env:
        assert len(list(_replayed_as_logged(env, logged))) == 65


def _replayed_as_logged(env, logged: list[dict]):
    """Each fixture episode played again under its own rules version, checked against what was
    logged (judgement, return, digest, events); yields (episode, its stored stream id)."""
    for e in logged:
        info = _reset_as_logged(env, e, e["rules"])
        for action in e["actions"]:
            assert not env.state["done"], e
            env.step(action)
        judged = env.state
        assert (judged["outcome"], judged["failure_mode"]) == (e["outcome"], e["failure_mode"]), e
        assert judged["total_return"] == e["total_return"], e
        env.reset(seed=0)  # writes the episode, held back with durability "episode"
        assert env.store.stream_digest(info["episode_id"]) == e["digest"], e
        assert env.store.stream_version(info["episode_id"]) + 1 == e["events"], e
        yield e, info["episode_id"]


def test_episodes_judged_by_rules_version_2_replay_to_their_digests(tmp_path):
    """tests/data/rules_v2_episodes.jsonl holds 60 episodes logged under rules version 2 when it
    was new: 48 by `companyos run` (random, expert and noop agents at chaos 0.25 to 0.8, both
    reward profiles) and 12 scripted (the expert sending its request to a delegate while the
    approver before them is available and then only reading; ignoring a rejection; succeeding at
    chaos none): their specs, actions, judgements and stream digests, every outcome and every
    failure mode. Played again under version 2 they give the same events, byte for byte, and the
    same judgement: a change to version 2's rules must be a new version, not an edit of this one."""
    from companyos.env import CompanyEnv
    from domain import FAILURE_MODES
    from domain.outcomes import FIRST_JUDGED_BY

    logged = _fixture_episodes("rules_v2_episodes.jsonl")
    assert len(logged) == 60 and {e["rules"] for e in logged} == {2}
    assert {e["failure_mode"] for e in logged} == {
        None, *(m for m in FAILURE_MODES if FIRST_JUDGED_BY.get(m, 1) <= 2)}
    objected = 0
    with CompanyEnv(f"sqlite:///{tmp_path / 'store.db'}", durability="episode") as env:
        for _, episode_id in _replayed_as_logged(env, logged):
            objected += any("is a delegate" in problem for ev in env.store.read_stream(episode_id)
                            if ev.type == "ApprovalSubmitted" for problem in ev.data["problems"])
    assert objected == 5  # version 2's routing objection: the four scripted misroutings and one random
