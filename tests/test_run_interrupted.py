"""Stopping `companyos run` half-way: Ctrl-C, or the parent process killed outright."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from companyos import batch, cli
from companyos.commands.run import seed_ranges
from domain import CURRENT_RULES
from tests.conftest import live_children


def _logged(url: str) -> list[dict]:
    from eventstore import EventStore
    from projections import default_projections
    from projections.episodes import list_episodes
    from projections.runner import ProjectionRunner

    with EventStore.open(url) as store:  # to the log as it stands: a run still logging is not
        # waited for (on a loaded machine, chasing it let the run end before the stop signal)
        ProjectionRunner(store, default_projections()).catch_up(upto=store.last_position())
        with store.engine.connect() as conn:
            return list_episodes(conn, limit=None)


def _run_json(monkeypatch, capsys, url: str, index: int, before) -> tuple[int, str, str]:
    """`companyos run --episodes 20 --seed 100 --json` in this process, with `before()` called as
    episode `index` begins; (exit code, stdout, stderr), the test's patches undone after."""
    play = batch._play

    def play_with(env, plan, i):
        if i == index:
            before()
        return play(env, plan, i)

    monkeypatch.setattr(batch, "_play", play_with)
    monkeypatch.setattr("sys.argv", ["companyos", "run", "--episodes", "20", "--seed", "100",
                                     "--db", url, "--json"])
    with pytest.raises(SystemExit) as stopped:
        cli.main()
    out = capsys.readouterr()
    monkeypatch.undo()
    return stopped.value.code, out.out, out.err


def _ctrl_c_while_the_report_is_encoded(monkeypatch) -> None:
    """A SIGINT to this process as `run` encodes its --json report."""
    import types

    from companyos.commands import run as run_command

    dumps = run_command.orjson.dumps

    def ctrl_c_while_encoding(document, *args, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)
        return dumps(document, *args, **kwargs)

    monkeypatch.setattr(run_command, "orjson", types.SimpleNamespace(dumps=ctrl_c_while_encoding))


@pytest.mark.parametrize("presses", [1, 2], ids=["ctrl-c", "ctrl-c-twice"])
def test_ctrl_c_finishes_the_episode_under_way_and_says_which_finished(
        tmp_path, monkeypatch, capsys, presses):
    """An interrupted run reported only whole chunks, while the log held more finished episodes
    (a user resuming from the seed after the reported ones ran those instances twice). The first
    Ctrl-C now lets the episode under way finish; a second one stops at once."""
    url = f"sqlite:///{tmp_path / 'store.db'}"

    def ctrl_c():
        for _ in range(presses):
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(batch, "CHUNK", 4)
    code, stdout, stderr = _run_json(monkeypatch, capsys, url, 9, ctrl_c)  # during the tenth
    assert code == 130
    logged = _logged(url)
    # the finished episodes' results still reach a caller piping --json, marked as cut short
    report = json.loads(stdout)
    assert report["interrupted"] is True
    assert report["summary"]["episodes"] == len(report["episodes"]) == 10 - (presses - 1)
    assert {(e["seed"], e["digest"]) for e in report["episodes"]} == {
        (e["seed"], e["digest"]) for e in logged if e["outcome"]}
    if presses == 1:
        assert stderr.strip().splitlines() == [
            "error: interrupted: 10 episode(s) finished, logged and reported (seeds 100..109); "
            "no other episode was begun or left half-logged"]
        assert sorted(e["seed"] for e in logged) == list(range(100, 110))
        assert all(e["outcome"] is not None for e in logged)
    else:
        assert stderr.strip().splitlines() == [
            "error: interrupted: 9 episode(s) finished, logged and reported (seeds 100..108); a "
            "second Ctrl-C stopped it at once: the episodes under way were cut short (each left "
            "running in the log) and, with --workers, some finished ones may be unreported; "
            "`companyos episodes` lists all the log holds"]
        assert sorted(e["seed"] for e in logged if e["outcome"]) == list(range(100, 109))


def test_a_stop_signal_while_the_json_report_is_written_leaves_it_whole(tmp_path, monkeypatch, capsys):
    """A Ctrl-C (or SIGTERM) just after the last episode, or a second Ctrl-C right after the
    first, landed while the report was being encoded or written: the reader of --json got a
    truncated document, or none. The report is written whole, then the signal takes effect."""
    url = f"sqlite:///{tmp_path / 'store.db'}"
    _ctrl_c_while_the_report_is_encoded(monkeypatch)
    # another thread that takes signals (a library's, a server's): with the stop signals masked in
    # the main thread only, the kernel handed the SIGINT to it and the report was cut all the same
    idle = threading.Event()
    other = threading.Thread(target=idle.wait, daemon=True)
    other.start()
    try:
        code, stdout, stderr = _run_json(monkeypatch, capsys, url, 0, lambda: None)
    finally:
        idle.set()
        other.join()
    assert code == 130 and stderr.strip() == "error: interrupted", stderr
    report = json.loads(stdout)
    assert report["summary"]["episodes"] == len(report["episodes"]) == 20
    assert {(e["seed"], e["digest"]) for e in report["episodes"]} == {
        (e["seed"], e["digest"]) for e in _logged(url)}


def test_a_ctrl_c_while_an_interrupted_runs_report_is_written_keeps_its_words(
        tmp_path, monkeypatch, capsys):
    """A second Ctrl-C while the interrupted run's report was written (the run stopping slowly,
    say) took effect after it, and replaced the line saying which episodes finished with a bare
    "error: interrupted". The run is ending for a stop already: the report and the line stay."""
    url = f"sqlite:///{tmp_path / 'store.db'}"
    _ctrl_c_while_the_report_is_encoded(monkeypatch)
    code, stdout, stderr = _run_json(monkeypatch, capsys, url, 4,
                                     lambda: os.kill(os.getpid(), signal.SIGINT))
    assert code == 130
    assert stderr.strip().splitlines() == [
        "error: interrupted: 5 episode(s) finished, logged and reported (seeds 100..104); "
        "no other episode was begun or left half-logged"], stderr
    report = json.loads(stdout)
    assert report["interrupted"] is True and report["summary"]["episodes"] == 5


def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as listed:
        return [int(child) for child in listed.read().split()]


def _pooled_run(tmp_path, episodes: int = 100000) -> tuple[subprocess.Popen, str]:
    """`companyos run --workers 2 --durability episode --json` in its own process group."""
    url = f"sqlite:///{tmp_path / 'store.db'}"
    run = subprocess.Popen([sys.executable, "-m", "companyos", "run", "--episodes", str(episodes),
                            "--workers", "2", "--durability", "episode", "--db", url, "--json"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           start_new_session=True)
    return run, url


def _until_logged(tmp_path, url: str, episodes: int) -> None:
    for _ in range(600):  # until both workers have logged episodes
        time.sleep(0.1)
        if (tmp_path / "store.db").exists() and len(_logged(url)) > episodes:
            return


@pytest.mark.parametrize("stop, group", [(signal.SIGINT, False), (signal.SIGTERM, False),
                                         (signal.SIGTERM, True)],
                         ids=["ctrl-c", "sigterm", "sigterm-to-the-group"])
def test_stopping_a_run_with_workers_reports_exactly_the_episodes_the_log_holds(tmp_path, stop, group):
    """SIGTERM (`kill`, `timeout`, `docker stop`, systemd, which signals the whole group) killed
    the run outright: no report, no seed ranges, and the episodes a worker held were lost. It now
    stops as Ctrl-C does."""
    run, url = _pooled_run(tmp_path)
    _until_logged(tmp_path, url, 300)
    if group:
        os.killpg(run.pid, stop)
    else:
        run.send_signal(stop)
    out, err = run.communicate(timeout=60)
    assert run.returncode == 130, err
    reported = re.search(r"interrupted: (\d+) episode\(s\) finished, logged and reported "
                         r"\(seeds ([^)]*)\); no other episode", err)
    assert reported, err
    logged = _logged(url)
    assert all(e["outcome"] is not None for e in logged)
    assert int(reported[1]) == len(logged)
    assert reported[2] == seed_ranges(sorted(e["seed"] for e in logged))
    report = json.loads(out)
    assert report["interrupted"] is True
    assert sorted(e["seed"] for e in report["episodes"]) == sorted(e["seed"] for e in logged)


def test_a_run_started_ignoring_ctrl_c_keeps_ignoring_it(tmp_path):
    """A background job of a script inherits SIGINT ignored: Python keeps it so, but the run put
    in its own handler once it began, so a Ctrl-C a moment later stopped it after all."""
    url = f"sqlite:///{tmp_path / 'store.db'}"
    episodes = 4000
    run = subprocess.Popen([sys.executable, "-m", "companyos", "run", "--episodes", str(episodes),
                            "--durability", "episode", "--db", url, "--json"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    _until_logged(tmp_path, url, 50)
    assert len(_logged(url)) < episodes, "the run ended before the signal: make it longer"
    run.send_signal(signal.SIGINT)
    out, err = run.communicate(timeout=120)
    assert run.returncode == 0, err
    assert len(json.loads(out)["episodes"]) == episodes == len(_logged(url))


def test_seed_ranges_reads_as_a_person_would_write_it():
    assert seed_ranges([3, 4, 5, 7, 9, 10]) == "3..5, 7, 9..10"
    assert seed_ranges(list(range(0, 20, 2)), shown=3) == "0, 2, 4 and 7 more ranges"
    assert seed_ranges(list(range(0, 20, 2)), shown=None).endswith(", 16, 18")  # what a resume needs


def test_a_worker_that_dies_ends_the_run_in_words_not_a_hang(tmp_path):
    """multiprocessing.Pool waited for ever for the chunk of a worker killed outright (by the OOM
    killer, say): an unattended run never ended and never said why."""
    run, url = _pooled_run(tmp_path)
    _until_logged(tmp_path, url, 100)
    os.kill(_children(run.pid)[-1], signal.SIGKILL)  # the last child started: a worker
    out, err = run.communicate(timeout=120)  # a guard: it used to wait for ever
    assert run.returncode == 1, err
    assert err.strip().splitlines() == [err.strip()] and err.startswith("error: a worker process died")
    report = json.loads(out)
    assert report["failed"] is True and "error: " + report["error"] == err.strip()
    reported = sorted(e["seed"] for e in report["episodes"])  # none, often: chunks of 2,000
    said = (f"; {len(reported)} episode(s) finished and were logged before it (seeds "
            f"{seed_ranges(reported, shown=None)})") if reported else "lists all the log holds"
    assert err.rstrip().endswith(said)
    logged = {(e["seed"], e["digest"]) for e in _logged(url) if e["outcome"]}
    assert {(e["seed"], e["digest"]) for e in report["episodes"]} <= logged
    assert not live_children(run.pid)  # the other worker was stopped too


def test_the_workers_left_are_gone_before_a_broken_pool_is_shut_down(tmp_path, monkeypatch):
    """From Python 3.12 the pool's own thread answers a dead worker by SIGTERM to the others and a
    join, holding the lock `shutdown()` takes; workers ignore SIGTERM (a stop is the parent's to
    handle), so the run above hung for ever there. Whatever the Python, no worker may be left
    when the run shuts its pool down."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    alive_at_shutdown: list[list[int]] = []
    shutdown = ProcessPoolExecutor.shutdown

    def the_runs() -> list:
        return [child for child in mp.active_children() if child not in before]

    def watched(executor, *args, **kwargs):
        # asked of /proc, not of the Process objects: the pool's own thread reaps the workers too,
        # and a waitpid that loses that race reads as "still running" (exitcode None)
        pids = {child.pid for child in the_runs()}
        for _ in range(100):  # a kill takes a moment; a busy worker never ends by itself
            alive = sorted(pids & set(live_children(os.getpid())))
            if not alive:
                break
            time.sleep(0.1)
        alive_at_shutdown.append(alive)
        return shutdown(executor, *args, **kwargs)

    monkeypatch.setattr(ProcessPoolExecutor, "shutdown", watched)
    plan = batch.RunPlan(f"sqlite:///{tmp_path / 'store.db'}", "expert", "all", "low", 100_000, 0)

    def kill_a_worker() -> None:
        for _ in range(600):
            time.sleep(0.1)
            workers = the_runs()
            if len(workers) == 2 and (tmp_path / "store.db").exists() and _logged(plan.db):
                os.kill(workers[-1].pid, signal.SIGKILL)
                return

    before = set(mp.active_children())  # an earlier test's processes are not the run's
    killer = threading.Thread(target=kill_a_worker, daemon=True)
    killer.start()
    with pytest.raises(batch.RunFailed) as failed:
        batch.run(plan, workers=2)
    killer.join()
    assert isinstance(failed.value.__cause__, batch.WorkerDied)
    assert alive_at_shutdown == [[]]


def test_a_worker_that_cannot_open_the_store_says_why_as_the_runs_error(tmp_path):
    """It printed an "Exception in initializer" traceback, then blamed a killed worker."""
    script = tmp_path / "worker.py"
    script.write_text(textwrap.dedent("""
        import os, signal, sys
        from companyos import batch
        batch._init_worker(sys.argv[1], os.getppid())
        try:
            batch._work((batch.RunPlan(sys.argv[1], "expert", "all", "low", 1, 0), 0, 1))
        except batch.ChunkFailed as failed:
            print(type(failed.error).__name__, failed.results)
    """))
    out = subprocess.run([sys.executable, str(script), f"sqlite:///{tmp_path / 'no-such-folder' / 's.db'}"],
                         capture_output=True, text=True, env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert out.stdout.strip() == "StoreUnavailable []", out.stderr


def test_a_stop_while_the_workers_start_prints_no_traceback(tmp_path):
    """Ctrl-C reached each worker while it was still importing: a KeyboardInterrupt traceback
    each (dozens of lines), before the worker could ignore it."""
    run, _ = _pooled_run(tmp_path)
    for _ in range(200):
        if len(_children(run.pid)) >= 3:  # the resource tracker and both workers
            break
        time.sleep(0.01)
    os.killpg(run.pid, signal.SIGINT)
    out, err = run.communicate(timeout=120)
    assert run.returncode == 130 and "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1 and json.loads(out)["interrupted"] is True


def test_ctrl_c_while_the_command_loads_is_one_line_not_a_traceback(tmp_path):
    """Ctrl-C in the half second a command takes to import its modules printed a traceback of the
    import under way (KeyboardInterrupt in typer, rich or SQLAlchemy), exit code 130 or 1."""
    url = f"sqlite:///{tmp_path / 's.db'}"
    reached = 0
    for delay in (0.15, 0.25, 0.35, 0.45, 0.6):  # the command's imports, on a fast or a slow day
        command = subprocess.Popen([sys.executable, "-m", "companyos", "episodes", "--db", url],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(delay)
        command.send_signal(signal.SIGINT)
        _, err = command.communicate(timeout=60)
        if "Fatal Python error: init_import_site" in err:
            continue  # on a loaded machine the signal came while Python itself started: not ours
        reached += 1
        assert "Traceback" not in err, (delay, err)
        if command.returncode == 130:  # else it had ended before the signal came (exit 2: no store)
            assert err.strip() == "error: interrupted", (delay, err)
    assert reached, "every signal came while Python itself started: nothing of the command was tried"


def test_a_ctrl_c_python_could_not_raise_is_delivered_again_not_printed_and_lost():
    """What the test above met under load: the signal landed in an import lock's callback, Python
    printed "Exception ignored in: ... Traceback" and the command went on as if never interrupted."""
    import types

    from companyos.entry import redelivered

    others: list = []
    hook = redelivered(others.append)
    hook(types.SimpleNamespace(exc_value=KeyboardInterrupt()))  # returns: raised here, it was lost
    with pytest.raises(KeyboardInterrupt):
        time.sleep(10)  # it comes a moment later, in the main thread
    assert others == []
    failed = types.SimpleNamespace(exc_value=ValueError("a finaliser failed"))
    hook(failed)
    assert others == [failed]  # anything else is printed as Python prints it


def test_a_ctrl_c_python_wraps_while_a_class_is_made_counts_as_an_interruption():
    """What the test above met under load: the signal landed while pydantic, imported lazily, made
    a dataclass, and Python 3.11 raised it as a RuntimeError about `__set_name__`, which the
    command printed as a traceback."""

    class Interrupted:
        def __set_name__(self, owner, name):
            raise KeyboardInterrupt

    with pytest.raises(BaseException) as raised:
        type("Made", (), {"field": Interrupted()})
    assert isinstance(raised.value, RuntimeError | KeyboardInterrupt)  # wrapped up to 3.11
    assert cli._interrupted(raised.value)
    assert not cli._interrupted(RuntimeError("something else"))


def test_worker_processes_the_system_cannot_start_are_said_in_words(tmp_path, monkeypatch, capsys):
    """Out of file descriptors (or processes) as the workers start: starting one raises OSError,
    which the run printed as a Rich traceback of multiprocessing's internals."""
    import errno

    class Exhausted(batch.ProcessPoolExecutor):
        def submit(self, *args, **kwargs):
            raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(batch, "ProcessPoolExecutor", Exhausted)
    monkeypatch.setattr("sys.argv", ["companyos", "run", "--episodes", "200", "--workers", "2",
                                     "--db", f"sqlite:///{tmp_path / 's.db'}", "--json"])
    with pytest.raises(SystemExit) as stopped:
        cli.main()
    out = capsys.readouterr()
    assert stopped.value.code == 1
    assert out.err.strip().splitlines() == ["error: cannot start the run's worker processes: "
                                            "Too many open files"], out.err
    assert json.loads(out.out) == {"rules": CURRENT_RULES, "summary": batch.summarise([]), "episodes": [],
                                   "failed": True,
                                   "error": "cannot start the run's worker processes: Too many open files"}


def test_no_more_worker_processes_start_than_there_are_chunks(tmp_path, monkeypatch):
    """100 episodes are two chunks: `--workers 64` started 64 processes, each importing the package
    and opening the store, and the run took twenty times as long as with one."""
    started = []

    class Counted(batch.ProcessPoolExecutor):
        def __init__(self, max_workers, **kwargs):
            started.append(max_workers)
            super().__init__(max_workers, **kwargs)

    monkeypatch.setattr(batch, "ProcessPoolExecutor", Counted)
    plan = batch.RunPlan(f"sqlite:///{tmp_path / 's.db'}", "expert", "all", "low", 100, 0)
    assert len(batch.run(plan, workers=64)) == 100
    assert started == [2]


_PARENT = textwrap.dedent("""
    import multiprocessing as mp, os, sys, time
    from companyos.batch import _init_worker
    def pid_then_wait(_):
        import os
        print(os.getpid(), flush=True)
        time.sleep(60)
    if __name__ == "__main__":
        with mp.get_context("spawn").Pool(1, _init_worker, (sys.argv[1], os.getpid())) as pool:
            pool.map(pid_then_wait, [0])
""")


def test_a_worker_whose_parent_was_killed_stops(tmp_path):
    """With the parent gone (kill -9), workers went on logging episodes no one would report,
    then died on a broken pipe with a traceback each."""
    script = tmp_path / "parent.py"
    script.write_text(_PARENT)
    parent = subprocess.Popen([sys.executable, str(script), f"sqlite:///{tmp_path / 's.db'}"],
                              stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": os.getcwd()})
    worker = int(parent.stdout.readline())
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    for _ in range(100):
        try:
            os.kill(worker, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    os.kill(worker, signal.SIGKILL)
    pytest.fail("the worker outlived its parent by 10 s")


def test_a_one_process_run_killed_outright_leaves_nothing_to_clean_up(tmp_path):
    """A one-process run made a process-shared semaphore it never needed; killed, it left
    multiprocessing's resource tracker to warn about "leaked semaphore objects"."""
    url = f"sqlite:///{tmp_path / 'store.db'}"
    run = subprocess.Popen([sys.executable, "-m", "companyos", "run", "--episodes", "100000",
                            "--durability", "episode", "--db", url],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for _ in range(600):
        time.sleep(0.1)
        if (tmp_path / "store.db").exists() and len(_logged(url)) > 20:
            break
    run.kill()
    _, err = run.communicate(timeout=60)  # until every holder of stderr (a tracker too) is gone
    assert run.returncode == -signal.SIGKILL
    assert "leaked" not in err and "resource_tracker" not in err, err


def test_a_run_the_store_fails_under_reports_the_episodes_that_finished(tmp_path, monkeypatch, capsys):
    """A lost database mid-run ended with `error: the store failed` and nothing else: the results
    of the episodes already logged were thrown away (Ctrl-C kept them)."""
    import sqlalchemy as sa

    url = f"sqlite:///{tmp_path / 'store.db'}"

    def database_gone():
        raise sa.exc.OperationalError("INSERT INTO commits ...", {}, Exception("the connection is lost"))

    code, stdout, stderr = _run_json(monkeypatch, capsys, url, 5, database_gone)  # at the sixth
    assert code == 1
    assert stderr.strip().splitlines() == ["error: the store failed: the connection is lost; 5 episode(s) "
                                           "finished and were logged before it (seeds 100..104)"]
    report = json.loads(stdout)
    assert report["failed"] is True and report["summary"]["episodes"] == 5
    assert "error: " + report["error"] == stderr.strip()  # a reader of --json is told why, too
    assert {(e["seed"], e["digest"]) for e in report["episodes"]} == {
        (e["seed"], e["digest"]) for e in _logged(url)}


def test_a_store_outage_that_stops_a_run_names_the_seeds_it_finished(tmp_path, monkeypatch, capsys):
    """The finished seeds ride on the error as a note, so every kind of error line says them: here
    an outage (StoreUnreachable, exit 1), said by the command line's own branch for it."""
    from eventstore import StoreUnreachable

    def outage():
        raise StoreUnreachable("the database server is not answering")

    code, stdout, stderr = _run_json(monkeypatch, capsys, f"sqlite:///{tmp_path / 'store.db'}", 3, outage)
    assert code == 1 and json.loads(stdout)["summary"]["episodes"] == 3
    assert stderr.strip().splitlines() == ["error: the database server is not answering; 3 episode(s) "
                                           "finished and were logged before it (seeds 100..102)"]
    assert "error: " + json.loads(stdout)["error"] == stderr.strip()


def test_a_run_whose_store_cannot_be_opened_says_why_in_its_json_too(tmp_path):
    """`--json` printed `"failed": true` and nothing of the cause, which only stderr said."""
    url = f"sqlite:///{tmp_path / 'no such directory' / 'store.db'}"
    run = subprocess.run([sys.executable, "-m", "companyos", "run", "--episodes", "1", "--db", url,
                          "--json"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 2, run.stderr  # a --db that cannot be: the caller's input
    report = json.loads(run.stdout)
    assert report["failed"] is True and report["episodes"] == []
    assert report["error"].startswith("cannot open the store at ") and "unable to open" in report["error"]
    assert run.stderr == f"error: {report['error']}\n"
    assert not (tmp_path / "no such directory").exists()


def test_a_prepared_statement_a_pooler_lost_is_said_with_the_url_that_fixes_it(tmp_path, monkeypatch, capsys):
    """Behind PgBouncer's transaction pooling psycopg's prepared statements go missing: the error
    line said only `prepared statement "_pg3_0" does not exist`, which names neither the cause
    nor the fix (tests/test_pooler.py shows the fix working behind a real PgBouncer)."""
    import psycopg

    url = f"sqlite:///{tmp_path / 'store.db'}"

    def pooler_lost_it():
        raise psycopg.errors.InvalidSqlStatementName('prepared statement "_pg3_0" does not exist')

    code, _, stderr = _run_json(monkeypatch, capsys, url, 3, pooler_lost_it)
    assert code == 1
    (line,) = stderr.strip().splitlines()
    assert line.startswith('error: the store failed: prepared statement "_pg3_0" does not exist; ')
    assert "transaction pooler" in line and "add ?prepare_threshold=none to the store's URL" in line


def test_an_error_said_over_several_lines_is_one_line(capsys):
    """libpq's words span three lines (and a tab): a script reading the one `error:` line lost
    the rest."""
    from companyos.commands.output import say_error

    say_error("the store failed: server closed the connection unexpectedly\n\tThis probably means"
              " the server terminated abnormally\n\tbefore or while processing the request.\n")
    assert capsys.readouterr().err == ("error: the store failed: server closed the connection "
                                       "unexpectedly This probably means the server terminated "
                                       "abnormally before or while processing the request.\n")
    # a damaged file's bytes in SQLite's words, an escape sequence among them: shown, not obeyed
    say_error("file is not a database: \x02\x1b[2J\x9b é")
    assert capsys.readouterr().err == "error: file is not a database: \\x02\\x1b[2J\\x9b é\n"


def test_a_json_run_that_fails_before_any_episode_still_prints_its_document(tmp_path, monkeypatch, capsys):
    """With nothing finished, `--json` printed nothing at all: its reader got no JSON to parse."""
    import sqlalchemy as sa

    def database_gone():
        raise sa.exc.OperationalError("INSERT INTO commits ...", {}, Exception("the disk is full"))

    code, stdout, stderr = _run_json(monkeypatch, capsys, f"sqlite:///{tmp_path / 's.db'}", 0,
                                     database_gone)
    assert code == 1 and stderr.strip() == "error: the store failed: the disk is full"
    assert json.loads(stdout) == {"rules": CURRENT_RULES, "summary": batch.summarise([]), "episodes": [],
                                  "failed": True, "error": "the store failed: the disk is full"}


def test_stop_signals_are_counted_and_a_forcing_one_waits_for_the_workers_to_start():
    """The halt a failed chunk sets made the user's first Ctrl-C a forcing second one; and a
    second signal raised inside Process.start() could leave a worker no one would kill."""
    import threading

    failed = batch.Stops(threading.Event())
    failed.halt.set()  # a chunk failed: the others finish the episode under way
    failed.handle(signal.SIGINT, None)  # the user's first Ctrl-C only asks for the same
    with pytest.raises(KeyboardInterrupt):
        failed.handle(signal.SIGTERM, None)  # the second forces
    starting = batch.Stops(threading.Event())
    starting.handle(signal.SIGINT, None)
    reached = False
    with pytest.raises(KeyboardInterrupt), starting.held():
        starting.handle(signal.SIGINT, None)  # held back while the workers start ...
        reached = True
    assert reached and starting.halt.is_set()  # ... and raised once they have
