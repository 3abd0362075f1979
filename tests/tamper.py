"""Damage a stored log behind the store's back, the way a bad disk, a bad restore or a hand-run
SQL statement would: by rewriting `commits` rows (see eventstore.packing) directly."""

from __future__ import annotations

from collections.abc import Callable

import orjson
import sqlalchemy as sa

from eventstore.packing import SEPARATOR, compress, payload_columns, payload_text

EVENT_COLUMNS = ("id", "type", "schema", "data", "digest")
"""The payload's per-event columns (eventstore.packing)."""


def stream_commits(engine: sa.Engine, stream_id: str) -> list[tuple[int, int, int]]:
    """(position, first_version, last_version) of each of a stream's commit rows, in version order."""
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(sa.text(
            "SELECT position, first_version, last_version FROM commits WHERE stream_id = :s "
            "ORDER BY first_version"), {"s": stream_id})]


def commit_holding(engine: sa.Engine, stream_id: str, version: int) -> tuple[int, int, int]:
    return next(c for c in stream_commits(engine, stream_id) if c[1] <= version <= c[2])


def edit_payload(engine: sa.Engine, position: int, edit: Callable[[dict], None]) -> None:
    """Rewrite one commit's payload in place; `edit` mutates its columns as one object of lists
    (`payload_columns`), which is then written back in the format it had."""
    with engine.begin() as conn:
        stored = conn.execute(
            sa.text("SELECT payload FROM commits WHERE position = :p"), {"p": position}).scalar_one()
        text = payload_text(stored)
        payload = payload_columns(text)
        edit(payload)
        as_json = text.startswith(b"{" if isinstance(text, bytes) else "{")
        edited = orjson.dumps(payload).decode() if as_json else joined(payload)
        # stored in the form it had: compressed (SQLite) or text
        conn.execute(sa.text("UPDATE commits SET payload = :payload WHERE position = :p"),
                     {"payload": compress(edited) if isinstance(stored, bytes) else edited,
                      "p": position})


def joined(payload: dict) -> str:
    """Columns written in the separated format (`eventstore.packing.pack`'s order) whatever they
    hold now: the count is the longest column's, so a column cut short stays cut short."""
    n = max(len(payload.get(key, ())) for key in EVENT_COLUMNS)
    fields = [str(n), *payload.get("type", ()), *map(str, payload.get("schema", ())),
              *payload.get("data", ()), payload["meta"], *payload.get("id", ()),
              *payload.get("digest", ())]
    if "event_meta" in payload:
        fields += [m or "" for m in payload["event_meta"]]
    return SEPARATOR.join(map(str, fields))


def edit_event(engine: sa.Engine, stream_id: str, version: int, key: str,
               change: Callable) -> None:
    """Replace one event's `key` column entry ("data", "type", ...) with `change(old)`."""
    position, first, _last = commit_holding(engine, stream_id, version)

    def edit(payload: dict) -> None:
        payload[key][version - first] = change(payload[key][version - first])

    edit_payload(engine, position, edit)


def versions_of_type(engine: sa.Engine, stream_id: str, type_: str) -> list[int]:
    with engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT first_version, payload FROM commits "
                                    "WHERE stream_id = :s ORDER BY first_version"), {"s": stream_id})
        return [first + i for first, payload in rows
                for i, t in enumerate(payload_columns(payload_text(payload))["type"]) if t == type_]


def delete_commit(engine: sa.Engine, position: int) -> None:
    with engine.begin() as conn:
        conn.execute(sa.text("DELETE FROM commits WHERE position = :p"), {"p": position})


def swap_commit_positions(engine: sa.Engine, a: int, b: int) -> None:
    """Two commit rows trade places in the global order; each keeps its versions and digests."""
    with engine.begin() as conn:
        for old, new in ((a, -1), (b, a), (-1, b)):
            conn.execute(sa.text("UPDATE commits SET position = :new WHERE position = :old"),
                         {"old": old, "new": new})


def swap_events(engine: sa.Engine, position: int, i: int, j: int, keys: tuple[str, ...]) -> None:
    """Within one commit, entries i and j of the given payload columns trade places."""

    def edit(payload: dict) -> None:
        for key in keys:
            payload[key][i], payload[key][j] = payload[key][j], payload[key][i]

    edit_payload(engine, position, edit)
