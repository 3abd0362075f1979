"""Integrity checks over the whole log, and proof that every read model equals its rebuild.

Per stream: versions contiguous from 0 and in log order, each stored digest equal to the chain
over (previous digest, type, schema version, data), `EpisodeStarted` first, at most one
`EpisodeEnded` and nothing after it, every type and schema version known to the domain, and
a rules version the domain knows.
The same pass folds every projection in memory with the runner's own rules, up to that
projection's checkpoint; the rows are compared with the stored read models at the end (by
hash, so memory stays small; a differing row is re-derived to say which columns differ).

The checks are per stream, so on a SQLite file they split over worker processes by ranges
of stream ids; each worker reads only its own streams through the (stream_id, version) index.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
import sqlalchemy as sa

import domain
from eventstore import GENESIS_DIGEST, EventStore, RecordedEvent, canonical_json, chain_digest
from projections.reader import STAND_IN, UNREADABLE_VERSION, fetch_page, snapshot, stream_records
from projections.runner import Entry, Projection, fold_records, row_of
from projections.schema import projection_checkpoints
from projections.views import head_problem


def _rules_named(data_json: str) -> object:
    """The rules version an EpisodeStarted's data names: 1 where it names none, or where the data
    is no JSON (the digest check blames that)."""
    try:
        data = orjson.loads(data_json)
    except orjson.JSONDecodeError:
        return 1
    return domain.rules_of(data.get("target") if type(data) is dict else None)


def _rules_problem(rules: object) -> str | None:
    """What is wrong with the rules version an episode names, if anything (`domain.rules_standing`)."""
    standing = domain.rules_standing(rules)
    if standing == "newer":
        return (f"{domain.unknown_rules_text(rules)}: a newer release's episode, which this one "
                "can neither check nor continue")
    if standing == "none":
        return (f"EpisodeStarted names no rules version: rules must be a whole number, one of the "
                f"versions {', '.join(map(str, domain.RULES_VERSIONS))}, not {rules!r}")
    return None


MAX_DETAILS = 20  # differing rows explained column by column; the rest are only named
PAGE = 20_000

Progress = Callable[[int], None]


@dataclass(slots=True)
class VerifyReport:
    streams: int = 0
    events: int = 0
    problems: dict[str, list[str]] = field(default_factory=dict)  # stream id -> what is wrong
    # per read model: rows, checkpoint, differing; `moved_to` (rows None) when another process
    # caught it up while verify ran, or `unfinished_rows` (rows None) when a parallel rebuild was
    # interrupted (its rows wait at checkpoint 0 for the next catch-up): rows not compared
    read_models: dict[str, dict[str, Any]] = field(default_factory=dict)
    upto: int = 0  # the log was checked up to this position
    # commits made before verify began lay past `upto`, waiting on an older transaction
    # (PostgreSQL); commits made while it ran are simply after `upto`
    waiting: bool = False

    @property
    def ok(self) -> bool:
        return not self.problems

    def add(self, stream_id: str, problem: str) -> None:
        found = self.problems.setdefault(stream_id, [])
        if problem not in found:  # a re-derived row may run into the same damage again
            found.append(problem)

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "streams": self.streams, "events": self.events,
                "broken": [{"episode_id": sid, "problems": problems}
                           for sid, problems in sorted(self.problems.items())],
                "read_models": self.read_models, "upto": self.upto, "waiting": self.waiting}


def verify(store: EventStore, projections: Sequence[Projection] | None = None,
           progress: Progress | None = None, page: int = PAGE,
           workers: int | None = None, wait: float = 0.0) -> VerifyReport:
    """Check every stream and every read model; the report names each broken episode.

    `workers` > 1 splits the streams over processes (SQLite files only; None: automatic).
    `wait`: seconds to wait for commits made before the call that an older transaction still
    holds back (PostgreSQL), so that the check covers them.
    """
    from projections.runner import _default_workers, _parallel_capable, bulk

    with store.engine.connect() as conn:  # before the head: a checkpoint never lies beyond it
        checkpoints = dict(conn.execute(
            sa.select(projection_checkpoints.c.name, projection_checkpoints.c.position)).all())
    upto, waiting = store.read_bound(wait)  # the heads and the events, read to one bound
    if workers is None:
        workers = _default_workers(store, upto)
    if workers > 1 and _parallel_capable(store):
        from projections.parallel import check_in_parallel

        checker = check_in_parallel(store, projections, checkpoints, upto, workers, page,
                                    progress)
    else:
        checker = Checker(projections, checkpoints)
        with bulk():
            after = 0
            while records := fetch_page(store, after, page, upto=upto):
                checker.feed(records)
                after = records[-1].position
                if progress is not None:
                    progress(len(records))
        checker.check_heads(store, upto)
    report = checker.finish(store)
    for position, stream_id in store.misplaced_commits():
        report.add(stream_id, f"a commit row at position {position}, past every transaction the "
                              "database has begun: its position was altered, and no reader "
                              "reaches it")
    for position, stream_id in store.misnumbered_commits(upto):
        report.add(stream_id, f"the commit at position {position} states versions that do not "
                              "join the stream's next commit: its version columns were altered, "
                              "and readers starting inside the stream skip or repeat events")
    report.upto = upto
    report.waiting = waiting
    return report


def _known_versions() -> dict[str, set[int]]:
    """Schema versions of each type the code can read: the current one and upcastable older ones."""
    from domain import events as domain_events

    upcasters = getattr(domain_events, "UPCASTERS", {})
    known: dict[str, set[int]] = {}
    for name, cls in domain.EVENT_TYPES.items():
        current = cls.SCHEMA_VERSION
        versions = {current}
        v = current - 1
        while v >= 1 and (name, v) in upcasters:
            versions.add(v)
            v -= 1
        known[name] = versions
    return known


class _Stream:
    __slots__ = ("next_version", "digest", "ended", "position", "disordered", "lost")

    def __init__(self) -> None:
        self.disordered = False  # events came out of version order: its last one is not its head
        self.lost = False  # a commit did not unpack: what follows cannot be checked against it
        self.next_version = 0
        self.digest = GENESIS_DIGEST
        self.ended = -1  # version of EpisodeEnded, -1 while none
        self.position = -1  # of the event last checked


class Checker:
    """Checks pages of records, in log order or stream by stream (each stream by version)."""

    def __init__(self, projections: Sequence[Projection] | None,
                 checkpoints: dict[str, int]) -> None:
        from projections import default_projections

        self.report = VerifyReport()
        if projections is None:
            projections = default_projections(on_error=self._fold_error)
        self.folds = {p.name: Fold(p, checkpoints.get(p.name, 0)) for p in projections}
        self.known = _known_versions()
        self.streams: dict[str, _Stream] = {}

    def _fold_error(self, name: str, record: RecordedEvent, exc: Exception) -> None:
        self.report.add(record.stream_id, f"version {record.version}: {name} cannot fold "
                                          f"{record.type}: {type(exc).__name__}: {exc}")

    def feed(self, records: list[RecordedEvent]) -> None:
        streams = self.streams
        get = streams.get
        known = self.known
        add = self.report.add
        digest_of = chain_digest
        for position, sid, version, _id, type_, schema_version, data_json, _meta, digest in records:
            s = get(sid)
            if s is not None and s.lost:
                continue
            if type_.startswith(STAND_IN):  # once, by position: the versions and digests that
                # follow it would each be blamed in turn for the events it lost
                if s is None:
                    s = streams[sid] = _Stream()
                s.lost = True
                start = "" if version == UNREADABLE_VERSION else f" (from version {version})"
                add(sid, f"the commit at position {position}{start} does not "
                         f"unpack: {type_[len(STAND_IN):-1]}; the stream is not checked past it")
                continue
            if s is None:
                s = streams[sid] = _Stream()
                if type_ != "EpisodeStarted":
                    add(sid, f"the stream starts with {type_} (version {version}), "
                             "not EpisodeStarted")
            elif type_ == "EpisodeStarted":
                add(sid, f"version {version}: EpisodeStarted is not the first event")
            if type_ == "EpisodeStarted" and (problem := _rules_problem(_rules_named(data_json))):
                add(sid, problem)
            if version != s.next_version:
                if version > s.next_version:
                    add(sid, f"version {version} follows version {s.next_version - 1}: "
                             f"{version - s.next_version} event(s) missing")
                elif version == s.next_version - 1:
                    add(sid, f"version {version} is stored twice")
                    s.disordered = True
                else:
                    add(sid, f"version {version} comes after version {s.next_version - 1}: "
                             "events out of order")
                    s.disordered = True
            if position < s.position:
                add(sid, f"version {version} is stored before version {s.next_version - 1} "
                         f"(position {position} < {s.position}): events out of order")
                s.disordered = True
            if digest_of(s.digest, type_, schema_version, data_json) != digest:
                add(sid, f"version {version}: digest does not match the event and its "
                         "predecessor (data, type or order altered)")
            versions = known.get(type_)
            if versions is None:
                add(sid, f"version {version}: unknown event type {type_!r}")
            elif schema_version not in versions:
                add(sid, f"version {version}: {type_} schema version {schema_version} is "
                         f"unknown (code reads {sorted(versions)})")
            if s.ended >= 0:
                add(sid, f"version {version}: {type_} after EpisodeEnded (version {s.ended})")
            elif type_ == "EpisodeEnded":
                s.ended = version
            s.digest = digest
            s.next_version = version + 1
            s.position = position
        for fold in self.folds.values():
            fold.feed(records)
        self.report.events += len(records)

    def check_heads(self, store: EventStore, upto: int, lo: str = "", hi: str | None = None) -> None:
        """Each stream's head columns (what writers chain the next step onto, and what
        `stream_digest` answers) must state its last event: forged, verify said ok, and the next
        honest step was the one blamed."""
        streams = self.streams
        for sid, version, digest in store.stream_heads(upto, lo, hi):
            s = streams.get(sid)  # a stream read out of order ends elsewhere: that is said already
            if s is not None and not (s.disordered or s.lost) and (
                    problem := head_problem((version, digest), s.next_version - 1, s.digest)):
                self.report.add(sid, problem)

    def partial(self) -> dict[str, Any]:
        """What a worker process sends back: its findings and the row hashes of its streams."""
        for fold in self.folds.values():
            fold.close()
        return {"problems": self.report.problems, "streams": len(self.streams),
                "events": self.report.events,
                "folds": {name: (fold.hashes, fold.reopened) for name, fold in self.folds.items()}}

    def merge(self, part: dict[str, Any]) -> None:
        for sid, problems in part["problems"].items():
            for problem in problems:
                self.report.add(sid, problem)
        self.report.events += part["events"]
        self.report.streams += part["streams"]
        for name, (hashes, reopened) in part["folds"].items():
            self.folds[name].hashes.update(hashes)
            self.folds[name].reopened |= reopened

    def finish(self, store: EventStore) -> VerifyReport:
        self.report.streams += len(self.streams)
        self.streams = {}
        for fold in self.folds.values():
            self.report.read_models[fold.projection.name] = fold.compare(store, self.report)
        return self.report


def _row_hash(table: sa.Table, row: dict[str, Any]) -> bytes:
    return hashlib.blake2b(canonical_json(normalise(table, row)), digest_size=16).digest()


def normalise(table: sa.Table, row: dict[str, Any]) -> dict[str, Any]:
    """A row with values coerced to its columns' Python types, so stored and folded rows compare."""
    out = {}
    for name, kind in _column_kinds(table):
        value = row.get(name)
        if value is not None and kind is not None:
            with contextlib.suppress(TypeError, ValueError):  # SQLite keeps text in a number
                value = kind(value)  # column: left as it is, the row differs from its rebuild
        out[name] = value
    return out


_KINDS: dict[str, tuple[tuple[str, Any], ...]] = {}


def _column_kinds(table: sa.Table) -> tuple[tuple[str, Any], ...]:
    """(plain str name, float/int or None) per column; cached per table."""
    kinds = _KINDS.get(table.name)
    if kinds is None:
        kinds = tuple((str(c.name), c.type.python_type if c.type.python_type in (float, int)
                       else None) for c in table.c)
        _KINDS[table.name] = kinds
    return kinds


class Fold:
    """A projection folded in memory up to its checkpoint, keeping only a hash of finished rows."""

    def __init__(self, projection: Projection, checkpoint: int) -> None:
        self.projection = projection
        self.checkpoint = checkpoint
        self.entries: dict[str, Entry] = {}
        self.hashes: dict[str, bytes | None] = {}  # finished streams: row hash (None: no row)
        self.reopened: set[str] = set()  # events after a stream was finished: re-derive at the end

    def feed(self, records: list[RecordedEvent]) -> None:
        cp = self.checkpoint
        todo = [r for r in records if r.position <= cp]
        hashes = self.hashes
        for r in todo:
            if r.stream_id in hashes:
                self.reopened.add(r.stream_id)
        if self.reopened:
            todo = [r for r in todo if r.stream_id not in self.reopened]
        fold_records(self.projection, todo, self.entries)
        self._settle()

    def _settle(self) -> None:
        projection = self.projection
        done = [sid for sid, e in self.entries.items()
                if e.dirty and (e.state is None or projection.finished(e.state))]
        for sid in done:
            self._hash(sid, self.entries.pop(sid))
        for entry in self.entries.values():
            entry.dirty = False

    def _hash(self, sid: str, entry: Entry) -> None:
        row = row_of(self.projection, sid, entry)
        self.hashes[sid] = None if row is None else _row_hash(self.projection.table, row)

    def close(self) -> None:
        """Hash the rows of streams still open at the checkpoint."""
        for sid, entry in self.entries.items():
            self._hash(sid, entry)
        self.entries = {}

    def expected(self, store: EventStore, stream_id: str) -> dict[str, Any] | None:
        """The row a rebuild gives for one stream (folded again from its own events)."""
        records = stream_records(store, stream_id, self.checkpoint)
        records.sort(key=lambda r: r.position)
        entry = fold_records(self.projection, records).get(stream_id)
        row = None if entry is None else row_of(self.projection, stream_id, entry)
        return None if row is None else normalise(self.projection.table, row)

    def compare(self, store: EventStore, report: VerifyReport) -> dict[str, Any]:
        projection = self.projection
        table = projection.table
        self.close()
        for sid in self.reopened:
            row = self.expected(store, sid)
            self.hashes[sid] = None if row is None else _row_hash(table, row)
        expected = {sid: h for sid, h in self.hashes.items() if h is not None}
        key = projection.key
        differing: list[tuple[str, dict[str, Any]]] = []
        rows = 0
        with snapshot(store) as conn:
            # rows and checkpoint commit together: read both in one snapshot, and compare only if
            # the read model is still where verify folded it (another process may catch it up)
            now = conn.execute(sa.select(projection_checkpoints.c.position).where(
                projection_checkpoints.c.name == projection.name)).scalar() or 0
            if now != self.checkpoint:
                return {"rows": None, "checkpoint": self.checkpoint, "differing": 0,
                        "moved_to": now}
            if now == 0:  # rows at checkpoint 0 are an interrupted parallel rebuild's
                held = conn.execute(sa.select(sa.func.count()).select_from(table)).scalar()
                if held:
                    return {"rows": None, "checkpoint": 0, "differing": 0, "moved_to": 0,
                            "unfinished_rows": held}
            for row in conn.execute(sa.select(table)).mappings():
                rows += 1
                sid = row[key]
                want = expected.pop(sid, None)
                if want is None or want != _row_hash(table, dict(row)):
                    differing.append((sid, normalise(table, dict(row))))
        name = projection.name
        for sid in expected:  # rows the rebuild has and the read model lacks
            report.add(sid, f"{name} read model: row missing (its rebuild has one)")
        for i, (sid, stored) in enumerate(differing):
            if i >= MAX_DETAILS:
                report.add(sid, f"{name} read model differs from its rebuild")
                continue
            want = self.expected(store, sid)
            if want is None:
                report.add(sid, f"{name} read model: row present, but its rebuild has none")
                continue
            columns = [c for c in want if want[c] != stored.get(c)]
            shown = ", ".join(f"{c}: stored {_short(stored.get(c))} != rebuilt {_short(want[c])}"
                              for c in columns[:4])
            report.add(sid, f"{name} read model differs from its rebuild ({shown})")
        return {"rows": rows, "checkpoint": self.checkpoint,
                "differing": len(differing) + len(expected)}


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."
