"""Options shared by every command group."""

from __future__ import annotations

import typer

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


EpisodeArgument = typer.Argument(..., help="Episode id (its stream id).", callback=utf8_text)
