"""The Gymnasium adapter: passes Gymnasium's own checker, plays the same episodes as CompanyEnv
(equal stream digests), follows Gymnasium's seeding convention, and is registered for make()."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings

import gymnasium
import numpy as np
import pytest
from gymnasium.utils import seeding
from gymnasium.utils.env_checker import check_env

import domain
from companyos.agents import make_agent
from companyos.client import RemoteCompanyEnv
from companyos.env import CompanyEnv
from companyos.gym import ENV_ID, CompanyOSGym
from tests.conftest import live_server

LIST_TICKETS = '{"app": "ticketdesk", "method": "list_tickets", "params": {}}'


@pytest.fixture
def strict_warnings():
    """Gymnasium's checker reports most problems as warnings: make each one a failure."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield


def test_check_env_passes_through_make(sqlite_url, strict_warnings):
    env = gymnasium.make(ENV_ID, db=sqlite_url, task="expense_report", chaos="high", render_mode="ansi")
    try:
        check_env(env.unwrapped)  # with a spec: also re-makes it for each render mode and close
    finally:
        env.close()


def test_check_env_passes_on_a_plain_instance(sqlite_url):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        env = CompanyOSGym(db=sqlite_url, durability="episode", chaos="medium")
        check_env(env)
        env.close()
    # without a spec Gymnasium can only say so; nothing else may be wrong
    assert [str(w.message) for w in caught if "spec" not in str(w.message)] == []


def play_company_env(db: str, seed: int, task: str) -> tuple[list, str]:
    """The expert's episode in process: (rewards, flags and texts per step, stream digest)."""
    with CompanyEnv(db) as env:
        obs, _ = env.reset(seed=seed, options={"task": task, "chaos": "high"})
        agent = make_agent("expert", seed)
        agent.reset(obs)
        steps = [obs["text"]]
        while True:
            obs, reward, terminated, truncated, _ = env.step(agent.act(obs))
            steps.append((obs["text"], reward, terminated, truncated))
            if terminated or truncated:
                return steps, env.store.stream_digest(env.state["episode_id"])


def play_adapter(env: gymnasium.Env, seed: int) -> list:
    """The expert's episode through the adapter: it reads info["observation"], sends JSON text."""
    text, info = env.reset(seed=seed)
    agent = make_agent("expert", seed)
    agent.reset(info["observation"])
    steps = [text]
    while True:
        action = json.dumps(agent.act(info["observation"]))
        text, reward, terminated, truncated, info = env.step(action)
        assert text in env.observation_space and action in env.action_space
        steps.append((text, reward, terminated, truncated))
        if terminated or truncated:
            return steps


@pytest.mark.parametrize("task", list(domain.TASK_FAMILIES))
def test_expert_episode_through_the_adapter_is_the_company_env_episode(sqlite_url, task):
    expected, digest = play_company_env(sqlite_url, 9, task)
    env = CompanyOSGym(db=sqlite_url, task=task, chaos="high")
    try:
        steps = play_adapter(env, 9)
        assert env.env.store.stream_digest(env.episode_id) == digest
    finally:
        env.close()
    assert steps == expected and steps[-1][2] is True


def test_a_remote_env_works_inside_the_adapter(sqlite_url):
    expected, digest = play_company_env(sqlite_url, 6, "vendor_onboarding")
    with live_server(sqlite_url) as base, RemoteCompanyEnv(base) as remote:
        env = gymnasium.make(ENV_ID, env=remote, task="vendor_onboarding", chaos="high",
                             render_mode="ansi")
        assert play_adapter(env, 6) == expected
        assert env.render().startswith("TicketDesk board")
        env.close()
        assert remote.state["step_count"] == len(expected) - 1  # the caller's env stays open
    with CompanyEnv(sqlite_url) as local:
        assert local.store.stream_digest(env.unwrapped.episode_id) == digest


def test_async_vector_envs_refuse_shared_memory_in_words_and_run_without_it(sqlite_url):
    """`make_vec(..., vectorization_mode="async")` died on "cannot fit 'int' into an index-sized
    integer": Gymnasium sized shared memory by the observation space's 2**62 characters."""
    kwargs = {"db": sqlite_url, "task": "expense_report", "chaos": "low"}
    with pytest.raises(TypeError, match=r"vector_kwargs=\{'shared_memory': False\}"):
        gymnasium.make_vec(ENV_ID, num_envs=2, vectorization_mode="async", **kwargs)
    envs = gymnasium.make_vec(ENV_ID, num_envs=2, vectorization_mode="async",
                              vector_kwargs={"shared_memory": False}, **kwargs)
    try:
        observations, infos = envs.reset(seed=[4, 5])
        assert list(infos["seed"]) == [4, 5]
        for text, seed in zip(observations, (4, 5), strict=True):  # the episodes of those seeds
            single = CompanyOSGym(**kwargs)
            assert text == single.reset(seed=seed)[0]
            single.close()
        _, rewards, _, _, _ = envs.step([LIST_TICKETS, LIST_TICKETS])
        assert len(rewards) == 2
    finally:
        envs.close()


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_vector_envs_step_rollouts_whose_results_differ_per_env(sqlite_url, mode):
    """One env's action rejected (no result) while another's got a tool's result crashed
    `make_vec` ("'numpy.ndarray' object has no attribute 'get'"): Gymnasium merged the structured
    observations key by key. Each env's observation now stays whole in the vector's infos."""
    extra = {"vector_kwargs": {"shared_memory": False}} if mode == "async" else {}
    envs = gymnasium.make_vec(ENV_ID, num_envs=3, vectorization_mode=mode, db=sqlite_url,
                              task="expense_report", **extra)
    try:
        envs.reset(seed=5)
        for actions in (["garbage", LIST_TICKETS, LIST_TICKETS], [LIST_TICKETS, "garbage", "{}"],
                        [LIST_TICKETS] * 3):
            texts, _, _, _, infos = envs.step(actions)
            for i, action in enumerate(actions):
                observation = infos["observation"][i]
                assert observation.text == texts[i]
                assert (observation["result"] is None) == (action != LIST_TICKETS), (i, action)
                assert json.loads(json.dumps(dict(observation)))["goal"] == observation["goal"]
    finally:
        envs.close()


def test_actions_in_a_numpy_array_are_read_as_the_json_they_hold(sqlite_url):
    """A vector env's actions as a NumPy array arrive as `np.str_`, which orjson refuses: every
    sub-env's valid action was penalised as malformed_action (-1.1), while the same actions as a
    list got the tool's answer."""
    envs = gymnasium.make_vec(ENV_ID, num_envs=2, vectorization_mode="sync", db=sqlite_url,
                              task="expense_report")
    try:
        envs.reset(seed=5)
        texts, rewards, _, _, infos = envs.step(np.array([LIST_TICKETS, LIST_TICKETS]))
        assert [infos["observation"][i]["error"] for i in range(2)] == [None, None]
        assert rewards.tolist() == [-0.1, -0.1] and all("tickets" in t for t in texts)
    finally:
        envs.close()


def test_one_env_cannot_back_two_adapters_and_a_servers_vector_env_gets_one_per_sub_env(sqlite_url):
    """`make_vec(env=remote)` handed every sub-env the same RemoteCompanyEnv: all of them stepped
    one episode while their infos named three seeds. That is refused; `url=` builds one each."""
    with live_server(sqlite_url) as base, RemoteCompanyEnv(base) as remote:
        with pytest.raises(ValueError, match="already backs another"):
            gymnasium.make_vec(ENV_ID, num_envs=2, env=remote, task="expense_report")
        envs = gymnasium.make_vec(ENV_ID, num_envs=3, url=base, task="expense_report")
        try:
            _, infos = envs.reset(seed=1)
            _, _, _, _, infos = envs.step([LIST_TICKETS] * 3)
            assert list(infos["seed"]) == [1, 2, 3] and list(infos["step"]) == [1, 1, 1]
            ids = [sub.unwrapped.episode_id for sub in envs.envs]
            assert len(set(ids)) == 3
        finally:
            envs.close()
        with CompanyEnv(sqlite_url) as local:  # three episodes, one step each, of those seeds
            for episode_id, seed in zip(ids, (1, 2, 3), strict=True):
                events = list(local.store.read_stream(episode_id))
                assert json.loads(events[0].data_json)["seed"] == seed
                assert sum(e.type == "ActionTaken" for e in events) == 1


def episodes(env: CompanyOSGym) -> list:
    """reset(seed=7), then reset() three times: each episode's seed and first observation."""
    runs = [env.reset(seed=7)]
    runs += [env.reset() for _ in range(3)]
    return [(info["seed"], text) for text, info in runs]


def test_unseeded_resets_draw_their_seeds_from_np_random(sqlite_url):
    first, second = CompanyOSGym(db=sqlite_url), CompanyOSGym(db=sqlite_url)
    other = CompanyOSGym(db=sqlite_url)
    try:
        runs = episodes(first)
        assert episodes(second) == runs
        rng, _ = seeding.np_random(7)  # Gymnasium's generator for seed 7, drawn as the adapter draws
        assert [seed for seed, _ in runs] == [7] + [int(rng.integers(0, 2**31)) for _ in range(3)]
        assert len({text for _, text in runs}) == 4  # four different episodes
        other.reset(seed=8)
        assert [other.reset()[1]["seed"] for _ in range(3)] != [seed for seed, _ in runs[1:]]
    finally:
        for env in (first, second, other):
            env.close()


@pytest.mark.parametrize("seed", [12, np.int64(12)], ids=["int", "numpy"])
def test_a_seeded_reset_plays_the_company_env_episode_of_that_seed(sqlite_url, seed):
    """A NumPy seed, which CompanyEnv takes, was refused by Gymnasium's seeding."""
    env = CompanyOSGym(db=sqlite_url, task="license_renewal", chaos="low", max_steps=30)
    with CompanyEnv(sqlite_url) as local:
        obs, info = local.reset(seed=12, options={"task": "license_renewal", "chaos": "low",
                                                  "max_steps": 30})
        text, gym_info = env.reset(seed=seed)
    env.close()
    assert text == obs["text"] and gym_info["observation"] == obs
    assert gym_info["seed"] == 12 and gym_info["step"] == info["step"] == 0
    assert "episode_id" not in gym_info and env.episode_id is not None


@pytest.mark.parametrize(("kwargs", "said"), [({"rules": 9}, "no rules version 9"),
                                              ({"task": "nap"}, "unknown task"),
                                              ({"chaos": "extreme"}, "chaos")])
def test_a_wrong_default_is_refused_when_the_adapter_is_made(tmp_path, kwargs, said):
    """It was refused only at the first reset, which left an env from gymnasium.make unusable."""
    with pytest.raises(ValueError, match=said):
        CompanyOSGym(db=f"sqlite:///{tmp_path / 's.db'}", **kwargs)
    with pytest.raises(ValueError, match=said):
        gymnasium.make(ENV_ID, db=f"sqlite:///{tmp_path / 's.db'}", **kwargs)
    assert not (tmp_path / "s.db").exists()  # nothing opened


def test_the_rules_version_is_a_default_of_every_reset_that_a_reset_may_override(sqlite_url):
    env = CompanyOSGym(db=sqlite_url, rules=1)
    env.reset(seed=3)
    assert env.env.state["rules"] == 1
    env.reset(seed=3, options={"rules": 2})
    assert env.env.state["rules"] == 2
    env.close()


def test_make_by_id_builds_the_env_and_renders_ansi(sqlite_url):
    env = gymnasium.make(ENV_ID, db=sqlite_url, task="bug_escalation", chaos="none", render_mode="ansi")
    try:
        text, info = env.reset(seed=3)
        assert env.unwrapped.env.state["task"] == "bug_escalation"
        assert env.unwrapped.env.state["chaos"] == 0.0
        with CompanyEnv(sqlite_url) as local:
            local.reset(seed=3, options={"task": "bug_escalation", "chaos": "none"})
            assert env.render() == local.render()
            assert "TicketDesk board" in env.render()
    finally:
        env.close()
    again = gymnasium.make("companyos.gym:CompanyOS-v0", db=sqlite_url)  # imports the module itself
    assert isinstance(again.unwrapped, CompanyOSGym)
    again.close()


@pytest.mark.parametrize(("action", "in_process"), [
    ("not json {", "not json {"), ("NaN", "NaN"), ("", ""),  # not JSON: the string itself
    # a number past a double's range: the server refuses the text as not JSON; the stdlib read
    # it as infinity, logged as null (an invalid_params step instead of a malformed action)
    (t := '{"app": "ticketdesk", "method": "search_tickets", "params": {"query": 1e400}}', t),
    ('"list_tickets"', "list_tickets"), ("[1, 2]", [1, 2]), ('{"app": "ticketdesk"}', {"app": "ticketdesk"}),
    ('{"app": "nowhere", "method": "x"}', {"app": "nowhere", "method": "x"})])
def test_a_bad_action_string_is_a_rejected_action(sqlite_url, action, in_process):
    """As CompanyEnv rejects it: the same reward, text and flags, and the same logged stream."""
    env = CompanyOSGym(db=sqlite_url, task="expense_report")
    with CompanyEnv(sqlite_url) as local:
        local.reset(seed=5, options={"task": "expense_report"})
        obs, reward, terminated, truncated, info = local.step(in_process)
        env.reset(seed=5)
        text, gym_reward, gym_terminated, gym_truncated, gym_info = env.step(action)
        assert local.store.stream_digest(env.episode_id) == local.store.stream_digest(info["episode_id"])
    env.close()
    assert info["rejected"] is not None and gym_info["rejected"] == info["rejected"]
    assert (text, gym_reward, gym_terminated, gym_truncated) == (obs["text"], reward, terminated, truncated)
    assert reward < 0


def test_a_text_that_is_not_json_is_logged_as_the_string_sent(sqlite_url):
    env = CompanyOSGym(db=sqlite_url)
    env.reset(seed=1)
    _, _, _, _, info = env.step("please list the tickets")
    events = list(env.env.store.read_stream(env.episode_id))
    env.close()
    assert info["rejected"] == "malformed_action"
    assert [e.data["action"] for e in events if e.type == "ActionTaken"] == ["please list the tickets"]


def test_the_longest_text_in_the_action_space_of_the_costliest_characters_is_logged(sqlite_url):
    """Every member of `action_space` is an action CompanyEnv takes: a text of control characters
    (6 bytes of JSON each) at the space's length was 2 bytes (its quotes) over the limit."""
    env = CompanyOSGym(db=sqlite_url)
    env.reset(seed=1)
    action = "\x01" * env.action_space.max_length
    assert env.action_space.contains(action)
    _, _, _, _, info = env.step(action)
    env.close()
    assert info["rejected"] == "malformed_action"


def test_dict_actions_and_unicode_observations(sqlite_url):
    env = CompanyOSGym(db=sqlite_url, task="bug_escalation", chaos="none")
    try:
        _, info = env.reset(seed=2)
        ticket = next(t["ticket_id"] for t in env.step(LIST_TICKETS)[4]["observation"]["result"]["tickets"])
        comment = "naïve — 日本語 ✓ 🚀"
        env.step({"app": "ticketdesk", "method": "add_comment",
                  "params": {"ticket_id": ticket, "text": comment}})
        text, *_ = env.step({"app": "ticketdesk", "method": "get_ticket", "params": {"ticket_id": ticket}})
    finally:
        env.close()
    assert comment in text and text in env.observation_space
    assert json.dumps({"text": comment}, ensure_ascii=False) in env.action_space
    assert "\ud800" not in env.observation_space  # not Unicode text: no UTF-8 log holds it


def test_step_before_reset_raises_as_company_env(sqlite_url):
    env = CompanyOSGym(db=sqlite_url)
    with pytest.raises(RuntimeError) as caught:
        env.step(LIST_TICKETS)
    env.close()
    env.close()  # twice is fine
    assert str(caught.value) == "call reset() before step()"


def test_an_option_given_as_none_keeps_the_adapters_default(sqlite_url):
    """`options={"task": None}` played the seed's own task, not the task the adapter was made with."""
    env = CompanyOSGym(db=sqlite_url, task="expense_report", chaos="none")
    try:
        env.reset(seed=3, options={"task": None, "chaos": None})
        assert env.env.state["task"] == "expense_report" and env.env.state["chaos"] == 0.0
        env.reset(seed=3, options={"task": "license_renewal"})  # and a value still overrides it
        assert env.env.state["task"] == "license_renewal"
        with pytest.raises(TypeError, match="options must be a dict"):
            env.reset(seed=3, options=[("task", "license_renewal")])
    finally:
        env.close()


def test_a_failed_reset_leaves_no_episode_id_or_seed(sqlite_url):
    """The adapter kept the last episode's id and seed while the wrapped env had no episode."""
    env = CompanyOSGym(db=sqlite_url)
    try:
        env.reset(seed=1)
        assert env.episode_id is not None and env.episode_seed == 1
        with pytest.raises(ValueError, match="unknown task"):
            env.reset(seed=2, options={"task": "nope"})
        assert (env.episode_id, env.episode_seed) == (None, None)
        assert env.env.state["episode_id"] is None
        with pytest.raises(RuntimeError, match="reset"):
            env.step(LIST_TICKETS)
    finally:
        env.close()


def test_constructor_arguments_are_checked(sqlite_url):
    with pytest.raises(ValueError, match="render_mode"):
        CompanyOSGym(db=sqlite_url, render_mode="human")
    with pytest.raises(ValueError, match="either env="):
        CompanyOSGym(db=sqlite_url, env=object())
    # accepted and ignored, they read as obeyed
    for wrong, words in (({"url": "http://127.0.0.1:9", "durability": "episode"}, "durability= is for"),
                         ({"env": object(), "durability": "step"}, "durability= is for"),
                         ({"env": object(), "api_key": "k"}, "api_key= is for"),
                         ({"db": sqlite_url, "api_key": "k"}, "api_key= is for")):
        with pytest.raises(ValueError, match=words):
            CompanyOSGym(**wrong)
    with pytest.raises(ValueError, match="unknown task"):  # CompanyEnv's refusal, when it is made
        CompanyOSGym(db=sqlite_url, task="no_such_task")


def test_importing_companyos_does_not_import_gymnasium():
    code = ("import sys, companyos, companyos.env, companyos.client, companyos.agents; "
            "assert 'gymnasium' not in sys.modules, 'gymnasium imported'")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_both_spaces_sample_members_seeded_and_bounded(sqlite_url):
    """`sample()` is what random baselines and wrappers call: it must return a member of the
    space, repeat under a seed, and honour a length that is asked for."""
    env = CompanyOSGym(db=sqlite_url)
    try:
        for space in (env.observation_space, env.action_space):
            space.seed(5)
            drawn = [space.sample() for _ in range(20)]
            assert all(text in space for text in drawn)
            assert len({len(text) for text in drawn}) > 1  # lengths are drawn, not fixed
            space.seed(5)
            assert [space.sample() for _ in range(20)] == drawn
            assert len(space.sample(mask=(7, None))) == 7
            only_a = np.array([c == "a" for c in space.character_list], dtype=np.int8)
            assert set(space.sample(mask=(None, only_a))) <= {"a"}
            with pytest.raises(ValueError, match="Only one of"):
                space.sample(mask=(3, None), probability=(3, None))
    finally:
        env.close()
