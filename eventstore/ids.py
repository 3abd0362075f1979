"""Cheap globally unique event ids: a random per-process prefix and a counter, re-drawn after fork."""

from __future__ import annotations

import itertools
import os
import uuid

_prefix = ""
_counter = itertools.count()


def _reseed() -> None:
    global _prefix, _counter
    _prefix = uuid.uuid4().hex[:20]
    _counter = itertools.count()


_reseed()
os.register_at_fork(after_in_child=_reseed)  # a forked child must not repeat its parent's ids


def new_event_id() -> str:
    return f"{_prefix}{next(_counter):x}"


def new_event_ids(count: int) -> list[str]:
    """`count` fresh ids at once (an append of a whole episode asks for dozens)."""
    prefix = _prefix
    return [f"{prefix}{n:x}" for n in itertools.islice(_counter, count)]
