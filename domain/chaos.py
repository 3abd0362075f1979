"""Chaos: seeded traps, each recorded as an event with ``cause="chaos"`` and its mechanism.

The level (0 = clean ... 1 = hostile) scales the probability of every mechanism. Static
mechanisms fire at reset (``with_static_chaos``); dynamic ones fire mid-episode
(``outage`` before a call, ``after`` once the call's effects are known). Draws are
counter-based: the same (task, seed, step) always gives the same dice, and a higher level
only adds traps to those a lower level would set (coupled draws).
"""

from __future__ import annotations

import math
import numbers
import re
from functools import lru_cache

from domain.events import (
    CHAOS,
    ActionRejected,
    ApprovalDelayed,
    ApprovalFieldsRequired,
    ApprovalFlagged,
    ApprovalSubmitted,
    ApproverLookedUp,
    ApproverWentOutOfOffice,
    MetricPublished,
    MetricQueried,
    MetricRefreshDelayed,
    MetricRefreshStarted,
    MetricWentStale,
    TicketBlocked,
    TicketCreated,
    TicketFieldCleared,
)
from domain.rng import Stream, digest, prefix, uniforms, unit

CHAOS_LEVELS: dict[str, float] = {"none": 0.0, "low": 0.25, "medium": 0.5, "high": 0.8}

# mechanism -> (probability at level 1, one-line description). The probability used is
# p * level (p * level**2 for the chained variants).
MECHANISMS: dict[str, tuple[float, str]] = {
    "missing_fields": (0.6, "the main ticket lacks its priority (p), assignee (0.8p) or "
                            "status (0.5p); it cannot be resolved until they are set"),
    "blocked_ticket": (0.6, "the main ticket is blocked by another ticket that must be "
                            "resolved first; closing a blocked ticket is irreversible"),
    "blocker_chain": (0.6, "the blocker is itself blocked (p * level^2)"),
    "stale_metric": (0.7, "the decision metric is stale at reset, and half the time the stale "
                          "value points to the wrong decision; refresh before relying on it"),
    "slow_refresh": (0.6, "a refresh needs 1-3 further polls (queries) before it completes"),
    "ooo_approver": (0.6, "the approver is out of office; requests must go to the delegate"),
    "ooo_chain": (0.6, "the delegate is out of office too (p * level^2)"),
    "required_fields": (0.6, "the approval type requires 1-2 extra fields (see "
                             "list_approval_types)"),
    "slow_decision": (0.7, "the reviewer needs 1-4 further polls before deciding"),
    "random_rejection": (0.4, "a correct request is rejected once; escalating it (or "
                              "resubmitting) gets it approved"),
    "transient_outage": (0.08, "any call fails with transient_outage, each on its own draw; a "
                               "retry usually works and may fail again"),
    "ooo_after_lookup": (0.4, "an approver goes out of office right after their first "
                              "lookup; look again before submitting"),
    "stale_again": (0.4, "the decision metric goes stale again right after its first fresh "
                         "read, with a new value at the source; read again before using it"),
}
_P = {name: p for name, (p, _) in MECHANISMS.items()}

SPRUNG_BY_THE_AGENT: tuple[str, ...] = ("stale_again", "ooo_after_lookup", "slow_refresh",
                                        "slow_decision", "random_rejection", "transient_outage")
"""Mechanisms drawn only when the agent makes a call that can spring them (a read, a lookup, a
refresh, a submission; an outage on any call), not set at reset: whether one fires in an episode
depends on how far, and how long, the agent got, which is why `chaos_impact` reads them apart."""


_DECIMAL = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:e[+-]?[0-9]+)?")


def parse_chaos(value) -> float:
    """A chaos level as a float in [0, 1], from a name (none/low/medium/high) or a number."""
    if isinstance(value, bool):
        raise ValueError(f"chaos must be a level name or a number in [0, 1], not {value!r}")
    if isinstance(value, str):
        text = value.strip().lower()
        if text in CHAOS_LEVELS:
            return CHAOS_LEVELS[text]
        # a decimal number in ASCII, as every other number a command takes: float() also read
        # full-width digits and `0_5` (as 5, "outside [0, 1]")
        if not _DECIMAL.fullmatch(text):
            raise ValueError(
                f"unknown chaos level {value!r}: use one of {', '.join(CHAOS_LEVELS)} or a "
                "number in [0, 1]")
        number = float(text)
    elif isinstance(value, numbers.Real):  # NumPy's numbers too, as a remote reset takes them
        number = float(value)
    else:
        raise ValueError(f"chaos must be a level name or a number in [0, 1], not {value!r}")
    if not math.isfinite(number) or not 0.0 <= number <= 1.0:
        raise ValueError(f"chaos level {value!r} is outside [0, 1]")
    return number + 0.0  # -0.0 is level 0: one value per level, or its log would differ by the sign


def level_text(level: float) -> str:
    """A chaos level exactly, in the fewest digits that read back as it: NumPy's
    0.30000000000000004 is another level than 0.3 (another log, another group in the analytics),
    and this text is what `--chaos` and a query's `chaos=` take to find it again. 1.0 reads 1."""
    text = repr(float(level))
    return text[:-2] if text.endswith(".0") else text


def _k(value, scale) -> int:
    return round(value / scale)


def value_of(k: int, scale: float) -> int | float:
    """A family's integer grid value `k` in its metric's unit."""
    return k if scale == 1 else round(k * scale, 1)


# --- static chaos ------------------------------------------------------------------------


def with_static_chaos(inst, seed: int, level: float, status_under_block: bool = True):
    """The instance with static chaos events appended and its budget widened for chaos.

    `status_under_block` False (rules version 3 on): no status is cleared on the ticket that is
    also blocked, since the block sets the status and unblocking reopens it: the trap had no
    effect, yet `missing_fields` counted among the chaos the episode met."""
    tg = inst.target
    rng = Stream(seed, f"chaos:{tg['family']}")
    u = [rng.random() for _ in range(16)]  # fixed number of draws: levels stay coupled
    events = list(inst.events)
    main = tg["ticket"]
    L = level
    blocked = u[3] < _P["blocked_ticket"] * L
    for i, (field, share) in enumerate((("priority", 1.0), ("assignee", 0.8),
                                        ("status", 0.5))):
        if u[i] < _P["missing_fields"] * share * L and (
                status_under_block or field != "status" or not blocked):
            events.append(TicketFieldCleared(main, field, CHAOS, "missing_fields"))
    if blocked:
        b1, b2 = tg["spare_ticket_ids"]
        titles = tg["blocker_titles"]
        first = int(u[4] * 2)
        events.append(TicketCreated(b1, titles[first], f"Must be done before {main} can "
                                    "proceed.", "open", "medium", tg["owner"], {"blocks": main},
                                    CHAOS, "blocked_ticket"))
        events.append(TicketBlocked(main, b1, CHAOS, "blocked_ticket"))
        if u[5] < _P["blocker_chain"] * L * L:
            events.append(TicketCreated(b2, titles[1 - first], f"Must be done before {b1} can "
                                        "proceed.", "open", "medium", tg["owner"],
                                        {"blocks": b1}, CHAOS, "blocker_chain"))
            events.append(TicketBlocked(b1, b2, CHAOS, "blocker_chain"))
    if u[6] < _P["stale_metric"] * L:
        published = next(e for e in inst.events
                         if type(e) is MetricPublished and e.name == tg["metric"])
        stale_k = _stale_value(tg, _k(published.value, tg["scale"]), u[7] < 0.5, u[8])
        events.append(MetricWentStale(tg["metric"], value_of(stale_k, tg["scale"]), published.value,
                                      f"2024-02-{10 + int(u[9] * 18):02d}", CHAOS,
                                      "stale_metric"))
    if u[10] < _P["ooo_approver"] * L:
        roles = tg["roles"]
        events.append(ApproverWentOutOfOffice(roles[0], "2024-03-29", CHAOS, "ooo_approver"))
        if u[11] < _P["ooo_chain"] * L * L:
            events.append(ApproverWentOutOfOffice(roles[1], "2024-03-22", CHAOS, "ooo_chain"))
    if u[12] < _P["required_fields"] * L:
        extra = tg["extra_fields"]
        n = 1 + (u[13] < L)
        start = int(u[14] * len(extra))
        fields = [extra[(start + i) % len(extra)] for i in range(n)]
        events.append(ApprovalFieldsRequired(tg["approval_type"], fields, CHAOS,
                                             "required_fields"))
    budget = inst.budget + round(24 * L)
    return inst._replace(events=events, budget=budget)


def _stale_value(tg: dict, true_k: int, misleading: bool, u: float) -> int:
    """A stale value: on the wrong side of the policy if misleading, else on the right one."""
    thr_k = _k(tg["threshold"], tg["scale"])
    lo, hi = tg["bounds"]
    delta = 1 + int(u * tg["spread"])
    proceed = tg["expected"] == "proceed"
    if tg["op"] == "==":
        if proceed:
            return thr_k - 1 if misleading else thr_k
        return thr_k if misleading else max(lo, thr_k - 1)
    if proceed:
        return max(lo, thr_k - delta) if misleading else max(thr_k, true_k - delta)
    return min(hi, thr_k + delta - 1) if misleading else min(thr_k - 1, true_k + delta)


# --- dynamic chaos -----------------------------------------------------------------------


@lru_cache(maxsize=8192)
def _outage_block(seed: int, task: str, block: int) -> tuple[float, ...]:
    return uniforms(seed, "outage:" + task, block)


def outage(level: float, app: str, step: int, seed: int, task: str) -> ActionRejected | None:
    """A transient outage for this call, or None. One digest covers eight steps."""
    if _outage_block(seed, task, step >> 3)[step & 7] < _P["transient_outage"] * level:
        return ActionRejected(step, "transient_outage",
                              f"{app} is temporarily unavailable (HTTP 503). Retry the call.",
                              CHAOS, "transient_outage")
    return None


_TRIGGERS = frozenset((MetricRefreshStarted, ApprovalSubmitted, ApproverLookedUp,
                       MetricQueried))


@lru_cache(maxsize=8192)
def _dyn_prefix(seed: int, task: str) -> bytes:
    return prefix(seed, "dyn:" + task)


def after(state, effects: list, seed: int, task: str) -> list:
    """Dynamic chaos triggered by this step's effects, given the state after them.

    The dice of a step are ``uniforms(seed, "dyn:" + task, step)``; they are drawn only when
    an effect can trigger a mechanism (its deterministic conditions are checked first)."""
    out = []
    for e in effects:
        t = type(e)
        if t not in _TRIGGERS:
            continue
        L = state.chaos
        if t is MetricQueried:
            tg = state.target
            m = state.world.datahub.metrics[e.name]
            if e.stale or e.name != tg["metric"] or m["fresh_queries"] != 1:
                continue
            d = digest(_dyn_prefix(seed, task), state.step)
            if unit(d, 1) < _P["stale_again"] * L:
                out.append(MetricWentStale(e.name, e.value, _drift(tg, e.value, unit(d, 2)),
                                           m["as_of"], CHAOS, "stale_again"))
        elif t is ApproverLookedUp:
            approvers = state.world.datahub.approvers
            a = approvers[e.role]
            dr = a["delegate_role"]
            if (e.out_of_office or a["lookups"] != 1 or dr is None or dr not in approvers
                    or approvers[dr]["out_of_office"]):
                continue
            d = digest(_dyn_prefix(seed, task), state.step)
            if unit(d, 1) < _P["ooo_after_lookup"] * L:
                out.append(ApproverWentOutOfOffice(e.role, "2024-03-27", CHAOS,
                                                   "ooo_after_lookup"))
        elif t is MetricRefreshStarted:
            d = digest(_dyn_prefix(seed, task), state.step)
            if unit(d, 1) < _P["slow_refresh"] * L:
                out.append(MetricRefreshDelayed(e.name, 1 + int(unit(d, 2) * 3 * L), CHAOS,
                                                "slow_refresh"))
        else:  # ApprovalSubmitted
            d = digest(_dyn_prefix(seed, task), state.step)
            if unit(d, 1) < _P["slow_decision"] * L:
                out.append(ApprovalDelayed(e.approval_id, 1 + int(unit(d, 2) * 4 * L), CHAOS,
                                           "slow_decision"))
            if (not e.problems and unit(d, 3) < _P["random_rejection"] * L
                    and not any(a["flagged"] for a in
                                state.world.approvalflow.approvals.values())):
                out.append(ApprovalFlagged(
                    e.approval_id, "The reviewer asked for more context and rejected the "
                    "request; escalate it with a reason or resubmit.", CHAOS, "random_rejection"))
    return out


def _drift(tg: dict, value, u: float):
    """A new source value on the same side of the policy as ``value``."""
    scale = tg["scale"]
    k = _k(value, scale)
    thr_k = _k(tg["threshold"], scale)
    lo, hi = tg["bounds"]
    delta = 1 + int(u * max(1, tg["spread"] // 2))
    if tg["op"] == "==":
        return value if k == thr_k else value_of(k + 1 if k + 1 != thr_k else k + 2, scale)
    if k >= thr_k:
        new = k - delta if k - delta >= thr_k else min(hi, k + delta)
    else:
        new = k + delta if k + delta < thr_k else max(lo, k - delta)
    return value_of(new, scale)
