"""One episode: the contract the rest of CompanyOS uses.

``reset`` and ``step`` are the simulator (rules and seeded chaos); ``fold``/``apply`` rebuild
the state from recorded events with no rules and no randomness, and ``step_info`` derives
what the agent was told from the state before a step and that step's events. ``step`` derives
its StepInfo with ``step_info`` and evolves the world with the same app ``evolve`` functions
that ``fold`` uses, so a replay of the log reproduces everything (the tests check
``fold(log) == live state`` at every step).

Events of one step, in order: ActionTaken, the effects or one ActionRejected,
MistakeRecorded*, dynamic chaos*, RewardGranted*, and EpisodeEnded on the last step (the
terminal grants come just before it and name its version as their cause).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

from domain import chaos as _chaos
from domain import world as _world
from domain.events import (
    CHAOS,
    ActionRejected,
    ActionTaken,
    ApprovalDelayed,
    ApprovalFieldsRequired,
    ApprovalFlagged,
    ApproverWentOutOfOffice,
    EpisodeEnded,
    EpisodeStarted,
    MetricRefreshDelayed,
    MetricWentStale,
    MistakeRecorded,
    RewardGranted,
    TicketBlocked,
    TicketFieldCleared,
    refused,
    to_json_value,
)
from domain.outcomes import is_success, judge, truncation_mode
from domain.rewards import ONCE_RULES, grants, reward_profile
from domain.rules import checked_rules, stamped
from domain.tasks import task_family
from domain.tools import Invalid, parse_action
from domain.world import INITIAL_WORLD, World

# Building a NamedTuple through its class runs a Python-level __new__; on the hot path we call
# tuple.__new__ directly, which builds the same value in C (fields in declaration order).
_new = tuple.__new__


class EpisodeFinished(Exception):
    """step() was called on an episode that has already ended (a caller error)."""


@dataclass(frozen=True)
class EpisodeSpec:
    task: str
    seed: int
    chaos: float
    reward_profile: str = "default"
    max_steps: int | None = None  # None => the task's own budget
    rules: int | None = None  # None => the current rules version (domain.rules)


class EpisodeState(NamedTuple):
    task: str
    seed: int
    chaos: float
    reward_profile: str
    max_steps: int  # resolved budget
    goal: str
    target: dict  # hidden success criteria (from EpisodeStarted)
    step: int
    version: int  # number of events so far (= version of the next event)
    done: bool
    outcome: str | None
    failure_mode: str | None
    total_return: float
    world: World
    paid: dict  # once-per-episode rules paid so far -> version of the grant's cause
    mistakes: tuple  # MistakeRecorded events, in order
    rejected_calls: int  # ActionRejected not caused by chaos

    @property
    def steps_remaining(self) -> int:
        return self.max_steps - self.step


class StepInfo(NamedTuple):
    reward: float  # sum of this step's grants
    terminated: bool  # ended by success or an irreversible mistake
    truncated: bool  # ended by the step budget
    outcome: str | None
    failure_mode: str | None
    result: object  # the tool's JSON result (None when rejected)
    message: str
    rejected: str | None  # the ActionRejected code, if any


INITIAL_STATE = EpisodeState("", 0, 0.0, "default", 0, "", {}, 0, 0, False, None, None, 0.0,
                             INITIAL_WORLD, {}, (), 0)

_WORLD = _world.EVOLVERS
_evolve = _world.evolve


def _fold_into(s: EpisodeState, events: Iterable) -> EpisodeState:
    (task, seed, level, profile, max_steps, goal, target, step, version, done, outcome,
     failure_mode, ret, world, paid, mistakes, rejected) = s
    for e in events:
        version += 1
        t = type(e)
        if t in _WORLD:
            world = _evolve(world, e)
        elif t is ActionTaken:
            step = e.step
        elif t is RewardGranted:
            ret += e.value
            if e.rule in ONCE_RULES and e.rule not in paid:
                paid = {**paid, e.rule: e.cause}
        elif t is ActionRejected:
            if e.cause != CHAOS:
                rejected += 1
        elif t is MistakeRecorded:
            mistakes = (*mistakes, e)
        elif t is EpisodeEnded:
            done, outcome, failure_mode = True, e.outcome, e.failure_mode
        elif t is EpisodeStarted:
            task, seed, level, profile, max_steps, goal, target = e[:7]
            step, done, outcome, failure_mode, ret = 0, False, None, None, 0.0
            world, paid, mistakes, rejected = INITIAL_WORLD, {}, (), 0
        else:
            raise TypeError(f"not an event: {e!r}")
    return _new(EpisodeState, (task, seed, level, profile, max_steps, goal, target, step, version,
                               done, outcome, failure_mode, ret, world, paid, mistakes, rejected))


def apply(state: EpisodeState, event) -> EpisodeState:
    """The state after one more recorded event (no rules, no randomness)."""
    return _fold_into(state, (event,))


def fold(events: Iterable, state: EpisodeState = INITIAL_STATE) -> EpisodeState:
    """The state after ``events``, from the start (or from ``state``)."""
    return _fold_into(state, events)


def reset(spec: EpisodeSpec) -> tuple[EpisodeState, list, StepInfo]:
    """A new episode: EpisodeStarted, the initial world's events and the static chaos."""
    family = task_family(spec.task)
    reward_profile(spec.reward_profile)
    if isinstance(spec.seed, bool) or not isinstance(spec.seed, int):
        raise ValueError(f"seed must be an integer, not {spec.seed!r}")
    if spec.max_steps is not None and (isinstance(spec.max_steps, bool)
                                       or not isinstance(spec.max_steps, int)
                                       or spec.max_steps < 1):
        raise ValueError(f"max_steps must be a positive integer or None, not {spec.max_steps!r}")
    rules = checked_rules(spec.rules)
    level = _chaos.parse_chaos(spec.chaos)
    inst = family.generate(int(spec.seed), level, rules < 3)
    max_steps = spec.max_steps if spec.max_steps is not None else inst.budget
    events = [EpisodeStarted(spec.task, int(spec.seed), level, spec.reward_profile, max_steps,
                             inst.goal, stamped(inst.target, rules)), *inst.events]
    state = _fold_into(INITIAL_STATE, events)
    return state, events, step_info(INITIAL_STATE, events)


class _Ctx(NamedTuple):
    """What judge, chaos and reward predicates read mid-step (duck-types EpisodeState)."""

    world: World
    target: dict
    step: int
    chaos: float
    mistakes: tuple
    paid: dict
    rejected_calls: int


def step(state: EpisodeState, action) -> tuple[EpisodeState, list, StepInfo]:
    """One agent step. Never raises for a bad action (it becomes ActionRejected).

    The new state is built directly (the hot path); ``fold`` of the same events gives an
    equal state, which the tests check at every step.
    """
    if state.done:
        raise EpisodeFinished(f"episode already ended ({state.outcome}); reset to start anew")
    if state.version == 0:
        raise EpisodeFinished("episode not started; call reset first")
    n = state.step + 1
    action = to_json_value(action)
    parsed = parse_action(action)
    level = state.chaos
    target = state.target
    world = state.world
    rejected_calls = state.rejected_calls
    params = None
    if type(parsed) is Invalid:
        effects = refused(n, parsed.code, parsed.reason)
        rejected_calls += 1
    else:
        app, method, params = parsed
        outage = _chaos.outage(level, app, n, state.seed, state.task) if level > 0.0 else None
        if outage is not None:
            effects = [outage]
            params = None
        else:
            effects = _world.decide(world, app, method, params, n, target)
            if effects:
                if type(effects[0]) is ActionRejected:
                    rejected_calls += 1
                else:
                    world = _world.evolve_all(world, effects)
    events = [_new(ActionTaken, (n, action)), *effects]
    mistakes = state.mistakes
    ctx = _new(_Ctx, (world, target, n, level, mistakes, state.paid, rejected_calls))
    irreversible = None
    if params is not None and effects:
        found = judge(ctx, params, effects)
        if found:
            events += found
            mistakes = (*mistakes, *found)
            ctx = ctx._replace(mistakes=mistakes)
            irreversible = next((m for m in found if m.irreversible), None)
        if level > 0.0 and irreversible is None:
            triggered = _chaos.after(ctx, effects, state.seed, state.task)
            if triggered:
                events += triggered
                world = _world.evolve_all(world, triggered)
                ctx = ctx._replace(world=world)
    # termination
    if irreversible is not None:
        outcome, mode = "failure", irreversible.mode
    elif is_success(world, target):
        outcome, mode = "success", None
    elif n >= state.max_steps:
        outcome, mode = "truncated", truncation_mode(ctx)
    else:
        outcome = mode = None
    # rewards, then the end
    paid_events = grants(state.reward_profile, events, state.version, ctx)
    if outcome is not None:
        last = grants(state.reward_profile, [EpisodeEnded(outcome, mode, n, 0.0)], 0, ctx)
        end_version = state.version + len(events) + len(paid_events) + len(last)
        paid_events += [g._replace(cause=end_version) for g in last]
    total = state.total_return
    paid = state.paid
    for g in paid_events:
        total += g.value
        if g.rule in ONCE_RULES and g.rule not in paid:
            paid = {**paid, g.rule: g.cause}
    events += paid_events
    if outcome is not None:
        events.append(EpisodeEnded(outcome, mode, n, total))
    new = _new(EpisodeState, (state.task, state.seed, level, state.reward_profile,
                              state.max_steps, state.goal, target, n, state.version + len(events),
                              outcome is not None, outcome, mode, total, world, paid, mistakes,
                              rejected_calls))
    return new, events, step_info(state, events)


_NOT_EFFECTS = frozenset((ActionTaken, ActionRejected, RewardGranted, MistakeRecorded,
                          EpisodeEnded, MetricWentStale, MetricRefreshDelayed,
                          ApproverWentOutOfOffice, ApprovalDelayed, ApprovalFlagged,
                          TicketBlocked, TicketFieldCleared, ApprovalFieldsRequired))


def step_info(state_before: EpisodeState, step_events: list) -> StepInfo:
    """What the agent was told for a step: from the state before it and its events only."""
    first = step_events[0]
    if type(first) is EpisodeStarted:
        return StepInfo(0.0, False, False, None, None, None,
                        f"New {first.task} task. Read the goal; you have {first.max_steps} "
                        "steps.", None)
    reward = 0.0
    rejected = None
    message = ""
    end = None
    effects = []
    for e in step_events:
        t = type(e)
        if t is RewardGranted:
            reward += e.value
        elif t not in _NOT_EFFECTS:
            effects.append(e)
        elif t is ActionRejected:
            rejected = e.code
            message = e.reason
        elif t is EpisodeEnded:
            end = e
    result = None
    if rejected is None:
        action = first.action
        result, message = _world.result(state_before.world, action["app"], action["method"],
                                        action.get("params") or {}, effects)
    if end is None:
        return _new(StepInfo, (reward, False, False, None, None, result, message, rejected))
    if end.outcome == "success":
        message += " Task complete: success."
    else:
        message += f" Episode over: {end.outcome} ({end.failure_mode})."
    return StepInfo(reward, end.outcome != "truncated", end.outcome == "truncated",
                    end.outcome, end.failure_mode, result, message, rejected)


def observe(state: EpisodeState, info: StepInfo) -> dict:
    """The agent's JSON observation (the env adds the shared tool list and text lazily)."""
    return {
        "goal": state.goal,
        "step": state.step,
        "steps_remaining": state.steps_remaining,
        "result": info.result,
        "message": info.message,
        "error": info.rejected,
        "done": state.done,
        "outcome": state.outcome,
    }


def views(state: EpisodeState) -> dict:
    """JSON views of the three apps (everything, hidden values included: for replay / UI)."""
    return _world.views(state.world)
