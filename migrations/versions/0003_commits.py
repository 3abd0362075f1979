"""pack each append into one commit row; caller-supplied event ids in their own table

Revision ID: 0003_commits
Revises: 0002_projections
Create Date: 2026-11-21

A row per event capped SQLite appends, `read_all` and the analytics sync (issues 2 and 6). Each
stored event becomes a one-event commit at its old position, so checkpoints stay valid.
"""
import sqlalchemy as sa
from alembic import op

revision = "0003_commits"
down_revision = "0002_projections"
branch_labels = None
depends_on = None

_PAYLOAD = {
    "sqlite": ("json_object('id', json_array(event_id), 'type', json_array(type), "
               "'schema', json_array(schema_version), 'data', json_array(data), "
               "'digest', json_array(digest), 'meta', meta)"),
    "postgresql": ("json_build_object('id', json_build_array(event_id), "
                   "'type', json_build_array(type), 'schema', json_build_array(schema_version), "
                   "'data', json_build_array(data), 'digest', json_build_array(digest), "
                   "'meta', meta)::text"),
}


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        # Writers of the older companyos know nothing of this migration's advisory lock: an event
        # one committed between the copies below was left out of `commits` and dropped with
        # `events`. Writes wait for this transaction now, and then fail on the dropped table.
        # (SQLite's migration holds the database's one write lock already.)
        op.execute("LOCK TABLE events IN EXCLUSIVE MODE")
    op.create_table(
        "commits",
        sa.Column("position", sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
                  primary_key=True, autoincrement=False),
        sa.Column("stream_id", sa.String(200), nullable=False),
        sa.Column("first_version", sa.Integer(), nullable=False),
        sa.Column("last_version", sa.Integer(), nullable=False),
        sa.Column("last_digest", sa.String(64), nullable=False),
        sa.Column("payload", sa.Text(), nullable=False),
        sa.UniqueConstraint("stream_id", "first_version", name="uq_commits_stream_first_version"),
    )
    op.create_table(
        "event_ids",
        sa.Column("event_id", sa.String(64), primary_key=True),
        sa.Column("stream_id", sa.String(200), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
    )
    payload = _PAYLOAD[op.get_bind().dialect.name]
    op.execute("INSERT INTO commits (position, stream_id, first_version, last_version, "
               f"last_digest, payload) SELECT position, stream_id, version, version, digest, "
               f"{payload} FROM events ORDER BY position")
    op.execute("INSERT INTO event_ids (event_id, stream_id, version) "
               "SELECT event_id, stream_id, version FROM events")
    op.drop_table("events")


def downgrade() -> None:
    raise NotImplementedError("commits are not unpacked back into one row per event")
