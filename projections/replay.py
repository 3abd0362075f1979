"""Time travel: any logged episode at any step, from the log alone (no simulator, no RNG).

Step 0 is the world right after reset; step K is the world after the K-th recorded action.
The events of step K are its `ActionTaken` and everything recorded up to the next one, so the
step's result (`domain.step_info` over those events), rewards and chaos all come from the log.
"""

from __future__ import annotations

from typing import Any

import orjson

import domain
from domain.episode import INITIAL_STATE
from domain.events import CHAOS
from domain.outcomes import counts_as_mistake
from eventstore import EventStore, RecordedEvent
from projections.episodes import UNKNOWN_AGENT
from projections.views import APPS, DamagedEvent, check_episode_stream, decode, render_views, views_of

_loads = orjson.loads


class EpisodeNotFound(LookupError):
    """No stream with that id in the store."""


class StepNotFound(LookupError):
    """The episode has fewer steps than asked for."""


def step_bounds(records: list[RecordedEvent]) -> list[int]:
    """Index of each step's first event: [0 (reset), index of ActionTaken 1, ...]."""
    return [0] + [i for i, r in enumerate(records) if r.type == "ActionTaken"]


def replay(store: EventStore, episode_id: str, step: int | None = None) -> dict[str, Any]:
    """The three apps' views after `step` (default: the last), with that step's story."""
    records = list(store.read_stream(episode_id))
    if not records:
        raise EpisodeNotFound(f"no episode {episode_id!r} in the store")
    return replay_records(episode_id, records, step)


def replay_records(episode_id: str, records: list[RecordedEvent],
                   step: int | None = None) -> dict[str, Any]:
    check_episode_stream(records)
    bounds = step_bounds(records)
    last_step = len(bounds) - 1
    if step is None:
        step = last_step
    if step < 0 or step > last_step:
        raise StepNotFound(f"episode {episode_id!r} has steps 0..{last_step}; there is no step {step}")
    begin = bounds[step]
    end = bounds[step + 1] if step < last_step else len(records)
    events = [decode(r) for r in records[:end]]
    step_events = events[begin:end]
    state_before = _fold(records[:begin], events[:begin]) if step > 0 else None
    state = _fold(records[begin:end], step_events, state_before) if step > 0 else _fold(records, events)
    started = _loads(records[0].data_json)
    meta = _loads(records[0].meta_json)
    step_records = records[begin:end]
    action = _loads(step_records[0].data_json)["action"] if step > 0 else None
    try:
        result = _jsonable(domain.step_info(state_before, step_events)) if step > 0 else None
    except Exception as exc:  # an edited action naming what its stored effects do not
        raise DamagedEvent(step_records[0], f"does not agree with the events it led to "
                           f"({type(exc).__name__}: {exc})") from None
    rewards = []
    mistakes = []  # what the rules held against the step: a mistake need not be a refusal
    chaos = []
    ended = None
    for record, event in zip(step_records, step_events, strict=True):
        if record.type == "RewardGranted":
            rewards.append(_loads(record.data_json))
        elif record.type == "MistakeRecorded":
            mistakes.append((event, _loads(record.data_json)))
        elif record.type == "EpisodeEnded":
            ended = _loads(record.data_json)
        if getattr(event, "cause", None) == CHAOS:  # the parsed field: an action's text may say "chaos"
            chaos.append({"type": record.type, **_loads(record.data_json)})
    views = views_of(state)
    if any(event.mode == "rejection_not_handled" for event, _ in mistakes):  # handled later?
        rest = records[end:]  # the episode's end decides whether the rejection was handled
        final = _fold(rest, [decode(r) for r in rest], state) if rest else state
        counted = [counts_as_mistake(event, final.world) for event, _ in mistakes]
    else:
        counted = [True] * len(mistakes)
    return {
        "episode_id": episode_id,
        "episode": {"task": started.get("task"), "seed": started.get("seed"),
                    "chaos": started.get("chaos"), "reward_profile": started.get("reward_profile"),
                    "max_steps": started.get("max_steps"), "agent": meta.get("agent"),
                    "goal": started.get("goal"),
                    "rules": domain.rules_of(started.get("target"))},
        "step": step,
        "steps": last_step,
        "version": end - 1,
        "action": action,
        "result": result,
        "rewards": rewards,
        "reward": sum(r["value"] for r in rewards),
        "mistakes": [{**data, "counted": c} for (_, data), c in zip(mistakes, counted, strict=True)],
        "chaos": chaos,
        "events": [r.type for r in step_records],
        "ended": ended,
        **{app: views[app] for app in APPS},
    }


def _fold(records: list[RecordedEvent], events: list[Any], state: Any = INITIAL_STATE) -> Any:
    """`domain.fold`, naming the stored event that does not fold (edited behind the store's back
    so that it contradicts the events before it) as damage, not a KeyError's traceback."""
    try:
        return domain.fold(events, state)
    except Exception:  # fold again one event at a time, to blame the right one
        for record, event in zip(records, events, strict=True):
            try:
                state = domain.fold([event], state)
            except Exception as exc:
                raise DamagedEvent(record, f"does not fold onto the events before it "
                                   f"({type(exc).__name__}: {exc})") from None
        raise


def _jsonable(value: Any) -> Any:
    """StepInfo (a NamedTuple) as plain JSON values."""
    if hasattr(value, "_asdict"):
        value = value._asdict()
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value


def render_replay(result: dict[str, Any]) -> str:
    """The replay as text: header, action, result, rewards, mistakes, chaos, then the three apps."""
    ep = result["episode"]
    lines = [f"episode {result['episode_id']} — {ep['task']} seed {ep['seed']} chaos {ep['chaos']}"
             f" agent {ep['agent'] or UNKNOWN_AGENT} rules {ep['rules']}",
             f"step {result['step']} of {result['steps']} (stream version {result['version']})"]
    if result["step"] > 0:  # an agent may have sent null: that is its action, shown as such
        lines.append(f"action: {orjson.dumps(result['action']).decode()}")
    info = result["result"]
    if info is not None:
        if info.get("rejected"):
            lines.append(f"rejected [{info['rejected']}]: {info.get('message', '')}")
        else:
            lines.append(f"result: {info.get('message', '')}")
            if info.get("result") is not None:
                body = orjson.dumps(info["result"], option=orjson.OPT_INDENT_2).decode()
                lines.append(_indent(body))
    if result["rewards"]:
        shown = ", ".join(f"{r['rule']} {r['value']:+g}" for r in result["rewards"])
        lines.append(f"rewards: {shown} (step total {result['reward']:+g})")
    for m in result["mistakes"]:  # its detail unless the refusal above said it already
        said = info is not None and m.get("detail") == info.get("message")
        notes = [m.get("subject")] + (["irreversible"] if m.get("irreversible") else []) + (
            [] if m.get("counted", True) else ["handled later, so not counted as a mistake"])
        lines.append(f"mistake [{m.get('mode')}]" + ("" if said else f": {m.get('detail')}")
                     + f" ({', '.join(map(str, notes))})")
    for c in result["chaos"]:
        lines.append(f"chaos: {c['type']} ({c.get('mechanism') or 'chaos'})")
    if result["ended"]:
        e = result["ended"]
        lines.append(f"episode ended: {e.get('outcome')}"
                     + (f" ({e['failure_mode']})" if e.get("failure_mode") else ""))
    lines.append("")
    lines.append(render_views({app: result[app] for app in APPS}))
    return "\n".join(lines)


def _indent(text: str, prefix: str = "  ") -> str:
    return "\n".join(prefix + line for line in text.splitlines())
