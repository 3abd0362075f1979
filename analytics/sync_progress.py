"""A running sync's progress, kept in a small file beside the warehouse for other processes.

DuckDB lets one process hold a warehouse file. A second `serve` worker (or a CLI call) that finds
it locked can only wait; with this file it can also tell its caller how far the holder's sync got,
and keep waiting for as long as that sync runs instead of giving up after a fixed time. The file
names the syncing process, so a file left behind by a killed sync is never taken for the lock
holder's.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from pathlib import Path

import orjson

Progress = Callable[[int, int | None], None]  # (events synced so far, expected in total or None)


def progress_file(warehouse: Path) -> Path:
    return warehouse.with_name(warehouse.name + ".syncing")


class SharedProgress:
    """A sync's progress callback that also writes the figures where other processes read them.

    Writes replace the file whole (a reader never sees half of one); `close` removes it. A file
    that cannot be written only costs the others their progress figures, never the sync.
    """

    def __init__(self, warehouse: Path, forward: Progress | None = None) -> None:
        self.path = progress_file(warehouse)
        self.forward = forward
        self.written = False

    def __call__(self, done: int, total: int | None) -> None:
        scratch = self.path.with_name(self.path.name + f".{os.getpid()}")
        try:
            scratch.write_bytes(orjson.dumps({"pid": os.getpid(), "done": done, "total": total}))
            os.replace(scratch, self.path)
            self.written = True
        except OSError:  # a full disk creates the scratch file, then cannot fill it
            with contextlib.suppress(OSError):
                scratch.unlink()
        if self.forward is not None:
            self.forward(done, total)

    def close(self) -> None:
        if self.written:
            with contextlib.suppress(OSError):
                self.path.unlink()


FRESH_S = 120.0
"""A progress file is rewritten after every batch (a few seconds each); one older than this is
not a running sync's, when the lock holder is unknown."""


def running_sync(warehouse: Path, holder: int | None) -> tuple[int, int | None] | None:
    """(done, total) of the sync the lock holder `holder` is running on `warehouse`, or None when
    the holder is not syncing (no file, or one some other process left behind).

    `holder` is None when DuckDB's message did not name the holder: then a fresh file naming
    another live process is taken for the holder's (a killed sync's file names a dead process).
    """
    path = progress_file(warehouse)
    try:
        said = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    if not isinstance(said, dict) or not isinstance(pid := said.get("pid"), int):
        return None
    if holder is not None:
        if pid != holder:
            return None
    elif not (pid != os.getpid() and _fresh(path) and _alive(pid)):
        return None
    done, total = said.get("done"), said.get("total")
    if not isinstance(done, int) or not (total is None or isinstance(total, int)):
        return None
    return done, total


def _fresh(path: Path) -> bool:
    """Rewritten within FRESH_S: a sync at work rewrites its file after every batch."""
    try:
        return time.time() - path.stat().st_mtime < FRESH_S
    except OSError:  # removed since it was read: that sync has ended
        return False


def _alive(pid: int) -> bool:
    """Whether a process with this id runs (signal 0 only checks; 0 and below name groups)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: it exists
        return True
    except OSError:
        return False
    return True
