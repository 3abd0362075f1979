"""Readers that page the store's `commits` table into Arrow tables of events, fastest path first.

The store keeps one row per append (see eventstore.packing): the commit's events packed as
columnar JSON. Python objects per event cap a reader at a few hundred thousand events/s on this
class of machine, so every path here moves whole commits and unpacks them in C:

- SQLite: the stdlib cursor, a page's commit rows gathered into Arrow columns a few hundred
  at a time, the payloads the store keeps lz4-compressed decompressed on the way into one buffer
  kept from page to page (`PayloadBuffer`). Never a second
  SQLite library (such as the ADBC driver's): the process also holds the store open through the
  stdlib, and closing another library's handle on the file drops this process's POSIX locks on
  it, so another process closing the store deletes the WAL under a live writer (a server that
  answered one analytics request split and then damaged its store that way).
- PostgreSQL: `COPY (SELECT ...) TO STDOUT (FORMAT csv)` parsed by Arrow's C++ CSV reader,
  behind the transaction-id high-water mark (PG_VISIBLE) the store's own reader uses.
- Any other engine: the store's `read_all` (correct everywhere, slow; the reference reader).

Commit rows become event rows in a private in-memory DuckDB (`Unpacker`): `json_transform` parses
each payload once and `unnest` of its lists zips them into rows, several million events/s per
core. DuckDB's own SQLite scanner would read the store directly, but it is a download-at-run-time
extension and this product must work offline, so it is not used.

Every reader returns events with `after < position <= upto` in position order, whole commits of
about `limit` events (more when a single commit is bigger), with the schema `EVENT_SCHEMA`. Data
is read raw: upcasting happens in the sync, on Arrow. The sync reads up to the store's
`readable_position()` as it was when the sync began (`upto`), so a writer that never stops cannot
keep it going.
"""

from __future__ import annotations

import io
import sqlite3
from typing import Protocol

import duckdb
import lz4.block
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import sqlalchemy as sa

from analytics.stores import POSTGRES_READER, SQLITE_READER, STORE_READER, reader_for
from eventstore.backends import PG_VISIBLE
from eventstore.engine import create_engine, normalise_url, sqlite_file, sqlite_immutable
from eventstore.packing import (
    CorruptCommit,
    NotUtf8,
    not_utf8_error,
    payload_columns,
    payload_text,
    text_or_escapes,
    unpack,
)
from eventstore.records import MAX_SCHEMA_VERSION

COMMIT_COLUMNS = ("position", "stream_id", "first_version", "last_digest", "payload")
COMMIT_SCHEMA = pa.schema([
    ("position", pa.int64()), ("stream_id", pa.string()), ("first_version", pa.int32()),
    ("last_digest", pa.string()), ("payload", pa.string()),
])
EVENT_SCHEMA = pa.schema([
    ("position", pa.int64()), ("stream_id", pa.string()), ("version", pa.int32()),
    ("type", pa.string()), ("schema_version", pa.int32()), ("data", pa.string()),
    ("meta", pa.string()), ("digest", pa.string()),
])
"""An event row. `digest` (the stream's digest after the event) may be NULL except on the last
event of each commit: the warehouse only needs each stream's head digest, and commits store it."""
_SELECT = ", ".join(COMMIT_COLUMNS)

# The payload lists the warehouse needs (not the event ids and per-event digests): parsing fewer
# keys into fewer lists is most of what unpacking a JSON payload costs.
_PAYLOAD_TYPE = ('{"type": "VARCHAR[]", "schema": "DOUBLE[]", "data": "VARCHAR[]", '
                 '"meta": "VARCHAR", "event_meta": "VARCHAR[]"}')
# A schema version is a positive 32-bit integer; anything else becomes NULL, which `_whole` sees
# (a cast alone took -1 and 0, and rounded 1.5 to 2). Nearly every event's is "1": tested first.
_JSON_SCHEMA_VERSION = f"CASE WHEN s = round(s) AND s BETWEEN 1 AND {MAX_SCHEMA_VERSION} THEN s::INTEGER END"
_TEXT_SCHEMA_VERSION = ("CASE WHEN {s} = '1' THEN 1 WHEN regexp_full_match({s}, '[1-9][0-9]{{0,9}}') "
                        "THEN TRY_CAST({s} AS INTEGER) END")
# Several unnests in one SELECT are zipped by DuckDB (a shorter or NULL list is padded with NULL,
# which is what a commit without per-event meta needs); `i` numbers the events of a commit 1..n.
_UNPACK_JSON = f"""
SELECT position, stream_id, version, type, schema_version, data, meta,
       CASE WHEN i = n THEN last_digest END AS digest
FROM (
    SELECT (position - n + i)::BIGINT AS position, stream_id, (first_version - 1 + i)::INTEGER AS version,
           type, {_JSON_SCHEMA_VERSION} AS schema_version, data, coalesce(event_meta, meta) AS meta,
           last_digest, i, n
    FROM (
        SELECT position, stream_id, first_version, last_digest, len(p.type) AS n, p.meta,
               unnest(range(1, len(p.type) + 1)) AS i, unnest(p.type) AS type,
               unnest(p.schema) AS s, unnest(p.data) AS data,
               unnest(p.event_meta) AS event_meta
        FROM (SELECT position, stream_id, first_version, last_digest,
                     json_transform(payload, '{_PAYLOAD_TYPE}') AS p FROM {{commits}})
    )
)
WHERE position > $after
"""
# The separated format (eventstore.packing.pack): one split per commit, then each event's fields
# picked by index, which costs DuckDB about half what json_transform and unnest do. A count that
# disagrees with the number of fields makes n NULL: the commit yields no rows, which `_whole` sees.
_UNPACK_SEPARATED = f"""
SELECT position, stream_id, version, type, schema_version, data, meta,
       CASE WHEN i = n THEN last_digest END AS digest
FROM (
    SELECT (position - n + i)::BIGINT AS position, stream_id, (first_version - 1 + i)::INTEGER AS version,
           f[1 + i] AS type, {_TEXT_SCHEMA_VERSION.format(s="f[1 + n + i]")} AS schema_version,
           f[1 + 2 * n + i] AS data,
           CASE WHEN own_meta THEN coalesce(nullif(f[2 + 5 * n + i], ''), f[2 + 3 * n])
                ELSE f[2 + 3 * n] END AS meta,
           last_digest, i, n
    FROM (
        SELECT position, stream_id, first_version, last_digest, f, n, own_meta,
               unnest(range(1, n + 1)) AS i
        FROM (
            SELECT position, stream_id, first_version, last_digest, f,
                   CASE WHEN len(f) = 2 + 5 * k OR len(f) = 2 + 6 * k THEN k END AS n,
                   len(f) = 2 + 6 * k AS own_meta
            FROM (SELECT position, stream_id, first_version, last_digest, f,
                         TRY_CAST(f[1] AS INTEGER) AS k
                  FROM (SELECT position, stream_id, first_version, last_digest,
                               string_split(payload, chr(30)) AS f FROM {{commits}}))
        )
    )
)
WHERE position > $after
"""
_UNPACK = {"json": _UNPACK_JSON, "separated": _UNPACK_SEPARATED}


class Source(Protocol):
    """A paged reader of the store's events as Arrow."""

    name: str

    def read(self, after: int, limit: int, upto: int) -> pa.Table: ...

    def remaining(self, after: int, head: int) -> int | None:
        """How many events lie in (after, head], when that is cheap to know (else None)."""
        ...

    def close(self) -> None: ...


def _conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """Cast a reader's table to `schema` (drivers infer int64 and large strings freely)."""
    table = table.rename_columns(schema.names)
    if table.schema.equals(schema):
        return table
    return table.cast(schema)


def _read_only_uri(path: str, immutable: bool = False) -> str:
    """A SQLite URI opening `path` read-only (quoted: a path may hold '?', '#' or spaces), and
    `immutable` when the store's URL says so: on read-only media SQLite cannot make the WAL's
    shared-memory file that `mode=ro` needs, and every analytics command failed there."""
    from pathlib import Path
    from urllib.parse import quote

    return f"file:{quote(str(Path(path).resolve()))}?mode=ro" + ("&immutable=1" if immutable else "")


def _empty() -> pa.Table:
    return EVENT_SCHEMA.empty_table()


def _damaged(commits: pa.Table) -> None:
    """Raise CorruptCommit for the first commit row whose payload does not unpack into whole events.

    DuckDB says only that some payload in the batch is malformed, or turns a value of the wrong
    type into NULL; the store's own unpacking names the stream and position, as `companyos
    verify` does, and `_shape_problem` checks the values the warehouse reads. Runs only after a
    failure, so it may be slow.
    """
    columns = [commits[name].to_pylist() for name in ("position", "stream_id", "first_version", "payload")]
    for row in zip(*columns, strict=True):
        unpack(row)
        problem = _shape_problem(payload_columns(row[3]))  # text: the reader decompressed it
        if problem:
            raise CorruptCommit(row[1], row[0], problem)


def _shape_problem(payload: dict) -> str | None:
    """What is wrong with the values of a payload `unpack` accepted (keys and lengths are right)."""
    if not payload["type"]:
        return "it holds no events"
    expected = (("type", _text, "text"), ("data", _text, "JSON text"),
                ("schema", _schema_version, "a schema version (a positive 32-bit integer)"))
    for key, fits, words in expected:
        wrong = next((v for v in payload[key] if not fits(v)), _NOTHING)
        if wrong is not _NOTHING:
            return f"its {key!r} list holds {_shown(wrong)} where {words} belongs"
    if not isinstance(payload["meta"], str):
        return "its 'meta' is not JSON text"
    if any(m is not None and not isinstance(m, str) for m in payload.get("event_meta") or ()):
        return "its 'event_meta' list holds a value that is not JSON text"
    return None


_NOTHING = object()


def _shown(value: object) -> str:
    """A damaged value as JSON, cut short (an integer past 64 bits, which orjson refuses, as digits)."""
    try:
        text = orjson.dumps(value).decode()
    except TypeError:
        text = repr(value)
    return text if len(text) <= 60 else f"{text[:60]}…"


def _text(value: object) -> bool:
    return type(value) is str


def _schema_version(value: object) -> bool:
    return type(value) is int and 1 <= value <= MAX_SCHEMA_VERSION  # as the store takes it


def _whole(events: pa.Table, commits: pa.Table, after: int) -> bool:
    """Every commit after `after` unpacked into events with every value the warehouse needs.

    DuckDB's json_transform makes a value of the wrong type NULL, and a payload that is not an
    object of lists yields no rows at all; both checks read only counts Arrow keeps.
    """
    if any(events[name].null_count for name in ("type", "schema_version", "data", "meta")):
        return False
    ends = events.num_rows - events["digest"].null_count  # one per commit: its last event
    return ends == pc.sum(pc.greater(commits["position"], after)).as_py()


class Unpacker:
    """Commit rows to event rows in a private in-memory DuckDB, one thread (the sync's reader
    thread owns it; the warehouse's connection works on the previous batch meanwhile)."""

    def __init__(self) -> None:
        self._con = duckdb.connect(config={"threads": "1"})

    def events(self, commits: pa.Table, after: int) -> pa.Table:
        """The events of `commits` (in position order) with `position > after`, in position order."""
        if commits.num_rows == 0:
            return _empty()
        commits = _conform(commits, COMMIT_SCHEMA)
        as_json = pc.starts_with(commits["payload"], "{")  # the format before revision 0005
        json_commits = pc.sum(as_json).as_py() or 0
        if json_commits == 0:  # every commit since revision 0005
            parts = {"separated": commits}
        elif json_commits == commits.num_rows:  # a store older code wrote
            parts = {"json": commits}
        else:  # where a migrated store's new commits begin
            parts = {"json": commits.filter(as_json), "separated": commits.filter(pc.invert(as_json))}
        sql = " UNION ALL ".join(_UNPACK[name].replace("{commits}", name) for name in parts)
        for name, table in parts.items():
            self._con.register(name, table)
        try:
            table = self._con.sql(sql + (" ORDER BY position" if len(parts) > 1 else ""),
                                  params={"after": after}).to_arrow_table()
        except duckdb.Error:
            _damaged(commits)  # names the damaged commit when the store agrees it is damaged
            raise
        finally:
            for name in parts:
                self._con.unregister(name)
        if not _whole(table, commits, after):
            _damaged(commits)
            raise ValueError(f"the commits at positions {commits['position'][0]}.."
                             f"{commits['position'][-1]} unpack into incomplete events")
        return _conform(table, EVENT_SCHEMA) if table.num_rows else _empty()

    def close(self) -> None:
        self._con.close()


_RANGE_SQL = f"SELECT {_SELECT} FROM commits WHERE position > ? AND position <= ? ORDER BY position"
_NEXT_SQL = "SELECT min(position) FROM commits WHERE position > ?"


def _mistyped(keys: tuple[list, ...]) -> CorruptCommit:
    """The first commit row whose column holds a value of another type (SQLite keeps whatever a
    hand-made UPDATE writes: `first_version = 'x'`), named as a damaged commit, as `unpack` names
    one (it was Arrow's traceback)."""
    for row in zip(*keys, strict=True):
        for value, field in zip(row, COMMIT_SCHEMA, strict=False):
            try:
                pa.array([value], type=field.type)
            except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
                return CorruptCommit(str(row[1]), row[0] if type(row[0]) is int else -1,
                                     f"its {field.name} {value!r} is no {field.type}")
    return CorruptCommit("?", -1, "a commit row's columns do not have their types")


class SqliteSource:
    """SQLite through the stdlib: commit rows gathered into columns, then one Arrow array each
    (a row per commit, not per event, so the Python cost is small). Positions are dense there, so
    the commits ending in (after, after + limit] hold at most `limit` events and a page is one
    range scan of the key."""

    name = SQLITE_READER

    def __init__(self, path: str, immutable: bool = False) -> None:
        self._con = sqlite3.connect(_read_only_uri(path, immutable), uri=True, check_same_thread=False)
        self._con.execute("PRAGMA busy_timeout=60000")
        self._unpacker = Unpacker()
        self._payloads = PayloadBuffer()

    def read(self, after: int, limit: int, upto: int) -> pa.Table:
        return self._unpacker.events(self.page(after, limit, upto), after)

    def page(self, after: int, limit: int, upto: int) -> pa.Table:
        table = self.fetch_range(after, min(after + limit, upto))
        if table.num_rows:
            return table
        # a gap, or one commit bigger than a page: take up to the next commit, whatever its size
        following = self._con.execute(_NEXT_SQL, (after,)).fetchone()[0]
        return table if following is None or following > upto else self.fetch_range(after, following)

    def remaining(self, after: int, head: int) -> int:
        """Positions are dense on SQLite: the count is a subtraction."""
        return max(head - after, 0)

    def fetch_range(self, after: int, upto: int) -> pa.Table:
        try:
            return self._fetch_range(after, upto)
        except sqlite3.OperationalError as exc:
            if not not_utf8_error(exc):
                raise
        raise self._not_utf8(after, upto)

    def _not_utf8(self, after: int, upto: int) -> CorruptCommit:
        """The first commit in (after, upto] holding text that is not UTF-8, named as a damaged
        commit (the driver's decoding error named no episode)."""
        self._con.text_factory = text_or_escapes
        try:
            for row in self._con.execute(_RANGE_SQL, (after, upto)):
                if any(type(value) is NotUtf8 for value in row):
                    return CorruptCommit(row[1], row[0], "its payload or stream id is not UTF-8 text")
        except sqlite3.OperationalError as exc:  # a position that is no number, say
            return CorruptCommit("?", after, f"a commit after position {after} is damaged: {exc}")
        finally:
            self._con.text_factory = str
        return CorruptCommit("?", after, "a commit's text is not UTF-8")

    def _fetch_range(self, after: int, upto: int) -> pa.Table:
        cursor = self._con.execute(_RANGE_SQL, (after, upto))
        keys: tuple[list, ...] = ([], [], [], [])
        payloads = self._payloads.start()
        # a few hundred rows at a time, each payload decompressed into the page's buffer at once:
        # their blobs are then freed and their memory reused by the next rows', where fetching the
        # whole page first held ~50 MB of blobs that the C library handed back to the kernel after
        # each page and faulted in again for the next
        while rows := cursor.fetchmany(_FETCH_ROWS):
            for row in rows:
                for column, value in zip(keys, row):  # noqa: B905 (the row has one more: its payload)
                    column.append(value)
                payloads.add(row[0], row[1], row[-1])
        if not keys[0]:
            return COMMIT_SCHEMA.empty_table()
        try:
            arrays = [pa.array(c, type=f.type) for c, f in zip(keys, list(COMMIT_SCHEMA)[:-1], strict=True)]
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
            raise _mistyped(keys) from None
        return pa.Table.from_arrays([*arrays, payloads.finish()], schema=COMMIT_SCHEMA)

    def close(self) -> None:
        self._unpacker.close()
        self._con.close()


_FETCH_ROWS = 256


class PayloadBuffer:
    """A page's payloads' JSON as one Arrow string array for DuckDB to unpack, decompressed into a
    buffer kept from page to page (SQLite keeps them lz4-compressed). A payload whose compression
    is damaged, or whose JSON is not UTF-8, is refused, naming its commit, as `unpack` would.

    Why one buffer, reused: joining a page's decompressed payloads into a fresh buffer (~120 MB a
    500,000-event page) made the kernel fault in and zero every page of it each time, which cost
    more CPU than decompressing them. The buffer is written again only once nothing holds an array
    made on it (an Arrow buffer keeps the bytearray exported, which `_free` detects), so a caller
    keeping an old page keeps its bytes.
    """

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._view = memoryview(self._buffer)
        self._chunks: list[pa.Array] = []
        self._commits: list[tuple[int, str]] = []  # the chunk's positions and streams, to name one
        self._ends = [0]

    def start(self) -> PayloadBuffer:
        """Begin a page: the arrays of earlier pages stay as they are."""
        self._view.release()
        self._buffer = self._free()
        self._view = memoryview(self._buffer)
        self._chunks, self._commits, self._ends = [], [], [0]
        return self

    def add(self, position: int, stream_id: str, payload: str | bytes) -> None:
        """Append one commit's payload, as stored."""
        text = _utf8(_decompressed(position, stream_id, payload))
        start = self._ends[-1]
        end = start + len(text)
        if end >= _CHUNK_LIMIT:  # past what 32-bit offsets reach: a new chunk from here
            self._seal()
            self._buffer = bytearray(max(len(text), _CHUNK_MIN))
            self._view = memoryview(self._buffer)
            start, end = 0, len(text)
        if end > len(self._buffer):
            self._grow(end)
        self._view[start:end] = text
        self._ends.append(end)
        self._commits.append((position, stream_id))

    def finish(self) -> pa.Array | pa.ChunkedArray:
        """The page's payloads, one string each, in the order added."""
        self._seal()
        chunks, self._chunks = self._chunks, []
        return chunks[0] if len(chunks) == 1 else pa.chunked_array(chunks, type=pa.string())

    def _seal(self) -> None:
        """Close the chunk being written as an array (checked as UTF-8) on the buffer."""
        ends, end = self._ends, self._ends[-1]
        array = pa.StringArray.from_buffers(len(ends) - 1, pa.array(ends, pa.int32()).buffers()[1],
                                            pa.py_buffer(self._view[:end]))
        try:
            array.validate(full=True)
        except pa.ArrowInvalid:
            for (position, stream_id), start, stop in zip(self._commits, ends, ends[1:]):  # noqa: B905
                try:
                    str(self._view[start:stop], "utf-8")
                except UnicodeDecodeError as exc:
                    raise CorruptCommit(stream_id, position, f"its payload is not UTF-8 ({exc.reason} "
                                        f"at byte {exc.start})") from None
            raise
        self._chunks.append(array)
        self._commits, self._ends = [], [0]

    def _grow(self, size: int) -> None:
        """A bigger buffer holding what the chunk has so far (pages are alike: rare after the first)."""
        bigger = bytearray(max(size, 2 * len(self._buffer), _CHUNK_MIN))
        end = self._ends[-1]
        bigger[:end] = self._view[:end]
        self._view.release()
        self._buffer = bigger
        self._view = memoryview(bigger)

    def _free(self) -> bytearray:
        """The buffer, if no array made on it is still alive; else a new one."""
        try:  # resizing an exported bytearray raises: an array on it is still alive
            self._buffer.append(0)
            self._buffer.pop()
        except BufferError:
            return bytearray(len(self._buffer))
        return self._buffer


_CHUNK_MIN = 1 << 20
_CHUNK_LIMIT = 2**31  # an Arrow string array's 32-bit offsets end here


def _utf8(text: str | bytes) -> bytes:
    return text if type(text) is bytes else text.encode()


def _decompressed(position: int, stream_id: str, payload: str | bytes) -> str | bytes:
    """A stored payload's JSON; CorruptCommit, naming it, if its compression is damaged."""
    try:
        return payload_text(payload)
    except lz4.block.LZ4BlockError as exc:
        raise CorruptCommit(stream_id, position, f"LZ4BlockError: {exc}") from None


class PostgresSource:
    """PostgreSQL through COPY ... TO STDOUT as CSV, parsed by Arrow; never skips a late commit.

    Positions have gaps there (`xid << 20 | index`), so a page is sized by walking the commits'
    event counts on a server-side cursor first, then copied as one position range.
    """

    name = POSTGRES_READER

    # Positions below the oldest running transaction's xid are final: the store's own reader rule.
    # A range ending at a position that was visible stays complete: later commits sort after it.
    _SIZES = (f"SELECT position, last_version - first_version + 1 FROM commits "
              f"WHERE position > %s AND position <= %s AND {PG_VISIBLE} ORDER BY position")
    _COPY = (f"COPY (SELECT {_SELECT} FROM commits WHERE position > {{after}} "
             f"AND position <= {{upto}} AND {PG_VISIBLE} ORDER BY position) TO STDOUT (FORMAT csv)")

    def __init__(self, engine: sa.Engine) -> None:
        self._engine = engine
        self._unpacker = Unpacker()

    def read(self, after: int, limit: int, upto: int) -> pa.Table:
        raw = self._engine.raw_connection()
        try:
            conn = raw.driver_connection
            upto = self._page_end(conn, after, limit, upto)
            buffer = io.BytesIO()
            if upto is not None:
                sql = self._COPY.format(after=int(after), upto=int(upto))
                with conn.cursor() as cur, cur.copy(sql) as copy:
                    for chunk in copy:
                        buffer.write(chunk)
            conn.rollback()
        finally:
            raw.close()
        return self._unpacker.events(self._parse(buffer), after)

    def _page_end(self, conn, after: int, limit: int, head: int) -> int | None:
        """The last position (<= head) of a page of about `limit` events (at least one commit),
        or None."""
        upto, total = None, 0
        with conn.cursor(name="analytics_page_sizes") as cur:
            cur.itersize = 2000
            cur.execute(self._SIZES, (int(after), int(head)))
            for position, count in cur:
                if upto is not None and total + count > limit:
                    break
                upto, total = position, total + count
        return upto

    @staticmethod
    def _parse(buffer: io.BytesIO) -> pa.Table:
        if not buffer.tell():
            return COMMIT_SCHEMA.empty_table()
        buffer.seek(0)
        return pacsv.read_csv(
            buffer,
            read_options=pacsv.ReadOptions(column_names=list(COMMIT_COLUMNS), block_size=64 << 20),
            parse_options=pacsv.ParseOptions(newlines_in_values=True),
            convert_options=pacsv.ConvertOptions(
                column_types=COMMIT_SCHEMA, strings_can_be_null=False,
                quoted_strings_can_be_null=False))

    def remaining(self, after: int, head: int) -> None:
        """Positions have gaps on PostgreSQL: unknown without counting."""
        return None

    def close(self) -> None:
        """The engine belongs to the caller; the unpacker is ours."""
        self._unpacker.close()


class StoreSource:
    """Any engine through `EventStore.read_all`: one Python object per event, so the slow path."""

    name = STORE_READER

    def __init__(self, store) -> None:
        self._store = store

    def read(self, after: int, limit: int, upto: int) -> pa.Table:
        rows = [r for r in self._store.read_all(after, limit) if r.position <= upto]
        if not rows:
            return _empty()
        # a page may end inside a commit: the checkpoint is a position, so the next page (by this
        # reader or a commit reader, which filters `position > after`) starts after it all the same
        columns = list(zip(*rows, strict=True))
        del columns[3]  # event_id
        return pa.Table.from_arrays(
            [pa.array(c, type=f.type) for c, f in zip(columns, EVENT_SCHEMA, strict=True)],
            schema=EVENT_SCHEMA)

    def remaining(self, after: int, head: int) -> None:
        return None

    def close(self) -> None:
        """The store belongs to the caller."""


def open_source(url: str, engine: sa.Engine | None = None, prefer: str | None = None) -> Source:
    """The fastest reader for the store at `url` (`prefer="store"` forces the reference reader)."""
    reader = reader_for(url, prefer)
    if reader == SQLITE_READER:
        return SqliteSource(sqlite_file(normalise_url(url)), immutable=sqlite_immutable(url))
    if reader == POSTGRES_READER:
        return PostgresSource(engine if engine is not None else create_engine(url))  # the store's settings
    from eventstore import EventStore

    return StoreSource(EventStore(engine) if engine is not None else EventStore.open(url))
