"""The app views read model: each episode's TicketDesk board, DataHub catalogue, ApprovalFlow queue.

There is one definition of every view: the apps' own `evolve` functions (`domain.world.EVOLVERS`,
which `domain.apply` composes for the live environment) fold the events, and the apps' `view`
functions (`domain.views`) render the state. So a rebuilt view equals what the live world showed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson
import sqlalchemy as sa

import domain
from domain import world as domain_world
from eventstore import CorruptCommit, EventStore, RecordedEvent
from projections.render import APPS, render_views
from projections.runner import Projection, fold_records, read_rows
from projections.schema import episode_views

_loads = orjson.loads
_dumps = orjson.dumps
_SORTED = orjson.OPT_SORT_KEYS
_from_envelope = domain.from_envelope
_INITIAL = domain_world.INITIAL_WORLD
_evolve = domain_world.evolve
_APP_EVENTS = frozenset(cls.__name__ for cls in domain_world.EVOLVERS)


def decode(record: RecordedEvent) -> Any:
    """The domain event a stored record holds (upcast to the current schema by the domain);
    DamagedEvent, naming it, when it holds none."""
    try:
        return _from_envelope(record.type, _loads(record.data_json), record.schema_version)
    except (ValueError, TypeError, KeyError) as exc:  # orjson's JSONDecodeError is a ValueError
        raise DamagedEvent(record, f"does not decode: {type(exc).__name__}: {exc}") from None


def check_episode_stream(records: Sequence[RecordedEvent]) -> None:
    """An episode's stream begins with EpisodeStarted, and its versions run 0, 1, 2, … without a
    gap: without its head (its first commit deleted) there is no world to fold from, and folding
    on over a gap (a commit deleted from its middle) would show, or continue, a world never logged."""
    if records[0].type != "EpisodeStarted":
        raise DamagedEvent(records[0], f"is {records[0].type}; an episode starts with EpisodeStarted")
    for expected, record in enumerate(records):
        if record.version != expected:
            raise DamagedEvent(record, f"follows version {expected - 1}: the events between "
                               "them are gone from the log (a commit deleted)")


def head_problem(head: tuple[int, str], last_version: int, last_digest: str) -> str | None:
    """Why a stream's head columns (what writers chain the next step onto, and what
    `stream_digest` answers) do not state its last event, if they do not."""
    version, digest = head
    if (version, digest) == (last_version, last_digest):
        return None
    return (f"its head (version {version}, digest {digest}) is not its last event (version "
            f"{last_version}, digest {last_digest}): the commit's head columns were altered")


def stream_head_problem(records: Sequence[RecordedEvent],
                        head: tuple[int, str] | None) -> str | None:
    """`head_problem` of a stream read by version. `head` is read after the records, so a head
    past them is another writer's step since, not damage."""
    last = records[-1]
    if head is None or head[0] > last.version:
        return None
    return head_problem(head, last.version, last.digest)


def check_stream_head(records: Sequence[RecordedEvent], head: tuple[int, str] | None) -> None:
    """Refuse to continue a stream whose head columns were altered: the next honest step would
    chain onto them, and be the one `verify` and `rerun` then blame."""
    if problem := stream_head_problem(records, head):
        raise DamagedEvent(records[-1], f"ends the stream, but {problem}")


class DamagedEvent(CorruptCommit):
    """A stored event that unpacks but is no domain event (its type, schema version or data was
    edited behind the store's back): reported like a commit that does not unpack, everywhere."""

    def __init__(self, record: RecordedEvent, problem: str) -> None:
        super().__init__(record.stream_id, record.position, problem)
        self.args = (f"stream {record.stream_id!r}: the event at version {record.version} "
                     f"(position {record.position}) {problem}",)


class WorldState:
    """The three apps' states of one episode, its step count and whether it has ended."""

    __slots__ = ("world", "step", "done")

    def __init__(self) -> None:
        self.world = _INITIAL
        self.step = 0
        self.done = False


class ViewsProjection(Projection):
    """State per stream = the apps' world folded with the domain's own app evolvers.

    Only app events are decoded: agent actions, rewards and mistakes never change what an app
    shows, so the runner skips them (ActionTaken only advances the step; verify checks types).
    `domain.apply` composes exactly these evolvers, so the live world and the rebuild agree.
    """

    name = "views"
    version = 1
    table = episode_views
    key = "episode_id"
    types = frozenset({*_APP_EVENTS, "ActionTaken", "EpisodeStarted", "EpisodeEnded"})

    def evolve(self, state: WorldState | None, record: RecordedEvent) -> WorldState | None:
        type_ = record.type
        if type_ in _APP_EVENTS:
            if state is None:
                return None
            state.world = _evolve(state.world, decode(record))  # as domain.apply does
        elif type_ == "ActionTaken" and state is not None:
            state.step += 1
        elif type_ == "EpisodeStarted":
            if state is None and record.version != 0:
                return None
            return WorldState()  # as domain.apply: a start resets the world
        elif type_ == "EpisodeEnded" and state is not None:
            state.done = True
        return state

    def row(self, stream_id: str, state: WorldState, last: RecordedEvent) -> dict[str, Any]:
        return {"episode_id": stream_id, "last_version": last.version, "step": state.step,
                "views": views_json(state)}

    def finished(self, state: WorldState) -> bool:
        return state.done

    def load(self, store: EventStore, conn: sa.Connection,
             stream_ids: Sequence[str]) -> dict[str, tuple[int, Any]]:
        """Re-fold each stream from the log up to the version its stored row reflects."""
        rows = read_rows(conn, episode_views, "episode_id", stream_ids, ("last_version",))
        out = {}
        for sid, row in rows.items():
            upto = row["last_version"]
            records = [r for r in store.read_stream(sid) if r.version <= upto]
            entry = fold_records(self, records).get(sid)
            if entry is not None:
                out[sid] = (entry.version, entry.state)
        return out


def views_of(state: Any) -> dict[str, Any]:
    """The three apps' views of an episode state (the domain's) or a WorldState, as JSON values."""
    if isinstance(state, WorldState):
        return domain_world.views(state.world)
    return domain.views(state)


def views_json(state: Any) -> str:
    """Canonical JSON (sorted keys, compact) of the views; their values come from canonical
    event data, so the encoder's non-finite-number guard is not needed here."""
    return _dumps(views_of(state), option=_SORTED).decode()


__all__ = ["APPS", "ViewsProjection", "decode", "render_views", "views_json", "views_of"]
