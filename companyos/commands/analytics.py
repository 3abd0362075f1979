"""`companyos analytics ...`: the DuckDB warehouse from the command line.

Every command first syncs what is new in the store, so an answer is never stale. The work lives
in `analytics/`; this module parses options, draws a progress bar (only on a terminal) and prints.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import typer

from companyos.commands.options import DbOption, named_path
from companyos.commands.output import (
    csv_text,
    fail,
    print_json,
    say_waiting,
    sigterm_as_ctrl_c,
    stdout_console,
)
from companyos.config import resolve_db

if TYPE_CHECKING:
    from analytics.sync import SyncResult
    from analytics.sync_progress import Progress
    from analytics.warehouse import Warehouse
    from eventstore import EventStore

T = TypeVar("T")

analytics_app = typer.Typer(help="Failure-mode analytics: a DuckDB warehouse fed from the store.",
                            no_args_is_help=True)

WarehouseOption = typer.Option(None, "--warehouse", parser=named_path,
                               help="DuckDB file of the warehouse (default: beside a SQLite store, "
                                    "x/companyos.db -> x/companyos.duckdb; ./<database>.duckdb for "
                                    "PostgreSQL).")
FormatOption = typer.Option("table", "--format", "-f", help="table, json (a list of row objects) or csv.")


def register(app: typer.Typer) -> None:
    app.add_typer(analytics_app, name="analytics")


@contextmanager
def _store(db: str | None) -> Iterator[tuple[str, EventStore]]:
    """The store's URL and the store, open: opened before the warehouse, so a --db that names no
    store leaves no warehouse file behind (StoreUnavailable is the CLI's `error:` line, exit 2)."""
    from analytics.stores import UnsyncableStore
    from analytics.sync import open_store

    url = resolve_db(db)
    try:
        store = open_store(url, create=False)
    except UnsyncableStore as exc:
        fail(str(exc))
    try:
        yield url, store
    finally:
        store.close()


def _open_synced(db: str | None, warehouse: Path | None, quiet: bool = False) -> Warehouse:
    """Sync, then hand back the warehouse open read-only (the caller closes it).

    Every command after the sync only reads, and the tables are a projection the sync owns: a
    statement that wrote would leave them disagreeing with the checkpoint. DuckDB opens a file
    one way per process, so the synced warehouse is closed and reopened read-only.
    """
    from analytics.sync import sync, warehouse_path
    from analytics.warehouse import Warehouse, WarehouseError, open_for_sync

    with _store(db) as (url, store):
        path = warehouse_path(url, warehouse)
        try:
            with _progress_bar(quiet) as progress, open_for_sync(path, follow=progress) as wh:
                _say_waiting(sync(url, wh, progress=progress, store=store))
            return Warehouse(path, read_only=True)
        except WarehouseError as exc:
            _warehouse_failed(exc)


def _say_waiting(result: SyncResult) -> None:
    if result.waiting:
        say_waiting(result.checkpoint, "events", "in the warehouse", "ask")


def _warehouse_failed(exc: Exception) -> NoReturn:
    """A --warehouse that cannot hold a warehouse is a wrong call (2); busy or another store's, 1."""
    from analytics.warehouse import WarehousePathError

    fail(str(exc), 2 if isinstance(exc, WarehousePathError) else 1)


@contextmanager
def _progress_bar(quiet: bool) -> Iterator[Progress]:
    """How far a sync got, as a bar on a terminal: this command's sync, and before it another
    process's sync of the same warehouse, which the command waits for (however long it takes).
    Around it, SIGTERM stops the sync as Ctrl-C does (its last whole batch kept)."""
    with sigterm_as_ctrl_c():
        if quiet or not sys.stderr.isatty():
            yield lambda done, total: None
            return
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        with Progress(TextColumn("syncing events"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                      console=Console(stderr=True), transient=True) as bar:
            job = bar.add_task("sync", total=None)
            yield lambda done, total: bar.update(job, completed=done, total=total)


def _interruptible(wh: Warehouse, work: Callable[[], T]) -> T:
    """`work` (queries on `wh`) on a thread of its own, so that Ctrl-C, and SIGTERM, stop it. A
    signal reaches Python between bytecodes of the main thread only, and DuckDB checks for it only
    now and then: a cross join went on for ever after Ctrl-C, 3 times in 4. The main thread waits,
    and when interrupted asks DuckDB to stop, then ends as Ctrl-C ends any command."""
    import threading
    from concurrent.futures import Future, wait

    answer: Future[T] = Future()  # not Thread.join: once interrupted, 3.11's join returns at once

    def run() -> None:
        try:
            answer.set_result(work())
        except BaseException as exc:  # raised in the main thread by answer.result()
            answer.set_exception(exc)

    with sigterm_as_ctrl_c():
        threading.Thread(target=run, name="analytics-query", daemon=True).start()
        try:
            return answer.result()  # a signal ends the wait (POSIX), not the query
        except KeyboardInterrupt:
            wh.con.interrupt()
            # DuckDB stops at once; a thread still in it as the interpreter exits aborts the process
            wait([answer], timeout=30)
            raise


@analytics_app.command("sync")
def sync_command(
    db: str | None = DbOption,
    warehouse: Path | None = WarehouseOption,
    rebuild: bool = typer.Option(False, "--rebuild", help="Forget the warehouse and read the store "
                                 "from the start."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON document."),
) -> None:
    """Bring the warehouse up to date with the store (incremental, resumable)."""
    from analytics.sync import sync, warehouse_path
    from analytics.warehouse import WarehouseError, open_for_sync

    with _store(db) as (url, store):
        path = warehouse_path(url, warehouse)
        try:
            with _progress_bar(as_json) as progress, open_for_sync(path, follow=progress) as wh:
                if rebuild:
                    wh.reset()
                result = sync(url, wh, progress=progress, store=store)
                counts = wh.counts()
        except WarehouseError as exc:
            _warehouse_failed(exc)
    _say_waiting(result)
    document = {"events_synced": result.events, "episodes_written": result.episodes,
                "batches": result.batches, "seconds": round(result.seconds, 3),
                "events_per_s": round(result.events_per_s), "checkpoint": result.checkpoint,
                "waiting": result.waiting, "reader": result.source, "warehouse": str(path),
                "tables": counts}
    if as_json:
        print_json(document)
        return
    typer.echo(f"synced {result.events} events in {result.seconds:.2f}s ({result.events_per_s:,.0f} "
               f"events/s, reader {result.source}); checkpoint {result.checkpoint}")
    typer.echo("warehouse " + document["warehouse"] + ": " +
               ", ".join(f"{n} {t}" for t, n in counts.items()))


@analytics_app.command("query")
def query_command(
    name: str | None = typer.Argument(None, help="A named query; omit it to list them."),
    param: list[str] | None = typer.Option(None, "--param", "-p", help="NAME=VALUE, repeatable."),
    fmt: str = FormatOption,
    db: str | None = DbOption,
    warehouse: Path | None = WarehouseOption,
) -> None:
    """Answer a named question (see `companyos analytics query` for the list)."""
    from analytics import named
    from analytics.report import listed

    _check_format(fmt)
    if name is None:
        if param:  # a forgotten name: the list would pass for an answer, the parameter dropped
            fail(f"--param needs a query name: `companyos analytics query NAME --param ...`; "
                 f"known queries: {', '.join(named.registry())}")
        _print_catalogue(fmt)
        return
    try:
        query = named.get(name)
        bound = query.bind(named.parse_assignments(param))
    except named.QueryError as exc:
        fail(str(exc))
    wh = _open_synced(db, warehouse, quiet=fmt != "table")

    def answer() -> tuple[list[str], list[tuple], list[int]]:
        cursor = wh.con.execute(query.sql, bound)
        rows = cursor.fetchall()
        return [d[0] for d in cursor.description], rows, _versions_pooled(wh, name, bound) if rows else []

    try:
        names, rows, pooled = _interruptible(wh, answer)
    finally:
        wh.close()
    _print_rows(names, rows, fmt, title=f"{name}: {query.description}")
    if len(pooled) > 1:  # as the report says it: rates over two rule sets compare unlike things
        typer.echo(f"note: the finished episodes matching these filters were judged by rules versions "
                   f"{listed(map(str, pooled))}, which count success and mistakes differently, "
                   "and this query counts them together: `-p rules=V` keeps one", err=True)
    if name == "pass_at_k" and rows and not any(row[names.index("instances")] for row in rows):
        k = bound["k"]
        typer.echo("note: no instance (agent, task, seed, chaos, step budget, reward profile, rules "
                   f"version) has {k} trials, so every row is empty: run the same seeds {k} times "
                   "(`companyos run --seed S` again), or ask for a smaller k", err=True)
    if name == "head_to_head" and not rows:  # "(no rows)" alone read as a broken query
        agent, other = bound["agent"], bound["other"]
        why = (f"agent and other both name {agent!r}: an agent is not compared with itself"
               if agent == other else
               f"{agent!r} and {repr(other) if other else 'any other agent'} ran no instance (task, "
               "seed, chaos, step budget, reward profile, rules version) in common among the "
               "finished episodes these filters keep: run them on the same seeds (`companyos run "
               "--seed S`) to compare them seed by seed")
        typer.echo(f"note: {why}", err=True)


def _versions_pooled(wh: Warehouse, name: str, bound: dict[str, Any]) -> list[int]:
    """The rules versions of the finished episodes the query's other filters keep, when it could
    narrow to one (it takes `rules`), was not asked to, and does not tell them apart itself
    (`compare_agents` gives each agent's versions; `head_to_head` pairs instances within one
    version); else none."""
    if name in ("compare_agents", "head_to_head") or "rules" not in bound or bound["rules"] is not None:
        return []
    from analytics.report import rules_versions

    return rules_versions(wh, bound)


@analytics_app.command("sql")
def sql_command(
    statement: str = typer.Argument(..., help="SQL over events, episodes, steps and rewards."),
    fmt: str = FormatOption,
    db: str | None = DbOption,
    warehouse: Path | None = WarehouseOption,
) -> None:
    """Ad-hoc SQL against the warehouse, read-only (local only: the HTTP API runs named queries only)."""
    import duckdb

    from analytics import adhoc
    from analytics.service import run_sql

    _check_format(fmt)
    try:
        adhoc.check(statement)  # a wrong call is said before the sync, not after it
    except adhoc.SqlRefused as exc:
        fail(str(exc))
    wh = _open_synced(db, warehouse, quiet=fmt != "table")
    try:
        names, rows = _interruptible(wh, lambda: run_sql(wh, statement))
    except duckdb.Error as exc:
        fail(_read_only_hint(adhoc.one_line(str(exc))))
    finally:
        wh.close()
    _print_rows(names, rows, fmt)


READ_ONLY_REFUSAL = "which is attached in read-only mode"
"""DuckDB's words when a statement would write the read-only warehouse (not any "read-only")."""


def _read_only_hint(message: str) -> str:
    """DuckDB's refusal to write, with why: the warehouse is rebuilt from the store, never edited."""
    from analytics.adhoc import WRITES

    if READ_ONLY_REFUSAL in message:
        return f"{message} ({WRITES})"
    return message


def _not_a_report(path: Path) -> str | None:
    """Why `path` must not be overwritten by a report, or None. A mistyped or tab-completed name
    overwrote the event store itself (or the warehouse) with HTML, every episode gone."""
    import stat

    try:
        mode = path.stat().st_mode
    except OSError:  # none yet; or unreadable, a symlink loop: writing says what is wrong
        return None
    if stat.S_ISDIR(mode):  # the caller's path, as for --warehouse and export (it was the world's, 1)
        return "it is a directory"
    if not stat.S_ISREG(mode):  # a device or a pipe is written through (_write_report), never read
        return None
    try:
        with path.open("rb") as existing:
            head = existing.read(512)
    except OSError:
        return None
    if not head.strip():  # `mktemp --suffix .html` makes one; a lock file is one too
        # the name of the file a report would replace: a link named .html to a lock file replaced it
        if Path(os.path.realpath(path)).suffix.lower() in (".html", ".htm"):
            return None
        return "it is an empty file not named .html (a lock file, say), which a report would replace"
    if head.startswith(b"SQLite format 3\0") or head[8:12] == b"DUCK":
        return "it is a database (the event store, or a warehouse), which a report would overwrite"
    from analytics.report import is_report

    if not is_report(head):  # a hand-written page was as lost as any other file
        return "it is a file that is no report of this command, which a report would overwrite"
    return None


def _write_report(target: Path, page: str) -> None:
    """The page into `target`: a file whole or not at all (an interrupted write left half a page in
    place of the last one; through a symlink, the file it names is replaced, not the link); a
    device or a pipe (`/dev/stdout`, a FIFO) written through, as a shell's `>` writes it (replacing
    one put a plain file in place of /dev/null)."""
    import stat

    final = Path(os.path.realpath(target)) if target.is_symlink() else target  # a loop: as is
    try:
        special = not stat.S_ISREG(final.stat().st_mode)
    except OSError:  # none yet, or a link to itself: a file is made in its place
        special = False
    if special:
        with final.open("w", encoding="utf-8") as stream:
            stream.write(page)
        return
    import uuid

    final.parent.mkdir(parents=True, exist_ok=True)
    # a new file, never one already there (O_EXCL: a link planted at a fixed `.NAME.tmp` was written
    # through, and the rename then put the link in the report's place), with a plain file's mode
    staged = final.with_name(f".{final.name}.{uuid.uuid4().hex[:8]}.tmp")
    handle = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            stream.write(page)
        staged.replace(final)
    finally:
        staged.unlink(missing_ok=True)


@analytics_app.command("report")
def report_command(
    agent: str | None = typer.Option(None, "--agent", help="Only this agent's episodes."),
    task: str | None = typer.Option(None, "--task", help="Only this task family."),
    chaos: str | None = typer.Option(None, "--chaos", help="Only this chaos level (none, low, "
                                     "medium, high or a number in [0, 1])."),
    profile: str | None = typer.Option(None, "--profile", help="Only episodes scored by this reward "
                                       "profile (default or sparse)."),
    rules: int | None = typer.Option(None, "--rules", help="Only episodes judged by this rules "
                                     "version (1, 2, ...)."),
    markdown: bool = typer.Option(False, "--markdown", help="Print the report as Markdown."),
    html: Path | None = typer.Option(None, "--html", parser=named_path,
                                     help="Write a self-contained HTML report with charts ('-': "
                                     "print it)."),
    db: str | None = DbOption,
    warehouse: Path | None = WarehouseOption,
) -> None:
    """The failure-mode report: success by chaos, failure modes, first mistakes, agents, tools."""
    from analytics import report

    if markdown and html:
        fail("choose one of --markdown and --html")
    try:
        report.check_filters(agent, task, chaos, profile, rules)
    except ValueError as exc:
        fail(str(exc))
    to_stdout = html is not None and str(html) == "-"
    if html and not to_stdout and (problem := _not_a_report(html)):
        fail(f"--html {html}: {problem}; name a new file or an earlier report")
    wh = _open_synced(db, warehouse, quiet=markdown or to_stdout)
    try:
        data = _interruptible(wh, lambda: report.build(wh, agent=agent, task=task, chaos=chaos,
                                                        profile=profile, rules=rules))
    finally:
        wh.close()
    if to_stdout:  # `--html - | ...`, as tools take "-": a file named "-" was written instead
        sys.stdout.write(report.to_html(data))
        return
    if html:
        try:
            _write_report(html, report.to_html(data))
        except OSError as exc:
            from analytics.paths import why_not_written

            fail(f"cannot write the report to {html}: {why_not_written(html, exc)}", code=1)
        typer.echo(f"wrote {html} ({report.counted(data['summary']['episodes'], 'episode')}, "
                   f"{data['seconds']:.2f}s)")
        return
    if markdown:
        sys.stdout.write(report.to_markdown(data) + "\n")
        return
    _print_report(data)


@analytics_app.command("export")
def export_command(
    directory: Path = typer.Argument(..., parser=named_path,
                                     help="Target directory (created if missing)."),
    db: str | None = DbOption,
    warehouse: Path | None = WarehouseOption,
) -> None:
    """Write the warehouse as Parquet partitioned by task family (Spark, Trino, another DuckDB)."""
    import duckdb

    from analytics.export import ExportRefused, export
    from analytics.paths import why_not_written

    wh = _open_synced(db, warehouse)
    try:
        manifest = export(wh, directory)
    except ExportRefused as exc:
        fail(str(exc))
    except (OSError, duckdb.IOException) as exc:
        fail(f"cannot export to {directory}: {why_not_written(directory, exc, is_directory=True)}", code=1)
    finally:
        wh.close()
    typer.echo(f"exported to {directory} (store position {manifest['position']}): " +
               ", ".join(f"{t} {m['rows']} rows" for t, m in manifest["tables"].items()))


# -- printing ------------------------------------------------------------------------------------


def _check_format(fmt: str) -> None:
    if fmt not in ("table", "json", "csv"):
        fail(f"--format must be table, json or csv, not {fmt!r}")


def _print_rows(names: list[str], rows: list[tuple], fmt: str, title: str | None = None) -> None:
    from analytics.service import unique_names

    if fmt == "json":
        from analytics.service import as_objects

        print_json(as_objects(names, rows))
        return
    if fmt == "csv":
        import csv

        writer = csv.writer(sys.stdout, lineterminator="\n")
        writer.writerow(unique_names(names))
        for row in rows:
            writer.writerow([csv_text(v) for v in row])
        return
    from rich.table import Table

    table = Table(title=title, title_justify="left")  # stdout_console prints stored text literally
    for n in unique_names(names):
        table.add_column(n, overflow="fold")
    for row in rows[:TABLE_ROWS]:
        table.add_row(*[_text(v, column=n) for n, v in zip(names, row, strict=True)])
    stdout_console().print(table)
    if not rows:
        typer.echo("(no rows)")
    elif len(rows) > TABLE_ROWS:
        typer.echo(f"({len(rows) - TABLE_ROWS:,} more rows not shown: --format csv or json prints all "
                   f"{len(rows):,})")


TABLE_ROWS = 1_000
"""Rows a terminal table shows: a table is for reading, and laying out 20,000 rows took 90 s and
400 MB before the first line appeared (CSV prints them in 2 s)."""


def _text(value: Any, short: bool = False, column: str = "") -> str:
    """A table cell: the text CSV and JSON give, not Python's repr (`b'..'`, `None` in a list,
    `datetime.datetime(...)` in a struct)."""
    if value is None:
        return ""
    if isinstance(value, list):
        items = ["NULL" if v is None else _text(v) for v in value]
        if short:  # episode ids in a terminal report: enough to grep for, not a wall of hex
            items = [v if len(v) <= 14 else v[:12] + "…" for v in items]
        return ", ".join(items)
    if isinstance(value, float):
        from analytics.report import KEY_NUMBER_COLUMNS, number_text
        from domain.chaos import level_text

        return level_text(value) if column in KEY_NUMBER_COLUMNS else number_text(value)
    return csv_text(value)


def _print_catalogue(fmt: str) -> None:
    """The named queries: JSON as `GET /analytics` serves it, CSV a row per query and parameter
    (a query without any has one row with an empty parameter), or a listing with `--param` usage."""
    from analytics import named, service

    if fmt == "json":
        print_json(service.describe())
        return
    if fmt == "csv":
        columns = ("name", "type", "required", "default", "min", "max", "description")
        none = dict.fromkeys(columns)
        _print_rows(["query", "description", *(f"param_{c}" for c in columns)],
                    [(q["name"], q["description"], *(p[c] for c in columns))
                     for q in service.describe() for p in q["params"] or [none]], "csv")
        return
    for q in named.registry().values():
        typer.echo(f"{q.name}\n    {q.description}")
        for p in q.params:
            typer.echo(f"    --param {p.name}=<{p.type.lower()}>  ({p.terms()}) {p.doc}")


def _print_report(data: dict) -> None:
    from rich.table import Table

    from analytics.report import report_title, sections, summary_line

    console = stdout_console()
    console.print(report_title(data), style="bold")  # literal: the title holds the --agent filter
    console.print(summary_line(data["summary"]))
    if note := data["notes"].get("summary"):
        console.print(note, markup=False)
    for title, rows, before, after in sections(data, with_charts=False):
        apart = not rows or bool(before)  # the title above a note said before the table
        if apart:
            console.print(title, style="italic", markup=False)
        if before:
            console.print(before, markup=False)
        if rows:
            table = Table(title=None if apart else title, title_justify="left")
            for c in rows[0]:
                table.add_column(c, overflow="fold")
            for r in rows:
                table.add_row(*[_text(v, short=True, column=c) for c, v in r.items()])
            console.print(table)
        if after:
            console.print(after, markup=False)
