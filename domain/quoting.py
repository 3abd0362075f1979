"""The domain's words for an agent's values as Python 3.11 writes them, on every Python: `repr` of
what the agent sent, and the number a submitted text spells (domain.unicode14 says why)."""

from __future__ import annotations

from bisect import bisect_right

from domain.unicode14 import DIGIT_ZEROS, NOT_PRINTABLE


def printable(char: str) -> bool:
    """`char.isprintable()` as Python 3.11 answers it."""
    return bisect_right(NOT_PRINTABLE, ord(char)) % 2 == 0


def _escaped(char: str) -> str:
    code = ord(char)
    if printable(char):
        return char
    if code <= 0xFF:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def shown(value: object) -> str:
    """`repr(value)`, with each character Python 3.11 would not print escaped as it escapes it.

    Only characters another version prints raw need it: the printable set only grows, so what
    this Python escapes 3.11 escaped too, and every raw non-ASCII character lies in a string.
    """
    text = repr(value)
    if text.isascii():
        return text
    return "".join(c if c < "\x80" else _escaped(c) for c in text)


def number_text(text: str) -> str | None:
    """`text` with the decimal digits of any script spelled in ASCII, as `float` reads them on
    Python 3.11; None when it holds a character 3.11's `float` refuses (a later Python reads
    digits of scripts 3.11 does not know, and a submission must pass or fail alike on both)."""
    if text.isascii():
        return text
    spelled = []
    for char in text:
        if char < "\x80" or char.isspace():
            spelled.append(char)
            continue
        code = ord(char)
        index = bisect_right(DIGIT_ZEROS, code) - 1
        if index < 0 or code - DIGIT_ZEROS[index] > 9:
            return None
        spelled.append(str(code - DIGIT_ZEROS[index]))
    return "".join(spelled)
