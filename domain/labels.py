"""The rule for labels people give (an agent's name): text that tables and pages can show."""

from __future__ import annotations

import re

BIDI_CONTROL_RANGES = "\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
"""Unicode's explicit bidirectional formatting characters (marks, embeddings, overrides, isolates),
as the inside of a regular expression's character class."""
BIDI_CONTROLS = re.compile(f"[{BIDI_CONTROL_RANGES}]")


def visible_bidi_controls(text: str) -> str:
    """`text` with its bidirectional controls written as escapes (`\\u202e`). Shown raw, an override
    turns the text after it around: a logged amount of 00001 read as 10000, a tool name backwards,
    so what a reviewer read was not what the log holds. Letters of right-to-left scripts stay."""
    return BIDI_CONTROLS.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


CONTROLS = re.compile(f"[\\x00-\\x1f\\x7f-\\x9f\\u2028\\u2029{BIDI_CONTROL_RANGES}]")
"""What a line of text must not hold raw: control characters (C0, DEL, C1), line and paragraph
separators, and bidirectional controls."""
_NAMED_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def visible_controls(text: str) -> str:
    """`text` with every one of CONTROLS written as an escape (`\\n`, `\\x1b`, `\\u2028`), so it stays
    on its line and shows what it holds: a newline split a Markdown table's row, and an escape
    sequence from a damaged file's bytes in an error line was the terminal's to obey."""
    def escaped(m: re.Match) -> str:
        char = m.group()
        code = ord(char)
        return _NAMED_ESCAPES.get(char) or (f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}")

    return CONTROLS.sub(escaped, text)


_VISIBLE_BIDI_CONTROL = re.compile(r"\\u([0-9a-fA-F]{4})")


def hidden_bidi_controls(text: str) -> str:
    """`visible_bidi_controls` undone: each escape of a bidirectional control back to the character,
    so a label typed as the pages show it (`evil\\u202e10000`) names the label it shows. Other
    escapes stay as typed."""
    def back(m: re.Match) -> str:
        char = chr(int(m.group(1), 16))
        return char if BIDI_CONTROLS.fullmatch(char) else m.group()

    return _VISIBLE_BIDI_CONTROL.sub(back, text)


def control_character(text: str) -> str | None:
    """The first control character in `text` (C0, DEL or C1), if any: a label holding one breaks
    the tables that show it, and PostgreSQL text holds no NUL."""
    return next((c for c in text if c < " " or "\x7f" <= c <= "\x9f"), None)
