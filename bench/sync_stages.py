"""Where the warehouse sync's CPU goes: each stage's CPU per event, and the ceiling that sets.

Usage:
    python bench/sync_stages.py --store PATH         # an existing SQLite store (e.g. analytics_scale's)
    python bench/sync_stages.py --episodes 40000     # fill a new one first by `companyos run`

The sync runs its stages on three threads at once (analytics.transfer): read (fetch the commit
rows, decompress their payloads), unpack (commits into event rows) and annotate on the reader's
thread; `derive_fresh` on the deriver's; inserting the events, `derive_batch` and `COMMIT` on the
writer's. Here the same functions run one after the other on one thread, batch by batch, into a
new warehouse, and each stage's thread CPU time and minor page faults are counted (a small store
overstates the faults: most are the first touch of memory the sync then keeps). However well
the threads overlap, a sync cannot beat (cores / CPU per event): that ceiling is the last line.
Issue 6 asks the sync for 1,000,000 events/s, so on two cores the whole pipeline must cost under
2 CPU-µs per event.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import duckdb  # noqa: E402
from analytics_scale import fill_with_run  # noqa: E402  (bench/ is the script's directory)

from analytics.derive import annotate, derive_batch, derive_fresh  # noqa: E402
from analytics.sources import SqliteSource, Unpacker  # noqa: E402
from analytics.sync import DEFAULT_BATCH  # noqa: E402
from analytics.transfer import INSERT_EVENTS, upcast  # noqa: E402
from analytics.warehouse import Warehouse  # noqa: E402

STAGES = ("read", "unpack", "annotate", "derive_fresh", "insert events", "derive_batch", "commit")


def _thread_faults() -> int:
    """Minor page faults of the calling thread so far (0 where the OS does not count per thread)."""
    who = getattr(resource, "RUSAGE_THREAD", None)
    return resource.getrusage(who).ru_minflt if who is not None else 0


def measure(store: Path, warehouse: Path, batch_events: int) -> tuple[Counter, Counter, int]:
    """CPU seconds and minor page faults per stage over the whole store, and the number of events.

    Faults are counted because each costs this VM ~3 µs of kernel time: memory a stage frees and
    the next batch allocates again shows up here, not in any profile of user code.
    """
    spent: Counter = Counter()
    faults: Counter = Counter()
    clock = time.thread_time

    def timed(stage: str, work, *args):
        started, faulted = clock(), _thread_faults()
        result = work(*args)
        spent[stage] += clock() - started
        faults[stage] += _thread_faults() - faulted
        return result

    source = SqliteSource(str(store))
    unpacker = Unpacker()
    deriver = duckdb.connect(config={"threads": "1"})
    events = position = 0
    try:
        with Warehouse(warehouse) as wh:
            con = wh.con
            con.execute("SET threads = 1")  # as the sync does
            while True:
                commits = timed("read", source.page, position, batch_events, 2**62)
                if commits.num_rows == 0:
                    break
                batch = timed("unpack", unpacker.events, commits, position)
                del commits  # as the sync's reader drops it: the next page may reuse its buffer
                batch = timed("annotate", lambda b: annotate(upcast(b)), batch)
                fresh = timed("derive_fresh", derive_fresh, deriver, batch)
                con.execute("BEGIN")
                con.register("batch", batch)
                timed("insert events", con.execute, INSERT_EVENTS)
                timed("derive_batch", derive_batch, con, batch["position"][0].as_py(), fresh)
                timed("commit", con.execute, "COMMIT")
                con.unregister("batch")
                events += batch.num_rows
                position = batch["position"][-1].as_py()
    finally:
        deriver.close()
        unpacker.close()
        source.close()
    return spent, faults, events


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--store", help="an existing SQLite store file")
    parser.add_argument("--episodes", type=int, default=4_000, help="episodes to log when no --store")
    parser.add_argument("--batch", type=int, default=DEFAULT_BATCH, help="events per sync batch")
    args = parser.parse_args()
    if args.store and not Path(args.store).is_file():
        parser.error(f"there is no store file at {args.store}")
    work = Path(tempfile.mkdtemp(prefix="companyos-stages-"))
    store = Path(args.store) if args.store else work / "companyos.db"
    try:
        if not args.store:  # half expert, half random-agent episodes, as analytics_scale.py logs them
            fill_with_run(f"sqlite:///{store}", args.episodes, workers=2)
        spent, faults, events = measure(store, work / "stages.duckdb", args.batch)
    finally:
        shutil.rmtree(work)
    if not events:
        raise SystemExit(f"the store {store} holds no events")
    total = sum(spent.values())
    for stage in STAGES:
        print(f"{stage:>14}: {spent[stage] / events * 1e6:5.2f} CPU-µs/event, "
              f"{faults[stage] / events:.3f} page faults/event")
    cores = len(os.sched_getaffinity(0))
    print(f"events={events} total={total / events * 1e6:.2f} CPU-µs/event cores={cores}")
    print(f"sync_ceiling_events_per_s={cores * events / total:.0f}")


if __name__ == "__main__":
    main()
