"""SQLite commit payloads are written lz4-compressed from this revision on

Revision ID: 0004_lz4_payloads
Revises: 0003_commits
Create Date: 2026-11-25

No row changes: readers take a payload as text (JSON) or as bytes (lz4-compressed JSON), so rows
written before stay as they are. The revision exists so that older code, which reads only text,
refuses a store holding compressed commits as newer than itself instead of reporting every such
commit as damaged.
"""

revision = "0004_lz4_payloads"
down_revision = "0003_commits"
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    raise NotImplementedError("compressed commits are not rewritten as text")
