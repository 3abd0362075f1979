"""The warehouse's `steps`, `episodes` and `rewards`, derived again in plain Python, event by event.

Why: analytics.derive computes them in SQL, in two ways (the batch's runs, or a window over old and
new events) and across batch cuts. This is a third derivation, written from the rules those
statements state (and domain/outcomes.py for the decisive step), so a test can compare every
row and column of a warehouse with it, not only the counts the tally in test_analytics checks.

It reads the store's events through `EventStore.read_all`, so it shares no SQL, no Arrow and no
DuckDB with the sync. Values follow DuckDB's spelling where SQL gives them one: JSON text for a
non-string field read as text, `round` half away from zero, `arg_min` over non-NULL values.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import orjson

from domain.events import EVENT_TYPES
from eventstore import EventStore

STEP_COLUMNS = ("episode_id", "task", "agent", "chaos", "step", "position", "version", "app", "method",
                "tool", "accepted", "reject_code", "reject_reason", "reject_cause", "reward", "mistake",
                "chaos_events", "chaos_now", "chaos_active", "terminal")
EPISODE_COLUMNS = ("episode_id", "task", "seed", "chaos", "agent", "reward_profile", "max_steps", "rules",
                   "outcome",
                   "failure_mode", "steps", "total_return", "reward_sum", "first_mistake_step",
                   "first_mistake_mode", "mistakes", "first_rejection_step", "rejected_actions",
                   "chaos_events", "chaos_mechanisms", "lead_in", "started_at", "first_position",
                   "last_position", "event_count", "last_version", "digest")
REWARD_COLUMNS = ("episode_id", "rule", "grants", "total", "first_step")
# where a step row holds what the episode row is made from
STEP, POSITION, TOOL, ACCEPTED = (STEP_COLUMNS.index(n) for n in ("step", "position", "tool", "accepted"))

# types that may carry cause="chaos": those with a mechanism, and any the domain does not know
_CHAOS_CAPABLE = {name for name, cls in EVENT_TYPES.items() if {"cause", "mechanism"} <= set(cls._fields)}


def text(value: Any) -> str | None:
    """A JSON value read as text: strings as they are, anything else as its JSON (NULL stays None)."""
    if value is None or isinstance(value, str):
        return value
    return orjson.dumps(value).decode()


def integer(value: Any) -> int | None:
    """TRY_CAST of the value's text to an integer."""
    try:
        return int(text(value))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None


def number(value: Any) -> float | None:
    """TRY_CAST of the value's text to a double."""
    try:
        return float(text(value))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None


def round6(value: float) -> float:
    """DuckDB's round(x, 6): scale, round half away from zero, scale back."""
    scaled = value * 1e6
    return math.copysign(math.floor(abs(scaled) + 0.5), scaled) / 1e6


def first(values: list[Any]) -> Any:
    """arg_min(value, version) over values in version order: the first that is not NULL."""
    return next((v for v in values if v is not None), None)


@dataclass
class Fact:
    position: int
    version: int
    type: str
    data: dict
    owner: int | None
    chaos: str | None  # the mechanism, for a chaos event

    @property
    def step(self) -> int | None:
        return integer(self.data.get("step"))


def derive(url: str) -> dict[str, list[tuple]]:
    """Rows of `steps`, `episodes` and `rewards` for every episode in the store at `url`, sorted as
    the caller's queries sort them (steps by position, episodes by id, rewards by episode and rule)."""
    streams: dict[str, list] = defaultdict(list)
    with EventStore.open(url, create=False) as store:
        for event in store.read_all():
            streams[event.stream_id].append(event)
    steps: list[tuple] = []
    episodes: list[tuple] = []
    rewards: list[tuple] = []
    for stream_id, events in streams.items():
        events.sort(key=lambda e: e.version)
        if events[0].version != 0 or events[0].type != "EpisodeStarted":  # not an episode
            continue
        s, e, r = _episode(stream_id, events)
        steps += s
        episodes.append(e)
        rewards += r
    steps.sort(key=lambda row: row[POSITION])
    episodes.sort(key=lambda row: row[0])
    rewards.sort(key=lambda row: (row[0], row[1] or ""))
    return {"steps": steps, "episodes": episodes, "rewards": rewards}


def _facts(events: list) -> list[Fact]:
    facts, owner = [], None
    for event in events:
        if event.type == "ActionTaken":
            owner = event.position
        data = event.data
        capable = event.type in _CHAOS_CAPABLE or event.type not in EVENT_TYPES
        chaos = None
        if capable and data.get("cause") == "chaos":
            chaos = text(data.get("mechanism")) or event.type
        facts.append(Fact(event.position, event.version, event.type, data, owner, chaos))
    return facts


def _episode(stream_id: str, events: list) -> tuple[list[tuple], tuple, list[tuple]]:
    facts = _facts(events)
    started, meta = events[0].data, events[0].meta
    task, chaos_level = text(started.get("task")), number(started.get("chaos"))
    agent = text(meta.get("agent"))
    steps = _steps(facts, (stream_id, task, agent, chaos_level))
    rewards = _rewards(stream_id, facts, {row[POSITION]: row[STEP] for row in steps})
    target = started.get("target")
    named = target.get("rules") if isinstance(target, dict) else None  # domain.rules_of
    started_as = (stream_id, task, integer(started.get("seed")), chaos_level, agent,
                  text(started.get("reward_profile")), integer(started.get("max_steps")),
                  1 if named is None else integer(named))
    return steps, _episode_row(started_as, events, facts, steps, rewards), rewards


def _steps(facts: list[Fact], episode: tuple) -> list[tuple]:
    """A row per action: `episode` (id, task, agent, chaos level), then what its step did."""
    by_owner: dict[int, list[Fact]] = defaultdict(list)
    for f in facts:
        if f.owner is not None and f.type != "ActionTaken":
            by_owner[f.owner].append(f)

    steps, fired = [], set()
    for f in facts:
        if f.chaos is not None and f.owner is None:
            fired.add(f.chaos)  # chaos during the reset is in force from the first step
    for action in (f for f in facts if f.type == "ActionTaken"):
        own = by_owner[action.position]
        refusals = [x.data for x in own if x.type == "ActionRejected"]
        code, reason, cause = (first([text(r.get(k)) for r in refusals]) for k in ("code", "reason", "cause"))
        malformed = code == "malformed_action"
        act = action.data.get("action")
        act = act if isinstance(act, dict) else {}
        app = None if malformed else text(act.get("app"))
        method = None if malformed else text(act.get("method"))
        tool = f"{app}.{method}" if app is not None and method is not None else "(malformed)"
        granted = [number(x.data.get("value")) for x in own if x.type == "RewardGranted"]
        granted = [g for g in granted if g is not None]
        now = sorted({x.chaos for x in own if x.chaos is not None})
        fired.update(now)
        steps.append((*episode, action.step, action.position, action.version,
                      app, method, tool, not refusals, code, reason, cause,
                      round6(sum(granted)) if granted else 0.0,
                      first([text(x.data.get("mode")) for x in own if x.type == "MistakeRecorded"]),
                      sum(1 for x in own if x.chaos is not None), now, sorted(fired),
                      any(x.type == "EpisodeEnded" for x in own)))
    return steps


def _rewards(stream_id: str, facts: list[Fact], step_of: dict[int, int | None]) -> list[tuple]:
    """A row per rule that granted a reward: grants, total, and the first step (by its number)."""
    rules: dict[str | None, list] = {}
    for f in facts:
        if f.type == "RewardGranted":
            rules.setdefault(text(f.data.get("rule")), []).append(f)
    rewards = []
    for rule, grants in rules.items():
        values = [v for v in (number(g.data.get("value")) for g in grants) if v is not None]
        firsts = [step_of.get(g.owner) for g in grants if g.owner is not None]
        firsts = [s for s in firsts if s is not None]
        rewards.append((stream_id, rule, len(grants), round6(sum(values)) if values else None,
                        min(firsts) if firsts else None))
    return rewards


def _episode_row(started_as: tuple, events: list, facts: list[Fact], steps: list[tuple],
                 rewards: list[tuple]) -> tuple:
    """The episode's row: `started_as` (its id and what its start says), then how it went."""
    totals = [r[3] for r in rewards if r[3] is not None]
    reward_sum = sum(totals) if totals else None

    ends = [f for f in facts if f.type == "EpisodeEnded"]
    end = ends[-1].data if ends else {}
    outcome, mode = text(end.get("outcome")), text(end.get("failure_mode"))
    rejected = [row[STEP] for row in steps if not row[ACCEPTED]]
    counted = [m for m in facts if m.type == "MistakeRecorded" and not _handled(m, facts)]
    counted_steps = [m.step for m in counted if m.step is not None]
    decisive = _decisive(facts, outcome, mode)
    last_step = max((row[STEP] for row in steps if row[STEP] is not None), default=None)
    upto = decisive if decisive is not None else last_step
    lead_in = [row[TOOL] for row in steps if upto is not None and row[STEP] is not None
               and upto - 5 < row[STEP] <= upto]
    chaos_all = [f.chaos for f in facts if f.chaos is not None]
    last = events[-1]
    return (
        *started_as, outcome, mode,
        _coalesce(integer(end.get("steps")), len(steps) if steps else None, 0),
        _coalesce(number(end.get("total_return")), None if reward_sum is None else round6(reward_sum), 0.0),
        round6(reward_sum or 0.0),
        min(counted_steps) if counted_steps else None,
        first([text(m.data.get("mode")) for m in counted]),
        len(counted), min((s for s in rejected if s is not None), default=None), len(rejected),
        len(chaos_all), sorted(set(chaos_all)), lead_in, text(events[0].meta.get("recorded_at")),
        events[0].position, max(e.position for e in events), len(events), last.version, last.digest)


def _coalesce(*values: Any) -> Any:
    return next((v for v in values if v is not None), None)


def _submissions(facts: list[Fact]) -> list[tuple[int | None, str | None, str | None, bool]]:
    return [(f.step, text(f.data.get("approval_type")), text(f.data.get("approval_id")),
             text(f.data.get("problems")) == "[]") for f in facts if f.type == "ApprovalSubmitted"]


def _handled(mistake: Fact, facts: list[Fact]) -> bool:
    """A rejection left unhandled is no mistake once escalated, or once its approval type was
    submitted again after the mistake's step."""
    data = mistake.data
    if text(data.get("mode")) != "rejection_not_handled":
        return False
    subject, at = text(data.get("subject")), mistake.step
    if any(f.type == "ApprovalEscalated" and text(f.data.get("approval_id")) == subject for f in facts):
        return True
    subs = _submissions(facts)
    types = {t for _, t, i, _ in subs if i == subject and t is not None}
    return at is not None and any(t in types and s is not None and s > at for s, t, _, _ in subs)


def _decisive(facts: list[Fact], outcome: str | None, mode: str | None) -> int | None:
    """The step that decided the failure mode (see domain/outcomes.py), None if none did."""
    if outcome not in ("failure", "truncated") or mode is None:
        return None
    subs = _submissions(facts)
    deciding = []
    for m in facts:
        if m.type != "MistakeRecorded" or text(m.data.get("mode")) != mode:
            continue
        irreversible = text(m.data.get("irreversible"))
        subject, at = text(m.data.get("subject")), m.step
        if mode == "rejection_not_handled":
            resolved = _handled(m, facts)
        else:
            # missing fields are put right by any later submission of the type, other problems
            # only by one without problems
            needs_clean = mode != "missing_required_fields"
            resolved = at is not None and any(t == subject and s is not None and s > at
                                              and (ok or not needs_clean) for s, t, _, ok in subs)
        deciding.append((m.step, irreversible, resolved))
    if not deciding:
        return None
    if outcome == "failure":
        chosen = [s for s, irr, _ in deciding if irr == "true" and s is not None]
        step = min(chosen) if chosen else None
    else:
        kept = (s for s, irr, res in deciding if irr not in (None, "true") and not res and s is not None)
        step = next(kept, None)
    if step is None:
        step = max((s for s, _, _ in deciding if s is not None), default=None)
    return step
