"""Which stores can feed a warehouse, and which reader serves each, decided without loading Arrow.

A sync that finds nothing new stops before any reader is opened, so every analytics command on an
up-to-date warehouse starts without importing pyarrow (and NumPy behind it).
"""

from __future__ import annotations

from eventstore.engine import in_memory_sqlite, normalise_url

SQLITE_READER = "sqlite"  # the stdlib cursor over `commits`
POSTGRES_READER = "postgresql-copy"  # COPY ... TO STDOUT as CSV
STORE_READER = "eventstore"  # `EventStore.read_all`: any engine, the reference reader


class UnsyncableStore(ValueError):
    """The store cannot feed a warehouse: an in-memory SQLite store lives in one process only."""


def check_syncable(url: str) -> None:
    """Refuse a store no other process can read, before a warehouse file is made for it."""
    if in_memory_sqlite(normalise_url(url)):
        raise UnsyncableStore(f"{url} is an in-memory SQLite store, which lives in one process and "
                              "cannot be synced; pass a file, e.g. sqlite:///companyos.db")


def reader_for(url: str, prefer: str | None = None) -> str:
    """The fastest reader for the store at `url` (`prefer="store"` forces the reference reader)."""
    if prefer == "store":
        return STORE_READER
    backend = normalise_url(url).get_backend_name()
    if backend == "sqlite":
        check_syncable(url)
        return SQLITE_READER
    return POSTGRES_READER if backend == "postgresql" else STORE_READER
