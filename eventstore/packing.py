"""One stored row per append: the events of a commit packed as columnar JSON.

A row per event made SQLite pay a B-tree insert, two index entries and a repeated stream id and
meta for every event; bulk reads paid a row fetch per event. A commit row is written once and
decoded by one `orjson.loads`, so appends, `read_all` and the analytics sync move whole commits.

Row: `position` is the position of the commit's *last* event (its events hold the positions
`position - count + 1 … position`), `first_version`/`last_version` bound its versions,
`last_digest` is the stream's digest after it (the head lookup reads only these), and `payload`
the columnar JSON object below. Bulk reads select only READ_COLUMNS: every column fetched costs
as much as decoding a commit's events.

SQLite keeps a payload over 2 KB lz4-compressed (a BLOB, `compress`): an expert episode's 15 KB commit
shrinks to ~7 KB, two pages fewer to write into the WAL and copy back at each checkpoint, which
made `companyos run` 8% faster at 500,000 episodes and the store half the size. PostgreSQL keeps
it as text (its TOAST compresses already), and so did SQLite stores before revision 0004; every
reader takes both forms (`payload_json`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from itertools import repeat
from typing import NamedTuple

import lz4.block
import orjson

from eventstore.records import RecordedEvent

COMMIT_COLUMNS = "position, stream_id, first_version, last_version, last_digest, payload"
READ_COLUMNS = "position, stream_id, first_version, payload"
"""Payload: {"id": [...], "type": [...], "schema": [...], "data": [<JSON text>...],
"digest": [...], "meta": <the commit's meta, JSON text>} and, only when some event carries its
own meta, "event_meta": [<JSON text> or null ...]; lists hold one entry per event."""

_new = tuple.__new__
_loads = orjson.loads
_compress = lz4.block.compress
_decompress = lz4.block.decompress
PayloadEncoder = Callable[[bytes], str | bytes]
"""How a backend stores a payload's JSON (UTF-8 bytes): `compress` for SQLite, text for PostgreSQL."""


COMPRESS_ABOVE = 2048
"""Payloads up to this many bytes stay text on SQLite: a small commit (a 4-event step's is under
1 KB) shares a leaf page either way, so compressing it would only cost its readers."""


def compress(payload_json: bytes) -> str | bytes:
    """A payload as SQLite stores it: lz4 (block format, its size in front) when it is big."""
    return _compress(payload_json) if len(payload_json) > COMPRESS_ABOVE else payload_json.decode()


def as_text(payload_json: bytes) -> str:
    """A payload as PostgreSQL stores it: text (TOAST compresses large values itself)."""
    return payload_json.decode()


LZ4_MAX_RATIO = 255
"""No lz4 block decompresses to more than ~255 times its size: a header claiming more is damage."""


def payload_json(stored: str | bytes) -> str | bytes:
    """The JSON of a stored payload, compressed (bytes) or not (text); lz4.block.LZ4BlockError
    when compressed bytes are damaged, a header claiming an impossible size included (lz4 would
    first allocate whatever it claims). The bulk read (`unpack`) inlines the decompression."""
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
         digests: list[str], meta: str, event_metas: list[str | None] | None = None) -> bytes:
    """The payload JSON of one commit (data stays canonical JSON text, so digests re-check)."""
    payload = {"id": ids, "type": types, "schema": schemas, "data": datas, "digest": digests,
               "meta": meta}
    if event_metas is not None:
        payload["event_meta"] = event_metas
    return orjson.dumps(payload)


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


class CorruptCommit(ValueError):
    """A stored commit row whose payload cannot be unpacked: damaged behind the store's back."""

    def __init__(self, stream_id: str, position: int, reason: str) -> None:
        self.stream_id = stream_id
        self.position = position
        self.reason = reason
        super().__init__(f"stream {stream_id!r}: the commit at position {position} does not "
                         f"unpack: {reason}")


_DAMAGE = (orjson.JSONDecodeError, lz4.block.LZ4BlockError, KeyError, TypeError, ValueError,
           AttributeError)


def unpack(row: tuple) -> list[RecordedEvent] | Iterator[RecordedEvent]:
    """The events of one commit row (columns in READ_COLUMNS order), in version order.

    Raises CorruptCommit when the payload was damaged past reading. This is the bulk-read hot
    path: one `orjson.loads`, one length check and one map over its columns per commit (the
    common case, no per-event meta, is `_records` inlined: the call cost 5% of a step's commit).
    """
    position, stream_id, first_version, payload = row
    try:
        # payload_json, inlined: a call per commit would cost a 4-event commit 2% of its unpacking
        cols = _loads(_decompress(payload) if type(payload) is bytes else payload)
        ids, types, schemas, datas, digests = columns = (
            cols["id"], cols["type"], cols["schema"], cols["data"], cols["digest"])
        n = len(ids)
        if not n == len(types) == len(schemas) == len(datas) == len(digests):
            raise ValueError("the payload's columns differ in length")
        if "event_meta" in cols:
            if len(cols["event_meta"]) != n:
                raise ValueError("the payload's columns differ in length")
            return _records(position - n + 1, stream_id, first_version, columns, cols["meta"],
                            cols["event_meta"])
        records = map(_new, repeat(RecordedEvent, n),
                      zip(range(position - n + 1, position + 1), repeat(stream_id, n),  # noqa: B905
                          range(first_version, first_version + n), ids, types, schemas, datas,
                          repeat(cols["meta"], n), digests))
        return records if n > _SMALL_COMMIT else list(records)
    except _DAMAGE as exc:
        raise CorruptCommit(stream_id, position, f"{type(exc).__name__}: {exc}") from None
