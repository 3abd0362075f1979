"""Commit payloads are written as fields joined by U+001E from this revision on

Revision ID: 0005_separated_payloads
Revises: 0004_lz4_payloads
Create Date: 2026-11-27

No row changes: readers take a payload in either format (a JSON object of lists, or its fields
joined by ASCII's record separator; see eventstore.packing), so rows written before stay as they
are. The revision exists so that older code, which reads only JSON payloads, refuses a store
holding separated ones as newer than itself instead of reporting every such commit as damaged.
"""

revision = "0005_separated_payloads"
down_revision = "0004_lz4_payloads"
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    raise NotImplementedError("separated commits are not rewritten as JSON")
