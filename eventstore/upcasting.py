"""Upcasters: old events are read in the current schema, the stored bytes are never rewritten."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from eventstore.encoding import canonical_json
from eventstore.records import RecordedEvent

Upcaster = Callable[[dict[str, Any]], dict[str, Any]]


class Upcasters:
    """A registry of `(type, from_version) -> function` that lifts data one schema version."""

    def __init__(self) -> None:
        self._steps: dict[tuple[str, int], Upcaster] = {}
        self.types: frozenset[str] = frozenset()

    def register(self, type_: str, from_version: int, fn: Upcaster) -> None:
        """`fn` lifts `type_`'s data from `from_version` to the next. Checked here, where the
        mistake is made, not on the first read of such an event (a version 0 never ran at all)."""
        if type(type_) is not str or not type_:
            raise ValueError(f"an upcaster's event type must be a non-empty string, not {type_!r}")
        if type(from_version) is not int or from_version < 1:
            raise ValueError(f"an upcaster lifts a schema version (1 or more), not {from_version!r}")
        if not callable(fn):
            raise ValueError(f"an upcaster must be callable (data -> data), not {type(fn).__name__}")
        key = (type_, from_version)
        if key in self._steps:
            raise ValueError(f"an upcaster for {type_} v{from_version} is already registered")
        self._steps[key] = fn
        self.types = self.types | {type_}

    def upcaster(self, type_: str, from_version: int) -> Callable[[Upcaster], Upcaster]:
        """Decorator form of `register`."""

        def wrap(fn: Upcaster) -> Upcaster:
            self.register(type_, from_version, fn)
            return fn

        return wrap

    def apply(self, record: RecordedEvent) -> RecordedEvent:
        """Lift a record through every registered step; records of other types pass untouched."""
        if record.type not in self.types:
            return record
        version = record.schema_version
        step = self._steps.get((record.type, version))
        if step is None:
            return record
        data = record.data
        while step is not None:
            data = step(data)
            if type(data) is not dict:  # an event's data is a JSON object: a list read back as one
                raise TypeError(f"the upcaster of {record.type} v{version} returned "
                                f"{type(data).__name__}, not the event's data as a dict")
            version += 1
            step = self._steps.get((record.type, version))
        return record._replace(data_json=canonical_json(data).decode(), schema_version=version)
