"""One stored row per append: the events of a commit packed as columnar JSON.

A row per event made SQLite pay a B-tree insert, two index entries and a repeated stream id and
meta for every event; bulk reads paid a row fetch per event. A commit row is written once and
decoded by one `orjson.loads`, so appends, `read_all` and the analytics sync move whole commits.

Row: `position` is the position of the commit's *last* event (its events hold the positions
`position - count + 1 … position`), `first_version`/`last_version` bound its versions,
`last_digest` is the stream's digest after it (the head lookup reads only these), and `payload`
the columnar JSON object below. Bulk reads select only READ_COLUMNS: every column fetched costs
as much as decoding a commit's events.
"""

from __future__ import annotations

from collections.abc import Iterator

import orjson

from eventstore.records import RecordedEvent

COMMIT_COLUMNS = "position, stream_id, first_version, last_version, last_digest, payload"
READ_COLUMNS = "position, stream_id, first_version, payload"
"""Payload: {"id": [...], "type": [...], "schema": [...], "data": [<JSON text>...],
"digest": [...], "meta": <the commit's meta, JSON text>} and, only when some event carries its
own meta, "event_meta": [<JSON text> or null ...]; lists hold one entry per event."""

_new = tuple.__new__
_loads = orjson.loads


def pack(ids: list[str], types: list[str], schemas: list[int], datas: list[str],
         digests: list[str], meta: str, event_metas: list[str | None] | None) -> str:
    """The payload text of one commit (data stays canonical JSON text, so digests re-check)."""
    payload = {"id": ids, "type": types, "schema": schemas, "data": datas, "digest": digests,
               "meta": meta}
    if event_metas is not None:
        payload["event_meta"] = event_metas
    return orjson.dumps(payload).decode()


def unpack(row: tuple) -> Iterator[RecordedEvent]:
    """The events of one commit row (columns in READ_COLUMNS order), in version order."""
    position, stream_id, version, payload = row
    cols = _loads(payload)
    ids = cols["id"]
    position -= len(ids)
    version -= 1
    meta = cols["meta"]
    own_meta = cols.get("event_meta")
    if own_meta is None:
        for event_id, type_, schema, data, digest in zip(
                ids, cols["type"], cols["schema"], cols["data"], cols["digest"], strict=True):
            position += 1
            version += 1
            yield _new(RecordedEvent, (position, stream_id, version, event_id, type_, schema,
                                       data, meta, digest))
    else:
        for event_id, type_, schema, data, digest, event_meta in zip(
                ids, cols["type"], cols["schema"], cols["data"], cols["digest"], own_meta, strict=True):
            position += 1
            version += 1
            yield _new(RecordedEvent, (position, stream_id, version, event_id, type_, schema,
                                       data, event_meta or meta, digest))
