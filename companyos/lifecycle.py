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
