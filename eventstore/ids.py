"""Cheap globally unique event ids: a random per-process prefix and a counter, re-drawn after fork."""

from __future__ import annotations

import itertools
import os
import uuid

_pid = -1
_prefix = ""
_counter = itertools.count()


def new_event_id() -> str:
    global _pid, _prefix, _counter
    if _pid != os.getpid():  # a forked child must not repeat its parent's ids
        _pid = os.getpid()
        _prefix = uuid.uuid4().hex[:20]
        _counter = itertools.count()
    return f"{_prefix}{next(_counter):x}"
