"""How every command group ends: one JSON document, a rich table, or an error in words."""

from __future__ import annotations

import io
import os
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
    """One indented JSON document on stdout (non-string keys and odd values as text).

    An integer past 64 bits (DuckDB's HUGEINT, say `sum` over UBIGINT) stops orjson; JSON itself
    has no such limit, so the standard library writes that document, numbers exact.
    """
    import orjson

    try:
        text = orjson.dumps(value, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS, default=str).decode()
    except TypeError as exc:
        if "64-bit" not in str(exc):
            raise
        import json

        text = json.dumps(_as_orjson_would(value), indent=2, ensure_ascii=False, allow_nan=False)
    sys.stdout.write(text + "\n")


def _as_orjson_would(value: Any) -> Any:
    """`value` in the JSON types, written as orjson writes it (NaN and infinities as null, dates
    in ISO form, other odd values as text), integers of any size kept: the standard library's
    writer then gives the same document orjson would, had it taken big integers."""
    import datetime
    import math

    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k if isinstance(k, str) else str(k): _as_orjson_would(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_as_orjson_would(v) for v in value]
    if isinstance(value, datetime.date | datetime.time):
        return value.isoformat()
    return str(value)


def stdout_console():
    """A rich console that prints text literally: what it shows is stored text (agent names,
    actions, ids) that anyone can set, so "[/]" or ":x:" must not be read as markup or emoji.
    Piped output gets a wide page so ids and values are never cut."""
    from rich.console import Console

    literal = {"markup": False, "emoji": False, "highlight": False}
    return Console(**literal) if sys.stdout.isatty() else Console(width=200, **literal)


class OutputFailed(OSError):
    """Stdout refused a write (a full disk, an I/O error): the output, not the command, failed."""


class _OutputFile(io.FileIO):
    """Stdout's file descriptor, telling its own write failures apart from every other OSError.

    A closed pipe stays BrokenPipeError: rich and Python's own recipe handle that one quietly.
    """

    def write(self, data) -> int | None:
        try:
            return super().write(data)
        except BrokenPipeError:
            raise
        except OSError as exc:
            raise OutputFailed(exc.errno, exc.strerror) from None


def guard_stdout() -> None:
    """Route sys.stdout through `_OutputFile`, keeping its encoding and buffering."""
    old = sys.stdout
    if old is None or not hasattr(old, "fileno"):
        return
    try:
        fd = old.fileno()
    except (OSError, ValueError):  # stdout is not a file (e.g. a test's capture)
        return
    old.flush()
    raw = _OutputFile(fd, "w", closefd=False)
    sys.stdout = io.TextIOWrapper(io.BufferedWriter(raw), encoding=old.encoding,
                                  errors=old.errors, line_buffering=old.line_buffering)


def discard_stdout() -> None:
    """Point stdout at /dev/null once it has failed, so the flush at exit does not fail again
    (the recipe Python's docs give for a closed pipe)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
