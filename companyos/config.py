"""Where the store lives: `--db`, else `COMPANYOS_DB`, else the embedded SQLite default."""

from __future__ import annotations

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
    """The store a command that only reads the log names, refused when it is a SQLite file that
    does not exist: opening would create an empty store, and `verify --db typo.db` said "ok"
    about nothing (the commands that write, `run` and `serve`, create it as before)."""
    from eventstore.engine import normalise_url, sqlite_file

    url = resolve_db(db)
    try:
        path = sqlite_file(normalise_url(url))
    except Exception:  # not a URL at all: the store says so when it opens it
        return url
    if path is not None and not os.path.exists(path):
        raise StoreUnavailable(f"there is no store at {path} ({url}); `companyos run` or "
                               "`companyos db upgrade` creates one")
    return url
