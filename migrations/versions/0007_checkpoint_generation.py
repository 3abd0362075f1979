"""Each read model's checkpoint counts the clears it went through

Revision ID: 0007_checkpoint_generation
Revises: 0006_episode_rules
Create Date: 2026-11-28

A rebuild clears a read model and sets its checkpoint back to 0; its pages then bring the
checkpoint to the very positions another runner may hold cached, so a compare-and-set of the
position alone let that runner commit a page it had folded over rows the clear deleted (and drop
their episodes). Every clear now bumps `generation`, and the compare-and-set checks both. Rows
written before hold 0.
"""
import sqlalchemy as sa
from alembic import op

revision = "0007_checkpoint_generation"
down_revision = "0006_episode_rules"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # a store whose revision row was set back by hand has the column already (see 0006)
    inspector = sa.inspect(op.get_bind())
    if "generation" not in {c["name"] for c in inspector.get_columns("projection_checkpoints")}:
        op.add_column("projection_checkpoints",
                      sa.Column("generation", sa.BigInteger(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("projection_checkpoints") as batch:
        batch.drop_column("generation")
