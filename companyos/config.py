"""Where the store lives: `--db`, else `COMPANYOS_DB`, else the embedded SQLite default."""

from __future__ import annotations

import os

from eventstore import DEFAULT_URL, StoreUnavailable
from eventstore.engine import in_memory_sqlite, sqlite_read_only


def resolve_db(db: str | None) -> str:
    """An empty `--db ""` is refused rather than read as "the default": it is most often an unset
    shell variable (`--db "$URL"`), and the default store is not the one the caller meant."""
    if db is not None and not isinstance(db, str):  # a path, say: it failed on `.strip`
        raise TypeError(f"db must be a store URL such as {DEFAULT_URL} (or an EventStore), "
                        f"not {type(db).__name__}")
    if db is not None and not db.strip():
        raise StoreUnavailable(f"the store URL (--db) is empty; pass one such as {DEFAULT_URL}, or none "
                               "at all for $COMPANYOS_DB, else that default")
    if db:
        return db
    from_env = os.environ.get("COMPANYOS_DB")
    if from_env is not None and not from_env.strip():  # set to an unset variable, as --db "" is
        raise StoreUnavailable(f"COMPANYOS_DB is set but empty; set it to a store URL such as "
                               f"{DEFAULT_URL}, or unset it for that default")
    return from_env or DEFAULT_URL


def in_memory_store(url: str) -> bool:
    """Whether the URL names an in-memory SQLite store, which `run` and `serve` refuse: its
    episodes would vanish with the process, and its one connection serves one thread. A URL that
    is no URL is not one: opening the store says what is wrong with it."""
    import sqlalchemy

    try:
        return in_memory_sqlite(url)
    except (sqlalchemy.exc.ArgumentError, ValueError):  # ValueError: a port that is no number
        return False


def read_only_store(url: str) -> bool:
    """Whether the URL opens a SQLite store read-only (`?mode=ro&uri=true`, the README's way to
    look without writing, or `immutable=1`): `run`, `serve` and `rebuild`, which write, refuse it
    up front (they failed at their first write, `serve` with a 503 on every route while /ready
    said ready)."""
    import sqlalchemy

    try:
        return sqlite_read_only(url)
    except (sqlalchemy.exc.ArgumentError, ValueError):
        return False


READ_ONLY_WORDS = "opens the store read-only (mode=ro or immutable=1)"


def read_only_refusal(url: str, writes: str) -> str | None:
    """Why a command that `writes` (e.g. "a run logs episodes") cannot use `url`, or None: the
    one refusal `run`, `serve` and `rebuild` give a read-only store URL."""
    if not read_only_store(url):
        return None
    return f"the store URL {url!r} {READ_ONLY_WORDS}, and {writes}; leave that argument out"


def api_key_problem(key: str) -> str | None:
    """What keeps `key` from working as a Bearer API key, or None. The server and the client both
    ask: a key that cannot travel in an HTTP header (a space, a control character, non-ASCII) would
    lock every client out with "wrong API key", or fail inside the client's HTTP library."""
    if not key:
        return "the API key is empty"
    bad = next((c for c in key if not "!" <= c <= "~"), None)
    if bad is not None:
        return (f"the API key holds {bad!r}, which an Authorization header cannot carry as sent: a key "
                "is printable ASCII without spaces")
    return None
