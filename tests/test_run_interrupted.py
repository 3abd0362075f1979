"""Stopping `companyos run` half-way: Ctrl-C, or the parent process killed outright."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from companyos import batch, cli


def test_ctrl_c_says_which_episodes_finished_and_keeps_them(tmp_path, monkeypatch, capsys):
    """An interrupted run printed nothing (or a store error from the interrupted rollback), so
    no one could tell which seeds were done."""
    url = f"sqlite:///{tmp_path / 'store.db'}"
    run_range, chunks = batch.run_range, []

    def interrupted_in_the_third_chunk(plan, start, stop, store):
        chunks.append(start)
        if len(chunks) == 3:
            raise KeyboardInterrupt
        return run_range(plan, start, stop, store)

    monkeypatch.setattr(batch, "run_range", interrupted_in_the_third_chunk)
    monkeypatch.setattr(batch, "CHUNK", 4)
    monkeypatch.setattr("sys.argv", ["companyos", "run", "--episodes", "20", "--seed", "100",
                                     "--db", url, "--json"])
    with pytest.raises(SystemExit) as stopped:
        cli.main()
    assert stopped.value.code == 130
    out = capsys.readouterr()
    assert not out.out
    assert out.err.strip().splitlines() == [
        "error: interrupted: 8 episode(s) finished and reported (seeds 100..107); the ones after "
        "them may be partly logged (an episode under way is left running), and `companyos "
        "episodes` lists all the log holds"]
    monkeypatch.undo()
    from eventstore import EventStore
    from projections import default_projections
    from projections.episodes import list_episodes
    from projections.runner import ProjectionRunner

    with EventStore.open(url) as store:
        ProjectionRunner(store, default_projections()).catch_up()
        with store.engine.connect() as conn:
            seeds = sorted(r["seed"] for r in list_episodes(conn))
    assert seeds == list(range(100, 108))


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
