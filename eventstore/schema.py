"""The store's tables as SQLAlchemy Core metadata; Alembic migrations create them (a test checks)."""

from __future__ import annotations

import sqlalchemy as sa

from eventstore.records import MAX_STREAM_ID_LENGTH

metadata = sa.MetaData()

# On SQLite an INTEGER PRIMARY KEY is the rowid itself: the cheapest possible clustered key.
Position = sa.BigInteger().with_variant(sa.Integer(), "sqlite")

commits = sa.Table(
    "commits",
    metadata,
    sa.Column("position", Position, primary_key=True, autoincrement=False),
    sa.Column("stream_id", sa.String(MAX_STREAM_ID_LENGTH), nullable=False),
    sa.Column("first_version", sa.Integer(), nullable=False),
    sa.Column("last_version", sa.Integer(), nullable=False),
    sa.Column("last_digest", sa.String(64), nullable=False),
    sa.Column("payload", sa.Text(), nullable=False),
    # Every append starts right after the head it saw, so commits tile a stream's versions and
    # two writers racing from one head collide on this key.
    sa.UniqueConstraint("stream_id", "first_version", name="uq_commits_stream_first_version"),
)
"""One row per append; see eventstore.packing for the layout."""

event_ids = sa.Table(
    "event_ids",
    metadata,
    sa.Column("event_id", sa.String(64), primary_key=True),
    sa.Column("stream_id", sa.String(MAX_STREAM_ID_LENGTH), nullable=False),
    sa.Column("version", sa.Integer(), nullable=False),
)
"""Caller-supplied event ids only (generated ids are unique by construction): idempotent retries."""
