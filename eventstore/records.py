"""The store's value types: what a writer hands in and what a reader gets back."""

from __future__ import annotations

from typing import Any, NamedTuple

from eventstore.encoding import decode_json

MAX_EVENT_BYTES = 1024 * 1024
"""Largest encoded `data` of one event; bigger payloads belong in a blob store, not an event log."""
MAX_STREAM_ID_LENGTH = 200
MAX_TYPE_LENGTH = 200
MAX_SCHEMA_VERSION = 2**31 - 1
"""A schema version is a positive 32-bit integer: what the warehouse's column (and every SQL
INTEGER) holds, so one append cannot stop every analytics sync of the store."""


class StoreUnavailable(Exception):
    """The store's URL names nothing we can open, or the database refused the connection."""


class WriterBusy(Exception):
    """Another writer holds the SQLite store and this append was told not to wait for it
    (`eventstore.backends.WAIT_FOR_WRITERS`); nothing was written."""


class StoreClosed(RuntimeError):
    """A store used after `close()`. Not a ValueError: the caller's values are not what is wrong
    (the server answers ValueErrors from a step as the action's fault)."""


class StoreUnreachable(StoreUnavailable):
    """The database server could not be reached or refused the connection (down, nothing
    listening, no such database or role), or SQLite refused the store's file (read-only, locked,
    damaged): the driver tells these apart only in words, and an outage is the common case, so a
    caller treats it as the world's fault and may try again."""


class ConcurrencyError(Exception):
    """A writer appended with a stale expected version: someone else wrote to the stream first."""

    def __init__(self, stream_id: str, expected: int | None, actual: int | None) -> None:
        self.stream_id = stream_id
        self.expected = expected
        self.actual = actual
        super().__init__(
            f"stream {stream_id!r}: expected version {_show(expected)}, "
            f"but the stream is at version {_show(actual)}"
        )


def _show(version: int | None) -> str:
    return "None (no stream)" if version is None else str(version)


TOKEN_META_KEY = "token_sha256"
"""The meta key under which a served episode's first commit keeps the hash of its token (how any
server process checks the token): what the API's answers and the analytics export leave out."""


class NewEvent(NamedTuple):
    """An event to append. `event_id` makes retries idempotent; `meta` never enters a digest."""

    type: str
    data: dict[str, Any]
    schema_version: int = 1
    event_id: str | None = None
    meta: dict[str, Any] | None = None


class StreamHead(NamedTuple):
    """Where a stream stands after an append: its last version and its chain digest."""

    version: int
    digest: str


class RecordedEvent(NamedTuple):
    """An event as stored. `data` and `meta` are decoded on access so bulk reads stay cheap."""

    position: int
    stream_id: str
    version: int
    event_id: str
    type: str
    schema_version: int
    data_json: str
    meta_json: str
    digest: str

    @property
    def data(self) -> dict[str, Any]:
        return self._decoded(self.data_json, "data")

    @property
    def meta(self) -> dict[str, Any]:
        return self._decoded(self.meta_json, "meta")

    def _decoded(self, text: str, part: str) -> Any:
        try:
            return decode_json(text)
        except (ValueError, TypeError) as exc:  # orjson's words, with no stream or position
            raise CorruptEvent(self, part, exc) from None


class CorruptCommit(ValueError):
    """A stored commit row whose payload cannot be unpacked: damaged behind the store's back."""

    def __init__(self, stream_id: str, position: int, reason: str) -> None:
        self.stream_id = stream_id
        self.position = position
        self.reason = reason
        super().__init__(f"stream {stream_id!r}: the commit at position {position} does not "
                         f"unpack: {reason}")


class CorruptEvent(CorruptCommit):
    """An event whose stored data or meta is no JSON (edited behind the store's back), raised as
    it is decoded: named by its stream, version and position as projections' `DamagedEvent`
    names one, not as orjson's bare error."""

    def __init__(self, record: RecordedEvent, part: str, exc: Exception) -> None:
        super().__init__(record.stream_id, record.position, f"its {part} is not JSON ({exc})")
        self.args = (f"stream {record.stream_id!r}: the event at version {record.version} "
                     f"(position {record.position}) does not decode: {self.reason}",)
