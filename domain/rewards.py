"""Rewards as data: a rule watches one event type, tests a predicate over the event and the
episode state, and pays a value, optionally only once per episode.

Every payment is a ``RewardGranted{rule, value, cause}`` event whose ``cause`` is the stream
version of the event that triggered it. Milestones (positive shaping rules) pay once, so
nothing can be farmed; penalties pay every time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from domain.events import (
    ActionRejected,
    ActionTaken,
    ApprovalDecided,
    ApprovalSubmitted,
    EpisodeEnded,
    MetricQueried,
    MetricRefreshed,
    RewardGranted,
    TicketPriorityChanged,
    TicketUnblocked,
    TicketVerificationChanged,
)
from domain.outcomes import approved_request_linked
from domain.rules import rules_of


class RewardRule(NamedTuple):
    name: str
    event_type: type
    predicate: Callable | None  # (event, state) -> bool; None means always
    value: float
    once: bool
    description: str


_AGENT_ERRORS = ("unknown_tool", "malformed_action")


def _verified_when_due(e, s) -> bool:
    """The task's ticket marked verified; from rules version 2 only once it is linked to the
    approved request of the task's type (version 1 paid for verifying nothing)."""
    target = s.target
    if not e.verified or e.ticket_id != target["ticket"]:
        return False
    return rules_of(target) < 2 or approved_request_linked(s.world, target)


def _missing_priority_set(e, s) -> bool:
    """A priority set where chaos had cleared it; from rules version 3 only on the task's ticket of
    a task that goes ahead (version 2 paid +1 for triaging a ticket a decline only closes, so an
    agent that did it beat the expert's return)."""
    if e.previous is not None:
        return False
    target = s.target
    return rules_of(target) < 3 or (target["expected"] == "proceed" and e.ticket_id == target["ticket"])


def _valid_submission(e, s) -> bool:
    """A correct request of the task's type to an available approver; from rules version 2 only one
    the policy allows, made on a fresh read (version 1 paid +2 for the request that ended the
    episode as a wrong decision, and for one whose figure was a guess)."""
    target = s.target
    if e.approval_type != target["approval_type"] or e.problems or e.approver_out_of_office:
        return False
    return rules_of(target) < 2 or (target["expected"] == "proceed"
                                    and s.world.datahub.metrics[target["metric"]]["fresh_queries"] > 0)


def _is_task_approval(e, s) -> bool:
    return (s.world.approvalflow.approvals[e.approval_id]["approval_type"]
            == s.target["approval_type"])


DEFAULT = (
    RewardRule("step", ActionTaken, None, -0.1, False, "every step costs a little"),
    RewardRule("set_missing_priority", TicketPriorityChanged, _missing_priority_set, 1.0, True,
               "set a missing priority (from rules version 3: the task's ticket's, where the task "
               "goes ahead)"),
    RewardRule("verify_ticket", TicketVerificationChanged, _verified_when_due, 1.5, True,
               "mark the task's ticket verified (from rules version 2: once it is linked to the "
               "approved request)"),
    RewardRule("unblock", TicketUnblocked, None, 1.0, True, "unblock a ticket"),
    RewardRule("refresh_stale_metric", MetricRefreshed, lambda e, s: e.was_stale, 1.0, True,
               "complete a refresh of a stale metric"),
    RewardRule("query_fresh_data", MetricQueried,
               lambda e, s: not e.stale and e.name == s.target["metric"], 0.5, True,
               "read the decision metric while it is fresh"),
    RewardRule("valid_submission", ApprovalSubmitted, _valid_submission, 2.0, True,
               "submit a correct request to an available approver (from rules version 2: a "
               "request that qualifies, made after a fresh read)"),
    RewardRule("approved", ApprovalDecided,
               lambda e, s: e.decision == "approved" and _is_task_approval(e, s), 3.0, True,
               "get the task's request approved"),
    RewardRule("failed_call", ActionRejected,
               lambda e, s: e.cause != "chaos" and e.code not in _AGENT_ERRORS, -0.3, False,
               "a call the app refused (bad parameters, not found, precondition)"),
    RewardRule("unknown_tool", ActionRejected, lambda e, s: e.code in _AGENT_ERRORS, -1.0,
               False, "a malformed action or an unknown tool"),
    RewardRule("rejection", ApprovalDecided, lambda e, s: e.decision == "rejected", -0.5,
               False, "an approval request was rejected"),
    RewardRule("success", EpisodeEnded, lambda e, s: e.outcome == "success", 15.0, True,
               "the task is done"),
    RewardRule("timeout", EpisodeEnded, lambda e, s: e.outcome == "truncated", -5.0, True,
               "the step budget ran out"),
    RewardRule("irreversible_mistake", EpisodeEnded, lambda e, s: e.outcome == "failure",
               -10.0, True, "the episode ended on an irreversible mistake"),
)

SPARSE = (
    RewardRule("success", EpisodeEnded, lambda e, s: e.outcome == "success", 1.0, True,
               "the task is done"),
)

REWARD_PROFILES: dict[str, tuple[RewardRule, ...]] = {"default": DEFAULT, "sparse": SPARSE}


def reward_profile(name: str) -> str:
    """`name`, when it names a profile; a ValueError naming every profile otherwise (the one check of
    a profile name, as task_family is of a task name: for the reset and every analytics filter)."""
    if not isinstance(name, str) or name not in REWARD_PROFILES:
        raise ValueError(f"no reward profile {name!r}; the profiles are {', '.join(REWARD_PROFILES)}")
    return name


def _index(rules) -> dict[type, tuple]:
    idx: dict[type, tuple] = {}
    for r in rules:
        idx[r.event_type] = (*idx.get(r.event_type, ()), (r.name, r.value, r.once, r.predicate))
    return idx


_INDEX = {name: _index(rules) for name, rules in REWARD_PROFILES.items()}
# rule names that pay once in some profile: the state remembers when these were paid
ONCE_RULES = frozenset(r.name for rules in REWARD_PROFILES.values() for r in rules if r.once)
_new = tuple.__new__  # builds a NamedTuple in C, skipping its Python-level __new__ (hot path)


def grants(profile: str, events: list, first_version: int, state) -> list:
    """RewardGranted events for ``events`` (whose first has version ``first_version``).

    ``state`` is the episode state after these events (anything with ``world``, ``target``
    and ``paid``); predicates receive it as their second argument."""
    idx = _INDEX[profile]
    out: list = []
    version = first_version - 1
    for e in events:
        version += 1
        rules = idx.get(type(e))
        if rules is None:
            continue
        for name, value, once, predicate in rules:
            if once and (name in state.paid or any(g[0] == name for g in out)):
                continue
            if predicate is None or predicate(e, state):
                out.append(_new(RewardGranted, (name, value, version)))
    return out
