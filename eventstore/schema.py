"""The store's tables as SQLAlchemy Core metadata; Alembic migrations create them (a test checks)."""

from __future__ import annotations

import sqlalchemy as sa

from eventstore.records import MAX_STREAM_ID_LENGTH, MAX_TYPE_LENGTH

metadata = sa.MetaData()

# On SQLite an INTEGER PRIMARY KEY is the rowid itself: the cheapest possible clustered key.
Position = sa.BigInteger().with_variant(sa.Integer(), "sqlite")

events = sa.Table(
    "events",
    metadata,
    sa.Column("position", Position, primary_key=True, autoincrement=False),
    sa.Column("stream_id", sa.String(MAX_STREAM_ID_LENGTH), nullable=False),
    sa.Column("version", sa.Integer(), nullable=False),
    sa.Column("event_id", sa.String(64), nullable=False),
    sa.Column("type", sa.String(MAX_TYPE_LENGTH), nullable=False),
    sa.Column("schema_version", sa.Integer(), nullable=False),
    sa.Column("data", sa.Text(), nullable=False),
    sa.Column("meta", sa.Text(), nullable=False),
    sa.Column("digest", sa.String(64), nullable=False),
    sa.UniqueConstraint("stream_id", "version", name="uq_events_stream_version"),
    sa.UniqueConstraint("event_id", name="uq_events_event_id"),
)
