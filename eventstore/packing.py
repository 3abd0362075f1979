"""One stored row per append: the events of a commit packed as columns of text.

A row per event made SQLite pay a B-tree insert, two index entries and a repeated stream id and
meta for every event; bulk reads paid a row fetch per event. A commit row is written once and
decoded by one split, so appends, `read_all` and the analytics sync move whole commits.

Row: `position` is the position of the commit's *last* event (its events hold the positions
`position - count + 1 … position`), `first_version`/`last_version` bound its versions,
`last_digest` is the stream's digest after it (the head lookup reads only these), and `payload`
the commit's columns (see `pack`). Bulk reads select only READ_COLUMNS: every column fetched costs
as much as decoding a commit's events.

Payload formats. From revision 0005 a payload is its fields joined by ASCII's record separator
(`SEPARATOR`): DuckDB splits that for about two thirds of what parsing the JSON cost it (the
analytics sync's unpack stage), packing and compressing a commit take ~15% fewer instructions,
and the events' JSON is no longer escaped inside another JSON text (payloads 14% smaller).
Before, it was a JSON object of lists (`{...`); every reader takes both, so a store keeps the
commits older code wrote.

SQLite keeps a payload over 2 KB lz4-compressed (a BLOB, `compress`): an expert episode's 15 KB commit
shrinks to ~7 KB, two pages fewer to write into the WAL and copy back at each checkpoint, which
made `companyos run` 8% faster at 500,000 episodes and the store half the size. PostgreSQL keeps
it as text (its TOAST compresses already), and so did SQLite stores before revision 0004; every
reader takes both forms (`payload_text`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from itertools import repeat
from typing import NamedTuple

import lz4.block
import orjson

from eventstore.records import CorruptCommit, RecordedEvent

COMMIT_COLUMNS = "position, stream_id, first_version, last_version, last_digest, payload"
READ_COLUMNS = "position, stream_id, first_version, payload"

SEPARATOR = "\x1e"
"""Between a payload's fields. Canonical JSON never holds a raw control character, digests are
hex, and the store refuses it in event types and event ids, so a split on it is exact."""
_JSON_PAYLOAD = "{"
"""How a payload written before revision 0005 begins: {"id": [...], "type": [...], "schema": [...],
"data": [<JSON text>...], "digest": [...], "meta": <JSON text>, "event_meta": [<JSON text> or null
...] (only when some event carries its own meta)}."""

_new = tuple.__new__
_loads = orjson.loads
_compress = lz4.block.compress
_decompress = lz4.block.decompress
PayloadEncoder = Callable[[str], str | bytes]
"""How a backend stores a payload (`pack`'s text): `compress` for SQLite, text for PostgreSQL."""


COMPRESS_ABOVE = 2048
"""Payloads up to this many bytes stay text on SQLite: a small commit (a 4-event step's is under
1 KB) shares a leaf page either way, so compressing it would only cost its readers."""


def compress(payload: str) -> str | bytes:
    """A payload as SQLite stores it: lz4 (block format, its size in front) when it is big."""
    encoded = payload.encode()
    return _compress(encoded) if len(encoded) > COMPRESS_ABOVE else payload


def as_text(payload: str) -> str:
    """A payload as PostgreSQL stores it: text (TOAST compresses large values itself)."""
    return payload


LZ4_MAX_RATIO = 255
"""No lz4 block decompresses to more than ~255 times its size: a header claiming more is damage."""


def payload_text(stored: str | bytes) -> str | bytes:
    """The text of a stored payload, in either format (see `pack`): UTF-8 bytes when it was stored
    compressed, else as stored. lz4.block.LZ4BlockError when compressed bytes are damaged, a
    header claiming an impossible size included (lz4 would first allocate whatever it claims).
    The bulk read (`unpack`) inlines the decompression."""
    if type(stored) is not bytes:
        return stored
    claimed = int.from_bytes(stored[:4], "little")
    if claimed > LZ4_MAX_RATIO * len(stored):
        raise lz4.block.LZ4BlockError(f"its header claims {claimed} bytes from {len(stored)}")
    return _decompress(stored)


class Commit(NamedTuple):
    """One append, ready to insert; the backend assigns its position."""

    stream_id: str
    first_version: int
    last_version: int
    last_digest: str
    payload: str | bytes  # as stored: see PayloadEncoder
    supplied_ids: list[tuple[str, str, int]]  # (event_id, stream_id, version)
    columns: tuple[list, ...]  # ids, types, schemas, datas, digests
    meta: str
    event_metas: list[str | None] | None  # None when no event carries its own meta

    @property
    def count(self) -> int:
        return self.last_version - self.first_version + 1

    def records(self, position: int) -> list[RecordedEvent]:
        """The recorded events once the commit's last position is known (no JSON decoding)."""
        return _records(position - self.count + 1, self.stream_id, self.first_version,
                        self.columns, self.meta, self.event_metas)


def make_commit(stream_id: str, first_version: int, ids: list[str], types: list[str],
                schemas: list[int], datas: list[str], digests: list[str], meta: str,
                event_metas: list[str | None] | None, supplied_ids: list[tuple[str, str, int]],
                encode: PayloadEncoder) -> Commit:
    """One append's commit, its columns packed once and stored as `encode` says."""
    return Commit(stream_id, first_version, first_version + len(ids) - 1, digests[-1],
                  encode(pack(ids, types, schemas, datas, digests, meta, event_metas)), supplied_ids,
                  (ids, types, schemas, datas, digests), meta, event_metas)


def pack(ids: list[str], types: list[str], schemas: list[int], datas: list[str],
         digests: list[str], meta: str, event_metas: list[str | None] | None = None) -> str:
    """The payload of one commit: its fields joined by SEPARATOR, in this order:

    the event count n; n types; n schema versions (decimal); n data (canonical JSON text, so
    digests re-check); the commit's meta (JSON text); n event ids; n digests; and, only when
    some event carries its own meta, n event metas ("" for an event that has none).

    What the warehouse reads comes first. The caller has made sure no type or id holds SEPARATOR.
    """
    n = len(ids)
    # nearly every event is at schema version 1: `str` of each int cost more than orjson's whole dump
    versions = repeat("1", n) if schemas.count(1) == n else map(str, schemas)
    fields = [str(n), *types, *versions, *datas, meta, *ids, *digests]
    if event_metas is not None:
        fields += [m or "" for m in event_metas]
    return SEPARATOR.join(fields)


def payload_columns(text: str | bytes) -> dict:
    """A payload's text (either format) as the JSON format's object of lists: for the slow paths
    that name damage or edit a payload by hand, not for bulk reads (`unpack`)."""
    if isinstance(text, bytes):
        text = text.decode()
    if text.startswith(_JSON_PAYLOAD):
        return _loads(text)
    (ids, types, schemas, datas, digests), meta, event_metas = _separated_columns(text)
    columns = {"id": ids, "type": types, "schema": schemas, "data": datas, "digest": digests,
               "meta": meta}
    if event_metas is not None:
        columns["event_meta"] = event_metas
    return columns


_SMALL_COMMIT = 64
"""Up to this many events a commit's records come as a list (cheapest per commit); bigger ones
as a lazy iterator, so a bulk read never holds thousands of fresh tuples that wake the cyclic GC."""


def _records(first: int, stream_id: str, first_version: int, columns: tuple[list, ...],
             meta: str, event_metas: list | None) -> list[RecordedEvent]:
    """The RecordedEvents of one commit from its columns (ids, types, schemas, datas, digests),
    the first event's position and version.

    Built by map/zip/repeat, which loop in C: no bytecode runs per event. The columns must be of
    equal length (the callers check): a keyword `strict=` sends every zip down CPython's slow
    keyword-call path, a quarter of the cost of a step-sized commit.
    """
    ids, types, schemas, datas, digests = columns
    n = len(ids)
    metas = repeat(meta, n) if event_metas is None else [m or meta for m in event_metas]
    return list(map(_new, repeat(RecordedEvent, n),
                    zip(range(first, first + n), repeat(stream_id, n),  # noqa: B905
                        range(first_version, first_version + n), ids, types, schemas, datas,
                        metas, digests)))


class NotUtf8(str):
    """A stored text whose bytes are not UTF-8 (SQLite keeps what a hand-made UPDATE writes), with
    those bytes as escapes: the SQLite backend reads a page that holds one again this way, so
    `unpack` names that commit as damaged (and a stream id reads as its escapes) where the
    driver's decoding error stopped every reader of the store."""


def text_or_escapes(data: bytes) -> str:
    """A SQLite `text_factory`: the text, or NotUtf8 when its bytes are not UTF-8."""
    try:
        return data.decode()
    except UnicodeDecodeError:
        return NotUtf8(data.decode("utf-8", "backslashreplace"))


def not_utf8_error(exc: Exception) -> bool:
    """Whether sqlite3 failed to decode a text column (`Could not decode to UTF-8 column ...`)."""
    return str(exc).startswith("Could not decode to UTF-8")


_DAMAGE = (orjson.JSONDecodeError, lz4.block.LZ4BlockError, KeyError, TypeError, ValueError,
           AttributeError, IndexError)


def unpack(row: tuple) -> list[RecordedEvent] | Iterator[RecordedEvent]:
    """The events of one commit row (columns in READ_COLUMNS order), in version order.

    Raises CorruptCommit when the payload was damaged past reading. This is the bulk-read hot
    path: one split (or, for an older commit, one `orjson.loads`), one length check and one map
    over its columns per commit (the common case, no per-event meta, is `_records` inlined: the
    call cost 5% of a step's commit). Each format has one parser, which `payload_columns` shares;
    calling it costs 1.0% of unpacking an episode's commit and 1.6% of a step's (callgrind).
    """
    position, stream_id, first_version, payload = row
    try:
        # payload_text, inlined: a call per commit would cost a 4-event commit 2% of its unpacking
        text = _decompress(payload).decode() if type(payload) is bytes else payload
        if type(text) is NotUtf8:
            raise ValueError("its payload is not UTF-8 text")
        columns, meta, event_metas = (_json_columns if text.startswith(_JSON_PAYLOAD)
                                      else _separated_columns)(text)
        if event_metas is not None:
            return _records(position - len(columns[0]) + 1, stream_id, first_version, columns, meta,
                            event_metas)
        ids, types, schemas, datas, digests = columns
        n = len(ids)
        records = map(_new, repeat(RecordedEvent, n),
                      zip(range(position - n + 1, position + 1), repeat(stream_id, n),  # noqa: B905
                          range(first_version, first_version + n), ids, types, schemas, datas,
                          repeat(meta, n), digests))
        return records if n > _SMALL_COMMIT else list(records)
    except _DAMAGE as exc:
        raise CorruptCommit(stream_id, position, f"{type(exc).__name__}: {exc}") from None


def _schema_number(text: str) -> int:
    if not (text.isascii() and text.isdigit()):
        raise ValueError(f"a schema version {text[:20]!r} is no number")
    return int(text)


Columns = tuple[list[str], list[str], list[int], list[str], list[str]]
"""A commit's per-event columns: ids, types, schema versions, data, digests (equal lengths)."""


def _separated_columns(text: str) -> tuple[Columns, str, list[str | None] | None]:
    """A payload in the separated format (see `pack`) as its columns, the commit's meta and the
    events' own metas (None when no event has one); ValueError when it does not read as one."""
    fields = text.split(SEPARATOR)
    try:
        n = int(fields[0])
    except ValueError:
        raise ValueError(f"it begins with {fields[0][:20]!r}, neither an event count nor a JSON "
                         "object") from None
    end = 5 * n + 2
    if len(fields) != end and len(fields) != end + n:
        raise ValueError("the payload's columns differ in length")
    schemas = fields[n + 1:2 * n + 1]
    # nearly every event is at version 1: no number to parse
    schemas = [1] * n if schemas.count("1") == n else [_schema_number(s) for s in schemas]
    columns = (fields[3 * n + 2:4 * n + 2], fields[1:n + 1], schemas, fields[2 * n + 1:3 * n + 1],
               fields[4 * n + 2:end])
    return columns, fields[3 * n + 1], [m or None for m in fields[end:]] if len(fields) != end else None


def _json_columns(text: str) -> tuple[Columns, str, list[str | None] | None]:
    """`_separated_columns` for a payload in the JSON format (written before revision 0005)."""
    cols = _loads(text)
    columns = (cols["id"], cols["type"], cols["schema"], cols["data"], cols["digest"])
    n = len(columns[0])
    if any(len(column) != n for column in columns):
        raise ValueError("the payload's columns differ in length")
    event_metas = cols.get("event_meta")
    if event_metas is not None and len(event_metas) != n:
        raise ValueError("the payload's columns differ in length")
    return columns, cols["meta"], event_metas
