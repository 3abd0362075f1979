"""Where the store lives: `--db`, else `COMPANYOS_DB`, else the embedded SQLite default."""

from __future__ import annotations

import os

from eventstore import DEFAULT_URL


def resolve_db(db: str | None) -> str:
    return db or os.environ.get("COMPANYOS_DB") or DEFAULT_URL
