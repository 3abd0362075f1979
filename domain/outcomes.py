"""Termination: success predicates, mistakes and the failure-mode taxonomy.

Success is a predicate over the world (as in tau-bench and AppWorld). Mistakes are judged as
they happen and recorded as ``MistakeRecorded`` events; an irreversible one ends the episode
at once. When the step budget runs out, the failure mode is the first recorded mistake that
was never put right, so the episode is blamed on its first decisive error, not its last event.
"""

from __future__ import annotations

from domain.events import (
    ActionRejected,
    ApprovalDecided,
    ApprovalSubmitted,
    MistakeRecorded,
    TicketStatusChanged,
)
from domain.quoting import number_text, shown
from domain.rules import rules_of

FAILURE_MODES: dict[str, str] = {
    "stale_data_used": "acted on a metric value that was stale (the agent's last read was "
                       "stale, or the value had gone stale since): a wrong irreversible "
                       "decision, or figures the reviewer rejects and that were never fixed; from "
                       "rules version 2 also an irreversible decision made with no fresh read at "
                       "all, only stale ones",
    "wrong_decision": "read fresh data and still decided wrongly: pushed through a request "
                      "the policy forbids, or closed one the policy allows",
    "irreversible_action": "made the irreversible decision (closed the ticket or submitted the "
                           "request) without ever reading the data it depends on (version 1 "
                           "blamed only the wrong decisions; version 2 the right ones too)",
    "routed_to_ooo_approver": "submitted an approval request to an approver who is out of "
                              "office",
    "blocked_ticket_mishandled": "closed a blocked ticket, or closed a blocker instead of "
                                 "resolving it",
    "missing_required_fields": "an approval request was refused for missing required fields "
                               "and never resubmitted complete",
    "incorrect_submission": "submitted fields that do not match the ticket (or, from rules "
                            "version 2, sent the request to a delegate while an approver before "
                            "them was available) and never submitted a corrected request",
    "rejection_not_handled": "an approval request was rejected and was neither escalated nor "
                             "resubmitted",
    "premature_resolution": "resolved the task's ticket before the task was done (not verified, "
                            "no approved request linked, a required field unset, or a request "
                            "to decline), never finished it and left no other mistake unrepaired "
                            "(from rules version 2)",
    "unrequested_submission": "submitted an approval request of a type the task does not ask for "
                              "(from rules version 4)",
    "invalid_tool_calls": "ran out of steps with no decisive mistake, but at least half of the "
                          "steps were malformed, unknown or failed calls",
    "step_budget_exhausted": "ran out of steps with no identifiable mistake (too slow or "
                             "stuck)",
}
FIRST_JUDGED_BY: dict[str, int] = {"premature_resolution": 2, "unrequested_submission": 4}
"""The rules version that introduced a failure mode; the others are version 1's. An episode judged by
an older version never carries a newer mode."""

# --- comparing submitted values with the records -----------------------------------------


def same(given, expected) -> bool:
    """Lenient equality for submitted values: numbers by value, text case-insensitively."""
    if type(given) is bool or type(expected) is bool:
        return given is expected
    if isinstance(expected, (int, float)):
        if isinstance(given, str):
            spelled = number_text(given.strip().replace(",", ""))  # digits as 3.11 reads them
            if spelled is None:
                return False
            try:
                given = float(spelled)
            except ValueError:
                return False
        if isinstance(given, (int, float)):
            return abs(given - expected) < 1e-6
        return False
    if isinstance(given, str) and isinstance(expected, str):
        return given.strip().casefold() == expected.strip().casefold()
    return given == expected


def review(target: dict, world, approval_type: str, data: dict) -> list[str]:
    """What the reviewer will object to in a submission: fields not matching the records.

    Only the task's own approval type is checked; fields are compared with the main ticket's
    details and the metric field with DataHub's current source value.
    """
    if approval_type != target["approval_type"]:
        return []
    problems = []
    for name, expected in target["fields"].items():
        if name in data and not same(data[name], expected):
            problems.append(f"{name} {_shown(data[name])} does not match ticket {target['ticket']}")
    field = target["field"]
    if field in data:
        true = world.datahub.metrics[target["metric"]]["true_value"]
        if not same(data[field], true):
            problems.append(f"{field} {_shown(data[field])} does not match the current DataHub "
                            f"value of {target['metric']}")
    return problems


def _shown(value) -> str:
    """A submitted value in words, its objects' keys sorted: the log keeps them sorted, so the text
    must not follow the order the agent sent them in (a rerun would differ from the live episode)."""
    return shown(_keys_sorted(value))


def _keys_sorted(value):
    if type(value) is dict:
        return {k: _keys_sorted(value[k]) for k in sorted(value, key=str)}
    if type(value) is list:
        return [_keys_sorted(v) for v in value]
    return value


def routing_problem(target: dict, world, approval_type: str, approver: dict, chain: tuple) -> str | None:
    """From rules version 2, what the reviewer objects to in a request of the task's type sent down
    the delegation chain past an available approver (version 1 accepted anyone on the chain)."""
    if (rules_of(target) < 2 or approval_type != target["approval_type"]
            or approver["role"] not in chain or approver["out_of_office"]):
        return None
    approvers = world.datahub.approvers
    first = next((role for role in chain if not approvers[role]["out_of_office"]), None)
    if first is None or first == approver["role"]:
        return None
    # who is available is not said: naming them let an agent send every request to the end of
    # the chain and resubmit to the name the objection gave, never checking who was away
    return (f"{approver['name']} ({approver['role']}) is a delegate, and an approver before them "
            "on the delegation chain is available to approve it")


# --- success -----------------------------------------------------------------------------


def approved_request_linked(world, target: dict) -> bool:
    """Whether the task's ticket is linked to an approved request of the task's type."""
    t = world.ticketdesk.tickets[target["ticket"]]
    a = world.approvalflow.approvals.get(t["linked_approval"])
    return (a is not None and a["status"] == "approved" and not a["problems"]
            and a["approval_type"] == target["approval_type"])


def is_success(world, target: dict) -> bool:
    t = world.ticketdesk.tickets[target["ticket"]]
    status = t["status"]
    if status != "resolved" and status != "closed":
        return False
    if target["expected"] == "proceed":
        if status != "resolved" or not t["verified"] or not approved_request_linked(world, target):
            return False
        return all(t[k] == v for k, v in target["requirements"].items())
    atype = target["approval_type"]
    return (status == "closed" and bool(t["comments"])
            and not any(a["approval_type"] == atype for a in world.approvalflow.approvals.values()))


def unfinished(world, target: dict) -> list[str]:
    """What stands between the task's ticket and success, in words (for an analyst reading the
    log: the agent is not shown it)."""
    if target["expected"] == "decline":
        return ["the request does not qualify: the ticket is to be closed with a comment"]
    t = world.ticketdesk.tickets[target["ticket"]]
    missing = [] if t["verified"] else ["not verified"]
    if not approved_request_linked(world, target):
        missing.append("no approved request linked")
    missing += [f"{k} is not {v}" for k, v in target["requirements"].items() if t[k] != v]
    return missing


# --- mistakes ----------------------------------------------------------------------------


def _decision_mode(world, target: dict) -> str:
    """The mode of a wrong irreversible decision (after `stale_again` the value stays on its side
    of the policy, so a decision that was wrong on a fresh read is a wrong decision)."""
    seen = world.datahub.metrics[target["metric"]]["seen"]
    if seen is None:
        return "irreversible_action"
    return "stale_data_used" if seen[1] else "wrong_decision"


def uninformed(world, target: dict) -> str | None:
    """From rules version 2, the mode of an irreversible decision of the right kind made without
    any fresh read of the decision metric: right by luck. Version 1 let a blind decline succeed,
    and a request sent with the threshold the goal names as its figure (an equality policy)."""
    if rules_of(target) < 2:
        return None
    m = world.datahub.metrics[target["metric"]]
    if m["seen"] is None:
        return "irreversible_action"
    return "stale_data_used" if m["fresh_queries"] == 0 else None


def judge(state, params, effects: list) -> list:
    """MistakeRecorded events for this step's effects, given the state after them."""
    tg = state.target
    world = state.world
    step = state.step
    found = []
    for e in effects:
        t = type(e)
        if t is TicketStatusChanged:
            if e.status != "closed":
                if (e.status == "resolved" and e.ticket_id == tg["ticket"] and rules_of(tg) >= 2
                        and not is_success(world, tg)):
                    found.append(MistakeRecorded(step, "premature_resolution", e.ticket_id,
                                                 f"resolved {e.ticket_id} before the task was "
                                                 f"done: {'; '.join(unfinished(world, tg))}",
                                                 False))
                continue
            tickets = world.ticketdesk.tickets
            tk = tickets[e.ticket_id]
            if tk["blocked_by"] is not None:
                found.append(MistakeRecorded(step, "blocked_ticket_mishandled", e.ticket_id,
                                             f"closed {e.ticket_id} while it was blocked by "
                                             f"{tk['blocked_by']}", True))
            elif any(o["blocked_by"] == e.ticket_id for o in tickets.values()):
                found.append(MistakeRecorded(step, "blocked_ticket_mishandled", e.ticket_id,
                                             f"closed the blocker {e.ticket_id} instead of "
                                             "resolving it", True))
            elif e.ticket_id == tg["ticket"] and tg["expected"] == "proceed":
                found.append(MistakeRecorded(step, _decision_mode(world, tg), e.ticket_id,
                                             f"closed {e.ticket_id} although the request "
                                             "qualifies", True))
            elif e.ticket_id == tg["ticket"] and (mode := uninformed(world, tg)):
                found.append(MistakeRecorded(step, mode, e.ticket_id,
                                             f"closed {e.ticket_id} without a fresh read of "
                                             f"{tg['metric']}", True))
        elif t is ApprovalSubmitted:
            if e.approver_out_of_office:
                found.append(MistakeRecorded(step, "routed_to_ooo_approver", e.approval_id,
                                             f"submitted {e.approval_id} to {e.approver}, who "
                                             "is out of office", True))
            elif e.approval_type != tg["approval_type"]:
                if rules_of(tg) >= 4:
                    found.append(MistakeRecorded(step, "unrequested_submission", e.approval_id,
                                                 f"submitted {e.approval_id}, a '{e.approval_type}' "
                                                 "request the task does not ask for", True))
            elif tg["expected"] == "decline":
                found.append(MistakeRecorded(step, _decision_mode(world, tg),
                                             e.approval_id, f"submitted {e.approval_id} "
                                             "although the request does not qualify", True))
            elif mode := uninformed(world, tg):
                found.append(MistakeRecorded(step, mode, e.approval_id,
                                             f"submitted {e.approval_id} without a fresh read "
                                             f"of {tg['metric']}", True))
            elif e.problems:
                m = world.datahub.metrics[tg["metric"]]
                stale = (tg["field"] in e.data
                         and not same(e.data[tg["field"]], m["true_value"])
                         and (m["stale"] or (m["seen"] is not None and m["seen"][1])))
                found.append(MistakeRecorded(
                    step, "stale_data_used" if stale else "incorrect_submission",
                    e.approval_type, "; ".join(e.problems), False))
        elif t is ActionRejected:
            if (e.code == "missing_required_fields"
                    and params.get("approval_type") == tg["approval_type"]
                    and (tg["expected"] == "proceed" or rules_of(tg) < 4)):
                found.append(MistakeRecorded(step, "missing_required_fields",
                                             tg["approval_type"], e.reason, False))
        elif (t is ApprovalDecided and e.decision == "rejected"
              and world.approvalflow.approvals[e.approval_id]["approval_type"]
              == tg["approval_type"]):
            found.append(MistakeRecorded(step, "rejection_not_handled", e.approval_id,
                                         e.reason, False))
    if not found:
        return found
    # a recoverable mistake is recorded once per (mode, subject)
    known = [(m.mode, m.subject) for m in state.mistakes]
    return [m for m in found if m.irreversible or (m.mode, m.subject) not in known]


def _resolved(m, world) -> bool:
    approvals = world.approvalflow.approvals
    if m.mode == "rejection_not_handled":
        a = approvals[m.subject]
        if a["escalated"]:
            return True
        atype = a["approval_type"]
        return any(b["approval_type"] == atype and b["step"] > m.step for b in approvals.values())
    if m.mode == "missing_required_fields":
        return any(b["approval_type"] == m.subject and b["step"] > m.step
                   for b in approvals.values())
    return any(b["approval_type"] == m.subject and b["step"] > m.step and not b["problems"]
               for b in approvals.values())


def counts_as_mistake(mistake, world) -> bool:
    """Whether a recorded mistake is one, given the world at the episode's end: a rejection is
    recorded when it happens, but it is the agent's mistake only if it is never handled (chaos
    rejects correct requests, and the agent that escalates or resubmits made none). As the
    analytics count `mistakes` and `first_mistake_step`."""
    return not (mistake.mode == "rejection_not_handled" and _resolved(mistake, world))


def truncation_mode(state) -> str:
    """Failure mode of an episode that ran out of steps. A premature resolution is blamed only
    when no other mistake was left unrepaired: resolving early is harmless once the work is
    finished, so it must not hide the mistake that kept the work from being finished."""
    unrepaired = [m.mode for m in state.mistakes
                  if not m.irreversible and not _resolved(m, state.world)]
    for mode in unrepaired:
        if mode != "premature_resolution":
            return mode
    if unrepaired:
        return "premature_resolution"
    if state.rejected_calls * 2 >= state.step:
        return "invalid_tool_calls"
    return "step_budget_exhausted"
