"""RemoteCompanyEnv against a real `companyos serve` app (Uvicorn on a loopback port, started the
way tests/test_api_live.py starts it): code written for CompanyEnv must run unchanged over the
WebSocket and over HTTP, with equal observations, rewards, flags, infos and logged streams."""

from __future__ import annotations

import socket

import numpy as np
import orjson
import pytest

import domain
from companyos.agents import make_agent
from companyos.client import (
    RemoteCompanyEnv,
    RemoteConnectionError,
    RemoteEnvError,
    RemoteEpisodeFinished,
    RemoteRequestError,
    RemoteServerError,
)
from companyos.env import CompanyEnv
from eventstore import EventStore
from tests import tamper
from tests.conftest import live_server

TRANSPORTS = ["ws", "http"]
LIST_TICKETS = {"app": "ticketdesk", "method": "list_tickets", "params": {}}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """One server for the module on a tmp SQLite store; yields (base URL, store URL)."""
    db = f"sqlite:///{tmp_path_factory.mktemp('client') / 'store.db'}"
    with live_server(db) as base:
        yield base, db


@pytest.fixture
def local(server):
    """CompanyEnv on the server's own store, so both faces log into one place."""
    with CompanyEnv(server[1], agent="expert") as env:
        yield env


def without_id(info: dict) -> dict:
    return {k: v for k, v in info.items() if k != "episode_id"}


def play_agent(local: CompanyEnv, remote: RemoteCompanyEnv, agent: str, seed: int,
               options: dict) -> list[tuple]:
    """Both envs played by their own copy of one agent, compared step by step."""
    obs_l, info_l = local.reset(seed=seed, options=options)
    obs_r, info_r = remote.reset(seed=seed, options=options)
    assert obs_r == obs_l and without_id(info_r) == without_id(info_l)
    assert info_r["episode_id"] == remote.episode_id != info_l["episode_id"]
    agent_l, agent_r = make_agent(agent, seed), make_agent(agent, seed)
    agent_l.reset(obs_l)
    agent_r.reset(obs_r)
    steps = []
    while True:
        result_l = local.step(agent_l.act(obs_l))
        result_r = remote.step(agent_r.act(obs_r))
        assert result_r[:4] == result_l[:4], f"step {len(steps) + 1}"
        assert without_id(result_r[4]) == without_id(result_l[4])
        assert type(result_r[1]) is float and type(result_r[2]) is bool and type(result_r[3]) is bool
        assert result_r[0]["text"] == result_l[0]["text"]  # the LLM's view, rendered locally
        assert result_r[4]["episode_id"] == remote.episode_id
        obs_l, obs_r = result_l[0], result_r[0]
        steps.append(result_l)
        if result_l[2] or result_l[3]:
            return steps


def assert_same_episode(local: CompanyEnv, remote: RemoteCompanyEnv) -> None:
    """Equal state (but the id), equal rendering, and equal logged streams."""
    state_l, state_r = local.state, remote.state
    assert state_r["episode_id"] == remote.episode_id
    assert {k: v for k, v in state_r.items() if k != "episode_id"} == \
        {k: v for k, v in state_l.items() if k != "episode_id"}
    assert remote.render() == local.render()
    digest = local.store.stream_digest(state_l["episode_id"])
    assert digest is not None and local.store.stream_digest(remote.episode_id) == digest


@pytest.mark.parametrize("task", list(domain.TASK_FAMILIES))
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_expert_episode_is_the_same_episode_remotely(server, local, transport, task):
    with RemoteCompanyEnv(server[0], transport=transport, agent="expert") as remote:
        steps = play_agent(local, remote, "expert", 11, {"task": task, "chaos": "high"})
        assert_same_episode(local, remote)
    assert steps[-1][2] is True and steps[-1][4]["outcome"] == "success"


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_another_client_attaches_to_an_episode_and_finishes_it_as_one_client_would(server, local, transport):
    """`close()` said an episode "can be resumed", yet no client could: CompanyEnv refused its id,
    and RemoteCompanyEnv had no way in (over WebSocket the session key was private)."""
    expert = make_agent("expert", 5)
    options = {"task": "expense_report", "chaos": "low"}
    obs, _ = local.reset(seed=5, options=options)  # the same episode in one go, for its digest
    expert.reset(obs)
    done = False
    while not done:
        obs, _, terminated, truncated, _ = local.step(expert.act(obs))
        done = terminated or truncated
    whole = local.store.stream_digest(local.state["episode_id"])
    expert = make_agent("expert", 5)
    with RemoteCompanyEnv(server[0], transport=transport) as first:
        obs, _ = first.reset(seed=5, options=options)
        expert.reset(obs)
        obs = first.step(expert.act(obs))[0]
        episode_id, token = first.episode_id, first.episode_token
    with RemoteCompanyEnv(server[0], transport=transport) as second:
        for wrong in ("not-the-token", "x", "a.b"):  # a short or dotted one was read as part of
            with pytest.raises(RemoteRequestError) as refused:  # the id over WebSocket: 404
                second.attach(episode_id, wrong)
            assert (refused.value.status, refused.value.code) == (403, "wrong_token")
            assert second.episode_id is None and f"{episode_id}.{wrong}" not in refused.value.detail
        assert second.attach(episode_id, token)["step_count"] == 1
        done = False
        while not done:
            obs, _, terminated, truncated, _ = second.step(expert.act(obs))
            done = terminated or truncated
        assert second.state["outcome"] == "success"
    assert local.store.stream_digest(episode_id) == whole  # one episode, as if one client played it
    with CompanyEnv(server[1]) as third:  # in process too, from the log
        assert third.resume(episode_id)["done"] is True
        with pytest.raises(domain.EpisodeFinished):
            third.step(LIST_TICKETS)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_rejections_and_truncation_are_the_same_remotely(server, local, transport):
    """A random agent on a short budget: rejected actions, penalties and a truncated end."""
    with RemoteCompanyEnv(server[0], transport=transport, agent="expert") as remote:
        steps = play_agent(local, remote, "random", 5,
                           {"task": "license_renewal", "chaos": 0.7, "max_steps": 8,
                            "reward_profile": "default"})
        assert_same_episode(local, remote)
    assert any(info["rejected"] for *_, info in steps)
    assert steps[-1][3] is True and steps[-1][2] is False and steps[-1][4]["outcome"] == "truncated"


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_actions_that_are_no_json_log_what_company_env_logs(server, local, transport):
    """Tuples, NaN, non-str keys, strings: sent as the JSON the domain would have logged."""
    actions = [("ticketdesk", "list_tickets"), "list the tickets please", {1: 2},
               {"app": "ticketdesk", "method": "get_ticket", "params": {"ticket_id": float("nan")}},
               {"app": "ticketdesk", "method": "search_tickets", "params": {"query": "é\ud800 ✓"}},
               LIST_TICKETS]
    with RemoteCompanyEnv(server[0], transport=transport, agent="expert") as remote:
        local.reset(seed=3, options={"task": "bug_escalation", "max_steps": len(actions)})
        remote.reset(seed=3, options={"task": "bug_escalation", "max_steps": len(actions)})
        for action in actions:
            result_l, result_r = local.step(action), remote.step(action)
            assert result_r[:4] == result_l[:4]
            assert without_id(result_r[4]) == without_id(result_l[4])
        assert result_l[3] is True
        assert_same_episode(local, remote)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_numpy_values_travel_as_their_numbers(server, local, transport):
    """Gymnasium code draws seeds (and may hold chaos levels) as NumPy scalars."""
    with RemoteCompanyEnv(server[0], transport=transport, agent="expert") as remote:
        obs_r, _ = remote.reset(seed=np.int64(21), options={"task": "expense_report",
                                                             "chaos": np.float64(0.5)})
        obs_l, _ = local.reset(seed=21, options={"task": "expense_report", "chaos": 0.5})
        assert obs_r == obs_l
        assert (remote.state["seed"], remote.state["chaos"]) == (21, 0.5)
        with pytest.raises(ValueError, match="not JSON"):
            remote.reset(seed=1, options={"task": object()})


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_float32_chaos_level_is_the_one_company_env_plays(server, local, transport):
    """CompanyEnv reads np.float32(0.3) as 0.30000001192092896, orjson wrote it as 0.3: the same
    seed and actions gave another episode, another digest, over the network."""
    options = {"task": "license_renewal", "chaos": np.float32(0.3), "max_steps": np.int32(12)}
    with RemoteCompanyEnv(server[0], transport=transport, agent="expert") as remote:
        play_agent(local, remote, "random", 3, options)
        assert remote.state["chaos"] == local.state["chaos"] == float(np.float32(0.3)) != 0.3


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_before_reset_it_behaves_as_company_env(server, local, transport):
    with RemoteCompanyEnv(server[0], transport=transport) as remote:
        assert remote.state == local.state == {"episode_id": None, "step_count": 0}
        assert remote.render() == local.render() == ""
        with pytest.raises(RuntimeError) as in_process:
            local.step(LIST_TICKETS)
        with pytest.raises(RuntimeError) as over_network:
            remote.step(LIST_TICKETS)
        assert str(over_network.value) == str(in_process.value) == "call reset() before step()"


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_step_after_the_end_raises_episode_finished(server, local, transport):
    with RemoteCompanyEnv(server[0], transport=transport) as remote:
        for env in (local, remote):
            env.reset(seed=1, options={"max_steps": 1})
            assert env.step(LIST_TICKETS)[3] is True
        with pytest.raises(domain.EpisodeFinished):
            local.step(LIST_TICKETS)
        with pytest.raises(domain.EpisodeFinished) as caught:
            remote.step(LIST_TICKETS)
    error = caught.value
    assert isinstance(error, RemoteEpisodeFinished) and isinstance(error, ValueError)
    assert (error.status, error.code) == (409, "episode_finished")
    assert "has finished" in error.detail and error.detail in str(error)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_an_unknown_task_is_a_value_error_in_the_servers_words(server, transport):
    with RemoteCompanyEnv(server[0], transport=transport) as remote, \
            pytest.raises(ValueError) as caught:
        remote.reset(seed=1, options={"task": "no_such_task"})
    error = caught.value
    assert isinstance(error, RemoteRequestError)
    assert (error.status, error.code) == (400, "invalid_reset")
    assert "unknown task 'no_such_task'" in error.detail and "invalid_reset" in str(error)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_bad_seed_is_a_value_error_from_the_server(server, transport):
    with RemoteCompanyEnv(server[0], transport=transport) as remote, \
            pytest.raises(RemoteRequestError) as caught:
        remote.reset(seed=-1)
    # the WebSocket hands reset data to the runtime's check (400); HTTP validates the body (422)
    assert caught.value.status == {"ws": 400, "http": 422}[transport]
    assert "seed" in caught.value.detail and isinstance(caught.value, ValueError)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_an_unknown_option_is_refused_as_company_env_refuses_it(server, local, transport):
    """`agent` is a reset field of the server but no option of CompanyEnv: refused, not obeyed."""
    with RemoteCompanyEnv(server[0], transport=transport) as remote:
        with pytest.raises(ValueError) as in_process:
            local.reset(seed=1, options={"agent": "someone"})
        with pytest.raises(ValueError) as over_network:
            remote.reset(seed=1, options={"agent": "someone"})
        assert str(over_network.value) == str(in_process.value)
        # a list of pairs: CompanyEnv refused it, the client sent it as a dict
        with pytest.raises(TypeError) as in_process:
            local.reset(seed=1, options=[("task", "expense_report")])
        with pytest.raises(TypeError) as over_network:
            remote.reset(seed=1, options=[("task", "expense_report")])
        assert str(over_network.value) == str(in_process.value)


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("seed, options", [(5, {"chaos": float("nan")}), (5, {"chaos": np.float64("inf")}),
                                           (5, {"max_steps": float("nan")}), (5, {"task": float("-inf")}),
                                           (2**70, {}), (5, {"max_steps": -2**70})])
def test_values_json_cannot_carry_are_refused_in_company_envs_words(server, local, transport, seed,
                                                                    options):
    """JSON has no NaN: sent as null, the server took it for "the default" and logged another
    episode (chaos 0.5, 32 steps) where CompanyEnv refuses the value. An integer beyond 64 bits
    was refused as "Integer exceeds 64-bit range" where CompanyEnv names the seed's range."""
    logged_before = local.store.last_position()
    with RemoteCompanyEnv(server[0], transport=transport) as remote:
        with pytest.raises(ValueError) as in_process:
            local.reset(seed=seed, options={"task": "expense_report", **options})
        with pytest.raises(ValueError) as over_network:
            remote.reset(seed=seed, options={"task": "expense_report", **options})
        assert str(over_network.value) == str(in_process.value)
        assert remote.episode_id is None
    assert local.store.last_position() == logged_before


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_an_episode_id_already_taken_is_a_409(server, transport):
    with RemoteCompanyEnv(server[0], transport=transport) as remote:
        episode_id = f"taken-{transport}"
        remote.reset(seed=1, options={"episode_id": episode_id})
        with pytest.raises(RemoteRequestError) as caught:
            remote.reset(seed=1, options={"episode_id": episode_id})
    assert (caught.value.status, caught.value.code) == (409, "episode_exists")


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_the_mcp_envelope_cannot_be_sent_as_an_action(server, transport):
    """The server would list tools instead of stepping: refused before it is sent."""
    with RemoteCompanyEnv(server[0], transport=transport) as remote:
        remote.reset(seed=1)
        with pytest.raises(ValueError, match="MCP envelope"):
            remote.step({"type": "list_tools"})
        assert remote.state["step_count"] == 0
        # with an "app" it is an action again: rejected as in process
        assert remote.step({"type": "list_tools", "app": "x"})[4]["rejected"] == "malformed_action"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize("base_url, message", [
    ("ws://127.0.0.1:8000", "http:// or https://"),
    ("127.0.0.1:8000", "http:// or https://"),
    ("http://", "http:// or https://"),
    # the HTTP transport appended its paths to the query ("?x=1/reset") and got the UI's HTML back
    ("http://127.0.0.1:8000?x=1", "without a query or fragment"),
    ("http://127.0.0.1:8000/#top", "without a query or fragment"),
    ("http://127.0.0.1:8000?", "without a query or fragment"),
])
def test_a_base_url_the_client_cannot_extend_is_refused_before_any_request(base_url, message):
    for transport in TRANSPORTS:
        with pytest.raises(ValueError, match=message):
            RemoteCompanyEnv(base_url, transport=transport)


@pytest.mark.parametrize("timeout", [0, -1, float("nan"), "5", True, None, float("inf"), 1e30])
def test_a_timeout_that_is_no_positive_number_is_refused_in_words(timeout):
    """"5" was compared with 0: a TypeError of the operator, not of the call; infinity was taken,
    then the first reset failed with the socket's OverflowError about time_t."""
    with pytest.raises(ValueError, match="timeout must be a positive number of seconds"):
        RemoteCompanyEnv("http://127.0.0.1:8000", timeout=timeout)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_no_server_is_a_clear_error_naming_the_url(transport):
    base = f"http://127.0.0.1:{free_port()}"
    with RemoteCompanyEnv(base, transport=transport, timeout=5) as remote, \
            pytest.raises(RuntimeError) as caught:
        remote.reset(seed=1)
    error = caught.value
    assert isinstance(error, RemoteConnectionError) and not isinstance(error, ValueError)
    assert error.status is None and error.code == "unreachable"
    assert base.split("//")[1] in str(error) and "companyos serve" in str(error)
    assert error.__cause__ is None and error.__suppress_context__  # no traceback from the library


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_api_key(tmp_path, transport):
    with live_server(f"sqlite:///{tmp_path / 'keyed.db'}", api_key="k3y") as base:
        with RemoteCompanyEnv(base, transport=transport) as remote, \
                pytest.raises(RemoteRequestError) as missing:
            remote.reset(seed=1)
        with RemoteCompanyEnv(base, transport=transport, api_key="wrong") as remote, \
                pytest.raises(RemoteRequestError) as wrong:
            remote.reset(seed=1)
        with RemoteCompanyEnv(base, transport=transport, api_key="k3y") as remote:
            remote.reset(seed=1)
            assert remote.step(LIST_TICKETS)[4]["step"] == 1
            assert remote.render().startswith("TicketDesk board")
            assert (remote._http_wire is None) == (transport == "ws")  # ws renders on its socket
    assert missing.value.status == 401 and wrong.value.status == 403
    assert missing.value.code and missing.value.detail


@pytest.mark.parametrize("key", ["s3cret\n", "s3cret ", "sécret", " "])
def test_a_key_no_header_can_carry_is_refused_in_words_at_construction(key):
    """Sent, a key ending in a newline failed inside httpx as a "lost connection" (or, over
    WebSocket, as an unreachable server), and a non-ASCII one as a bare UnicodeEncodeError."""
    for transport in TRANSPORTS:
        with pytest.raises(ValueError, match="API key"):
            RemoteCompanyEnv("http://127.0.0.1:1", transport=transport, api_key=key)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_failed_reset_leaves_no_episode_to_step(server, local, transport):
    """In process a refused reset leaves nothing to step; remotely the next step went on with the
    episode before it, so a trainer that caught the error logged actions into the wrong episode."""
    with RemoteCompanyEnv(server[0], transport=transport) as remote:
        remote.reset(seed=3)
        remote.step(LIST_TICKETS)
        for env in (local, remote):
            with pytest.raises(ValueError, match="unknown task"):
                env.reset(seed=4, options={"task": "nope"})
            with pytest.raises(RuntimeError, match="reset"):
                env.step(LIST_TICKETS)
        assert remote.state == {"episode_id": None, "step_count": 0}
        remote.reset(seed=4)  # and a good reset goes on as usual
        assert remote.step(LIST_TICKETS)[4]["step"] == 1


def test_a_reset_on_a_new_socket_does_not_resume_an_episode_the_server_lost(server):
    """The WebSocket reopened with the last episode's session id even to reset: against a server
    that no longer held that episode (restarted on another store) every reset failed for good."""
    with RemoteCompanyEnv(server[0], transport="ws") as remote:
        remote.reset(seed=5)
        remote._ws.resume_as = ("01a2000000000000000000000000dead", "not-a-token")  # a server without it
        remote._ws.drop()
        remote.reset(seed=6)
        assert remote.state["seed"] == 6 and remote.step(LIST_TICKETS)[4]["step"] == 1


def test_a_full_server_says_so_over_the_websocket(tmp_path):
    """The server sends CAPACITY_REACHED and closes: the client dropped the frame with the socket
    and reported a lost connection whose action "may or may not have been applied"."""
    with live_server(f"sqlite:///{tmp_path / 'full.db'}", max_sessions=1) as base, \
            RemoteCompanyEnv(base) as first, RemoteCompanyEnv(base) as second:
        first.reset(seed=1)
        for _ in range(5):  # at once, again: a call sent on the socket before its close arrived
            with pytest.raises(RemoteServerError) as full:  # read the close as a step lost
                second.reset(seed=2)
            assert (full.value.status, full.value.code) == (503, "CAPACITY_REACHED")
            assert "capacity" in full.value.detail
            assert second._ws._conn is None  # the socket the server closes is not sent on again
        first.close()
        second.reset(seed=2)
        assert second.state["seed"] == 2


def test_an_error_frame_the_server_closes_after_drops_the_socket_before_the_close_arrives():
    """The race the live test above can only sometimes hit: the refusal read, the server's close
    not yet arrived. The next call went out on that socket and read its close (1013) as a step
    lost mid-way ("may or may not have been applied")."""
    from companyos.client import _WebSocketWire

    class Refusing:  # a socket whose server has sent its refusal and not yet its close
        close_timeout = 0

        def send(self, _text):
            pass

        def recv(self, timeout=None):
            return orjson.dumps({"type": "error", "data": {
                "code": "CAPACITY_REACHED", "message": "server at capacity: 1 of 1 sessions"}}).decode()

    wire = _WebSocketWire("http://127.0.0.1:9", 5.0, {})
    wire._conn = Refusing()
    with pytest.raises(RemoteServerError) as full:
        wire.call({"type": "reset", "data": {}})
    assert full.value.code == "CAPACITY_REACHED" and wire._conn is None


def test_a_server_failure_is_a_runtime_error(server):
    """A log damaged behind the store's back: the server answers 500, said in its words."""
    with RemoteCompanyEnv(server[0], transport="http") as remote:
        remote.reset(seed=2)
        remote.step(LIST_TICKETS)
        store = EventStore.open(server[1])
        try:
            position = tamper.stream_commits(store.engine, remote.episode_id)[-1][0]
            tamper.edit_payload(store.engine, position, lambda payload: payload.pop("type"))
        finally:
            store.close()
        with pytest.raises(RemoteServerError) as caught:
            remote.render()
    error = caught.value
    assert isinstance(error, RuntimeError) and not isinstance(error, ValueError)
    assert (error.status, error.code) == (500, "log_damaged")
    assert remote.episode_id in error.detail


def test_a_dropped_websocket_is_reopened_and_resumes_the_episode(server, local):
    with RemoteCompanyEnv(server[0], transport="ws", agent="expert") as remote:
        local.reset(seed=4, options={"task": "handbook_update"})
        remote.reset(seed=4, options={"task": "handbook_update"})
        for _ in range(2):
            assert remote.step(LIST_TICKETS)[:4] == local.step(LIST_TICKETS)[:4]
        remote._ws._conn.close()  # the connection drops between two steps
        assert remote.step(LIST_TICKETS)[:4] == local.step(LIST_TICKETS)[:4]
        assert remote.state["step_count"] == 3
        assert_same_episode(local, remote)


def test_a_closed_env_says_so(server):
    remote = RemoteCompanyEnv(server[0])
    remote.reset(seed=1)
    remote.close()
    remote.close()  # twice is fine
    with pytest.raises(RuntimeError, match="closed"):
        remote.step(LIST_TICKETS)
    with pytest.raises(RuntimeError, match="closed"):
        remote.reset(seed=2)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_the_outcome_can_be_read_after_the_with_block_as_in_process(server, local, transport):
    """CompanyEnv's `state` and `render` answer after `close()`; RemoteCompanyEnv's raised "closed",
    so code reading the outcome after its `with` block ran in process only."""
    with RemoteCompanyEnv(server[0], transport=transport, agent="expert") as remote:
        play_agent(local, remote, "expert", 3, {"task": "expense_report"})
    assert remote.state["outcome"] == local.state["outcome"] == "success"
    assert_same_episode(local, remote)  # state and render, each over a connection of its own
    with pytest.raises(RuntimeError, match="closed"):
        remote.step(LIST_TICKETS)  # reads only: the env stays closed


def test_arguments_are_checked_at_construction():
    with pytest.raises(ValueError, match="transport"):
        RemoteCompanyEnv("http://127.0.0.1:1", transport="grpc")
    with pytest.raises(ValueError, match="http"):
        RemoteCompanyEnv("127.0.0.1:8000")
    with pytest.raises(ValueError):
        RemoteCompanyEnv("http://127.0.0.1:1", agent="")


def test_error_classes_sort_server_answers():
    from companyos.client import remote_error

    assert isinstance(remote_error(404, "episode_not_found", "x"), ValueError)
    assert isinstance(remote_error(503, "unavailable", "x"), RuntimeError)
    assert not isinstance(remote_error(503, "unavailable", "x"), ValueError)
    assert isinstance(remote_error(None, "timeout", "x"), RemoteConnectionError)
    assert all(isinstance(remote_error(s, "c", "d"), RemoteEnvError) for s in (400, 500, None))


def test_the_default_timeout_outlasts_the_servers_wait_for_a_locked_store():
    """At 30 s, a step waiting out another process's lock (60 s, then a 503: not applied) was
    reported "may have been applied" here, and then applied."""
    import inspect

    from eventstore.engine import PG_LOCK_TIMEOUT_MS, SQLITE_BUSY_TIMEOUT_MS

    default = inspect.signature(RemoteCompanyEnv).parameters["timeout"].default
    assert default > max(SQLITE_BUSY_TIMEOUT_MS, PG_LOCK_TIMEOUT_MS) / 1000 + 10
