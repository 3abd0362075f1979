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
        store_failure,
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
