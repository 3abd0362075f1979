"""The `companyos` command line: run agents, serve them, replay and analyse what they did."""

from __future__ import annotations

import typer

from companyos.commands.options import DbOption
from companyos.config import resolve_db

app = typer.Typer(help="CompanyOS: an event-sourced RL environment of messy enterprise workflows.",
                  no_args_is_help=True, add_completion=False)
db_app = typer.Typer(help="Database maintenance.", no_args_is_help=True)
app.add_typer(db_app, name="db")


@db_app.command("upgrade")
def db_upgrade(db: str | None = DbOption) -> None:
    """Create the store or bring it to the newest migration."""
    from eventstore import EventStore
    from eventstore.migrate import HEAD_REVISION
    from eventstore.store import shown_url

    url = resolve_db(db)
    EventStore.open(url).close()
    typer.echo(f"{shown_url(url)}: at migration {HEAD_REVISION}")


def _register_commands() -> None:
    """Each area of the product adds its commands from its own module."""
    import importlib

    for name in COMMAND_MODULES:
        importlib.import_module(f"companyos.commands.{name}").register(app)


# Modules under companyos/commands/ whose `register(app)` adds commands to `companyos`.
COMMAND_MODULES: tuple[str, ...] = ("run", "projections", "serve", "analytics")


def main() -> None:
    import sys

    from companyos.commands.output import (
        OutputFailed,
        discard_stdout,
        guard_stdout,
        hold_closed_std_fds,
        say_error,
    )

    hold_closed_std_fds()
    _register_commands()
    guard_stdout()
    quiet_library_logs()
    try:
        try:
            app()
        finally:
            sys.stdout.flush()  # what the buffer still holds fails here, not at exit
    except BrokenPipeError:  # the reader left (`| head`): stop quietly, as Unix tools do
        discard_stdout()
        raise SystemExit(1) from None
    except OutputFailed as exc:  # e.g. `> file` on a full disk: say so, not a traceback
        discard_stdout()
        say_error(f"cannot write the output: {exc.strerror}")
        raise SystemExit(1) from None
    except SystemExit as exc:
        if _ctrl_c(exc):  # Typer's own silent answer to Ctrl-C, said in words
            say_error("interrupted")
        raise
    except Exception as exc:
        if _interrupted(exc):
            say_error("interrupted")
            raise SystemExit(130) from None
        failure = store_failure(exc)
        if failure is None:
            raise
        say_error(failure[0])
        raise SystemExit(failure[1]) from None


def store_failure(exc: BaseException) -> tuple[str, int] | None:
    """The error line a store's failure is said with (its notes included) and the exit code: 2 for
    a bad --db, the user's input; 1 for the world's fault (a server that does not answer, a damaged
    log, a lost database). None: not the store's failure."""
    from companyos.commands.output import with_notes
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


def quiet_library_logs() -> None:
    """Keep libraries' log records off stderr: the command says what failed in one `error:` line.

    SQLAlchemy's pool logs, with a traceback, each connection it fails to reset after a database
    server went away; with no handler configured, Python printed those records (some 40 lines)
    above the command's own line.
    """
    import logging

    for library in ("sqlalchemy.pool", "psycopg"):  # psycopg: "error ignored terminating ..."
        logging.getLogger(library).addHandler(logging.NullHandler())


def _ctrl_c(exc: SystemExit) -> bool:
    """Typer turns a KeyboardInterrupt no command handled into `Exit(130) from` it (a command
    that says more about its interruption exits 130 itself)."""
    raised = exc.__context__
    return exc.code == 130 and raised is not None and isinstance(raised.__cause__, KeyboardInterrupt)


def _interrupted(exc: BaseException) -> bool:
    """A Ctrl-C that something caught first and raised as another error: Python 3.11 wraps one
    that lands while a class is made (a lazy import of pydantic) in a RuntimeError about
    `__set_name__`; DuckDB raises its InterruptException, or a RuntimeError when the signal lands
    while it scans Arrow data from Python; also when cleaning up after it failed in turn (an
    aborted transaction refusing to unregister a table), hiding it as the context."""
    import sys

    duckdb = sys.modules.get("duckdb")  # consulted only when loaded
    seen: set[int] = set()
    link: BaseException | None = exc
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        if isinstance(link, KeyboardInterrupt):
            return True
        if duckdb is not None and (isinstance(link, duckdb.InterruptException) or (
                type(link) is RuntimeError and str(link) == "Query interrupted")):
            return True
        link = link.__cause__ or link.__context__
    return False


def _store_error(exc: BaseException) -> bool:
    """A database error from the store (a read-only or damaged file, a lost server): the world's
    fault, not the call's. SQLAlchemy wraps most; the store's raw cursors raise the driver's own.
    psycopg is only consulted when loaded: importing it costs every command 0.14 s."""
    import sqlite3
    import sys

    from sqlalchemy.exc import DBAPIError

    psycopg = sys.modules.get("psycopg")
    return isinstance(exc, DBAPIError | sqlite3.Error) or (
        psycopg is not None and isinstance(exc, psycopg.Error))
