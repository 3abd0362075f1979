"""TicketDesk: the ticket tracker, as a decider.

State entities are plain dicts that are never mutated after construction (copy on write);
``evolve`` copies only the ticket an event touches.
"""

from __future__ import annotations

from typing import NamedTuple

from domain.events import (
    TicketApprovalLinked,
    TicketAssigned,
    TicketBlocked,
    TicketCommentAdded,
    TicketCreated,
    TicketFieldCleared,
    TicketPriorityChanged,
    TicketStatusChanged,
    TicketUnblocked,
    TicketVerificationChanged,
    refused,
)
from domain.quoting import shown

PRIORITIES = ("low", "medium", "high", "critical")
SETTABLE_STATUSES = ("open", "in_progress", "resolved", "closed")
FIELDS = ("priority", "assignee", "status", "verified", "linked_approval")
MAX_TEXT = 1000

# Building a NamedTuple through its class runs a Python-level __new__; on the hot path we call
# tuple.__new__ directly, which builds the same value in C (fields in declaration order).
_new = tuple.__new__


class TicketDeskState(NamedTuple):
    tickets: dict  # ticket_id -> ticket dict


initial_state = TicketDeskState({})


class Command(NamedTuple):
    method: str
    params: dict
    step: int
    approval_ids: object = ()  # container of existing approval ids (for linked_approval)


def _missing_fields(t: dict) -> list[str]:
    return [f for f in ("priority", "assignee", "status") if t[f] is None]


# --- decide ------------------------------------------------------------------------------


def decide(state: TicketDeskState, cmd: Command) -> list:
    """Events for one TicketDesk command; reads that change nothing give []."""
    method = cmd.method
    if method == "list_tickets" or method == "search_tickets":
        return []
    params = cmd.params
    tid = params["ticket_id"]
    t = state.tickets.get(tid)
    if t is None:
        return refused(cmd.step, "not_found",
                       f"No ticket {shown(tid)}. Use ticketdesk.list_tickets or search_tickets.")
    if method == "get_ticket":
        return []
    if method == "add_comment":
        text = params["text"].strip()
        if not text:
            return refused(cmd.step, "invalid_params", "A comment needs some text.")
        return [TicketCommentAdded(tid, text[:MAX_TEXT], cmd.step)]
    # update_ticket
    field = params["field"]
    value = params["value"]
    if t["status"] == "closed":
        return refused(cmd.step, "precondition_failed",
                       f"{tid} is closed; closed tickets cannot be changed.")
    if field == "priority":
        if value not in PRIORITIES:
            return refused(cmd.step, "invalid_params",
                           f"priority must be one of {', '.join(PRIORITIES)}; got {shown(value)}.")
        return [TicketPriorityChanged(tid, value, t["priority"])]
    if field == "assignee":
        if type(value) is not str or not value.strip() or len(value) > 100:
            return refused(cmd.step, "invalid_params", "assignee must be a person's name.")
        return [TicketAssigned(tid, value.strip(), t["assignee"])]
    if field == "verified":
        if type(value) is not bool:
            return refused(cmd.step, "invalid_params", "verified must be true or false.")
        return [TicketVerificationChanged(tid, value)]
    if field == "linked_approval":
        if value is not None and (type(value) is not str or value not in cmd.approval_ids):
            return refused(cmd.step, "not_found",
                           f"No approval {shown(value)}. Use approvalflow.list_approvals.")
        return [TicketApprovalLinked(tid, value, t["linked_approval"])]
    # status
    if value not in SETTABLE_STATUSES:
        if value == "blocked":
            return refused(cmd.step, "invalid_params",
                           "status 'blocked' is set by dependencies, not by hand.")
        return refused(cmd.step, "invalid_params",
                       f"status must be one of {', '.join(SETTABLE_STATUSES)}; got {shown(value)}.")
    if t["blocked_by"] is not None and value != "closed":
        return refused(cmd.step, "precondition_failed",
                       f"{tid} is blocked by {t['blocked_by']}; deal with the blocker first.")
    if value == "resolved":
        if t["status"] is None:
            return refused(cmd.step, "precondition_failed",
                           f"{tid} has no status; set it to open or in_progress first.")
        missing = [f for f in ("priority", "assignee") if t[f] is None]
        if missing:
            return refused(cmd.step, "precondition_failed",
                           f"{tid} cannot be resolved before it is triaged: missing "
                           f"{' and '.join(missing)}.")
    events = [TicketStatusChanged(tid, value, t["status"])]
    if value == "resolved":
        for other in state.tickets.values():
            if other["blocked_by"] == tid:
                events.append(TicketUnblocked(other["ticket_id"], tid))
    return events


# --- evolve ------------------------------------------------------------------------------


def _put(state: TicketDeskState, ticket: dict) -> TicketDeskState:
    tickets = state.tickets.copy()
    tickets[ticket["ticket_id"]] = ticket
    return _new(TicketDeskState, (tickets,))


def _created(state, e):
    return _put(state, {
        "ticket_id": e.ticket_id, "title": e.title, "description": e.description,
        "status": e.status, "priority": e.priority, "assignee": e.assignee,
        "verified": False, "blocked_by": None, "linked_approval": None,
        "details": e.details, "comments": (),
    })


def _field_cleared(state, e):
    return _put(state, {**state.tickets[e.ticket_id], e.field: None})


def _blocked(state, e):
    return _put(state, {**state.tickets[e.ticket_id], "blocked_by": e.blocked_by,
                        "status": "blocked"})


def _unblocked(state, e):
    return _put(state, {**state.tickets[e.ticket_id], "blocked_by": None, "status": "open"})


def _priority(state, e):
    return _put(state, {**state.tickets[e.ticket_id], "priority": e.priority})


def _assigned(state, e):
    return _put(state, {**state.tickets[e.ticket_id], "assignee": e.assignee})


def _status(state, e):
    return _put(state, {**state.tickets[e.ticket_id], "status": e.status})


def _verified(state, e):
    return _put(state, {**state.tickets[e.ticket_id], "verified": e.verified})


def _linked(state, e):
    return _put(state, {**state.tickets[e.ticket_id], "linked_approval": e.approval_id})


def _commented(state, e):
    t = state.tickets[e.ticket_id]
    return _put(state, {**t, "comments": (*t["comments"], e.text)})


EVOLVERS = {
    TicketCreated: _created,
    TicketFieldCleared: _field_cleared,
    TicketBlocked: _blocked,
    TicketUnblocked: _unblocked,
    TicketPriorityChanged: _priority,
    TicketAssigned: _assigned,
    TicketStatusChanged: _status,
    TicketVerificationChanged: _verified,
    TicketApprovalLinked: _linked,
    TicketCommentAdded: _commented,
}


def evolve(state: TicketDeskState, event) -> TicketDeskState:
    """Apply one TicketDesk fact. No rules, no randomness."""
    return EVOLVERS[type(event)](state, event)


# --- what the agent sees -----------------------------------------------------------------


def summary(t: dict) -> dict:
    return {"ticket_id": t["ticket_id"], "title": t["title"], "status": t["status"],
            "priority": t["priority"], "assignee": t["assignee"]}


def full(t: dict) -> dict:
    return {
        "ticket_id": t["ticket_id"], "title": t["title"], "description": t["description"],
        "status": t["status"], "priority": t["priority"], "assignee": t["assignee"],
        "verified": t["verified"], "blocked_by": t["blocked_by"],
        "linked_approval": t["linked_approval"], "details": dict(t["details"]),
        "comments": list(t["comments"]),
    }


def warnings_of(t: dict) -> list[str]:
    out = []
    if t["blocked_by"] is not None:
        out.append(f"{t['ticket_id']} is blocked by {t['blocked_by']}: resolve the blocker "
                   "first (closing a blocked ticket is irreversible).")
    missing = _missing_fields(t)
    if missing:
        out.append(f"{t['ticket_id']} is missing: {', '.join(missing)}.")
    return out


def result(method: str, state: TicketDeskState, params: dict, events: list):
    """(result, message) of a successful call, from the state before it and its events."""
    if method == "list_tickets":
        tickets = [summary(t) for t in state.tickets.values()]
        return {"tickets": tickets}, f"{len(tickets)} tickets."
    if method == "search_tickets":
        q = params["query"].strip().casefold()
        hits = [summary(t) for t in state.tickets.values()
                if q in t["title"].casefold() or q in t["description"].casefold()
                or q == t["ticket_id"].casefold()]
        return {"query": params["query"], "tickets": hits}, f"{len(hits)} tickets match."
    if method == "get_ticket":
        t = state.tickets[params["ticket_id"]]
        return {"ticket": full(t), "warnings": warnings_of(t)}, f"Ticket {t['ticket_id']}."
    e = events[0]
    if method == "add_comment":
        return ({"ticket_id": e.ticket_id, "comment": e.text},
                f"Comment added to {e.ticket_id}.")
    field = params["field"]
    value = e.verified if field == "verified" else getattr(e, _EVENT_FIELD[field])
    res = {"ticket_id": e.ticket_id, "field": field, "value": value}
    if field != "verified":
        res["previous"] = e.previous
    unblocked = [u.ticket_id for u in events[1:]]
    if unblocked:
        res["unblocked"] = unblocked
        return res, (f"{e.ticket_id} {field} set to {shown(value)}; now unblocked: "
                     f"{', '.join(unblocked)}.")
    return res, f"{e.ticket_id} {field} set to {shown(value)}."


_EVENT_FIELD = {"priority": "priority", "assignee": "assignee", "status": "status",
                "linked_approval": "approval_id"}


def view(state: TicketDeskState) -> dict:
    return {"tickets": [full(t) for t in state.tickets.values()]}
