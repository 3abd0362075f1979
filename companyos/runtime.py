"""One live episode: the domain's pure step plus the log. Shared by CompanyEnv and the server.

The runtime never decides anything itself: the domain emits the events, the runtime appends
them (per step, or all at once at the end) and folds nothing twice.
"""

from __future__ import annotations

import os
import re
import time
import weakref
from typing import Any

import orjson

import domain
from companyos.observation import Observation
from eventstore import (
    MAX_EVENT_BYTES,
    ConcurrencyError,
    EventStore,
    NewEvent,
    NewStream,
    StreamHead,
)
from projections.replay import EpisodeNotFound  # one class for 'no such episode', every layer
from projections.views import DamagedEvent, check_episode_stream, check_stream_head, decode

DURABILITY = ("step", "episode")

# An episode id travels in URLs, headers and `<id>.<token>` session keys, and is a text column.
EPISODE_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}")
EPISODE_ID_RULE = ("episode_id must be 1-128 characters of letters, digits, '_', '.', ':' or '-', "
                   "starting with a letter or digit")


def episode_id_problem(episode_id: object) -> str | None:
    """What is wrong with an episode id, in words (None: nothing); the same rule in process and
    over the network, so no episode is logged under an id a client could not name."""
    if isinstance(episode_id, str) and EPISODE_ID_RE.fullmatch(episode_id):
        return None
    return EPISODE_ID_RULE


def new_episode_id() -> str:
    """A fresh episode id: a UUIDv7 (RFC 9562) as 32 hex digits, its first 48 bits the Unix time
    in milliseconds, the rest random.

    Ids that grow with time keep the store's stream index written at its right edge: random
    (v4) ids dirtied a random leaf of a 50 MB index per episode, which at a million episodes
    left SQLite's cache and cost `run` ~6% (docs/performance.md). Only the ids' order follows
    the clock; nothing replayed depends on them.
    """
    value = (time.time_ns() // 1_000_000 & _MS_MASK) << 80 | int.from_bytes(os.urandom(10), "big")
    return f"{value & _VERSION_CLEAR | _VERSION_7:032x}"


_MS_MASK = (1 << 48) - 1
_VERSION_CLEAR = ~(0xF << 76 | 0x3 << 62)  # the version nibble and the variant's two bits
_VERSION_7 = 0x7 << 76 | 0x2 << 62  # version 7, variant 10 (RFC 9562)


class EpisodeExists(ConcurrencyError):
    """A reset named an episode id the store already holds: said at the reset, whatever the
    durability, not when a held-back episode is finally written and all its steps are lost."""

    def __init__(self, episode_id: str, version: int) -> None:
        super().__init__(episode_id, None, version)
        self.args = (f"episode {episode_id!r} is already in the store; pass another episode_id, "
                     "or none for a fresh one",)


def to_new_events(events: list) -> list[NewEvent]:
    """Domain events as store envelopes (built as plain tuples: this runs for every event)."""
    to_envelope = domain.to_envelope
    return [_new(NewEvent, (*to_envelope(event), None, None)) for event in events]


_new = tuple.__new__


class EpisodeRuntime:
    """The state of one episode and the bookkeeping that keeps the log in step with it."""

    __slots__ = ("episode_id", "state", "store", "durability", "start_meta", "digest",
                 "group", "_stored_version", "_pending", "__weakref__")

    def __init__(self, store: EventStore, episode_id: str, state, durability: str,
                 start_meta: dict | None, stored_version: int | None, digest: str = "",
                 group: CommitGroup | None = None) -> None:
        self.store = store
        self.group = group  # where a new episode goes when it ends, if durability is "episode"
        self.episode_id = episode_id
        self.state = state
        self.durability = durability
        self.start_meta = start_meta or {}
        self._stored_version = stored_version
        self.digest = digest  # the stream digest of what is stored so far
        self._pending: list = []

    @classmethod
    def start(cls, store: EventStore, spec: domain.EpisodeSpec, *, episode_id: str | None = None,
              durability: str = "step", meta: dict | None = None,
              group: CommitGroup | None = None):
        """Reset the world for `spec` and log EpisodeStarted with the initial world (with
        durability "episode" and a `group`, the ended episode is handed to the group to write)."""
        check_group(durability, group)
        if episode_id is not None:
            if problem := episode_id_problem(episode_id):
                raise ValueError(problem)
            # held back, the first append comes at the end: ask the store now (per step, the
            # reset's own append finds the id taken, at no extra read)
            if durability == "episode" and (version := store.stream_version(episode_id)) is not None:
                raise EpisodeExists(episode_id, version)
        state, events, info = domain.reset(spec)
        runtime = cls(store, episode_id or new_episode_id(), state, durability, meta, None,
                      group=group)
        try:
            runtime._record(events, state.done, first_meta=meta)
        except ConcurrencyError as exc:
            raise EpisodeExists(runtime.episode_id, exc.actual) from None
        return runtime, info

    @classmethod
    def load(cls, store: EventStore, episode_id: str, durability: str = "step") -> EpisodeRuntime:
        """Rebuild a running episode from its stream alone, so any process can continue it."""
        records = list(store.read_stream(episode_id))
        if not records:
            raise EpisodeNotFound(f"no episode {episode_id!r} in the store")
        check_episode_stream(records)
        check_stream_head(records, store.stream_head(episode_id))
        state = domain.fold([decode(r) for r in records])
        version = domain.rules_of(state.target)
        standing = domain.rules_standing(version)
        if standing == "none":  # 4.0 and true passed for 4 and 1
            raise DamagedEvent(records[0], f"names rules {version!r}, which is no rules version "
                                           "(a whole number from 1)")
        if standing == "newer":
            raise UnknownRules(f"episode {episode_id!r} is {domain.unknown_rules_text(version)}: "
                               "upgrade companyos to continue it")
        return cls(store, episode_id, state, durability, records[0].meta, records[-1].version,
                   records[-1].digest)

    @property
    def stored_version(self) -> int | None:
        """Version of the last event this runtime wrote (or loaded); None before anything is stored."""
        return self._stored_version

    def step(self, action: Any) -> domain.StepInfo:
        """Apply one action and log its events; if the log refuses them, the live episode stays
        where the log is (a ValueError, nothing applied), so what the agent saw is what is stored."""
        state, events, info = domain.step(self.state, action)
        check_loggable(events)
        self._record(events, state.done)
        self.state = state
        return info

    def _record(self, events: list, done: bool = False, first_meta: dict | None = None) -> None:
        if self.durability == "episode":
            self._pending.extend(events)
            if done:
                try:
                    if self.group is not None and self._stored_version is None:
                        self.group.hold(self)
                    else:
                        self.flush()
                except BaseException:
                    del self._pending[len(self._pending) - len(events):]  # this step never happened
                    raise
            return
        self._append(as_logged(events, first_meta))

    def _append(self, new: list[NewEvent]) -> None:
        self._stored_version, self.digest = self.store.append_head(self.episode_id, new,
                                                                   self._stored_version)

    def pending_as_logged(self) -> list[NewEvent]:
        """The events held back, as the store takes them (a flush's, or a CommitGroup's)."""
        return as_logged(self._pending, self.start_meta if self._stored_version is None else None)

    def forget_pending(self) -> None:
        """Drop the events held back: a CommitGroup writes them."""
        self._pending = []

    def logged(self, head: StreamHead) -> None:
        """Told by a CommitGroup that the episode is now in the log, up to `head`."""
        self._stored_version, self.digest = head

    def flush(self) -> None:
        """Write events held back by `durability="episode"`; a no-op with per-step durability."""
        if self._pending:
            self._append(self.pending_as_logged())
            self._pending = []

    def flush_or_discard(self) -> None:
        """Flush when the episode is left (a reset, a close): if the log still refuses what was
        held back, drop it and say so, once. Keeping it would make every later reset and close
        fail the same way, and leave the environment unusable."""
        try:
            self.flush()
        except Exception as exc:
            lost, self._pending = len(self._pending), []
            raise UnloggedEpisode(f"episode {self.episode_id!r} was not logged and is dropped "
                                  f"({lost} events held back by durability='episode'): {exc}") from exc

    def observe(self, info: domain.StepInfo) -> dict[str, Any]:
        observation = Observation(domain.observe(self.state, info))
        observation["tools"] = TOOL_NAMES
        return observation


def as_logged(events: list, first_meta: dict | None) -> list[NewEvent]:
    """Domain events as one append; who ran the episode (and secrets) travel in the first
    event's meta, outside the digest."""
    new = to_new_events(events)
    if first_meta and new:
        new[0] = new[0]._replace(meta=first_meta)
    return new


class CommitGroup:
    """Ended episodes written together: one transaction for up to `size` of them.

    Why: `companyos run` logs thousands of episodes a second, and every transaction pays the
    store's fixed cost (SQLite's write lock, the pages each commit rewrites, the other worker
    waiting). Each episode is still one append, all or nothing, with the digest it would have
    alone; what a crash can lose grows from the episode under way to the ended ones held here,
    which the runner has not reported either. The group keeps only their encoded events and a
    weak reference to each runtime, not the episodes' states: holding 16 whole states alive cost
    more CPU than grouping saved.
    """

    def __init__(self, store: EventStore, size: int) -> None:
        if size < 1:
            raise ValueError("a commit group holds at least one episode")
        self.store = store
        self.size = size
        self._streams: list[NewStream] = []
        self._runtimes: list[weakref.ref[EpisodeRuntime]] = []

    @property
    def full(self) -> bool:
        return len(self._streams) >= self.size

    def hold(self, runtime: EpisodeRuntime) -> None:
        """Take an ended episode that is not in the log yet, to write at the next `commit`.

        Its events are checked and encoded now, while they are fresh in the CPU's caches
        (encoding a whole group at commit time cost more), and so that a bad one is refused at
        the step that ended the episode, as a flush would refuse it. The runtime holds nothing
        to write afterwards; once `commit` has written it, the runtime (if still in use) knows
        its stream's head, as after a flush.
        """
        self._streams.append(self.store.new_stream(runtime.episode_id, runtime.pending_as_logged()))
        runtime.forget_pending()
        self._runtimes.append(weakref.ref(runtime))

    def commit(self) -> list[tuple[str, StreamHead]]:
        """Write every held episode in one transaction: their (episode id, head) in the order
        they were held. If the store refuses, nothing of the group is written, the group is
        emptied and the error says why."""
        streams, runtimes = self._streams, self._runtimes
        self._streams, self._runtimes = [], []
        if not streams:
            return []
        heads = self.store.create_streams(streams)
        for ref, head in zip(runtimes, heads, strict=True):
            if (runtime := ref()) is not None:
                runtime.logged(head)
        return [(stream.commit.stream_id, head) for stream, head in zip(streams, heads, strict=True)]


def check_group(durability: str, group: CommitGroup | None) -> None:
    """Refuse an unknown durability, and a commit group without durability "episode"."""
    if durability not in DURABILITY:
        raise ValueError(f"durability must be one of {DURABILITY}, not {durability!r}")
    if group is not None and durability != "episode":
        raise ValueError("a commit group writes whole episodes: it needs durability='episode'")


class UnknownRules(RuntimeError):
    """An episode judged by a rules version this companyos does not know (logged by a newer
    release): continuing it would judge its next steps by other rules, and the log would hold an
    episode its own rules never judged."""


class UnloggedEpisode(RuntimeError):
    """Events held back by `durability="episode"` that the log refused when the episode was left."""


# An action travels in its ActionTaken event (and may be echoed by one effect): leave room for the rest.
MAX_ACTION_BYTES = MAX_EVENT_BYTES - 4096
# Effects quote an action's values at most a few times (a submission's data, and its problems with
# the values' repr, which may escape a character into 6): below this no event of a step can reach
# the log's limit, so only bigger actions pay for measuring every event.
_QUOTE_FACTOR = 8


def check_loggable(events: list) -> None:
    """Refuse a step too big for the log before it is applied: with `durability="episode"` the
    store would only refuse it when the episode ends, and every step of the episode would be lost
    with it. The domain already made every value JSON, so plain orjson gives the sizes (canonical
    JSON only sorts the keys) at a fifth of the cost."""
    size = len(orjson.dumps(events[0].action))  # the step's ActionTaken: the action as logged
    if size > MAX_ACTION_BYTES:
        raise ValueError(f"the action is {size} bytes of JSON; an action is at most {MAX_ACTION_BYTES}")
    if size * _QUOTE_FACTOR <= MAX_EVENT_BYTES:
        return
    for event in events[1:]:
        name, data, _ = domain.to_envelope(event)
        if (n := len(orjson.dumps(data))) > MAX_EVENT_BYTES:
            raise ValueError(f"the action would log a {name} event of {n} bytes of JSON (it quotes "
                             f"the action's values), over the log's limit of {MAX_EVENT_BYTES}")


# Every observation lists the tools by reference: one shared tuple, never copied per step.
TOOL_NAMES: tuple[str, ...] = tuple(t.name for t in domain.TOOLS)
