"""The episodes read model names the rules version each episode was judged by

Revision ID: 0006_episode_rules
Revises: 0005_separated_payloads
Create Date: 2026-11-27

Rows written before hold 1 (the server default), what every episode logged before rules versions
existed was judged by; the episodes projection's version moved with this column, so the next
catch-up refolds the read model from the log and every row says what its episode's log says.
"""
import sqlalchemy as sa
from alembic import op

revision = "0006_episode_rules"
down_revision = "0005_separated_payloads"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # a store whose revision row was set back by hand (or restored over newer tables) has the
    # column already: adding it again would fail the whole upgrade
    inspector = sa.inspect(op.get_bind())
    if "rules" not in {c["name"] for c in inspector.get_columns("episodes")}:
        op.add_column("episodes", sa.Column("rules", sa.Integer(), nullable=False, server_default="1"))
    if "ix_episodes_rules" not in {i["name"] for i in inspector.get_indexes("episodes")}:
        op.create_index("ix_episodes_rules", "episodes", ["rules"])


def downgrade() -> None:
    op.drop_index("ix_episodes_rules", "episodes")
    with op.batch_alter_table("episodes") as batch:
        batch.drop_column("rules")
