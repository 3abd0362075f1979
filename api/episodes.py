"""The episode log over HTTP: listing (the `episodes` read model), one episode, its events, and
its app views at any step (time travel through `projections.replay`)."""

from __future__ import annotations

import threading
import time
from typing import Any

import orjson
import sqlalchemy as sa

from api.sessions import ApiError, log_damaged, public_meta, writes_refused
from companyos.runtime import episode_id_problem
from eventstore import CorruptCommit, EventStore
from projections.episodes import EpisodesProjection, count_episodes, episode_filters, summarize
from projections.reader import snapshot
from projections.replay import EpisodeNotFound, StepNotFound, replay
from projections.rerun import rerun_records
from projections.runner import ProjectionRunner
from projections.schema import episodes as episodes_table

_HIDDEN_COLUMNS = ("first_position", "last_position")


class _CatchUp:
    """One catch-up of the read models to a log position, run on its own thread so that a page
    can stop waiting for it (the first list after a run of 232,000 episodes took 103 s) while it
    goes on and the next request finds the work done."""

    def __init__(self, fold: Any, upto: int, count_end: Any) -> None:
        self.upto = upto
        self.behind = 0
        self.error: BaseException | None = None
        self.ended_as = 0  # how many catch-ups had ended once this one did
        self.done = threading.Event()
        threading.Thread(target=self._run, args=(fold, count_end), name="episodes-catch-up",
                         daemon=True).start()

    def _run(self, fold: Any, count_end: Any) -> None:
        try:
            self.behind = fold(self.upto)
        except BaseException as exc:  # handed to every request that waits for this one
            self.error = exc
        finally:
            self.ended_as = count_end()
            self.done.set()


class EpisodeLog:
    """Read side of the server. The list comes from the `episodes` read model, caught up before
    each query (so it is never behind the log, unless the caller gives a page a time to wait:
    then it lists what the read model holds so far); single episodes are folded from their
    stream."""

    def __init__(self, store: EventStore) -> None:
        self.store = store
        self._runner = ProjectionRunner(store, [EpisodesProjection()])
        self._catch_up_lock = threading.Lock()
        self._job: _CatchUp | None = None  # the latest catch-up, running or ended
        self._ended = 0  # catch-ups ended so far

    def list(self, *, task: str | None = None, agent: str | None = None, outcome: str | None = None,
             rules: int | str | None = None, failure_mode: str | None = None, limit: int = 50,
             offset: int = 0, before: int | None = None, after: int | None = None,
             wait_s: float | None = None) -> dict[str, Any]:
        """One page of episodes, newest first. `before`/`after`: only episodes that began before
        (after) that log position, the cursors a page hands out (`next_before`, `prev_after`), so
        paging holds still while episodes are logged (by offset, 10 new episodes made "older"
        repeat 10 rows). `wait_s`: how long to wait for the read model to catch up before listing
        what it holds (`catching_up` then says the rest is on its way); None waits for all of it."""
        if before is not None and after is not None:
            raise ApiError(400, "invalid_filter", "give before or after, not both: before pages "
                           "towards older episodes, after towards newer ones")
        table = episodes_table
        try:  # before the catch-up, which may wait a minute for a busy store
            where = episode_filters(task, agent, outcome, rules, failure_mode=failure_mode)
        except ValueError as exc:
            raise ApiError(400, "invalid_filter", str(exc)) from None
        behind, catching_up = self._caught_up(self.store.last_position(), wait_s)
        columns = [c for c in table.c if c.name not in _HIDDEN_COLUMNS]
        position = table.c.first_position
        query = sa.select(*columns, position).where(*where)
        if after is not None:  # the page just newer than `after`: the oldest of them first, turned
            query = query.where(position > after).order_by(position.asc())
        else:
            older = [position < before] if before is not None else []
            query = query.where(*older).order_by(position.desc())
        with snapshot(self.store) as conn:  # rows, total and count of one moment of the read model
            found = [dict(row) for row in conn.execute(query.limit(limit).offset(offset)).mappings()]
            if after is not None:
                found.reverse()
            total = count_episodes(conn, task=task, agent=agent, outcome=outcome, rules=rules,
                                   failure_mode=failure_mode)
            cursored = before is not None or after is not None
            newer = offset  # by offset, the rows before the page; by cursor, counted
            if cursored:
                edge = (position >= found[0]["first_position"] if found  # the page's newest row
                        else position >= before if before is not None else position > after)
                counted = conn.execute(sa.select(sa.func.count()).where(*where, edge)).scalar_one()
                newer = counted - bool(found)  # the page's newest row is not newer than itself
        rows = [{str(k): v for k, v in row.items() if k != "first_position"} for row in found]
        more = newer + len(rows) < total
        return {"episodes": rows, "total": total, "limit": limit, "offset": offset,
                "next_offset": offset + len(rows) if more and not cursored else None,
                "newer": min(newer, total),
                "next_before": found[-1]["first_position"] if found and more else None,
                "prev_after": found[0]["first_position"] if found and newer else None,
                "read_models_behind": behind, "catching_up": catching_up}

    def _caught_up(self, upto: int, wait_s: float | None = None) -> tuple[int, bool]:
        """Catch the read model up to `upto` (the log as asked: steps logged meanwhile are not
        waited for); (how many events it is behind, whether a catch-up is still under way).

        One catch-up at a time: a listing takes the answer of one that ended after it came, a
        failure included, and starts another only if none did, or that one ended short of `upto`
        (else each listing queued behind the last paid its own minute for the same busy store, one
        after another)."""
        arrived = self._ended
        deadline = None if wait_s is None else time.monotonic() + wait_s
        while True:
            with self._catch_up_lock:
                job = self._job
                ended = job is not None and job.done.is_set()
                if job is None or (ended and job.ended_as <= arrived
                                   and (job.error is not None or job.upto < upto)):
                    job = self._job = _CatchUp(self._fold, upto, self._count_end)
            left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            if not job.done.wait(left):  # what the read model holds so far, and how much it misses
                return self._behind(), True
            if job.error is not None:
                raise job.error
            if job.upto >= upto:
                return job.behind, False
            arrived = job.ended_as  # it ended short of this listing's position: catch up anew

    def _count_end(self) -> int:
        with self._catch_up_lock:
            self._ended += 1
            return self._ended

    def _behind(self) -> int:
        """Events of the log the read model has not folded yet."""
        return self.store.count_events(min(self._runner.stored_checkpoints().values()))

    def _fold(self, upto: int) -> int:
        """Fold the log into the read model up to `upto`; how many events it is still behind (0,
        unless the database takes no writes)."""
        try:
            self._runner.catch_up(upto=upto)
            return 0
        except Exception as exc:
            if not writes_refused(exc):
                raise
            # a database that takes no writes (a standby, a read-only role): what the read
            # models hold, and how much of the log they miss, as `companyos episodes` lists it
            # (this was a 503 once the log had moved past them)
            return self._behind()

    def _records(self, episode_id: str) -> list:
        if episode_id_problem(episode_id):
            raise ApiError(404, "episode_not_found", f"no episode {episode_id!r}")
        try:
            records = list(self.store.read_stream(episode_id))
        except CorruptCommit as exc:
            raise log_damaged(exc) from None
        if not records:
            raise ApiError(404, "episode_not_found", f"no episode {episode_id!r}")
        return records

    def get(self, episode_id: str) -> dict[str, Any]:
        return _summary(episode_id, self._records(episode_id))

    def get_with_events(self, episode_id: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """The summary and every event, from one read of the stream (the web UI's episode page)."""
        records = self._records(episode_id)
        return _summary(episode_id, records), _event_dicts(records)

    def events(self, episode_id: str, from_version: int = 0, limit: int = 100) -> dict[str, Any]:
        """Events from stream version `from_version` on (versions, not list positions: a stream
        damaged by a missing commit has a gap, and the page must still start where it says)."""
        records = self._records(episode_id)
        start = next((i for i, r in enumerate(records) if r.version >= from_version), len(records))
        page = records[start:start + limit]
        more = start + len(page) < len(records)
        return {"episode_id": episode_id, "events": _event_dicts(page), "from_version": from_version,
                "next_from_version": page[-1].version + 1 if more else None,
                "total": len(records)}

    def rerun(self, episode_id: str) -> dict[str, Any]:
        """Re-simulated from its seed, options and actions, and compared with the log by digest:
        `match` is the answer, `first_difference` where the two streams part (an episode whose
        first events are missing is a mismatch, as `companyos rerun` says, not "no episode")."""
        records = self._records(episode_id)
        if records[0].version == 0 and records[0].type != "EpisodeStarted":
            raise ApiError(404, "episode_not_found", f"{episode_id!r} is not an episode stream")
        return rerun_records(self.store, episode_id, records).to_json()

    def views(self, episode_id: str, step: int | None = None) -> dict[str, Any]:
        if episode_id_problem(episode_id):
            raise ApiError(404, "episode_not_found", f"no episode {episode_id!r}")
        try:
            return replay(self.store, episode_id, step)
        except EpisodeNotFound as exc:
            raise ApiError(404, "episode_not_found", str(exc)) from None
        except StepNotFound as exc:
            raise ApiError(404, "step_not_found", str(exc)) from None
        except CorruptCommit as exc:
            raise log_damaged(exc) from None


def _summary(episode_id: str, records: list) -> dict[str, Any]:
    """An episode's summary row (as the listing has it) plus its goal, folded from its stream. A
    stream that does not fold because it is damaged is a 500 `log_damaged` naming the event, as
    the views say; "no episode" (404) only for a stream that is whole and no episode."""
    failures: list[tuple] = []
    try:
        row = summarize(episode_id, records,
                        on_error=lambda _name, record, exc: failures.append((record, exc)))
    except orjson.JSONDecodeError:  # a running episode's rewards, summed as its row is made
        for record in records:
            _decoded(record, record.data_json)  # raises, naming the damaged event
        raise
    if row is None:
        if records[0].version != 0:
            raise _damaged(episode_id, f"its first stored event is version {records[0].version}: "
                                       "the events before it are missing")
        if failures:
            record, exc = failures[0]
            raise _damaged(episode_id, f"the event at version {record.version} (position "
                                       f"{record.position}) does not fold: {type(exc).__name__}: {exc}")
        raise ApiError(404, "episode_not_found", f"{episode_id!r} is not an episode stream")
    for column in _HIDDEN_COLUMNS:
        row.pop(column, None)
    row["goal"] = _decoded(records[0], records[0].data_json).get("goal")
    return row


def _damaged(episode_id: str, what: str) -> ApiError:
    return ApiError(500, "log_damaged", f"stream {episode_id!r}: {what}; `companyos verify` names "
                                        "every damaged episode")


def _decoded(record, text: str) -> Any:
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError as exc:  # damaged behind the store's back: said, not a bare 500
        raise _damaged(record.stream_id, f"the event at version {record.version} (position "
                                         f"{record.position}) does not decode: {exc}") from None


def _event_dicts(records: list) -> list[dict[str, Any]]:
    """Events as the API shows them: data decoded, secrets removed from the meta."""
    return [{"version": r.version, "position": r.position, "type": r.type,
             "schema_version": r.schema_version, "data": _decoded(r, r.data_json),
             "meta": public_meta(_decoded(r, r.meta_json)), "digest": r.digest}
            for r in records]
