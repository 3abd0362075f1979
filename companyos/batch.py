"""Run many logged episodes of a baseline agent, in one process or several sharing the store."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import statistics
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

import sqlalchemy

import domain
from companyos.agents import make_agent
from companyos.env import SEED_MAX, CompanyEnv, spec_from_options
from companyos.lifecycle import end_with
from companyos.runtime import DURABILITY
from eventstore import EventStore
from eventstore.engine import in_memory_sqlite

CHUNK = 50  # episodes per unit of work handed to a worker process


@dataclass(frozen=True, slots=True)
class RunPlan:
    db: str
    agent: str
    task: str  # a family name or "all"
    chaos: str | float
    episodes: int
    seed: int
    durability: str = "episode"
    reward_profile: str = "default"

    def task_of(self, index: int) -> str:
        if self.task != "all":
            return self.task
        families = list(domain.TASK_FAMILIES)
        return families[index % len(families)]


@dataclass(frozen=True, slots=True)
class EpisodeResult:
    episode_id: str
    task: str
    seed: int
    chaos: float
    agent: str
    outcome: str
    failure_mode: str | None
    steps: int
    reward_return: float
    digest: str

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["return"] = data.pop("reward_return")
        return data


def validate(plan: RunPlan) -> None:
    """Fail before any process starts, with words, when the plan names something unknown."""
    if plan.task != "all" and plan.task not in domain.TASK_FAMILIES:
        raise ValueError(f"unknown task {plan.task!r}; known: all, {', '.join(domain.TASK_FAMILIES)}")
    spec_from_options(plan.seed, {"task": None if plan.task == "all" else plan.task,
                                  "chaos": plan.chaos, "reward_profile": plan.reward_profile})
    make_agent(plan.agent, 0)
    if plan.episodes < 0:
        raise ValueError("--episodes must be 0 or more")
    last_seed = plan.seed + max(plan.episodes, 1) - 1
    if last_seed > SEED_MAX:
        raise ValueError(f"episode i uses seed {plan.seed}+i, so the last one would be "
                         f"{last_seed}, past the largest seed {SEED_MAX}")
    if _in_memory(plan.db):
        raise ValueError(f"--db {plan.db!r} is an in-memory SQLite store: every episode would "
                         "be gone when the run ends; name a file, e.g. sqlite:///companyos.db")
    if plan.durability not in DURABILITY:
        raise ValueError(f"--durability must be one of {', '.join(DURABILITY)}")


def _in_memory(url: str) -> bool:
    try:
        return in_memory_sqlite(url)
    except sqlalchemy.exc.ArgumentError:
        return False  # opening the store says what is wrong with it


def run_range(plan: RunPlan, start: int, stop: int, store: EventStore | None = None) -> list[EpisodeResult]:
    """Episodes start..stop-1 of the plan; episode i uses seed plan.seed + i."""
    own = store is None
    store = store or EventStore.open(plan.db)
    env = CompanyEnv(store, durability=plan.durability, agent=plan.agent)
    try:
        return [_one_episode(env, plan, index) for index in range(start, stop)]
    finally:
        env.close()
        if own:
            store.close()


def _one_episode(env: CompanyEnv, plan: RunPlan, index: int) -> EpisodeResult:
    seed = plan.seed + index
    task = plan.task_of(index)
    agent = make_agent(plan.agent, seed)
    observation, _ = env.reset(seed=seed, options={"task": task, "chaos": plan.chaos,
                                                   "reward_profile": plan.reward_profile})
    agent.reset(observation)
    while True:
        observation, _reward, terminated, truncated, info = env.step(agent.act(observation))
        if terminated or truncated:
            break
    runtime = env.runtime
    runtime.flush()
    state = runtime.state
    # the return as EpisodeEnded logs it (summed grant by grant), so every view shows one figure
    return EpisodeResult(runtime.episode_id, task, seed, state.chaos, plan.agent,
                         info["outcome"], info["failure_mode"], state.step, state.total_return,
                         runtime.digest)


_worker_store: EventStore | None = None


def _init_worker(db: str, parent: int) -> None:
    """Each worker process opens the store once and keeps it for all its chunks.

    Ctrl-C is the parent's to handle (it stops the pool); a worker whose parent died stops too,
    rather than log episodes no one will report and die on a broken pipe with a traceback.
    """
    global _worker_store
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _worker_store = EventStore.open(db)
    end_with(parent, lambda: os._exit(1))


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C during a run: carries the results of the episodes finished (and logged) so far."""

    def __init__(self, results: list[EpisodeResult]) -> None:
        super().__init__()
        self.results = results


def _work(args: tuple[RunPlan, int, int]) -> list[EpisodeResult]:
    plan, start, stop = args
    return run_range(plan, start, stop, _worker_store)


def run(plan: RunPlan, workers: int = 1,
        progress: Callable[[int], None] | None = None) -> list[EpisodeResult]:
    """All episodes of the plan, in index order; `progress(n)` is told as chunks finish."""
    validate(plan)
    size = max(CHUNK, min(2_000, plan.episodes // max(1, workers * 40)))
    chunks = [(plan, s, min(s + size, plan.episodes)) for s in range(0, plan.episodes, size)]
    results: list[EpisodeResult] = []
    try:
        for chunk in _execute(plan, chunks, workers):
            results.extend(chunk)
            if progress:
                progress(len(chunk))
    except BaseException as exc:
        # Ctrl-C in the middle of a commit surfaces as the driver's failure to roll back
        if isinstance(exc, KeyboardInterrupt) or isinstance(exc.__context__, KeyboardInterrupt):
            raise RunInterrupted(results) from None
        raise
    return results


def _execute(plan: RunPlan, chunks, workers: int) -> Iterator[list[EpisodeResult]]:
    if workers <= 1 or len(chunks) <= 1:
        store = EventStore.open(plan.db)  # opening migrates a new store
        try:
            for _, start, stop in chunks:
                yield run_range(plan, start, stop, store)
        finally:
            store.close()
        return
    EventStore.open(plan.db).close()  # migrate once, before the workers race to
    with mp.get_context("spawn").Pool(workers, _init_worker, (plan.db, os.getpid())) as pool:
        yield from pool.imap(_work, chunks)


def summarise(results: list[EpisodeResult]) -> dict[str, Any]:
    """Episodes, success rate, mean return ± std, mean steps and failure modes of a run."""
    n = len(results)
    returns = [r.reward_return for r in results]
    outcomes = Counter(r.outcome for r in results)
    modes = Counter(r.failure_mode for r in results if r.failure_mode)
    return {
        "episodes": n,
        "success_rate": outcomes["success"] / n if n else 0.0,
        "outcomes": dict(sorted(outcomes.items())),
        "mean_return": statistics.fmean(returns) if n else 0.0,
        "std_return": statistics.pstdev(returns) if n > 1 else 0.0,
        "mean_steps": statistics.fmean(r.steps for r in results) if n else 0.0,
        "failure_modes": dict(modes.most_common()),
    }
