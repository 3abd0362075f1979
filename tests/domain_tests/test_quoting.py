"""What the domain writes of an agent's text is the same bytes on every Python: Python's own
Unicode tables change with its version (3.12 prints emoji 3.11 escapes and reads digits 3.11
refuses), so an episode logged on one did not rerun on another, and could even end otherwise."""

from __future__ import annotations

import unicodedata

import pytest

from domain import EpisodeSpec, reset, step
from domain.events import ActionRejected
from domain.outcomes import same
from domain.quoting import number_text, printable, shown

PYTHON_311_UNICODE = "14.0.0"


def test_the_frozen_printable_table_is_python_3_11s_and_later_pythons_only_add_to_it():
    """On 3.11 the table is `str.isprintable` exactly, so logs written before it are unchanged;
    on a later Python every character 3.11 prints is printable still (what `shown` relies on)."""
    frozen = [printable(chr(code)) for code in range(0x110000)]
    if unicodedata.unidata_version == PYTHON_311_UNICODE:
        assert frozen == [chr(code).isprintable() for code in range(0x110000)]
    else:
        assert all(chr(code).isprintable() for code in range(0x110000) if frozen[code])


def test_shown_is_repr_with_what_3_11_escapes_escaped():
    assert shown("renew") == repr("renew") and shown("it's") == '"it\'s"'
    assert shown("café ☕") == "'café ☕'"  # printable in Unicode 14: as it is
    # U+1FAE8 came with Unicode 15: 3.12 prints it, 3.11 escaped it, as the log keeps it
    assert shown("\U0001fae8") == "'\\U0001fae8'"
    assert shown({"v": ["\U0001fae8", 7, None]}) == "{'v': ['\\U0001fae8', 7, None]}"
    assert shown("tab\t\x00\ud800") == repr("tab\t\x00\ud800")


@pytest.mark.parametrize("text, spelled", [
    ("1,250.50", "1,250.50"),
    ("١٢٥٠", "1250"),  # Arabic-Indic digits, which 3.11's float reads
    ("１２", "12"),  # full-width
    ("\U0001e4f1\U0001e4f2", None),  # Nag Mundari (Unicode 15): 3.12's float reads it, 3.11's not
    ("12 €", None),
])
def test_a_submitted_number_is_read_as_python_3_11_reads_it(text, spelled):
    assert number_text(text) == spelled


def test_digits_a_later_python_knows_do_not_change_an_outcome():
    """The expert's amount spelled in Nag Mundari digits: on 3.11 a mismatch, on 3.12 a match,
    so one logged episode ended otherwise when re-simulated on the other."""
    assert same("\U0001e4f1\U0001e4f2\U0001e4f3", 123) is False
    assert same("١٢٣", 123) is True and same(" 1,234.5 ", 1234.5) is True


def test_a_rejection_quoting_new_unicode_is_the_same_text_on_every_python():
    state = reset(EpisodeSpec("vendor_onboarding", 2, "none"))[0]
    _, events, _ = step(state, {"app": "ticketdesk", "method": "get_ticket",
                                "params": {"ticket_id": "T-\U0002ebf0\U0001fae8"}})
    reason = next(e for e in events if type(e) is ActionRejected).reason
    assert "No ticket 'T-\\U0002ebf0\\U0001fae8'." in reason
