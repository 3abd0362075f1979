"""read models: projection checkpoints, episodes, episode views

Revision ID: 0002_projections
Revises: 0001_events
Create Date: 2026-11-21
"""
import sqlalchemy as sa
from alembic import op

revision = "0002_projections"
down_revision = "0001_events"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "projection_checkpoints",
        sa.Column("name", sa.String(100), primary_key=True),
        sa.Column("position", sa.BigInteger(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
    )
    op.create_table(
        "episodes",
        sa.Column("episode_id", sa.String(200), primary_key=True),
        sa.Column("task", sa.String(100), nullable=False),
        sa.Column("seed", sa.BigInteger(), nullable=False),
        sa.Column("chaos", sa.Float(), nullable=False),
        sa.Column("agent", sa.String(200), nullable=True),
        sa.Column("reward_profile", sa.String(100), nullable=False),
        sa.Column("max_steps", sa.Integer(), nullable=True),
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
    )
    op.create_index("ix_episodes_task", "episodes", ["task"])
    op.create_index("ix_episodes_agent", "episodes", ["agent"])
    op.create_index("ix_episodes_outcome", "episodes", ["outcome"])
    op.create_index("ix_episodes_first_position", "episodes", ["first_position"])
    op.create_table(
        "episode_views",
        sa.Column("episode_id", sa.String(200), primary_key=True),
        sa.Column("last_version", sa.Integer(), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("views", sa.Text(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("episode_views")
    op.drop_index("ix_episodes_first_position", table_name="episodes")
    op.drop_index("ix_episodes_outcome", table_name="episodes")
    op.drop_index("ix_episodes_agent", table_name="episodes")
    op.drop_index("ix_episodes_task", table_name="episodes")
    op.drop_table("episodes")
    op.drop_table("projection_checkpoints")
