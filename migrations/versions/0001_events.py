"""the append-only events table

Revision ID: 0001_events
Revises:
Create Date: 2026-11-21
"""
import sqlalchemy as sa
from alembic import op

revision = "0001_events"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "events",
        sa.Column("position", sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
                  primary_key=True, autoincrement=False),
        sa.Column("stream_id", sa.String(200), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("event_id", sa.String(64), nullable=False),
        sa.Column("type", sa.String(200), nullable=False),
        sa.Column("schema_version", sa.Integer(), nullable=False),
        sa.Column("data", sa.Text(), nullable=False),
        sa.Column("meta", sa.Text(), nullable=False),
        sa.Column("digest", sa.String(64), nullable=False),
        sa.UniqueConstraint("stream_id", "version", name="uq_events_stream_version"),
        sa.UniqueConstraint("event_id", name="uq_events_event_id"),
    )


def downgrade() -> None:
    op.drop_table("events")
