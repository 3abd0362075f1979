"""Checkpointed sync from the event store into the DuckDB warehouse.

Each batch is one DuckDB transaction (analytics.transfer): insert the batch's events, recompute
the episodes and steps it touches, move the checkpoint. A sync killed at any point therefore
leaves the warehouse at the end of its last committed batch, and the next sync continues from
there: nothing is lost and nothing is counted twice. The store holds one row per append (a
commit); the readers page whole commits and unpack them into event rows (analytics.sources), so
batches end on commit boundaries, and the checkpoint is the position of the batch's last event.
A sync reads up to the store's head as of its start, so it ends even while writers keep
appending; the next sync takes what came since.

Every analytics command syncs first, and usually finds nothing new: that case checks the store
and stops before loading the readers, Arrow and NumPy (a sixth of a second of every command).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from analytics.stores import check_syncable, reader_for
from analytics.sync_progress import Progress, SharedProgress
from analytics.warehouse import (
    DERIVE_VERSION,
    NOT_WRITABLE,
    Warehouse,
    WarehouseError,
    WarehousePathError,
    default_path,
    open_for_sync,
    store_label,
)
from eventstore import EventStore
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
    waiting: bool = False  # commits made before the sync lie past it, behind an older transaction

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
        with open_for_sync(path) as wh:
            return _sync(db_url, store, wh, batch_events, shared, prefer, after_batch)
    finally:
        shared.close()


def _sync(db_url: str, store: EventStore, wh: Warehouse, batch_events: int, shared: SharedProgress,
          prefer: str | None, after_batch: Callable[[int], None] | None) -> SyncResult:
    started = time.perf_counter()
    with wh.writing():
        first_id = _check_identity(wh, db_url, store)
        _check_history(wh, db_url, store)
        # the head as of now (a writer that never stops cannot keep the sync going), to the
        # store's own rule of what a reader may read (PostgreSQL: below running transactions)
        head, waiting = store.read_bound()
        checkpoint = wh.checkpoint
        if head <= checkpoint:  # nothing new: no reader to open, nothing to load
            return SyncResult(0, 0, 0, time.perf_counter() - started, checkpoint,
                              reader_for(db_url, prefer), waiting)
        if wh.read_only:
            raise WarehouseError(f"cannot sync the warehouse {wh.path}: {NOT_WRITABLE}, and the store "
                                 f"holds events after its checkpoint ({checkpoint}, the store's head "
                                 f"{head}); pass a --warehouse this process can write")
        from analytics.sources import open_source
        from analytics.transfer import move

        source = open_source(db_url, engine=store.engine, prefer=prefer)
        try:
            moved = move(wh, source, (store_label(db_url), first_id), head, batch_events, shared,
                         after_batch)
        finally:
            source.close()
    return SyncResult(moved.events, moved.episodes, moved.batches, time.perf_counter() - started,
                      moved.checkpoint, source.name, waiting)


def _first_event_id(store: EventStore) -> str:
    """The id of the store's first event ("" for an empty store): what names a store to a warehouse."""
    first = store.commit_rows(0, 1)
    return next(iter(unpack(first[0]))).event_id if first else ""


def _check_identity(wh: Warehouse, db_url: str, store: EventStore) -> str:
    """Refuse to mix stores: a warehouse remembers the first event it saw and the derivation version.

    Returns the store's first event id ("" for an empty store).
    """
    state = wh.state()
    first_id = _first_event_id(store)
    derived_by = state.get("derive_version")
    if derived_by is not None and derived_by.isascii() and derived_by.isdigit() \
            and int(derived_by) > DERIVE_VERSION:  # rebuilt, a newer companyos would rebuild it back
        raise WarehousePathError(
            f"the warehouse {wh.path} was derived by a newer companyos (derivation version "
            f"{derived_by}; this one knows {DERIVE_VERSION}): upgrade companyos, pass another "
            "--warehouse, or rebuild it for this version with `companyos analytics sync --rebuild`")
    if derived_by not in (None, str(DERIVE_VERSION)):
        wh.reset()  # derived tables are defined differently now: rebuild from the store (refused
        # in words on a warehouse this process may not write)
        state = {}
    known_first = state.get("store_first_event")
    if known_first and first_id and known_first != first_id:
        raise WarehouseError(
            f"the warehouse {wh.path} was built from another store ({state.get('store')}); "
            "pass another --warehouse or rebuild it with `companyos analytics sync --rebuild`")
    if known_first and not first_id and int(state.get("position", 0)) > 0:
        raise WarehouseError(f"the store {store_label(db_url)} is empty but the warehouse {wh.path} "
                             "holds events; rebuild it with `companyos analytics sync --rebuild`")
    if not known_first and first_id and int(state.get("position", 0)) > 0 and not wh.read_only:
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
