"""Bad actions never raise: they become ActionRejected with a code and words."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from domain import TOOLS, EpisodeSpec, from_envelope, observe, reset, step, to_envelope
from domain.events import ActionRejected, ActionTaken
from domain.tools import parse_action


@pytest.fixture(scope="module")
def fresh():
    return reset(EpisodeSpec("vendor_onboarding", 2, "none"))[0]


def _rejected(state, action):
    s, events, info = step(state, action)
    assert type(events[0]) is ActionTaken
    rej = [e for e in events if type(e) is ActionRejected]
    assert len(rej) == 1, events
    obs = observe(s, info)
    assert obs["error"] == rej[0].code and obs["message"] and obs["result"] is None
    return rej[0]


@pytest.mark.parametrize("action,code", [
    ("list tickets please", "malformed_action"),
    (["ticketdesk", "list_tickets"], "malformed_action"),
    (None, "malformed_action"),
    (42, "malformed_action"),
    ({"method": "list_tickets"}, "malformed_action"),
    ({"app": "email", "method": "send", "params": {}}, "unknown_tool"),
    ({"app": "ticketdesk", "method": "delete_ticket", "params": {}}, "unknown_tool"),
    ({"app": "ticketdesk", "method": "get_ticket", "params": {}}, "invalid_params"),
    ({"app": "ticketdesk", "method": "get_ticket", "params": {"ticket_id": 7}},
     "invalid_params"),
    ({"app": "ticketdesk", "method": "get_ticket", "params": "T-1"}, "invalid_params"),
    ({"app": "ticketdesk", "method": "list_tickets", "params": {"x": 1}}, "invalid_params"),
    ({"app": "ticketdesk", "method": "update_ticket",
      "params": {"ticket_id": "T-1", "field": "colour", "value": "red"}}, "invalid_params"),
    ({"app": "approvalflow", "method": "submit_approval",
      "params": {"approval_type": "x", "approver": "y", "data": []}}, "invalid_params"),
    # as many keys as the tool has parameters, one of them unknown and `data` (an object) absent
    ({"app": "approvalflow", "method": "submit_approval",
      "params": {"approval_type": "x", "approver": "y", "bogus": 1}}, "invalid_params"),
    ({"app": "ticketdesk", "method": "get_ticket", "params": {"ticket_id": "T-0"}},
     "not_found"),
    ({"app": "datahub", "method": "query_metric", "params": {"metric_name": "nope"}},
     "not_found"),
    ({"app": "datahub", "method": "get_approver", "params": {"role": "pope"}}, "not_found"),
    ({"app": "approvalflow", "method": "check_status", "params": {"approval_id": "APR-9"}},
     "not_found"),
])
def test_bad_actions_become_action_rejected(fresh, action, code):
    assert _rejected(fresh, action).code == code


def test_broken_preconditions_are_rejected(fresh):
    main = fresh.target["ticket"]
    # resolving before the approval exists is fine for the app, but linking a ghost is not
    r = _rejected(fresh, {"app": "ticketdesk", "method": "update_ticket",
                          "params": {"ticket_id": main, "field": "linked_approval",
                                     "value": "APR-5555"}})
    assert r.code == "not_found"
    r = _rejected(fresh, {"app": "ticketdesk", "method": "update_ticket",
                          "params": {"ticket_id": main, "field": "status", "value": "blocked"}})
    assert r.code == "invalid_params"
    atype = fresh.target["approval_type"]
    someone = fresh.world.datahub.approvers["security_officer"]["name"]
    r = _rejected(fresh, {"app": "approvalflow", "method": "submit_approval",
                          "params": {"approval_type": atype, "approver": someone, "data": {}}})
    assert r.code == "precondition_failed" and "may not approve" in r.reason
    lead = fresh.world.datahub.approvers[fresh.target["role"]]["name"]
    r = _rejected(fresh, {"app": "approvalflow", "method": "submit_approval",
                          "params": {"approval_type": atype, "approver": lead, "data": {}}})
    assert r.code == "missing_required_fields"


def test_closed_ticket_cannot_change():
    s, _, _ = reset(EpisodeSpec("expense_report", 0, "none"))
    noise = next(t for t in s.world.ticketdesk.tickets if t != s.target["ticket"])
    s, _, _ = step(s, {"app": "ticketdesk", "method": "update_ticket",
                       "params": {"ticket_id": noise, "field": "status", "value": "closed"}})
    assert not s.done
    r = _rejected(s, {"app": "ticketdesk", "method": "update_ticket",
                      "params": {"ticket_id": noise, "field": "priority", "value": "low"}})
    assert r.code == "precondition_failed"


def test_parse_action_accepts_every_tool_with_its_required_params():
    samples = {"string": "x", "object": {}, "boolean": True}
    for t in TOOLS:
        props = t.parameters["properties"]
        params = {}
        for name in t.parameters["required"]:
            kind = props[name]["type"]
            kind = kind[0] if isinstance(kind, list) else kind
            params[name] = props[name].get("enum", [samples[kind]])[0]
        assert parse_action({"app": t.app, "method": t.method, "params": params}) == (
            t.app, t.method, params)


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(max_size=6), children, max_size=4),
    max_leaves=12)
_tool = st.sampled_from(TOOLS)


@st.composite
def _near_valid(draw):
    t = draw(_tool)
    params = {k: draw(_json) for k in t.parameters["properties"] if draw(st.booleans())}
    if draw(st.booleans()):
        params[draw(st.sampled_from(("bogus", "data", "ticket_id")))] = draw(_json)
    return {"app": t.app, "method": t.method, "params": params}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(action=_json | _near_valid() | st.tuples(st.integers(), st.text(max_size=3)))
def test_any_action_is_recorded_and_never_raises(action):
    state = reset(EpisodeSpec("bug_escalation", 1, "medium"))[0]
    s, events, info = step(state, action)
    taken = events[0]
    assert type(taken) is ActionTaken
    for e in events:
        t, data, v = to_envelope(e)
        text = json.dumps(data, sort_keys=True, allow_nan=False)
        assert from_envelope(t, json.loads(text), v) == e
    assert isinstance(info.message, str)


def test_an_integer_too_long_for_text_is_logged_and_judged_not_an_exception(fresh):
    """Python refuses to write an int of more than 4,300 digits: as a parameter, a key or the
    whole action, step raised ValueError instead of logging the action (as text, like any integer
    past 64 bits) and judging it."""
    huge = 10**5000
    assert _rejected(fresh, {"app": "ticketdesk", "method": "list_tickets",
                             "params": {huge: 1}}).code == "invalid_params"
    assert _rejected(fresh, huge).code == "malformed_action"
    logged = step(fresh, {"app": "ticketdesk", "method": "search_tickets",
                          "params": {"query": huge}})[1][0].action
    assert logged["params"]["query"] == "<integer of 16610 bits>"
    assert step(fresh, -huge)[1][0].action == "<negative integer of 16610 bits>"
    assert step(fresh, 10**1000)[1][0].action == str(10**1000)  # fewer digits: written out


def test_str_subclass_keys_and_values_are_their_text_as_json_writes_them(fresh):
    """A StrEnum key became "<K>", so {K.app: ..., K.method: ..., K.params: {}} was malformed."""
    import enum

    class Key(enum.StrEnum):
        APP = "app"
        METHOD = "method"
        PARAMS = "params"

    class App(str, enum.Enum):  # noqa: UP042 (the old style on purpose: its str() is "App.TICKETDESK")
        TICKETDESK = "ticketdesk"

    action = {Key.APP: App.TICKETDESK, Key.METHOD: "list_tickets", Key.PARAMS: {}}
    _, events, info = step(fresh, action)
    assert not info.rejected, info.message
    assert events[0].action == json.loads(json.dumps(action))
