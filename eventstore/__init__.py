"""The append-only event store: envelopes in, envelopes out; it knows nothing of the domain."""

from eventstore.encoding import GENESIS_DIGEST, canonical_json, chain_digest
from eventstore.records import (
    MAX_EVENT_BYTES,
    TOKEN_META_KEY,
    ConcurrencyError,
    CorruptCommit,
    CorruptEvent,
    NewEvent,
    RecordedEvent,
    StoreClosed,
    StoreUnavailable,
    StoreUnreachable,
    StreamHead,
    WriterBusy,
)
from eventstore.store import DEFAULT_URL, EventStore, NewStream, shown_url
from eventstore.upcasting import Upcasters

__all__ = [
    "DEFAULT_URL", "GENESIS_DIGEST", "MAX_EVENT_BYTES", "ConcurrencyError", "CorruptCommit", "CorruptEvent",
    "EventStore",
    "NewEvent", "NewStream", "RecordedEvent", "StoreClosed", "StoreUnavailable", "StoreUnreachable",
    "StreamHead", "TOKEN_META_KEY", "Upcasters", "WriterBusy", "canonical_json",
    "chain_digest", "shown_url",
]
