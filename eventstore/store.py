"""The append-only event store on SQLAlchemy Core: one stream per episode, one global order."""

from __future__ import annotations

import datetime as dt
import numbers
import os
import time
from collections.abc import Iterable, Iterator, Sequence
from itertools import chain, islice
from typing import Any, NamedTuple

import sqlalchemy as sa

from eventstore import migrate
from eventstore.backends import (
    MAX_EVENTS_PER_APPEND,
    READ_PAGE_COMMITS,
    STREAM_PAGE_COMMITS,
    BuildCommit,
    UniqueViolation,
    backend_for,
)
from eventstore.encoding import GENESIS_DIGEST, canonical_json, chain_digests, decode_json
from eventstore.engine import (
    BadSynchronous,
    UnsuitableEncoding,
    create_engine,
    in_memory_sqlite,
    normalise_url,
    sqlite_file,
    sqlite_immutable,
    sqlite_read_only,
    sqlite_uri_mode,
)
from eventstore.ids import new_event_id, new_event_ids
from eventstore.packing import SEPARATOR, Commit, make_commit, unpack
from eventstore.records import (
    MAX_EVENT_BYTES,
    MAX_SCHEMA_VERSION,
    MAX_STREAM_ID_LENGTH,
    MAX_TYPE_LENGTH,
    ConcurrencyError,
    NewEvent,
    RecordedEvent,
    StoreClosed,
    StoreUnavailable,
    StoreUnreachable,
    StreamHead,
)
from eventstore.upcasting import Upcasters

DEFAULT_URL = "sqlite:///companyos.db"
_HEAD_CACHE_SIZE = 4096

_EVENT_IDS_SQL = sa.text(
    "SELECT stream_id, min(version) FROM event_ids WHERE event_id IN :ids GROUP BY stream_id"
).bindparams(sa.bindparam("ids", expanding=True))


_BOUND_POLL_S = 0.1
"""How often `read_bound` looks again while it waits for older transactions to end."""


class _VersionMismatch(Exception):
    def __init__(self, actual: int | None) -> None:
        self.actual = actual


class NewStream(NamedTuple):
    """A new stream's first commit, built by `EventStore.new_stream` and not yet written (only
    the store that built it writes it: the payload is encoded for its database)."""

    commit: Commit
    supplied_ids: list[str]
    head: StreamHead
    store: EventStore


class EventStore:
    """Append and read events. Any SQLAlchemy URL; SQLite (WAL) by default, PostgreSQL for many writers."""

    def __init__(self, engine: sa.Engine, upcasters: Upcasters | None = None) -> None:
        self.engine = engine
        self.upcasters = upcasters or Upcasters()
        self._backend = backend_for(engine)
        self._heads: dict[str, tuple[int, str]] = {}

    @classmethod
    def open(
        cls,
        url: str = DEFAULT_URL,
        synchronous: str | None = None,
        upcasters: Upcasters | None = None,
        create: bool = True,
    ) -> EventStore:
        """Open (and if needed create and migrate) the store at `url`; with `create=False` a
        database that holds no store is refused (StoreUnavailable), not given one.

        SQLite durability: `synchronous="normal"` (default) survives a crashed process;
        `"full"` also survives power loss, at the price of an fsync per commit.
        """
        shown = shown_url(url)
        try:
            _check_a_sqlite_file_before_connecting(url, create)
        except (migrate.NoStore, migrate.ForeignTables) as exc:
            raise _no_store_at(url, exc) from None
        try:
            engine = create_engine(url, synchronous)
        except BadSynchronous:
            raise  # the URL is fine: the message says what is wrong
        except ImportError as exc:
            raise StoreUnavailable(f"{shown} needs a database driver that is not installed "
                                   f"({exc}); the store runs on SQLite and PostgreSQL") from None
        except (sa.exc.ArgumentError, sa.exc.NoSuchModuleError, ValueError) as exc:
            raise StoreUnavailable(f"{shown} is not a database URL the store can open ({exc}); "
                                   "use e.g. sqlite:///companyos.db or postgresql://user@host/db"
                                   ) from None
        try:
            migrate.upgrade(engine, create)
        except (migrate.NoStore, migrate.ForeignTables) as exc:
            engine.dispose()
            raise _no_store_at(url, exc) from None
        except (sa.exc.DBAPIError, migrate.MigrationFailed) as exc:
            engine.dispose()
            error = exc.error if isinstance(exc, migrate.MigrationFailed) else exc
            said = " ".join(str(error.orig).split())  # one line: psycopg's text spans several
            if _worlds_fault(error.orig, url):
                raise StoreUnreachable(f"cannot open the store at {shown}: {said}"
                                       f"{_read_only_media_hint(error.orig, url)}") from None
            if isinstance(exc, migrate.MigrationFailed):  # the user ran `episodes`: say it migrated
                raise StoreUnavailable(
                    f"the store at {shown} is at migration {exc.revision!r}, older than this "
                    f"companyos's {migrate.HEAD_REVISION!r}, and upgrading it failed: {said}; run "
                    "`companyos db upgrade` once with a URL and a role that may write and create "
                    "tables") from None
            raise StoreUnavailable(f"cannot open the store at {shown}: {said}") from None
        except migrate.NewerStore as exc:
            engine.dispose()
            raise StoreUnavailable(f"the store at {shown} is at {exc}") from None
        except UnsuitableEncoding as exc:
            engine.dispose()
            raise StoreUnavailable(
                f"the database at {shown} has the encoding {exc}, which cannot hold every character "
                "agents send: the store needs a UTF8 database (CREATE DATABASE ... ENCODING 'UTF8' "
                "TEMPLATE template0)") from None
        except migrate.OutdatedStore as exc:
            engine.dispose()
            raise StoreUnavailable(f"cannot read the store at {shown}: {exc}") from None
        return cls(engine, upcasters)

    def close(self) -> None:
        """Release the connections; using the store afterwards raises StoreClosed (it used to
        reconnect quietly, re-opening a writer and its lock file that nothing closed again)."""
        if self._backend is _CLOSED:
            return
        self._backend.close()
        self.engine.dispose()
        self._backend = self.engine = _CLOSED

    def __enter__(self) -> EventStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- writing -------------------------------------------------------------------------------

    def append(
        self, stream_id: str, events: Iterable[NewEvent], expected_version: int | None
    ) -> list[RecordedEvent]:
        """Atomically append `events` after `expected_version` (None: the stream must not exist).

        Raises ConcurrencyError when the stream moved on; re-sending already stored event ids
        returns the stored records instead of writing duplicates.
        """
        events = _event_list(events)
        if not events:  # nothing to write, but a stale expected version is still a conflict
            _check_stream_id(stream_id)
            expected = _checked_expected_version(expected_version)
            actual = self.stream_version(stream_id)
            if (-1 if actual is None else actual) != (-1 if expected is None else expected):
                raise ConcurrencyError(stream_id, expected, actual)
            return []
        written = self._write(stream_id, events, expected_version)
        return written if isinstance(written, list) else written[1].records(written[0])

    def append_head(
        self, stream_id: str, events: Iterable[NewEvent], expected_version: int | None
    ) -> StreamHead:
        """`append` for a writer that only needs where the stream now stands (the episode
        runtime): the same write, without building a record per event (~4% of the CPU of
        logging an episode). `events` must not be empty."""
        events = _event_list(events)
        if not events:
            raise ValueError("append_head needs at least one event")
        written = self._write(stream_id, events, expected_version)
        if isinstance(written, list):  # a retry: the records stored by the first attempt
            return StreamHead(written[-1].version, written[-1].digest)
        commit = written[1]
        return StreamHead(commit.last_version, commit.last_digest)

    def new_stream(self, stream_id: str, events: Iterable[NewEvent]) -> NewStream:
        """A new stream's first append, validated and encoded (digests included) but not
        written: `create_streams` writes several together. Raises ValueError for what `append`
        refuses, naming the stream, and for an empty one."""
        events = _event_list(events)
        if not events:
            _check_stream_id(stream_id)
            raise ValueError(f"stream {stream_id!r}: a new stream needs at least one event")
        try:
            supplied, build = self._commit_builder(stream_id, events, None)
        except ValueError as exc:
            raise ValueError(f"stream {stream_id!r}: {exc}") from None
        commit = build(None)
        return NewStream(commit, supplied, StreamHead(commit.last_version, commit.last_digest),
                         self)

    def create_streams(self, streams: Iterable[NewStream]) -> list[StreamHead]:
        """Write several new streams (from `new_stream`) in one transaction: all or none.

        Why: a bulk writer (`companyos run`'s group commit) pays a transaction's fixed cost (the
        write lock, the pages it rewrites) once for many episodes. Each stream is still one
        commit, as `append(stream_id, events, None)` writes it. Raises ConcurrencyError naming a
        stream that already exists, ValueError for a stream or event id named twice, an event
        id stored already, or more than 2**20 events in all; nothing is written then. Unlike
        `append`, re-sending streams that committed is not taken for a retry: they exist. A
        stream built by another store is refused too. Any iterable of streams will do, a
        generator included (its first pass used it up: nothing was written, and no error said so).
        """
        streams = _listed(streams, NewStream, "streams", "new_stream()'s results")
        names = [stream.commit.stream_id for stream in streams]
        if strangers := [stream.commit.stream_id for stream in streams if stream.store is not self]:
            raise ValueError(f"streams {strangers} were built by another store: build them with "
                             "this one's new_stream")
        if len(set(names)) != len(names):
            raise ValueError("create_streams names the same stream twice")
        supplied = [event_id for stream in streams for event_id in stream.supplied_ids]
        if len(set(supplied)) != len(supplied):
            raise ValueError("create_streams names the same event_id twice")
        if sum(stream.commit.count for stream in streams) > MAX_EVENTS_PER_APPEND:
            raise ValueError(f"one create_streams takes at most {MAX_EVENTS_PER_APPEND} events")
        if not streams:
            return []
        try:
            self._backend.insert_new([stream.commit for stream in streams])
        except UniqueViolation:
            for stream_id in names:
                self._heads.pop(stream_id, None)
                if (version := self.stream_version(stream_id)) is not None:
                    raise ConcurrencyError(stream_id, None, version) from None
            clashing = [r.event_id for r in self._by_event_ids(supplied)]
            raise ValueError(f"event ids already stored in other appends: {clashing}") from None
        for stream in streams:
            self._remember_head(stream.commit.stream_id, *stream.head)
        return [stream.head for stream in streams]

    def _commit_builder(self, stream_id: str, events: Sequence[NewEvent],
                        expected_version: int | None) -> tuple[list[str], BuildCommit]:
        """Validate and encode an append before any write starts, so a bad one writes nothing:
        its caller-supplied event ids, and what builds its commit after the head it finds."""
        _check_stream_id(stream_id)
        if len(events) > MAX_EVENTS_PER_APPEND:
            raise ValueError(f"one append takes at most {MAX_EVENTS_PER_APPEND} events")
        types, schemas, datas, given_ids, metas = _encode(events)
        joined = "".join(types)  # one check per append; `_unstorable` names the culprit
        if SEPARATOR in joined or _unholdable(joined):
            raise ValueError(next(problem for t in types if (problem := _unstorable(t, "event type"))))
        supplied_ids = [event_id for event_id in given_ids if event_id is not None]
        if len(set(supplied_ids)) != len(supplied_ids):
            raise ValueError("one append names the same event_id twice")
        plain_meta = canonical_json({"recorded_at": dt.datetime.now(dt.UTC).isoformat()}).decode()
        event_metas = ([_meta_json(meta, plain_meta) if meta else None for meta in metas]
                       if any(metas) else None)
        event_ids = ([event_id or new_event_id() for event_id in given_ids] if supplied_ids
                     else new_event_ids(len(given_ids)))

        encode = self._backend.encode_payload

        def build(head: tuple[int, str] | None) -> Commit:
            """The commit after `head`: only the digest chain and versions depend on it."""
            version = -1 if head is None else head[0]
            if version != (-1 if expected_version is None else expected_version):
                raise _VersionMismatch(None if head is None else head[0])
            digests = chain_digests(GENESIS_DIGEST if head is None else head[1], types, schemas,
                                    datas)
            supplied = [(event_id, stream_id, version + 1 + i)
                        for i, event_id in enumerate(given_ids) if event_id is not None]
            return make_commit(stream_id, version + 1, event_ids, types, schemas, datas,
                               digests, plain_meta, event_metas, supplied, encode)

        return supplied_ids, build

    def _write(self, stream_id: str, events: Sequence[NewEvent], expected_version: int | None
               ) -> tuple[int, Commit] | list[RecordedEvent]:
        """The commit written and its position, or the stored records when `events` repeat an
        append that already committed."""
        expected_version = _checked_expected_version(expected_version)
        supplied_ids, build = self._commit_builder(stream_id, events, expected_version)
        try:
            position, commit = self._backend.append(stream_id, build, expected_version,
                                                    self._heads.get(stream_id))
        except _VersionMismatch as mismatch:
            retry = _as_retry(stream_id, self._by_event_ids(supplied_ids), supplied_ids, len(events),
                              expected_version)
            if retry is not None:
                return retry
            raise ConcurrencyError(stream_id, expected_version, mismatch.actual) from None
        except UniqueViolation:
            self._heads.pop(stream_id, None)
            stored = self._by_event_ids(supplied_ids)
            retry = _as_retry(stream_id, stored, supplied_ids, len(events), expected_version)
            if retry is not None:
                return retry
            if stored:
                clashing = [r.event_id for r in stored]
                raise ValueError(f"event ids already stored in other appends: {clashing}") from None
            raise ConcurrencyError(stream_id, expected_version,
                                   self.stream_version(stream_id)) from None
        self._remember_head(stream_id, commit.last_version, commit.last_digest)
        return position, commit

    def _remember_head(self, stream_id: str, version: int, digest: str) -> None:
        """Cache a stream's head so the next append skips a query; a stale entry only costs a retry."""
        heads = self._heads
        if len(heads) >= _HEAD_CACHE_SIZE and stream_id not in heads:
            heads.pop(next(iter(heads)))
        heads[stream_id] = (version, digest)

    def _by_event_ids(self, ids: list[str]) -> list[RecordedEvent]:
        """The stored events with these caller-supplied ids, in position order."""
        if not ids:
            return []
        with self.engine.connect() as conn:
            starts = conn.execute(_EVENT_IDS_SQL, {"ids": ids}).all()
        wanted = set(ids)
        found = [r for stream_id, first in starts for r in self.read_stream(stream_id, first)
                 if r.event_id in wanted]
        return sorted(found, key=lambda r: r.position)

    # -- reading -------------------------------------------------------------------------------

    def read_stream(self, stream_id: str, from_version: int = 0) -> Iterator[RecordedEvent]:
        """The stream's events in version order (upcast to the current schema), read a page of
        commits at a time (STREAM_PAGE_COMMITS)."""
        _check_stream_id(stream_id)  # else each database answered in its own way (42 read "42")
        from_version = _checked_count("from_version", from_version)
        apply = self.upcasters.apply if self.upcasters.types else None
        sql, backend = self._backend.stream_sql(), self._backend
        while True:
            rows = backend.fetch(sql, (stream_id, from_version, STREAM_PAGE_COMMITS))
            record = None
            for row in rows:
                for record in unpack(row):
                    if record.version >= from_version:
                        yield record if apply is None else apply(record)
            if len(rows) < STREAM_PAGE_COMMITS or record is None:
                return
            from_version = record.version + 1

    def read_all(self, after_position: int = 0, limit: int | None = None) -> Iterator[RecordedEvent]:
        """Every event after `after_position` in commit order, read in pages so memory stays flat.

        Lazy: nothing is read before the first event is asked for. The events of a page are
        chained in C (itertools), so no Python frame resumes per event.
        """
        after_position = _checked_count("after_position", after_position)
        if limit is not None and _checked_count("limit", limit) == 0:
            return iter(())
        events: Iterator[RecordedEvent] = chain.from_iterable(self._pages(after_position))
        if self.upcasters.types:
            events = map(self.upcasters.apply, events)
        return events if limit is None else islice(events, limit)

    def _pages(self, after: int) -> Iterator[Iterator[RecordedEvent]]:
        """The events after `after`, one iterator per page of commits."""
        rows = self.commit_rows(after, READ_PAGE_COMMITS)
        if not rows:
            return
        # only the very first commit read may hold events at or before `after`
        yield (r for r in unpack(rows[0]) if r.position > after)
        yield chain.from_iterable(map(unpack, rows[1:]))
        while len(rows) == READ_PAGE_COMMITS:
            rows = self.commit_rows(rows[-1][0], READ_PAGE_COMMITS)
            yield chain.from_iterable(map(unpack, rows))

    # -- raw commit rows, for readers that unpack (and survive damage) themselves ---------------

    def commit_rows(self, after: int, commits: int, upto: int | None = None) -> list[tuple]:
        """Up to `commits` stored commit rows (READ_COLUMNS; see eventstore.packing) ending after
        position `after` and, if given, at or before `upto`, in position order.

        The first row may hold events at or before `after` (a commit is one row). On PostgreSQL
        only rows below the transaction-id high-water mark, as `read_all`.
        """
        after, commits = _checked_count("after", after), _checked_count("commits", commits)
        if upto is None:
            return self._backend.fetch(self._backend.page_sql(), (after, commits))
        return self._backend.fetch(self._backend.page_sql(upto=True), (after, upto, commits))

    def commit_rows_by_stream(self, after: tuple[str, int], below: str | None, upto: int,
                              commits: int) -> list[tuple]:
        """Up to `commits` commit rows after the key `after` = (stream_id, first_version), of
        streams below `below` (None: no bound), at positions up to `upto`, in stream order."""
        params = [*after, *([below] if below is not None else []), upto, commits]
        return self._backend.fetch(self._backend.stream_order_sql(below is not None), params)

    def stream_ids(self, upto: int) -> list[str]:
        """The ids of the streams begun at or before position `upto`, in id order."""
        return [row[0] for row in self._backend.fetch(self._backend.stream_starts_sql(), (upto,))]

    def stream_heads(self, upto: int, lo: str = "", hi: str | None = None) -> list[tuple[str, int, str]]:
        """(stream_id, last version, last digest) of every stream in [lo, hi) as its newest commit
        row at or before `upto` states them: the head columns writers chain onto, which `verify`
        checks against the events themselves."""
        bound = "" if hi is None else "AND stream_id < :hi "
        sql = sa.text(
            "SELECT c.stream_id, c.last_version, c.last_digest FROM commits c JOIN ("
            "SELECT stream_id, max(first_version) AS v FROM commits "
            f"WHERE position <= :upto AND stream_id >= :lo {bound}GROUP BY stream_id) h "
            "ON h.stream_id = c.stream_id AND h.v = c.first_version")
        with self.engine.connect() as conn:
            return [tuple(r) for r in conn.execute(sql, {"upto": upto, "lo": lo, "hi": hi})]

    def stream_version(self, stream_id: str) -> int | None:
        """Version of the stream's last event, or None when the stream does not exist."""
        head = self.stream_head(stream_id)
        return None if head is None else head.version

    def stream_digest(self, stream_id: str) -> str | None:
        """The digest of the stream's last event: equal digests mean identical streams."""
        head = self.stream_head(stream_id)
        return None if head is None else head.digest

    def stream_head(self, stream_id: str) -> StreamHead | None:
        """(last version, last digest) as the newest commit row states them, by the same query the
        writers run to chain onto it; None when the stream does not exist."""
        _check_stream_id(stream_id)
        rows = self._backend.fetch(self._backend.head_sql(), (stream_id,))
        return StreamHead(*rows[0]) if rows else None

    def last_position(self) -> int:
        return self._max_position(())

    def _max_position(self, conditions: tuple[str, ...]) -> int:
        """The largest position among commit rows meeting every condition (0: none)."""
        where = " AND ".join(conditions)
        with self.engine.connect() as conn:
            return conn.execute(sa.text("SELECT max(position) FROM commits"
                                        + (f" WHERE {where}" if where else ""))).scalar() or 0

    def read_bound(self, wait: float = 0.0) -> tuple[int, bool]:
        """`readable_position()`, and whether commits already written lie past it (PostgreSQL:
        behind a transaction still running), so a reader can say that what it read is not all.
        The newest is read first: commits made after this call are simply later, not waiting.

        `wait` seconds at most are spent polling for those commits to become readable (the
        transactions older than them to end), so a check can cover everything made before it.
        """
        newest = self.written_position()
        upto = self.readable_position()
        if upto < newest and wait > 0:
            deadline = time.monotonic() + wait
            while upto < newest and time.monotonic() < deadline:
                time.sleep(min(_BOUND_POLL_S, max(deadline - time.monotonic(), 0)))
                upto = self.readable_position()
        return upto, newest > upto

    def written_position(self) -> int:
        """The last position a transaction could have written: `last_position()` without the
        commit rows `misplaced_commits()` names, which no reader would ever reach."""
        return self._max_position(self._backend.begun)

    def misplaced_commits(self, limit: int = 20) -> list[tuple[int, str]]:
        """(position, stream_id) of up to `limit` commit rows at positions no transaction has
        written yet (PostgreSQL: past every transaction id begun). Readers stop below running
        transactions, so such a row would wait unread for ever; only tampering puts one there."""
        if not self._backend.begun:
            return []
        where = " OR ".join(f"NOT ({c})" for c in self._backend.begun)
        with self.engine.connect() as conn:
            return [tuple(r) for r in conn.execute(sa.text(
                f"SELECT position, stream_id FROM commits WHERE {where} ORDER BY position "
                "LIMIT :n"), {"n": limit})]

    def misnumbered_commits(self, upto: int, limit: int = 20) -> list[tuple[int, str]]:
        """(position, stream_id) of up to `limit` commit rows at or before `upto` whose version
        bounds do not join their stream's next commit (`last_version + 1` is where it begins).
        Readers pick commits by those bounds (`read_stream(s, from_version)` skipped events past a
        lowered `last_version`), and no digest covers them: only tampering breaks them."""
        upto = _checked_count("upto", upto)
        with self.engine.connect() as conn:
            return [tuple(r) for r in conn.execute(sa.text(
                "SELECT position, stream_id FROM (SELECT position, stream_id, first_version, "
                "last_version, lead(first_version) OVER (PARTITION BY stream_id ORDER BY "
                "first_version) AS next_first FROM commits WHERE position <= :upto) c "
                "WHERE last_version < first_version OR next_first <> last_version + 1 "
                "ORDER BY position LIMIT :n"), {"upto": upto, "n": limit})]

    def takes_writes(self) -> bool:
        """Whether the database would take a write: not a SQLite file opened `mode=ro` or
        `immutable=1`, nor a PostgreSQL session that is read-only (a hot standby, or
        `default_transaction_read_only`) or whose role may not add to the log (`SELECT` grants
        only). Readers that would first bring the read models up to date list what they hold
        instead."""
        if self.engine.dialect.name != "postgresql":
            return not sqlite_read_only(self.engine.url) and self.file_writable()
        with self.engine.connect() as conn:
            return bool(conn.execute(sa.text(
                "SELECT current_setting('transaction_read_only') = 'off' "
                "AND has_table_privilege('commits', 'INSERT')")).scalar())

    def file_writable(self) -> bool:
        """Whether this process may write a SQLite store's file (not on a read-only file system, nor
        another user's file without write permission); True for any other store. SQLite opens
        such a file read-only by itself, and the first write failed with "attempt to write a
        readonly database"."""
        path = sqlite_file(self.engine.url)
        return path is None or os.access(path, os.W_OK)

    def readable_position(self) -> int:
        """The last position a reader of the global order may read now. On PostgreSQL a commit
        still running can yet land below `last_position()`, so what lies past the transaction-id
        high-water mark is not final: readers and checks that must agree stop here."""
        return self._max_position(self._backend.visible)

    def count_events(self, after_position: int = 0, upto: int | None = None) -> int:
        """How many events lie after a position, and at or before `upto` if given (the total of
        a progress bar)."""
        after_position = _checked_count("after_position", after_position)
        upto = None if upto is None else _checked_count("upto", upto)
        bound = "" if upto is None else " AND position <= :upto"
        with self.engine.connect() as conn:
            return conn.execute(sa.text(
                "SELECT coalesce(sum(last_version - first_version + 1), 0) FROM commits "
                f"WHERE position > :p{bound}"), {"p": after_position, "upto": upto}).scalar() or 0


def _as_retry(stream_id: str, stored: list[RecordedEvent], supplied_ids: list[str],
              count: int, expected_version: int | None) -> list[RecordedEvent] | None:
    """The stored records, in append order, when this append repeats one that already committed:
    the same ids in the same order, stored where this append expected to write them. Ids in
    another order, or a part of the first append, were answered as a retry with whichever event
    came last (`append_head` said version 0 of a stream at 1)."""
    if len(supplied_ids) != count or len(stored) != count:
        return None
    if any(r.stream_id != stream_id for r in stored):
        return None
    by_id = {r.event_id: r for r in stored}
    ordered = [by_id[event_id] for event_id in supplied_ids]
    first = 0 if expected_version is None else expected_version + 1
    if [r.version for r in ordered] != list(range(first, first + count)):
        return None
    return ordered


def _check_a_sqlite_file_before_connecting(url: str, create: bool) -> None:
    """A SQLite file is judged by `migrate.check_tables` through a read-only connection before the
    engine touches it: its first connection would create the file, or turn it to WAL mode
    (another application's file was changed even as it was refused). A file that does not exist is
    refused when `create` is False. Other databases are judged by the migration step."""
    import os
    import sqlite3
    from contextlib import closing
    from pathlib import Path

    try:
        path = sqlite_file(normalise_url(url))
    except Exception:  # not a URL at all: creating the engine says so
        return
    if path is None or "\x00" in path:  # a file no system can name: creating the engine says so
        return
    if not os.path.exists(path):
        if not create:
            raise StoreUnavailable(f"there is no store at {path} ({url}); `companyos run` or "
                                   "`companyos db upgrade` creates one")
        return
    try:
        immutable = "&immutable=1" if sqlite_immutable(url) else ""  # read-only media: no -shm
        with closing(sqlite3.connect(f"{Path(path).resolve().as_uri()}?mode=ro{immutable}", uri=True)) as con:
            tables = {name for (name,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            row = con.execute("SELECT version_num FROM alembic_version").fetchone() \
                if "alembic_version" in tables else None
    except sqlite3.Error:
        return  # not a database, or unreadable: opening the store says what is wrong
    migrate.check_tables(tables, row[0] if row else None, create)


def _no_store_at(url: str, exc: migrate.NoStore | migrate.ForeignTables) -> StoreUnavailable:
    """The refusal of a database that holds no store, said with what to do: `run` and `db
    upgrade` make one only where no other application's tables are (readers were sent to them,
    which then refused), and never in memory (they refuse it)."""
    shown = shown_url(url)
    if isinstance(exc, migrate.ForeignTables):
        return StoreUnavailable(
            f"the database at {shown} is not a store: {exc}; use a database of its own or, on "
            "PostgreSQL, a schema of its own (CREATE SCHEMA companyos, then add "
            "?options=-csearch_path%3Dcompanyos to the URL)")
    tables = exc.args[0]
    if not tables and in_memory_sqlite(url):
        return StoreUnavailable(f"there is no store at {shown}: it is an in-memory SQLite "
                                "database, empty when a process opens it; name the store's file, "
                                "e.g. sqlite:///companyos.db")
    if not tables:
        return StoreUnavailable(f"there is no store at {shown}: the database holds none of its "
                                "tables; `companyos run` or `companyos db upgrade` creates one")
    return StoreUnavailable(f"there is no store at {shown}: the database holds none of its tables, "
                            f"only another application's ({migrate.named(tables)}); a store needs a "
                            "database of its own")


def shown_url(url: str) -> str:
    """The URL for messages and banners (they end up in logs), password masked.

    A URL without a password is shown as the user spelled it: SQLAlchemy's rendering quotes a
    SQLite URI's `file:` as `file%3A`, a URL no one typed.
    """
    try:
        parsed = sa.make_url(url)
    except (sa.exc.ArgumentError, ValueError):  # ValueError: a port that is not a number
        return repr(url)
    if "password" in parsed.query:  # libpq takes ?password= as well as user:password@
        parsed = parsed.update_query_dict({"password": "***"})
    elif parsed.password is None:
        return url
    return parsed.render_as_string(hide_password=True).replace("password=%2A%2A%2A", "password=***")


def _event_list(events: Any) -> Sequence[NewEvent]:
    """The events a writer passed, as a sequence (see `_listed`)."""
    return _listed(events, NewEvent, "events", "NewEvent")


def _listed(items: Any, one: type, name: str, what: str) -> Sequence:
    """What a writer passed as a sequence: a list or tuple as is, any other iterable (a
    generator) listed. A single item, a mapping, text or None is a TypeError saying so: the write
    counts its items first, a generator's first pass used it up, and iterating a lone item (a
    NamedTuple) would give its fields."""
    if type(items) is list or type(items) is tuple:
        return items
    if isinstance(items, one):
        raise TypeError(f"{name} must be a list of {what}, not one {one.__name__}: pass [{name[:-1]}]")
    if isinstance(items, (str, bytes, bytearray, dict)) or not isinstance(items, Iterable):
        raise TypeError(f"{name} must be a list of {what}, not {type(items).__name__}")
    return list(items)


def _check_stream_id(stream_id: Any) -> None:
    """A stream id a writer may use, on every database alike (PostgreSQL's text holds no NUL,
    and UTF-8 no lone surrogate: their drivers failed in their own words)."""
    if not isinstance(stream_id, str) or not stream_id:
        raise ValueError("stream_id must be a non-empty string")
    if len(stream_id) > MAX_STREAM_ID_LENGTH:
        raise ValueError(f"stream_id is longer than {MAX_STREAM_ID_LENGTH} characters")
    if _unholdable(stream_id):
        raise ValueError(f"stream_id {stream_id!r} holds a NUL or a lone surrogate, which no "
                         "database of the store can hold")


def _unstorable(text: str, what: str) -> str | None:
    """Why an event type or id cannot be stored, or None: U+001E, which the commit format keeps
    for itself, or what a database cannot hold (PostgreSQL's text no NUL, UTF-8 no lone surrogate:
    SQLite took them, PostgreSQL failed in its driver's words, and a surrogate failed in a codec's)."""
    if SEPARATOR in text:
        return (f"{what} {text!r} holds U+001E (the record separator), which the store's commit "
                "format keeps for itself")
    if _unholdable(text):
        return f"{what} {text!r} holds a NUL or a lone surrogate, which no database of the store can hold"
    return None


def _unholdable(text: str) -> bool:
    """Text some database of the store cannot hold: a NUL (PostgreSQL's text) or a lone surrogate
    (UTF-8). ASCII text, the usual kind, is answered without encoding it."""
    return "\x00" in text or not (text.isascii() or _utf8(text))


def _utf8(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def _integer(value: Any) -> int | None:
    """`value` as an int when it is a whole number (NumPy's integers too, never a bool), else None.
    Callers test `type(value) is int` first: a plain int, every append's, takes no call."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return int(value)
    return None


def _checked_count(name: str, value: Any) -> int:
    """A position, version or limit given to a reader: a whole number from 0 to 2⁶³ − 1. 1.5 was
    read as it was, -1 as nothing, and 2⁶³ reached the driver's OverflowError."""
    number = value if type(value) is int else _integer(value)
    if number is None:
        raise ValueError(f"{name} must be a whole number, not {type(value).__name__}")
    if not 0 <= number < 2**63:
        raise ValueError(f"{name} must be from 0 to 2**63 - 1, not {number}")
    return number


def _checked_expected_version(expected_version: Any) -> int | None:
    """None or a version (NumPy's integers too); "0" or True used to be compared as they were,
    and a string made a ConcurrencyError that contradicted itself."""
    if expected_version is None:
        return None
    if type(expected_version) is not int:
        if (checked := _integer(expected_version)) is None:
            raise ValueError("expected_version must be an integer version, or None for a new "
                             f"stream; not {type(expected_version).__name__}")
        expected_version = checked
    if expected_version < 0:  # -1 made a new stream, as None does; -5 a self-contradicting conflict
        raise ValueError(f"expected_version must be a version (0 or more), or None for a new "
                         f"stream; not {expected_version}")
    return expected_version


class _Closed:
    """What a closed store holds in place of its engine and backend: any use says so."""

    def __getattr__(self, name: str) -> Any:
        raise StoreClosed("the event store is closed")


_CLOSED: Any = _Closed()


def _encode(events: Sequence[NewEvent]) -> tuple[list, list, list, list, list]:
    """Validate and encode a batch into columns (types, schema versions, data JSON, supplied ids,
    metas) before any write starts, so a bad batch writes nothing.

    The plain case (a NewEvent with neither id nor meta, valid at a glance, data that encodes
    and round-trips) takes a few inline checks; anything else goes through `_prepare`, which
    either accepts it or says in words what is wrong. This loop runs for every stored event, so
    it fills the columns directly.
    """
    types: list[str] = []
    schemas: list[int] = []
    datas: list[str] = []
    ids: list[str | None] = []
    metas: list[dict | None] = []
    for event in events:
        if type(event) is NewEvent:
            type_, data, schema_version, event_id, meta = event
            if (event_id is None and meta is None and type(type_) is str
                    and 0 < len(type_) <= MAX_TYPE_LENGTH and type(data) is dict
                    and type(schema_version) is int and 1 <= schema_version <= MAX_SCHEMA_VERSION):
                try:
                    encoded = canonical_json(data)
                except ValueError:
                    encoded = b""  # not encodable: `_prepare` says why
                if 0 < len(encoded) <= MAX_EVENT_BYTES:
                    types.append(type_)
                    schemas.append(schema_version)
                    datas.append(encoded.decode())
                    ids.append(None)
                    metas.append(None)
                    continue
        type_, schema_version, data_json, event_id, meta = _prepare(event)
        types.append(type_)
        schemas.append(schema_version)
        datas.append(data_json)
        ids.append(event_id)
        metas.append(meta)
    return types, schemas, datas, ids, metas


def _prepare(event: NewEvent) -> tuple[str, int, str, str | None, dict]:
    """Validate and encode one event before any write starts, so a bad batch writes nothing."""
    if not isinstance(event, NewEvent):
        raise ValueError(f"expected NewEvent, got {type(event).__name__}")
    type_, data, sv, event_id, meta = event
    if type(type_) is not str or not 0 < len(type_) <= MAX_TYPE_LENGTH:
        if not isinstance(type_, str) or not type_:
            raise ValueError("event type must be a non-empty string")
        if len(type_) > MAX_TYPE_LENGTH:
            raise ValueError(f"event type is longer than {MAX_TYPE_LENGTH} characters")
        type_ = str.__str__(type_)  # a str subclass (a StrEnum member) is stored as its text
    if type(data) is not dict:
        raise ValueError(f"{type_}: data must be a JSON object (dict), got {type(data).__name__}")
    if type(sv) is not int or not 1 <= sv <= MAX_SCHEMA_VERSION:
        raise ValueError(f"{type_}: schema_version must be a positive integer of at most "
                         f"{MAX_SCHEMA_VERSION} (32 bits)")
    data_json = canonical_json(data)
    if len(data_json) > MAX_EVENT_BYTES:
        raise ValueError(f"{type_}: data is {len(data_json)} bytes, over the {MAX_EVENT_BYTES}-byte limit")
    if event_id is not None and (type(event_id) is not str or not 0 < len(event_id) <= 64):
        raise ValueError(f"{type_}: event_id must be a non-empty string of at most 64 characters")
    if event_id is not None and (problem := _unstorable(event_id, "event_id")):
        raise ValueError(f"{type_}: {problem}")
    if meta is None:
        meta = {}
    elif type(meta) is not dict:
        raise ValueError(f"{type_}: meta must be a dict")
    return type_, sv, data_json.decode(), event_id, meta


def _meta_json(meta: dict, plain: str) -> str:
    return canonical_json({**meta, **decode_json(plain)}).decode()


_SQLITE_ERROR, _SQLITE_CANTOPEN, _SQLITE_NOTADB = 1, 14, 26


_PG_TRANSIENT_CLASSES = frozenset({"08", "40", "53", "55", "57", "58", "XX"})
"""SQLSTATE classes of a server that failed while it opened the store, not of a wrong call:
connection exceptions, a rolled-back transaction (deadlock, serialization), insufficient
resources, an object in use (a lock timeout), operator intervention (a backend terminated, a
statement timeout, a shutdown), system and internal errors."""


def _refused_url(error: BaseException) -> bool:
    """psycopg's ProgrammingError without a SQLSTATE: libpq refused the connection string
    (`invalid connection option "bogus"`) before reaching any server; trying again cannot help."""
    try:
        import psycopg
    except ImportError:
        return False
    return isinstance(error, psycopg.ProgrammingError)


def _read_only_media_hint(error: BaseException, url: str) -> str:
    """What to do when SQLite cannot open a store file in a directory no one may write (a read-only
    mount): it makes the WAL's shared-memory file beside the store, even to read; `immutable=1`
    tells it the file cannot change, so it needs none. '' when that is not the case."""
    import os

    if (getattr(error, "sqlite_errorcode", 0) or 0) & 0xFF != _SQLITE_CANTOPEN or sqlite_immutable(url):
        return ""
    path = sqlite_file(url)
    if path is None or not os.path.isfile(path) or os.access(os.path.dirname(os.path.abspath(path)), os.W_OK):
        return ""
    return (f"; its directory cannot be written (read-only media?), where SQLite makes the WAL's "
            f"shared-memory file even to read: open it as sqlite:///file:{os.path.abspath(path)}"
            "?immutable=1&uri=true")


def _worlds_fault(error: BaseException, url: str) -> bool:
    """Whether a database refusing to open the store is the world's fault (exit 1, worth trying
    again) rather than the call's (exit 2): a PostgreSQL connection that failed (no SQLSTATE:
    psycopg gives none for any of its causes), or a SQLite store that is read-only (its file, or
    a directory where no WAL can be made), locked, damaged, on a full disk, or out of file
    descriptors, as when the refusal comes later in a command; a PostgreSQL server that failed
    with a SQLSTATE of _PG_TRANSIENT_CLASSES while it opened the store. Not a SQLite URL naming a
    file that is no database, a directory, or a folder that does not exist."""
    code = getattr(error, "sqlite_errorcode", None)
    if code is None:
        state = getattr(error, "sqlstate", "")
        if state is None:  # a connection that failed, unless libpq refused the URL itself (an
            return not _refused_url(error)  # option it does not know): the call's to mend
        return str(state)[:2] in _PG_TRANSIENT_CLASSES
    code &= 0xFF  # the primary code, not the extended one
    if code in (_SQLITE_ERROR, _SQLITE_NOTADB):  # a URI SQLite cannot use (no such mode or VFS);
        return False  # a file that is no database (or whose header is damaged: SQLite cannot tell)
    if code == _SQLITE_CANTOPEN:  # SQLite says the same of all these: look at the path
        import os

        path = sqlite_file(url)
        if path is None or os.path.isdir(path):
            return False
        if not os.path.exists(path):  # not made: no folder for it, or a mode that never makes one
            return os.path.isdir(os.path.dirname(os.path.abspath(path))) and \
                sqlite_uri_mode(url) not in ("ro", "rw")  # else a read-only directory: the world's
    return True
