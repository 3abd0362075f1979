"""How every command group ends: one JSON document, a rich table, or an error in words."""

from __future__ import annotations

import codecs
import errno
import io
import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, NoReturn

import typer


def _stop(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


@contextmanager
def sigterm_as_ctrl_c() -> Iterator[None]:
    """SIGTERM (`timeout`, `docker stop`, systemd) stops the block as Ctrl-C does: the command says
    `error: interrupted` and exits 130, leaving what Ctrl-C leaves, where it died in silence (143).
    Forked workers put SIGTERM back to its default (projections.parallel), so stopping them works."""
    if threading.current_thread() is not threading.main_thread():  # signals reach the main thread
        yield
        return
    previous = signal.signal(signal.SIGTERM, _stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def error_line(message: str) -> str:
    """An error's words on one line: a driver's words can span lines, as libpq's do, and are
    joined into the one; control characters left are written as escapes (a damaged file's bytes
    reached the terminal raw in SQLite's words)."""
    from domain.labels import visible_controls

    return visible_controls(" ".join(message.split()))


def say_error(message: str) -> None:
    """One `error: message` line on stderr: how every command reports what went wrong."""
    typer.echo(f"error: {error_line(message)}", err=True)


def with_notes(message: str, exc: BaseException) -> str:
    """`message` followed by the notes a command added to `exc` (`add_note`: what it had done
    before the error, say), so they are said in the error's one line."""
    return "; ".join([message, *getattr(exc, "__notes__", ())])


def say_waiting(upto: int, what: str, where: str, again: str) -> None:
    """A note on stderr (JSON on stdout stays whole) that what the answer holds stops at `upto`:
    `what` logged after it waits behind an older transaction (PostgreSQL). Without it, episodes a
    run had just logged were silently missing from lists and analytics, while `verify` said why."""
    typer.echo(f"note: {what} logged after position {upto} are not {where} yet: a transaction "
               f"older than them is still running ({again} again once it ends)", err=True)


def fail(message: str, code: int = 2) -> NoReturn:
    """Say the error and exit with `code` (2: the call was wrong, 1: the world was, e.g. a
    warehouse in use)."""
    say_error(message)
    raise typer.Exit(code)


def print_json(value: Any) -> None:
    """One indented JSON document on stdout: decimals (DuckDB's DECIMAL, `avg` over one) and
    integers past 64 bits (its HUGEINT, `sum` over UBIGINT) as exact numbers, other values JSON
    lacks (dates, UUIDs) as text."""
    import orjson

    # dates and times as text written as SQL and the CSV write them (orjson's own has a `T`)
    option = orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS | orjson.OPT_PASSTHROUGH_DATETIME
    try:
        text = orjson.dumps(value, option=option, default=_json_default)
    except TypeError as exc:  # orjson stops at 64 bits; JSON itself has no limit
        if "64-bit" not in str(exc):
            raise
        text = orjson.dumps(_big_ints_as_numbers(value), option=option, default=_json_default)
    if _encodes_everything(sys.stdout) or not hasattr(sys.stdout, "buffer"):
        sys.stdout.write(text.decode() + "\n")
    else:  # JSON is UTF-8 (RFC 8259), whatever the terminal's encoding (as `run --json` writes it)
        sys.stdout.flush()
        sys.stdout.buffer.write(text + b"\n")


def _encodes_everything(stream: Any) -> bool:
    """Whether `stream` can write any text: a UTF encoding, not a legacy locale's (latin-1)."""
    try:
        return codecs.lookup(stream.encoding or "utf-8").name.startswith("utf")
    except (AttributeError, LookupError):
        return False


def _json_default(value: Any) -> Any:
    """What orjson cannot write itself: a finite Decimal as the number it is (not a float's
    rounding of it, nor text), a NaN or infinite one as null (as orjson writes such floats);
    other values as text (`value_text`)."""
    import decimal

    import orjson

    if isinstance(value, decimal.Decimal):
        return orjson.Fragment(str(value)) if value.is_finite() else None
    return value_text(value)


def csv_text(value: Any) -> str:
    """A CSV cell a reader parses back where Python's str would not: booleans `true`/`false` (as
    DuckDB writes them), lists joined by `;`, structs and maps as JSON, other values JSON lacks as
    `value_text` says."""
    import decimal

    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return ";".join(csv_text(v) for v in value)
    if isinstance(value, dict):
        return json_text(value)
    if isinstance(value, int | float | str | decimal.Decimal):
        return str(value)
    return value_text(value)


def json_text(value: Any) -> str:
    """A struct or map as one line of JSON, its dates and times as SQL writes them (orjson's own
    have a `T`, unlike the same values outside a struct)."""
    import orjson

    option = orjson.OPT_NON_STR_KEYS | orjson.OPT_PASSTHROUGH_DATETIME
    return orjson.dumps(value, default=_json_default, option=option).decode()


def value_text(value: Any) -> str:
    """A value JSON and CSV have no type for, as text a reader can parse: an interval as ISO 8601
    (`P3DT1.5S`, not Python's "3 days, 0:00:01.500000"), a blob as DuckDB writes one (`\\x00\\xFF`,
    not Python's b'...'), anything else (dates, times, UUIDs) as its own str."""
    import datetime

    if isinstance(value, datetime.timedelta):
        sign = "-" if value < datetime.timedelta(0) else ""
        value = abs(value)
        seconds = f"{value.seconds}.{value.microseconds:06d}".rstrip("0").rstrip(".")  # exact
        return f"{sign}P{value.days}DT{seconds}S"
    if isinstance(value, bytes | bytearray | memoryview):
        return "".join(chr(b) if 32 <= b < 127 and b != 92 else f"\\x{b:02X}" for b in bytes(value))
    return str(value)


def _big_ints_as_numbers(value: Any) -> Any:
    """`value` with every integer outside 64 bits as a raw JSON number: the rest stays as it is,
    so orjson writes the document exactly as it would have, big integers included."""
    import orjson

    if isinstance(value, int) and not isinstance(value, bool) and not -2**63 <= value < 2**64:
        return orjson.Fragment(str(value))
    if isinstance(value, dict):
        return {k: _big_ints_as_numbers(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_big_ints_as_numbers(v) for v in value]
    return value


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


class _ClosedOutput(io.RawIOBase):
    """Stands in for a stdout the command was started without (`>&-`): the first write fails in
    words, as on a full disk; later ones (the flush at exit) go nowhere."""

    def __init__(self) -> None:
        super().__init__()
        self._told = False

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        if not self._told:
            self._told = True
            raise OutputFailed(errno.EBADF, "standard output is closed")
        return len(data)


def hold_closed_std_fds() -> None:
    """Open /dev/null on a standard descriptor the command was started without (`>&-`, `2>&-`):
    else the next file opened takes its number, and output meant for the terminal lands in it
    (the store's database file, say)."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            held = os.open(os.devnull, os.O_RDWR)
            if held != fd:
                os.dup2(held, fd)
                os.close(held)


def guard_stdout() -> None:
    """Route sys.stdout through `_OutputFile`, keeping its encoding and buffering."""
    old = sys.stdout
    if old is None:  # no stdout at start: what the command prints fails as an unwritable one
        sys.stdout = io.TextIOWrapper(io.BufferedWriter(_ClosedOutput()), encoding="utf-8")
        return
    if not hasattr(old, "fileno"):
        return
    try:
        fd = old.fileno()
    except (OSError, ValueError):  # stdout is not a file (e.g. a test's capture)
        return
    old.flush()
    raw = _OutputFile(fd, "w", closefd=False)
    # a character the terminal's encoding lacks (a legacy locale: latin-1) is shown escaped, as
    # Python shows it on stderr, not a UnicodeEncodeError's traceback: stored text is anyone's
    errors = "backslashreplace" if old.errors == "strict" else old.errors
    sys.stdout = io.TextIOWrapper(io.BufferedWriter(raw), encoding=old.encoding,
                                  errors=errors, line_buffering=old.line_buffering)


def discard_stdout() -> None:
    """Point stdout at /dev/null once it has failed, so the flush at exit does not fail again
    (the recipe Python's docs give for a closed pipe)."""
    try:
        fd = sys.stdout.fileno()
    except (OSError, ValueError):  # no descriptor (stdout was closed at start): nothing to point
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)


def store_failure(exc: BaseException) -> tuple[str, int] | None:
    """The error line a store's failure is said with (its notes included) and the exit code: 2 for
    a bad --db, the user's input; 1 for the world's fault (a server that does not answer, a damaged
    log, a lost database). None: not the store's failure."""
    from eventstore import CorruptCommit, StoreUnavailable, StoreUnreachable
    from eventstore.engine import pooler_hint

    if isinstance(exc, StoreUnavailable):
        return with_notes(str(exc), exc), 1 if isinstance(exc, StoreUnreachable) else 2
    if isinstance(exc, CorruptCommit):  # the log was damaged behind the store's back
        return with_notes(f"{exc}; `companyos verify` names every damaged episode", exc), 1
    if not _store_error(exc):
        return None
    hint = pooler_hint(exc) or _missing_read_model_hint(exc)
    return with_notes(f"the store failed: {getattr(exc, 'orig', None) or exc}"
                      + (f"; {hint}" if hint else ""), exc), 1


def _missing_read_model_hint(exc: BaseException) -> str | None:
    """What to do when a read model's table is gone (dropped by hand): the log is intact, and a
    rebuild makes the table again and folds it."""
    from projections.schema import episode_views, episodes

    text = str(getattr(exc, "orig", None) or exc)
    for table in (episodes.name, episode_views.name):
        if text == f"no such table: {table}" or text.startswith(f'relation "{table}" does not exist'):
            return "`companyos rebuild` makes the read model's table again from the log"
    return None


def _store_error(exc: BaseException) -> bool:
    """A database error from the store (a read-only or damaged file, a lost server): the world's
    fault, not the call's. SQLAlchemy wraps most; the store's raw cursors raise the driver's own.
    psycopg is only consulted when loaded: importing it costs every command 0.14 s."""
    import sqlite3

    from sqlalchemy.exc import DBAPIError

    psycopg = sys.modules.get("psycopg")
    return isinstance(exc, DBAPIError | sqlite3.Error) or (
        psycopg is not None and isinstance(exc, psycopg.Error))
