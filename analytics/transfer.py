"""Moving the store's events into the warehouse, batch by batch: the part of a sync that runs only
when there is something new (it loads Arrow, NumPy and the readers; see analytics.sync).

Each batch is one DuckDB transaction: insert the batch's events, write the episodes and steps it
touches, move the checkpoint. Three stages run at once on three threads, a batch apart (SQLite,
Arrow and DuckDB all release the GIL while they work): a reader reads and unpacks batch n+2, a
deriver derives the episodes batch n+1 starts on a private DuckDB (`derive_fresh`: most of the
derivation, and it needs nothing from the warehouse), and the caller's thread writes batch n,
deriving only the episodes that continue from earlier batches.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Callable, Generator
from typing import NamedTuple, TypeVar

import duckdb
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from analytics.derive import Fresh, annotate, derive_batch, derive_fresh
from analytics.sources import EVENT_SCHEMA, Source
from analytics.sync_progress import Progress
from analytics.warehouse import DERIVE_VERSION, Warehouse
from eventstore import CorruptCommit, canonical_json

T = TypeVar("T")
Derived = tuple[pa.Table, Fresh]  # a batch, and what derive_fresh made of it
AfterBatch = Callable[[int], None]
Identity = tuple[str, str]  # (the store's label, its first event id): what the warehouse remembers
INSERT_EVENTS = ("INSERT INTO events SELECT position, stream_id, version, type, schema_version, data, meta "
                 "FROM batch")


class Moved(NamedTuple):
    events: int
    episodes: int  # episode rows written or rewritten
    batches: int
    checkpoint: int


def move(wh: Warehouse, source: Source, identity: Identity, head: int, batch_events: int,
         progress: Progress, after_batch: AfterBatch | None) -> Moved:
    """Move the events in (checkpoint, head] from `source` into the warehouse, one transaction a
    batch, deriving the tables each batch touches; an exception leaves the last whole batch."""
    con = wh.con
    # One DuckDB thread while syncing: the reader and deriver threads keep the other core busy,
    # and DuckDB's parallel insert costs more CPU than it saves on a two-core machine.
    threads = con.execute("SELECT current_setting('threads')").fetchone()[0]
    con.execute("SET threads = 1")
    try:
        return _batches(wh, source, identity, head, batch_events, progress, after_batch)
    finally:
        con.execute(f"SET threads = {int(threads)}")


def _batches(wh: Warehouse, source: Source, identity: Identity, head: int, batch_events: int,
             progress: Progress, after_batch: AfterBatch | None) -> Moved:
    con = wh.con
    checkpoint = wh.checkpoint
    total = source.remaining(checkpoint, head)
    moved = episodes = batches = 0
    if total:
        progress(0, total)  # what lies ahead is known before the first batch is read
    for batch, fresh in _pipeline(source, checkpoint, head, batch_events):
        lo = batch["position"][0].as_py()
        hi = batch["position"][-1].as_py()
        con.execute("BEGIN")
        try:
            con.register("batch", batch)
            con.execute(INSERT_EVENTS)
            episodes += derive_batch(con, lo, fresh)
            values = {"position": hi, "checkpoint_digest": batch["digest"][-1].as_py() or "",
                      "derive_version": DERIVE_VERSION}
            if checkpoint == 0 and batches == 0:
                values["store"], first_id = identity
                if first_id:  # else the store was empty at the check; the next sync records it
                    values["store_first_event"] = first_id
            wh.set_state(**values)
            con.execute("COMMIT")
        except BaseException as exc:
            with contextlib.suppress(duckdb.Error):  # an interrupted COMMIT may have ended it
                con.execute("ROLLBACK")
            damage = _not_json(con, batch) if isinstance(exc, duckdb.Error) else None
            if damage is not None:
                raise damage from None
            raise
        finally:
            con.unregister("batch")
        checkpoint = hi
        moved += batch.num_rows
        batches += 1
        progress(moved, None if total is None else max(total, moved))
        if after_batch is not None:
            after_batch(checkpoint)
    return Moved(moved, episodes, batches, checkpoint)


def _not_json(con: duckdb.DuckDBPyConnection, batch: pa.Table) -> CorruptCommit | None:
    """The commit of the batch's first event whose data or meta is not JSON, which DuckDB only
    reports as a malformed value somewhere in a statement; None if there is none.

    Runs after the rollback, which also dropped the batch's registration.
    """
    con.register("suspect", batch)
    try:
        row = con.execute("SELECT position, stream_id, "
                          "CASE WHEN json_valid(data) THEN 'meta' ELSE 'data' END FROM suspect "
                          "WHERE NOT (json_valid(data) AND json_valid(meta)) "
                          "ORDER BY position LIMIT 1").fetchall()
        if not row:
            return None
        position, stream_id, field = row[0]
        commit = con.execute("SELECT min(position) FROM suspect WHERE stream_id = ? AND position >= ? "
                             "AND digest IS NOT NULL", [stream_id, position]).fetchall()[0][0]
    finally:
        con.unregister("suspect")
    return CorruptCommit(stream_id, position if commit is None else commit,
                         f"the {field} of its event at position {position} is not JSON")


def _pipeline(source: Source, after: int, head: int, limit: int) -> Generator[Derived, None, None]:
    """The store's pages up to `head` in order, each with the rows of the episodes it starts,
    read and derived on two threads ahead of the caller."""
    pages = _on_thread(_pages(source, after, head, limit), "analytics-sync-reader")
    return _on_thread(_derived(pages), "analytics-sync-deriver")


def _pages(source: Source, after: int, head: int, limit: int) -> Generator[pa.Table, None, None]:
    position = after
    while position < head:
        page = source.read(position, limit, head)
        if page.num_rows == 0:
            return
        position = page["position"][-1].as_py()
        yield annotate(upcast(page))


def _derived(pages: Generator[pa.Table, None, None]) -> Generator[Derived, None, None]:
    """Each page with the rows `derive_fresh` makes of it, on a private in-memory DuckDB."""
    con = duckdb.connect(config={"threads": "1"})
    try:
        for batch in pages:
            try:
                fresh = derive_fresh(con, batch)
            except duckdb.Error:
                damage = _not_json(con, batch)
                if damage is not None:
                    raise damage from None
                raise
            yield batch, fresh
    finally:
        con.close()
        pages.close()  # stops the reader's thread now, not when the generator is collected


def _on_thread(items: Generator[T, None, None], name: str) -> Generator[T, None, None]:
    """Iterate `items` on a thread of its own, one item ahead of the caller; an exception it raises
    reaches the caller in its place. Leaving the loop early stops the thread and closes `items`."""
    stop = threading.Event()
    ready: queue.Queue = queue.Queue(maxsize=1)
    done = object()

    def put(item: object) -> bool:
        while not stop.is_set():
            with contextlib.suppress(queue.Full):
                ready.put(item, timeout=0.1)
                return True
        return False

    def work() -> None:
        try:
            for item in items:
                if not put(item):
                    return
            put(done)
        except BaseException as exc:  # handed to the caller, which re-raises it
            put(exc)
        finally:
            items.close()

    thread = threading.Thread(target=work, name=name, daemon=True)
    thread.start()
    try:
        while True:
            item = ready.get()
            if item is done:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        thread.join()


def upcast(batch: pa.Table) -> pa.Table:
    """Lift events stored in an older schema version to the current one, as the domain would.

    The sync reads raw rows, so the domain's upcasters run here, on the few rows that need them.
    """
    from domain.events import EVENT_TYPES, from_envelope, to_envelope

    current = {name: cls.SCHEMA_VERSION for name, cls in EVENT_TYPES.items() if cls.SCHEMA_VERSION > 1}
    if not current or batch.num_rows == 0:
        return batch
    if not pc.any(pc.is_in(batch["type"], value_set=pa.array(list(current)))).as_py():
        return batch
    types = batch["type"].to_pylist()
    versions = batch["schema_version"].to_pylist()
    old = [i for i, (t, v) in enumerate(zip(types, versions, strict=True)) if t in current and v < current[t]]
    if not old:
        return batch
    data = batch["data"].to_pylist()
    for i in old:
        event = from_envelope(types[i], orjson.loads(data[i]), versions[i])
        _, payload, versions[i] = to_envelope(event)
        data[i] = canonical_json(payload).decode()
    columns = dict(zip(batch.column_names, batch.columns, strict=True))
    columns["data"] = pa.array(data, pa.string())
    columns["schema_version"] = pa.array(versions, pa.int32())
    return pa.Table.from_pydict(columns, schema=EVENT_SCHEMA)
