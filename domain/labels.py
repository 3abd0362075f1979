"""The rule for labels people give (an agent's name): text that tables and pages can show."""

from __future__ import annotations


def control_character(text: str) -> str | None:
    """The first control character in `text` (C0, DEL or C1), if any: a label holding one breaks
    the tables that show it, and PostgreSQL text holds no NUL."""
    return next((c for c in text if c < " " or "\x7f" <= c <= "\x9f"), None)
