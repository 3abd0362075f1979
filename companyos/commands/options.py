"""Options shared by every command group."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import typer


def seconds(lo: float, hi: float) -> Callable[[str | float], float]:
    """A parser of a number of seconds in [lo, hi]: `nan` was refused by Typer's own range check
    with the words of a bound it does not break ("Input should be less than or equal to 3600")."""

    def parse(value: str | float) -> float:
        try:
            number = float(value)
        except ValueError:
            raise typer.BadParameter(f"{value!r} is not a number of seconds") from None
        if not lo <= number <= hi:  # nan included: it compares false with every bound
            raise typer.BadParameter(f"must be a number of seconds from {lo:,} to {hi:,}, not {value}")
        return number

    return parse


DbOption = typer.Option(None, "--db", help="SQLAlchemy URL of the store (default: $COMPANYOS_DB "
                        "or sqlite:///companyos.db)")
JsonOption = typer.Option(False, "--json", help="Print one JSON document instead of tables.")


def utf8_text(value: str | None) -> str | None:
    """Command-line text the store can hold: bytes that are not UTF-8 reach Python as lone
    surrogates, which no stored id or name has and no database driver accepts."""
    if value is not None:
        try:
            value.encode()
        except UnicodeEncodeError:
            shown = value.encode("utf-8", "backslashreplace").decode()
            raise typer.BadParameter(f"'{shown}' is not UTF-8 text") from None
    return value


def named_path(value: str) -> Path:
    """A path the user named, `~` expanded as a shell would (a quoted `'~/x'` reached DuckDB, which
    expands it, and Python, which did not: two places for one name). An empty one (usually an unset
    shell variable) would otherwise be the current directory: an export or report written there, a
    warehouse refused as "."."""
    if not value:
        raise typer.BadParameter("is empty (an unset shell variable?); name a path")
    return Path(value).expanduser()


def episode_text(value: str) -> str:
    """An episode id a stream can have: UTF-8, not empty, at most the store's length (the store's
    own check of `""` or a 201-character id was a traceback)."""
    from eventstore.records import MAX_STREAM_ID_LENGTH

    utf8_text(value)
    if not value:
        raise typer.BadParameter("an episode id cannot be empty")
    if len(value) > MAX_STREAM_ID_LENGTH:
        raise typer.BadParameter(f"no episode id is longer than {MAX_STREAM_ID_LENGTH} characters "
                                 f"(this one has {len(value)})")
    return value


EpisodeArgument = typer.Argument(..., help="Episode id (its stream id).", callback=episode_text)
