"""The read models' tables as SQLAlchemy Core metadata; migration 0002 creates exactly these.

Wall-clock and simulated times are ISO-8601 strings: they sort correctly as text, and the same
value round-trips byte for byte on SQLite and PostgreSQL (which `verify` relies on).
"""

from __future__ import annotations

import sqlalchemy as sa

from eventstore.records import MAX_STREAM_ID_LENGTH as STREAM_ID

metadata = sa.MetaData()

projection_checkpoints = sa.Table(
    "projection_checkpoints",
    metadata,
    sa.Column("name", sa.String(100), primary_key=True),
    # the global position of the last event folded into the read model
    sa.Column("position", sa.BigInteger(), nullable=False),
    # the projection's code version; a different one makes the runner rebuild the read model
    sa.Column("version", sa.Integer(), nullable=False),
    # how many times the read model was cleared (migration 0007): a runner's compare-and-set
    # checks it beside the position, which a rebuild's pages bring back to values seen before
    sa.Column("generation", sa.BigInteger(), nullable=False, server_default="0"),
)

episodes = sa.Table(
    "episodes",
    metadata,
    sa.Column("episode_id", sa.String(STREAM_ID), primary_key=True),
    sa.Column("task", sa.String(100), nullable=False),
    sa.Column("seed", sa.BigInteger(), nullable=False),
    sa.Column("chaos", sa.Float(), nullable=False),
    sa.Column("agent", sa.String(200), nullable=True),
    sa.Column("reward_profile", sa.String(100), nullable=False),
    sa.Column("max_steps", sa.Integer(), nullable=True),
    # the rules version the episode was judged by (1: its log names none; migration 0006)
    sa.Column("rules", sa.Integer(), nullable=False, server_default="1"),
    sa.Column("started_at", sa.String(40), nullable=True),
    sa.Column("ended_at", sa.String(40), nullable=True),
    sa.Column("sim_started_at", sa.String(40), nullable=True),
    sa.Column("sim_ended_at", sa.String(40), nullable=True),
    sa.Column("steps", sa.Integer(), nullable=False),
    sa.Column("total_return", sa.Float(), nullable=False),
    sa.Column("outcome", sa.String(20), nullable=True),
    sa.Column("failure_mode", sa.String(100), nullable=True),
    sa.Column("events", sa.Integer(), nullable=False),
    sa.Column("last_version", sa.Integer(), nullable=False),
    sa.Column("digest", sa.String(64), nullable=False),
    sa.Column("first_position", sa.BigInteger(), nullable=False),
    sa.Column("last_position", sa.BigInteger(), nullable=False),
    sa.Index("ix_episodes_task", "task"),
    sa.Index("ix_episodes_agent", "agent"),
    sa.Index("ix_episodes_outcome", "outcome"),
    sa.Index("ix_episodes_rules", "rules"),
    sa.Index("ix_episodes_first_position", "first_position"),
)

episode_views = sa.Table(
    "episode_views",
    metadata,
    sa.Column("episode_id", sa.String(STREAM_ID), primary_key=True),
    sa.Column("last_version", sa.Integer(), nullable=False),
    sa.Column("step", sa.Integer(), nullable=False),
    # canonical JSON of domain.views(state): {"ticketdesk": ..., "datahub": ..., "approvalflow": ...}
    sa.Column("views", sa.Text(), nullable=False),
)
