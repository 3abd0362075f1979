"""`companyos run` and `companyos tasks`: log episodes of a baseline agent and list the task families."""

from __future__ import annotations

import sys

import orjson
import typer

from companyos.commands.options import DbOption, JsonOption
from companyos.commands.output import error_line, fail, stdout_console, store_failure, with_notes
from companyos.config import resolve_db

MAX_EPISODES = 10**8
"""One run's results stay in memory for its summary (~0.26 KB each): 10^8 is ~26 GB."""


def register(app: typer.Typer) -> None:
    app.command("run")(run)
    app.command("tasks")(tasks)


def run(
    agent: str = typer.Option("expert", help="Baseline agent: random, expert or noop."),
    task: str = typer.Option("all", help="A task family, or 'all' to cycle through them."),
    chaos: str = typer.Option("medium", help="none, low, medium, high, or a number in [0, 1]."),
    episodes: int = typer.Option(10, min=0, max=MAX_EPISODES,
                                 help="How many episodes; episode i uses seed S+i."),
    seed: int = typer.Option(0, help="Seed of the first episode."),
    workers: int = typer.Option(1, min=1, max=64, help="Processes sharing the store."),
    durability: str = typer.Option("step", help="step: commit every step; episode: commit ended "
                                   "episodes 16 at a time (faster; a crash loses the episodes under "
                                   "way and up to 15 ended ones a worker held)."),
    reward_profile: str = typer.Option("default", help="default or sparse."),
    rules: int | None = typer.Option(None, help="The rules version the episodes are judged by "
                                     "(default: the latest; 1 to compare with logs written before "
                                     "rules versions existed)."),
    db: str | None = DbOption,
    as_json: bool = JsonOption,
) -> None:
    """Run a baseline agent for N logged episodes and summarise how it did."""
    from companyos.batch import RunFailed, RunInterrupted, RunPlan, WorkerDied, validate
    from companyos.batch import run as run_plan

    plan = RunPlan(resolve_db(db), agent, task, chaos, episodes, seed, durability,
                   reward_profile, rules)
    try:
        validate(plan)
    except ValueError as exc:  # one `error:` line (exit 2), as every command says a wrong value
        fail(str(exc))
    from dataclasses import replace

    from domain import checked_rules

    plan = replace(plan, rules=checked_rules(plan.rules))  # the version it runs, named in its report
    try:
        if as_json or not sys.stdout.isatty():
            results = run_plan(plan, workers)
        else:
            from rich.progress import Progress

            with Progress(transient=True) as bar:
                job = bar.add_task(f"{agent} on {task}", total=episodes)
                results = run_plan(plan, workers, progress=lambda n: bar.advance(job, n))
    except RunInterrupted as stop:
        # what finished is reported as a whole run's would be (JSON marked "interrupted"), so a
        # caller piping --json keeps those episodes' results; the exit code says the run was cut
        _report(plan, stop.results, as_json, cut_short="interrupted")
        fail(f"interrupted: {len(stop.results)} episode(s) finished, logged and reported"
             + (f" (seeds {_seeds_of(stop.results)})" if stop.results else "")
             + ("; a second Ctrl-C stopped it at once: the episodes under way were cut short "
                "(each " + ("lost" if durability == "episode" else "left running in the log")
                + ") and, with --workers, some finished ones may be unreported; `companyos "
                "episodes` lists all the log holds" if stop.forced else
                "; no other episode was begun or left half-logged"), code=130)
    except RunFailed as failed:
        # the episodes that finished before the error (a lost database, say) are reported, marked
        # "failed" (with --json always, so its reader gets a document, which says the error in the
        # words of the `error:` line); the error is then said as every command says it (exit 1 for
        # a store)
        cause = failed.__cause__
        if failed.results:  # what a resumed run can skip, in the error's one line
            cause.add_note(f"{len(failed.results)} episode(s) finished and were logged before it "
                           f"(seeds {_seeds_of(failed.results)})")
        said = (with_notes(str(cause), cause), 1) if isinstance(cause, WorkerDied) else store_failure(cause)
        if failed.results or as_json:
            _report(plan, failed.results, as_json, cut_short="failed", error=said and said[0])
        if said is None:  # not the store's failure: a bug, with its traceback
            raise cause from None
        fail(*said)
    _report(plan, results, as_json)


def _report(plan, results: list, as_json: bool, cut_short: str | None = None,
            error: str | None = None) -> None:
    """The run's summary and, with --json, every episode's result, on stdout; a run cut short is
    marked `"interrupted": true` (Ctrl-C) or `"failed": true` (an error, with `"error"` saying it
    when it is a store's or a worker's)."""
    from companyos.batch import stop_signals_deferred, summarise

    # a stop signal (a second Ctrl-C, a SIGTERM as the run ends) takes effect once the report
    # is out: cutting it short left a reader of --json a truncated document, or none. A run
    # interrupted already ends with its own line and exit 130; a bare "interrupted" replaced it
    with stop_signals_deferred(stopping=cut_short == "interrupted"):
        summary = summarise(results)
        if as_json:
            document = {"rules": plan.rules, "summary": summary,
                        "episodes": [r.to_json() for r in results]}
            if cut_short:
                document[cut_short] = True
            if error:
                document["error"] = error_line(error)  # the words of the `error:` line
            sys.stdout.buffer.write(orjson.dumps(document) + b"\n")
            sys.stdout.flush()
            return
        _print_summary(plan, summary)


def _seeds_of(results: list) -> str:
    """Every seed of a run cut short's finished episodes, as ranges: what a resumed run skips."""
    return seed_ranges(sorted(r.seed for r in results), shown=None)


def seed_ranges(seeds: list[int], shown: int | None = 6) -> str:
    """Sorted seeds as ranges, 'a..b, c, d..e' (after `shown` ranges, how many more there are;
    every range with None, as a run cut short says them: they are what a resumed run needs)."""
    ranges: list[list[int]] = []
    for s in seeds:
        if ranges and s == ranges[-1][1] + 1:
            ranges[-1][1] = s
        else:
            ranges.append([s, s])
    text = ", ".join(f"{a}..{b}" if a != b else str(a) for a, b in ranges[:shown])
    hidden = 0 if shown is None else len(ranges) - shown
    return text + (f" and {hidden} more ranges" if hidden > 0 else "")


def _print_summary(plan, summary: dict) -> None:
    from rich.table import Table

    from analytics.intervals import percent_text, wilson_bounds

    table = Table(title=f"{plan.agent} agent, task {plan.task}, chaos {plan.chaos}, "
                        f"rules {plan.rules}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_row("episodes", str(summary["episodes"]))
    if summary["episodes"]:
        # from the counts, rounded as the report rounds: `:.1%` read 5 of 16 as 31.2%, and the
        # bounds' 4 places rounded again read 95.9496% as 96.0%
        wins, n = summary["outcomes"].get("success", 0), summary["episodes"]
        low, high = wilson_bounds(wins, n)
        table.add_row("success rate", percent_text(summary["success_rate"]))
        table.add_row("95% interval", f"{percent_text(low)} to {percent_text(high)}")
        table.add_row("mean return", f"{summary['mean_return']:.2f} ± {summary['std_return']:.2f}")
        table.add_row("mean steps", f"{summary['mean_steps']:.1f}")
    else:  # nothing to average: n/a, as the analytics report says it
        for metric in ("success rate", "95% interval", "mean return", "mean steps"):
            table.add_row(metric, "n/a")
    for outcome, count in summary["outcomes"].items():
        table.add_row(f"outcome: {outcome}", str(count))
    for mode, count in summary["failure_modes"].items():
        table.add_row(f"failure mode: {mode}", str(count))
    stdout_console().print(table)


def tasks(as_json: bool = JsonOption) -> None:
    """List the task families, chaos levels, reward profiles, rules versions and failure modes;
    --json prints the catalogue GET /tasks serves.

    The text and the JSON hold the same catalogue, so what a person reads is what a script gets.
    """
    from companyos.catalogue import task_catalogue

    catalogue = task_catalogue()
    if as_json:
        typer.echo(orjson.dumps(catalogue).decode())
        return
    from rich.table import Table

    console = stdout_console()
    sections = [
        ("task families", ("task", "goal"), [(t["name"], t["description"]) for t in catalogue["tasks"]]),
        ("chaos levels", ("level", "probability"),
         [(name, f"{p:g}") for name, p in catalogue["chaos_levels"].items()]),
        ("reward profiles", ("reward profile",), [(name,) for name in catalogue["reward_profiles"]]),
        ("rules versions", ("version", "rules"),
         [(f"{r['version']}" + (" (current)" if r["version"] == catalogue["current_rules"] else ""),
           r["description"]) for r in catalogue["rules_versions"]]),
        ("failure modes", ("failure mode", "meaning"), list(catalogue["failure_modes"].items())),
    ]
    for title, columns, rows in sections:
        table = Table(title=title, title_justify="left")
        for column in columns:
            table.add_column(column, no_wrap=column != columns[-1])
        for row in rows:
            table.add_row(*row)
        console.print(table)
