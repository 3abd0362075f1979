"""Append throughput: one step's four events per transaction, 1,000 per transaction, PG with 4 writers.

Usage: python bench/store_append.py [--seconds S]. PostgreSQL runs when COMPANYOS_TEST_PG_URL
(or COMPANYOS_BENCH_PG_URL) is set. The last line carries the headline SQLite figure.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _common import fresh_pg_url, fresh_sqlite_url, open_store, step_events  # noqa: E402


def four_event_appends(url: str, seconds: float, stream_prefix: str = "s") -> tuple[int, float]:
    store = open_store(url)
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
    store = open_store(url)
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
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()
    url = fresh_sqlite_url()
    appends, elapsed = four_event_appends(url, args.seconds)
    sqlite_appends = appends / elapsed
    print(f"sqlite four_event_appends_per_s={sqlite_appends:.0f} events_per_s={4 * appends / elapsed:.0f}")
    sqlite_batch = batch_appends(fresh_sqlite_url(), args.seconds)
    print(f"sqlite batch1000_events_per_s={sqlite_batch:.0f}")
    pg = fresh_pg_url()
    if pg:
        appends, elapsed = four_event_appends(pg, args.seconds)
        print(f"postgresql four_event_appends_per_s={appends / elapsed:.0f} (1 writer)")
        open_store(pg).close()
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
