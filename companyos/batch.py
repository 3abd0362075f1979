"""Run many logged episodes of a baseline agent, in one process or several sharing the store."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import statistics
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass
from multiprocessing.resource_tracker import ensure_running as ensure_resource_tracker
from typing import Any, Protocol

import domain
from analytics.intervals import wilson_interval
from companyos.agents import make_agent
from companyos.config import in_memory_store, read_only_refusal
from companyos.env import SEED_MAX, CompanyEnv, spec_from_options, task_for_seed
from companyos.lifecycle import die_with_parent
from companyos.runtime import DURABILITY, CommitGroup, EpisodeRuntime, UnloggedEpisode
from eventstore import EventStore

CHUNK = 50  # episodes per unit of work handed to a worker process
GROUP_COMMIT = 16
"""Ended episodes a run writes per transaction with durability "episode" (see CommitGroup)."""


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
    rules: int | None = None  # None: the current rules version

    def task_of(self, index: int) -> str:
        """Episode `index`'s task. With "all", the family its seed picks, as CompanyEnv's reset
        picks it: seed s is the same episode in any run, so a run resumed from its seed ranges
        plays what the whole run would have."""
        return self.task if self.task != "all" else task_for_seed(self.seed + index)


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
    if not plan.reward_profile:  # the options below would read an empty one as the default
        raise ValueError(f"--reward-profile is empty; known: {', '.join(domain.REWARD_PROFILES)}")
    if plan.task != "all" and plan.task not in domain.TASK_FAMILIES:
        raise ValueError(f"unknown task {plan.task!r}; known: all, {', '.join(domain.TASK_FAMILIES)}")
    spec_from_options(plan.seed, {"task": None if plan.task == "all" else plan.task,
                                  "chaos": plan.chaos, "reward_profile": plan.reward_profile,
                                  "rules": plan.rules})
    make_agent(plan.agent, 0)
    if plan.episodes < 0:
        raise ValueError("--episodes must be 0 or more")
    last_seed = plan.seed + max(plan.episodes, 1) - 1
    if last_seed > SEED_MAX:
        raise ValueError(f"episode i uses seed {plan.seed}+i, so the last one would be "
                         f"{last_seed}, past the largest seed {SEED_MAX}")
    if in_memory_store(plan.db):
        raise ValueError(f"the store {plan.db!r} is an in-memory SQLite store: every episode would "
                         "be gone when the run ends; name a file, e.g. sqlite:///companyos.db")
    if refused := read_only_refusal(plan.db, "a run logs episodes"):
        raise ValueError(refused)
    if plan.durability not in DURABILITY:
        raise ValueError(f"--durability must be one of {', '.join(DURABILITY)}")


def run_range(plan: RunPlan, start: int, stop: int, store: EventStore | None = None,
              halt: Halt | None = None, into: list | None = None) -> list[EpisodeResult]:
    """Episodes start..stop-1 of the plan; episode i uses seed plan.seed + i. Once `halt` is set
    no further episode starts: the ones finished so far are the result. Each result is appended
    to `into` (default: a new list, returned) once its episode is in the log (with durability
    "episode", GROUP_COMMIT episodes a transaction), so an exception loses none of them."""
    own = store is None
    store = store or EventStore.open(plan.db)
    group = CommitGroup(store, GROUP_COMMIT) if plan.durability == "episode" else None
    env = CompanyEnv(store, durability=plan.durability, agent=plan.agent, commit_group=group)
    done = [] if into is None else into
    ended: list[tuple] = []  # EpisodeResult fields but the digest, of episodes the group holds
    try:
        for index in range(start, stop):
            if halt is not None and halt.is_set():
                break
            runtime, info = _play(env, plan, index)
            if group is None:
                done.append(EpisodeResult(*_fields(plan, runtime, info), runtime.digest))
                continue
            ended.append(_fields(plan, runtime, info))
            if group.full:
                _write_group(group, ended, done)
        if group is not None:
            _write_group(group, ended, done)
    except BaseException:
        # the episodes that ended are whole: log them, unless the store is what failed
        with suppress(Exception):
            if group is not None:
                _write_group(group, ended, done)
        with suppress(UnloggedEpisode):  # the error in flight (a full disk...) is the one to say
            env.close()
        raise
    else:
        env.close()
        return done
    finally:
        if own:
            store.close()


def _write_group(group: CommitGroup, ended: list[tuple], done: list[EpisodeResult]) -> None:
    """Write the group's episodes; only then are they results (a result is a logged episode)."""
    try:
        written = group.commit()
        for fields, (_, head) in zip(ended, written, strict=True):
            done.append(EpisodeResult(*fields, head.digest))
    finally:
        ended.clear()


def _play(env: CompanyEnv, plan: RunPlan, index: int) -> tuple[EpisodeRuntime, dict]:
    """Episode `index` of the plan to its end; its runtime and last step's info."""
    seed = plan.seed + index
    agent = make_agent(plan.agent, seed)
    observation, _ = env.reset(seed=seed, options={"task": plan.task_of(index),
                                                   "chaos": plan.chaos,
                                                   "reward_profile": plan.reward_profile,
                                                   "rules": plan.rules})
    agent.reset(observation)
    while True:
        observation, _reward, terminated, truncated, info = env.step(agent.act(observation))
        if terminated or truncated:
            break
    runtime = env.runtime
    runtime.flush()
    return runtime, info


def _fields(plan: RunPlan, runtime: EpisodeRuntime, info: dict) -> tuple:
    """An ended episode's EpisodeResult fields, all but its digest, as its state holds them."""
    state = runtime.state
    # the return as EpisodeEnded logs it (summed grant by grant), so every view shows one figure
    return (runtime.episode_id, state.task, state.seed, state.chaos, plan.agent,
            info["outcome"], info["failure_mode"], state.step, state.total_return)


class Halt(Protocol):
    def is_set(self) -> bool: ...


_worker_store: EventStore | None = None
_worker_halt: Halt | None = None
_worker_failure: Exception | None = None  # why the worker could not open the store
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
"""Ctrl-C, and the polite stop of `kill`, `timeout`, `docker stop` and systemd: the first lets the
episodes under way finish and reports them, a second stops at once."""


def _init_worker(db: str, parent: int, halt: Halt | None = None) -> None:
    """Each worker process opens the store once and keeps it for all its chunks.

    Stopping is the parent's to handle (it sets `halt`: each worker finishes the episode under way
    and starts no other), so a worker ignores the stop signals a terminal or service manager
    sends its whole process group; the parent started it with them blocked, so one that arrived
    while it was starting up is dropped here instead of breaking its imports. A worker whose
    parent died stops at once, rather than log episodes no one will report and die on a broken
    pipe with a traceback.
    """
    global _worker_store, _worker_halt, _worker_failure
    die_with_parent(parent)
    for stop in STOP_SIGNALS:
        signal.signal(stop, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    _worker_halt = halt
    try:
        _worker_store = EventStore.open(db)
    except Exception as exc:  # said by its first chunk, as a chunk's failure: raised here it was a
        _worker_failure = _sendable(exc)  # traceback, then "a worker process died"


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C during a run: carries the results of the episodes finished (and logged) so far;
    `forced` when a second Ctrl-C cut episodes under way short."""

    def __init__(self, results: list[EpisodeResult], forced: bool = False) -> None:
        super().__init__()
        self.results = results
        self.forced = forced


class RunFailed(Exception):
    """The run stopped on an error (its cause, e.g. a lost database) after these episodes had
    finished and been logged. They are every episode the log holds, unless a worker died
    (WorkerDied): the episodes of its chunk that it had not reported yet are not among them."""

    def __init__(self, results: list[EpisodeResult]) -> None:
        super().__init__(f"the run stopped after {len(results)} episode(s)")
        self.results = results


class WorkerDied(RuntimeError):
    """A worker process ended without finishing its chunk (killed, or out of memory), or could
    not be started (no file descriptors or processes left)."""


class ChunkFailed(Exception):
    """A worker's chunk stopped on an error after these of its episodes were logged: the parent
    reports them with the rest (a bare exception from the worker lost them)."""

    def __init__(self, results: list[EpisodeResult], error: BaseException) -> None:
        super().__init__(results, error)
        self.results = results
        self.error = error


def _work(args: tuple[RunPlan, int, int]) -> list[EpisodeResult]:
    plan, start, stop = args
    if _worker_failure is not None:
        if _worker_halt is not None:  # the other chunks stop now, not as the parent reaches each
            _worker_halt.set()
        raise ChunkFailed([], _worker_failure)
    done: list[EpisodeResult] = []
    try:
        return run_range(plan, start, stop, _worker_store, _worker_halt, into=done)
    except Exception as exc:
        raise ChunkFailed(done, _sendable(exc)) from None


def _sendable(exc: Exception) -> Exception:
    """`exc` if it survives pickling back to the parent, else a RuntimeError in its words (a
    driver's exception may hold a connection)."""
    import pickle

    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:  # noqa: BLE001 - any failure to pickle means the same
        return RuntimeError(str(exc))
    return exc


def run(plan: RunPlan, workers: int = 1,
        progress: Callable[[int], None] | None = None) -> list[EpisodeResult]:
    """All episodes of the plan, in index order; `progress(n)` is told as chunks finish.

    The first Ctrl-C lets every process finish the episode under way and start no other, then
    raises RunInterrupted with exactly the episodes finished (none is left half-logged); a
    second one stops at once."""
    validate(plan)
    size = max(CHUNK, min(2_000, plan.episodes // max(1, workers * 40)))
    chunks = [(plan, s, min(s + size, plan.episodes)) for s in range(0, plan.episodes, size)]
    results: list[EpisodeResult] = []
    pooled = workers > 1 and len(chunks) > 1
    # a process-shared Event is a named semaphore, which a run killed outright leaves for
    # multiprocessing's resource tracker to clean up, with a warning: only pools need one
    halt = mp.get_context("spawn").Event() if pooled else threading.Event()
    try:
        with _stop_signals_set(halt) as stops:
            if not pooled:
                _run_here(plan, chunks, halt, results, progress)
            else:
                _run_pooled(plan, chunks, workers, stops, results, progress)
    except BaseException as exc:
        # Ctrl-C in the middle of a commit surfaces as the driver's failure to roll back
        if isinstance(exc, KeyboardInterrupt) or isinstance(exc.__context__, KeyboardInterrupt):
            raise RunInterrupted(results, forced=True) from None
        if isinstance(exc, Exception):  # what finished (maybe nothing) is still worth reporting
            raise RunFailed(results) from exc
        raise
    if halt.is_set():
        raise RunInterrupted(results)
    return results


class Stops:
    """The stop signals a run has had (Ctrl-C, SIGTERM): the first sets `halt`, the next is a
    KeyboardInterrupt. Counted here, not read from `halt`, which a failed chunk sets too (the
    user's first Ctrl-C after it was taken for a second)."""

    def __init__(self, halt) -> None:
        self.halt = halt
        self.count = 0
        self._holding = False
        self._held = False

    def handle(self, signum, frame) -> None:
        self.count += 1
        if self.count == 1:
            self.halt.set()
        elif self._holding:
            self._held = True
        else:
            raise KeyboardInterrupt

    @contextmanager
    def held(self) -> Iterator[None]:
        """Hold a forcing signal back while worker processes start, and raise it after: raised
        inside Process.start() it could leave a child no one kills. (Blocking the signals covers
        only this thread; another, such as a progress bar's, still takes them.)"""
        self._holding = True
        try:
            yield
        finally:
            self._holding = False
        if self._held:
            raise KeyboardInterrupt


@contextmanager
def _stop_signals_set(halt) -> Iterator[Stops]:
    """Route the stop signals to a Stops for the run. Only the main thread can take signals:
    elsewhere they keep their default meaning (and the Stops hears none)."""
    stops = Stops(halt)
    if threading.current_thread() is not threading.main_thread():
        yield stops
        return
    # a signal the command was started ignoring stays ignored (a background job of a script
    # ignores Ctrl-C), as Python itself leaves SIGINT then: it was honoured only once a run began
    previous = {stop: signal.signal(stop, stops.handle) for stop in STOP_SIGNALS
                if signal.getsignal(stop) != signal.SIG_IGN}
    try:
        yield stops
    finally:
        for stop, before in previous.items():
            signal.signal(stop, before)


def _run_here(plan: RunPlan, chunks, halt: Halt, results: list[EpisodeResult],
              progress: Callable[[int], None] | None) -> None:
    """The chunks in this process, each result into `results` as its episode finishes."""
    with EventStore.open(plan.db) as store:  # opening migrates a new store
        for _, start, stop in chunks:
            before = len(results)
            run_range(plan, start, stop, store, halt, into=results)
            if progress:
                progress(len(results) - before)


def _run_pooled(plan: RunPlan, chunks, workers: int, stops: Stops, results: list[EpisodeResult],
                progress: Callable[[int], None] | None) -> None:
    """The chunks on worker processes (no more than there are chunks), their results into
    `results` in chunk order. Once halted, the chunks left return at once.

    A worker that dies (killed, out of memory) breaks the pool, which says so (BrokenProcessPool):
    multiprocessing.Pool waited for its chunk for ever. A chunk that fails halts the others, which
    finish the episode under way; every episode logged is then reported, the failed chunk's too.
    """
    halt = stops.halt
    EventStore.open(plan.db).close()  # migrate once, before the workers race to
    others = set(mp.active_children())  # a library caller's own processes, never killed here
    try:
        ensure_resource_tracker()  # now: starting later, it would unblock the signals held below
        executor = ProcessPoolExecutor(min(workers, len(chunks)), mp_context=mp.get_context("spawn"),
                                       initializer=_init_worker,
                                       initargs=(plan.db, os.getpid(), halt))
    except OSError as exc:
        raise _cannot_start(exc) from None
    failure: BaseException | None = None
    try:
        # the workers start with the stop signals blocked (see _init_worker); one that comes
        # meanwhile reaches this process's handler when they are unblocked
        with stops.held(), stop_signals_blocked():
            try:
                futures = [executor.submit(_work, chunk) for chunk in chunks]
            except OSError as exc:
                raise _cannot_start(exc) from None
        for future in futures:
            try:
                chunk = future.result()
            except ChunkFailed as failed:
                halt.set()
                chunk, failure = failed.results, failure or failed.error
            results.extend(chunk)
            if progress:
                progress(len(chunk))
    except BaseException as exc:
        # a second stop signal, or a broken pool: the workers stop now, whatever they were doing.
        # Killed before the shutdown: from Python 3.12 the pool's own thread answers a dead worker
        # by SIGTERM to the others and a join, holding the lock shutdown() takes, and workers
        # ignore SIGTERM (see _init_worker), so the run hung for ever. The shutdown then waits
        # for that thread: left running, it could close its wake-up pipe just as the interpreter's
        # exit wrote to it (an OSError traceback after the run's error line)
        for child in set(mp.active_children()) - others:
            child.kill()
        executor.shutdown(wait=True, cancel_futures=True)
        if isinstance(exc, BrokenProcessPool):
            raise WorkerDied("a worker process died (killed, or out of memory?); the others were "
                             "stopped, cutting short the episodes they had under way, and the "
                             "episodes of every chunk not yet reported (up to 2,000 a worker) are "
                             "missing from this report: `companyos episodes` lists all the log "
                             "holds") from None
        raise
    executor.shutdown()
    if failure is not None:
        raise failure


def _cannot_start(exc: OSError) -> WorkerDied:
    """No file descriptors or processes left to start the workers: said in words (it was a
    traceback of multiprocessing's internals)."""
    return WorkerDied(f"cannot start the run's worker processes: {exc.strerror or exc}")


@contextmanager
def stop_signals_blocked() -> Iterator[None]:
    """Hold the stop signals while processes start: they inherit the mask, so one is never
    delivered to a worker still importing (a KeyboardInterrupt traceback each). Multiprocessing's
    resource tracker must be running already: starting, it unblocks them."""
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


@contextmanager
def stop_signals_deferred(stopping: bool = False) -> Iterator[None]:
    """A stop signal that comes meanwhile takes effect on leaving, as it would have then (a
    KeyboardInterrupt, or SIGTERM's default end); with `stopping` (the caller ends for a stop
    already, and says why) it is dropped. A thread's signal mask would not do: the kernel
    hands a signal sent to the process to any thread that does not block it, and Python then runs
    the handler in the main thread at once. Only the main thread may set handlers; elsewhere
    nothing is deferred."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    came: list[int] = []
    previous = {stop: signal.signal(stop, lambda number, _frame: came.append(number))
                for stop in STOP_SIGNALS}
    try:
        yield
    finally:
        # SIGINT's own handler last: a Ctrl-C that comes as it is restored raises at once, and
        # must not leave SIGTERM's recorder in place
        for stop in sorted(previous, key=lambda stop: stop == signal.SIGINT):
            signal.signal(stop, previous[stop])
        if came and not stopping:
            signal.raise_signal(came[0])


def summarise(results: list[EpisodeResult]) -> dict[str, Any]:
    """Episodes, success rate, mean return ± std, mean steps and failure modes of a run. A run of
    no episodes (`--episodes 0`, or stopped before the first ended) has no rate or mean: None, not
    a 0.0 a script would average in as a run that never succeeded."""
    n = len(results)
    returns = [r.reward_return for r in results]
    outcomes = Counter(r.outcome for r in results)
    modes = Counter(r.failure_mode for r in results if r.failure_mode)
    low, high = wilson_interval(outcomes["success"], n)  # as compare_agents gives it
    return {
        "episodes": n,
        "success_rate": outcomes["success"] / n if n else None,
        "success_rate_low": low,
        "success_rate_high": high,
        "outcomes": dict(sorted(outcomes.items())),
        "mean_return": statistics.fmean(returns) if n else None,
        # the sample deviation, as `analytics query compare_agents` gives it: one number for one thing
        "std_return": (statistics.stdev(returns) if n > 1 else 0.0) if n else None,
        "mean_steps": statistics.fmean(r.steps for r in results) if n else None,
        "failure_modes": dict(modes.most_common()),
    }
