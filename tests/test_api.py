"""The agent server in-process (Starlette TestClient): OpenEnv HTTP and WebSocket, MCP, sessions
that live in the log (restart, any worker, 409), access rules, bad inputs, the episode log."""

from __future__ import annotations

import gzip
import json
import logging
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from starlette.testclient import WebSocketDenialResponse

from api.app import create_app
from api.config import ServerConfig
from companyos.env import CompanyEnv
from companyos.runtime import UnknownRules
from domain import CURRENT_RULES, RULES_VERSIONS
from eventstore import CorruptCommit, EventStore, NewEvent
from eventstore.backends import SqliteBackend
from tests import tamper

ACTIONS = [
    {"app": "ticketdesk", "method": "list_tickets", "params": {}},
    {"app": "datahub", "method": "list_metrics", "params": {}},
    {"app": "approvalflow", "method": "list_approval_types", "params": {}},
    {"app": "crm", "method": "lookup", "params": {}},  # unknown app: rejected, penalised
    {"app": "ticketdesk", "method": "get_ticket", "params": {"ticket_id": 7}},  # ill-typed
    {"app": "approvalflow", "method": "list_approvals", "params": {}},
    {"app": "ticketdesk", "method": "search_tickets", "params": {"query": "renew"}},
]
RESET = {"seed": 11, "task": "expense_report", "chaos": "high"}


def client(url: str, **config) -> TestClient:
    return TestClient(create_app(ServerConfig(db=url, **config)))


def reset(c: TestClient, **body) -> tuple[str, str, dict]:
    r = c.post("/reset", json=body or RESET)
    assert r.status_code == 200, r.text
    meta = r.json()["metadata"]
    return meta["episode_id"], meta["episode_token"], r.json()


def step(c: TestClient, episode_id: str, token: str | None, action: dict) -> object:
    headers = {"X-Episode-Token": token} if token else {}
    return c.post("/step", json={"episode_id": episode_id, "action": action}, headers=headers)


def digest_uninterrupted(tmp_path, actions: list[dict], options: dict = RESET) -> str:
    """The same episode run in-process by CompanyEnv, start to end."""
    opts = {k: v for k, v in options.items() if k != "seed"}
    with CompanyEnv(f"sqlite:///{tmp_path / 'reference.db'}") as env:
        env.reset(seed=options["seed"], options=opts)
        for action in actions:
            env.step(action)
        episode_id = env.state["episode_id"]
        return env.store.stream_digest(episode_id)


def stream_digest(url: str, episode_id: str) -> str:
    with EventStore.open(url) as store:
        return store.stream_digest(episode_id)


# -- OpenEnv HTTP -------------------------------------------------------------------------------


def test_info_endpoints(sqlite_url):
    with client(sqlite_url) as c:
        assert c.get("/health").json() == {"status": "healthy"}
        meta = c.get("/metadata").json()
        assert meta["name"] == "companyos" and meta["description"] and meta["version"]
        assert "expense_report" in meta["readme_content"]
        schema = c.get("/schema").json()
        assert {"action", "observation", "state"} <= set(schema)
        assert schema["action"]["properties"]["app"]["enum"]
        assert c.get("/openapi.json").json()["info"]["version"] == meta["version"]
        tasks = c.get("/tasks").json()
        assert {t["name"] for t in tasks["tasks"]} >= {"vendor_onboarding", "handbook_update"}
        assert "medium" in tasks["chaos_levels"] and "sparse" in tasks["reward_profiles"]
        tools = c.get("/tools").json()
        names = {t["function"]["name"] for t in tools}
        assert "ticketdesk_get_ticket" in names and all(t["type"] == "function" for t in tools)
        assert all("." not in n for n in names)  # valid OpenAI function names


def test_tasks_json_on_the_command_line_is_what_get_tasks_serves(sqlite_url):
    """`companyos tasks --json` printed a list of {task, description}, `GET /tasks` a document
    with `tasks` as {name, description} and the chaos levels beside: one shape now, either way."""
    from companyos.commands import run
    from tests.conftest import command_runner

    printed = command_runner(run.register)("tasks", "--json")
    assert printed.exit_code == 0, printed.output
    with client(sqlite_url) as c:
        served = c.get("/tasks").json()
    assert json.loads(printed.output) == served
    assert {t["name"] for t in served["tasks"]} == {
        "vendor_onboarding", "expense_report", "bug_escalation", "license_renewal", "handbook_update"}


def test_tasks_as_text_lists_the_whole_catalogue(sqlite_url):
    """`companyos tasks` printed only the task families: the chaos levels, reward profiles, rules
    versions (which one is current) and failure modes were in `--json` alone."""
    from companyos.catalogue import task_catalogue
    from companyos.commands import run
    from tests.conftest import command_runner

    printed = command_runner(run.register)("tasks")
    assert printed.exit_code == 0, printed.output
    cells = [cell.strip() for line in printed.stdout.splitlines() for cell in line.split("│")]
    catalogue = task_catalogue()
    assert {t["name"] for t in catalogue["tasks"]} <= set(cells)
    assert set(catalogue["chaos_levels"]) <= set(cells)
    assert {f"{p:g}" for p in catalogue["chaos_levels"].values()} <= set(cells)
    assert set(catalogue["reward_profiles"]) <= set(cells)
    assert set(catalogue["failure_modes"]) <= set(cells)
    current = catalogue["current_rules"]
    assert f"{current} (current)" in cells
    assert {str(r["version"]) for r in catalogue["rules_versions"] if r["version"] != current} <= set(cells)
    for title in ("task families", "chaos levels", "reward profiles", "rules versions", "failure modes"):
        assert title in [line.strip() for line in printed.stdout.splitlines()]


def test_reset_step_state(sqlite_url):
    with client(sqlite_url) as c:
        episode_id, token, first = reset(c)
        assert first["done"] is False and first["reward"] is None
        assert first["observation"]["goal"] and first["metadata"]["session_id"].startswith(episode_id)
        r = step(c, episode_id, token, ACTIONS[0])
        assert r.status_code == 200
        body = r.json()
        assert set(body) == {"observation", "reward", "done", "metadata"}
        assert body["metadata"]["step"] == 1 and body["metadata"]["rejected"] is None
        # the token may also travel in the body
        r = c.post("/step", json={"episode_id": episode_id, "episode_token": token,
                                  "action": ACTIONS[1]})
        assert r.status_code == 200
        state = c.get("/state", params={"episode_id": episode_id},
                      headers={"X-Episode-Token": token}).json()
        assert state["episode_id"] == episode_id and state["step_count"] == 2
        assert state["task"] == "expense_report" and state["seed"] == 11


def test_reset_takes_a_rules_version_and_tasks_lists_the_versions(sqlite_url):
    with client(sqlite_url) as c:
        tasks = c.get("/tasks").json()
        assert [v["version"] for v in tasks["rules_versions"]] == [1, 2, 3, 4] and tasks["current_rules"] == 4
        assert "Rules versions: 1, 2, 3, 4 (the latest, 4," in c.get("/metadata").json()["readme_content"]
        for body, rules in (({"seed": 3}, CURRENT_RULES), ({"seed": 3, "rules": 1}, 1)):
            episode_id, token, _ = reset(c, **body)
            state = c.get("/state", params={"episode_id": episode_id},
                          headers={"X-Episode-Token": token}).json()
            assert state["rules"] == rules == c.get(f"/episodes/{episode_id}").json()["rules"]
        for rules in (7, 0, -1):  # one refusal, naming the versions, for every version that is none
            r = c.post("/reset", json={"rules": rules})
            assert r.status_code == 400 and f"no rules version {rules}; the versions are 1, 2, 3, 4" in r.text
        assert c.post("/reset", json={"rules": "1"}).status_code == 422
        listed = c.get("/episodes", params={"rules": 1}).json()
        assert listed["total"] == 1 and [e["rules"] for e in listed["episodes"]] == [1]
        r = c.get("/episodes", params={"rules": 9})
        assert r.status_code == 400 and "no rules version 9" in r.json()["detail"]
        for written in ("2.0", "+2", "0_2"):  # as every other whole number in a query: digits only
            r = c.get("/episodes", params={"rules": written})
            assert r.status_code == 422 and "whole number written in digits" in r.text, written
        assert c.get("/episodes").json()["total"] == 2


def test_unknown_tool_is_a_rejection_not_an_http_error(sqlite_url):
    with client(sqlite_url) as c:
        episode_id, token, _ = reset(c)
        r = step(c, episode_id, token, {"app": "ticketdesk", "method": "delete_everything"})
        assert r.status_code == 200
        body = r.json()
        assert body["metadata"]["rejected"] == "unknown_tool"
        assert body["reward"] < 0
        assert "delete_everything" in body["observation"]["message"]


def test_text_that_is_not_unicode_is_logged_spelled_out_not_a_500(sqlite_url):
    """A JSON "\\ud800" (a lone surrogate) has no UTF-8 form: the action is taken with the
    escape spelled out, logged, and the episode goes on."""
    with client(sqlite_url) as c:
        episode_id, token, _ = reset(c)
        action = '{"app": "ticketdesk", "method": "search_tickets", "params": {"query": "renew \\ud800"}}'
        body = f'{{"episode_id": "{episode_id}", "action": {action}}}'
        r = c.post("/step", content=body.encode(), headers={
            "content-type": "application/json", "X-Episode-Token": token})
        assert r.status_code == 200, r.text
        assert step(c, episode_id, token, ACTIONS[0]).status_code == 200
        logged = c.get(f"/episodes/{episode_id}/events").json()
    actions = [e["data"]["action"] for e in logged["events"] if e["type"] == "ActionTaken"]
    assert actions[0]["params"]["query"] == "renew \\ud800" and len(actions) == 2


SURROGATE_ACTION = ('{"app": "ticketdesk", "method": "search_tickets", '
                    '"params": {"query": "renew \\ud800"}}')


def test_every_transport_takes_the_same_json_as_the_same_action(sqlite_url, tmp_path):
    """A lone-surrogate escape is valid JSON text: HTTP took it and WebSocket and MCP refused the
    frame, so the same actions logged different episodes. NaN is not JSON: HTTP took it (and
    logged null) while WebSocket refused it; now every transport refuses it in words."""
    sent = [ACTIONS[0], SURROGATE_ACTION, ACTIONS[1]]

    def raw(action) -> str:
        return action if isinstance(action, str) else json.dumps(action)

    digests = {}
    with client(sqlite_url) as c:
        episode_id, token, _ = reset(c)
        for action in sent:
            r = c.post("/step", content=f'{{"episode_id": "{episode_id}", "action": {raw(action)}}}',
                       headers={"content-type": "application/json", "X-Episode-Token": token})
            assert r.status_code == 200, r.text
        digests["http"] = stream_digest(sqlite_url, episode_id)
        nan = c.post("/step", content=f'{{"episode_id": "{episode_id}", "action": {{"x": NaN}}}}',
                     headers={"content-type": "application/json", "X-Episode-Token": token})
        assert nan.status_code == 422 and "not valid JSON" in nan.json()["detail"][0]["msg"]

        with c.websocket_connect("/ws") as ws:
            ws.send_json({"type": "reset", "data": RESET})
            episode_id = ws.receive_json()["data"]["metadata"]["episode_id"]
            for action in sent:
                ws.send_text(f'{{"type": "step", "data": {raw(action)}}}')
                assert ws.receive_json()["type"] == "observation"
            ws.send_text('{"type": "step", "data": {"x": NaN}}')
            assert ws.receive_json()["data"]["code"] == "INVALID_JSON"
        digests["ws"] = stream_digest(sqlite_url, episode_id)

        episode_id, token, _ = reset(c)
        headers = {"content-type": "application/json", "X-Episode-Id": episode_id,
                   "X-Episode-Token": token}
        for i, action in enumerate(sent):
            action = json.loads(raw(action)) if i != 1 else None
            name = "ticketdesk_search_tickets" if action is None else f"{action['app']}_{action['method']}"
            arguments = '{"query": "renew \\ud800"}' if action is None else json.dumps(action["params"])
            r = c.post("/mcp", headers=headers, content=(
                f'{{"jsonrpc": "2.0", "id": {i}, "method": "tools/call", '
                f'"params": {{"name": "{name}", "arguments": {arguments}}}}}'))
            assert "result" in r.json(), r.text
        digests["mcp"] = stream_digest(sqlite_url, episode_id)
        r = c.post("/mcp", headers=headers, content='{"jsonrpc": "2.0", "id": 9, "method": "tools/call", '
                   '"params": {"name": "ticketdesk_get_ticket", "arguments": {"ticket_id": NaN}}}')
        assert r.json()["error"]["code"] == -32700 and "not JSON" in r.json()["error"]["message"]
    assert digests["http"] == digests["ws"] == digests["mcp"]
    assert digests["http"] == digest_uninterrupted(
        tmp_path, [json.loads(raw(a)) if isinstance(a, dict) else
                   {"app": "ticketdesk", "method": "search_tickets",
                    "params": {"query": "renew \ud800"}} for a in sent])


def test_the_observation_schema_describes_every_observation_the_server_sends(sqlite_url):
    """`/schema` gave the observation only `tools` and `text` (and any other key): a client or a
    validator generated from it knew nothing of goal, result, error, done or outcome."""
    import jsonschema

    from companyos.agents import make_agent

    with client(sqlite_url) as c:
        schema = jsonschema.Draft202012Validator(c.get("/schema").json()["observation"])
        for seed, text in ((3, False), (4, True)):
            episode_id, token, first = reset(c, seed=seed, task="expense_report", chaos="high", text=text)
            seen = [first["observation"]]
            agent = make_agent("random", seed=seed)
            agent.reset(first["observation"])
            while not seen[-1]["done"]:
                r = step(c, episode_id, token, agent.act(seen[-1]))
                assert r.status_code == 200, r.text
                seen.append(r.json()["observation"])
            for observation in seen:
                schema.validate(observation)
            assert {o["error"] for o in seen} - {None}  # rejections among them
            assert any(o["result"] is not None for o in seen) and seen[-1]["outcome"]
        for bad in ({**first["observation"], "done": "no"}, {**first["observation"], "outcome": "won"}):
            assert not schema.is_valid(bad)


def test_text_rendering_on_request(sqlite_url):
    with client(sqlite_url) as c:
        _, _, plain = reset(c)
        assert "text" not in plain["observation"]
        episode_id, token, rich = reset(c, seed=3, text=True)
        assert "GOAL" in rich["observation"]["text"].upper()
        assert "text" in step(c, episode_id, token, ACTIONS[0]).json()["observation"]


# -- sessions in the log ----------------------------------------------------------------------


def test_restart_continues_with_the_same_digest(sqlite_url, tmp_path):
    with client(sqlite_url) as c:
        episode_id, token, _ = reset(c)
        for action in ACTIONS[:3]:
            assert step(c, episode_id, token, action).status_code == 200
    with client(sqlite_url) as c:  # a new server process: nothing cached
        assert c.app.server.sessions.cached(episode_id) is None
        for action in ACTIONS[3:]:
            assert step(c, episode_id, token, action).status_code == 200
        assert c.get("/state", params={"episode_id": episode_id, "episode_token": token}
                     ).json()["step_count"] == len(ACTIONS)
    assert stream_digest(sqlite_url, episode_id) == digest_uninterrupted(tmp_path, ACTIONS)


def test_any_worker_serves_any_episode(sqlite_url, tmp_path):
    """Two server processes on one store, steps alternating between them (a load balancer)."""
    with client(sqlite_url) as a, client(sqlite_url) as b:
        episode_id, token, _ = reset(a)
        for i, action in enumerate(ACTIONS):
            r = step((a, b)[i % 2], episode_id, token, action)
            assert r.status_code == 200, r.text
            assert r.json()["metadata"]["step"] == i + 1
    assert stream_digest(sqlite_url, episode_id) == digest_uninterrupted(tmp_path, ACTIONS)


def test_state_from_any_worker_is_the_logs(sqlite_url):
    """A worker that cached an episode reports the steps another worker took since."""
    with client(sqlite_url) as a, client(sqlite_url) as b:
        episode_id, token, _ = reset(a)
        auth = {"X-Episode-Token": token}
        assert b.get("/state", params={"episode_id": episode_id}, headers=auth
                     ).json()["step_count"] == 0
        for action in ACTIONS[:3]:
            assert step(a, episode_id, token, action).status_code == 200
        assert b.get("/state", params={"episode_id": episode_id}, headers=auth
                     ).json()["step_count"] == 3
        assert step(b, episode_id, token, ACTIONS[3]).json()["metadata"]["step"] == 4


def test_idle_sessions_leave_the_cache_not_the_log(sqlite_url):
    with client(sqlite_url, idle_timeout_s=60) as c:
        sessions = c.app.server.sessions
        episode_id, token, _ = reset(c)
        assert sessions.cached(episode_id) is not None
        assert sessions.evict_idle(now=10**9) == 1
        assert sessions.cached(episode_id) is None
        r = step(c, episode_id, token, ACTIONS[0])
        assert r.status_code == 200 and r.json()["metadata"]["step"] == 1


def test_cache_size_is_bounded(sqlite_url):
    with client(sqlite_url, cache_size=2) as c:
        ids = [reset(c, seed=i)[:2] for i in range(4)]
        assert len(c.app.server.sessions) == 2
        for episode_id, token in ids:  # evicted ones come back from the log
            assert step(c, episode_id, token, ACTIONS[0]).status_code == 200


def test_ended_episodes_leave_the_cache_past_a_few(sqlite_url, monkeypatch):
    """Kept until the cache was full (4,096), ended episodes made each worker grow ~20 KB an
    episode with 8 running at a time; the latest few stay, the rest are read from the log if
    asked for, and a running episode stays however many end around it."""
    from api import sessions as sessions_module

    monkeypatch.setattr(sessions_module, "ENDED_KEPT", 3)
    with client(sqlite_url) as c:
        running = reset(c, seed=99)[:2]
        ended = []
        for seed in range(8):  # a step budget of one: each ends at its first step
            episode_id, token, _ = reset(c, seed=seed, task="expense_report", max_steps=1)
            assert step(c, episode_id, token, ACTIONS[0]).json()["done"] is True
            ended.append((episode_id, token))
        cache = c.app.server.sessions
        assert [e for e, _ in ended if cache.cached(e) is not None] == [e for e, _ in ended[-3:]]
        assert cache.cached(running[0]) is not None and len(cache) == 4
        first, token = ended[0]
        late = c.get("/state", params={"episode_id": first}, headers={"X-Episode-Token": token})
        assert step(c, *running, ACTIONS[0]).status_code == 200
    assert late.status_code == 200 and (late.json()["step_count"], late.json()["done"]) == (1, True)


def test_concurrent_step_on_one_episode_is_a_409(sqlite_url):
    with client(sqlite_url) as c:
        episode_id, token, _ = reset(c)
        session = c.app.server.sessions.cached(episode_id)
        with session.lock:  # a step is running
            r = step(c, episode_id, token, ACTIONS[0])
        assert r.status_code == 409 and r.json()["code"] == "step_in_progress"
        assert step(c, episode_id, token, ACTIONS[0]).status_code == 200


def test_step_race_one_wins_per_version(sqlite_url):
    """Many simultaneous steps: each is applied or refused with 409, never lost or doubled."""
    with client(sqlite_url) as c:
        episode_id, token, _ = reset(c, seed=5, max_steps=500)
        barrier = threading.Barrier(8)

        def go(i: int) -> int:
            barrier.wait()
            return step(c, episode_id, token, ACTIONS[i % 3]).status_code

        with ThreadPoolExecutor(8) as pool:
            codes = list(pool.map(go, range(8)))
        assert set(codes) <= {200, 409} and 200 in codes
        state = c.get("/state", params={"episode_id": episode_id, "episode_token": token}).json()
        assert state["step_count"] == codes.count(200)


def test_conflict_with_another_process_is_a_409_then_recovers(sqlite_url):
    """A socket's cached episode went stale because another process stepped it: 409, reload."""
    with client(sqlite_url) as a, client(sqlite_url) as b, a.websocket_connect("/ws") as ws:
        ws.send_json({"type": "reset", "data": RESET})
        meta = ws.receive_json()["data"]["metadata"]
        assert step(b, meta["episode_id"], meta["episode_token"], ACTIONS[0]).status_code == 200
        ws.send_json({"type": "step", "data": ACTIONS[1]})
        reply = ws.receive_json()
        assert reply["type"] == "error" and reply["data"]["status"] == 409
        ws.send_json({"type": "step", "data": ACTIONS[1]})
        reply = ws.receive_json()
        assert reply["type"] == "observation" and reply["data"]["metadata"]["step"] == 2


def test_a_step_by_another_client_of_the_same_process_is_a_409_for_the_socket_too(sqlite_url):
    """Another process's step refused the socket's next one (its action was chosen on a world that
    has moved), but another client of the same process, sharing its cached episode, did not: on
    `serve --workers 2` it depended on which worker took the other request (7 of 12 applied)."""
    with client(sqlite_url) as c, c.websocket_connect("/ws") as ws:
        ws.send_json({"type": "reset", "data": RESET})
        meta = ws.receive_json()["data"]["metadata"]
        assert step(c, meta["episode_id"], meta["episode_token"], ACTIONS[0]).status_code == 200
        ws.send_json({"type": "step", "data": ACTIONS[1]})
        reply = ws.receive_json()
        assert reply["type"] == "error" and reply["data"]["status"] == 409, reply
        assert reply["data"]["reason"] == "conflict" and "another client" in reply["data"]["message"]
        ws.send_json({"type": "step", "data": ACTIONS[1]})  # on the world as logged now
        assert ws.receive_json()["data"]["metadata"]["step"] == 2
    with client(sqlite_url) as c:
        state = c.get("/state", params={"episode_id": meta["episode_id"],
                                        "episode_token": meta["episode_token"]}).json()
        assert state["step_count"] == 2  # the refused action was not applied


def test_a_socket_resuming_an_episode_another_process_stepped_steps_on_from_the_log(sqlite_url):
    """Resuming took this process's cached copy as it was: a socket hopping between two server
    processes (a reconnect behind a load balancer) had its first step refused as a conflict."""
    with client(sqlite_url) as a, client(sqlite_url) as b:
        episode_id, token, _ = reset(a)
        assert step(a, episode_id, token, ACTIONS[0]).status_code == 200  # a caches the episode
        assert step(b, episode_id, token, ACTIONS[1]).status_code == 200
        with a.websocket_connect(f"/ws?session_id={episode_id}.{token}") as ws:
            ws.send_json({"type": "step", "data": ACTIONS[2]})
            reply = ws.receive_json()
        assert reply["type"] == "observation", reply
        assert reply["data"]["metadata"]["step"] == 3



def _tool_call(ws, name: str, **params) -> dict:
    ws.send_json({"type": "mcp", "data": {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                                          "params": {"name": name, **params}}})
    return ws.receive_json()["data"]


def test_reading_an_episode_while_this_process_steps_it_waits_for_the_step(sqlite_url, monkeypatch):
    """While a step of this process was logging (an MCP batch on a thread), the log was ahead of
    the cached copy, so `state` or a socket's resume loaded the whole episode again, on the event
    loop (~0.5 s for 8,000 steps), and threw the load away. It waits for the step instead, and on
    the loop (told not to wait) it stops at once so the server waits on a thread."""
    from api.sessions import SessionManager
    from eventstore import EventStore, WriterBusy
    from eventstore.backends import writers_waited_for

    store = EventStore.open(sqlite_url)
    sessions = SessionManager(store, cache_size=8, idle_timeout_s=600)
    session, _, _ = sessions.start(dict(RESET))
    logged, proceed = threading.Event(), threading.Event()
    append_head = store.append_head

    def logged_then_held(*args):
        head = append_head(*args)
        logged.set()  # in the log, not yet in the cached copy
        proceed.wait(30)
        return head

    monkeypatch.setattr(store, "append_head", logged_then_held)
    reloads = []
    reload = sessions._reload
    monkeypatch.setattr(sessions, "_reload", lambda episode_id: reloads.append(1) or reload(episode_id))
    with ThreadPoolExecutor(2) as pool:
        stepping = pool.submit(sessions.step, session, ACTIONS[0])
        assert logged.wait(30)
        with writers_waited_for(False), pytest.raises(WriterBusy):
            sessions.state(session)
        reading = pool.submit(sessions.state, session)
        proceed.set()
        assert stepping.result(30)["metadata"]["step"] == 1
        assert reading.result(30)["step_count"] == 1
    assert reloads == []
    store.close()


def test_a_sockets_tool_calls_are_its_own_steps(sqlite_url):
    """A tools/call on the socket's episode is a step of the socket's: its next plain step was
    refused as "another client stepped this episode", and another client's step before a tools/call
    went unnoticed, where a plain step is refused."""
    with client(sqlite_url) as c, c.websocket_connect("/ws") as ws:
        ws.send_json({"type": "reset", "data": RESET})
        meta = ws.receive_json()["data"]["metadata"]
        assert _tool_call(ws, "datahub_list_metrics")["result"]["structuredContent"]["metadata"]["step"] == 1
        ws.send_json({"type": "step", "data": ACTIONS[0]})
        reply = ws.receive_json()
        assert reply["type"] == "observation" and reply["data"]["metadata"]["step"] == 2, reply
        assert step(c, meta["episode_id"], meta["episode_token"], ACTIONS[1]).status_code == 200
        refused = _tool_call(ws, "datahub_list_metrics")
        assert refused["error"]["data"] == {"status": 409, "code": "conflict"}, refused
        assert "another client stepped" in refused["error"]["message"]
        answer = _tool_call(ws, "datahub_list_metrics")  # on the world as logged now
        assert answer["result"]["structuredContent"]["metadata"]["step"] == 4, answer


def test_a_sockets_tool_call_on_another_episode_reads_it_from_the_log(sqlite_url):
    """A tools/call naming another episode took this process's cached copy of it as fresh: one that
    another server process had stepped since was refused as a conflict (3 of 6 on `--workers 3`)."""
    with client(sqlite_url) as a, client(sqlite_url) as b, a.websocket_connect("/ws") as ws:
        ws.send_json({"type": "reset", "data": RESET})
        ws.receive_json()
        other, token, _ = reset(a, seed=2)  # a caches it
        assert step(b, other, token, ACTIONS[0]).status_code == 200
        answer = _tool_call(ws, "datahub_list_metrics", episode_id=other, episode_token=token)
        content = answer["result"]["structuredContent"]["metadata"]
        assert (content["episode_id"], content["step"]) == (other, 2), answer


# -- access ----------------------------------------------------------------------------------


def test_an_encoded_slash_in_a_path_is_no_route(sqlite_url):
    """`/episodes/<id>%2Fevents` was decoded before routing and answered the events route: a
    spelling a proxy's rule on the raw path would not see. No route and no episode id has one."""
    with client(sqlite_url) as c:
        episode_id, _, _ = reset(c)
        assert c.get(f"/episodes/{episode_id}/events").status_code == 200
        for path in (f"/episodes/{episode_id}%2Fevents", f"/episodes/{episode_id}%2frerun"):
            r = c.get(path)
            assert r.status_code == 404 and "encoded slash" in r.json()["detail"], (path, r.text)
        page = c.get(f"/ui/episodes/{episode_id}%2Fviews")  # a person reads a page
        assert page.status_code == 404 and page.headers["content-type"].startswith("text/html")


def test_episode_token_rules(sqlite_url):
    with client(sqlite_url) as c:
        episode_id, token, _ = reset(c)
        _, other_token, _ = reset(c, seed=2)
        r = step(c, episode_id, None, ACTIONS[0])
        assert r.status_code == 401 and "token" in r.json()["detail"]
        r = step(c, episode_id, other_token, ACTIONS[0])
        assert r.status_code == 403 and r.json()["code"] == "wrong_token"
        r = c.get("/state", params={"episode_id": episode_id})
        # GET /state takes it in its query, not the body field the words once named alone
        assert r.status_code == 401 and "the query (GET /state" in r.json()["detail"]
        assert c.get("/state", params={"episode_id": episode_id, "episode_token": token}).status_code == 200
        # the body's token and the header's, different: the body's won without a word
        for headers in ({"X-Episode-Token": other_token}, {"X-Episode-Token": token}):
            body_token = token if headers["X-Episode-Token"] == other_token else other_token
            r = c.post("/step", json={"episode_id": episode_id, "episode_token": body_token,
                                      "action": ACTIONS[0]}, headers=headers)
            assert r.status_code == 400 and r.json()["code"] == "conflicting_tokens", r.text
            r = c.get("/state", params={"episode_id": episode_id, "episode_token": body_token},
                      headers=headers)
            assert r.status_code == 400 and "differ; send the episode's token once" in r.json()["detail"]
        r = c.post("/step", json={"episode_id": episode_id, "episode_token": token, "action": ACTIONS[0]},
                   headers={"X-Episode-Token": token})
        assert r.status_code == 200 and r.json()["metadata"]["step"] == 1  # the same one twice is fine
        # two X-Episode-Token headers that differ: the first won without a word, whichever it was
        for pair in ([("X-Episode-Token", token), ("X-Episode-Token", other_token)],
                     [("X-Episode-Token", other_token), ("X-Episode-Token", token)]):
            r = c.post("/step", json={"episode_id": episode_id, "action": ACTIONS[0]}, headers=pair)
            assert r.status_code == 400 and "X-Episode-Token headers that differ" in r.json()["detail"]
            r = c.get("/state", params={"episode_id": episode_id}, headers=pair)
            assert r.status_code == 400 and r.json()["code"] == "conflicting_tokens", r.text
        r = c.get("/state", params={"episode_id": episode_id}, headers=[("X-Episode-Token", token)] * 2)
        assert r.status_code == 200 and r.json()["step_count"] == 1  # nothing stepped meanwhile
        # whitespace around a header's value is no part of it (a trailing space was a 403)
        for padded in (f"{token} ", f"{token}\t", f" {token} "):
            r = c.get("/state", params={"episode_id": episode_id}, headers={"X-Episode-Token": padded})
            assert r.status_code == 200, r.text
            r = c.get("/state", params={"episode_id": episode_id, "episode_token": token},
                      headers={"X-Episode-Token": padded})
            assert r.status_code == 200, r.text  # the same token as the query's, not a conflict
        # so on /ws, where the query's token won over a differing header (two headers: test_api_live)
        with c.websocket_connect(f"/ws?session_id={episode_id}&episode_token={token}",
                                 headers={"X-Episode-Token": other_token}) as ws:
            ws.send_json({"type": "state"})
            error = ws.receive_json()
        assert error["data"]["reason"] == "conflicting_tokens", error
        assert "send the episode's token once" in error["data"]["message"]


def test_episode_logged_elsewhere_cannot_be_acted_on(sqlite_url):
    with CompanyEnv(sqlite_url) as env:
        env.reset(seed=1, options={"task": "handbook_update"})
        episode_id = env.state["episode_id"]
    with client(sqlite_url) as c:
        r = step(c, episode_id, "x" * 32, ACTIONS[0])
        assert r.status_code == 403 and r.json()["code"] == "no_token"
        assert c.get(f"/episodes/{episode_id}").status_code == 200  # but it can be read


def test_api_key(sqlite_url):
    with client(sqlite_url, api_key="sekret") as c:
        assert c.get("/health").status_code == 200
        r = c.get("/tasks")
        assert r.status_code == 401 and "Authorization" in r.json()["detail"]
        assert c.get("/tasks", headers={"Authorization": "Bearer nope"}).status_code == 403
        r = c.get("/tasks", headers={"Authorization": "Bearer "})  # no key at all: not a wrong one
        assert r.status_code == 401 and "holds no key after Bearer" in r.json()["detail"]
        # the right key in another scheme was "wrong API key" (403): the form is what is wrong
        for header in ("Basic sekret", "sekret"):
            r = c.get("/tasks", headers={"Authorization": header})
            assert r.status_code == 401 and "takes Authorization: Bearer <key>" in r.json()["detail"], r.text
        auth = {"Authorization": "Bearer sekret"}
        assert c.get("/tasks", headers=auth).status_code == 200
        assert c.post("/reset", json=RESET).status_code == 401
        assert c.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "ping"}).status_code == 401
        with pytest.raises(WebSocketDenialResponse) as denied, c.websocket_connect("/ws"):
            pass
        assert denied.value.status_code == 401 and "API key" in denied.value.json()["detail"]
        with c.websocket_connect("/ws", headers=auth) as ws:
            ws.send_json({"type": "reset", "data": RESET})
            assert ws.receive_json()["type"] == "observation"


@pytest.mark.parametrize("api_key", [None, "sekret"])
def test_a_websocket_to_another_path_is_told_404_in_words(sqlite_url, api_key):
    """Starlette refused a WebSocket handshake for a path with no WebSocket route (`/ws/`, `/step`)
    with a bare 403, as if it were forbidden. It is a 404 that names /ws, after the API key check."""
    with client(sqlite_url, api_key=api_key) as c:
        auth = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        for path in ("/ws/", "/step", "/nowhere"):
            with pytest.raises(WebSocketDenialResponse) as denied, c.websocket_connect(path, headers=auth):
                pass
            assert denied.value.status_code == 404, path
            assert denied.value.json() == {"code": "not_found", "detail":
                                           f"there is no WebSocket endpoint at {path!r}: it is /ws"}
        if api_key:
            with pytest.raises(WebSocketDenialResponse) as denied, c.websocket_connect("/nowhere"):
                pass
            assert denied.value.status_code == 401


def test_a_configured_key_is_taken_without_its_surrounding_whitespace(sqlite_url):
    """A key file or secret mount ends in a newline: kept, it locked out every client (a header
    cannot carry it), all told "wrong API key"."""
    from api.config import ServerConfig

    config = ServerConfig.from_env({"COMPANYOS_DB": sqlite_url, "COMPANYOS_API_KEY": "sekret\n"})
    assert config.api_key == "sekret"
    with client(sqlite_url, api_key=config.api_key) as c:
        assert c.get("/tasks", headers={"Authorization": "Bearer sekret"}).status_code == 200
    for key in ("two words", "sécret", "tab\tin"):
        with pytest.raises(ValueError, match="API key"):
            ServerConfig(db=sqlite_url, api_key=key)


# -- bad input -------------------------------------------------------------------------------


def test_bad_inputs_are_4xx_with_a_message(sqlite_url):
    with client(sqlite_url, max_body_bytes=4096) as c:
        episode_id, token, _ = reset(c)
        auth = {"X-Episode-Token": token}
        cases = [
            c.post("/reset", content=b"{not json", headers={"content-type": "application/json"}),
            c.post("/reset", json={"seed": "eleven"}),
            c.post("/reset", json={"seed": -1}),
            c.post("/reset", json={"task": "world_domination"}),
            c.post("/reset", json={"chaos": "apocalyptic"}),
            c.post("/reset", json={"reward_profile": "lavish"}),
            c.post("/reset", json={"max_steps": 0}),
            c.post("/reset", json={"colour": "blue"}),
            c.post("/reset", json={"episode_id": "no spaces/slashes"}),
            c.post("/reset", json={"episode_id": episode_id}),  # exists
            c.post("/step", json={"episode_id": episode_id, "action_": ACTIONS[0]}, headers=auth),
            c.post("/step", json={"episode_id": episode_id}, headers=auth),
            c.post("/step", json={"action": ACTIONS[0]}, headers=auth),
            c.post("/step", json=[1, 2], headers=auth),
            c.post("/step", json={"episode_id": "nope", "action": ACTIONS[0]}, headers=auth),
            c.post("/step", json={"episode_id": episode_id, "action": {"params": "x" * 5000}},
                   headers=auth),
            c.get("/state"),
            c.get("/episodes/nope"),
            c.get(f"/episodes/{episode_id}/views", params={"step": 999}),
            c.get("/episodes", params={"limit": 0}),
            c.get("/episodes", params={"outcome": "meh"}),
            c.get("/episodes", params={"task": "expens_report"}),  # not an empty list
        ]
        for r in cases:
            assert 400 <= r.status_code < 500, (r.request.url, r.status_code, r.text)
            assert r.json()["detail"], r.text
        assert cases[3].status_code == 400 and "world_domination" in cases[3].json()["detail"]
        assert cases[9].status_code == 409
        assert cases[14].status_code == 404
        assert cases[15].status_code == 413
        assert cases[-1].status_code == 422 and "expense_report" in cases[-1].text


@pytest.mark.parametrize("body", [{"chaos": True}, {"seed": True}, {"seed": "7"}, {"seed": 7.0},
                                  {"text": "yes"}, {"max_steps": "5"}])
def test_reset_refuses_values_of_the_wrong_type_instead_of_converting_them(sqlite_url, body):
    """As the WebSocket does: `"chaos": true` is not chaos 1.0, `"seed": "7"` is not seed 7."""
    with client(sqlite_url) as c:
        r = c.post("/reset", json=body)
        assert r.status_code == 422 and r.json()["detail"][0]["loc"][:2] == ["body", *body]
        assert c.get("/episodes").json()["total"] == 0


def test_mcp_initialize_refuses_a_text_flag_it_cannot_read(sqlite_url):
    with client(sqlite_url) as c:
        r = rpc(c, "initialize", {"protocolVersion": "2025-06-18"}, path="/mcp?text=maybe")
        assert "text must be true or false" in r.json()["error"]["message"]
        r = rpc(c, "initialize", {"protocolVersion": "2025-06-18"}, path="/mcp?text=no&seed=2")
        assert "result" in r.json()


@pytest.mark.parametrize("version", [5, 2025.06, ["2025-06-18"], {"v": 1}, True])
def test_mcp_initialize_refuses_a_protocol_version_that_is_no_string(sqlite_url, version):
    """`"protocolVersion": 5` was answered as the latest version, with an episode started."""
    with client(sqlite_url) as c:
        r = rpc(c, "initialize", {"protocolVersion": version}, path="/mcp?seed=3")
        assert r.status_code == 200 and r.json()["error"]["code"] == -32602, r.text
        assert "protocolVersion must be a string" in r.json()["error"]["message"]
        assert "mcp-session-id" not in r.headers
        assert c.get("/episodes").json()["total"] == 0
        r = rpc(c, "initialize", {"protocolVersion": "1999-01-01"}, path="/mcp?seed=3")
        assert r.json()["result"]["protocolVersion"] == "2025-11-25"  # one it speaks, as MCP asks


@pytest.mark.parametrize("seed", ["%D9%A3", "1_000", "%2B3", "0x10"])
def test_mcp_initialize_reads_a_seed_as_reset_and_the_ui_do(sqlite_url, seed):
    """Python's int() read "1_000" and Arabic-Indic digits, which every other path refuses."""
    with client(sqlite_url) as c:
        r = rpc(c, "initialize", {"protocolVersion": "2025-06-18"}, path=f"/mcp?seed={seed}")
        assert "seed must be an integer" in r.json()["error"]["message"]
        assert c.get("/episodes").json()["total"] == 0


def test_mcp_initialize_takes_a_rules_version_from_the_query(sqlite_url):
    """It arrived as text and was refused as "no rules version '1'", whatever it was."""
    with client(sqlite_url) as c:
        r = rpc(c, "initialize", {"protocolVersion": "2025-06-18"}, path="/mcp?seed=3&rules=1")
        episode_id = r.headers["mcp-session-id"].rpartition(".")[0]
        assert c.get(f"/episodes/{episode_id}").json()["rules"] == 1
        r = rpc(c, "initialize", {"protocolVersion": "2025-06-18"}, path="/mcp?seed=3&rules=5")
        assert "no rules version 5; the versions are 1, 2, 3, 4" in r.json()["error"]["message"]
        assert c.get("/episodes").json()["total"] == 1


def test_a_long_seed_is_out_of_range_on_mcp_as_on_reset(sqlite_url):
    """A seed of 31 digits or more was "not an integer" over MCP; out of range, as it is."""
    seed = "1" + "0" * 40
    with client(sqlite_url) as c:
        r = rpc(c, "initialize", {"protocolVersion": "2025-06-18"}, path=f"/mcp?seed={seed}")
        assert "is outside 0 to 9223372036854775807" in r.json()["error"]["message"], r.text
        assert c.post("/reset", json={"seed": int(seed)}).status_code == 422
        assert c.get("/episodes").json()["total"] == 0


def test_an_mcp_id_no_reply_could_carry_is_refused_before_anything_runs(sqlite_url):
    """An id past 64 bits: the tool call was applied, then encoding the reply failed with a 500
    (and a dropped WebSocket), so a client retried a step that had happened."""
    with client(sqlite_url) as c:
        r = rpc(c, "initialize", {"protocolVersion": "2025-06-18"}, path="/mcp?seed=3")
        session = {"Mcp-Session-Id": r.headers["mcp-session-id"]}
        call = {"name": "datahub_list_metrics", "arguments": {}}
        for huge in (10**23, -(2**63) - 1, 2**64):
            r = rpc(c, "tools/call", call, headers=session, id_=huge)
            assert r.status_code == 200 and r.json()["error"]["code"] == -32600
            assert r.json()["id"] is None and "64 bits" in r.json()["error"]["message"]
        episode = session["Mcp-Session-Id"].split(".")[0]
        assert c.get(f"/episodes/{episode}").json()["steps"] == 0  # nothing was applied
        r = rpc(c, "tools/call", call, headers=session, id_=2**64 - 1)  # the largest that fits
        assert r.json()["id"] == 2**64 - 1 and "result" in r.json()
        with c.websocket_connect("/ws") as ws:
            ws.send_json({"type": "mcp", "data": {"jsonrpc": "2.0", "id": 10**23, "method": "ping"}})
            assert ws.receive_json()["data"]["error"]["code"] == -32600
            ws.send_json({"type": "mcp", "data": {"jsonrpc": "2.0", "id": 1, "method": "ping"}})
            assert ws.receive_json()["data"] == {"jsonrpc": "2.0", "id": 1, "result": {}}  # still open


def test_an_mcp_notification_is_never_answered_even_with_bad_params(sqlite_url):
    with client(sqlite_url) as c:
        r = c.post("/mcp", json={"jsonrpc": "2.0", "method": "notifications/initialized", "params": [1]})
        assert r.status_code == 202 and r.content == b""


def test_mcp_initialize_refuses_an_option_given_twice_as_analytics_does(sqlite_url):
    """`?seed=1&seed=2` could mean either seed: neither is guessed, and no episode starts."""
    with client(sqlite_url) as c:
        r = rpc(c, "initialize", {"protocolVersion": "2025-06-18"}, path="/mcp?seed=1&seed=2")
        assert "parameter 'seed' is given more than once" in r.json()["error"]["message"]
        assert c.get("/episodes").json()["total"] == 0
        r = c.get("/analytics/pass_at_k?k=1&k=2")
        assert r.status_code == 400 and r.json()["detail"] == "parameter 'k' is given more than once"


def test_bodies_the_parser_gives_up_on_are_said_in_words(sqlite_url):
    """Chunked (no Content-Length) past the limit: 413 as with one; too deep or not UTF-8: 422."""
    json_type = {"content-type": "application/json"}
    with client(sqlite_url, max_body_bytes=4096) as c:
        chunked = c.post("/reset", content=(b'{"task": "' + b"x" * 1000 for _ in range(10)),
                         headers=json_type)
        not_utf8 = c.post("/reset", content=b'{"task": "\xff"}', headers=json_type)
    depth = 1_100  # past orjson's limit
    with client(sqlite_url, max_body_bytes=2 * depth + 1024) as c:
        deep = c.post("/reset", content=b"[" * depth + b"]" * depth, headers=json_type)
        assert chunked.status_code == 413 and chunked.json()["code"] == "body_too_large"
        # the parser's own words, which differ between versions ("nested too deeply", "recursion
        # depth exceeded")
        said = deep.json()["detail"][0]["msg"]
        assert deep.status_code == 422 and said.startswith("the body is not valid JSON: ")
        assert "deep" in said or "depth" in said, said
        assert not_utf8.status_code == 422 and "not valid UTF-8" in not_utf8.json()["detail"][0]["msg"]
        assert reset(c)[0]  # and the server goes on serving


def test_bodies_in_a_coding_the_server_does_not_read_are_refused_for_it(sqlite_url):
    """A gzipped body was read as its compressed bytes and refused as "not valid UTF-8", which
    named the wrong problem; a transfer coding other than chunked went through undecoded."""
    body = gzip.compress(json.dumps(RESET).encode())
    with client(sqlite_url) as c:
        r = c.post("/reset", content=body, headers={"content-type": "application/json",
                                                    "content-encoding": "gzip"})
        assert r.status_code == 415 and r.json()["code"] == "unsupported_encoding"
        assert "Content-Encoding 'gzip' is not read here" in r.json()["detail"]
        assert r.headers["accept-encoding"] == "identity"
        r = c.post("/reset", content=json.dumps(RESET), headers={
            "content-type": "application/json", "content-encoding": "identity"})
        assert r.status_code == 200
        assert c.get("/episodes").json()["total"] == 1  # the refused body started nothing


def test_an_integer_too_long_for_python_is_refused_in_words_on_every_door(sqlite_url):
    """Python turns at most 4,300 digits into an int: its plain ValueError was a 400 "There was an
    error parsing the body" over HTTP, a 500 over MCP and a dropped socket over WebSocket."""
    digits = "1" + "0" * 5000
    with client(sqlite_url) as c:
        r = c.post("/reset", content=f'{{"seed": {digits}}}', headers={"content-type": "application/json"})
        assert r.status_code == 422, r.text
        said = r.json()["detail"][0]["msg"]
        assert "an integer of 5,001 digits is longer than the 4,300 digits read" in said
        r = c.post("/mcp", content=f'{{"jsonrpc": "2.0", "id": {digits}, "method": "ping"}}',
                   headers={"content-type": "application/json"})
        assert r.json()["error"]["code"] == -32700 and "5,001 digits" in r.json()["error"]["message"]
        with c.websocket_connect("/ws") as ws:
            ws.send_json({"type": "reset", "data": RESET})
            assert ws.receive_json()["type"] == "observation"
            ws.send_text(f'{{"type": "step", "data": {digits}}}')
            frame = ws.receive_json()
            assert frame["data"]["code"] == "INVALID_JSON" and "5,001 digits" in frame["data"]["message"]
            ws.send_json({"type": "step", "data": ACTIONS[0]})  # the socket and its episode go on
            assert ws.receive_json()["type"] == "observation"


def test_deep_text_the_stdlib_parser_reads_is_one_action_on_every_door(sqlite_url):
    """Text with a 19-digit run goes to the stdlib parser, which recurses once a level: on the
    caller's stack it gave up at 955 levels over HTTP and 971 over WebSocket, so the same bytes
    were an action on one door and a 422 on the other."""
    action = "[" * 980 + '"1234567890123456789"' + "]" * 980
    with client(sqlite_url) as c:
        episode_id, token, _ = reset(c)
        r = c.post("/step", content=f'{{"episode_id": "{episode_id}", "action": {action}}}',
                   headers={"content-type": "application/json", "X-Episode-Token": token})
        assert r.status_code == 200 and r.json()["metadata"]["rejected"] == "malformed_action", r.text
        with c.websocket_connect("/ws") as ws:
            ws.send_json({"type": "reset", "data": RESET})
            assert ws.receive_json()["type"] == "observation"
            ws.send_text(f'{{"type": "step", "data": {action}}}')
            frame = ws.receive_json()
            assert frame["type"] == "observation"
            assert frame["data"]["metadata"]["rejected"] == "malformed_action"


def test_a_lone_surrogate_echoed_back_is_answered_not_a_500_or_a_dropped_socket(sqlite_url):
    """orjson writes no lone surrogate: a reply quoting one (an unknown message type, a JSON-RPC
    id) failed the request or dropped the socket. It comes back as the escape it came in."""
    with client(sqlite_url) as c:
        r = c.post("/mcp", content='{"jsonrpc": "2.0", "id": "a\\ud800", "method": "ping"}',
                   headers={"content-type": "application/json"})
        assert r.status_code == 200 and r.json()["id"] == "a\ud800" and "result" in r.json()
        r = c.post("/mcp", content='{"jsonrpc": "2.0", "id": 1, "method": "no\\udfff"}',
                   headers={"content-type": "application/json"})
        assert r.json()["error"]["code"] == -32601 and "no\udfff" in r.json()["error"]["message"]
        created = c.post("/mcp", content='{"jsonrpc": "2.0", "id": 2, "method": '
                         '"openenv/session/create", "params": {"agent": "a\\ud800"}}',
                         headers={"content-type": "application/json"}).json()
        assert "agent must be Unicode text" in created["error"]["message"]
        with c.websocket_connect("/ws") as ws:
            ws.send_text('{"type": "x\\ud800"}')
            frame = ws.receive_json()
            assert frame["data"]["code"] == "UNKNOWN_TYPE" and "type: x\ud800; " in frame["data"]["message"]
            ws.send_text('{"type": "reset", "data": {"agent": "a\\ud800"}}')
            assert "agent must be Unicode text" in ws.receive_json()["data"]["message"]
            ws.send_json({"type": "reset", "data": RESET})
            assert ws.receive_json()["type"] == "observation"
        assert c.get("/episodes").json()["total"] == 1


def test_finished_episode_is_a_409(sqlite_url):
    with client(sqlite_url) as c:
        episode_id, token, _ = reset(c, seed=4, max_steps=1)
        assert step(c, episode_id, token, ACTIONS[0]).json()["done"] is True
        r = step(c, episode_id, token, ACTIONS[0])
        assert r.status_code == 409 and r.json()["code"] == "episode_finished"


# -- WebSocket -------------------------------------------------------------------------------


def test_websocket_protocol(sqlite_url):
    with client(sqlite_url) as c, c.websocket_connect("/ws") as ws:
        ws.send_json({"type": "step", "data": ACTIONS[0]})
        assert ws.receive_json()["data"]["code"] == "EXECUTION_ERROR"  # no reset yet
        ws.send_json({"type": "views"})
        assert ws.receive_json()["data"]["reason"] == "no_episode"
        ws.send_json({"type": "state"})
        assert ws.receive_json() == {"type": "state", "data": {"episode_id": None, "step_count": 0}}
        ws.send_json({"type": "reset", "data": RESET})
        first = ws.receive_json()
        assert first["type"] == "observation" and first["data"]["metadata"]["episode_token"]
        ws.send_json({"type": "step", "data": ACTIONS[0]})
        reply = ws.receive_json()
        assert reply["type"] == "observation" and reply["data"]["metadata"]["step"] == 1
        ws.send_json({"type": "step", "data": {"app": "nope", "method": "x"}})
        assert ws.receive_json()["data"]["metadata"]["rejected"] == "unknown_tool"
        ws.send_json({"type": "state"})
        state = ws.receive_json()
        assert state["type"] == "state" and state["data"]["step_count"] == 2
        ws.send_json({"type": "views"})  # the apps after step 2, as the log's HTTP route folds them
        views = ws.receive_json()
        episode_id = first["data"]["metadata"]["episode_id"]
        assert views == {"type": "views", "data": c.get(f"/episodes/{episode_id}/views").json()}
        assert views["data"]["step"] == 2
        ws.send_text("{nope")
        assert ws.receive_json()["data"]["code"] == "INVALID_JSON"
        ws.send_json({"type": "dance"})
        said = ws.receive_json()["data"]
        assert said["code"] == "UNKNOWN_TYPE"
        assert said["message"].endswith("the types are reset, step, state, views, close or mcp")
        ws.send_json({"nottype": 1})  # was "Unknown message type: None"
        said = ws.receive_json()["data"]
        assert said["code"] == "VALIDATION_ERROR"
        assert said["message"].startswith("a message must be a JSON object with a 'type': reset, step")
        ws.send_json({"type": "step"})  # no action at all
        assert ws.receive_json()["data"]["code"] == "VALIDATION_ERROR"
        ws.send_json({"type": "reset", "data": {"task": "nope"}})
        assert ws.receive_json()["data"]["code"] == "VALIDATION_ERROR"
        ws.send_json({"type": "step", "data": {"type": "list_tools"}})  # OpenEnv MCP-style
        assert len(ws.receive_json()["data"]["observation"]["tools"]) >= 14
        ws.send_json({"type": "mcp", "data": {"jsonrpc": "2.0", "id": 3, "method": "tools/call",
                                              "params": {"name": "datahub_list_metrics"}}})
        reply = ws.receive_json()
        assert reply["type"] == "mcp"
        assert reply["data"]["result"]["structuredContent"]["metadata"]["step"] == 3
        ws.send_json({"type": "close"})


NOT_ACTIONS = ["list_tickets", None, [1, 2], 7]


def test_a_value_that_is_no_action_is_the_agents_mistake_on_every_transport(sqlite_url, tmp_path):
    """In process such a value is rejected in the episode with a penalty; HTTP answered 422 and
    WebSocket an error without logging it, so the same actions logged different episodes."""
    actions = [ACTIONS[0], *NOT_ACTIONS, ACTIONS[1]]
    want = digest_uninterrupted(tmp_path, actions)
    with client(sqlite_url) as c:
        episode_id, token, _ = reset(c)
        for action in actions:
            r = step(c, episode_id, token, action)
            assert r.status_code == 200, r.text
        assert r.json()["metadata"]["step"] == len(actions)
        with c.websocket_connect("/ws") as ws:
            ws.send_json({"type": "reset", "data": RESET})
            ws_episode = ws.receive_json()["data"]["metadata"]["episode_id"]
            for action in actions:
                ws.send_json({"type": "step", "data": action})
                reply = ws.receive_json()
                assert reply["type"] == "observation", reply
                if action in NOT_ACTIONS:
                    assert reply["data"]["metadata"]["rejected"] == "malformed_action"
                    assert "must be a JSON object" in reply["data"]["observation"]["message"]
    assert stream_digest(sqlite_url, episode_id) == stream_digest(sqlite_url, ws_episode) == want


def test_mcp_initialize_over_a_websocket_starts_the_episode_its_tool_calls_act_in(sqlite_url):
    """`initialize` on an unbound socket logged an episode it did not bind: the next tools/call
    said "call initialize first", and every try left an episode running that nobody could reach."""
    with client(sqlite_url) as c:
        with c.websocket_connect("/ws") as ws:
            ws.send_json({"type": "mcp", "data": {"jsonrpc": "2.0", "id": 1, "method": "initialize",
                                                  "params": {"protocolVersion": "2025-03-26"}}})
            assert "Goal: " in ws.receive_json()["data"]["result"]["instructions"]
            ws.send_json({"type": "state"})
            episode_id = ws.receive_json()["data"]["episode_id"]
            assert episode_id
            ws.send_json({"type": "mcp", "data": {"jsonrpc": "2.0", "id": 2, "method": "initialize"}})
            ws.receive_json()  # the socket's episode again, not another one
            ws.send_json({"type": "mcp", "data": {"jsonrpc": "2.0", "id": 3, "method": "tools/call",
                                                  "params": {"name": "datahub_list_metrics"}}})
            content = ws.receive_json()["data"]["result"]["structuredContent"]
            assert content["metadata"]["episode_id"] == episode_id and content["metadata"]["step"] == 1
        running = c.get("/episodes", params={"outcome": "running"}).json()
        assert [e["episode_id"] for e in running["episodes"]] == [episode_id]


def test_a_query_parameter_a_route_does_not_take_is_refused_in_words(sqlite_url):
    """FastAPI ignores an unknown parameter and keeps the last of a repeated one: a typo in a
    filter (`outcomes=`) answered with the whole, unfiltered list."""
    with client(sqlite_url) as c:
        episode_id, token, _ = reset(c)
        step(c, episode_id, token, ACTIONS[0])
        assert c.get("/episodes", params={"outcome": "running"}).json()["total"] == 1
        for path, query, words in (
                ("/episodes", "outcomes=success", "/episodes has no query parameter 'outcomes'; "
                                                  "it takes after, agent, before, failure_mode, limit, "
                                                  "offset, outcome, rules, task"),
                ("/episodes", "limit=2&limit=500", "parameter 'limit' is given more than once"),
                (f"/episodes/{episode_id}/views", "stpe=0", "has no query parameter 'stpe'; it takes step"),
                (f"/episodes/{episode_id}/events", "from=3", "has no query parameter 'from'"),
                (f"/episodes/{episode_id}", "step=1", "it takes none"),
                ("/state", f"episode_id={episode_id}&episode_token={token}&verbose=1", "'verbose'"),
                ("/tasks", "family=x", "/tasks has no query parameter 'family'")):
            r = c.get(f"{path}?{query}")
            assert r.status_code == 400 and r.json()["code"] == "invalid_query", (path, r.text)
            assert words in r.json()["detail"], r.text
        assert c.get(f"/state?episode_id={episode_id}&episode_token={token}").status_code == 200
        assert c.get("/health?probe=1").status_code == 200  # load balancers add what they like
        r = c.get("/analytics?name=failure_modes")
        assert r.status_code == 400 and "/analytics has no query parameter 'name'" in r.json()["detail"]
        with c.websocket_connect(f"/ws?sesion_id={episode_id}.{token}") as ws:  # started no session
            error = ws.receive_json()
        assert error["data"]["reason"] == "invalid_query", error
        assert "/ws has no query parameter 'sesion_id'" in error["data"]["message"]
        with c.websocket_connect("/ws?session_id=") as ws:  # an unset variable: it started afresh
            error = ws.receive_json()
        assert error["data"]["reason"] == "invalid_query", error
        assert error["data"]["message"].startswith("session_id is empty; give <episode_id>.<token>")
        with c.websocket_connect(f"/ws?episode_token={token}") as ws:  # it started afresh too
            ws.send_json({"type": "state"})
            error = ws.receive_json()
        assert error["data"]["reason"] == "invalid_query", error
        assert error["data"]["message"].startswith("episode_token resumes an episode only beside "
                                                   "session_id=<episode_id>")
        with c.websocket_connect(f"/ws?session_id={episode_id}&episode_token={token}") as ws:
            ws.send_json({"type": "state"})
            assert ws.receive_json()["data"]["episode_id"] == episode_id


def test_numbers_in_query_strings_are_digits_as_on_the_ui_pages(sqlite_url):
    """Pydantic's int() read `step=1_0` as step 10, and `limit=+5` or `limit=5.0` as 5, where the
    web UI refuses them; a wrong type in a step's body was converted too."""
    with client(sqlite_url) as c:
        episode_id, token, _ = reset(c)
        for action in ACTIONS[:2]:
            step(c, episode_id, token, action)
        for path, query in (("/episodes", "limit=1_0"), ("/episodes", "limit=%2B5"),
                            ("/episodes", "offset=5.0"), (f"/episodes/{episode_id}/views", "step=1_0"),
                            (f"/episodes/{episode_id}/events", "from_version=%2B1"),
                            (f"/episodes/{episode_id}/events", "limit=%D9%A3")):  # Arabic-Indic 3
            r = c.get(f"{path}?{query}")
            assert r.status_code == 422, (path, query, r.text)
            assert "must be a whole number written in digits" in r.text, r.text
        assert c.get("/episodes?limit=%201").json()["limit"] == 1  # spaces around digits are fine
        assert c.get(f"/episodes/{episode_id}/views?step=1").json()["step"] == 1
        assert c.get("/episodes?limit=501").status_code == 422  # the range still holds
        r = c.post("/step", json={"episode_id": episode_id, "episode_token": token,
                                  "action": ACTIONS[2], "timeout_s": "1"})
        assert r.status_code == 422 and "timeout_s" in r.text, r.text
        assert c.get(f"/episodes/{episode_id}").json()["steps"] == 2  # nothing was applied


_NEWER = object()


def _judged_by_a_newer_release(store: EventStore, episode_id: str, copy: str, rules: object = _NEWER) -> None:
    """`copy`: the episode as a newer release would log it, judged by a rules version after ours
    (or by `rules`; a chain of digests as the store writes it, its token and agent kept)."""
    records = list(store.read_stream(episode_id))
    events = []
    for r in records:
        data = json.loads(r.data_json)
        if r.type == "EpisodeStarted":
            data["target"]["rules"] = max(RULES_VERSIONS) + 1 if rules is _NEWER else rules
        events.append(NewEvent(r.type, data, schema_version=r.schema_version, meta=r.meta))
    store.append(copy, events, None)


def test_an_episode_judged_by_rules_this_server_does_not_know_is_not_continued(sqlite_url):
    """A store shared with a newer release holds an episode judged by rules version 5: the server
    judged its next step by its own rules and logged it, and the log then held a "rules 5" episode
    those rules never judged (what an older release did to today's rules-4 episodes)."""
    with client(sqlite_url) as c:
        started = c.post("/reset", json={"seed": 7, "task": "expense_report", "chaos": "none"}).json()
        episode_id, token = started["metadata"]["episode_id"], started["metadata"]["episode_token"]
    with EventStore.open(sqlite_url) as store:
        _judged_by_a_newer_release(store, episode_id, "newer-release")
        before = store.stream_digest("newer-release")
    with client(sqlite_url) as c:
        listing = {"app": "ticketdesk", "method": "list_tickets", "params": {}}
        answer = c.post("/step", json={"episode_id": "newer-release", "episode_token": token,
                                       "action": listing})
        assert answer.status_code == 409, answer.text
        error = answer.json()
        assert error["code"] == "unknown_rules"
        assert f"judged by rules version {max(RULES_VERSIONS) + 1}, which this companyos does not know" in \
            error["detail"] and "upgrade companyos" in error["detail"]
        assert c.get("/health").status_code == 200  # and it keeps serving
    with EventStore.open(sqlite_url) as store:
        assert store.stream_digest("newer-release") == before  # nothing logged
    with CompanyEnv(sqlite_url) as env, pytest.raises(UnknownRules, match="upgrade companyos"):
        env.resume("newer-release")
    # and `verify`, which said ok, names it (the episode it was copied from is fine)
    from projections.verify import verify

    with EventStore.open(sqlite_url) as store:
        checked = verify(store, workers=1)
    assert list(checked.problems) == ["newer-release"]
    (problem,) = checked.problems["newer-release"]
    assert problem.startswith(f"judged by rules version {max(RULES_VERSIONS) + 1}, which this "
                              "companyos does not know") and "newer release's episode" in problem
    # a version that is no version is damage, not a newer release (4.0 and true passed as 4 and 1)
    wrong = {"float": 4.0, "true": True, "zero": 0, "null": None, "text": "5"}
    with EventStore.open(sqlite_url) as store:
        for name, rules in wrong.items():
            _judged_by_a_newer_release(store, episode_id, name, rules)
        checked = verify(store, workers=1)
    for name, rules in wrong.items():
        (problem,) = checked.problems[name]
        assert problem.startswith("EpisodeStarted names no rules version") and repr(rules) in problem, problem
        assert "newer release" not in problem
    # nor continued as if it were version 4 or 1: a damaged log, said so (a server: 500 log_damaged)
    with CompanyEnv(sqlite_url) as env:
        for name in wrong:
            with pytest.raises(CorruptCommit, match="which is no rules version"):
                env.resume(name)


def test_websocket_resume_after_restart(sqlite_url, tmp_path):
    with client(sqlite_url) as c, c.websocket_connect("/ws") as ws:
        ws.send_json({"type": "reset", "data": RESET})
        key = ws.receive_json()["data"]["metadata"]["session_id"]
        for action in ACTIONS[:2]:
            ws.send_json({"type": "step", "data": action})
            ws.receive_json()
    with client(sqlite_url) as c:
        with c.websocket_connect(f"/ws?session_id={key}") as ws:
            for action in ACTIONS[2:]:
                ws.send_json({"type": "step", "data": action})
                assert ws.receive_json()["type"] == "observation"
        with c.websocket_connect(f"/ws?session_id={key.rpartition('.')[0]}") as ws:
            assert ws.receive_json()["data"]["code"] == "SESSION_ERROR"  # no token
    episode_id = key.rpartition(".")[0]
    assert stream_digest(sqlite_url, episode_id) == digest_uninterrupted(tmp_path, ACTIONS)


def test_a_websocket_given_a_session_twice_is_refused_as_other_routes_refuse_it(sqlite_url):
    """`?session_id=x&session_id=<key>` resumed the first silently; every other route says 400."""
    with client(sqlite_url) as c:
        episode_id, token, _ = reset(c)
        with c.websocket_connect(f"/ws?session_id=nope&session_id={episode_id}.{token}") as ws:
            error = ws.receive_json()
        assert error["type"] == "error" and error["data"]["reason"] == "invalid_query", error
        assert "'session_id' is given more than once" in error["data"]["message"]


def test_a_plain_get_of_the_websocket_endpoint_says_to_upgrade(sqlite_url):
    """It was a bare 404, as if the server had no /ws."""
    with client(sqlite_url) as c:
        r = c.get("/ws")
    assert r.status_code == 426 and r.json()["code"] == "upgrade_required", r.text
    assert r.headers["upgrade"] == "websocket" and "WebSocket client" in r.json()["detail"]


def test_websocket_capacity(sqlite_url):
    with client(sqlite_url, max_sessions=1) as c, c.websocket_connect("/ws") as first:
        with c.websocket_connect("/ws") as second:
            error = second.receive_json()
            assert error["type"] == "error" and error["data"]["code"] == "CAPACITY_REACHED"
        first.send_json({"type": "reset", "data": RESET})
        assert first.receive_json()["type"] == "observation"


# -- MCP -------------------------------------------------------------------------------------


def rpc(c: TestClient, method: str, params: dict | None = None, headers: dict | None = None,
        path: str = "/mcp", id_: int | None = 1):
    message = {"jsonrpc": "2.0", "method": method, "params": params or {}}
    if id_ is not None:
        message["id"] = id_
    return c.post(path, json=message, headers=headers or {})


def test_mcp_session_flow(sqlite_url):
    with client(sqlite_url) as c:
        r = rpc(c, "initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                  "clientInfo": {"name": "t", "version": "0"}},
                path="/mcp?task=bug_escalation&seed=9&chaos=low")
        assert r.status_code == 200
        result = r.json()["result"]
        assert result["protocolVersion"] == "2025-06-18" and "tools" in result["capabilities"]
        assert "Goal" in result["instructions"]
        session = {"Mcp-Session-Id": r.headers["mcp-session-id"]}
        assert rpc(c, "notifications/initialized", headers=session, id_=None).status_code == 202
        tools = rpc(c, "tools/list", headers=session).json()["result"]["tools"]
        assert {"name", "description", "inputSchema"} <= set(tools[0])
        r = rpc(c, "tools/call", {"name": "ticketdesk_list_tickets", "arguments": {}},
                headers=session).json()["result"]
        assert r["isError"] is False and r["content"][0]["type"] == "text"
        assert r["structuredContent"]["metadata"]["step"] == 1
        r = rpc(c, "tools/call", {"name": "ticketdesk.frobnicate"}, headers=session).json()
        assert r["result"]["isError"] is True and r["result"]["structuredContent"]["reward"] < 0
        episode_id = session["Mcp-Session-Id"].rpartition(".")[0]
        state = c.get(f"/episodes/{episode_id}").json()
        assert state["task"] == "bug_escalation" and state["steps"] == 2
        bad = {"Mcp-Session-Id": f"{episode_id}.{'x' * 32}"}
        assert rpc(c, "tools/call", {"name": "datahub_list_metrics"}, headers=bad
                   ).json()["error"]["data"]["status"] == 403
        assert rpc(c, "tools/call", {"name": "datahub_list_metrics"},
                   headers={"Mcp-Session-Id": f"gone.{'x' * 32}"}).status_code == 404
        # clients cannot end a session that lives in the log: 405 (MCP's word for it), not a
        # 204 after which the session went on answering
        ended = c.delete("/mcp", headers=session)  # in words, as every other 405 (it had no body)
        assert ended.status_code == 405 and ended.json()["code"] == "method_not_allowed", ended.text
        assert "result" in rpc(c, "tools/call", {"name": "datahub_list_metrics"}, headers=session).json()


def test_mcp_plain_json_rpc(sqlite_url):
    with client(sqlite_url) as c:
        episode_id, token, _ = reset(c)
        r = rpc(c, "tools/call", {"name": "datahub.list_metrics", "episode_id": episode_id,
                                  "episode_token": token}).json()
        assert r["result"]["structuredContent"]["metadata"]["episode_id"] == episode_id
        headers = {"X-Episode-Id": episode_id, "X-Episode-Token": token}
        assert "result" in rpc(c, "tools/call", {"name": "ticketdesk_list_tickets"},
                               headers=headers).json()
        assert rpc(c, "tools/call", {"name": "ticketdesk_list_tickets"}).json()["error"]
        assert rpc(c, "nope/nothing").json()["error"]["code"] == -32601
        assert rpc(c, "ping").json()["result"] == {}
        for body in (b"{", b"[]", b"{}", b'{"jsonrpc": "1.0", "method": "x", "id": 1}', b"7"):
            r = c.post("/mcp", content=body, headers={"content-type": "application/json"})
            assert r.status_code == 200 and r.json()["jsonrpc"] == "2.0" and r.json()["error"]
        created = rpc(c, "openenv/session/create", {"seed": 3}).json()["result"]
        r = rpc(c, "tools/call", {"name": "datahub_list_metrics",
                                  "session_id": created["session_id"]}).json()
        assert r["result"]["structuredContent"]["metadata"]["episode_id"] == created["episode_id"]


# -- the episode log -------------------------------------------------------------------------


def test_episode_log(sqlite_url):
    with client(sqlite_url) as c:
        episode_id, token, _ = reset(c, seed=21, task="license_renewal", agent="tester")
        for action in ACTIONS[:3]:
            step(c, episode_id, token, action)
        for seed in range(3):
            reset(c, seed=seed, task="handbook_update")
        listing = c.get("/episodes", params={"limit": 2}).json()
        assert listing["total"] == 4 and len(listing["episodes"]) == 2 and listing["next_offset"] == 2
        page2 = c.get("/episodes", params={"limit": 2, "offset": 2}).json()
        assert page2["next_offset"] is None
        assert episode_id in {e["episode_id"] for e in page2["episodes"]}  # newest first
        only = c.get("/episodes", params={"agent": "tester"}).json()["episodes"]
        assert [e["episode_id"] for e in only] == [episode_id] and only[0]["steps"] == 3
        assert c.get("/episodes", params={"task": "handbook_update"}).json()["total"] == 3
        assert c.get("/episodes", params={"outcome": "running"}).json()["total"] == 4
        summary = c.get(f"/episodes/{episode_id}").json()
        assert summary["task"] == "license_renewal" and summary["steps"] == 3 and summary["digest"]
        events = c.get(f"/episodes/{episode_id}/events", params={"limit": 5}).json()
        assert [e["version"] for e in events["events"]] == [0, 1, 2, 3, 4]
        assert events["events"][0]["type"] == "EpisodeStarted"
        assert "token_sha256" not in events["events"][0]["meta"]
        rest = c.get(f"/episodes/{episode_id}/events",
                     params={"from_version": events["next_from_version"], "limit": 1000}).json()
        assert rest["next_from_version"] is None
        assert events["total"] == 5 + len(rest["events"])
        views = c.get(f"/episodes/{episode_id}/views", params={"step": 1}).json()
        assert views["step"] == 1 and {"ticketdesk", "datahub", "approvalflow"} <= set(views)
        assert c.get(f"/episodes/{episode_id}/views").json()["step"] == 3


def test_rerun_proves_determinism_and_finds_an_event_altered_in_the_log(sqlite_url):
    with client(sqlite_url) as c:
        episode_id, token, _ = reset(c)
        for action in ACTIONS[:3]:
            assert step(c, episode_id, token, action).status_code == 200
        result = c.get(f"/episodes/{episode_id}/rerun").json()
        summary = c.get(f"/episodes/{episode_id}").json()
        assert result["match"] is True and result["first_difference"] is None
        assert result["rerun_digest"] == result["stored_digest"] == summary["digest"]
        assert result["actions"] == 3 and result["rules"] == summary["rules"] == CURRENT_RULES
        assert result["rerun_events"] == result["stored_events"] == summary["events"]
        missing = c.get("/episodes/no-such-episode/rerun")
        assert missing.status_code == 404 and missing.json()["code"] == "episode_not_found"
    engine = sa.create_engine(sqlite_url)
    altered = tamper.versions_of_type(engine, episode_id, "ActionTaken")[1]
    tamper.edit_event(engine, episode_id, altered, "data", lambda data: data.replace('"step":2', '"step":7'))
    engine.dispose()
    with client(sqlite_url) as c:
        result = c.get(f"/episodes/{episode_id}/rerun").json()
    assert result["match"] is False and result["first_difference"] == altered
    assert result["stored"]["data"]["step"] == 7 and result["rerun"]["data"]["step"] == 2
    assert any("stored content was altered" in note for note in result["notes"])


def _unreadable_commit(engine: sa.Engine, episode_id: str) -> None:
    position = tamper.stream_commits(engine, episode_id)[0][0]
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE commits SET payload = '{' WHERE position = :p"),
                     {"p": position})


def _undecodable_event(engine: sa.Engine, episode_id: str) -> None:
    """The commit unpacks, but one event is no domain event: it used to be a bare 500."""
    version = tamper.versions_of_type(engine, episode_id, "ActionTaken")[0]
    tamper.edit_event(engine, episode_id, version, "type", lambda _: "Bogus")


def _truncated_data(engine: sa.Engine, episode_id: str) -> None:
    """An event whose data is no longer JSON: /events was a plain-text 500, /episodes/{id} a 404."""
    version = tamper.versions_of_type(engine, episode_id, "RewardGranted")[0]
    tamper.edit_event(engine, episode_id, version, "data", lambda data: data[:5])


def _first_commit_deleted(engine: sa.Engine, episode_id: str) -> None:
    """The episode's start is gone: /episodes/{id} and /rerun said there was no such episode."""
    tamper.delete_commit(engine, tamper.stream_commits(engine, episode_id)[0][0])


def test_an_action_edited_past_its_effects_is_log_damaged_in_the_views_and_the_cli(sqlite_url, capsys,
                                                                                  monkeypatch):
    """An ActionTaken rewritten to name a ticket its stored effects never saw folded into a
    KeyError: a plain-text 500 for the views, a traceback for `companyos replay`."""
    from companyos import cli

    with client(sqlite_url) as c:
        episode_id, token, _ = reset(c)
        assert step(c, episode_id, token, ACTIONS[0]).status_code == 200
    engine = sa.create_engine(sqlite_url)
    version = tamper.versions_of_type(engine, episode_id, "ActionTaken")[0]
    tamper.edit_event(engine, episode_id, version, "data", lambda data: data.replace(
        '"method":"list_tickets","params":{}', '"method":"get_ticket","params":{"ticket_id":"T-99999"}'))
    engine.dispose()
    with client(sqlite_url) as c:
        for url in (f"/episodes/{episode_id}/views", f"/episodes/{episode_id}/views?step=1"):
            response = c.get(url)
            assert response.status_code == 500 and response.json()["code"] == "log_damaged", response.text
            assert f"version {version}" in response.json()["detail"]
    monkeypatch.setattr("sys.argv", ["companyos", "replay", episode_id, "--step", "1", "--db", sqlite_url])
    with pytest.raises(SystemExit) as ended:
        cli.main()
    said = capsys.readouterr().err
    assert ended.value.code == 1 and said.startswith("error: ") and "Traceback" not in said, said
    assert f"the event at version {version}" in said and "does not agree" in said


@pytest.mark.parametrize("damage", [_unreadable_commit, _undecodable_event, _truncated_data,
                                    _first_commit_deleted])
def test_a_damaged_commit_is_a_500_that_names_it_and_the_server_keeps_serving(sqlite_url, damage):
    with client(sqlite_url) as c:
        episode_id, token, _ = reset(c)
        assert step(c, episode_id, token, ACTIONS[0]).status_code == 200
        healthy, healthy_token, _ = reset(c, seed=12, task="bug_escalation", chaos="low")
    engine = sa.create_engine(sqlite_url)
    damage(engine, episode_id)
    engine.dispose()
    with client(sqlite_url) as c:  # a fresh server: the episode is read from the log
        urls = [f"/episodes/{episode_id}/views"]
        if damage is not _undecodable_event:  # an unknown type leaves the summary foldable
            urls.append(f"/episodes/{episode_id}")
        if damage in (_unreadable_commit, _truncated_data):
            urls.append(f"/episodes/{episode_id}/events")
        for response in (step(c, episode_id, token, ACTIONS[1]), *map(c.get, urls)):
            assert response.status_code == 500, (response.request.url, response.text)
            assert response.json()["code"] == "log_damaged"
            assert episode_id in response.json()["detail"] and "verify" in response.json()["detail"]
        if damage is _first_commit_deleted:  # as `companyos rerun` says: a mismatch, not "no episode"
            rerun = c.get(f"/episodes/{episode_id}/rerun")
            assert rerun.status_code == 200 and rerun.json()["match"] is False
            # pages are by stream version, gap or not (list positions were taken for versions)
            page = c.get(f"/episodes/{episode_id}/events", params={"from_version": 0, "limit": 1}).json()
            first = page["events"][0]["version"]
            assert first > 0 and page["next_from_version"] == first + 1
            page = c.get(f"/episodes/{episode_id}/events", params={"from_version": first + 1}).json()
            assert page["events"][0]["version"] == first + 1
        assert step(c, healthy, healthy_token, ACTIONS[0]).status_code == 200


def test_an_agent_label_with_control_characters_is_refused_and_listings_go_on(store_url):
    """On PostgreSQL a NUL in an agent label could not enter the episodes read model: every
    later listing was a 500, for every client. Now the label is refused in words, as is a
    listing filter holding one, on both backends."""
    with client(store_url) as c:
        for label in ("a\u0000b", "two\nlines"):
            r = c.post("/reset", json={"seed": 1, "agent": label})
            assert r.status_code == 400 and "control characters" in r.json()["detail"]
        r = c.get("/episodes", params={"agent": "a\u0000b"})
        assert r.status_code == 400 and "control characters" in r.json()["detail"]
        assert c.get("/episodes").status_code == 200
    with pytest.raises(ValueError, match="control characters"):
        CompanyEnv(store_url, agent="a\u0000b")


def test_a_body_sent_without_a_json_content_type_is_told_so(sqlite_url):
    """FastAPI leaves such a body unparsed and said 'Input should be a valid dictionary'."""
    with client(sqlite_url) as c:
        for headers in ({"content-type": "text/plain"}, {}):
            r = c.post("/reset", content=b'{"seed": 1}', headers=headers)
            assert r.status_code == 422
            assert r.json()["detail"][0]["msg"] == ("the body must be JSON, sent with "
                                                    "Content-Type: application/json")
        r = c.post("/reset", content=b'{"seed": 1}',
                   headers={"content-type": "application/vnd.api+json"})
        assert r.status_code == 200


def test_an_action_too_big_for_the_log_is_a_413_when_the_body_limit_lets_it_in(sqlite_url):
    """A server started with a body limit over the log's 1 MiB used to answer 500 and drop the
    connection; the episode goes on as if the action had not been sent."""
    huge = {"app": "ticketdesk", "method": "add_comment",
            "params": {"ticket_id": "T-101", "text": "x" * 1_500_000}}
    with client(sqlite_url, max_body_bytes=4 << 20) as c:
        episode_id, token, _ = reset(c)
        r = step(c, episode_id, token, huge)
        assert r.status_code == 413 and r.json()["code"] == "action_too_large", r.text
        assert "an action is at most" in r.json()["detail"]
        r = step(c, episode_id, token, {"app": "ticketdesk", "method": "list_tickets", "params": {}})
        assert r.status_code == 200
        state = c.get("/state", params={"episode_id": episode_id, "episode_token": token}).json()
        assert state["step_count"] == 1


def test_openenv_tool_envelopes_log_the_same_steps_over_http_and_websocket(sqlite_url):
    """MCPToolClient's `list_tools`/`call_tool` payloads are read alike on both transports; a
    payload with `app` and `method` is an action whatever else it holds."""
    payloads = [{"type": "list_tools"},
                {"type": "call_tool", "tool_name": "ticketdesk_list_tickets", "arguments": {}},
                {"app": "ticketdesk", "method": "list_tickets", "params": {}, "type": "list_tools"}]
    with client(sqlite_url) as c:
        episode_id, token, _ = reset(c)
        replies = [step(c, episode_id, token, p).json() for p in payloads]
        assert len(replies[0]["observation"]["tools"]) >= 14 and "metadata" not in replies[0]
        assert replies[2]["metadata"]["step"] == 2
        over_http = c.get(f"/episodes/{episode_id}").json()
        with c.websocket_connect("/ws") as ws:
            ws.send_json({"type": "reset", "data": RESET})
            ws_episode = ws.receive_json()["data"]["metadata"]["episode_id"]
            for p in payloads:
                ws.send_json({"type": "step", "data": p})
                ws.receive_json()
        over_ws = c.get(f"/episodes/{ws_episode}").json()
    assert over_http["steps"] == over_ws["steps"] == 2 and over_http["digest"] == over_ws["digest"]


def test_an_integer_past_64_bits_logs_what_it_logs_in_process(sqlite_url, tmp_path):
    """orjson would read it as a float (digits lost); the stdlib, and so a caller in process,
    keeps the integer: the same body is the same action on every path."""
    raw = b'{"app": "ticketdesk", "method": "get_ticket", "params": {"ticket_id": 18446744073709551616}}'
    action = json.loads(raw)
    with client(sqlite_url) as c:
        episode_id, token, _ = reset(c)
        body = b'{"episode_id": "%s", "action": %s}' % (episode_id.encode(), raw)
        r = c.post("/step", content=body, headers={"X-Episode-Token": token,
                                                    "content-type": "application/json"})
        assert r.status_code == 200 and "18446744073709551616" in r.json()["observation"]["message"]
        r = c.post("/step", content=body.replace(b"18446744073709551616", b"1e400"),
                   headers={"X-Episode-Token": token, "content-type": "application/json"})
        assert r.status_code == 422 and "infinity" in r.text
    assert stream_digest(sqlite_url, episode_id) == digest_uninterrupted(tmp_path, [action])


@pytest.mark.parametrize("label, said", [("(unknown)", "episodes without an agent label"),
                                         (" padded ", "begin or end with spaces")])
def test_an_agent_label_the_analytics_could_not_tell_apart_is_refused(sqlite_url, label, said):
    """`(unknown)` is the analytics' name for unlabelled episodes (an agent so named was merged
    with them), and analytics parameters are stripped (` padded ` could never be asked for)."""
    with client(sqlite_url) as c:
        r = c.post("/reset", json={"seed": 1, "agent": label})
        assert r.status_code == 400 and said in r.json()["detail"]
        assert c.get("/episodes").json()["total"] == 0
    with pytest.raises(ValueError, match=said):
        CompanyEnv(sqlite_url, agent=label)


def test_the_action_schema_accepts_exactly_the_calls_without_params_the_environment_does():
    """The schema did not require `params` of a tool that needs some, and refused `"params": null`,
    which the environment reads as no parameters."""
    from jsonschema import Draft202012Validator

    from api import catalog
    from domain import TOOLS
    from domain.tools import Invalid, parse_action

    validator = Draft202012Validator(catalog.action_schema())
    for tool in TOOLS:
        for extra in ({}, {"params": None}, {"params": {}}):
            action = {"app": tool.app, "method": tool.method, **extra}
            accepted = not isinstance(parse_action(action), Invalid)
            assert validator.is_valid(action) == accepted, (tool.name, extra)


def test_an_episode_id_holding_a_dot_is_named_by_every_route(sqlite_url):
    """`run.<32 hex digits>` ends like a token, so the MCP params and a WebSocket resume read it as
    `<episode_id>.<token>` and answered "no episode 'run'"."""
    episode_id = "run.0123456789abcdef0123456789abcdef"
    with client(sqlite_url) as c:
        _, token, _ = reset(c, **RESET, episode_id=episode_id)
        r = rpc(c, "tools/call", {"name": "ticketdesk_list_tickets", "arguments": {},
                                  "episode_id": episode_id, "episode_token": token})
        assert r.json()["result"]["structuredContent"]["metadata"]["step"] == 1, r.text
        r = rpc(c, "tools/call", {"name": "ticketdesk_list_tickets", "arguments": {},
                                  "session_id": f"{episode_id}.{token}"})
        assert r.json()["result"]["structuredContent"]["metadata"]["step"] == 2, r.text
        with c.websocket_connect(f"/ws?session_id={episode_id}&episode_token={token}") as ws:
            ws.send_json({"type": "step", "data": ACTIONS[1]})
            assert ws.receive_json()["data"]["metadata"]["step"] == 3
        r = rpc(c, "tools/call", {"name": "ticketdesk_list_tickets", "arguments": {},
                                  "episode_id": "nowhere.0123456789abcdef0123456789abcdef",
                                  "episode_token": token})
        assert r.json()["error"]["data"]["code"] == "episode_not_found"
        r = rpc(c, "tools/call", {"name": "ticketdesk_list_tickets", "arguments": {},
                                  "episode_id": episode_id})  # the id alone: its token is wanted
        assert r.json()["error"]["data"]["code"] == "token_required", r.text
        # an episode named like the id's first part does not stand in the way of the dotted one
        reset(c, **RESET, episode_id="run")
        r = rpc(c, "tools/call", {"name": "ticketdesk_list_tickets", "arguments": {},
                                  "episode_id": episode_id, "episode_token": token})
        assert r.json()["result"]["structuredContent"]["metadata"]["step"] == 4, r.text
        r = rpc(c, "tools/call", {"name": "ticketdesk_list_tickets", "arguments": {},
                                  "episode_id": episode_id})
        assert r.json()["error"]["data"]["code"] == "token_required", r.text
        # a session id too long to be an id is still an unknown session (404: initialize again)
        unknown = rpc(c, "tools/list", headers={"Mcp-Session-Id": "x" * 100 + "." + "A" * 32})
        called = rpc(c, "tools/call", {"name": "ticketdesk_list_tickets", "arguments": {}},
                     headers={"Mcp-Session-Id": "x" * 100 + "." + "A" * 32})
        assert unknown.status_code == 200 and called.status_code == 404, called.text


def test_a_store_that_fails_mid_episode_is_a_503_in_words_and_the_episode_goes_on(sqlite_url, monkeypatch,
                                                                                    caplog):
    """A lost PostgreSQL connection (simulated: the append raises the driver's OperationalError)
    was a bare "Internal Server Error" over HTTP and a WebSocket closed with no frame."""

    real_append = EventStore.append_head
    failing = {"on": False}

    def append_head(self, *args, **kwargs):
        if failing["on"]:
            raise sa.exc.OperationalError("INSERT INTO commits ...", {}, Exception(
                "server closed the connection unexpectedly\n\tThis probably means ..."))
        return real_append(self, *args, **kwargs)

    monkeypatch.setattr(EventStore, "append_head", append_head)
    with client(sqlite_url) as c:
        episode_id, token, _ = reset(c)
        failing["on"] = True
        server_log = logging.getLogger("uvicorn.error")  # a live server earlier may have stopped
        server_log.addHandler(caplog.handler)  # its propagation to the root: listen on it directly
        try:
            r = step(c, episode_id, token, ACTIONS[0])
        finally:
            server_log.removeHandler(caplog.handler)
        assert r.status_code == 503 and r.json()["code"] == "store_unavailable", r.text
        assert r.json()["detail"].startswith("the store's database failed")
        assert r.headers["retry-after"] == "1"
        assert "server closed the connection" not in r.text  # the driver's words are the log's
        assert "server closed the connection" in caplog.text
        failing["on"] = False
        assert step(c, episode_id, token, ACTIONS[0]).json()["metadata"]["step"] == 1  # not applied
        _ws_step_refused_then_taken(c, failing)



def test_a_store_that_fails_under_an_mcp_call_is_a_json_rpc_error_and_the_session_goes_on(sqlite_url,
                                                                                            monkeypatch):
    """MCP's transport wants a JSON-RPC answer to every request: an HTTP 503 with the API's JSON
    made the MCP SDK's client end its whole session, with the words lost."""
    real_append = EventStore.append_head
    failing = {"on": False}

    def append_head(self, *args, **kwargs):
        if failing["on"]:
            raise sa.exc.OperationalError("INSERT INTO commits ...", {}, Exception("terminated"))
        return real_append(self, *args, **kwargs)

    monkeypatch.setattr(EventStore, "append_head", append_head)
    call = {"name": "datahub_list_metrics", "arguments": {}}
    with client(sqlite_url) as c:
        r = rpc(c, "initialize", {"protocolVersion": "2025-06-18"}, path="/mcp?seed=3")
        session = {"Mcp-Session-Id": r.headers["mcp-session-id"]}
        failing["on"] = True
        r = rpc(c, "tools/call", call, headers=session, id_=7)
        assert r.status_code == 200 and r.json()["id"] == 7, r.text
        assert r.json()["error"]["data"] == {"status": 503, "code": "store_unavailable"}
        assert r.json()["error"]["message"].startswith("the store's database failed")
        failing["on"] = False
        r = rpc(c, "tools/call", call, headers=session, id_=8)
        assert r.json()["result"]["structuredContent"]["metadata"]["step"] == 1  # not applied before


def test_mcp_batches_responses_null_ids_and_protocol_versions_follow_the_spec(sqlite_url):
    """MCP 2025-03-26, which the server agrees to, has JSON-RPC batches (they were refused); a
    client's response is acknowledged (202), not "Invalid Request"; a null id is refused (MCP);
    an MCP-Protocol-Version the server does not speak is a 400; over the WebSocket a notification
    got a "response" without an id."""
    with client(sqlite_url) as c:
        r = rpc(c, "initialize", {"protocolVersion": "2025-03-26"}, path="/mcp?seed=5")
        assert r.json()["result"]["protocolVersion"] == "2025-03-26"
        session = {"Mcp-Session-Id": r.headers["mcp-session-id"]}
        batch = [{"jsonrpc": "2.0", "method": "notifications/initialized"},
                 {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                  "params": {"name": "datahub_list_metrics", "arguments": {}}},
                 {"jsonrpc": "2.0", "id": "two", "method": "ping"},
                 {"jsonrpc": "2.0", "id": 3, "method": "nope"}]
        r = c.post("/mcp", json=batch, headers=session)
        assert r.status_code == 200, r.text
        answers = r.json()
        assert [a["id"] for a in answers] == [1, "two", 3]
        assert answers[0]["result"]["structuredContent"]["metadata"]["step"] == 1
        assert answers[1]["result"] == {} and answers[2]["error"]["code"] == -32601
        only_notes = [{"jsonrpc": "2.0", "method": "notifications/initialized"}]
        assert c.post("/mcp", json=only_notes, headers=session).status_code == 202
        r = c.post("/mcp", json=[{"jsonrpc": "2.0", "id": 9, "method": "initialize", "params": {}}])
        assert "initialize must not be part of a JSON-RPC batch" in r.json()["error"]["message"]
        # 5,000 tools/list in 250 KB were answered with 25 MB: a batch holds a thousand at most
        pings = [{"jsonrpc": "2.0", "id": i, "method": "tools/list"} for i in range(1001)]
        r = c.post("/mcp", json=pings, headers=session)
        assert r.json()["error"]["code"] == -32600, r.text
        assert r.json()["error"]["message"] == ("a JSON-RPC batch of 1001 messages; this server "
                                                "answers at most 1000 in one batch")
        assert len(c.post("/mcp", json=pings[:1000], headers=session).json()) == 1000
        for response in ({"jsonrpc": "2.0", "id": 7, "result": {}},
                         {"jsonrpc": "2.0", "id": 7, "error": {"code": 1, "message": "x"}}):
            r = c.post("/mcp", json=response, headers=session)
            assert r.status_code == 202 and r.content == b""
        r = c.post("/mcp", json={"jsonrpc": "2.0", "id": None, "method": "tools/call",
                                 "params": {"name": "datahub_list_metrics"}}, headers=session)
        assert r.json()["error"]["code"] == -32600 and "never null" in r.json()["error"]["message"]
        r = c.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "ping"},
                   headers={**session, "MCP-Protocol-Version": "1999-01-01"})
        assert r.status_code == 400 and "1999-01-01" in r.json()["error"]["message"]
        episode = session["Mcp-Session-Id"].split(".")[0]
        assert c.get(f"/episodes/{episode}").json()["steps"] == 1  # the batch's one call, nothing else
        with c.websocket_connect("/ws") as ws:
            ws.send_json({"type": "mcp", "data": {"jsonrpc": "2.0", "method": "notifications/initialized"}})
            ws.send_json({"type": "mcp", "data": {"jsonrpc": "2.0", "id": 1, "method": "ping"}})
            assert ws.receive_json()["data"] == {"jsonrpc": "2.0", "id": 1, "result": {}}  # no frame before
            ws.send_json({"type": "mcp", "data": pings})
            assert "answers at most 1000 in one batch" in ws.receive_json()["data"]["error"]["message"]


def _ws_step_refused_then_taken(c: TestClient, failing: dict) -> dict:
    """A WebSocket step while `failing["on"]` is refused as 503 `store_unavailable` in a frame, and
    the same socket's next step, the failure gone, is step 1 (nothing was applied); the frame."""
    with c.websocket_connect("/ws") as ws:
        ws.send_json({"type": "reset", "data": RESET})
        ws.receive_json()
        failing["on"] = True
        ws.send_json({"type": "step", "data": ACTIONS[0]})
        refused = ws.receive_json()["data"]
        assert (refused["reason"], refused["status"]) == ("store_unavailable", 503), refused
        failing["on"] = False
        ws.send_json({"type": "step", "data": ACTIONS[0]})  # the same socket goes on
        assert ws.receive_json()["data"]["metadata"]["step"] == 1
    return refused

def test_ready_says_whether_the_store_answers_while_health_says_the_process_lives(sqlite_url,
                                                                                 monkeypatch):
    """A load balancer takes a server out of rotation on /ready's 503 and back on its 200; both
    probes come without the API key."""
    real = EventStore.last_position
    down = {"on": False}

    def last_position(self):
        if down["on"]:
            raise sa.exc.OperationalError("SELECT max(position) ...", {}, Exception("connection refused"))
        return real(self)

    monkeypatch.setattr(EventStore, "last_position", last_position)
    with client(sqlite_url, api_key="sekret") as c:
        before = c.get("/ready")
        assert before.status_code == 200 and before.json()["status"] == "ready", before.text
        auth = {"Authorization": "Bearer sekret"}
        assert c.post("/reset", json=RESET, headers=auth).status_code == 200
        assert c.get("/ready?probe=1").json()["position"] > before.json()["position"]
        down["on"] = True
        r = c.get("/ready")
        assert r.status_code == 503 and r.json()["code"] == "store_unavailable", r.text
        assert r.headers["retry-after"] == "1" and "connection refused" not in r.text
        assert c.get("/health").json() == {"status": "healthy"}
        down["on"] = False
        assert c.get("/ready").status_code == 200


def test_ready_answers_503_in_bounded_time_while_the_database_hangs(sqlite_url, monkeypatch):
    """A hung database (a partition, a lock held) kept /ready waiting as long as it did, or made
    it a 500 once the pool gave up; probes then piled up a thread each."""
    import time

    import api.readiness

    monkeypatch.setattr(api.readiness, "READY_TIMEOUT_S", 0.2)
    real = EventStore.last_position
    calls, returned, release = [], [], threading.Event()

    def hung(self):
        calls.append(1)
        release.wait(30)
        returned.append(1)
        return real(self)

    monkeypatch.setattr(EventStore, "last_position", hung)
    said = []
    heard = logging.Handler()
    heard.emit = lambda record: said.append(record.getMessage())
    server_log = logging.getLogger("uvicorn.error")
    with client(sqlite_url) as c:
        server_log.addHandler(heard)
        try:
            for _ in range(3):
                r = c.get("/ready")
                assert r.status_code == 503 and r.json()["code"] == "store_unavailable", r.text
                assert r.headers["retry-after"] == "1"
        finally:
            server_log.removeHandler(heard)
        assert returned == [] and len(calls) == 1  # answered while the one check still hangs
        assert len(said) == 1 and said[0].startswith("not ready"), said  # said once, not per probe
        release.set()
        for _ in range(50):  # the hung check returns; the next probe starts a fresh one
            if c.get("/ready").status_code == 200:
                break
            time.sleep(0.05)
        assert c.get("/ready").json()["status"] == "ready"


def test_a_step_behind_a_stopped_sqlite_writer_is_a_503_not_a_hang(sqlite_url, tmp_path, monkeypatch):
    """Another writer process suspended while it holds `<db>-writer.lock` kept /step waiting for
    ever. After SQLite's busy timeout (shortened here) the step is answered 503
    `store_unavailable`, nothing applied; once the lock is let go, the same step is step 1."""
    import fcntl

    from eventstore import engine

    monkeypatch.setattr(engine, "SQLITE_BUSY_TIMEOUT_MS", 300)
    with client(sqlite_url) as c:
        episode_id, token, _ = reset(c)
        with open(f"{tmp_path / 'store.db'}-writer.lock", "a+") as held:
            fcntl.flock(held.fileno(), fcntl.LOCK_EX)
            r = step(c, episode_id, token, ACTIONS[0])
            assert r.status_code == 503 and r.json()["code"] == "store_unavailable", r.text
            assert c.get("/health").status_code == 200
        r = step(c, episode_id, token, ACTIONS[0])
        assert r.status_code == 200 and r.json()["metadata"]["step"] == 1, r.text


def test_a_pool_that_gives_up_waiting_is_an_outage_not_a_bug(sqlite_url, monkeypatch):
    """Every pooled PostgreSQL connection busy past pool_timeout (sqlalchemy's TimeoutError) was
    a 500 that trainers read as a server bug; it is a 503 they retry."""
    from api.episodes import EpisodeLog

    def exhausted(self, **kwargs):
        raise sa.exc.TimeoutError("QueuePool limit of size 8 overflow 32 reached")

    monkeypatch.setattr(EpisodeLog, "list", exhausted)
    with client(sqlite_url) as c:
        r = c.get("/episodes")
        assert r.status_code == 503 and r.json()["code"] == "store_unavailable", r.text


@pytest.mark.parametrize("holder", ["another companyos process", "a plain sqlite3 writer"])
def test_a_websocket_step_waiting_for_the_sqlite_write_lock_does_not_freeze_the_worker(
        sqlite_url, tmp_path, holder):
    """SQLite steps run inline on the event loop: one that waited for another writer (up to the
    60 s busy timeout) froze every socket of the worker, /health included."""
    import fcntl
    import sqlite3

    path = str(tmp_path / "store.db")
    with client(sqlite_url) as c, c.websocket_connect("/ws") as ws:
        ws.send_json({"type": "reset", "data": RESET})
        ws.receive_json()
        if holder == "another companyos process":  # it queues on the writers' lock file
            held = open(f"{path}-writer.lock", "a+")  # noqa: SIM115 - released below
            fcntl.flock(held.fileno(), fcntl.LOCK_EX)
            release = lambda: fcntl.flock(held.fileno(), fcntl.LOCK_UN)  # noqa: E731
        else:  # the sqlite3 shell, say: it takes SQLite's own write lock only
            held = sqlite3.connect(path, isolation_level=None)
            held.execute("BEGIN IMMEDIATE")
            release = lambda: held.execute("ROLLBACK")  # noqa: E731
        released, entered, answers = threading.Event(), threading.Event(), []
        real_append = SqliteBackend.append

        def append(self, *args, **kwargs):
            entered.set()
            return real_append(self, *args, **kwargs)

        def let_go() -> None:
            if not released.is_set():
                released.set()
                release()

        stepping = threading.Thread(target=lambda: (ws.send_json({"type": "step", "data": ACTIONS[0]}),
                                                    answers.append(ws.receive_json())))
        safety_net = threading.Timer(10, let_go)  # the old code waited until the lock was let go
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(SqliteBackend, "append", append)
            safety_net.start()
            stepping.start()
            try:
                assert entered.wait(10)  # the step is waiting for the lock now
                for _ in range(3):
                    assert c.get("/health").status_code == 200
                assert not released.is_set() and answers == []  # answered while the step waits
            finally:
                safety_net.cancel()
                let_go()
                stepping.join(30)
                held.close()
        assert answers and answers[0]["data"]["metadata"]["step"] == 1, answers  # then it is logged


def test_a_step_retried_off_the_loop_is_still_a_conflict_if_another_worker_stepped_meanwhile(
        sqlite_url):
    """A WebSocket step that found the write lock held dropped its cached episode, and its retry
    reloaded the log: a step another worker logged in between was silently built upon."""
    from eventstore import WriterBusy
    from eventstore.backends import WAIT_FOR_WRITERS

    a, b = create_app(ServerConfig(db=sqlite_url)), create_app(ServerConfig(db=sqlite_url))
    with TestClient(a) as ca, TestClient(b) as cb, ca.websocket_connect("/ws") as ws:
        ws.send_json({"type": "reset", "data": RESET})
        meta = ws.receive_json()["data"]["metadata"]
        episode_id, token = meta["episode_id"], meta["episode_token"]
        real_append, other = SqliteBackend.append, []

        def append(self, *args, **kwargs):
            if not WAIT_FOR_WRITERS.get() and not other and self is a.server.store._backend:
                other.append(step(cb, episode_id, token, ACTIONS[1]))  # worker B, in between
                raise WriterBusy("another process is writing")
            return real_append(self, *args, **kwargs)

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(SqliteBackend, "append", append)
            ws.send_json({"type": "step", "data": ACTIONS[0]})
            answer = ws.receive_json()["data"]
        assert other[0].status_code == 200 and other[0].json()["metadata"]["step"] == 1
        assert answer.get("reason") == "conflict" and answer.get("status") == 409, answer
        events = cb.get(f"/episodes/{episode_id}/events").json()["events"]
        assert sum(e["type"] == "ActionTaken" for e in events) == 1  # worker B's step alone


def test_a_step_that_outlives_the_servers_store_is_a_503_not_the_actions_fault(sqlite_url):
    """At shutdown a queued step met the closed store, whose error (then a ValueError) was
    answered as 413 action_too_large."""
    with client(sqlite_url) as c:
        episode_id, token, _ = reset(c)
        c.app.server.store.close()  # as the server's shutdown does under a step still queued
        r = step(c, episode_id, token, ACTIONS[0])
        assert r.status_code == 503 and r.json()["code"] == "store_unavailable", r.text


def test_only_an_outage_is_a_503_and_a_page_asks_as_a_page(sqlite_url, monkeypatch):
    """A constraint or bad SQL is a bug: a 500, not a "try again" a client would retry forever;
    the UI answers an outage with its HTML error page, not JSON."""
    from api.episodes import EpisodeLog

    def broken(error):
        def listing(self, **kwargs):
            raise error("SELECT ...", {}, Exception("no such column: bogus"))
        return listing

    monkeypatch.setattr(EpisodeLog, "list", broken(sa.exc.OperationalError))
    with TestClient(create_app(ServerConfig(db=sqlite_url))) as c:
        page = c.get("/ui")
        assert page.status_code == 503 and page.headers["content-type"].startswith("text/html")
        assert "database failed" in page.text
        assert c.get("/episodes").json()["code"] == "store_unavailable"
    monkeypatch.setattr(EpisodeLog, "list", broken(sa.exc.ProgrammingError))
    with TestClient(create_app(ServerConfig(db=sqlite_url)), raise_server_exceptions=False) as c:
        assert c.get("/episodes").status_code == 500


@pytest.mark.parametrize("wrapped", [False, True], ids=["the driver's own", "SQLAlchemy's"])
def test_a_prepared_statement_a_pooler_lost_is_a_503_that_names_the_fix(sqlite_url, monkeypatch, wrapped):
    """Behind PgBouncer's transaction pooling, without `?prepare_threshold=none` in the server's
    store URL, a step failed with a 500 that read as a server bug; it is a 503 whose words name
    the fix, and a WebSocket step gets them in its error frame and keeps its socket."""
    import psycopg

    lost = psycopg.errors.InvalidSqlStatementName('prepared statement "_pg3_0" does not exist')
    failing = {"on": False}
    real_append = EventStore.append_head

    def append_head(self, *args, **kwargs):
        if failing["on"]:
            raise sa.exc.ProgrammingError("INSERT INTO commits ...", {}, lost) if wrapped else lost
        return real_append(self, *args, **kwargs)

    monkeypatch.setattr(EventStore, "append_head", append_head)
    fix = "add ?prepare_threshold=none to the store's URL"
    with client(sqlite_url) as c:
        episode_id, token, _ = reset(c)
        failing["on"] = True
        r = step(c, episode_id, token, ACTIONS[0])
        assert r.status_code == 503 and r.json()["code"] == "store_unavailable", r.text
        assert fix in r.json()["detail"] and r.headers["retry-after"] == "1"
        failing["on"] = False
        assert fix in _ws_step_refused_then_taken(c, failing)["message"]


def test_the_api_docs_page_needs_nothing_from_the_internet(sqlite_url):
    """/docs loaded Swagger UI from a CDN: offline, the UI's "API docs" link opened a blank page.
    Every script and style it names is served here now (Swagger UI 5, which reads OpenAPI 3.1)."""
    import re

    with client(sqlite_url) as c:
        page = c.get("/docs")
        assert page.status_code == 200
        assets = re.findall(r'(?:src|href)="([^"]+)"', page.text)
        assert {a.rsplit(".", 1)[-1] for a in assets} >= {"js", "css"}
        assert all(a.startswith("/docs/assets/") for a in assets), assets
        script = c.get(next(a for a in assets if a.endswith(".js")))
        assert script.status_code == 200 and b"SwaggerUIBundle" in script.content
        assert re.search(rb'version:"5\.\d+\.\d+"|swagger-ui@5|"5\.\d+\.\d+"', script.content)
        assert c.get("/openapi.json").json()["openapi"].startswith("3.1")
        redoc = c.get("/redoc").text
        (script,) = re.findall(r'<script src="([^"]+)">', redoc)
        assert script.startswith("/docs/assets/") and c.get(script).status_code == 200
        assert "fonts.googleapis" not in redoc
        for path in ("/docs", "/redoc", "/docs/oauth2-redirect"):  # not to be framed elsewhere
            headers = c.get(path).headers
            assert headers["content-security-policy"] == "frame-ancestors 'none'", path
            assert headers["x-frame-options"] == "DENY" and headers["x-content-type-options"] == "nosniff"
    with TestClient(create_app(ServerConfig(db=sqlite_url)), root_path="/prefix") as c:  # behind a proxy
        assert '<script src="/prefix/docs/assets/swagger-ui-bundle.js">' in c.get("/docs").text


def test_a_read_only_postgresql_store_serves_reads_and_refuses_steps_in_words(fresh_pg_url):
    """A hot standby or a role without write grants: the server opened it and served reads, and
    every reset or step was a bare 500 with a traceback in the log."""
    from tests.conftest import _pg_engine

    with client(fresh_pg_url) as c:
        episode_id, _, _ = reset(c)
    admin = _pg_engine()
    database = sa.make_url(fresh_pg_url).database
    with admin.connect() as conn:
        conn.exec_driver_sql(f"ALTER DATABASE {database} SET default_transaction_read_only = on")
    try:
        with client(fresh_pg_url) as c:
            assert c.get(f"/episodes/{episode_id}/events").status_code == 200
            listing = c.get("/episodes").json()  # the read models never folded it: listed as they are
            assert listing["total"] == 0 and listing["read_models_behind"] > 0, listing
            r = c.post("/reset", json=RESET)
            assert r.status_code == 503 and r.json()["code"] == "store_read_only", r.text
            assert "refuses writes (ReadOnlySqlTransaction)" in r.json()["detail"]
            with c.websocket_connect("/ws") as ws:
                ws.send_json({"type": "reset", "data": RESET})
                frame = ws.receive_json()
                assert frame["data"]["reason"] == "store_read_only" and frame["data"]["status"] == 503
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f"ALTER DATABASE {database} RESET default_transaction_read_only")
        admin.dispose()


def test_a_sqlite_store_this_process_may_not_write_refuses_steps_as_read_only(tmp_path):
    """A store file the server's user may not write (here SQLite's `query_only`, which fails as
    a read-only file does, SQLITE_READONLY): every reset was a 503 "try again once it is back",
    which no retry mends. It is `store_read_only`, and the log is still served."""
    url = f"sqlite:///{tmp_path / 's.db'}"
    with client(url) as c:
        episode_id, _, _ = reset(c)
    store = EventStore.open(url)
    sa.event.listen(store.engine, "connect", lambda conn, _: conn.execute("PRAGMA query_only = ON"))
    store.engine.dispose()  # the connections opened before it
    try:
        with TestClient(create_app(ServerConfig(db=url), store=store)) as c:
            assert c.get(f"/episodes/{episode_id}/events").status_code == 200
            r = c.post("/reset", json=RESET)
            assert r.status_code == 503 and r.json()["code"] == "store_read_only", r.text
    finally:
        store.close()


def test_a_store_that_takes_no_writes_lists_what_its_read_models_hold(tmp_path):
    """A standby (or a file this process may not write) whose log had moved past its read models
    answered the episode list 503 `store_read_only` with a traceback in the log, though the server
    serves the log: it lists what the read models hold and says how much of the log they miss."""
    url = f"sqlite:///{tmp_path / 's.db'}"
    with client(url) as c:
        first, _, _ = reset(c)
        assert c.get("/episodes").json()["total"] == 1  # the read models fold it
    second = "logged-elsewhere"  # past the read models, as a primary logs while a standby serves
    with EventStore.open(url) as store:
        store.append(second, [NewEvent(r.type, json.loads(r.data_json)) for r in store.read_stream(first)],
                     None)
    store = EventStore.open(url)
    sa.event.listen(store.engine, "connect", lambda conn, _: conn.execute("PRAGMA query_only = ON"))
    store.engine.dispose()  # the connections opened before it
    try:
        with TestClient(create_app(ServerConfig(db=url), store=store)) as c:
            r = c.get("/episodes")
            assert r.status_code == 200, r.text
            listing = r.json()
            assert [e["episode_id"] for e in listing["episodes"]] == [first]
            assert listing["read_models_behind"] == len(list(store.read_stream(second))) > 0
            assert c.get(f"/episodes/{second}").status_code == 200  # read from the log itself
            page = c.get("/ui")
            assert page.status_code == 200 and "events behind the log" in page.text
    finally:
        store.close()
    with client(url) as c:  # a store that takes writes again catches up, and leaves nothing out
        listing = c.get("/episodes").json()
        assert listing["total"] == 2 and listing["read_models_behind"] == 0


def test_listings_waiting_for_a_catch_up_that_failed_take_its_answer_not_another_minute(sqlite_url):
    """Three listings against a store busy for a minute were answered 503 after 60, 120 and 150 s:
    each waited for the one before it, then waited its own minute for the same busy store. A bad
    filter is refused before any catch-up, rather than after that wait."""
    from api.episodes import EpisodeLog

    class CountedLock:  # the real lock, counting who came for it
        def __init__(self) -> None:
            self.lock, self.came = threading.Lock(), 0

        def __enter__(self):
            self.came += 1
            return self.lock.__enter__()

        def __exit__(self, *exc):
            return self.lock.__exit__(*exc)

    with EventStore.open(sqlite_url) as store:
        log = EpisodeLog(store)
        log._catch_up_lock = lock = CountedLock()
        release = threading.Event()
        calls = []

        def busy(upto=None, **_):
            calls.append(upto)
            release.wait(10)
            raise sa.exc.OperationalError("BEGIN IMMEDIATE", {}, Exception("database is locked"))

        log._runner.catch_up = busy
        with ThreadPoolExecutor(3) as pool:
            listings = [pool.submit(log.list) for _ in range(3)]
            while lock.came < 3:  # all three asked: one catches up, two wait for it
                threading.Event().wait(0.01)
            release.set()
            for listing in listings:
                with pytest.raises(sa.exc.OperationalError, match="database is locked"):
                    listing.result(10)
        assert len(calls) == 1
        with pytest.raises(Exception, match="rules"):
            log.list(rules="1.5")
        assert len(calls) == 1  # refused before the catch-up
        log._runner.catch_up = lambda upto=None, **_: calls.append(upto)
        assert log.list()["episodes"] == [] and len(calls) == 2  # a later listing catches up anew


def test_the_openapi_document_names_the_outage_and_damage_answers_of_the_episode_routes(sqlite_url):
    """/reset, /step and /state answer 503 when the store does not answer or takes no writes, and
    the log's routes 500 `log_damaged`; the document said neither, so generated clients had no
    type for them."""
    with client(sqlite_url) as c:
        paths = c.get("/openapi.json").json()["paths"]
    for path, method, codes in (("/reset", "post", {"503"}), ("/step", "post", {"500", "503"}),
                                ("/state", "get", {"503"}), ("/episodes", "get", {"503"}),
                                ("/episodes/{episode_id}", "get", {"500", "503"}),
                                ("/episodes/{episode_id}/views", "get", {"500", "503"})):
        documented = paths[path][method]["responses"]
        assert codes <= set(documented), (path, sorted(documented))
        assert "store_unavailable" in documented["503"]["description"]


def test_the_openapi_document_declares_the_analytics_parameters_and_answers(sqlite_url):
    """`GET /analytics/{name}` declared only `name`, its errors had no body and no 401/403: a client
    generated from the document could pass no parameter and had no type for any refusal."""
    from analytics import named

    with client(sqlite_url) as c:
        operation = c.get("/openapi.json").json()["paths"]["/analytics/{name}"]["get"]
    declared = {p["name"]: p for p in operation["parameters"] if p["in"] == "query"}
    assert set(declared) == {p.name for q in named.registry().values() for p in q.params}
    assert declared["k"]["schema"] == {"type": "integer"}
    assert "1..64, default 4): pass_at_k" in declared["k"]["description"]
    responses = operation["responses"]
    for code in ("400", "401", "403", "404", "500", "503"):
        assert responses[code]["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorBody")
    assert "Retry-After" in responses["202"]["headers"]
    assert responses["202"]["content"]["application/json"]["schema"]["$ref"].endswith("/SyncingBody")


def test_the_openapi_document_states_the_resets_rules_the_server_enforces(sqlite_url):
    """An id with a slash, an empty task and rules 0 were valid by the document and refused by the
    server (400): a client generated from it could not know. The server's words stay its own."""
    import jsonschema

    with client(sqlite_url) as c:
        fields = c.get("/openapi.json").json()["components"]["schemas"]["ResetRequest"]["properties"]
        for name, value in (("episode_id", "qa/slash"), ("task", ""), ("reward_profile", ""), ("rules", 0)):
            with pytest.raises(jsonschema.ValidationError):
                jsonschema.validate(value, fields[name])
            assert c.post("/reset", json={name: value}).status_code == 400  # in the server's words
        for name, value in (("episode_id", "run-1.a:b_c"), ("task", "expense_report"), ("rules", 4),
                            ("episode_id", None)):
            jsonschema.validate(value, fields[name])


def test_the_openapi_document_states_the_seed_range_exactly(sqlite_url):
    """FastAPI's OpenAPI model holds bounds as floats: the seed's maximum, 2**63 - 1, was published as
    9.223372036854776e+18 (2**63), so a seed the document allowed was refused with a 422."""
    import jsonschema

    from companyos.env import SEED_MAX

    with client(sqlite_url) as c:
        document = c.get("/openapi.json").json()
        reset_schema = document["components"]["schemas"]["ResetRequest"]
        (bounded,) = (s for s in reset_schema["properties"]["seed"]["anyOf"] if s["type"] == "integer")
        assert (bounded["minimum"], bounded["maximum"]) == (0, SEED_MAX) == (0, 2**63 - 1)
        assert type(bounded["maximum"]) is int and type(bounded["minimum"]) is int
        for seed in (SEED_MAX, SEED_MAX + 1):  # the document and the server agree on both sides
            try:
                jsonschema.validate({"seed": seed}, reset_schema)
                allowed = True
            except jsonschema.ValidationError:
                allowed = False
            assert allowed == (c.post("/reset", json={"seed": seed}).status_code == 200), seed


def test_long_work_runs_apart_from_the_steps(sqlite_url, monkeypatch):
    """A batch POSTed to /mcp ran on the pool every thread-hopping step needs: forty such batches
    held a socket's step up to 4 s (9 s on PostgreSQL), and so did 32 sockets asking for the views of
    a long episode. Both now run on the pool for long work; a single message stays a step."""
    import threading

    import api.app as app_module
    from api import episodes

    ran_on: list[tuple[str, str]] = []

    def recorded(kind, fn):
        def wrapped(*args, **kwargs):
            ran_on.append((kind, threading.current_thread().name.rpartition("_")[0]))
            return fn(*args, **kwargs)
        return wrapped

    monkeypatch.setattr(app_module, "_mcp_http", recorded("mcp", app_module._mcp_http))
    monkeypatch.setattr(episodes.EpisodeLog, "views", recorded("views", episodes.EpisodeLog.views))
    call = {"jsonrpc": "2.0", "method": "tools/call",
            "params": {"name": "ticketdesk_list_tickets", "arguments": {}}}
    with client(sqlite_url) as c:
        r = rpc(c, "initialize", {"protocolVersion": "2025-06-18"}, path="/mcp?seed=3")
        session = {"Mcp-Session-Id": r.headers["mcp-session-id"]}
        r = c.post("/mcp", json=[{**call, "id": i} for i in range(3)], headers=session)
        assert [answer["id"] for answer in r.json()] == [0, 1, 2]
        assert rpc(c, "tools/call", call["params"], headers=session).json()["id"] == 1
        with c.websocket_connect("/ws") as ws:
            ws.send_json({"type": "reset", "data": {"seed": 3}})
            assert ws.receive_json()["type"] == "observation"
            ws.send_json({"type": "views"})
            assert ws.receive_json()["type"] == "views"
    assert ran_on == [("mcp", "companyos-step"), ("mcp", "companyos-batch"), ("mcp", "companyos-step"),
                      ("views", "companyos-batch")]


def test_a_client_gone_mid_body_on_mcp_is_no_application_error(sqlite_url):
    """A client that left while sending a /mcp body (or was answered 408 for a slow one) raised
    ClientDisconnect out of the route, which Uvicorn logs as "Exception in ASGI application" with a
    traceback: a false alarm per client. /step and /reset said nothing in the same case."""
    import asyncio

    app = create_app(ServerConfig(db=sqlite_url))
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
             "scheme": "http", "path": "/mcp", "raw_path": b"/mcp", "root_path": "", "query_string": b"",
             "headers": [(b"host", b"test"), (b"content-type", b"application/json"),
                         (b"content-length", b"1000")],
             "client": ("127.0.0.1", 1), "server": ("test", 80)}
    arrived = iter([{"type": "http.request", "body": b'{"jsonrpc"', "more_body": True},
                    {"type": "http.disconnect"}])
    sent: list[dict] = []

    async def receive() -> dict:
        return next(arrived)

    async def send(message: dict) -> None:
        sent.append(message)

    async def main() -> None:
        async with app.router.lifespan_context(app):
            await app(scope, receive, send)

    asyncio.run(main())  # raised ClientDisconnect
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]
