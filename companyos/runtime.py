"""One live episode: the domain's pure step plus the log. Shared by CompanyEnv and the server.

The runtime never decides anything itself: the domain emits the events, the runtime appends
them (per step, or all at once at the end) and folds nothing twice.
"""

from __future__ import annotations

import uuid
from typing import Any

import domain
from companyos.observation import Observation
from eventstore import EventStore, NewEvent
from projections.replay import EpisodeNotFound  # one class for 'no such episode', every layer

DURABILITY = ("step", "episode")


def to_new_events(events: list) -> list[NewEvent]:
    """Domain events as store envelopes (built as plain tuples: this runs for every event)."""
    to_envelope = domain.to_envelope
    return [_new(NewEvent, (*to_envelope(event), None, None)) for event in events]


_new = tuple.__new__


class EpisodeRuntime:
    """The state of one episode and the bookkeeping that keeps the log in step with it."""

    __slots__ = ("episode_id", "state", "store", "durability", "start_meta", "digest",
                 "_stored_version", "_pending")

    def __init__(self, store: EventStore, episode_id: str, state, durability: str,
                 start_meta: dict | None, stored_version: int | None, digest: str = "") -> None:
        self.store = store
        self.episode_id = episode_id
        self.state = state
        self.durability = durability
        self.start_meta = start_meta or {}
        self._stored_version = stored_version
        self.digest = digest  # the stream digest of what is stored so far
        self._pending: list = []

    @classmethod
    def start(cls, store: EventStore, spec: domain.EpisodeSpec, *, episode_id: str | None = None,
              durability: str = "step", meta: dict | None = None):
        """Reset the world for `spec` and log EpisodeStarted with the initial world."""
        if durability not in DURABILITY:
            raise ValueError(f"durability must be one of {DURABILITY}, not {durability!r}")
        state, events, info = domain.reset(spec)
        runtime = cls(store, episode_id or uuid.uuid4().hex, state, durability, meta, None)
        runtime._record(events, first_meta=meta)
        return runtime, info

    @classmethod
    def load(cls, store: EventStore, episode_id: str, durability: str = "step") -> EpisodeRuntime:
        """Rebuild a running episode from its stream alone, so any process can continue it."""
        records = list(store.read_stream(episode_id))
        if not records:
            raise EpisodeNotFound(f"no episode {episode_id!r} in the store")
        events = [domain.from_envelope(r.type, r.data, r.schema_version) for r in records]
        state = domain.fold(events)
        return cls(store, episode_id, state, durability, records[0].meta, records[-1].version,
                   records[-1].digest)

    @property
    def stored_version(self) -> int | None:
        """Version of the last event this runtime wrote (or loaded); None before anything is stored."""
        return self._stored_version

    def step(self, action: Any) -> domain.StepInfo:
        state, events, info = domain.step(self.state, action)
        self.state = state
        self._record(events)
        return info

    def _record(self, events: list, first_meta: dict | None = None) -> None:
        if self.durability == "episode":
            self._pending.extend(events)
            if self.state.done:
                self.flush()
            return
        self._append(events, first_meta)

    def _append(self, events: list, first_meta: dict | None = None) -> None:
        new = to_new_events(events)
        if first_meta and new:  # who ran the episode (and secrets) travel outside the digest
            new[0] = new[0]._replace(meta=first_meta)
        recorded = self.store.append(self.episode_id, new, self._stored_version)
        self._stored_version = recorded[-1].version
        self.digest = recorded[-1].digest

    def flush(self) -> None:
        """Write events held back by `durability="episode"`; a no-op with per-step durability."""
        if self._pending:
            pending, self._pending = self._pending, []
            self._append(pending, self.start_meta if self._stored_version is None else None)

    def observe(self, info: domain.StepInfo) -> dict[str, Any]:
        observation = Observation(domain.observe(self.state, info))
        observation["tools"] = TOOL_NAMES
        return observation


# Every observation lists the tools by reference: one shared tuple, never copied per step.
TOOL_NAMES: tuple[str, ...] = tuple(t.name for t in domain.TOOLS)
