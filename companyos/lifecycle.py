"""Worker processes that end with the process that started them.

A pool's or a server's workers outlive a parent killed outright (`kill -9`): they go on logging
episodes no one will report, or serving a port a restart needs. Each watches its parent's pid,
handed down by the parent (when a worker starts after its parent died, `os.getppid()` already
names another process).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable


def end_with(parent: int, end: Callable[[], object], interval: float = 0.5) -> None:
    """Call `end` (on a daemon thread) once this process is no longer `parent`'s child."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(interval)
        end()

    threading.Thread(target=watch, name="end-with-parent", daemon=True).start()


_PR_SET_PDEATHSIG = 1


def die_with_parent(parent: int) -> None:
    """End this process the moment `parent` dies, even by `kill -9`: on Linux the kernel kills it
    (PR_SET_PDEATHSIG), before it can write to a pipe no one reads and print the broken pipe's
    traceback; elsewhere, within half a second (`end_with`)."""
    import ctypes
    import signal

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        armed = libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0
    except (OSError, AttributeError):  # not Linux
        armed = False
    if not armed:
        end_with(parent, lambda: os._exit(1))
    elif os.getppid() != parent:  # it died before the kernel was asked to watch
        os._exit(1)
