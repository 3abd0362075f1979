"""Read-model speed: rebuild all projections, `replay --step K`, and `verify`, over a filled store.

The store is filled with real domain episodes (expert and random agents, every family, chaos
from none to high), played once in memory and appended under fresh episode ids until the
store holds --events events; each episode is one append (as `durability="episode"` writes it)
unless --interleave N appends step by step, round-robin over N episodes at a time.

Usage: python bench/rebuild.py [--events N] [--interleave N] [--workers N] [--db URL]
Targets (SQLite, 1,000,000 events): rebuild >= 300,000 events/s; replay <= 5 ms; verify <= 10 s.
The last line is the headline figure: rebuild_events_per_s=...
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import sqlalchemy as sa  # noqa: E402
from _common import fresh_sqlite_url  # noqa: E402

import domain  # noqa: E402
from eventstore import EventStore, NewEvent  # noqa: E402

CHAOS = ("none", "low", "medium", "high")


def play(task: str, seed: int, chaos: str, agent_name: str, max_steps: int | None = None):
    """One episode in memory: a list of steps, each a list of (type, data, schema_version)."""
    from companyos.agents import make_agent

    agent = make_agent(agent_name, seed)
    spec = domain.EpisodeSpec(task, seed, domain.CHAOS_LEVELS[chaos], max_steps=max_steps)
    state, events, info = domain.reset(spec)
    obs = domain.observe(state, info)
    agent.reset(obs)
    steps = [[domain.to_envelope(e) for e in events]]
    while not state.done:
        state, events, info = domain.step(state, agent.act(obs))
        obs = domain.observe(state, info)
        steps.append([domain.to_envelope(e) for e in events])
    return agent_name, steps


def templates(count: int = 120) -> list:
    families = list(domain.TASK_FAMILIES)
    out = []
    for i in range(count):
        agent = "expert" if i % 3 else "random"
        out.append(play(families[i % len(families)], 1000 + i, CHAOS[(i // 5) % 4], agent))
    return out


def fill(store: EventStore, total: int, interleave: int) -> int:
    """Append copies of the template episodes until `total` events are stored."""
    pool = templates()
    written = 0
    n = 0
    open_streams: list = []
    while written < total or open_streams:
        while written < total and len(open_streams) < max(interleave, 1):
            agent, steps = pool[n % len(pool)]
            open_streams.append([f"bench-{n:08d}", agent, steps, 0, None])
            written += sum(len(s) for s in steps)
            n += 1
        if interleave <= 1:
            sid, agent, steps, _, _ = open_streams.pop()
            events = [NewEvent(t, d, v) for s in steps for (t, d, v) in s]
            events[0] = NewEvent(events[0].type, events[0].data, 1, meta={"agent": agent})
            store.append(sid, events, None)
            continue
        for stream in list(open_streams):
            sid, agent, steps, i, version = stream
            events = [NewEvent(t, d, v, meta={"agent": agent} if i == 0 and k == 0 else None)
                      for k, (t, d, v) in enumerate(steps[i])]
            recorded = store.append(sid, events, version)
            stream[3], stream[4] = i + 1, recorded[-1].version
            if i + 1 == len(steps):
                open_streams.remove(stream)
    return n


def cpu_seconds() -> float:
    """CPU time of this process and its finished children (the rebuild's worker processes)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def bench_rebuild(store: EventStore, workers: int | None) -> tuple[int, float, float]:
    """(events, wall seconds, CPU seconds over all processes) of rebuilding every read model."""
    from projections import ProjectionRunner, default_projections

    runner = ProjectionRunner(store, default_projections())
    start, cpu = time.perf_counter(), cpu_seconds()
    read = runner.rebuild(workers=workers)
    return read, time.perf_counter() - start, cpu_seconds() - cpu


def bench_replay(store: EventStore) -> tuple[float, float, int]:
    """Median and worst ms of `replay --step K` work (store already open) on a 50-step episode."""
    from projections.replay import replay

    for seed in range(200):  # a random agent that lasts the whole budget: 50 steps
        agent, steps = play("expense_report", seed, "medium", "random", max_steps=50)
        if len(steps) == 51:
            break
    events = [NewEvent(t, d, v) for s in steps for (t, d, v) in s]
    store.append("bench-replay-50", events, None)
    n_steps = len(steps) - 1
    replay(store, "bench-replay-50", n_steps // 2)  # warm the imports and caches once
    times = []
    for k in list(range(0, n_steps + 1, 5)) * 4:
        start = time.perf_counter()
        replay(store, "bench-replay-50", k)
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times), max(times), n_steps


def bench_verify(store: EventStore, workers: int | None) -> tuple[float, float, bool, int]:
    from projections.verify import verify

    start, cpu = time.perf_counter(), cpu_seconds()
    report = verify(store, workers=workers)
    return time.perf_counter() - start, cpu_seconds() - cpu, report.ok, report.events


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=200_000,
                        help="events to store (1000000 for the headline figures)")
    parser.add_argument("--interleave", type=int, default=1,
                        help="append step by step over this many episodes at a time")
    parser.add_argument("--workers", type=int, default=None,
                        help="processes for rebuild and verify (default: automatic)")
    parser.add_argument("--db", default=None, help="store URL (default: a fresh SQLite file)")
    args = parser.parse_args()
    url = args.db or fresh_sqlite_url()
    store = EventStore.open(url)
    start = time.perf_counter()
    episodes = fill(store, args.events, args.interleave)
    events = store.last_position() if store.engine.dialect.name == "sqlite" else args.events
    print(f"filled {episodes} episodes, ~{events} events in {time.perf_counter() - start:.1f} s "
          f"({url})")
    read, elapsed, cpu = bench_rebuild(store, args.workers)
    rate = read / elapsed
    print(f"rebuild episodes+views: {read} events in {elapsed:.2f} s = {rate:,.0f} events/s "
          f"(target >= 300,000); CPU {cpu * 1e6 / read:.2f} us/event over all processes")
    median, worst, n_steps = bench_replay(store)
    print(f"replay --step K of a {n_steps}-step episode: median {median:.2f} ms, worst {worst:.2f} ms "
          "(target <= 5 ms)")
    seconds, cpu, ok, checked = bench_verify(store, args.workers)
    print(f"verify: {checked} events in {seconds:.2f} s, ok={ok} "
          f"(= {seconds * 1_000_000 / max(checked, 1):.2f} s per 1M events; target <= 10 s); "
          f"CPU {cpu * 1e6 / max(checked, 1):.2f} us/event over all processes")
    store.close()
    if args.db is None:  # a million events take ~400 MB: do not leave them behind
        import shutil

        shutil.rmtree(Path(sa.make_url(url).database).parent, ignore_errors=True)
    print(f"rebuild_events_per_s={rate:.0f}")


if __name__ == "__main__":
    main()
