"""How every command group ends: one JSON document, a rich table, or an error in words."""

from __future__ import annotations

import sys
from typing import Any, NoReturn

import typer


def say_error(message: str) -> None:
    """One `error: message` line on stderr: how every command reports what went wrong."""
    typer.echo(f"error: {message}", err=True)


def fail(message: str, code: int = 2) -> NoReturn:
    """Say the error and exit with `code` (2: the call was wrong, 1: the world was, e.g. a
    warehouse in use)."""
    say_error(message)
    raise typer.Exit(code)


def print_json(value: Any) -> None:
    """One indented JSON document on stdout (non-string keys and odd values as text)."""
    import orjson

    sys.stdout.write(orjson.dumps(value, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS,
                                  default=str).decode() + "\n")


def stdout_console():
    """A rich console; piped output gets a wide page so ids and values are never cut."""
    from rich.console import Console

    return Console() if sys.stdout.isatty() else Console(width=200)
