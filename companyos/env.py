"""CompanyEnv: the Gymnasium-shaped, in-process face of CompanyOS, logging every event to the store."""

from __future__ import annotations

import numbers
import secrets
from collections.abc import Mapping
from typing import Any

import domain
from companyos.config import resolve_db
from companyos.runtime import CommitGroup, EpisodeRuntime, check_group
from eventstore import EventStore, StoreClosed
from projections.episodes import new_agent_label_problem
from projections.render import render_views

DEFAULT_CHAOS = "medium"


SEED_MAX = 2**63 - 1
"""Seeds are stored in 64-bit columns (the read models, the warehouse)."""
RESET_OPTIONS = frozenset({"task", "chaos", "reward_profile", "max_steps", "rules", "episode_id"})
"""What `reset(options=...)` takes (the remote client refuses the rest in the same words)."""


def checked_seed(seed: Any) -> int:
    """The seed as a plain int, or ValueError in words.

    Non-negative, as Gymnasium and the server ask, and within the 64-bit columns every reader of
    the log holds. NumPy's integers pass (Gymnasium code draws seeds with NumPy), logged as ints.
    """
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise ValueError(f"seed must be a non-negative integer, not {type(seed).__name__}")
    seed = int(seed)
    if not 0 <= seed <= SEED_MAX:
        raise ValueError(f"seed {seed} is outside 0 to {SEED_MAX}: seeds are non-negative and "
                         "64-bit, as the log's readers hold them")
    return seed


def task_for_seed(seed: int) -> str:
    """The task family an episode plays when none is named: chosen by its seed, in turn."""
    families = list(domain.TASK_FAMILIES)
    return families[seed % len(families)]


def spec_from_options(seed: int | None, options: dict[str, Any] | None) -> domain.EpisodeSpec:
    """Turn reset options into a domain spec, with words for every bad value (no seed: a random
    one, as Gymnasium's reset without a seed gives)."""
    seed = secrets.randbelow(2**31) if seed is None else checked_seed(seed)
    if options is not None and not isinstance(options, Mapping):  # a list of pairs got to `.get`
        raise TypeError(f"options must be a dict of reset options, not {type(options).__name__}")
    options = dict(options or {})
    unknown = set(options) - RESET_OPTIONS
    if unknown:
        raise ValueError(f"unknown reset options: {sorted(unknown)}")
    for key in ("task", "reward_profile"):  # an empty one (an unset variable) is refused, not
        # read as "not given": an agent would train on tasks it never asked for
        if options.get(key) is not None and (not isinstance(options[key], str) or not options[key]):
            raise ValueError(f"{key} must be a non-empty string (leave it out for the default)")
    task = task_for_seed(seed) if options.get("task") is None else options["task"]
    domain.task_family(task)
    chaos = domain.parse_chaos(DEFAULT_CHAOS if options.get("chaos") is None else options["chaos"])
    profile = options.get("reward_profile") or "default"
    if profile not in domain.REWARD_PROFILES:
        raise ValueError(f"unknown reward_profile {profile!r}; known: {', '.join(domain.REWARD_PROFILES)}")
    max_steps = options.get("max_steps")
    if max_steps is not None:  # NumPy's integers too (rng.integers gives them), as a remote reset takes
        if not isinstance(max_steps, numbers.Integral) or isinstance(max_steps, bool) \
                or not 1 <= max_steps <= 10_000:
            raise ValueError("max_steps must be an integer from 1 to 10000")
        max_steps = int(max_steps)
    rules = options.get("rules")
    if isinstance(rules, numbers.Integral) and not isinstance(rules, bool):
        rules = int(rules)  # a NumPy integer, as max_steps takes one
    return domain.EpisodeSpec(task=task, seed=seed, chaos=chaos, reward_profile=profile,
                              max_steps=max_steps, rules=domain.checked_rules(rules))


class CompanyEnv:
    """Gymnasium-shaped: reset(seed, options) -> (obs, info); step(action) -> (obs, reward, terminated,
    truncated, info).

    durability="step" commits each step before `step` returns: a crash loses nothing and another
    process can continue the episode. durability="episode" keeps an episode's events in memory and
    commits them in one transaction when it ends (or on close): several times faster for bulk
    runs, but a crash loses the unfinished episode. With durability="episode" a `commit_group`
    (companyos.runtime.CommitGroup) takes each ended episode to write it together with others;
    its owner commits it (`companyos run` does, 16 episodes a transaction), and `close` writes
    what it still holds.
    """

    metadata = {"render_modes": ["ansi"]}

    def __init__(self, db: str | EventStore | None = None, durability: str = "step",
                 agent: str | None = None, commit_group: CommitGroup | None = None) -> None:
        check_group(durability, commit_group)
        if commit_group is not None and commit_group.store is not db:
            raise ValueError("a commit_group writes to its own store: pass that EventStore as db")
        if agent is not None and (problem := new_agent_label_problem(agent)):
            raise ValueError(problem)
        if isinstance(db, EventStore):
            self.store, self._owns_store = db, False
        else:
            self.store, self._owns_store = EventStore.open(resolve_db(db)), True
        self.durability = durability
        self.commit_group = commit_group
        self.agent = agent
        self.runtime: EpisodeRuntime | None = None
        self.tools = domain.TOOLS
        self._closed = False

    def _check_usable(self) -> None:
        """An environment that closed its own store refuses to go on: with durability "episode"
        its steps were only held in memory, and were lost without a word."""
        if self._closed and self._owns_store:
            raise StoreClosed("this CompanyEnv is closed, and its event store with it")

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None):
        self._check_usable()
        self._let_go()
        spec = spec_from_options(seed, options)
        meta = {"agent": self.agent} if self.agent else None
        self.runtime, info = EpisodeRuntime.start(
            self.store, spec, episode_id=(options or {}).get("episode_id"),
            durability=self.durability, meta=meta, group=self.commit_group)
        return self.runtime.observe(info), self._info(info)

    def resume(self, episode_id: str) -> dict[str, Any]:
        """Continue a running episode from the log (another process's, or this one's before a
        restart; logged with durability="step"): the next `step` acts on it. Returns its state.
        EpisodeNotFound for an id the store does not hold; steps of an ended episode raise
        EpisodeFinished as after any end. Two processes stepping one episode at once: the second
        append fails with a ConcurrencyError, and the log keeps the first."""
        self._check_usable()
        self._let_go()
        self.runtime = EpisodeRuntime.load(self.store, episode_id, self.durability)
        return self.state

    def _let_go(self) -> None:
        """Leave the episode under way, writing what it holds back (durability "episode")."""
        if self.runtime is not None:
            previous, self.runtime = self.runtime, None
            previous.flush_or_discard()

    def step(self, action: Any):
        self._check_usable()
        if self.runtime is None:
            raise RuntimeError("call reset() before step()")
        info = self.runtime.step(action)
        return (self.runtime.observe(info), info.reward, info.terminated, info.truncated,
                self._info(info))

    def _info(self, info: domain.StepInfo) -> dict[str, Any]:
        state = self.runtime.state
        return {"episode_id": self.runtime.episode_id, "step": state.step,
                "outcome": info.outcome, "failure_mode": info.failure_mode,
                "rejected": info.rejected}

    @property
    def state(self) -> dict[str, Any]:
        if self.runtime is None:
            return {"episode_id": None, "step_count": 0}
        return episode_state(self.runtime)

    def render(self) -> str:
        """The three apps as they are now, as text (Gymnasium's "ansi" render mode)."""
        if self.runtime is None:
            return ""
        return render_views(domain.views(self.runtime.state))

    def close(self) -> None:
        """Log what is held back, then let go of the store if this environment opened it.

        The commit group's ended episodes are written too: closing without its `commit()` lost
        them without a word (a later `commit()` then returns nothing for them)."""
        self._closed = True
        try:
            try:
                if self.runtime is not None:
                    self.runtime.flush_or_discard()
            finally:
                if self.commit_group is not None:
                    self.commit_group.commit()
        finally:
            if self._owns_store:
                self.store.close()

    def __enter__(self) -> CompanyEnv:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def episode_state(runtime: EpisodeRuntime) -> dict[str, Any]:
    """What `state` reports: identity, progress and outcome of the episode."""
    s = runtime.state
    return {"episode_id": runtime.episode_id, "step_count": s.step, "task": s.task,
            "seed": s.seed, "chaos": s.chaos, "reward_profile": s.reward_profile,
            "rules": domain.rules_of(s.target), "max_steps": s.max_steps, "done": s.done,
            "total_return": s.total_return, "outcome": s.outcome, "failure_mode": s.failure_mode,
            "agent": runtime.start_meta.get("agent")}
