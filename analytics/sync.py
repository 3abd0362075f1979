"""Checkpointed sync from the event store into the DuckDB warehouse.

Each batch is one DuckDB transaction: insert the batch's events, recompute the episodes and steps
it touches, move the checkpoint. A sync killed at any point therefore leaves the warehouse at the
end of its last committed batch, and the next sync continues from there: nothing is lost and
nothing is counted twice. The store holds one row per append (a commit); the readers page whole
commits and unpack them into event rows (analytics.sources), so batches end on commit boundaries,
and the checkpoint is the position of the batch's last event. Reading and unpacking the next
batch overlaps with writing the current one (a reader thread; SQLite, Arrow and DuckDB all
release the GIL while they work). A sync reads up to the store's head as of its start, so it ends
even while writers keep appending; the next sync takes what came since.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import duckdb
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from analytics.derive import annotate, derive_batch
from analytics.sources import EVENT_SCHEMA, Source, check_syncable, open_source
from analytics.sync_progress import Progress, SharedProgress
from analytics.warehouse import DERIVE_VERSION, Warehouse, WarehouseError, default_path, store_label
from eventstore import CorruptCommit, EventStore, canonical_json
from eventstore.packing import unpack

DEFAULT_BATCH = 500_000


@dataclass
class SyncResult:
    events: int  # events moved by this sync
    episodes: int  # episode rows written or rewritten
    batches: int
    seconds: float
    checkpoint: int
    source: str

    @property
    def events_per_s(self) -> float:
        return self.events / self.seconds if self.seconds > 0 else 0.0


def warehouse_path(db_url: str, warehouse: str | Path | None) -> Path:
    return Path(warehouse) if warehouse else default_path(db_url)


def open_store(db_url: str, create: bool = True) -> EventStore:
    """Open the store to sync from before any warehouse file is made for it, so a --db naming no
    store (StoreUnavailable) or one that cannot be synced (UnsyncableStore) leaves no file behind.

    `create=False` (the CLI) refuses a database holding no store, as `EventStore.open` does.
    """
    store = EventStore.open(db_url, create=create)
    try:
        check_syncable(db_url)
    except BaseException:
        store.close()
        raise
    return store


def sync(db_url: str, warehouse: str | Path | Warehouse | None = None, *,
         batch_events: int = DEFAULT_BATCH, progress: Progress | None = None,
         prefer: str | None = None, after_batch: Callable[[int], None] | None = None,
         store: EventStore | None = None) -> SyncResult:
    """Bring the warehouse up to date with the store at `db_url`; returns what moved.

    `store` is the store at `db_url` already opened by `open_store` (the caller closes it); without
    it the store is opened first and closed after. `after_batch(checkpoint)` runs after each
    committed batch (tests inject failures there).
    """
    if store is None:
        with open_store(db_url) as opened:
            return sync(db_url, warehouse, batch_events=batch_events, progress=progress,
                        prefer=prefer, after_batch=after_batch, store=opened)
    own = not isinstance(warehouse, Warehouse)
    path = warehouse_path(db_url, warehouse) if own else warehouse.path
    # how far, for processes that find the file locked; a warehouse this call opens is closed
    # before the file goes (closing can take a while on a slow machine), so a process following
    # the sync never finds the file locked with no sync to follow
    shared = SharedProgress(path, progress)
    try:
        if not own:
            return _sync(db_url, store, warehouse, batch_events, shared, prefer, after_batch)
        with Warehouse(path) as wh:
            return _sync(db_url, store, wh, batch_events, shared, prefer, after_batch)
    finally:
        shared.close()


AfterBatch = Callable[[int], None]


def _sync(db_url: str, store: EventStore, wh: Warehouse, batch_events: int, shared: SharedProgress,
          prefer: str | None, after_batch: AfterBatch | None) -> SyncResult:
    started = time.perf_counter()
    source = open_source(db_url, engine=store.engine, prefer=prefer)
    try:
        with wh.writing():
            first_id = _check_identity(wh, db_url, source)
            _check_history(wh, db_url, store)
            # the head as of now (a writer that never stops cannot keep the sync going), to the
            # store's own rule of what a reader may read (PostgreSQL: below running transactions)
            head = store.readable_position()
            return _run(wh, source, (store_label(db_url), first_id), head, batch_events, shared,
                        after_batch, started)
    finally:
        source.close()


def _check_identity(wh: Warehouse, db_url: str, source: Source) -> str:
    """Refuse to mix stores: a warehouse remembers the first event it saw and the derivation version.

    Returns the store's first event id ("" for an empty store).
    """
    state = wh.state()
    first_id = source.first_event_id()
    if state.get("derive_version") not in (None, str(DERIVE_VERSION)):
        wh.reset()  # derived tables are defined differently now: rebuild from the store
        state = {}
    known_first = state.get("store_first_event")
    if known_first and first_id and known_first != first_id:
        raise WarehouseError(
            f"the warehouse {wh.path} was built from another store ({state.get('store')}); "
            "pass another --warehouse or rebuild it with `companyos analytics sync --rebuild`")
    if known_first and not first_id and int(state.get("position", 0)) > 0:
        raise WarehouseError(f"the store {store_label(db_url)} is empty but the warehouse {wh.path} "
                             "holds events; rebuild it with `companyos analytics sync --rebuild`")
    if not known_first and first_id and int(state.get("position", 0)) > 0:
        wh.set_state(store_first_event=first_id)  # the store was empty when the first sync began
    return first_id


def _check_history(wh: Warehouse, db_url: str, store: EventStore) -> None:
    """Refuse a store whose events up to the checkpoint are not the ones synced: one restored from
    a backup, or a copy that went on separately, starts with the same event, yet the sync would
    keep the rows of episodes it no longer holds and never read what now lies below the checkpoint."""
    state = wh.state()
    position, seen = int(state.get("position", 0)), state.get("checkpoint_digest")
    if not position or not seen:  # nothing synced, or synced before the digest was kept
        return
    holding = store.commit_rows(position - 1, 1)  # the commit that holds the checkpoint's event
    now = next((r.digest for r in unpack(holding[0]) if r.position == position), None) if holding else None
    if now != seen:
        what = "no longer holds it" if now is None else "holds another event there"
        raise WarehouseError(
            f"the store {store_label(db_url)} changed history since the warehouse {wh.path} last "
            f"synced up to position {position}: it {what} (restored from a backup, or a copy?); "
            "rebuild it with `companyos analytics sync --rebuild`")


Identity = tuple[str, str]  # (the store's label, its first event id): what the warehouse remembers


def _run(wh: Warehouse, source: Source, identity: Identity, head: int, batch_events: int,
         progress: Progress, after_batch: AfterBatch | None, started: float) -> SyncResult:
    con = wh.con
    # One DuckDB thread while syncing: the reader thread keeps the other core busy, and DuckDB's
    # parallel insert costs more CPU than it saves on a two-core machine.
    threads = con.execute("SELECT current_setting('threads')").fetchone()[0]
    con.execute("SET threads = 1")
    try:
        return _batches(wh, source, identity, head, batch_events, progress, after_batch, started)
    finally:
        con.execute(f"SET threads = {int(threads)}")


def _batches(wh: Warehouse, source: Source, identity: Identity, head: int, batch_events: int,
             progress: Progress, after_batch: AfterBatch | None, started: float) -> SyncResult:
    con = wh.con
    checkpoint = wh.checkpoint
    total = source.remaining(checkpoint, head)
    moved = episodes = batches = 0
    if total:
        progress(0, total)  # what lies ahead is known before the first batch is read
    for batch in _prefetch(source, checkpoint, head, batch_events):
        lo = batch["position"][0].as_py()
        hi = batch["position"][-1].as_py()
        con.execute("BEGIN")
        try:
            con.register("batch", batch)
            con.execute("INSERT INTO events SELECT position, stream_id, version, type, schema_version, "
                        "data, meta FROM batch")
            episodes += derive_batch(con, lo)
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
    return SyncResult(moved, episodes, batches, time.perf_counter() - started, checkpoint, source.name)


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


def _prefetch(source: Source, after: int, head: int, limit: int) -> Iterator[pa.Table]:
    """Yield the store's pages up to `head` in order, reading and annotating page n+1 on a thread while the
    caller writes page n (SQLite, Arrow and DuckDB all release the GIL while they work).

    A further stage that derived new episodes on its own DuckDB instance was tried and dropped:
    moving the rows between instances cost more CPU than the overlap saved on two cores.
    """
    stop = threading.Event()
    pages: queue.Queue = queue.Queue(maxsize=1)

    def put(item: object) -> bool:
        while not stop.is_set():
            with contextlib.suppress(queue.Full):
                pages.put(item, timeout=0.1)
                return True
        return False

    def reader() -> None:
        position = after
        try:
            while not stop.is_set():
                page = source.read(position, limit, head) if position < head else None
                if page is None or page.num_rows == 0:
                    put(None)
                    return
                position = page["position"][-1].as_py()
                if not put(annotate(upcast(page))):
                    return
        except BaseException as exc:  # handed to the caller, which re-raises it
            put(exc)

    thread = threading.Thread(target=reader, name="analytics-sync-reader", daemon=True)
    thread.start()
    try:
        while True:
            item = pages.get()
            if isinstance(item, BaseException):
                raise item
            if item is None:
                return
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
