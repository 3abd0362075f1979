"""DataHub: business metrics (possibly stale) and the approver directory, as a decider."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import NamedTuple

from domain.events import (
    ApproverLookedUp,
    ApproverRegistered,
    ApproverWentOutOfOffice,
    MetricPublished,
    MetricQueried,
    MetricRefreshDelayed,
    MetricRefreshed,
    MetricRefreshStarted,
    MetricWentStale,
    refused,
)
from domain.quoting import shown

TODAY = "2024-03-15"  # the simulated date of every episode (time inside events is simulated)
_EPOCH = datetime.fromisoformat(TODAY).replace(hour=9, tzinfo=UTC)


def sim_time(step: int) -> str:
    """Simulated ISO time of a step: 09:00 UTC on TODAY plus one minute per step."""
    return (_EPOCH + timedelta(minutes=step)).isoformat()

# Building a NamedTuple through its class runs a Python-level __new__; on the hot path we call
# tuple.__new__ directly, which builds the same value in C (fields in declaration order).
_new = tuple.__new__


class DataHubState(NamedTuple):
    metrics: dict  # name -> metric dict
    approvers: dict  # role -> approver dict


initial_state = DataHubState({}, {})


class Command(NamedTuple):
    method: str
    params: dict
    step: int
    # rules version 3 on: a metric read while a refresh runs is as stale as the metric is (before,
    # always stale: a fresh metric refreshed needlessly read as stale, and a decision on it was
    # labelled stale_data_used)
    refresh_keeps_freshness: bool


def decide(state: DataHubState, cmd: Command) -> list:
    """Events for one DataHub command; reads that change nothing give []."""
    method = cmd.method
    if method == "list_metrics":
        return []
    if method == "get_approver":
        role = cmd.params["role"]
        a = state.approvers.get(role)
        if a is None:
            return refused(cmd.step, "not_found",
                           f"No approver with role {shown(role)}. Known roles: "
                           f"{', '.join(state.approvers)}.")
        return [ApproverLookedUp(role, a["name"], a["out_of_office"])]
    name = cmd.params["metric_name"]
    m = state.metrics.get(name)
    if m is None:
        return refused(cmd.step, "not_found",
                       f"No metric {shown(name)}. Use datahub.list_metrics.")
    if method == "refresh_data":
        if m["refreshing"]:
            return []  # already running: the call succeeds and changes nothing
        return [MetricRefreshStarted(name)]
    # query_metric
    if m["refreshing"]:
        if m["polls_left"] > 0:
            stale = m["stale"] if cmd.refresh_keeps_freshness else True
            return [MetricQueried(name, m["value"], stale, True, m["polls_left"] - 1)]
        return [MetricRefreshed(name, m["true_value"], m["value"], m["stale"], TODAY),
                MetricQueried(name, m["true_value"], False, False, 0)]
    return [MetricQueried(name, m["value"], m["stale"], False, 0)]


# --- evolve ------------------------------------------------------------------------------


def _put_metric(state: DataHubState, m: dict) -> DataHubState:
    metrics = state.metrics.copy()
    metrics[m["name"]] = m
    return _new(DataHubState, (metrics, state.approvers))


def _put_approver(state: DataHubState, a: dict) -> DataHubState:
    approvers = state.approvers.copy()
    approvers[a["role"]] = a
    return _new(DataHubState, (state.metrics, approvers))


def _published(state, e):
    return _put_metric(state, {
        "name": e.name, "value": e.value, "unit": e.unit, "description": e.description,
        "as_of": e.as_of, "stale": False, "true_value": e.value, "refreshing": False,
        "polls_left": 0, "fresh_queries": 0, "seen": None,
    })


def _went_stale(state, e):
    return _put_metric(state, {**state.metrics[e.name], "value": e.value,
                               "true_value": e.true_value, "as_of": e.as_of, "stale": True})


def _queried(state, e):
    m = state.metrics[e.name]
    return _put_metric(state, {
        **m, "polls_left": e.polls_left,
        "fresh_queries": m["fresh_queries"] + (not e.stale),
        "seen": [e.value, e.stale],
    })


def _refresh_started(state, e):
    return _put_metric(state, {**state.metrics[e.name], "refreshing": True, "polls_left": 0})


def _refresh_delayed(state, e):
    return _put_metric(state, {**state.metrics[e.name], "polls_left": e.polls})


def _refreshed(state, e):
    return _put_metric(state, {**state.metrics[e.name], "value": e.value, "true_value": e.value,
                               "stale": False, "refreshing": False, "polls_left": 0,
                               "as_of": e.as_of})


def _registered(state, e):
    return _put_approver(state, {
        "role": e.role, "name": e.name, "email": e.email, "title": e.title,
        "delegate_role": e.delegate_role, "out_of_office": False, "until": None, "lookups": 0,
    })


def _ooo(state, e):
    return _put_approver(state, {**state.approvers[e.role], "out_of_office": True,
                                 "until": e.until})


def _looked_up(state, e):
    a = state.approvers[e.role]
    return _put_approver(state, {**a, "lookups": a["lookups"] + 1})


EVOLVERS = {
    MetricPublished: _published,
    MetricWentStale: _went_stale,
    MetricQueried: _queried,
    MetricRefreshStarted: _refresh_started,
    MetricRefreshDelayed: _refresh_delayed,
    MetricRefreshed: _refreshed,
    ApproverRegistered: _registered,
    ApproverWentOutOfOffice: _ooo,
    ApproverLookedUp: _looked_up,
}


def evolve(state: DataHubState, event) -> DataHubState:
    """Apply one DataHub fact. No rules, no randomness."""
    return EVOLVERS[type(event)](state, event)


# --- queries used by the other apps and the judge ------------------------------------------


def approver_by_name(state: DataHubState, name: str) -> dict | None:
    for a in state.approvers.values():
        if a["name"] == name:
            return a
    return None


def delegation_chain(state: DataHubState, role: str) -> list[str]:
    """role, its delegate, the delegate's delegate, ... (no repeats)."""
    chain = []
    while role is not None and role in state.approvers and role not in chain:
        chain.append(role)
        role = state.approvers[role]["delegate_role"]
    return chain


# --- what the agent sees -----------------------------------------------------------------


def _approver_view(state: DataHubState, a: dict) -> dict:
    d = state.approvers.get(a["delegate_role"]) if a["delegate_role"] else None
    return {"role": a["role"], "name": a["name"], "email": a["email"], "title": a["title"],
            "out_of_office": a["out_of_office"], "until": a["until"],
            "delegate_role": a["delegate_role"], "delegate_name": d["name"] if d else None}


def result(method: str, state: DataHubState, params: dict, events: list):
    """(result, message) of a successful call, from the state before it and its events."""
    if method == "list_metrics":
        return ({"metrics": [{"name": m["name"], "description": m["description"],
                              "unit": m["unit"]} for m in state.metrics.values()]},
                f"{len(state.metrics)} metrics.")
    if method == "get_approver":
        a = state.approvers[params["role"]]
        res = _approver_view(state, a)
        if a["out_of_office"]:
            res["warnings"] = [
                f"{a['name']} is out of office until {a['until']}; requests routed to them "
                f"will not be handled. Delegate: role {shown(a['delegate_role'])} "
                f"({res['delegate_name']})."]
            return res, f"{a['name']} ({a['role']}) is OUT OF OFFICE."
        res["warnings"] = []
        return res, f"{a['name']} ({a['role']}) is available."
    name = params["metric_name"]
    m = state.metrics[name]
    if method == "refresh_data":
        if not events:
            return ({"metric": name, "status": "refreshing"},
                    f"A refresh of {name} is already running; query the metric to poll it.")
        return ({"metric": name, "status": "refreshing"},
                f"Refresh of {name} started; query the metric to read the fresh value.")
    q = events[-1]
    res = {"metric": name, "value": q.value, "unit": m["unit"],
           "as_of": TODAY if len(events) == 2 else m["as_of"], "stale": q.stale,
           "refreshing": q.refreshing, "warnings": []}
    if q.refreshing:  # from rules version 3 a metric that was fresh already reads fresh
        value_is = "the old, stale one" if q.stale else "current all the same"
        res["warnings"].append(f"A refresh of {name} is still running; the value shown is "
                               f"{value_is}. Query again to poll.")
        return res, f"{name} = {q.value} ({'STALE, ' if q.stale else ''}refresh running)."
    if q.stale:
        res["warnings"].append(f"{name} is stale (last updated {m['as_of']}); call "
                               "datahub.refresh_data before relying on it.")
        return res, f"{name} = {q.value} (STALE)."
    return res, f"{name} = {q.value}."


def view(state: DataHubState) -> dict:
    return {
        "metrics": [{k: (list(v) if isinstance(v, list) else v) for k, v in m.items()}
                    for m in state.metrics.values()],
        "approvers": [dict(a) for a in state.approvers.values()],
    }
