"""The web UI (/ui): the episode list, an episode's timeline, the apps at a step, the analytics
report; the facts each page shows are checked against the events the store holds, not against
text written here. Also: refusals as HTML pages in words, escaping, headers, the API-key guard."""

from __future__ import annotations

import html
import re
from urllib.parse import parse_qs, urlsplit

import orjson
import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from analytics.report import number_text
from api.app import create_app
from api.config import ServerConfig
from companyos.agents import make_agent
from companyos.env import CompanyEnv
from domain import CURRENT_RULES
from eventstore import EventStore
from tests import tamper

HOSTILE = "<script>alert(1)</script>"
HOSTILE_APP = '"><img src=x onerror=alert(2)>'


def _play(env: CompanyEnv, agent: str, seed: int, options: dict) -> str:
    agent_ = make_agent(agent, seed)
    obs, info = env.reset(seed=seed, options=options)
    agent_.reset(obs)
    done = False
    while not done:
        obs, _, terminated, truncated, info = env.step(agent_.act(obs))
        done = terminated or truncated
    return info["episode_id"]


def _fail(env: CompanyEnv) -> str:
    """An episode that fails: a hostile comment, a hostile unknown tool, then the ticket closed
    without reading the data it depends on (an irreversible mistake)."""
    obs, info = env.reset(seed=3, options={"task": "expense_report", "chaos": "low"})
    ticket = re.search(r"T-\d+", obs["goal"]).group(0)
    env.step({"app": "ticketdesk", "method": "add_comment", "params": {"ticket_id": ticket, "text": HOSTILE}})
    env.step({"app": HOSTILE_APP, "method": "x", "params": {}})
    env.step({"app": "ticketdesk", "method": "update_ticket",
              "params": {"ticket_id": ticket, "field": "status", "value": "closed"}})
    return info["episode_id"]


@pytest.fixture(scope="module")
def logged(tmp_path_factory):
    """A store with a success, two truncated random runs, and a failure by a hostile agent."""
    url = f"sqlite:///{tmp_path_factory.mktemp('ui') / 'store.db'}"
    ids = {}
    with CompanyEnv(url, agent="expert-agent") as env:
        ids["success"] = _play(env, "expert", 0, {"task": "expense_report", "chaos": "high"})
    with CompanyEnv(url, agent="random-agent") as env:
        ids["random"] = _play(env, "random", 1, {"task": "bug_escalation", "chaos": "high"})
        ids["random2"] = _play(env, "random", 2, {"task": "handbook_update", "chaos": "high"})
    with CompanyEnv(url, agent=HOSTILE) as env:
        ids["failure"] = _fail(env)
    return url, ids


@pytest.fixture(autouse=True)
def patient_report(monkeypatch):
    """The report page waits SYNC_WAIT_S (2 s) for a sync before it answers "still syncing"
    (202); a first sync on a slow day took longer, and a test of the report got that page. The
    tests of the 202 page set their own wait."""
    from api import ui as ui_routes

    monkeypatch.setattr(ui_routes, "SYNC_WAIT_S", 600.0)
    monkeypatch.setattr(ui_routes, "LIST_WAIT_S", 600.0)  # the list's catch-up, likewise


@pytest.fixture(scope="module")
def ui(logged):
    url, ids = logged
    with TestClient(create_app(ServerConfig(db=url))) as c:
        yield c, url, ids


def _events(url: str, episode_id: str) -> list[dict]:
    with EventStore.open(url) as store:
        return [{"type": r.type, "data": orjson.loads(r.data_json)} for r in store.read_stream(episode_id)]


def _row(page: str, step: int) -> str:
    match = re.search(rf'<tr id="step-{step}"[^>]*>(.*?)</tr>', page, re.S)
    assert match, f"no row for step {step}"
    return match.group(1)


def _links(page: str) -> list[str]:
    return [html.unescape(h) for h in re.findall(r'href="([^"]*)"', page)]


def _html_ok(r, status: int = 200) -> str:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("text/html")
    assert r.headers["content-security-policy"].startswith("default-src 'none'; style-src 'unsafe-inline'")
    assert r.headers["x-content-type-options"] == "nosniff"
    assert "<script" not in r.text  # no page carries a script: not ours, not an agent's
    for nav in ('href="/ui"', 'href="/ui/analytics"', 'href="/docs"'):
        assert nav in r.text
    return r.text


# -- the list -----------------------------------------------------------------------------------


def test_list_shows_every_logged_episode_newest_first_with_its_facts(ui):
    c, _, ids = ui
    page = _html_ok(c.get("/ui"))
    rows = c.get("/episodes").json()["episodes"]
    assert len(rows) == 4
    positions = [page.index(f'/ui/episodes/{e["episode_id"]}"') for e in rows]
    assert positions == sorted(positions)  # the JSON listing's order: newest first
    failed = next(e for e in rows if e["episode_id"] == ids["failure"])
    assert failed["outcome"] == "failure" and failed["failure_mode"] == "irreversible_action"
    for e in rows:
        row = page.split(f'/ui/episodes/{e["episode_id"]}"', 1)[1].split("</tr>", 1)[0]
        assert f"<td>{e['task']}</td>" in row and f">{e['outcome']}</span>" in row
        assert f"<td class=\"num\">{e['steps']}</td>" in row
        assert f"<td class=\"num\">{number_text(e['total_return'])}</td>" in row
        if e["failure_mode"]:
            assert f">{e['failure_mode']}</span>" in row
        assert re.findall(r"<td[^>]*>(.*?)</td>", row)[8] == str(e["rules"])  # after the chaos
    head = re.findall(r"<th scope='col'>(.*?)</th>", page)
    assert head[head.index("chaos") + 1] == "rules"
    assert html.escape(HOSTILE) in page and "expert-agent" in page


def test_list_filters_and_drops_the_empty_fields_a_form_sends(ui):
    c, _, ids = ui
    page = _html_ok(c.get("/ui", params={"task": "", "agent": "random-agent", "outcome": ""}))
    assert ids["random"] in page and ids["random2"] in page
    assert ids["success"] not in page and ids["failure"] not in page
    page = _html_ok(c.get("/ui", params={"outcome": "failure", "task": "expense_report"}))
    assert ids["failure"] in page and ids["success"] not in page
    assert '<option value="failure" selected>' in page  # the form shows the filter in force
    page = _html_ok(c.get("/ui", params={"agent": HOSTILE}))
    assert ids["failure"] in page and ids["random"] not in page
    assert f'value="{html.escape(HOSTILE)}"' in page
    page = _html_ok(c.get("/ui", params={"task": "", "agent": "", "outcome": ""}))
    assert all(i in page for i in ids.values())
    assert "No episodes match." in _html_ok(c.get("/ui", params={"agent": "nobody"}))  # not "0 match"
    # a filter accepted as written otherwise is shown as the form writes it: the select showed
    # "any" beside a filtered list, and the next Filter dropped the filter
    page = _html_ok(c.get("/ui", params={"rules": f"0{CURRENT_RULES}", "task": " expense_report",
                                         "outcome": "failure "}))
    assert ids["failure"] in page and ids["success"] not in page
    for chosen in (f'<option value="{CURRENT_RULES}" selected>', '<option value="expense_report" selected>',
                   '<option value="failure" selected>'):
        assert chosen in page


def test_pages_are_titled_apart_and_their_tables_and_step_links_read_out_whole(ui):
    """Every list page was titled "Episodes" (the history menu: a row of look-alikes), header
    cells had no scope, and the timeline's step links read "0", "1", "2" in a list of links."""
    c, _, ids = ui
    titles = {re.search(r"<title>(.*?)</title>", _html_ok(c.get("/ui", params=p))).group(1)
              for p in ({}, {"agent": "random-agent"}, {"limit": 1, "offset": 1}, {"task": "expense_report"})}
    assert titles == {"Episodes (1–4) · CompanyOS", "Episodes (agent random-agent; 1–2) · CompanyOS",
                      "Episodes (2–2) · CompanyOS", "Episodes (task expense_report; 1–2) · CompanyOS"}
    for page in (_html_ok(c.get("/ui")), _html_ok(c.get(f"/ui/episodes/{ids['success']}"))):
        assert "<th>" not in page and "<th scope='col'>" in page
    page = _html_ok(c.get(f"/ui/episodes/{ids['success']}"))
    assert 'aria-label="the apps after step 0">0</a>' in page


def test_the_report_page_shows_a_chaos_level_as_the_form_writes_it(ui):
    """`?chaos=LOW` filtered as low but the select offered a second choice, LOW, beside low."""
    c, _, _ = ui
    page = _html_ok(c.get("/ui/analytics", params={"chaos": "LOW", "rules": "02"}))
    assert '<option value="low" selected>' in page and "LOW" not in page
    assert '<option value="2" selected>' in page


def _pager(page: str) -> dict[str, dict]:
    """The pager's links: label -> the query of its address."""
    found = re.findall(r'<a href="([^"]*)">([^<]*)</a>', page.split("class='pager'>")[1])
    return {html.unescape(label): parse_qs(urlsplit(html.unescape(h)).query) for h, label in found}


def test_list_pages_forward_and_back_keeping_the_filters(ui):
    c, _, ids = ui
    page = _html_ok(c.get("/ui", params={"limit": 2}))
    first = c.get("/episodes", params={"limit": 2}).json()
    expected = [e["episode_id"] for e in first["episodes"]]
    assert all(i in page for i in expected) and len(set(ids.values()) - set(expected)) == 2
    assert _pager(page) == {"older →": {"limit": ["2"], "before": [str(first["next_before"])]}}
    page2 = _html_ok(c.get("/ui", params=_pager(page)["older →"]))
    rest = set(ids.values()) - set(expected)
    assert all(i in page2 for i in rest) and "episodes 3–4 of 4" in page2
    assert set(_pager(page2)) == {"← newer"}  # no older page
    back = _html_ok(c.get("/ui", params=_pager(page2)["← newer"]))
    assert all(i in back for i in expected) and "episodes 1–2 of 4" in back
    assert _pager(back) == _pager(page)
    filtered = _html_ok(c.get("/ui", params={"agent": "random-agent", "limit": 1}))
    assert _pager(filtered)["older →"]["agent"] == ["random-agent"]
    older = _html_ok(c.get("/ui", params=_pager(filtered)["older →"]))
    assert "episodes 2–2 of 2" in older and "random-agent" in older
    # past the end, "newer" stepped back one empty page at a time; it leads to either end now
    total = c.get("/episodes").json()["total"]
    for past in ({"offset": 1_000_000}, {"after": 2**62}, {"before": 1}):
        beyond = _html_ok(c.get("/ui", params={"limit": 3, **past}))
        assert set(_pager(beyond)) == {"« the newest episodes", "the oldest episodes »"}, past
        assert f"episodes {total - 2}–{total} of {total}" in _html_ok(
            c.get("/ui", params=_pager(beyond)["the oldest episodes »"]))
        newest = _html_ok(c.get("/ui", params=_pager(beyond)["« the newest episodes"]))
        assert f"episodes 1–3 of {total}" in newest


def test_the_list_reaches_its_oldest_and_newest_pages_in_one_click_at_a_size_the_form_sets(ui):
    """232,000 episodes were 4,640 "older" clicks from end to end, and the page size could be set
    only in the address."""
    c, _, _ = ui
    total = c.get("/episodes").json()["total"]
    oldest = c.get("/episodes", params={"limit": 1, "offset": total - 1}).json()["episodes"][0]["episode_id"]
    first = _html_ok(c.get("/ui", params={"limit": 1}))
    assert set(_pager(first)) == {"older →", "oldest »"}
    assert _pager(first)["oldest »"] == {"limit": ["1"], "after": ["0"]}
    last = _html_ok(c.get("/ui", params=_pager(first)["oldest »"]))
    assert oldest in last and f"episodes {total}–{total} of {total}" in last
    assert set(_pager(last)) == {"« newest", "← newer"}
    assert _pager(last)["« newest"] == {"limit": ["1"]}
    one_newer = _html_ok(c.get("/ui", params=_pager(last)["← newer"]))
    assert f"episodes {total - 1}–{total - 1} of {total}" in one_newer
    sizes = re.search(r'<select name="limit">(.*?)</select>', first).group(1)
    assert re.findall(r'<option value="(\d+)"', sizes) == ["1", "50", "100", "200", "500"]
    assert '<option value="1" selected>' in sizes  # the address's own size stays chosen


def test_paging_holds_still_while_episodes_are_logged(tmp_path):
    """By offset, 2 episodes logged between two clicks made "older →" show 2 rows again; by the
    page's cursor, the next page begins where the last one ended, and the count says where."""
    url = f"sqlite:///{tmp_path / 'store.db'}"

    def log(n: int, first_seed: int) -> None:
        with CompanyEnv(url, agent="noop") as env:
            for seed in range(first_seed, first_seed + n):
                env.reset(seed=seed, options={"task": "expense_report", "chaos": "none"})
    log(6, 0)
    with TestClient(create_app(ServerConfig(db=url))) as c:
        page1 = c.get("/episodes", params={"limit": 3}).json()
        log(2, 100)  # two more, newer than every listed one
        page2 = c.get("/episodes", params={"limit": 3, "before": page1["next_before"]}).json()
        by_offset = c.get("/episodes", params={"limit": 3, "offset": 3}).json()
        html_page2 = _html_ok(c.get("/ui", params={"limit": 3, "before": page1["next_before"]}))
        newer = c.get("/episodes", params={"limit": 3, "after": page2["prev_after"]}).json()
        newest = c.get("/episodes", params={"limit": 3, "after": newer["prev_after"]}).json()
        both = c.get("/episodes", params={"before": 5, "after": 1})
    seen = [e["episode_id"] for e in page1["episodes"] + page2["episodes"]]
    assert len(set(seen)) == 6 and page2["next_before"] is None  # all six, none twice
    assert [e["seed"] for e in page1["episodes"] + page2["episodes"]] == [5, 4, 3, 2, 1, 0]
    assert (page2["newer"], page2["total"]) == (5, 8) and "episodes 6–8 of 8" in html_page2
    assert [e["seed"] for e in by_offset["episodes"]] == [4, 3, 2]  # offset paging repeats 4 and 3
    # back towards the newest: the three just newer than page 2 (page 1's), then the two new ones
    assert [e["seed"] for e in newer["episodes"]] == [5, 4, 3] and newer["newer"] == 2
    assert newer["next_before"] == page1["next_before"] and newer["prev_after"] is not None
    assert [e["seed"] for e in newest["episodes"]] == [101, 100] and newest["newer"] == 0
    assert newest["prev_after"] is None and newest["next_before"] is not None
    assert both.status_code == 400 and "give before or after, not both" in both.json()["detail"]


def test_a_page_counts_its_rows_total_and_newer_at_one_moment(store_url):
    """On PostgreSQL each of a page's three queries saw another listing's catch-up: a total
    counted before it and a "newer" after made the page the last one, its older episodes out of
    reach ("episodes 3914–3915 of 3915", no "older →")."""
    from api import episodes as listing_module
    from api.episodes import EpisodeLog
    from projections.episodes import EpisodesProjection
    from projections.runner import ProjectionRunner

    def log(seed: int) -> None:
        with CompanyEnv(store_url, agent="noop") as env:
            env.reset(seed=seed, options={"task": "expense_report", "chaos": "none"})

    for seed in range(5):
        log(seed)
    store = EventStore.open(store_url)
    try:
        reader = EpisodeLog(store)
        newest_first = reader.list(limit=5)["episodes"]
        whole = reader.list(limit=3)
        counted = listing_module.count_episodes

        def count_then_log_one(conn, **filters):  # the total, then another catch-up commits
            total = counted(conn, **filters)
            log(99)
            ProjectionRunner(store, [EpisodesProjection()]).catch_up()
            return total
        listing_module.count_episodes = count_then_log_one
        try:
            page = reader.list(limit=2, before=whole["next_before"])
        finally:
            listing_module.count_episodes = counted
    finally:
        store.close()
    # (a PostgreSQL store is shared with other tests: there may be older episodes than these five)
    assert [e["episode_id"] for e in page["episodes"]] == [e["episode_id"] for e in newest_first[3:5]]
    assert (page["newer"], page["total"]) == (3, whole["total"])  # the moment before the sixth
    assert (page["next_before"] is None) == (whole["total"] == 5) and page["prev_after"] is not None
    # and one page further in: the older page is reachable
    store = EventStore.open(store_url)
    try:
        reader = EpisodeLog(store)
        middle = reader.list(limit=1, before=whole["next_before"])
    finally:
        store.close()
    assert middle["next_before"] is not None and middle["total"] == whole["total"] + 1


@pytest.mark.parametrize(("query", "said"), [
    ({"outcome": "bogus"}, "unknown outcome"),
    ({"task": "nope"}, "unknown task"),
    ({"agent": "x" * 101}, "agent must be a string of 1-100"),
    ({"limit": "0"}, "limit must be a whole number from 1 to 500"),
    ({"offset": "-1"}, "offset must be a whole number"),
    ("task=expense_report&task=bug_escalation", "given more than once"),
])
def test_a_bad_list_filter_is_a_400_page_in_words(ui, query, said):
    c, _, _ = ui
    page = _html_ok(c.get("/ui", params=query), 400)
    assert html.escape(said) in page


# -- one episode --------------------------------------------------------------------------------


@pytest.mark.parametrize("which", ["success", "random", "failure"])
def test_episode_page_shows_every_step_and_the_facts_the_store_holds(ui, which):
    c, url, ids = ui
    episode_id = ids[which]
    page = _html_ok(c.get(f"/ui/episodes/{episode_id}"))
    events = _events(url, episode_id)
    assert len(events) > 20
    step, seen = 0, {"rejected": 0, "reward": 0, "chaos": 0, "mistake": 0}
    for event in events:
        kind, data = event["type"], event["data"]
        if kind == "ActionTaken":
            step = data["step"]
            row = _row(page, step)
            assert f'/ui/episodes/{episode_id}/views?step={step}"' in row
            action = data["action"]
            if isinstance(action, dict) and isinstance(action.get("app"), str) \
                    and isinstance(action.get("method"), str):
                assert html.escape(f"{action['app']}.{action['method']}") in row
            else:
                assert "malformed action" in row
            continue
        row = _row(page, step)
        if kind == "ActionRejected":
            assert "rejected" in row and html.escape(data["code"]) in row
            assert html.escape(data["reason"]) in row
            seen["rejected"] += 1
        elif kind == "RewardGranted":
            assert f"{html.escape(data['rule'])} {data['value']:+g}" in row
            seen["reward"] += 1
        elif kind == "MistakeRecorded":
            assert html.escape(data["mode"]) in row and html.escape(data["detail"]) in row
            seen["mistake"] += 1
        elif kind == "EpisodeEnded":
            assert f"episode ended: {data['outcome']}" in row
        if data.get("cause") == "chaos":
            assert html.escape(data["mechanism"]) in row and kind in row
            seen["chaos"] += 1
    last = max(e["data"]["step"] for e in events if e["type"] == "ActionTaken")
    assert not re.search(rf'id="step-{last + 1}"', page)
    assert seen["reward"] > 0
    if which != "success":
        assert seen["rejected"] > 0
    if which == "failure":
        assert seen["mistake"] > 0
    else:
        assert seen["chaos"] > 0  # chaos high: traps were planted or fired


def test_a_failed_episode_shows_its_failure_mode(ui):
    c, _, ids = ui
    summary = c.get(f"/episodes/{ids['failure']}").json()
    assert summary["outcome"] == "failure"
    page = _html_ok(c.get(f"/ui/episodes/{ids['failure']}"))
    assert f"<b>{summary['failure_mode']}</b>" in page  # in the summary, with its meaning
    assert "without ever reading the data" in page
    assert summary["digest"] in page and f"seed</dt><dd>{summary['seed']}<" in page


def test_a_list_whose_catch_up_runs_long_shows_what_the_read_model_holds_and_says_so(sqlite_url,
                                                                                    monkeypatch):
    """After a run of 232,000 episodes the list's first load took 103 s, a blank page meanwhile.
    The page now stops waiting after LIST_WAIT_S, lists what the read model holds and says how
    much is on its way; the catch-up goes on, and GET /episodes still waits for all of it."""
    import threading

    from api import ui as ui_routes
    from projections.runner import ProjectionRunner

    with CompanyEnv(sqlite_url) as env:
        first = _play(env, "expert", 0, {"task": "expense_report", "chaos": "none"})
    with TestClient(create_app(ServerConfig(db=sqlite_url))) as c:
        assert first in _html_ok(c.get("/ui"))
        with CompanyEnv(sqlite_url) as env:
            second = _play(env, "expert", 1, {"task": "bug_escalation", "chaos": "none"})
        release, original = threading.Event(), ProjectionRunner.catch_up

        def slow(self, *args, **kwargs):
            release.wait(60)
            return original(self, *args, **kwargs)

        monkeypatch.setattr(ProjectionRunner, "catch_up", slow)
        monkeypatch.setattr(ui_routes, "LIST_WAIT_S", 0.2)
        page = _html_ok(c.get("/ui"))
        behind = len(_events(sqlite_url, second))
        assert f"The list is catching up with the log: {behind} events are not listed yet" in page
        assert first in page and second not in page and "episodes 1–1 of 1" in page
        threading.Timer(0.5, release.set).start()
        listing = c.get("/episodes").json()  # the API waits for the whole log
        assert (listing["total"], listing["read_models_behind"], listing["catching_up"]) == (2, 0, False)
        page = _html_ok(c.get("/ui"))
        assert first in page and second in page and "catching up" not in page


def test_the_unknown_agent_the_analytics_name_is_a_list_filter_too(sqlite_url):
    """The report links a failure mode to its episodes under its agent filter; for `(unknown)`,
    the analytics' name for episodes logged without an agent, the list found none."""
    with CompanyEnv(sqlite_url) as env:
        nobody = _play(env, "expert", 0, {"task": "expense_report", "chaos": "none"})
    with CompanyEnv(sqlite_url, agent="someone") as env:
        someone = _play(env, "expert", 1, {"task": "expense_report", "chaos": "none"})
    with TestClient(create_app(ServerConfig(db=sqlite_url))) as c:
        listing = c.get("/episodes", params={"agent": "(unknown)"}).json()
        assert [e["episode_id"] for e in listing["episodes"]] == [nobody] and listing["total"] == 1
        page = _html_ok(c.get("/ui", params={"agent": "(unknown)"}))
        whole = _html_ok(c.get("/ui"))
        episode = _html_ok(c.get(f"/ui/episodes/{nobody}"))
    assert nobody in page and someone not in page
    # and the list names them so, the name that finds them (an empty cell, or "-", did not say it)
    (row,) = [r for r in re.findall(r"<tr>(.*?)</tr>", whole, re.S) if nobody in r]
    assert "(unknown)" in row and "(unknown)" in episode


def test_a_running_episode_shows_as_running(sqlite_url):
    with TestClient(create_app(ServerConfig(db=sqlite_url))) as c:
        meta = c.post("/reset", json={"seed": 5, "task": "license_renewal"}).json()["metadata"]
        action = {"app": "ticketdesk", "method": "list_tickets", "params": {}}
        c.post("/step", json={"episode_id": meta["episode_id"], "action": action},
               headers={"X-Episode-Token": meta["episode_token"]})
        page = _html_ok(c.get(f"/ui/episodes/{meta['episode_id']}"))
        assert ">running</span>" in page and "ticketdesk.list_tickets" in _row(page, 1)
        assert "episode ended" not in page
        assert meta["episode_id"] in _html_ok(c.get("/ui", params={"outcome": "running"}))


def test_a_long_timeline_is_paged_and_every_step_is_on_exactly_one_page(sqlite_url):
    """A 450-step episode: three pages of at most 200 steps, linked both ways, that together show
    every step once; the apps at a step link back to the page that shows it."""
    with CompanyEnv(sqlite_url, agent="noop") as env:
        episode_id = _play(env, "noop", 4, {"task": "bug_escalation", "chaos": "low", "max_steps": 450})
    with TestClient(create_app(ServerConfig(db=sqlite_url))) as c:
        address, shown, pages = f"/ui/episodes/{episode_id}", [], 0
        while address:
            page = _html_ok(c.get(address))
            pages += 1
            shown += [int(k) for k in re.findall(r'<tr id="step-(\d+)"', page)]
            later = re.search(r'<a href="([^"]+)">later steps →</a>', page)
            address = html.unescape(later.group(1)) if later else None
        assert pages == 3 and shown == list(range(451)) and "episode ended: truncated" in page
        assert "steps 400 to 450 of 0 to 450" in page and "← earlier steps" in page
        views = _html_ok(c.get(f"/ui/episodes/{episode_id}/views", params={"step": 250}))
        assert f'href="/ui/episodes/{episode_id}?from=200#step-250">back to the episode' in views
        past_the_end = _html_ok(c.get(f"/ui/episodes/{episode_id}", params={"from": 451}), 404)
        assert "has no step 451: its steps are 0 to 450" in past_the_end
        assert f"<a href='/ui/episodes/{episode_id}'>Back to the episode</a>" in past_the_end
        assert "from must be a whole number" in _html_ok(
            c.get(f"/ui/episodes/{episode_id}", params={"from": "-1"}), 400)


def test_an_episode_re_simulated_from_its_seed_matches_and_an_altered_one_does_not(ui, sqlite_url):
    c, _, ids = ui
    episode = _html_ok(c.get(f"/ui/episodes/{ids['success']}"))
    assert f'href="/ui/episodes/{ids["success"]}/rerun"' in episode
    digest = c.get(f"/episodes/{ids['success']}").json()["digest"]
    page = _html_ok(c.get(f"/ui/episodes/{ids['success']}/rerun"))
    assert "<b>Match.</b>" in page and f"digest <code>{digest}</code>" in page
    assert f"actions under rules version {CURRENT_RULES}, the episode gives the stored stream" in page
    assert "no episode" in _html_ok(c.get("/ui/episodes/nope/rerun"), 404)

    with CompanyEnv(sqlite_url, agent="expert") as env:
        episode_id = _play(env, "expert", 5, {"task": "license_renewal", "chaos": "low"})
    engine = sa.create_engine(sqlite_url)
    altered = tamper.versions_of_type(engine, episode_id, "RewardGranted")[0]
    tamper.edit_event(engine, episode_id, altered, "data", lambda data: data.replace('"value":', '"value":1'))
    # (not JSON any more: "value":1-0.1; the page shows the stored text where the streams part)
    engine.dispose()
    with TestClient(create_app(ServerConfig(db=sqlite_url))) as other:
        page = _html_ok(other.get(f"/ui/episodes/{episode_id}/rerun"))
    assert "<b>Mismatch.</b>" in page and f"First difference: version {altered}" in page
    assert "<b>Mismatch.</b> Both chains end in digest" in page  # the digest columns untouched
    assert "stored content was altered" in page and '\\"value\\":1-0.1}' in html.unescape(page)


def test_hostile_agent_label_and_action_arguments_are_escaped(ui):
    c, _, ids = ui
    episode_id = ids["failure"]
    pages = [c.get("/ui").text, c.get(f"/ui/episodes/{episode_id}").text,
             *(c.get(f"/ui/episodes/{episode_id}/views", params={"step": k}).text for k in (1, 2, 3))]
    for page in pages:
        assert HOSTILE not in page and "<img" not in page
        assert "onerror=alert(2)>" not in page  # the tag cannot open, nor an attribute close
    assert html.escape(HOSTILE) in pages[1] and html.escape(HOSTILE_APP) in pages[1]
    assert html.escape(HOSTILE) in pages[2]  # the comment, in the ticket's view


def test_missing_episode_is_a_404_page(ui):
    """Also: a long id echoed in the message wraps (a 200-character one made a phone's page 2,064
    pixels wide), as does a long value in a select."""
    from api.ui_html import _CSS

    assert re.search(r"\.error\{[^}]*overflow-wrap:anywhere", _CSS) and "select{max-width:100%}" in _CSS
    c, _, _ = ui
    for path in ("/ui/episodes/no-such-episode", "/ui/episodes/no-such-episode/views",
                 "/ui/episodes/%3Cbad%3E"):
        assert "no episode" in _html_ok(c.get(path), 404)
    assert "no UI page" in _html_ok(c.get("/ui/nothing/here"), 404)


def test_an_agents_label_cannot_turn_the_pages_own_words_around(ui):
    """A label ending in an unclosed right-to-left override (U+202E) reversed the rest of the
    views page's line of facts in Chromium ("stream version 21" read 12), and a tool's the
    arguments beside it: the label is isolated (<bdi>), and so are a step's tool and arguments."""
    from analytics.report import _html_title
    from api.ui_html import _CSS

    c, _, ids = ui
    page = _html_ok(c.get(f"/ui/episodes/{ids['failure']}/views", params={"step": 1}))
    assert f"agent <bdi>{html.escape(HOSTILE)}</bdi>;" in page
    assert re.search(r"td b,td code\{unicode-bidi:isolate\}", _CSS)
    title = _html_title({"filters": {"agent": "\u202eevil", "chaos": "high"}})
    assert title == "CompanyOS failure-mode report (agent=<bdi>\\u202eevil</bdi>, chaos=high)"


def test_bidirectional_controls_show_as_escapes_not_as_reversed_text(sqlite_url):
    """A right-to-left override inside a logged value turned it around on the page: a comment's
    amount of 00001 read 10000, a ticket id read as the real one though the step was refused for
    it, an agent's label backwards in the list and the report. The page writes each such control as
    an escape, right-to-left letters stay; the filter box shows the label so too (raw, it read
    bidi-tnega), and a filter typed as the pages show the label names it."""
    from analytics import report

    agent = "bidi-\u202eagent"
    with CompanyEnv(sqlite_url, agent=agent) as env:
        obs, info = env.reset(seed=7100, options={"chaos": "none", "max_steps": 3, "episode_id": "bidi-1"})
        ticket = re.search(r"T-\d+", obs["goal"]).group(0)
        env.step({"app": "ticketdesk", "method": "add_comment",
                  "params": {"ticket_id": ticket, "text": "approved amount \u202e00001\u202c USD שלום"}})
        env.step({"app": "ticketdesk", "method": "get_ticket", "params": {"ticket_id": "\u202e724-T\u202c"}})
        assert any(env.step({"app": "ticketdesk", "method": "list_tickets", "params": {}})[2:4])  # over
    with TestClient(create_app(ServerConfig(db=sqlite_url))) as c:
        pages = [_html_ok(c.get("/ui/episodes/bidi-1")), _html_ok(c.get("/ui", params={"agent": agent})),
                 _html_ok(c.get("/ui/episodes/bidi-1/views", params={"step": 2})),
                 _html_ok(c.get("/ui/analytics")),
                 _html_ok(c.get("/ui", params={"agent": "bidi-\\u202eagent"})),  # as the page shows it
                 _html_ok(c.get("/ui/analytics", params={"agent": agent}))]
        timeline, listing = pages[0], pages[1]
        assert "approved amount \\u202e00001\\u202c USD שלום" in timeline
        assert "\\u202e724-T\\u202c" in timeline and "bidi-\\u202eagent" in listing
        for filtered in (listing, pages[4]):  # the filter by the raw label, or as shown, matched it
            assert 'href="/ui/episodes/bidi-1"' in filtered
            assert 'name="agent" value="bidi-\\u202eagent"' in filtered  # the box shows it as the table
        assert 'name="agent" value="bidi-\\u202eagent"' in pages[5]
        assert "1 episode" in pages[5] or "(agent=<bdi>bidi-\\u202eagent</bdi>" in pages[5]
        for page in pages:
            assert "\u202e" not in page
    assert "bidi-\\u202eagent" in pages[3]  # in the report's tables and legends
    assert report._md(agent) == "bidi-\\u202eagent"  # and in its Markdown


def test_every_box_that_scrolls_sideways_can_be_reached_by_the_keyboard(ui):
    """A wide table on a narrow screen scrolls in its box, which older browsers do not let Tab
    reach (axe: scrollable-region-focusable): each box is focusable and named."""
    c, _, ids = ui
    for path in ("/ui", f"/ui/episodes/{ids['failure']}", "/ui/analytics"):
        boxes = re.findall(r'<div class="scroll"([^>]*)>', _html_ok(c.get(path)))
        assert boxes and all(re.fullmatch(r' tabindex="0" role="region" aria-label="[^"]+"', b)
                             for b in boxes), (path, boxes)


def test_a_method_a_page_does_not_take_is_a_405_page_naming_the_one_it_does(ui):
    """POST /ui answered 405 in the API's JSON, where every other refusal of a page is a page."""
    c, _, ids = ui
    for method, path in (("POST", "/ui"), ("DELETE", f"/ui/episodes/{ids['failure']}"), ("PUT", "/")):
        r = c.request(method, path)
        assert r.headers["allow"] == "GET, HEAD", (method, path)  # HEAD is answered too
        page = _html_ok(r, 405)
        assert "Method not allowed" in page
        assert f"{method} is not allowed here: this page answers GET, HEAD" in page
        assert c.head(path).status_code in (200, 307), path
    refused = c.post("/episodes")
    assert refused.headers["content-type"] == "application/json"  # the API stays JSON
    assert refused.headers["allow"] == "GET, HEAD" and c.head("/episodes").status_code == 200
    assert c.get("/step").headers["allow"] == "POST"  # no GET, no HEAD


def test_the_server_root_and_ui_slash_lead_to_the_episode_list(ui):
    c, _, _ = ui
    for path in ("/", "/ui/", "/ui/episodes", "/ui/episodes/"):  # the last two led to a 404 page
        moved = c.get(path, follow_redirects=False)
        assert moved.status_code in (302, 307) and moved.headers["location"] == "/ui"
        assert "<h1>Episodes</h1>" in c.get(path).text
    moved = c.get("/ui/episodes?outcome=success", follow_redirects=False)
    assert moved.headers["location"] == "/ui?outcome=success"


def test_a_page_asked_for_with_a_trailing_slash_leads_to_the_page(ui):
    """`/ui/` led to the list, but `/ui/episodes/<id>/` (a hand-edited or pasted address) was a 404."""
    c, _, ids = ui
    episode = ids["success"]
    moved = c.get(f"/ui/episodes/{episode}/views/?step=1", follow_redirects=False)
    assert moved.status_code in (302, 307)
    assert moved.headers["location"] == f"/ui/episodes/{episode}/views?step=1"
    assert episode in _html_ok(c.get(f"/ui/episodes/{episode}/"))
    assert "no UI page" in _html_ok(c.get("/ui/nothing/here/"), 404)  # still a 404, said in words
    # the path is sent back encoded as it came: `%3F` became a real query, `%2E%2E` a step out
    moved = c.get("/ui/episodes/long-ep.1%3Ffrom=9800/", follow_redirects=False)
    assert moved.headers["location"] == "/ui/episodes/long-ep.1%3Ffrom%3D9800"
    for outside in ("/ui/%2E%2E/episodes/", "/ui/episodes/%2E/"):
        assert "no UI page" in _html_ok(c.get(outside, follow_redirects=False), 404)


# -- the apps at a step -------------------------------------------------------------------------


def _table(section: str, caption: str) -> list[dict[str, str]]:
    """The rows of the table under <h3>caption</h3>, as {column: cell text}."""
    body = section.split(f"<h3>{caption}</h3>", 1)[1].split("</table>", 1)[0]
    head = re.findall(r"<th scope='col'>(.*?)</th>", body)
    rows = re.findall(r"<tr>(<td>.*?)</tr>", body, re.S)
    return [dict(zip(head, [html.unescape(re.sub(r"<[^>]+>", "", cell))
                            for cell in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)], strict=True))
            for row in rows]


def _number(value) -> str:
    return number_text(value) if isinstance(value, float) else str(value)


def test_the_step_0_page_shows_the_chaos_planted_at_reset(ui):
    """`replay --step 0` and the JSON named the chaos planted at reset; the page said only "the
    world right after reset"."""
    c, _, ids = ui
    planted = {}
    for name in ("success", "random", "random2"):
        chaos = c.get(f"/episodes/{ids[name]}/views", params={"step": 0}).json()["chaos"]
        if chaos:
            planted[ids[name]] = chaos
    assert planted, "no episode of the fixture has chaos at reset"
    for episode_id, chaos in planted.items():
        page = _html_ok(c.get(f"/ui/episodes/{episode_id}/views", params={"step": 0}))
        assert "right after reset" in page
        for fired in chaos:
            assert html.escape(f"{fired['mechanism']}: {fired['type']}") in page


def _section(page: str, app: str) -> str:
    return page.split(f"<h2>{app}</h2>", 1)[1].split("<h2>", 1)[0]


def test_views_page_shows_the_apps_at_that_step(ui):
    c, _, ids = ui
    episode_id = ids["failure"]
    goal_ticket = re.search(r"T-\d+", c.get(f"/episodes/{episode_id}").json()["goal"]).group(0)
    shown = {}
    for step in (0, 1, 3):
        views = c.get(f"/episodes/{episode_id}/views", params={"step": step}).json()
        page = _html_ok(c.get(f"/ui/episodes/{episode_id}/views", params={"step": step}))
        assert f"step {step} of 3" in page
        tickets = _table(_section(page, "ticketdesk"), "tickets")
        assert [t["ticket_id"] for t in tickets] == [t["ticket_id"] for t in views["ticketdesk"]["tickets"]]
        for row, ticket in zip(tickets, views["ticketdesk"]["tickets"], strict=True):
            assert row["status"] == (ticket["status"] or "—") and row["priority"] == ticket["priority"]
        metrics = _table(_section(page, "datahub"), "metrics")
        assert [(m["name"], m["value"]) for m in metrics] == [
            (m["name"], _number(m["value"])) for m in views["datahub"]["metrics"]]
        shown[step] = next(t for t in tickets if t["ticket_id"] == goal_ticket)
    assert shown[0]["status"] != "closed" and shown[3]["status"] == "closed"
    assert HOSTILE not in shown[0]["comments"] and HOSTILE in shown[1]["comments"]


def test_views_page_links_to_neighbouring_steps_and_back(ui):
    c, _, ids = ui
    episode_id = ids["failure"]
    page = _html_ok(c.get(f"/ui/episodes/{episode_id}/views", params={"step": 2}))
    links = _links(page)
    assert f"/ui/episodes/{episode_id}/views?step=1" in links
    assert f"/ui/episodes/{episode_id}/views?step=3" in links
    assert f"/ui/episodes/{episode_id}#step-2" in links
    last = _html_ok(c.get(f"/ui/episodes/{episode_id}/views"))  # no step: the last
    assert "step 3 of 3" in last and "views?step=4" not in last
    assert "episode ended" in last
    first = _html_ok(c.get(f"/ui/episodes/{episode_id}/views", params={"step": 0}))
    assert "views?step=-1" not in first and f"/ui/episodes/{episode_id}/views?step=1" in _links(first)


@pytest.mark.parametrize(("step", "status", "said"), [
    ("4", 404, "has steps 0..3; there is no step 4"),
    ("abc", 400, "step must be a whole number from 0 to 1000000"),
    ("-1", 400, "step must be a whole number"),
])
def test_a_bad_step_is_a_page_in_words(ui, step, status, said):
    c, _, ids = ui
    page = _html_ok(c.get(f"/ui/episodes/{ids['failure']}/views", params={"step": step}), status)
    assert html.escape(said) in page
    # back to the episode the reader was on, not only to the list
    assert f"<a href='/ui/episodes/{ids['failure']}'>Back to the episode</a>" in page


def test_a_bad_report_filter_links_back_to_the_whole_report(ui):
    c, _, _ = ui
    page = _html_ok(c.get("/ui/analytics", params={"chaos": "bogus"}), 400)
    assert "<a href='/ui/analytics'>Back to the whole report</a>" in page
    missing = _html_ok(c.get("/ui/episodes/no-such-episode/views", params={"step": 1}), 404)
    assert "<a href='/ui'>Back to the episode list</a>" in missing  # no episode to go back to


# -- analytics ----------------------------------------------------------------------------------


def test_labels_and_ids_the_user_chose_may_wrap_anywhere_in_tables(ui):
    """An agent label of 100 characters without a space made the episode list 1,944 px wide, the
    outcome, return and chaos columns off the screen; only the cells of such free text wrap
    anywhere (the task and failure-mode words stay whole)."""
    c, _, _ = ui
    pages = {"list": _html_ok(c.get("/ui")), "report": _html_ok(c.get("/ui/analytics"))}
    for name, page in pages.items():
        assert re.search(r"td\.free\{overflow-wrap:anywhere", page), name
        free = re.findall(r'<td class="free">(.*?)</td>', page)
        assert any(html.escape(HOSTILE) in cell for cell in free), name  # the agent's label
        assert not any("expense_report" in cell for cell in free), name
    assert any("expert-agent" in cell for cell in re.findall(r'<td class="free">(.*?)</td>', pages["list"]))


def test_analytics_page_holds_the_report_and_its_charts(ui):
    c, _, _ = ui
    page = _html_ok(c.get("/ui/analytics"))
    assert page.count("<svg") >= 2 and "Failure modes" in page and "irreversible_action" in page
    assert HOSTILE not in page and html.escape(HOSTILE) in page  # the agents table
    assert page.count("<body>") == 1 and page.count("<html") == 1  # the report's body, in ours
    only = _html_ok(c.get("/ui/analytics", params={"agent": "random-agent", "task": ""}))
    assert "agent=<bdi>random-agent</bdi>" in only and "irreversible_action" not in only
    level = _html_ok(c.get("/ui/analytics", params={"chaos": "high"}))
    assert "chaos=high" in level and '<option value="high" selected>' in level
    swept = _html_ok(c.get("/ui/analytics", params={"chaos": "0.3"}))  # a level of a sweep stays chosen
    assert "chaos=0.3" in swept and '<option value="0.3" selected>' in swept
    refused = _html_ok(c.get("/ui/analytics", params={"chaos": "extreme"}), 400)
    assert "unknown chaos level" in refused
    scored = _html_ok(c.get("/ui/analytics", params={"profile": "sparse"}))  # the fixture logs none
    assert "profile=sparse" in scored and '<option value="sparse" selected>' in scored
    assert 'class="kpi">episodes<b>0</b>' in scored and "irreversible_action" not in scored
    assert "irreversible_action" in _html_ok(c.get("/ui/analytics", params={"profile": "default"}))
    judged = _html_ok(c.get("/ui/analytics", params={"rules": "1"}))  # the fixture logs version 2 only
    assert "rules=1" in judged and '<option value="1" selected>' in judged
    assert 'class="kpi">episodes<b>0</b>' in judged


@pytest.mark.parametrize(("query", "said"), [
    ({"task": "nope"}, "unknown task"),  # (a blank agent field is "any": see the spaces test)
    ({"agent": "a\x00b"}, "agent labels hold no control characters"),  # was echoed into the page
    ({"profile": "dense"}, "no reward profile 'dense'; the profiles are default, sparse"),
    ({"rules": "9"}, "no rules version 9; the versions are 1, 2"),
    ({"agnet": "random-agent"},
     "this page has no query parameter 'agnet'; it takes agent, chaos, profile, reload, rules, task")])
def test_a_bad_analytics_filter_is_a_400_page(ui, query, said):
    c, _, _ = ui
    page = _html_ok(c.get("/ui/analytics", params=query), 400)
    assert html.escape(said) in page and "\x00" not in page


def test_a_query_parameter_a_page_does_not_take_is_a_400_page_naming_it(ui):
    """A typo in a hand-edited or bookmarked address showed believable, unfiltered data."""
    c, _, ids = ui
    episode = ids["success"]
    for path, query, takes in (
            ("/ui", "outcom=success",
             "after, agent, before, failure_mode, limit, offset, outcome, rules, task"),
            (f"/ui/episodes/{episode}", "form=5", "from"),
            (f"/ui/episodes/{episode}/views", "setp=3", "step"),
            (f"/ui/episodes/{episode}/rerun", "x=1", "none")):
        page = _html_ok(c.get(f"{path}?{query}"), 400)
        name = query.split("=")[0]
        assert html.escape(f"this page has no query parameter '{name}'; it takes {takes}") in page, path


def test_an_unusable_warehouse_is_a_503_page(tmp_path):
    (tmp_path / "store.duckdb").mkdir()  # where the warehouse of store.db would be
    with TestClient(create_app(ServerConfig(db=f"sqlite:///{tmp_path / 'store.db'}"))) as c:
        page = _html_ok(c.get("/ui/analytics"), 503)
        assert "is a directory" in page


def test_a_long_sync_answers_with_a_page_that_reloads_until_the_report_is_ready(logged, tmp_path,
                                                                                monkeypatch, held_sync):
    """A store far ahead of its warehouse (millions of events take minutes): the page says how far
    the sync got and reloads itself, rather than keep the browser waiting; every reload joins the
    one sync under way; the report follows when it is done."""
    from api import ui as ui_routes

    url, _ = logged
    release, calls = held_sync
    monkeypatch.setattr(ui_routes, "SYNC_WAIT_S", 0.2)
    with TestClient(create_app(ServerConfig(db=url, warehouse=str(tmp_path / "w.duckdb")))) as c:
        for _ in range(2):
            waiting = _html_ok(c.get("/ui/analytics", params={"task": "expense_report"}), 202)
            assert "1,500 of 3,000 events so far (50.0%)" in waiting
            assert "<meta http-equiv='refresh' content='2'>" in waiting
        assert len(calls) == 1
        # a page that reloads every 2 s with no way to stop it fails WCAG 2.2.1: it has one
        stop = next(h for h in _links(waiting) if "reload=off" in h)
        # first after the heading, and focused: at the end, a screen reader never got to it in 2 s
        assert re.search(r"</h1><p><a href=\"[^\"]*reload=off\" autofocus>Stop reloading</a>", waiting)
        assert parse_qs(urlsplit(stop).query) == {"task": ["expense_report"], "reload": ["off"]}
        still = _html_ok(c.get(stop), 202)
        assert "refresh" not in still and "does not reload itself" in still
        assert "1,500 of 3,000 events so far" in still and len(calls) == 1  # the same sync
        assert {"check again", "reload every 2 s"} <= set(re.findall(r'<a href="[^"]*">([^<]*)</a>', still))
        assert "reload must be on or off, not 'maybe'" in html.unescape(
            _html_ok(c.get("/ui/analytics", params={"reload": "maybe"}), 400))
        release.set()
        for _ in range(300):
            ready = c.get("/ui/analytics", params={"task": "expense_report"})
            if ready.status_code != 202:
                break
        assert "Success rate by chaos level" in _html_ok(ready)


# -- access and the schema ----------------------------------------------------------------------


def test_the_api_key_guard_covers_the_ui_and_says_so_in_a_page(logged):
    """A person who opens the UI without the key reads why and what to do, not a JSON document;
    the JSON API keeps its JSON refusal."""
    url, ids = logged
    with TestClient(create_app(ServerConfig(db=url, api_key="sekret"))) as c:
        for path in ("/", "/ui", f"/ui/episodes/{ids['success']}", f"/ui/episodes/{ids['success']}/views",
                     "/ui/analytics", "/ui/anything", "/docs", "/redoc"):  # the API docs the UI links to
            page = _html_ok(c.get(path, follow_redirects=False), 401)
            assert "needs an API key" in page and "reverse proxy that adds the header" in page
            assert c.get(path).headers["www-authenticate"] == "Bearer"
            page = _html_ok(c.get(path, headers={"Authorization": "Bearer wrong"}), 403)
            assert "wrong API key" in page
        ok = c.get(f"/ui/episodes/{ids['success']}", headers={"Authorization": "Bearer sekret"})
        _html_ok(ok)
        refused = c.get("/episodes")
        assert refused.status_code == 401 and refused.json()["code"] == "unauthorized"
        assert c.get("/uix").headers["content-type"] == "application/json"
        assert c.get("/openapi.json").json()["code"] == "unauthorized"


def test_ui_routes_stay_out_of_the_api_schema(ui):
    c, _, _ = ui
    assert not [p for p in c.get("/openapi.json").json()["paths"] if p.startswith("/ui")]


# -- behind a reverse proxy ---------------------------------------------------------------------


def _addresses(page: str) -> list[str]:
    return [html.unescape(a) for a in re.findall(r'(?:href|action)="([^"]*)"', page)]


def test_behind_a_proxy_prefix_every_link_and_form_stays_under_it(logged, tmp_path):
    """`serve --root-path /cos` (a proxy that mounts the server under /cos and strips it): Uvicorn
    hands the app /cos/... paths with root_path /cos. Every address a page sends the browser to
    must keep the prefix, and answer."""
    url, ids = logged
    app = create_app(ServerConfig(db=url, warehouse=str(tmp_path / "w.duckdb")))
    with TestClient(app, root_path="/cos") as c:
        home = c.get("/cos/", follow_redirects=False)
        assert home.status_code in (302, 307) and home.headers["location"] == "/cos/ui"
        pages = ["/cos/ui", f"/cos/ui/episodes/{ids['failure']}", f"/cos/ui/episodes/{ids['success']}/views",
                 "/cos/ui/analytics", "/cos/ui/nothing-here"]
        seen: set[str] = set()
        for path in pages:
            r = c.get(path)
            assert r.status_code == (404 if path.endswith("nothing-here") else 200), path
            addresses = _addresses(r.text)
            assert addresses and all(a.startswith("/cos/") for a in addresses), (path, addresses)
            seen.update(addresses)
        for path in ("/cos/ui", "/cos/ui/analytics", f"/cos/ui/episodes/{ids['failure']}"):
            refused = c.post(path)  # the router's 405, which no UI route sets the prefix for
            assert refused.status_code == 405 and "GET" in refused.text, path
            addresses = _addresses(refused.text)
            assert addresses and all(a.startswith("/cos/") for a in addresses), (path, addresses)
        for address in sorted(seen):
            assert c.get(address).status_code == 200, address
        assert {"/cos/ui", "/cos/ui/analytics", "/cos/docs"} <= seen
        assert any(a.startswith(f"/cos/ui/episodes/{ids['failure']}/views?step=") for a in seen)


@pytest.mark.parametrize("prefix", ["", "/cos"])
def test_an_address_under_the_docs_assets_is_no_ui_page(logged, prefix):
    """`/docs/assets/` (the mounted directory itself) was taken for a UI page under a proxy
    prefix `/docs/assets`: an HTML 404 whose every link (`/docs/assets/ui`, ...) led nowhere."""
    url, _ = logged
    with TestClient(create_app(ServerConfig(db=url)), root_path=prefix) as c:
        for method, path in (("GET", "/docs/assets/"), ("POST", "/docs/assets/"),
                             ("GET", "/docs/assets/nope.js")):
            r = c.request(method, prefix + path)
            assert r.status_code in (404, 405) and r.headers["content-type"] == "application/json", path
        assert c.get(prefix + "/docs/assets/swagger-ui.css").status_code == 200
        page = c.get(prefix + "/ui/nothing-here")  # a UI address still gets a page
        assert page.status_code == 404 and all(a.startswith(prefix + "/") for a in _addresses(page.text))
        assert prefix + "/ui" in _addresses(page.text)


def test_behind_a_proxy_prefix_the_key_guard_and_the_websocket_still_work(logged):
    url, ids = logged
    with TestClient(create_app(ServerConfig(db=url, api_key="sekret")), root_path="/cos") as c:
        assert c.get("/cos/health").status_code == 200  # open, as without a prefix
        refused = c.get("/cos/ui")
        assert refused.status_code == 401 and refused.headers["content-type"].startswith("text/html")
        assert _addresses(refused.text) and all(a.startswith("/cos/") for a in _addresses(refused.text))
        assert c.get("/cos/episodes").json()["code"] == "unauthorized"
        key = {"Authorization": "Bearer sekret"}
        with c.websocket_connect("/cos/ws", headers=key) as ws:
            ws.send_json({"type": "reset", "data": {"seed": 3}})
            assert ws.receive_json()["type"] == "observation"


def test_serve_root_path_puts_the_pages_links_under_the_prefix(tmp_path):
    """The real command on a real socket: the proxy strips /cos, so requests arrive as /ui."""
    import socket
    import subprocess
    import sys

    from tests.conftest import get_once_listening

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "companyos", "serve", "--port", str(port),
                               "--root-path", "cos/", "--db", f"sqlite:///{tmp_path / 's.db'}"],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        page = get_once_listening(f"http://127.0.0.1:{port}/ui")
        assert page.status_code == 200
        addresses = _addresses(page.text)
        assert "/cos/ui/analytics" in addresses and all(a.startswith("/cos/") for a in addresses)
    finally:
        server.terminate()
        banner = server.communicate(timeout=30)[0]
    # the address it prints leads to pages whose links need the proxy: it says so
    assert "the pages' links lead under /cos: open them through the proxy" in banner, banner
    for bad in ("/a b", "/café", "/a?b"):
        refused = subprocess.run([sys.executable, "-m", "companyos", "serve", "--root-path", bad],
                                 capture_output=True, text=True, timeout=60)
        assert refused.returncode == 2 and f"--root-path '{bad}' is not a URL path prefix" in refused.stderr


def test_the_report_page_links_each_example_episode_to_its_timeline(ui):
    """The failure-modes table listed example episode ids as text: from why agents fail to how
    one failed took a copy and an edited address. Each is a link now, and every link opens (the
    standalone `report --html` has no server to link to, and keeps them text)."""
    c, _, ids = ui
    page = _html_ok(c.get("/ui/analytics"))
    linked = re.findall(r'<a href="(/ui/episodes/[0-9a-f]+)">([0-9a-f]+)</a>', page)
    assert linked and all(href.endswith(shown) for href, shown in linked)
    assert f"/ui/episodes/{ids['failure']}" in {href for href, _ in linked}
    for href, _ in linked[:3]:
        _html_ok(c.get(href))


def test_an_agent_filter_is_taken_without_its_surrounding_spaces(ui):
    """A pasted label with a trailing space listed no episode on /ui and GET /episodes, where the
    analytics stripped it (no label begins or ends with space); the list now strips it too."""
    c, _, _ = ui
    exact = c.get("/episodes", params={"agent": "random-agent"}).json()
    assert exact["episodes"]
    for spaced in (" random-agent", "random-agent ", "\trandom-agent"):
        assert c.get("/episodes", params={"agent": spaced}).json()["episodes"] == exact["episodes"]
        page = _html_ok(c.get("/ui", params={"agent": spaced}))
        assert all(e["episode_id"] in page for e in exact["episodes"])
    # a field left blank but for a space is "any", as an empty one is (it was a 400 in CLI words)
    assert _html_ok(c.get("/ui", params={"agent": " "})) == _html_ok(c.get("/ui"))
    blank = _html_ok(c.get("/ui/analytics", params={"agent": "  ", "task": " "}))
    assert "--agent" not in blank and "failure-mode report</h1>" in blank


def test_the_longest_agent_label_is_measured_without_its_surrounding_spaces(tmp_path):
    """A 100-character label with a space before it was a 422 `string_too_long` on GET /episodes,
    where the UI and the command line found its episode."""
    url = f"sqlite:///{tmp_path / 'long.db'}"
    longest = "x" * 100
    with CompanyEnv(url, agent=longest) as env:
        env.reset(seed=1)
    with TestClient(create_app(ServerConfig(db=url))) as c:
        found = c.get("/episodes", params={"agent": longest}).json()["episodes"]
        assert len(found) == 1
        for spaced in (f" {longest}", f"{longest}\t"):
            assert c.get("/episodes", params={"agent": spaced}).json()["episodes"] == found
            assert found[0]["episode_id"] in _html_ok(c.get("/ui", params={"agent": spaced}))
        assert c.get("/episodes", params={"agent": "x" * 101}).status_code == 422


def test_text_colours_meet_wcag_aa_contrast_on_every_row_background():
    """`.muted` (#777) was 4.48:1 on white and 3.81:1 on a mistake row; AA wants 4.5:1."""
    from api.ui_html import _CSS

    def colour(selector: str, prop: str) -> str:
        return re.search(rf"\.{selector}\{{{prop}:(#[0-9a-f]{{6}})\}}", _CSS)[1]

    def luminance(hex_colour: str) -> float:
        channels = [int(hex_colour[i:i + 2], 16) / 255 for i in (1, 3, 5)]
        lin = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in channels]
        return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]

    backgrounds = ["#ffffff", colour("rejected", "background"), colour("mistake", "background")]
    for text in ("muted", "ok", "bad", "chaos"):
        for background in backgrounds:
            light, dark = sorted((luminance(colour(text, "color")), luminance(background)), reverse=True)
            assert (light + 0.05) / (dark + 0.05) >= 4.5, (text, background)
    # the report's footnote was an inline #888: 3.54:1 on white
    from analytics.report import REPORT_CSS

    footnote = re.search(r"\.footnote\{color:(#[0-9a-f]{6})", REPORT_CSS)[1]
    assert (1.05) / (luminance(footnote) + 0.05) >= 4.5


def test_pages_fit_a_narrow_screen_and_keep_numbers_whole(ui):
    """Checked in Chromium at 375 and 1440 px: every table cell broke anywhere (`rando/m`, a seed
    `90/7`), a long token in an action made a step page 23,000 px wide, the nav and an episode's
    32-character id stuck out, and the charts lost their right part. Tables now scroll sideways
    in a box, numbers and headers never break, the summary list and headings wrap long words,
    and charts scale down whole; the page's content is in a <main> landmark."""
    from analytics.report import REPORT_CSS
    from api.ui_html import _CSS

    # no cell breaks anywhere; headings, the summary list, a page's line of facts (a 100-
    # character agent label made a step page scroll sideways at 375 px) and an error message do
    assert "overflow-wrap:anywhere}" not in re.sub(
        r"(h1|dl\.summary dd|dl\.summary code|p\.muted|\.error)\{[^}]*\}", "", _CSS)
    assert re.search(r"p\.muted\{[^}]*overflow-wrap:anywhere", _CSS)
    for rule in (r"td\.num\{[^}]*white-space:nowrap", r"th\{[^}]*white-space:nowrap"):
        assert re.search(rule, _CSS), rule
    assert re.search(r"dl\.summary code\{[^}]*overflow-wrap:anywhere", _CSS)
    assert re.search(r"svg\{max-width:100%;height:auto\}", REPORT_CSS)
    c, _, ids = ui
    for path in ("/ui", f"/ui/episodes/{ids['failure']}", "/ui/analytics"):
        page = _html_ok(c.get(path))
        assert page.count("<main>") == 1, path
        assert page.count("<table") == len(re.findall(r'<div class="scroll"[^>]*><table', page)), path
    charts = _html_ok(c.get("/ui/analytics"))
    svgs = re.findall(r"<svg [^>]*>", charts)
    assert svgs and all(re.search(r'viewBox="0 0 \d+ \d+"', tag) for tag in svgs)


def test_the_episodes_of_a_failure_mode_are_listed_and_the_report_links_to_them(tmp_path):
    """From "why agents fail" to the episodes that failed so: the list took no failure mode
    (`/ui?failure_mode=` was a 400 naming the filters it takes), nor did GET /episodes or the
    command line, and the report's modes led nowhere."""
    import json
    from collections import Counter

    from companyos.batch import RunPlan
    from companyos.batch import run as run_plan
    from companyos.commands import projections
    from tests.conftest import command_runner

    url = f"sqlite:///{tmp_path / 'store.db'}"
    reported = [r.to_json() for r in run_plan(RunPlan(url, "random", "all", "high", 60, 0), workers=1)]
    modes = Counter(r["failure_mode"] for r in reported if r["failure_mode"])
    mode, count = modes.most_common(1)[0]
    failed_so = {r["episode_id"] for r in reported if r["failure_mode"] == mode}
    cli = command_runner(projections.register)
    listed = json.loads(cli("episodes", "--db", url, "--failure-mode", mode, "--limit", "0",
                            "--json").stdout)
    assert {e["episode_id"] for e in listed["episodes"]} == failed_so and listed["total"] == count
    refused = cli("episodes", "--db", url, "--failure-mode", "nope")
    assert refused.exit_code == 2 and "unknown failure mode 'nope'; choose one of" in refused.stderr
    with TestClient(create_app(ServerConfig(db=url))) as c:
        answer = c.get("/episodes", params={"failure_mode": mode, "limit": 500}).json()
        assert {e["episode_id"] for e in answer["episodes"]} == failed_so and answer["total"] == count
        assert c.get("/episodes", params={"failure_mode": "nope"}).status_code == 422
        page = _html_ok(c.get("/ui", params={"failure_mode": mode, "limit": 500}))
        assert f"of {count}<" in page and all(e in page for e in failed_so)
        assert f'<option value="{mode}" selected>' in page
        report = _html_ok(c.get("/ui/analytics"))
        assert f'href="/ui?failure_mode={mode}"' in report
        narrowed = _html_ok(c.get("/ui/analytics", params={"task": "expense_report"}))
        assert "/ui?task=expense_report&amp;failure_mode=" in narrowed
        # the list filters by no chaos level: a link would lead to more episodes than counted
        assert "failure_mode=" not in _html_ok(c.get("/ui/analytics", params={"chaos": "high"}))


def test_the_report_tables_each_agents_failure_modes_and_links_to_that_agents_episodes(tmp_path):
    """Pooled, one agent's many failures of one kind drowned out what another fails at; a row of
    the table by agent leads to that agent's episodes of that mode, exactly as many as it counts."""
    from collections import Counter

    from analytics import report
    from analytics.sync import sync
    from analytics.warehouse import Warehouse
    from companyos.batch import RunPlan
    from companyos.batch import run as run_plan

    url = f"sqlite:///{tmp_path / 'store.db'}"
    reported = [r.to_json() for agent, seed in (("random", 0), ("noop", 100))
                for r in run_plan(RunPlan(url, agent, "all", "high", 30, seed), workers=1)]
    tally = Counter((r["agent"], r["failure_mode"]) for r in reported if r["failure_mode"])
    with Warehouse(tmp_path / "w.duckdb") as wh:
        sync(url, wh)
        rows = report.build(wh)["failure_modes_by_agent"]
    assert {(r["agent"], r["failure_mode"]): r["episodes"] for r in rows} == dict(tally)
    for agent in ("random", "noop"):
        mine = [r for r in rows if r["agent"] == agent]
        assert sum(r["share"] for r in mine) == pytest.approx(1, abs=5e-4)
    with TestClient(create_app(ServerConfig(db=url))) as c:
        page = _html_ok(c.get("/ui/analytics"))
        start = page.index("<h2>Failure modes by agent")
        table = page[start:page.index("</table>", start)]
        for (agent, mode), count in tally.items():
            href = f"/ui?agent={agent}&amp;failure_mode={mode}"
            assert f'href="{href}"' in table
            assert f"of {count}<" in _html_ok(c.get(html.unescape(href)))
