"""Rebuild and verify split over worker processes, each owning a range of stream ids.

Folding is CPU-bound Python. Every read model is a fold per stream, so the streams can be
shared out: each worker reads only the streams in its key range, through the
(stream_id, version) index, stream by stream, and folds them with the runner's own rules.
A rebuild worker writes its rows in page-sized transactions and never moves a checkpoint
(the caller does that once all succeeded), and only while the checkpoints stand where the
rebuild's clear left them; a verify worker sends its findings back.
Processes are forked, so projections need not be importable or picklable. A worker leaves
Ctrl-C to its parent (which stops it), and stops by itself once its parent is gone (`kill -9`).
"""

from __future__ import annotations

import contextlib
import gc
import multiprocessing as mp
import os
import queue
import signal
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from eventstore import EventStore, RecordedEvent
from projections.reader import scan_range, stream_ranges
from projections.runner import (
    Entry,
    Projection,
    fold_records,
    lock_checkpoints,
    rows_of,
    transaction,
    write_rows,
)
from projections.verify import Checker

Progress = Callable[[int], None]


class WorkerFailed(RuntimeError):
    """A worker process ended before its range was done (killed, out of memory, or an error it
    printed): said in one line by the commands, not as a traceback."""


def _run(target, store: EventStore, upto: int, workers: int, extra: tuple,
         progress: Progress | None, results=None) -> tuple[int, list[Any]]:
    """Start one forked worker per stream range, relay progress and results; fail if one fails.

    Returns (events the workers read, what they put on `results`).
    """
    ctx = mp.get_context("fork")
    url = store.engine.url.render_as_string(hide_password=False)
    ranges = stream_ranges(store, workers, upto)
    counters = [ctx.Value("q", 0, lock=False) for _ in ranges]
    where = (url, store.upcasters, os.getpid())
    procs = [ctx.Process(target=target, daemon=True,
                         args=(where, lo, hi, upto, counters[k], results, *extra))
             for k, (lo, hi) in enumerate(ranges)]
    for proc in procs:
        proc.start()
    reported = 0
    collected: list[Any] = []

    def relay() -> None:
        nonlocal reported
        while results is not None:  # drain, so no worker blocks on a full pipe
            try:
                collected.append(results.get_nowait())
            except queue.Empty:
                break
        done = sum(c.value for c in counters)
        if progress is not None and done > reported:
            progress(done - reported)
            reported = done

    try:
        while any(proc.is_alive() for proc in procs):
            relay()
            time.sleep(0.05)
        relay()
        deadline = time.monotonic() + 5
        while results is not None and len(collected) < len(procs) and time.monotonic() < deadline:
            with contextlib.suppress(queue.Empty):
                collected.append(results.get(timeout=0.1))
        failed = [proc.exitcode for proc in procs if proc.exitcode != 0]
        if failed:
            raise WorkerFailed(f"{len(failed)} of {len(procs)} worker processes ended before their "
                               f"streams were done (exit code {', '.join(map(str, failed))}; a "
                               "negative one is the signal that ended it: -9 is kill -9 or the "
                               "OOM killer); run it again")
        if results is not None and len(collected) < len(procs):
            raise WorkerFailed("a worker process ended without sending its findings")
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.terminate()
            proc.join()
    return sum(c.value for c in counters), collected


def _worker_store(where: tuple[str, Any, int]) -> EventStore:
    """Set up a worker process and open its own connection to the store.

    Ctrl-C reaches the whole process group: the parent stops its workers, so a worker ignores it
    (no traceback from each); SIGTERM, which the parent stops them with, ends a worker outright.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the parent's handler would raise here instead
    gc.disable()  # see runner.bulk: a short-lived process folding fresh tuples
    return EventStore.open(where[0], upcasters=where[1])


def _pages(store: EventStore, where: tuple[str, Any, int], lo: str, hi: str | None, upto: int,
           page: int) -> Iterator[list[RecordedEvent]]:
    """A worker's pages of its stream range, read while its parent lives: a parent killed
    outright stops no one, so the worker checks page by page rather than write on for no one."""
    parent = where[2]
    for records in scan_range(store, lo, hi, upto, page):
        if os.getppid() != parent:
            os._exit(1)
        yield records


# -- rebuild ---------------------------------------------------------------------------------


def rebuild_in_parallel(store: EventStore, projections: Sequence[Projection], upto: int,
                        workers: int, page: int, progress: Progress | None,
                        cleared: dict[str, tuple[int, int]]) -> tuple[int, dict[str, set[str]]]:
    """Fold positions (0, upto] into the read models, cleared to the checkpoints `cleared`
    ((0, generation) by name), with `workers` processes.

    A worker writes a page only while every checkpoint stands as cleared: once another runner
    moved one (it folds from 0 over these rows, and its newer rows must stay) or cleared the read
    model again, the worker stops. Returns (events read, per read model the streams it could not
    fold in the pages written)."""
    read, parts = _run(_rebuild_range, store, upto, workers, (list(projections), page, cleared),
                       progress, mp.get_context("fork").Queue())
    return read, {p.name: set().union(*(part[p.name] for part in parts)) for p in projections}


def _rebuild_range(where: tuple[str, Any, int], lo: str, hi: str | None, upto: int, counter,
                   results, projections: list[Projection], page: int,
                   cleared: dict[str, tuple[int, int]]) -> None:
    entries: dict[str, dict[str, Entry]] = {p.name: {} for p in projections}
    unfolded: dict[str, set[str]] = {p.name: set() for p in projections}
    store = _worker_store(where)
    for records in _pages(store, where, lo, hi, upto, page):
        found: dict[str, set[str]] = {p.name: set() for p in projections}  # kept if written
        for projection in projections:
            fold_records(projection, records, entries[projection.name], found[projection.name])
        with transaction(store.engine) as conn:
            if lock_checkpoints(conn, cleared) != cleared:
                break  # another runner moved on or cleared again: its rows stand
            for projection in projections:
                mine = entries[projection.name]
                write_rows(conn, projection, *rows_of(projection, mine, list(mine),
                                                      found[projection.name]))
        for name, streams in found.items():
            unfolded[name].update(streams)
        tail = records[-1].stream_id  # stream order: only the last stream can continue
        for projection in projections:
            entry = entries[projection.name].get(tail)
            entries[projection.name] = {} if entry is None else {tail: entry}
            if entry is not None:
                entry.dirty = False
        counter.value += len(records)
    results.put(unfolded)
    store.close()


# -- verify ----------------------------------------------------------------------------------


def check_in_parallel(store: EventStore, projections: Sequence[Projection] | None,
                      checkpoints: dict[str, int], upto: int, workers: int, page: int,
                      progress: Progress | None):
    """A verify Checker holding the merged findings of `workers` processes."""
    ctx = mp.get_context("fork")
    results = ctx.Queue()
    _, parts = _run(_check_range, store, upto, workers, (projections, checkpoints, page),
                    progress, results)
    checker = Checker(projections, checkpoints)
    for part in parts:
        checker.merge(part)
    return checker


def _check_range(where: tuple[str, Any, int], lo: str, hi: str | None, upto: int, counter,
                 results, projections, checkpoints: dict[str, int], page: int) -> None:
    store = _worker_store(where)
    checker = Checker(projections, checkpoints)
    for records in _pages(store, where, lo, hi, upto, page):
        checker.feed(records)
        counter.value += len(records)
    checker.check_heads(store, upto, lo, hi)
    results.put(checker.partial())
    store.close()
