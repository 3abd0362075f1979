"""read_all throughput over a store filled with step-shaped events (SQLite, and PostgreSQL when configured).

Usage: python bench/store_read.py [--events N] [--repeat R]. Three SQLite stores are read: one
filled by 1,000-event appends (a bulk import), one by expert-agent episodes logged with
`durability="episode"` (what `companyos run` writes: one append of ~65 events per episode), and
one by 4-event appends (one step per commit, the slowest shape to read); each R times, figures
are medians. The last line carries the SQLite figure for the 4-event appends.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _common import (  # noqa: E402
    fresh_pg_url,
    fresh_sqlite_url,
    median_of,
    spread,
    step_events,
)

from eventstore import EventStore  # noqa: E402


def fill(url: str, total: int, steps_per_append: int = 250) -> int:
    """Write about `total` step-shaped events; returns how many were written."""
    store = EventStore.open(url)
    batch = [e for i in range(steps_per_append) for e in step_events(i)]
    version = None
    for n in range(total // len(batch)):
        stream, index = divmod(n, max(1, 200 // steps_per_append))
        version = None if index == 0 else version
        version = store.append(f"fill-{stream}", batch, version)[-1].version
    store.close()
    return total // len(batch) * len(batch)


def fill_with_episodes(url: str, total: int) -> int:
    """Log expert episodes as `companyos run --durability episode` does until about `total`
    events are stored; returns how many were."""
    from companyos.batch import RunPlan, run_range

    plan = RunPlan(url, "expert", "all", "medium", 0, 0, "episode")
    store = EventStore.open(url)
    start = 0
    while store.last_position() < total:
        run_range(plan, start, start + 1000, store)
        start += 1000
    written = store.last_position()
    store.close()
    return written


def read_rate(url: str) -> float:
    store = EventStore.open(url)
    start = time.perf_counter()
    count = 0
    for _ in store.read_all():
        count += 1
    elapsed = time.perf_counter() - start
    store.close()
    return count / elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    url = fresh_sqlite_url()
    written = fill(url, args.events)
    rate, rates = median_of(lambda: read_rate(url), args.repeat)
    print(f"sqlite read_all events={written} events_per_s={rate:.0f} (1000-event appends; "
          f"median, {spread(rates)})")
    url = fresh_sqlite_url()
    written = fill_with_episodes(url, args.events)
    rate, rates = median_of(lambda: read_rate(url), args.repeat)
    print(f"sqlite read_all events={written} events_per_s={rate:.0f} (expert episodes, one "
          f"append each; median, {spread(rates)})")
    url = fresh_sqlite_url()
    written = fill(url, args.events, steps_per_append=1)
    sqlite_rate, rates = median_of(lambda: read_rate(url), args.repeat)
    print(f"sqlite read_all events={written} events_per_s={sqlite_rate:.0f} (4-event appends; "
          f"median, {spread(rates)})")
    pg = fresh_pg_url()
    if pg:
        written = fill(pg, min(args.events, 200_000))
        rate, rates = median_of(lambda: read_rate(pg), args.repeat)
        print(f"postgresql read_all events={written} events_per_s={rate:.0f} "
              f"(median, {spread(rates)})")
    print(f"sqlite_read_all_events_per_s={sqlite_rate:.0f}")


if __name__ == "__main__":
    main()
