"""`episodes`, `replay`, `rerun`, `verify`, `rebuild`: looking at the log, and proving it sound.

Thin wrappers: the work lives in `projections/`; this module parses options, draws progress
bars (only on a terminal) and prints tables or one JSON document.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import typer

from companyos.commands.options import DbOption, EpisodeArgument, JsonOption, seconds, utf8_text
from companyos.commands.output import (
    fail,
    print_json,
    say_error,
    say_waiting,
    sigterm_as_ctrl_c,
    stdout_console,
)
from companyos.config import READ_ONLY_WORDS, read_only_refusal, resolve_db


def register(app: typer.Typer) -> None:
    app.command("episodes")(episodes)
    app.command("replay")(replay)
    app.command("rerun")(rerun)
    app.command("verify")(verify)
    app.command("rebuild")(rebuild)


# -- helpers ---------------------------------------------------------------------------------


def _open(db: str | None):
    from eventstore import EventStore

    return EventStore.open(resolve_db(db), create=False)  # these commands only read the log


@contextmanager
def _progress(total: int, label: str) -> Iterator[Callable[[int], None] | None]:
    """A rich progress bar on stderr when it is a terminal; nothing (None) otherwise. Drawn on
    stdout, its escape codes went into the JSON of `verify --json` run with a terminal for stdout
    whose output was kept (`docker run -t … > file`, `script`). Around the long work it measures,
    SIGTERM stops the command as Ctrl-C does (sigterm_as_ctrl_c)."""
    with sigterm_as_ctrl_c():
        if not sys.stderr.isatty() or total <= 0:
            yield None
            return
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                   TextColumn("events"), TimeRemainingColumn())
        with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
            task = bar.add_task(label, total=total)
            yield lambda n: bar.advance(task, n)


# -- commands --------------------------------------------------------------------------------


def episodes(
    task: str | None = typer.Option(None, "--task", help="Only this task family."),
    agent: str | None = typer.Option(None, "--agent", help="Only episodes run by this agent.",
                                     callback=utf8_text),
    outcome: str | None = typer.Option(None, "--outcome",
                                       help="success, failure, truncated or running."),
    rules: int | None = typer.Option(None, "--rules", help="Only episodes judged by this rules version."),
    failure_mode: str | None = typer.Option(None, "--failure-mode",
                                            help="Only episodes that failed so (see `companyos tasks`)."),
    limit: int = typer.Option(50, "--limit", min=0, max=10**9,
                              help="At most this many, newest first (0: all)."),
    offset: int = typer.Option(0, "--offset", min=0, max=10**12,
                               help="Skip this many of the newest first (the next page)."),
    db: str | None = DbOption,
    as_json: bool = JsonOption,
) -> None:
    """List logged episodes (the read models catch up with the log first)."""
    from projections import ProjectionRunner, default_projections
    from projections.episodes import count_episodes, episode_filters, list_episodes

    try:
        # a wrong filter is told before any catching up
        episode_filters(task, agent, outcome, rules, failure_mode=failure_mode)
    except ValueError as exc:
        fail(str(exc))
    store = _open(db)
    unread = 0
    why_not = None  # why the read models cannot be brought up to date, and where they could be
    try:
        runner = ProjectionRunner(store, default_projections())
        read_only = not store.takes_writes()
        if read_only:
            why_not = _why_read_only(store)
        checkpoints = runner.stored_checkpoints() if read_only else runner.checkpoints()
        behind = min(checkpoints.values())
        waiting = _commits_waiting(store)
        if read_only:  # the read models stay as they are: a list of what
            unread = store.count_events(behind)  # they hold, and a word on what they miss
        else:
            upto = store.last_position()  # what the log holds as asked, however fast it grows
            with _progress(store.count_events(behind, upto), "catching up") as advance:
                runner.catch_up(progress=advance, upto=upto)
        with store.engine.connect() as conn:
            rows = list_episodes(conn, task=task, agent=agent, outcome=outcome, limit=limit or None,
                                 offset=offset, rules=rules, failure_mode=failure_mode)
            total = count_episodes(conn, task=task, agent=agent, outcome=outcome, rules=rules,
                                   failure_mode=failure_mode)
    finally:
        store.close()
    _say_waiting(waiting, "listed", "list")
    if read_only and total and checkpoints["episodes"] == 0:
        # rows at checkpoint 0 are an unfinished rebuild's (or another version's fold): some
        # finished episodes were listed as running, part-way, as if the rows were the log's
        why, fix = why_not
        typer.echo("note: the episode list holds the rows of an unfinished rebuild (still running "
                   "in another process, or interrupted) or of another version's fold, "
                   f"which may be partial, and {why}, which cannot complete it: nothing is listed "
                   f"(list once {fix}, or run `companyos rebuild` so)", err=True)
        rows, total, unread = [], 0, 0
    if unread:
        why, fix = why_not
        typer.echo(f"note: the read models are {unread} events behind the log, and {why}, which cannot "
                   f"bring them up to date: the episodes logged since are not listed (list once {fix})",
                   err=True)
    shown_to = offset + len(rows)
    next_offset = shown_to if shown_to < total else None
    if as_json:  # paged as GET /episodes answers
        print_json({"episodes": rows, "total": total, "limit": limit, "offset": offset,
                    "next_offset": next_offset})
        return
    from rich.table import Table

    from domain.chaos import level_text
    from projections.episodes import UNKNOWN_AGENT  # as the analytics name them, and filter finds them

    table = Table(box=None, header_style="bold")
    for title in ("episode", "task", "seed", "chaos", "rules", "agent", "outcome", "failure mode",
                  "steps", "return", "started"):
        numeric = title in ("seed", "chaos", "rules", "steps", "return")
        table.add_column(title, no_wrap=title == "episode", justify="right" if numeric else "left")
    for r in rows:
        table.add_row(r["episode_id"], r["task"], str(r["seed"]), level_text(r["chaos"]), str(r["rules"]),
                      r["agent"] or UNKNOWN_AGENT, r["outcome"] or "running", r["failure_mode"] or "-",
                      str(r["steps"]), f"{r['total_return']:.2f}", (r["started_at"] or "")[:19])
    stdout_console().print(table)
    if not rows:
        typer.echo("no episodes match" if not total else f"no episodes past the first {total:,} that match")
    elif offset or next_offset is not None:  # a page of them: say which, and how to see more
        more = f"; --offset {next_offset} for the next, --limit 0 for all" if next_offset is not None else ""
        typer.echo(f"episodes {offset + 1:,}–{shown_to:,} of {total:,}{more}")


def _why_read_only(store) -> tuple[str, str]:
    """Why a store takes no writes, and where a listing could bring its read models up to date."""
    if store.engine.dialect.name != "sqlite":
        return ("the database takes no writes (a standby, default_transaction_read_only, or a role "
                "with SELECT grants only)", "as a role that may write, on the primary")
    if not store.file_writable():
        return ("this process may not write the store's file (a read-only file or file system, or "
                "another user's file)", "as a user who may write it")
    return f"the URL {READ_ONLY_WORDS}", "with a URL that may write"


def replay(
    episode: str = EpisodeArgument,
    step: int | None = typer.Option(None, "--step", min=0,
                                    help="Show the world after this step (0: after reset; "
                                         "default: the last step)."),
    db: str | None = DbOption,
    as_json: bool = JsonOption,
) -> None:
    """Time travel: the three apps after step K, with that step's action, result, rewards, chaos.

    Built from the log alone: the recorded events are folded, nothing is simulated.
    """
    from projections.replay import EpisodeNotFound, StepNotFound, render_replay
    from projections.replay import replay as replay_episode

    store = _open(db)
    try:
        result = replay_episode(store, episode, step)
    except (EpisodeNotFound, StepNotFound) as exc:
        fail(str(exc))
    finally:
        store.close()
    if as_json:
        print_json(result)
    else:
        typer.echo(render_replay(result))


def rerun(
    episode: str = EpisodeArgument,
    db: str | None = DbOption,
    as_json: bool = JsonOption,
) -> None:
    """Re-simulate an episode from its seed, options and actions; exit 1 if the digest differs."""
    from projections.replay import EpisodeNotFound
    from projections.rerun import rerun as rerun_episode

    store = _open(db)
    try:
        result = rerun_episode(store, episode)
    except EpisodeNotFound as exc:
        fail(str(exc))
    finally:
        store.close()
    if as_json:
        print_json(result.to_json())
    elif result.match:
        typer.echo(f"{episode}: match — {result.rerun_events} events, {result.actions} actions, "
                   f"rules version {result.rules}, digest {result.rerun_digest}")
    else:
        _print_mismatch(result)
    if not result.match:
        raise typer.Exit(1)


def _print_mismatch(result) -> None:
    import orjson
    from rich.table import Table

    from projections.rerun import mismatch_line

    console = stdout_console()
    console.print(f"{result.episode_id}: MISMATCH — {mismatch_line(result.to_json())}",
                  style="bold red")
    if result.error:
        console.print(result.error, style="red")
    for note in result.notes:
        console.print(note)
    if result.first_difference is None:
        return

    def show(envelope) -> str:
        if envelope is None:
            return "(no event)"
        data, is_json = envelope.data()
        body = (orjson.dumps(data, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS).decode()
                if is_json else f"{data}\n(not JSON)")
        return f"{envelope.type} (schema v{envelope.schema_version})\n{body}"

    table = Table(title=f"first difference: event version {result.first_difference}",
                  show_lines=True)
    table.add_column("stored", overflow="fold")
    table.add_column("re-simulated", overflow="fold")
    table.add_row(show(result.stored), show(result.rerun))
    console.print(table)


WorkersOption = typer.Option(None, "--workers", min=1, max=64,
                             help="Processes to split the streams over (SQLite files; default: "
                                  "2 on big logs when there are cores, else 1).")


def verify(
    workers: int | None = WorkersOption,
    wait: float = typer.Option(
        10.0, "--wait", parser=seconds(0, 3600), metavar="SECONDS",
        help="PostgreSQL: how long to wait for transactions older than the newest commits to end, "
             "so that the check covers those commits (0: check what is final now; at most 3600)."),
    db: str | None = DbOption,
    as_json: bool = JsonOption,
) -> None:
    """Check the log and every read model; exit 1 naming each broken episode.

    Per stream: versions, digest chain, episode shape, event types. Per read model: its rebuild.
    """
    from projections.parallel import WorkerFailed
    from projections.verify import verify as verify_store

    store = _open(db)
    try:
        with _progress(store.count_events(), "verifying") as advance:
            report = verify_store(store, progress=advance, workers=workers, wait=wait)
    except WorkerFailed as exc:
        fail(f"verify stopped: {exc}", code=1)
    finally:
        store.close()
    if as_json:
        print_json(report.to_json())
    else:
        models = ", ".join(_read_model_line(name, m) for name, m in report.read_models.items())
        typer.echo(f"{report.streams} streams, {report.events} events checked; read models: {models}")
        if report.waiting:
            typer.echo(f"commits after position {report.upto} were not checked: a transaction "
                       f"older than them was still running after {wait:g} s (verify again once "
                       "it ends)")
        for sid, problems in sorted(report.problems.items()):
            typer.echo(f"BROKEN {sid}:")
            for problem in problems:
                typer.echo(f"  - {problem}")
        if not report.ok:
            typer.echo(f"{len(report.problems)} broken episode(s)")
        else:  # a bare "ok" read as "the whole log is sound" with most of it unchecked
            typer.echo(f"ok up to position {report.upto}" if report.waiting else "ok")
    if not report.ok:
        raise typer.Exit(1)


def _read_model_line(name: str, m: dict) -> str:
    """How verify's comparison of one read model went, in a few words."""
    if m["rows"] is not None:
        return f"{name} {m['rows']} rows"
    if m.get("unfinished_rows"):
        return (f"{name} not compared (it holds {m['unfinished_rows']} rows of an unfinished "
                "rebuild, still running in another process or interrupted; once it ends, or after "
                "`companyos rebuild` or `companyos episodes`, verify compares it)")
    moved = (f"caught up from position {m['checkpoint']} to {m['moved_to']}"
             if m["moved_to"] > m["checkpoint"] else "rebuilt")
    return f"{name} not compared ({moved} by another process meanwhile; verify again to compare it)"


def _commits_waiting(store) -> int | None:
    """The position up to which a read model can be brought now, when commits already made lie
    past it (PostgreSQL: behind a transaction that is still running), else None."""
    upto, waiting = store.read_bound()
    return upto if waiting else None


def _say_waiting(upto: int | None, where: str, again: str) -> None:
    if upto is not None:
        say_waiting(upto, "episodes", where, again)


def rebuild(
    projection: str | None = typer.Argument(None, help="episodes or views (default: all)."),
    workers: int | None = WorkersOption,
    db: str | None = DbOption,
) -> None:
    """Drop a read model (default: all of them) and fold it again from the whole log."""
    import time

    from projections import PROJECTION_NAMES, ProjectionRunner, default_projections
    from projections.parallel import WorkerFailed

    if projection is not None and projection not in PROJECTION_NAMES:
        fail(f"unknown projection {projection!r}; known: {', '.join(PROJECTION_NAMES)}")
    if refused := read_only_refusal(resolve_db(db), "a rebuild writes the read models"):
        fail(refused)
    store = _open(db)
    try:
        # only the read model rebuilt: with the other one behind, its catch-up counted into this
        # rebuild's events, which then outnumbered the log's (it catches up at its next use)
        runner = ProjectionRunner(store, [p for p in default_projections()
                                          if projection is None or p.name == projection])
        names = None if projection is None else [projection]
        start = time.perf_counter()
        waiting = _commits_waiting(store)
        with _progress(store.count_events(), "rebuilding") as advance:
            read = runner.rebuild(names, progress=advance, workers=workers)
        elapsed = time.perf_counter() - start
    except WorkerFailed as exc:
        fail(f"rebuild stopped: {exc}", code=1)
    finally:
        store.close()
    _say_waiting(waiting, "in the read models", "catch up")
    rate = read / elapsed if elapsed > 0 else 0.0
    typer.echo(f"rebuilt {projection or ', '.join(PROJECTION_NAMES)}: {read} events in "
               f"{elapsed:.2f} s ({rate:,.0f} events/s)")
    left_out = {name: sorted(streams) for name, streams in runner.unfolded.items() if streams}
    for name, streams in left_out.items():
        shown = ", ".join(streams[:5]) + (", …" if len(streams) > 5 else "")
        say_error(f"{len(streams)} episode(s) left out of the {name} read model, since their "
                  f"events do not fold there: {shown}")
    if left_out:
        fail("the log is damaged; `companyos verify` says where and how", code=1)
