"""Every fact of an episode, as an immutable NamedTuple with a class-level schema version.

Field values are JSON values only (str, int, float, bool, None, lists, dicts with str keys)
and never tuples, so ``from_envelope(*to_envelope(e)) == e`` holds for every event.
Chaos-caused facts carry ``cause="chaos"`` and the ``mechanism`` that produced them.
"""

from __future__ import annotations

import math
from operator import itemgetter
from typing import Any, NamedTuple

Event = tuple  # every event type below is a NamedTuple, i.e. a tuple subclass

CHAOS = "chaos"  # value of the ``cause`` field of chaos-made events

# --- the episode -------------------------------------------------------------------------


class EpisodeStarted(NamedTuple):
    task: str
    seed: int
    chaos: float
    reward_profile: str
    max_steps: int  # the resolved step budget
    goal: str
    target: dict  # the hidden success criteria of this instance (never shown to the agent)
    SCHEMA_VERSION = 1


class EpisodeEnded(NamedTuple):
    outcome: str  # success | failure | truncated
    failure_mode: str | None
    steps: int
    total_return: float
    SCHEMA_VERSION = 1


class ActionTaken(NamedTuple):
    step: int
    action: Any  # exactly what the agent sent, as a JSON value
    SCHEMA_VERSION = 1


class ActionRejected(NamedTuple):
    step: int
    code: str
    reason: str
    cause: str  # "rules" or "chaos"
    mechanism: str | None
    SCHEMA_VERSION = 1


def refused(step: int, code: str, reason: str) -> list:
    """The events of a call an app refuses by its rules: one ActionRejected."""
    return [ActionRejected(step, code, reason, "rules", None)]


class RewardGranted(NamedTuple):
    rule: str
    value: float
    cause: int  # stream version of the triggering event
    SCHEMA_VERSION = 1


class MistakeRecorded(NamedTuple):
    step: int
    mode: str  # a key of outcomes.FAILURE_MODES
    subject: str  # what the mistake was about (ticket id, approval type, ...)
    detail: str
    irreversible: bool
    SCHEMA_VERSION = 1


# --- TicketDesk --------------------------------------------------------------------------


class TicketCreated(NamedTuple):
    ticket_id: str
    title: str
    description: str
    status: str | None
    priority: str | None
    assignee: str | None
    details: dict
    cause: str
    mechanism: str | None
    SCHEMA_VERSION = 1


class TicketFieldCleared(NamedTuple):
    ticket_id: str
    field: str
    cause: str
    mechanism: str | None
    SCHEMA_VERSION = 1


class TicketBlocked(NamedTuple):
    ticket_id: str
    blocked_by: str
    cause: str
    mechanism: str | None
    SCHEMA_VERSION = 1


class TicketUnblocked(NamedTuple):
    ticket_id: str
    blocker: str
    SCHEMA_VERSION = 1


class TicketPriorityChanged(NamedTuple):
    ticket_id: str
    priority: str
    previous: str | None
    SCHEMA_VERSION = 1


class TicketAssigned(NamedTuple):
    ticket_id: str
    assignee: str
    previous: str | None
    SCHEMA_VERSION = 1


class TicketStatusChanged(NamedTuple):
    ticket_id: str
    status: str
    previous: str | None
    SCHEMA_VERSION = 1


class TicketVerificationChanged(NamedTuple):
    ticket_id: str
    verified: bool
    SCHEMA_VERSION = 1


class TicketApprovalLinked(NamedTuple):
    ticket_id: str
    approval_id: str | None
    previous: str | None
    SCHEMA_VERSION = 1


class TicketCommentAdded(NamedTuple):
    ticket_id: str
    text: str
    step: int
    SCHEMA_VERSION = 1


# --- DataHub -----------------------------------------------------------------------------


class MetricPublished(NamedTuple):
    name: str
    value: float
    unit: str
    description: str
    as_of: str
    SCHEMA_VERSION = 1


class MetricWentStale(NamedTuple):
    name: str
    value: float  # what DataHub keeps showing
    true_value: float  # what the source now holds (revealed by a refresh)
    as_of: str
    cause: str
    mechanism: str | None
    SCHEMA_VERSION = 1


class MetricQueried(NamedTuple):
    name: str
    value: float
    stale: bool
    refreshing: bool
    polls_left: int  # further queries before a running refresh completes
    SCHEMA_VERSION = 1


class MetricRefreshStarted(NamedTuple):
    name: str
    SCHEMA_VERSION = 1


class MetricRefreshDelayed(NamedTuple):
    name: str
    polls: int
    cause: str
    mechanism: str | None
    SCHEMA_VERSION = 1


class MetricRefreshed(NamedTuple):
    name: str
    value: float
    previous: float
    was_stale: bool
    as_of: str
    SCHEMA_VERSION = 1


class ApproverRegistered(NamedTuple):
    role: str
    name: str
    email: str
    title: str
    delegate_role: str | None
    SCHEMA_VERSION = 1


class ApproverWentOutOfOffice(NamedTuple):
    role: str
    until: str
    cause: str
    mechanism: str | None
    SCHEMA_VERSION = 1


class ApproverLookedUp(NamedTuple):
    role: str
    name: str
    out_of_office: bool
    SCHEMA_VERSION = 1


# --- ApprovalFlow ------------------------------------------------------------------------


class ApprovalTypeDefined(NamedTuple):
    name: str
    approver_role: str
    required_fields: list
    description: str
    SCHEMA_VERSION = 1


class ApprovalFieldsRequired(NamedTuple):
    approval_type: str
    fields: list
    cause: str
    mechanism: str | None
    SCHEMA_VERSION = 1


class ApprovalSubmitted(NamedTuple):
    approval_id: str
    approval_type: str
    approver: str
    approver_role: str
    data: dict
    step: int
    problems: list  # what the reviewer will object to (data not matching the records)
    approver_out_of_office: bool
    SCHEMA_VERSION = 1


class ApprovalDelayed(NamedTuple):
    approval_id: str
    polls: int
    cause: str
    mechanism: str | None
    SCHEMA_VERSION = 1


class ApprovalFlagged(NamedTuple):
    approval_id: str
    reason: str
    cause: str
    mechanism: str | None
    SCHEMA_VERSION = 1


class ApprovalPolled(NamedTuple):
    approval_id: str
    polls_left: int
    SCHEMA_VERSION = 1


class ApprovalDecided(NamedTuple):
    approval_id: str
    decision: str  # approved | rejected
    reason: str
    cause: str
    mechanism: str | None
    SCHEMA_VERSION = 1


class ApprovalEscalated(NamedTuple):
    approval_id: str
    reason: str
    SCHEMA_VERSION = 1


# --- registry and envelopes --------------------------------------------------------------

EVENT_TYPES: dict[str, type] = {
    cls.__name__: cls
    for cls in (
        EpisodeStarted, EpisodeEnded, ActionTaken, ActionRejected, RewardGranted,
        MistakeRecorded,
        TicketCreated, TicketFieldCleared, TicketBlocked, TicketUnblocked,
        TicketPriorityChanged, TicketAssigned, TicketStatusChanged, TicketVerificationChanged,
        TicketApprovalLinked, TicketCommentAdded,
        MetricPublished, MetricWentStale, MetricQueried, MetricRefreshStarted,
        MetricRefreshDelayed, MetricRefreshed, ApproverRegistered, ApproverWentOutOfOffice,
        ApproverLookedUp,
        ApprovalTypeDefined, ApprovalFieldsRequired, ApprovalSubmitted, ApprovalDelayed,
        ApprovalFlagged, ApprovalPolled, ApprovalDecided, ApprovalEscalated,
    )
}

# (type name, from schema version) -> function(data) -> data of the next version
UPCASTERS: dict[tuple[str, int], Any] = {}


_ENVELOPE_HEADS: dict[type, tuple[str, int, tuple[str, ...]]] = {
    cls: (name, cls.SCHEMA_VERSION, cls._fields) for name, cls in EVENT_TYPES.items()
}


def to_envelope(event: Event) -> tuple[str, dict, int]:
    """(type name, JSON-able data dict, schema version) of an event.

    Runs for every logged event: one table lookup, and a positional zip (a NamedTuple holds
    exactly its fields; the `strict` keyword alone costs 40% here).
    """
    name, schema_version, fields = _ENVELOPE_HEADS[type(event)]
    return name, dict(zip(fields, event)), schema_version  # noqa: B905


def _field_getter(cls: type) -> Any:
    """A C-level getter of the class's fields, in order, from a data dict (always a tuple)."""
    fields = cls._fields
    if len(fields) == 1:
        only = fields[0]
        return lambda data: (data[only],)
    return itemgetter(*fields)


# Reading the log builds hundreds of thousands of events a second: `cls(**data)` runs the
# NamedTuple's Python-level __new__ with keyword matching; this getter does the same in C.
_CURRENT: dict[str, tuple[type, int, int, Any]] = {
    name: (cls, cls.SCHEMA_VERSION, len(cls._fields), _field_getter(cls))
    for name, cls in EVENT_TYPES.items()
}
_new_tuple = tuple.__new__


def from_envelope(type_name: str, data: dict, schema_version: int) -> Event:
    """The event an envelope describes; older schema versions are upcast first."""
    current = _CURRENT.get(type_name)
    if current is not None and schema_version == current[1] and len(data) == current[2]:
        try:
            return _new_tuple(current[0], current[3](data))
        except (KeyError, TypeError):
            pass  # not exactly the fields: the slow path below says what is wrong
    cls = EVENT_TYPES.get(type_name)
    if cls is None:
        raise ValueError(f"unknown event type {type_name!r}")
    version = schema_version
    while version < cls.SCHEMA_VERSION:
        up = UPCASTERS.get((type_name, version))
        if up is None:
            raise ValueError(f"no upcaster for {type_name} schema version {version}")
        data = up(data)
        version += 1
    if version != cls.SCHEMA_VERSION:
        raise ValueError(
            f"{type_name} schema version {schema_version} is newer than this code "
            f"({cls.SCHEMA_VERSION})")
    return cls(**data)


_MAX_INT = 2**63 - 1


_TEXT_BITS = 14_000
"""Integers up to this many bits (4,215 digits) are logged as their digits; a bigger one as its
size, since Python refuses to turn more than 4,300 digits into text (a fixed bound, not that
limit, which a process may change, so the log never depends on the process)."""


def _key(k) -> str:
    if isinstance(k, str):  # a StrEnum member, say: its text, as json.dumps writes it
        return _unicode(str.__str__(k))
    if isinstance(k, int) and not isinstance(k, bool):
        return _int_text(int(k))
    if isinstance(k, (float, bool)) or k is None:
        return str(k)
    return f"<{type(k).__name__}>"


def _int_text(value: int) -> str:
    """An integer as text: its digits, or its size when it has too many to write."""
    if value.bit_length() > _TEXT_BITS:
        return f"<{'negative ' if value < 0 else ''}integer of {value.bit_length()} bits>"
    return str(value)


def _unicode(text: str) -> str:
    """The text itself when it is valid Unicode; lone surrogates (which no UTF-8 log can hold,
    e.g. a JSON "\\ud800") spelled out as the escape `\\ud800` instead."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode()
    return text


def to_json_value(value: Any, depth: int = 0) -> Any:
    """A fresh JSON value equal to ``value`` where possible.

    Tuples become lists, non-str keys become str, NaN/inf become None, lone surrogates in text
    become their escape, integers beyond 64 bits and anything not JSON become a short
    deterministic string. The copy also protects recorded events from callers that mutate
    their action objects afterwards.
    """
    t = type(value)
    if t is dict and depth < 32:
        out = {}
        for k, v in value.items():
            if type(k) is not str:
                k = _key(k)
            elif not k.isascii():
                k = _unicode(k)
            tv = type(v)
            out[k] = (v if (tv is str and v.isascii()) or v is None or tv is bool
                      else to_json_value(v, depth + 1))
        return out
    if t is str:
        return value if value.isascii() else _unicode(value)
    if t is bool or value is None:
        return value
    if t is int:
        return value if -_MAX_INT <= value <= _MAX_INT else _int_text(value)
    if t is float:
        return value if math.isfinite(value) else None
    if depth >= 32:
        return "<too deep>"
    if t is list or t is tuple:
        return [to_json_value(v, depth + 1) for v in value]
    # subclasses of the JSON types
    if isinstance(value, dict):
        return to_json_value(dict(value), depth)
    if isinstance(value, (list, tuple)):
        return [to_json_value(v, depth + 1) for v in value]
    if isinstance(value, int):
        return to_json_value(int(value), depth)
    if isinstance(value, float):
        return to_json_value(float(value), depth)
    if isinstance(value, str):  # its text, as json.dumps writes it (str() of a (str, Enum) member
        return _unicode(str.__str__(value))  # is "K.app")
    return f"<unserializable {type(value).__name__}>"
