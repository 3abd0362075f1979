"""Analytics at scale: log episodes, sync them into DuckDB, build the full report; time and memory.

Usage:
    python bench/analytics_scale.py                      # quick: 4,000 episodes via `companyos run`
    python bench/analytics_scale.py --episodes 200000
    python bench/analytics_scale.py --million            # the issue's 1,000,000 episodes
    python bench/analytics_scale.py --source synthetic   # synthetic episodes written in bulk (no env)

Figures: `companyos run --workers 2 --durability episode` episodes/s (source run) for the issue's
command as written (the CLI's defaults: expert agent, chaos medium) and for the random agent,
each timed as a whole CLI call (process start included); the sync's
events/s (wall and per CPU second), the full report's time on a synced warehouse, and peak memory
(ru_maxrss of this process, which syncs and reports; of the run's processes separately).
Targets (issue 6): run >= 3,000 episodes/s, sync >= 1,000,000 events/s, report over 1M episodes
<= 2 s, peak memory <= 4 GiB. The last line is the headline figure.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from analytics import report  # noqa: E402
from analytics.sync import sync  # noqa: E402
from analytics.warehouse import Warehouse  # noqa: E402


def cpu_seconds(who: int = resource.RUSAGE_SELF) -> float:
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime


def peak_gib(who: int = resource.RUSAGE_SELF) -> float:
    return resource.getrusage(who).ru_maxrss / (1024 * 1024)  # Linux reports KiB


def fill_with_run(url: str, episodes: int, workers: int) -> list[tuple[str, float]]:
    """Half the episodes by the issue's command (`companyos run` with its defaults: the expert
    agent at medium chaos), half by the random agent (so the warehouse holds failures to
    analyse); returns (what ran, episodes/s) for each half."""
    half = episodes // 2
    rates = []
    for label, extra, n, seed in (
            ("defaults (expert agent, chaos medium)", [], episodes - half, 0),
            ("random agent, chaos medium", ["--agent", "random", "--chaos", "medium"], half, 0)):
        if n == 0:
            continue
        started = time.perf_counter()
        subprocess.run([sys.executable, "-m", "companyos", "run", *extra, "--episodes", str(n),
                        "--seed", str(seed), "--workers", str(workers), "--durability", "episode",
                        "--db", url], check=True, stdout=subprocess.DEVNULL)
        rates.append((f"{label} episodes={n}", n / (time.perf_counter() - started)))
    return rates


def fill_synthetic(url: str, episodes: int) -> float:
    from analytics.synthetic import fill_sqlite

    started = time.perf_counter()
    fill_sqlite(url, episodes)
    return episodes / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=4_000)
    parser.add_argument("--million", action="store_true", help="1,000,000 episodes")
    parser.add_argument("--source", choices=("run", "synthetic"), default="run")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--dir", help="work directory (default: a new temporary one)")
    parser.add_argument("--reuse", action="store_true", help="reuse a filled store in --dir")
    args = parser.parse_args()
    episodes = 1_000_000 if args.million else args.episodes
    root = Path(args.dir or tempfile.mkdtemp(prefix="companyos-analytics-"))
    root.mkdir(parents=True, exist_ok=True)
    store = root / "companyos.db"
    url = f"sqlite:///{store}"
    warehouse = root / "companyos.duckdb"

    if not (args.reuse and store.exists()):
        for p in (store, Path(f"{store}-wal"), Path(f"{store}-shm")):
            p.unlink(missing_ok=True)
        if args.source == "run":
            for label, rate in fill_with_run(url, episodes, args.workers):
                print(f"run {label} workers={args.workers} durability=episode "
                      f"episodes_per_s={rate:.0f}")
            print(f"run peak_rss_gib={peak_gib(resource.RUSAGE_CHILDREN):.2f}")
        else:
            rate = fill_synthetic(url, episodes)
            print(f"synthetic fill episodes={episodes} episodes_per_s={rate:.0f}")
    for p in (warehouse, Path(f"{warehouse}.wal")):
        p.unlink(missing_ok=True)

    cpu0 = cpu_seconds()
    result = sync(url, warehouse)
    cpu = cpu_seconds() - cpu0
    print(f"sync events={result.events} episodes={result.episodes} batches={result.batches} "
          f"seconds={result.seconds:.2f} events_per_s={result.events_per_s:.0f} "
          f"events_per_cpu_s={result.events / cpu:.0f} reader={result.source} "
          f"store_mb={store.stat().st_size / 1e6:.0f} warehouse_mb={warehouse.stat().st_size / 1e6:.0f}")

    with Warehouse(warehouse) as wh:
        times = []
        for _ in range(3):
            started = time.perf_counter()
            data = report.build(wh)
            report.to_html(data)
            times.append(time.perf_counter() - started)
        print(f"report episodes={data['summary']['episodes']} first_s={times[0]:.3f} best_s={min(times):.3f}")
        started = time.perf_counter()
        again = sync(url, wh)
        print(f"incremental sync with nothing new: seconds={time.perf_counter() - started:.3f} "
              f"events={again.events}")
    print(f"peak_rss_gib={peak_gib():.2f} (sync and report process)")
    print(f"workdir={root}" + ("" if args.dir else " (temporary)"))
    if not args.dir and os.environ.get("KEEP") != "1":
        import shutil

        shutil.rmtree(root, ignore_errors=True)
    print(f"sync_events_per_s={result.events_per_s:.0f}")


if __name__ == "__main__":
    main()
