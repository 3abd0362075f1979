"""Append throughput: one step's four events per transaction, 1,000 per transaction, PG with 4 writers.

Usage: python bench/store_append.py [--seconds S] [--repeat R]. The SQLite figures are medians of
R runs of S seconds, each on a fresh store. PostgreSQL runs when COMPANYOS_TEST_PG_URL (or
COMPANYOS_BENCH_PG_URL) is set. The last line carries the headline SQLite figure.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
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


def four_event_appends(url: str, seconds: float, stream_prefix: str = "s") -> tuple[int, float]:
    store = EventStore.open(url)
    appends = 0
    version = None
    stream = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(100):
            recorded = store.append(f"{stream_prefix}-{stream}", step_events(appends), version)
            version = recorded[-1].version
            appends += 1
            if version > 200:
                stream += 1
                version = None
    elapsed = time.perf_counter() - start
    store.close()
    return appends, elapsed


def batch_appends(url: str, seconds: float, batch: int = 1000) -> float:
    store = EventStore.open(url)
    events = [e for i in range(batch // 4) for e in step_events(i)]
    n = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        store.append(f"batch-{n}", events, None)
        n += 1
    elapsed = time.perf_counter() - start
    store.close()
    return n * batch / elapsed


def _writer(args):
    url, seconds, prefix = args
    return four_event_appends(url, seconds, prefix)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    def four() -> float:
        appends, elapsed = four_event_appends(fresh_sqlite_url(), args.seconds)
        return appends / elapsed

    sqlite_appends, runs = median_of(four, args.repeat)
    print(f"sqlite four_event_appends_per_s={sqlite_appends:.0f} "
          f"events_per_s={4 * sqlite_appends:.0f} (median; {spread(runs)})")
    sqlite_batch, runs = median_of(lambda: batch_appends(fresh_sqlite_url(), args.seconds),
                                   args.repeat)
    print(f"sqlite batch1000_events_per_s={sqlite_batch:.0f} (median; {spread(runs)})")
    pg = fresh_pg_url()
    if pg:
        appends, elapsed = four_event_appends(pg, args.seconds)
        print(f"postgresql four_event_appends_per_s={appends / elapsed:.0f} (1 writer)")
        EventStore.open(pg).close()
        with mp.get_context("spawn").Pool(4) as pool:
            results = pool.map(_writer, [(pg, args.seconds, f"w{i}") for i in range(4)])
        total = sum(a for a, _ in results) / max(e for _, e in results)
        print(f"postgresql four_event_appends_per_s={total:.0f} (4 writer processes)")
        print(f"postgresql batch1000_events_per_s={batch_appends(pg, args.seconds):.0f}")
    else:
        print("postgresql skipped: set COMPANYOS_TEST_PG_URL")
    print(f"sqlite_four_event_appends_per_s={sqlite_appends:.0f}")


if __name__ == "__main__":
    main()
