"""ApprovalFlow: approval types and requests, as a decider.

Who may approve comes from DataHub's directory and what the reviewer will object to comes
from the records; both arrive inside the command, so ``decide`` stays a function of its
arguments.
"""

from __future__ import annotations

from typing import NamedTuple

from domain.events import (
    ApprovalDecided,
    ApprovalDelayed,
    ApprovalEscalated,
    ApprovalFieldsRequired,
    ApprovalFlagged,
    ApprovalPolled,
    ApprovalSubmitted,
    ApprovalTypeDefined,
    refused,
)
from domain.quoting import shown

# Building a NamedTuple through its class runs a Python-level __new__; on the hot path we call
# tuple.__new__ directly, which builds the same value in C (fields in declaration order).
_new = tuple.__new__


class ApprovalFlowState(NamedTuple):
    types: dict  # name -> approval type dict
    approvals: dict  # approval_id -> approval dict


initial_state = ApprovalFlowState({}, {})


class Command(NamedTuple):
    method: str
    params: dict
    step: int
    approver: dict | None = None  # the directory entry named by submit_approval
    chain: tuple = ()  # roles allowed to approve the type: its role and the delegates
    problems: list | None = None  # what the reviewer will object to in the submitted data


def _empty(v) -> bool:
    return v is None or (type(v) is str and not v.strip())


def decide(state: ApprovalFlowState, cmd: Command) -> list:
    """Events for one ApprovalFlow command; reads that change nothing give []."""
    method = cmd.method
    if method == "list_approval_types" or method == "list_approvals":
        return []
    params = cmd.params
    if method == "submit_approval":
        tname = params["approval_type"]
        atype = state.types.get(tname)
        if atype is None:
            return refused(cmd.step, "not_found", f"No approval type {shown(tname)}. Use "
                           "approvalflow.list_approval_types.")
        a = cmd.approver
        if a is None:
            return refused(cmd.step, "not_found",
                           f"No approver named {shown(params['approver'])} in the directory; "
                           "look the approver up with datahub.get_approver(role).")
        if a["role"] not in cmd.chain:
            return refused(cmd.step, "precondition_failed",
                           f"{a['name']} ({a['role']}) may not approve {tname}: it needs role "
                           f"{shown(atype['approver_role'])} or that role's delegate.")
        data = params["data"]
        missing = [f for f in atype["required_fields"] if _empty(data.get(f))]
        if missing:
            return refused(cmd.step, "missing_required_fields",
                           f"{tname} requires the fields {', '.join(atype['required_fields'])};"
                           f" missing: {', '.join(missing)}.")
        aid = f"APR-{1001 + len(state.approvals)}"
        return [ApprovalSubmitted(aid, tname, a["name"], a["role"], data, cmd.step,
                                  list(cmd.problems or ()), a["out_of_office"])]
    aid = params["approval_id"]
    ap = state.approvals.get(aid)
    if ap is None:
        return refused(cmd.step, "not_found",
                       f"No approval {shown(aid)}. Use approvalflow.list_approvals.")
    status = ap["status"]
    if method == "check_status":
        if status != "pending" and status != "escalated":
            return []
        if ap["polls_left"] > 0:
            return [ApprovalPolled(aid, ap["polls_left"] - 1)]
        if ap["problems"]:
            prefix = "Escalation upheld the rejection: " if status == "escalated" else ""
            return [ApprovalDecided(aid, "rejected", prefix + "; ".join(ap["problems"]),
                                    "rules", None)]
        if ap["flagged"] is not None and status == "pending":
            return [ApprovalDecided(aid, "rejected", ap["flagged"], "chaos",
                                    "random_rejection")]
        return [ApprovalDecided(aid, "approved", "Approved.", "rules", None)]
    # escalate
    reason = params["reason"].strip()
    if not reason:
        return refused(cmd.step, "invalid_params", "An escalation needs a reason.")
    if status != "rejected":
        return refused(cmd.step, "precondition_failed",
                       f"{aid} is {status}; only rejected approvals can be escalated.")
    if ap["escalated"]:
        return refused(cmd.step, "precondition_failed",
                       f"{aid} was already escalated once; submit a corrected request instead.")
    return [ApprovalEscalated(aid, reason[:500])]


# --- evolve ------------------------------------------------------------------------------


def _put_type(state, t):
    types = state.types.copy()
    types[t["name"]] = t
    return _new(ApprovalFlowState, (types, state.approvals))


def _put(state, ap):
    approvals = state.approvals.copy()
    approvals[ap["approval_id"]] = ap
    return _new(ApprovalFlowState, (state.types, approvals))


def _type_defined(state, e):
    return _put_type(state, {"name": e.name, "approver_role": e.approver_role,
                             "required_fields": e.required_fields,
                             "description": e.description})


def _fields_required(state, e):
    t = state.types[e.approval_type]
    extra = [f for f in e.fields if f not in t["required_fields"]]
    return _put_type(state, {**t, "required_fields": t["required_fields"] + extra})


def _submitted(state, e):
    return _put(state, {
        "approval_id": e.approval_id, "approval_type": e.approval_type, "approver": e.approver,
        "approver_role": e.approver_role, "data": e.data, "step": e.step,
        "problems": e.problems, "approver_out_of_office": e.approver_out_of_office,
        "status": "pending", "polls_left": 0, "flagged": None, "escalated": False,
        "reason": None,
    })


def _delayed(state, e):
    return _put(state, {**state.approvals[e.approval_id], "polls_left": e.polls})


def _flagged(state, e):
    return _put(state, {**state.approvals[e.approval_id], "flagged": e.reason})


def _polled(state, e):
    return _put(state, {**state.approvals[e.approval_id], "polls_left": e.polls_left})


def _decided(state, e):
    return _put(state, {**state.approvals[e.approval_id], "status": e.decision,
                        "reason": e.reason})


def _escalated(state, e):
    return _put(state, {**state.approvals[e.approval_id], "status": "escalated",
                        "escalated": True, "polls_left": 0, "reason": None})


EVOLVERS = {
    ApprovalTypeDefined: _type_defined,
    ApprovalFieldsRequired: _fields_required,
    ApprovalSubmitted: _submitted,
    ApprovalDelayed: _delayed,
    ApprovalFlagged: _flagged,
    ApprovalPolled: _polled,
    ApprovalDecided: _decided,
    ApprovalEscalated: _escalated,
}


def evolve(state: ApprovalFlowState, event) -> ApprovalFlowState:
    """Apply one ApprovalFlow fact. No rules, no randomness."""
    return EVOLVERS[type(event)](state, event)


# --- what the agent sees -----------------------------------------------------------------


def type_view(t: dict) -> dict:
    return {"name": t["name"], "description": t["description"],
            "approver_role": t["approver_role"], "required_fields": list(t["required_fields"])}


def approval_view(ap: dict) -> dict:
    return {"approval_id": ap["approval_id"], "approval_type": ap["approval_type"],
            "approver": ap["approver"], "status": ap["status"], "reason": ap["reason"]}


def result(method: str, state: ApprovalFlowState, params: dict, events: list):
    """(result, message) of a successful call, from the state before it and its events."""
    if method == "list_approval_types":
        return ({"approval_types": [type_view(t) for t in state.types.values()]},
                f"{len(state.types)} approval types.")
    if method == "list_approvals":
        return ({"approvals": [approval_view(a) for a in state.approvals.values()]},
                f"{len(state.approvals)} approvals.")
    if method == "submit_approval":
        e = events[0]
        return ({"approval_id": e.approval_id, "approval_type": e.approval_type,
                 "approver": e.approver, "status": "pending"},
                f"Submitted {e.approval_id} to {e.approver}; poll it with check_status.")
    aid = params["approval_id"]
    if method == "escalate":
        return ({"approval_id": aid, "status": "escalated"},
                f"{aid} escalated for review; poll it with check_status.")
    # check_status
    ap = state.approvals[aid]
    if not events:
        res = approval_view(ap)
        return res, f"{aid} is {ap['status']}."
    e = events[0]
    if type(e) is ApprovalPolled:
        return ({"approval_id": aid, "status": ap["status"], "reason": None},
                f"{aid} is still {ap['status']}; the reviewer has not decided yet.")
    res = {"approval_id": aid, "status": e.decision, "reason": e.reason}
    if e.decision == "rejected":
        return res, f"{aid} was REJECTED: {e.reason}"
    return res, f"{aid} was approved."


def view(state: ApprovalFlowState) -> dict:
    return {"approval_types": [type_view(t) for t in state.types.values()],
            "approvals": [{**a, "data": dict(a["data"]), "problems": list(a["problems"])}
                          for a in state.approvals.values()]}
