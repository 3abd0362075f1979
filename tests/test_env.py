"""CompanyEnv and the runtime: every step logged, identical digests, episodes continue from the log."""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys
import textwrap

import pytest
import sqlalchemy as sa

import domain
from companyos.agents import make_agent
from companyos.env import CompanyEnv
from companyos.runtime import EpisodeNotFound, EpisodeRuntime
from eventstore import EventStore
from eventstore.engine import normalise_url, sqlite_file
from tests.conftest import two_at_a_time

FAMILIES = list(domain.TASK_FAMILIES)


def play(env: CompanyEnv, agent_name: str, seed: int, task: str, chaos: str = "medium",
         stop_after: int | None = None):
    agent = make_agent(agent_name, seed)
    obs, info = env.reset(seed=seed, options={"task": task, "chaos": chaos})
    agent.reset(obs)
    actions = []
    done = False
    while not done and (stop_after is None or len(actions) < stop_after):
        action = agent.act(obs)
        actions.append(action)
        obs, _, terminated, truncated, info = env.step(action)
        done = terminated or truncated
    return info, actions


def test_every_step_is_in_the_log_and_state_reports_progress(sqlite_url):
    with CompanyEnv(sqlite_url, agent="expert") as env:
        info, actions = play(env, "expert", 3, FAMILIES[0])
        state = env.state
        episode_id = state["episode_id"]
        assert state["step_count"] == len(actions)
        assert state["done"] and state["agent"] == "expert"
        records = list(env.store.read_stream(episode_id))
    types = [r.type for r in records]
    assert types[0] == "EpisodeStarted" and types[-1] == "EpisodeEnded"
    assert types.count("ActionTaken") == len(actions)
    taken = [r.data["action"] for r in records if r.type == "ActionTaken"]
    assert taken == actions, "ActionTaken must record exactly what the agent sent"
    assert records[0].meta["agent"] == "expert"


def test_the_log_holds_exactly_the_domains_envelopes(sqlite_url):
    """The runtime converts events in bulk, inlined: it must write what domain.to_envelope says."""
    task = FAMILIES[2]
    with CompanyEnv(sqlite_url, durability="episode") as env:
        _, actions = play(env, "random", 5, task, chaos="high")
        records = list(env.store.read_stream(env.state["episode_id"]))
    state, events, _ = domain.reset(domain.EpisodeSpec(task, 5, domain.parse_chaos("high")))
    for action in actions:
        state, more, _ = domain.step(state, action)
        events += more
    assert [(r.type, r.data, r.schema_version) for r in records] == [
        domain.to_envelope(e) for e in events]


@pytest.mark.parametrize("durability", ["step", "episode"])
def test_an_action_with_text_that_is_not_unicode_loses_nothing(sqlite_url, durability):
    """A lone surrogate has no UTF-8 form; held back until the episode ends, it used to make the
    whole episode's append fail. It is logged spelled out, like other values JSON cannot hold."""
    odd = {"app": "ticketdesk", "method": "search_tickets", "params": {"query": "x\ud800"},
           "\udfff": 1}
    with CompanyEnv(sqlite_url, durability=durability) as env:
        env.reset(seed=2, options={"task": FAMILIES[0], "max_steps": 2})
        env.step(odd)
        env.step(odd)
        records = list(env.store.read_stream(env.state["episode_id"]))
    taken = [r.data["action"] for r in records if r.type == "ActionTaken"]
    assert taken == [{"app": "ticketdesk", "method": "search_tickets",
                      "params": {"query": "x\\ud800"}, "\\udfff": 1}] * 2
    assert records[-1].type == "EpisodeEnded"


@pytest.mark.parametrize("durability", ["step", "episode"])
def test_an_action_too_big_to_log_is_refused_and_the_episode_goes_on(sqlite_url, durability):
    """The store refuses an event over 1 MiB. The step used to advance the live episode anyway
    (the log then missed a step the agent saw) or, held back until the end, lose the episode."""
    listing = {"app": "ticketdesk", "method": "list_tickets", "params": {}}
    huge = {"app": "ticketdesk", "method": "add_comment",
            "params": {"ticket_id": "T-101", "text": "x" * 2_000_000}}
    with CompanyEnv(sqlite_url, durability=durability) as env:
        env.reset(seed=1, options={"task": FAMILIES[1], "chaos": "none", "max_steps": 3})
        env.step(listing)
        with pytest.raises(ValueError, match="bytes of JSON; an action is at most"):
            env.step(huge)
        assert env.state["step_count"] == 1
        env.step(listing)
        env.step(listing)
        assert env.state["done"]
        episode_id = env.state["episode_id"]
        records = list(env.store.read_stream(episode_id))
    taken = [r.data["action"] for r in records if r.type == "ActionTaken"]
    assert taken == [listing] * 3 and records[-1].type == "EpisodeEnded"


@pytest.mark.parametrize("durability", ["step", "episode"])
def test_an_action_whose_events_would_be_too_big_to_log_is_refused(sqlite_url, durability):
    """A submission echoes its data and quotes mismatching values in its problems: an action of
    half the limit logs an event over it. Held back, that used to lose the whole episode."""
    with CompanyEnv(sqlite_url, durability=durability) as env:
        env.reset(seed=1, options={"task": "expense_report", "chaos": "none", "max_steps": 2})
        target = env.runtime.state.target
        approver = env.runtime.state.world.datahub.approvers[target["role"]]["name"]
        data = {**target["fields"], target["field"]: 0, next(iter(target["fields"])): "x" * 540_000}
        action = {"app": "approvalflow", "method": "submit_approval",
                  "params": {"approval_type": target["approval_type"], "approver": approver, "data": data}}
        with pytest.raises(ValueError, match="would log a ApprovalSubmitted event of .* over the log"):
            env.step(action)
        listing = {"app": "ticketdesk", "method": "list_tickets", "params": {}}
        env.step(listing)
        env.step(listing)
        assert env.state["done"]
        records = list(env.store.read_stream(env.state["episode_id"]))
    assert [r.data["action"] for r in records if r.type == "ActionTaken"] == [listing] * 2


@pytest.mark.parametrize("durability", ["step", "episode"])
def test_a_reused_episode_id_is_refused_at_reset_in_words(sqlite_url, durability):
    """Held back, the clash used to surface only when the second episode ended: all of it lost,
    and every later reset and close failing the same way."""
    from companyos.runtime import EpisodeExists

    with CompanyEnv(sqlite_url, durability=durability) as env:
        env.reset(seed=7, options={"task": "expense_report", "episode_id": "expense_report-7"})
        env.step({"app": "ticketdesk", "method": "list_tickets", "params": {}})
        with pytest.raises(EpisodeExists, match="'expense_report-7' is already in the store"):
            env.reset(seed=7, options={"task": "expense_report", "episode_id": "expense_report-7"})
        env.reset(seed=8, options={"task": "expense_report"})
        env.step({"app": "ticketdesk", "method": "list_tickets", "params": {}})
    with EventStore.open(sqlite_url) as store:
        assert len(list(store.read_stream("expense_report-7"))) > 1
        assert len(store.stream_ids(store.last_position())) == 2


def test_an_episode_the_log_refuses_at_the_end_is_dropped_once_not_forever(sqlite_url):
    """With durability="episode", a write that fails when the episode is left is said once; the
    next reset and close work."""
    from companyos.runtime import UnloggedEpisode

    listing = {"app": "ticketdesk", "method": "list_tickets", "params": {}}
    with CompanyEnv(sqlite_url, durability="episode") as env:
        env.reset(seed=4, options={"task": FAMILIES[0]})
        env.step(listing)
        append = env.store.append_head  # how the runtime writes
        env.store.append_head = lambda *a, **k: (_ for _ in ()).throw(OSError("disk full"))
        with pytest.raises(UnloggedEpisode, match="was not logged and is dropped .*disk full"):
            env.reset(seed=5, options={"task": FAMILIES[0]})
        env.store.append_head = append
        env.reset(seed=5, options={"task": FAMILIES[0]})
        env.step(listing)
        kept = env.state["episode_id"]
    with EventStore.open(sqlite_url) as store:
        assert store.stream_ids(store.last_position()) == [kept]


def test_a_step_the_store_fails_to_log_is_not_applied(sqlite_url):
    """What the agent saw is what is stored: a failed append leaves the live episode as it was."""
    listing = {"app": "ticketdesk", "method": "list_tickets", "params": {}}
    with CompanyEnv(sqlite_url) as env:
        env.reset(seed=4, options={"task": FAMILIES[0]})
        env.step(listing)
        before = env.state
        append = env.store.append_head  # how the runtime writes
        env.store.append_head = lambda *a, **k: (_ for _ in ()).throw(OSError("disk full"))
        with pytest.raises(OSError):
            env.step(listing)
        env.store.append_head = append
        assert env.state == before
        env.step(listing)
        assert env.state["step_count"] == 2
        records = list(env.store.read_stream(env.state["episode_id"]))
    assert [r.type for r in records].count("ActionTaken") == 2


@pytest.mark.parametrize("task", FAMILIES)
def test_both_durabilities_log_identical_streams(sqlite_url, task):
    digests = []
    for durability in ("step", "episode"):
        with CompanyEnv(sqlite_url, durability=durability) as env:
            play(env, "random", 11, task)
            digests.append(env.store.stream_digest(env.state["episode_id"]))
    assert digests[0] == digests[1]


def test_an_unfinished_episode_continues_from_the_log_with_the_same_digest(sqlite_url):
    task = FAMILIES[1]
    with CompanyEnv(sqlite_url) as env:
        _, full_actions = play(env, "expert", 5, task)
        uninterrupted = env.store.stream_digest(env.state["episode_id"])
    with CompanyEnv(sqlite_url) as env:
        play(env, "expert", 5, task, stop_after=3)
        episode_id = env.state["episode_id"]
    # a different process (here: a fresh store and runtime) picks the episode up from the log
    store = EventStore.open(sqlite_url)
    runtime = EpisodeRuntime.load(store, episode_id)
    assert runtime.state.step == 3
    for action in full_actions[3:]:
        runtime.step(action)
    assert runtime.state.done
    assert store.stream_digest(episode_id) == uninterrupted
    with pytest.raises(EpisodeNotFound):
        EpisodeRuntime.load(store, "no-such-episode")
    store.close()


_SCRIPT = """
import sys
from companyos.env import CompanyEnv
from companyos.agents import make_agent
env = CompanyEnv(sys.argv[1])
for seed in range(3):
    agent = make_agent("random", seed)
    obs, _ = env.reset(seed=seed, options={"task": sys.argv[2], "chaos": "high"})
    agent.reset(obs)
    done = False
    while not done:
        obs, _, t, tr, _ = env.step(agent.act(obs))
        done = t or tr
    print(env.store.stream_digest(env.state["episode_id"]))
env.close()
"""


def test_same_seed_and_actions_give_the_same_digest_in_any_process(tmp_path):
    outputs = set()
    for n, hash_seed in enumerate(("0", "7", "4242")):
        url = f"sqlite:///{tmp_path / f'p{n}.db'}"
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        out = subprocess.run([sys.executable, "-c", _SCRIPT, url, FAMILIES[2]], env=env,
                             capture_output=True, text=True, check=True)
        outputs.add(out.stdout)
    assert len(outputs) == 1 and len(outputs.pop().split()) == 3


@pytest.mark.parametrize("options, message", [
    ({"task": "world_domination"}, "unknown task"),
    ({"chaos": "apocalyptic"}, "chaos"),
    ({"chaos": 1.5}, "chaos"),
    ({"reward_profile": "lavish"}, "reward_profile"),
    ({"max_steps": 0}, "max_steps"),
    ({"colour": "red"}, "unknown reset options"),
    ({"task": ["vendor_onboarding"]}, "task must be a non-empty string"),
    ({"reward_profile": {"a": 1}}, "reward_profile must be a non-empty string"),
    # an empty one (an unset variable) was read as "not given": the task chosen by seed
    ({"task": ""}, "task must be a non-empty string"),
    ({"reward_profile": ""}, "reward_profile must be a non-empty string"),
    ({"rules": 9}, "no rules version 9; the versions are 1, 2"),
    ({"rules": "2"}, "rules must be a whole number, one of the versions 1, 2, 3, 4, not '2'"),
])
def test_bad_reset_options_are_refused_in_words(sqlite_url, options, message):
    with CompanyEnv(sqlite_url) as env, pytest.raises(ValueError, match=message):
        env.reset(seed=1, options=options)


@pytest.mark.parametrize("options", [[("task", "expense_report")], "task", 5])
def test_reset_options_that_are_no_dict_are_a_type_error_in_words(sqlite_url, options):
    """A list of pairs reached `options.get` (an AttributeError); a string, `dict()`'s ValueError."""
    with CompanyEnv(sqlite_url) as env, pytest.raises(TypeError, match="options must be a dict"):
        env.reset(seed=1, options=options)


@pytest.mark.parametrize("db", [5, b"sqlite:///x.db", pathlib.Path("x.db")])
def test_a_db_that_is_no_url_is_a_type_error_in_words(db):
    """A path or a number failed on `.strip` (an AttributeError), bytes as a URL SQLAlchemy refused."""
    with pytest.raises(TypeError, match="db must be a store URL such as sqlite:///"):
        CompanyEnv(db)


def test_reset_takes_a_rules_version_and_state_says_which_judges_the_episode(sqlite_url):
    import numpy as np

    with CompanyEnv(sqlite_url) as env:
        env.reset(seed=1)
        assert env.state["rules"] == domain.CURRENT_RULES
        env.reset(seed=1, options={"rules": np.int64(1)})  # as Gymnasium code draws its numbers
        assert env.state["rules"] == 1
        started = next(env.store.read_stream(env.state["episode_id"]))
        assert "rules" not in json.loads(started.data_json)["target"]  # as logs before versions


def test_a_null_chaos_option_means_the_default_level(sqlite_url):
    with CompanyEnv(sqlite_url) as env:
        env.reset(seed=1, options={"chaos": None})
        assert env.state["chaos"] == domain.parse_chaos("medium")


def test_stepping_before_reset_or_after_the_end_is_a_caller_error(sqlite_url):
    with CompanyEnv(sqlite_url) as env:
        with pytest.raises(RuntimeError, match="reset"):
            env.step({"app": "ticketdesk", "method": "list_tickets", "params": {}})
        play(env, "noop", 1, FAMILIES[0])
        with pytest.raises(domain.EpisodeFinished):
            env.step({"app": "ticketdesk", "method": "list_tickets", "params": {}})


def test_another_process_resumes_an_episode_from_the_log_and_finishes_it(sqlite_url, tmp_path):
    """durability="step" promised that any other process can continue an episode, but CompanyEnv
    refused its id at reset and had nothing else: `resume` continues it, and the stream is the one
    an uninterrupted run logs."""
    with CompanyEnv(f"sqlite:///{tmp_path / 'whole.db'}") as whole:
        info, actions = play(whole, "random", 9, FAMILIES[1], "high")
        digest = whole.store.stream_digest(info["episode_id"])
    with CompanyEnv(sqlite_url) as first:
        info, _ = play(first, "random", 9, FAMILIES[1], "high", stop_after=3)
    episode_id = info["episode_id"]
    script = textwrap.dedent(f"""
        import json, sys
        from companyos.env import CompanyEnv
        with CompanyEnv({sqlite_url!r}) as env:
            assert env.resume({episode_id!r})["step_count"] == 3
            for action in json.loads(sys.stdin.read())[3:]:
                env.step(action)
            print(env.state["outcome"])
    """)
    done = subprocess.run([sys.executable, "-c", script], input=json.dumps(actions), capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    with CompanyEnv(sqlite_url) as env:
        assert env.store.stream_digest(episode_id) == digest and done.stdout.strip() == env.resume(
            episode_id)["outcome"]
        with pytest.raises(EpisodeNotFound):
            env.resume("no-such-episode")


def test_observation_text_is_rendered_only_on_demand(sqlite_url):
    with CompanyEnv(sqlite_url) as env:
        obs, _ = env.reset(seed=2, options={"task": FAMILIES[0]})
        assert "text" not in obs
        before = (dict(obs), json.dumps(obs))
        assert isinstance(obs["text"], str) and obs["text"]
        assert obs.text == obs["text"]
        # reading the text changes nothing else: it had become a key, so equality, keys and the
        # JSON of an observation depended on whether someone had read it
        assert "text" not in obs and (dict(obs), json.dumps(obs)) == before and obs == before[0]
        assert json.loads(json.dumps(obs.with_text()))["text"] == obs.text  # the whole, for wires


def test_run_cli_json_reports_every_episode_with_its_digest(tmp_path):
    url = f"sqlite:///{tmp_path / 'run.db'}"
    out = subprocess.run(
        [sys.executable, "-m", "companyos", "run", "--agent", "expert", "--task", "all",
         "--chaos", "low", "--episodes", "10", "--seed", "100", "--db", url, "--json"],
        capture_output=True, text=True, check=True)
    document = json.loads(out.stdout)
    episodes = document["episodes"]
    assert [e["seed"] for e in episodes] == list(range(100, 110))
    assert [e["task"] for e in episodes[:len(FAMILIES)]] == FAMILIES
    assert document["summary"]["episodes"] == 10
    store = EventStore.open(url)
    for e in episodes:
        assert store.stream_digest(e["episode_id"]) == e["digest"]
        assert e["outcome"] in ("success", "failure", "truncated")
        assert (e["failure_mode"] is None) == (e["outcome"] == "success")
    store.close()
    again = subprocess.run(
        [sys.executable, "-m", "companyos", "run", "--agent", "expert", "--task", "all",
         "--chaos", "low", "--episodes", "10", "--seed", "100", "--db", url, "--json",
         "--workers", "2"], capture_output=True, text=True, check=True)
    assert [e["digest"] for e in json.loads(again.stdout)["episodes"]] == [e["digest"] for e in episodes]


def test_a_run_of_no_episodes_has_no_success_rate_or_means(tmp_path):
    """`run --episodes 0` said success 0.0% and mean return 0.00 (JSON 0.0): a script averaging
    runs read it as a run that never succeeded. Nothing was run, so there is nothing to average."""
    url = f"sqlite:///{tmp_path / 'run.db'}"
    command = [sys.executable, "-m", "companyos", "run", "--episodes", "0", "--db", url]
    document = json.loads(subprocess.run([*command, "--json"], capture_output=True, text=True,
                                         check=True).stdout)
    assert document == {"rules": domain.CURRENT_RULES,
                        "summary": {"episodes": 0, "success_rate": None, "success_rate_low": None,
                                    "success_rate_high": None, "outcomes": {}, "mean_return": None,
                                    "std_return": None, "mean_steps": None, "failure_modes": {}},
                        "episodes": []}
    table = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    for metric in ("success rate", "95% interval", "mean return", "mean steps"):
        assert re.search(rf"{metric}\s+│\s+n/a", table), table


def test_run_reports_each_return_exactly_as_the_log_holds_it(tmp_path):
    """`run --json` and `episodes --json` give one episode the same return, to the last bit."""
    url = f"sqlite:///{tmp_path / 'run.db'}"
    cli = [sys.executable, "-m", "companyos"]
    ran = json.loads(subprocess.run(
        [*cli, "run", "--agent", "random", "--chaos", "high", "--episodes", "30", "--db", url,
         "--json"], capture_output=True, text=True, check=True).stdout)["episodes"]
    listed = json.loads(subprocess.run([*cli, "episodes", "--limit", "0", "--db", url, "--json"],
                                       capture_output=True, text=True, check=True).stdout)["episodes"]
    assert {e["episode_id"]: e["return"] for e in ran} == {
        e["episode_id"]: e["total_return"] for e in listed}


def test_run_cli_refuses_unknown_agents_and_tasks(tmp_path):
    url = f"sqlite:///{tmp_path / 'run.db'}"
    for args in (["--agent", "genius"], ["--task", "nap"], ["--chaos", "extreme"],
                 ["--reward-profile", "lavish"]):
        out = subprocess.run([sys.executable, "-m", "companyos", "run", "--db", url, *args],
                             capture_output=True, text=True)
        # one `error:` line naming the value, as `episodes --task nap` says it (was a usage box)
        assert out.returncode == 2 and out.stderr.startswith("error: ") and args[1] in out.stderr
        assert out.stderr.count("\n") == 1, out.stderr


def test_run_judges_by_the_rules_version_asked_for_and_says_which(tmp_path):
    from companyos.commands import run as run_commands
    from tests.conftest import command_runner

    cli = command_runner(run_commands.register)
    url = f"sqlite:///{tmp_path / 'run.db'}"
    for args, rules in (([], domain.CURRENT_RULES), (["--rules", "1"], 1)):
        doc = json.loads(cli("run", "--episodes", "2", "--db", url, "--json", *args).stdout)
        assert doc["rules"] == rules and doc["summary"]["episodes"] == 2
    with EventStore.open(url) as store:
        starts = [json.loads(r.data_json)["target"] for r in store.read_all() if r.version == 0]
    assert [domain.rules_of(t) for t in starts] == [domain.CURRENT_RULES] * 2 + [1, 1]
    out = cli("run", "--episodes", "2", "--db", url, "--rules", "9")
    assert out.exit_code == 2 and "no rules version 9" in out.output


def test_cli_names_a_store_it_cannot_open_without_a_traceback(tmp_path):
    out = subprocess.run([sys.executable, "-m", "companyos", "run", "--episodes", "1", "--db",
                          f"sqlite:///{tmp_path}/missing/dir/x.db"], capture_output=True, text=True)
    assert out.returncode == 2
    assert "cannot open the store" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.parametrize("args", [["verify"], ["episodes"], ["db", "upgrade"], ["analytics", "sync"],
                                  ["run", "--episodes", "1"]])
@pytest.mark.parametrize("url", ["postgresql://u@127.0.0.1:abc/db", "sqlite:///%00"])
def test_a_url_whose_port_is_not_a_number_or_file_a_nul_is_one_error_line(tmp_path, args, url):
    """`sqlite:///%00` (a NUL in the file name) was a traceback of sqlite3's "embedded null byte"."""
    out = subprocess.run([sys.executable, "-m", "companyos", *args, "--db", url],
                         capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.startswith("error: ") and "is not a database URL" in out.stderr


def test_a_password_in_the_store_url_is_never_printed(fresh_pg_url, tmp_path):
    """`db upgrade` echoed the URL as given, password and all, into terminals and CI logs; a
    password given as `?password=` (libpq takes it) was shown in every error line."""
    url = sa.make_url(fresh_pg_url).set(password="s3cret")
    as_given = url.render_as_string(hide_password=False)
    out = subprocess.run([sys.executable, "-m", "companyos", "db", "upgrade", "--db", as_given],
                         capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0 and ":***@" in out.stdout and "s3cret" not in out.stdout, out.stdout
    missing = url.set(password=None, database="companyos_no_such_db").update_query_dict(
        {"password": "s3cret"}).render_as_string(hide_password=False)
    out = subprocess.run([sys.executable, "-m", "companyos", "episodes", "--db", missing],
                         capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode != 0 and "password=***" in out.stderr and "s3cret" not in out.stderr, out.stderr


def test_a_store_on_read_only_media_is_read_by_every_command_without_side_files(tmp_path):
    """`immutable=1` is the README's URL for read-only media, where SQLite cannot make the WAL's
    side files: `verify` and `episodes` worked, but opening the store probed it with `mode=ro`
    alone and the analytics read it so, and there every analytics command failed."""
    def companyos(*args):
        return subprocess.run([sys.executable, "-m", "companyos", *args], capture_output=True,
                              text=True, cwd=tmp_path)

    assert companyos("run", "--episodes", "3", "--db", "sqlite:///s.db").returncode == 0
    assert not list(tmp_path.glob("s.db-[sw][ha][ml]"))  # a clean close leaves no WAL files
    media = f"sqlite:///file:{tmp_path / 's.db'}?immutable=1&uri=true"
    out = companyos("analytics", "query", "success_by_task_and_chaos", "--db", media,
                    "--warehouse", str(tmp_path / "w.duckdb"), "--format", "json")
    assert out.returncode == 0 and sum(r["episodes"] for r in json.loads(out.stdout)) == 3, out.stderr
    assert companyos("verify", "--db", media).returncode == 0
    assert not list(tmp_path.glob("s.db-[sw][ha][ml]"))  # nothing written beside the store


def test_a_postgresql_url_option_libpq_refuses_is_the_calls_fault_not_an_outage(tmp_path):
    """`?bogus=1` exited 1, the code of an outage worth retrying; libpq refuses it before it
    reaches any server, so no retry can help (exit 2, as SQLite's mistyped argument)."""
    out = subprocess.run([sys.executable, "-m", "companyos", "episodes", "--db",
                          "postgresql://nobody@127.0.0.1/nothing?bogus=1"],
                         capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 2 and 'invalid connection option "bogus"' in out.stderr, out.stderr


def test_a_sqlite_url_argument_the_driver_would_ignore_is_refused(tmp_path):
    """A typo (`?mdoe=ro`) or `?mode=ro` without `uri=true` was a warning with a source line, and
    the store opened read-write as if the argument were absent."""
    EventStore.open(f"sqlite:///{tmp_path / 's.db'}").close()
    for args in (["episodes"], ["run", "--episodes", "1"]):
        out = subprocess.run([sys.executable, "-m", "companyos", *args, "--db", "sqlite:///s.db?mdoe=ro"],
                             capture_output=True, text=True, cwd=tmp_path)
        assert out.returncode == 2 and "Traceback" not in out.stderr and "Warning" not in out.stderr
        assert "SQLite takes no query argument 'mdoe' here" in out.stderr, out.stderr
    with EventStore.open(f"sqlite:///{tmp_path / 's.db'}") as store:
        assert store.last_position() == 0


@pytest.mark.parametrize("url, said", [
    # with uri=true SQLite itself dropped the typo: the store opened read-write and took episodes
    ("sqlite:///file:s.db?mdoe=ro&uri=true", "SQLite takes no URI argument 'mdoe'"),
    # without file: the name was a file of its own, `s.db?mode=ro`, made and written
    ("sqlite:///s.db?uri=true&mode=rw", "begins with file:"),
    # an argument without a value was dropped by SQLAlchemy: `?readonly` opened read-write, and
    # a `?` in the name opened another file (`a?.db` was `a`)
    ("sqlite:///s.db?readonly", "the query argument 'readonly' has no value"),
    ("sqlite:///file:s.db?uri=true&immutable", "the query argument 'immutable' has no value"),
    ("sqlite:///a?.db", "a '?' in a file name as %3F"),
])
def test_a_sqlite_uri_that_would_open_another_file_or_drop_an_argument_is_refused(tmp_path, url, said):
    EventStore.open(f"sqlite:///{tmp_path / 's.db'}").close()
    out = subprocess.run([sys.executable, "-m", "companyos", "run", "--episodes", "1", "--db", url],
                         capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 2 and said in out.stderr, out.stderr
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("s.db-")) == ["s.db"]
    with EventStore.open(f"sqlite:///{tmp_path / 's.db'}") as store:
        assert store.last_position() == 0


@pytest.mark.parametrize("args", [["verify"], ["episodes"], ["rebuild"], ["replay", "x"],
                                  ["analytics", "sync"], ["analytics", "query", "failure_modes"]])
def test_a_command_that_reads_the_log_refuses_a_store_file_that_does_not_exist(tmp_path, args):
    """A typo in --db made an empty store there, and `verify` certified it: "0 streams ... ok"."""
    typo = tmp_path / "typo.db"
    out = subprocess.run([sys.executable, "-m", "companyos", *args, "--db", f"sqlite:///{typo}"],
                         capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 2, out.stderr
    assert out.stderr == (f"error: there is no store at {typo} (sqlite:///{typo}); `companyos run` "
                          "or `companyos db upgrade` creates one\n")
    assert os.listdir(tmp_path) == []


def test_cli_names_a_damaged_commit_without_a_traceback(tmp_path):
    url = f"sqlite:///{tmp_path}/store.db"
    with CompanyEnv(url) as env:
        env.reset(seed=3, options={"task": "handbook_update"})
        episode_id = env.state["episode_id"]
    with EventStore.open(url) as store, store.engine.begin() as conn:
        conn.execute(sa.text("UPDATE commits SET payload = '[' WHERE stream_id = :s"),
                     {"s": episode_id})
    out = subprocess.run([sys.executable, "-m", "companyos", "replay", episode_id, "--db", url],
                         capture_output=True, text=True)
    assert out.returncode == 1
    assert episode_id in out.stderr and "does not unpack" in out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs Linux's /dev/full")
@pytest.mark.parametrize("args", [["tasks"], ["run", "--episodes", "2"],
                                  ["run", "--episodes", "2", "--json"]])
def test_cli_says_when_its_output_cannot_be_written(tmp_path, args):
    """Output redirected to a full disk: one error line and exit 1, and the run still logged."""
    url = f"sqlite:///{tmp_path}/store.db"
    extra = ["--db", url] if args[0] == "run" else []
    with open("/dev/full", "w") as full:
        out = subprocess.run([sys.executable, "-m", "companyos", *args, *extra], stdout=full,
                             stderr=subprocess.PIPE, text=True)
    assert out.returncode == 1
    assert out.stderr == "error: cannot write the output: No space left on device\n"
    if extra:
        with EventStore.open(url) as store:
            assert len(store.stream_ids(store.last_position())) == 2


@pytest.mark.parametrize("args", [["tasks"], ["run", "--episodes", "2"],
                                  ["run", "--episodes", "2", "--json"]])
def test_cli_says_when_it_was_started_without_stdout(tmp_path, args):
    """`companyos ... >&-` (cron, a daemon's child): a traceback about None's `isatty`; and the
    store's file, opened first, could take descriptor 1 and get what was printed."""
    url = f"sqlite:///{tmp_path}/store.db"
    extra = ["--db", url] if args[0] == "run" else []
    out = subprocess.run([sys.executable, "-m", "companyos", *args, *extra],
                         preexec_fn=lambda: os.close(1), stderr=subprocess.PIPE, text=True)
    assert out.returncode == 1
    assert out.stderr == "error: cannot write the output: standard output is closed\n"
    if extra:
        with EventStore.open(url) as store:
            assert len(store.stream_ids(store.last_position())) == 2
        assert _cli("verify", "--db", url).returncode == 0


@pytest.mark.parametrize("args", [["tasks"], ["run", "--episodes", "2", "--json"]])
def test_cli_stops_quietly_when_its_reader_goes_away(tmp_path, args):
    """`companyos tasks | head -1`: the reader closes the pipe; no traceback, as Unix tools do."""
    extra = ["--db", f"sqlite:///{tmp_path}/store.db"] if args[0] == "run" else []
    cli = subprocess.Popen([sys.executable, "-m", "companyos", *args, *extra],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    cli.stdout.close()  # the reader leaves before reading a byte
    _, err = cli.communicate()
    assert cli.returncode == 1 and b"Traceback" not in err and err == b""


def _unboxed(text: str) -> str:
    """A usage error's words without the box rich draws around them."""
    return " ".join(re.sub("[│╭╮╰╯─]", " ", text).split())


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "companyos", *args], capture_output=True,
                          text=True, env=None if env is None else {**os.environ, **env})


def _clis(*calls: list[str] | tuple[list[str], dict[str, str]]) -> list[subprocess.CompletedProcess]:
    """`_cli` of each independent call (its arguments, or its arguments and environment
    variables), two at a time."""
    return two_at_a_time(lambda call: _cli(*call[0], env=call[1]) if isinstance(call, tuple)
                         else _cli(*call), calls)


@pytest.mark.parametrize("args", [["verify"], ["episodes"], ["analytics", "query", "failure_modes"]])
def test_a_command_that_reads_the_log_adds_no_store_to_a_database_without_one(
        empty_store_url, tmp_path, args):
    """On PostgreSQL any database a URL named got the store's tables (and verify said "ok");
    a SQLite file that is not a store was migrated the same way."""
    engine = sa.create_engine(normalise_url(empty_store_url))
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE customers (id INTEGER)"))
    engine.dispose()
    out = subprocess.run([sys.executable, "-m", "companyos", *args, "--db", empty_store_url],
                         capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "there is no store at" in out.stderr and "holds none of its tables" in out.stderr
    assert sa.inspect(engine).get_table_names() == ["customers"]
    assert [p.name for p in tmp_path.iterdir()] == (["store.db"] if "sqlite" in empty_store_url else [])
    engine.dispose()


@pytest.mark.parametrize("url", ["sqlite://", "sqlite:///:memory:"])
def test_a_reader_told_of_an_in_memory_store_hears_that_it_is_one(tmp_path, url):
    """It was told the database "holds none of its tables" and that `run` creates one, which
    `run` then refused: an in-memory store is empty in every process that opens it."""
    out = subprocess.run([sys.executable, "-m", "companyos", "analytics", "sync", "--db", url],
                         capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stderr == (f"error: there is no store at {url}: it is an in-memory SQLite database, "
                          "empty when a process opens it; name the store's file, e.g. "
                          "sqlite:///companyos.db\n")


@pytest.mark.parametrize("command", [["run", "--episodes", "1"], ["db", "upgrade"]])
def test_a_database_of_another_applications_tables_is_not_made_a_store(empty_store_url, command):
    """A mistyped --db naming another application's SQLite file (or a PostgreSQL database in use)
    got the store's tables beside that application's: only tables of the store's own names were
    refused. Now any table there and none of the store's is refused, and nothing is added."""
    engine = sa.create_engine(normalise_url(empty_store_url))
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE users (id INTEGER)"))
    engine.dispose()
    file = sqlite_file(normalise_url(empty_store_url))
    before = file and pathlib.Path(file).read_bytes()
    out = _cli(*command, "--db", empty_store_url)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "another application's tables (users)" in out.stderr and "of its own" in out.stderr
    # not a byte changed: the refusal came after the first connection had turned the file to WAL
    assert file is None or pathlib.Path(file).read_bytes() == before
    assert sa.inspect(engine).get_table_names() == ["users"]
    engine.dispose()
    out = _cli("episodes", "--db", empty_store_url)  # it pointed readers to run or db upgrade
    assert out.returncode == 2 and "creates one" not in out.stderr, out.stderr


def test_run_refuses_seeds_past_64_bits_before_logging_anything(tmp_path):
    """Seeds are 64-bit in every reader of the log: one past it used to be stored, then break
    `episodes` and `rebuild` for the whole store."""
    url = f"sqlite:///{tmp_path / 'run.db'}"
    refused = ((2**63 - 1, "past the largest seed"),  # its second episode's seed
               (2**64 - 1, "seeds are non-negative and 64-bit"))
    outs = _clis(*(["run", "--episodes", "2", "--seed", str(seed), "--db", url] for seed, _ in refused))
    for (_, why), out in zip(refused, outs, strict=True):
        assert out.returncode == 2 and why in _unboxed(out.stderr), out.stderr
    assert _cli("run", "--episodes", "1", "--seed", str(2**63 - 1), "--db", url).returncode == 0
    listed = _cli("episodes", "--db", url, "--json")
    assert listed.returncode == 0
    assert [e["seed"] for e in json.loads(listed.stdout)["episodes"]] == [2**63 - 1]
    with pytest.raises(ValueError, match="outside 0 to"):
        CompanyEnv(url).reset(seed=-(2**63) - 1)


def test_seeds_follow_one_rule_in_process_in_run_and_over_the_network(sqlite_url, tmp_path):
    """A negative seed played in process and in `run` but the server refused it; a NumPy integer
    (as Gymnasium code draws seeds) was refused in process. Seeds are non-negative integers
    everywhere, and a NumPy one plays and logs as the same int."""
    import numpy as np
    from fastapi.testclient import TestClient

    from api.app import create_app
    from api.config import ServerConfig

    digests = []
    for seed in (7, np.int64(7), np.uint32(7)):
        with CompanyEnv(sqlite_url) as env:
            info, _ = play(env, "expert", seed, FAMILIES[0])
            digests.append(env.store.stream_digest(env.state["episode_id"]))
            assert type(env.state["seed"]) is int and env.state["seed"] == 7
    assert len(set(digests)) == 1
    words = "seed -1 is outside 0 to"
    with CompanyEnv(sqlite_url) as env:
        for bad, said in ((-1, words), (np.int64(-1), words), (np.bool_(True), "not bool"),
                          (7.0, "not float"), ("7", "not str")):
            with pytest.raises(ValueError, match=said):
                env.reset(seed=bad)
    out = _cli("run", "--episodes", "1", "--seed", "-1", "--db", f"sqlite:///{tmp_path / 'r.db'}")
    assert out.returncode == 2 and words in _unboxed(out.stderr), out.stderr
    with TestClient(create_app(ServerConfig(db=sqlite_url))) as c:
        r = c.post("/reset", json={"seed": -1})
        assert r.status_code == 422 and "greater than or equal to 0" in r.text
        with c.websocket_connect("/ws") as ws:
            ws.send_json({"type": "reset", "data": {"seed": -1}})
            assert words in ws.receive_json()["data"]["message"]


def test_a_seed_is_the_same_episode_whichever_seed_its_run_starts_from(tmp_path):
    """`--task all` gave episode i the family i % 5 of its own run: seed 3 was license_renewal
    from `--seed 0` but vendor_onboarding from `--seed 3`, so a run resumed from the seed ranges
    an interrupted one reports played other episodes than the whole run would have."""
    from companyos.batch import RunPlan
    from companyos.batch import run as run_plan

    def played(db: str, seed: int, episodes: int) -> dict[int, tuple[str, str]]:
        plan = RunPlan(f"sqlite:///{tmp_path / db}", "expert", "all", "medium", episodes, seed)
        return {r.seed: (r.task, r.digest) for r in run_plan(plan, workers=1)}

    whole, resumed = played("whole.db", 0, 8), played("resumed.db", 3, 5)
    assert resumed == {seed: whole[seed] for seed in range(3, 8)}
    assert len({task for task, _ in whole.values()}) == len(FAMILIES)  # still every family in turn
    with CompanyEnv(f"sqlite:///{tmp_path / 'env.db'}") as env:
        for seed in (3, 4):
            env.reset(seed=seed)
            assert env.state["task"] == whole[seed][0]


def test_numpy_chaos_and_max_steps_play_as_the_python_numbers_they_are(sqlite_url):
    """`max_steps=np.int64(9)` was refused as "must be an integer", and a NumPy chaos level as not a
    number, in process, while a remote reset took both (they arrive as JSON numbers)."""
    import numpy as np

    digests = []
    for max_steps, chaos in ((9, 0.5), (np.int64(9), np.float32(0.5)), (np.uint8(9), np.float64(0.5))):
        with CompanyEnv(sqlite_url) as env:
            env.reset(seed=3, options={"task": FAMILIES[1], "chaos": chaos, "max_steps": max_steps})
            assert (env.state["max_steps"], env.state["chaos"]) == (9, 0.5)
            assert type(env.state["max_steps"]) is int and type(env.state["chaos"]) is float
            digests.append(env.store.stream_digest(env.state["episode_id"]))
    assert len(set(digests)) == 1
    with CompanyEnv(sqlite_url) as env:
        for options, said in (({"max_steps": np.int64(0)}, "from 1 to 10000"),
                              ({"max_steps": np.float64(9)}, "must be an integer"),
                              ({"chaos": np.float64(1.5)}, "outside"),
                              ({"chaos": np.bool_(True)}, "level name or a number")):
            with pytest.raises(ValueError, match=said):
                env.reset(seed=3, options=options)


def test_run_refuses_an_in_memory_store_and_outsized_counts(tmp_path):
    memory_uri = "sqlite:///file:memdb1?mode=memory&cache=shared&uri=true"  # its episodes vanished
    empty = f"sqlite:///{tmp_path / 'empty.db'}"
    said = [  # (call, what its one error line says; None: only that it is a wrong call)
        (["run", "--db", memory_uri], "in-memory SQLite store"),
        (["run", "--db", "sqlite://"], "in-memory SQLite store"),
        (["run", "--db", "sqlite:///"], None),
        (["run", "--episodes", str(2**62)], None),
        (["run", "--workers", "1000"], None),
        # an empty value (an unset shell variable) is a wrong call, not the default or no filter
        (["run", "--reward-profile", "", "--db", empty], "--reward-profile is empty"),
        (["episodes", "--task", "", "--db", empty], "unknown task ''"),
        (["episodes", "--outcome", "", "--db", empty], "unknown outcome ''"),
        # SQLite's anonymous temporary file: the run "succeeded", and verify then found no store
        (["run", "--episodes", "1", "--db", "sqlite:///file:?uri=true"], "in-memory SQLite store"),
        # a URL that does not parse is said as every command says it, not as int()'s words
        (["run", "--episodes", "1", "--db", "postgresql://postgres@[::1/db"], "is not a database URL"),
    ]
    for (call, words), out in zip(said, _clis(*(call for call, _ in said)), strict=True):
        assert out.returncode == 2 and "Traceback" not in out.stderr, (call, out.stderr)
        assert words is None or words in _unboxed(out.stderr), (call, out.stderr)


def test_an_empty_companyos_db_is_refused_as_an_empty_db_option_is(monkeypatch, tmp_path):
    """`COMPANYOS_DB=$UNSET companyos run` wrote into ./companyos.db, where `--db ""` is refused."""
    from companyos.config import resolve_db
    from eventstore import StoreUnavailable

    monkeypatch.chdir(tmp_path)
    for blank in ("", "   "):
        monkeypatch.setenv("COMPANYOS_DB", blank)
        with pytest.raises(StoreUnavailable, match="COMPANYOS_DB is set but empty; set it to a store URL"):
            resolve_db(None)
        assert resolve_db("sqlite:///given.db") == "sqlite:///given.db"  # --db still wins
    monkeypatch.delenv("COMPANYOS_DB")
    assert resolve_db(None) == "sqlite:///companyos.db"
    monkeypatch.setenv("COMPANYOS_DB", "")
    out = _cli("run", "--episodes", "1")
    assert out.returncode == 2 and "COMPANYOS_DB is set but empty" in out.stderr, out.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_store_the_database_refuses_is_one_error_line(tmp_path):
    """A damaged file (or a read-only one, or a driver that is not installed) is the world's
    problem: one `error:` line, no traceback."""
    path = tmp_path / "s.db"
    assert _cli("run", "--episodes", "20", "--db", f"sqlite:///{path}").returncode == 0
    data = bytearray(path.read_bytes())
    middle = len(data) * 6 // 10
    data[middle:middle + 3000] = bytes((i * 7 + 13) % 256 for i in range(3000))
    path.write_bytes(bytes(data))
    (tmp_path / "folder").mkdir()
    junk = tmp_path / "junk.db"
    junk.write_text("junk")
    bogus = f"file:{path}?mode=bogus&uri=true"
    missing = f"file:{tmp_path / 'none.db'}?mode=ro&uri=true"
    calls = [["verify", "--db", f"sqlite:///{path}"],
             *(["run", "--episodes", "1", "--db", f"sqlite:///{tmp_path / wrong}"]
               for wrong in ("folder", "no-such-folder/s.db")),
             ["run", "--episodes", "1", "--db", f"sqlite:///{bogus}"],
             ["verify", "--db", f"sqlite:///{missing}"],
             *([*command, "--db", f"sqlite:///{junk}"] for command in (["verify"], ["run", "--episodes", "1"],
                                                                       ["episodes"])),
             ["episodes", "--db", "mysql://a@127.0.0.1:1/x"],
             ["episodes", "--db", "postgresql://someone@127.0.0.1:1/nowhere"]]
    damaged, folder, no_folder, bad_mode, no_file, *no_database, mysql, unanswered = _clis(*calls)
    assert damaged.returncode == 1 and damaged.stderr.startswith("error: the store failed: "), damaged.stderr
    assert "Traceback" not in damaged.stderr
    # SQLite says "unable to open database file" of a directory, a missing folder, a store in a
    # read-only directory (no WAL can be made) and a process out of file descriptors: the last
    # two are the world's problem (exit 1, as when the refusal comes later), the first two the
    # call's; out of descriptors, it was exit 2
    script = tmp_path / "out_of_descriptors.py"
    script.write_text(textwrap.dedent("""
        import os, resource, sys
        from eventstore import EventStore, StoreUnavailable, StoreUnreachable
        EventStore.open(sys.argv[1]).close()  # the store made, every lazy import done
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
        held = []
        try:
            while True:
                held.append(os.open(os.devnull, os.O_RDONLY))
        except OSError:
            pass
        try:
            EventStore.open(sys.argv[1])
        except StoreUnreachable:
            print("world")
        except StoreUnavailable:
            print("call")
    """))
    out = subprocess.run([sys.executable, str(script), f"sqlite:///{tmp_path / 'fds.db'}"],
                         capture_output=True, text=True, env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert out.stdout.strip() == "world", out.stderr
    for out in (folder, no_folder):
        assert out.returncode == 2 and "unable to open database file" in out.stderr, out.stderr
    # a URI SQLite cannot use, or a file a read-only URI cannot find: the call's (2), too
    for out, said in ((bad_mode, "no such access mode"), (no_file, "there is no store")):
        assert out.returncode == 2 and said in out.stderr, out.stderr
    # a file that is no database at all: the URL names the wrong thing (2), as a directory does
    for out in no_database:
        assert out.returncode == 2 and "file is not a database" in out.stderr, out.stderr
    assert mysql.returncode == 2 and "needs a database driver that is not installed" in mysql.stderr
    # a PostgreSQL server that does not answer: an outage (1, worth retrying), said on one line
    # (it was 2, the wrong-call code, on three lines)
    assert unanswered.returncode == 1 and "Traceback" not in unanswered.stderr, unanswered.stderr
    assert unanswered.stderr.startswith(
        "error: cannot open the store at postgresql://someone@127.0.0.1:1/nowhere: ")
    assert len(unanswered.stderr.strip().splitlines()) == 1, unanswered.stderr


def test_serve_says_in_one_line_why_it_cannot_listen(tmp_path):
    """Before its banner, and with the project's exit codes (Uvicorn's own is 3)."""
    import socket

    url = f"sqlite:///{tmp_path / 's.db'}"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        out = _cli("serve", "--port", port, "--db", url)
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr == f"error: cannot listen on 127.0.0.1:{port}: Address already in use\n"
    host, level, idle, wait, *memory, spaced, empty = _clis(
        ["serve", "--host", "no-such-host.invalid", "--db", url],
        ["serve", "--log-level", "loud", "--db", url],
        ["serve", "--idle-timeout", "nan", "--db", url],
        ["verify", "--wait", "nan", "--db", url],
        *(["serve", "--db", m] for m in ("sqlite://", "sqlite:///file:m?mode=memory&cache=shared&uri=true")),
        (["serve", "--db", url], {"COMPANYOS_API_KEY": "two words"}),
        (["serve", "--db", url], {"COMPANYOS_API_KEY": ""}))
    assert host.returncode == 2 and host.stderr.startswith("error: cannot listen on 'no-such-host")
    assert level.returncode == 2 and "--log-level must be one of critical" in level.stderr
    # nan was refused with the words of a bound it does not break ("... less than or equal to 3600")
    assert idle.returncode == 2 and "from 0.001 to 31,622,400, not nan" in _unboxed(idle.stderr), idle.stderr
    assert wait.returncode == 2 and "from 0 to 3,600, not nan" in _unboxed(wait.stderr), wait.stderr
    for out in memory:
        assert out.returncode == 2 and "is an in-memory SQLite store" in _unboxed(out.stderr), out.stderr
    # a key no Authorization header can carry locked out every client with "wrong API key"
    assert spaced.returncode == 2 and "COMPANYOS_API_KEY" in spaced.stderr and "' '" in spaced.stderr
    # set but empty (`COMPANYOS_API_KEY=$KEY`, KEY unset) served every route without a key
    assert empty.returncode == 2 and "COMPANYOS_API_KEY is set but empty" in empty.stderr, empty.stderr


_SERVE_WITH_FEW_FILES = """
import resource, sys
soft, hard = (int(n) for n in sys.argv[1:3])
resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
import uvicorn
uvicorn.run = lambda *a, **k: print("open files", resource.getrlimit(resource.RLIMIT_NOFILE)[0])
from companyos.cli import main
sys.argv = ["companyos", "serve", "--port", "0", "--db", sys.argv[3]]
main()
"""


def test_serve_raises_its_open_files_limit_and_says_when_sessions_cannot_fit(tmp_path):
    """At the usual soft limit of 1,024 files, clients past ~1,000 were dropped without a word,
    below the default --max-sessions of 1,024, while the hard limit allowed far more."""
    import resource

    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < 2048:
        pytest.skip(f"the hard limit of open files here is {hard}")
    url = f"sqlite:///{tmp_path / 's.db'}"
    out = subprocess.run([sys.executable, "-c", _SERVE_WITH_FEW_FILES, "256", "4096", url],
                         capture_output=True, text=True)
    assert out.returncode == 0 and "open files 4096" in out.stdout, out.stderr
    assert "note:" not in out.stderr
    out = subprocess.run([sys.executable, "-c", _SERVE_WITH_FEW_FILES, "512", "512", url],
                         capture_output=True, text=True)
    assert out.returncode == 0 and "open files 512" in out.stdout, out.stderr
    assert "may open 512 files, too few for --max-sessions 1024" in _unboxed(out.stderr), out.stderr


@pytest.mark.parametrize("episode_id", ["a\x00b", "épisode-1", "ends-in-newline\n", "", "x" * 129, 7])
def test_an_episode_id_no_client_could_name_is_refused_in_process_as_over_http(sqlite_url, episode_id):
    """A NUL failed on PostgreSQL with a driver error; other ids were logged but unreachable
    over HTTP, whose rule now applies in process too (and `$` no longer lets a newline end one)."""
    from fastapi.testclient import TestClient

    from api.app import create_app
    from api.config import ServerConfig

    with CompanyEnv(sqlite_url) as env:
        with pytest.raises(ValueError, match="episode_id must be 1-128 characters"):
            env.reset(seed=1, options={"task": FAMILIES[0], "episode_id": episode_id})
        env.reset(seed=1, options={"task": FAMILIES[0], "episode_id": "ok-1"})
    with TestClient(create_app(ServerConfig(db=sqlite_url))) as c:
        r = c.post("/reset", json={"task": FAMILIES[0], "episode_id": episode_id})
        assert r.status_code in (400, 422), r.text
    with EventStore.open(sqlite_url) as store:
        assert store.stream_ids(store.last_position()) == ["ok-1"]


def test_fresh_episode_ids_are_uuid7_and_grow_with_time(sqlite_url):
    """Episode ids named by the environment sort by when they were made (the store's stream index
    is then written at its right edge) and are valid UUIDv7s any client can name, in process
    and over HTTP."""
    import time
    import uuid

    from fastapi.testclient import TestClient

    from api.app import create_app
    from api.config import ServerConfig
    from companyos.runtime import episode_id_problem, new_episode_id

    made = []
    with CompanyEnv(sqlite_url) as env:
        for seed in range(3):
            env.reset(seed=seed, options={"task": FAMILIES[0]})
            made.append(env.runtime.episode_id)
            time.sleep(0.002)  # ids order by the millisecond; within one they are random
    with TestClient(create_app(ServerConfig(db=sqlite_url))) as c:
        r = c.post("/reset", json={"task": FAMILIES[0]})
        assert r.status_code == 200, r.text
        made.append(r.json()["metadata"]["episode_id"])
    assert made == sorted(made) and len(set(made)) == len(made)
    for episode_id in [*made, new_episode_id()]:
        parsed = uuid.UUID(episode_id)
        assert (parsed.hex, parsed.version, parsed.variant) == (episode_id, 7, uuid.RFC_4122)
        assert episode_id_problem(episode_id) is None
    assert abs(int(made[-1][:12], 16) - time.time_ns() // 1_000_000) < 60_000  # Unix ms


@pytest.mark.parametrize("task", FAMILIES)
def test_an_episode_continued_from_the_log_shows_what_the_live_one_would(sqlite_url, task):
    """Any process continues an episode from the log (a restart, a cache eviction, another
    worker): its observations must be the live ones, key order included, or an agent that reads
    them in order acts otherwise and the episode is not the one an uninterrupted run logs."""
    seed = 782
    with CompanyEnv(sqlite_url, agent="random") as live, CompanyEnv(sqlite_url, agent="random") as hop:
        options = {"task": task, "chaos": "high"}
        obs_live, _ = live.reset(seed=seed, options=options)
        obs_hop, _ = hop.reset(seed=seed, options=options)
        agent = make_agent("random", seed)
        agent.reset(obs_live)
        done = False
        while not done:
            action = agent.act(obs_live)
            obs_live, _, terminated, truncated, _ = live.step(action)
            hop.runtime = EpisodeRuntime.load(hop.store, hop.runtime.episode_id)  # from the log
            obs_hop, *_ = hop.step(action)
            assert json.dumps(obs_hop) == json.dumps(obs_live)  # same keys in the same order
            done = terminated or truncated
        assert live.runtime.digest == hop.runtime.digest


def test_a_bulk_run_on_a_full_disk_says_the_disk_is_full(tmp_path):
    """Held back, the episode the disk refused was tried again on close and its UnloggedEpisode
    replaced the cause, which the CLI then showed as a traceback."""
    import sqlite3

    from companyos.batch import RunPlan, run_range

    url = f"sqlite:///{tmp_path / 'full.db'}"
    with EventStore.open(url) as store:
        store._backend._write_connection().execute("PRAGMA max_page_count = 60")
        with pytest.raises(sqlite3.OperationalError, match="database or disk is full"):
            run_range(RunPlan(url, "random", "all", "medium", 500, 0, "episode"), 0, 500, store=store)


def test_an_ended_episode_held_by_a_commit_group_is_logged_when_the_group_commits(tmp_path):
    """`companyos run` writes ended episodes 16 to a transaction: until the group commits, an
    episode is not in the log; then it is, exactly as an episode written alone."""
    from companyos.runtime import CommitGroup

    url = f"sqlite:///{tmp_path / 'grouped.db'}"
    with EventStore.open(url) as store:
        group = CommitGroup(store, size=2)
        with CompanyEnv(store, durability="episode", commit_group=group) as env, \
                CompanyEnv(store, durability="episode") as alone:
            held, digests = [], []
            for seed in (5, 6):
                play(env, "expert", seed, FAMILIES[seed % len(FAMILIES)])
                held.append(env.runtime.episode_id)
                assert store.stream_version(held[-1]) is None
                assert group.full == (seed == 6)
                play(alone, "expert", seed, FAMILIES[seed % len(FAMILIES)])
                digests.append(alone.runtime.digest)
            assert (env.runtime.stored_version, env.runtime.digest) == (None, "")
            written = group.commit()
            assert not group.full and group.commit() == []
            assert (env.runtime.stored_version, env.runtime.digest) == written[-1][1]
        assert [episode_id for episode_id, _ in written] == held
        assert [head.digest for _, head in written] == digests
        for episode_id, head in written:
            assert (store.stream_version(episode_id), store.stream_digest(episode_id)) == head


def test_closing_the_environment_writes_what_its_commit_group_still_holds(tmp_path):
    """Closing without the group's commit() dropped every ended episode it held, without a word."""
    from companyos.runtime import CommitGroup

    url = f"sqlite:///{tmp_path / 'closed.db'}"
    with EventStore.open(url) as store:
        group = CommitGroup(store, size=16)
        with CompanyEnv(store, durability="episode", commit_group=group) as env:
            held = []
            for seed in (1, 2, 3):
                play(env, "expert", seed, FAMILIES[seed % len(FAMILIES)])
                held.append(env.runtime.episode_id)
            assert store.count_events(0) == 0
        assert all(store.stream_version(episode_id) is not None for episode_id in held)
        assert group.commit() == []


def test_a_commit_group_writes_whole_episodes_to_its_own_store(tmp_path):
    from companyos.runtime import CommitGroup

    url = f"sqlite:///{tmp_path / 'g.db'}"
    with EventStore.open(url) as store, EventStore.open(url) as other:
        with pytest.raises(ValueError, match="durability='episode'"):
            CompanyEnv(store, durability="step", commit_group=CommitGroup(store, 4))
        with pytest.raises(ValueError, match="its own store"):
            CompanyEnv(other, durability="episode", commit_group=CommitGroup(store, 4))
        with pytest.raises(ValueError, match="at least one"):
            CommitGroup(store, 0)


def test_a_run_reports_only_episodes_the_log_holds_when_a_group_fails(tmp_path, monkeypatch):
    """A group the store refuses is lost whole, and none of its episodes is reported: the run's
    results are always exactly the ended episodes in the log."""
    import sqlite3

    from companyos import batch
    from companyos.batch import RunPlan, run_range

    url = f"sqlite:///{tmp_path / 'run.db'}"
    monkeypatch.setattr(batch, "GROUP_COMMIT", 4)
    create_streams = EventStore.create_streams
    calls = []

    def fail_the_third(self, streams):
        calls.append(len(streams))
        if len(calls) == 3:
            raise sqlite3.OperationalError("disk I/O error")
        return create_streams(self, streams)

    monkeypatch.setattr(EventStore, "create_streams", fail_the_third)
    results: list = []
    with EventStore.open(url) as store:
        with pytest.raises(sqlite3.OperationalError, match="disk I/O error"):
            run_range(RunPlan(url, "expert", "all", "medium", 20, 0, "episode"), 0, 20,
                      store=store, into=results)
        logged = {r.stream_id for r in store.read_all()}
        assert calls[:3] == [4, 4, 4]
        assert [r.seed for r in results] == list(range(8))
        assert logged == {r.episode_id for r in results}
        for r in results:
            assert store.stream_digest(r.episode_id) == r.digest


def test_a_grouped_run_logs_what_a_run_step_by_step_logs_on_each_backend(empty_store_url):
    """Group commit changes when episodes are written, never what: 40 episodes (groups of 16,
    16 and 8) have the digests of the same seeds written step by step, on SQLite and PostgreSQL."""
    from companyos.batch import RunPlan, run_range

    def ran(durability: str) -> list:
        plan = RunPlan(empty_store_url, "random", "all", "high", 40, 7, durability)
        with EventStore.open(empty_store_url) as store:
            results = run_range(plan, 0, 40, store=store)
            for r in results:
                assert store.stream_digest(r.episode_id) == r.digest
        return results

    grouped, stepwise = ran("episode"), ran("step")
    assert [r.seed for r in grouped] == list(range(7, 47))
    assert [(r.seed, r.outcome, r.steps, r.digest) for r in grouped] == [
        (r.seed, r.outcome, r.steps, r.digest) for r in stepwise]


@pytest.mark.parametrize("quiet", [True, False])
def test_library_log_records_stay_off_a_commands_stderr(quiet):
    """SQLAlchemy's pool logs a traceback for each connection it cannot reset after PostgreSQL
    went away; those 40 lines came before the command's one `error:` line."""
    script = textwrap.dedent(f"""
        import logging
        from companyos import cli
        if {quiet}:
            cli.quiet_library_logs()
        try:
            raise OSError("the connection is lost")
        except OSError:
            logging.getLogger("sqlalchemy.pool.impl.QueuePool").error(
                "Exception during reset or similar", exc_info=True)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert (out.stderr == "") is quiet, out.stderr  # the control run shows what is kept off


@pytest.mark.parametrize("durability", ["step", "episode"])
def test_an_environment_closed_with_its_own_store_refuses_further_use(sqlite_url, durability):
    """It reconnected quietly, re-opening a writer connection and a lock file nothing closed; with
    durability "episode" its steps went on being taken, held in memory and never logged."""
    from eventstore import StoreClosed

    env = CompanyEnv(sqlite_url, durability=durability)
    env.reset(seed=1, options={"task": FAMILIES[0]})
    first = env.state["episode_id"]
    env.step({"app": "ticketdesk", "method": "list_tickets", "params": {}})
    env.close()
    with pytest.raises(StoreClosed):
        env.step({"app": "ticketdesk", "method": "list_tickets", "params": {}})
    assert env.state["step_count"] == 1  # the refused step was not taken
    env.close()  # twice is fine: nothing was held back since
    with pytest.raises(StoreClosed):
        env.reset(seed=2)
    with EventStore.open(sqlite_url) as store:  # the file itself is fine: the step is logged
        assert [r.type for r in store.read_stream(first)].count("ActionTaken") == 1
