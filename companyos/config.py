"""Where the store lives: `--db`, else `COMPANYOS_DB`, else the embedded SQLite default."""

from __future__ import annotations

import contextlib
import os

from eventstore import DEFAULT_URL, StoreUnavailable


def resolve_db(db: str | None) -> str:
    """An empty `--db ""` is refused rather than read as "the default": it is most often an unset
    shell variable (`--db "$URL"`), and the default store is not the one the caller meant."""
    if db is not None and not db.strip():
        raise StoreUnavailable(f"the store URL (--db) is empty; pass one such as {DEFAULT_URL}, or none "
                               "at all for $COMPANYOS_DB, else that default")
    return db or os.environ.get("COMPANYOS_DB") or DEFAULT_URL


def resolve_existing_db(db: str | None) -> str:
    """The store a command that only reads the log names, refused when there is none there (a
    SQLite file that does not exist, a database without the store's tables): opening would
    create an empty store, and `verify --db typo.db` said "ok" about nothing (the commands that
    write, `run` and `serve`, create it as before)."""
    from eventstore import EventStore
    from eventstore.engine import normalise_url, sqlite_file

    url = resolve_db(db)
    try:
        path = sqlite_file(normalise_url(url))
    except Exception:  # not a URL at all: the store says so when it opens it
        return url
    if path is not None and not os.path.exists(path):
        raise StoreUnavailable(f"there is no store at {path} ({url}); `companyos run` or "
                               "`companyos db upgrade` creates one")
    if path is not None and _sqlite_holds_a_store(path) is False:  # a look that changes nothing
        raise StoreUnavailable(f"there is no store at {path} ({url}): the file holds none of its "
                               "tables; `companyos run` or `companyos db upgrade` creates one")
    if path is None:
        EventStore.open(url, create=False).close()
    return url


def _sqlite_holds_a_store(path: str) -> bool | None:
    import sqlite3
    from pathlib import Path

    try:
        with contextlib.closing(sqlite3.connect(f"{Path(path).resolve().as_uri()}?mode=ro",
                                                uri=True)) as con:
            return con.execute("SELECT count(*) FROM sqlite_master "
                               "WHERE name = 'alembic_version'").fetchone()[0] > 0
    except sqlite3.Error:
        return None  # not a database, or unreadable: opening the store says what is wrong
