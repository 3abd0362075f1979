"""Re-simulation: run a logged episode again from its seed, options and actions, and compare.

Everything happens in memory: `domain.reset` and `domain.step` produce the events, the digest
chain is computed over their canonical envelopes exactly as the store computes it, and nothing
is written. Equal digests mean a byte-identical stream.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

import orjson

import domain
from eventstore import GENESIS_DIGEST, CorruptCommit, EventStore, RecordedEvent, canonical_json, chain_digest
from projections.replay import EpisodeNotFound
from projections.views import decode, stream_head_problem


@dataclass(frozen=True, slots=True)
class Envelope:
    """One event as the digest sees it, plus its version and chained digest."""

    version: int
    type: str
    schema_version: int
    data_json: str
    digest: str

    def data(self) -> tuple[Any, bool]:
        """(the data decoded, True), or (the stored text, False) when it is damaged past JSON:
        showing where a log was damaged is what a rerun is asked for, so it is never an error."""
        try:
            return orjson.loads(self.data_json), True
        except orjson.JSONDecodeError:
            return self.data_json, False

    def to_json(self) -> dict[str, Any]:
        """The event with its data decoded (the stored text when that is not JSON)."""
        data, _ = self.data()
        return {"version": self.version, "type": self.type, "schema_version": self.schema_version,
                "data": data, "digest": self.digest}


@dataclass(slots=True)
class RerunResult:
    episode_id: str
    match: bool
    stored_digest: str
    rerun_digest: str
    stored_events: int
    rerun_events: int
    actions: int
    first_difference: int | None = None  # stream version of the first differing event
    stored: Envelope | None = None
    rerun: Envelope | None = None
    error: str | None = None  # the re-simulation itself failed (bad log or changed code)
    notes: list[str] = field(default_factory=list)
    rules: int | None = None  # the rules version it was re-simulated under (None: no start to read)

    def to_json(self) -> dict[str, Any]:
        return {
            "episode_id": self.episode_id, "match": self.match,
            "stored_digest": self.stored_digest, "rerun_digest": self.rerun_digest,
            "stored_events": self.stored_events, "rerun_events": self.rerun_events,
            "actions": self.actions, "first_difference": self.first_difference,
            "stored": self.stored.to_json() if self.stored else None,
            "rerun": self.rerun.to_json() if self.rerun else None,
            "error": self.error, "notes": self.notes, "rules": self.rules,
        }


def mismatch_line(result: dict[str, Any]) -> str:
    """A mismatch in one line, from `RerunResult.to_json()`. Equal digests are said as such: an
    event altered without its digest leaves both chains ending alike, and "stored digest X,
    re-simulated X" read as a contradiction."""
    rules = f" under rules version {result['rules']}" if result["rules"] is not None else ""
    counts = (f"{result['stored_events']} stored events, {result['rerun_events']} re-simulated from "
              f"{result['actions']} actions{rules}")
    if result["stored_digest"] == result["rerun_digest"]:
        return (f"both chains end in digest {result['stored_digest']} ({counts}), but the stored "
                "stream is not the re-simulated one")
    return f"stored digest {result['stored_digest']}, re-simulated {result['rerun_digest']} ({counts})"


def spec_of(started: dict[str, Any]) -> Any:
    """The EpisodeSpec an EpisodeStarted event was produced from."""
    return domain.EpisodeSpec(task=started["task"], seed=started["seed"], chaos=started["chaos"],
                              reward_profile=started.get("reward_profile", "default"),
                              max_steps=started.get("max_steps"),
                              rules=domain.rules_of(started.get("target")))


def resimulate(records: list[RecordedEvent]) -> tuple[list[Any], int, str | None, int | None]:
    """(events produced, actions replayed, error, rules version) for a stored stream, purely in
    memory; the version is the one its start names (None when it has no start to read)."""
    first = records[0]
    if first.type != "EpisodeStarted":
        return [], 0, f"the stream starts with {first.type}, not EpisodeStarted", None
    produced: list[Any] = []
    # each action is decoded just before its step: the events before one that does not decode
    # are still re-simulated, so the first difference is that event, not the stream's start
    actions = [r for r in records if r.type == "ActionTaken"]
    rules = None
    try:
        spec = spec_of(orjson.loads(first.data_json))
        state, events, _info = domain.reset(spec)
        rules = spec.rules  # once reset took it: a damaged start's "9" or "2" was never run under
        produced.extend(events)
        for i, record in enumerate(actions):
            if getattr(state, "done", False):
                return produced, i, f"the re-simulated episode ended before action {i + 1}", rules
            state, events, _info = domain.step(state, decode(record).action)
            produced.extend(events)
    except CorruptCommit as exc:  # an event that decodes into nothing: say which
        return produced, len(actions), f"the log is damaged: {exc}", rules
    except Exception as exc:  # the log names something this code cannot re-run
        return produced, len(actions), f"re-simulation failed: {type(exc).__name__}: {exc}", rules
    return produced, len(actions), None, rules


def envelopes(events: list[Any]) -> list[Envelope]:
    """Canonical envelopes and the digest chain, as the store would record them."""
    out = []
    digest = GENESIS_DIGEST
    for version, event in enumerate(events):
        type_, data, schema_version = domain.to_envelope(event)
        data_json = canonical_json(data).decode()
        digest = chain_digest(digest, type_, schema_version, data_json)
        out.append(Envelope(version, type_, schema_version, data_json, digest))
    return out


def stored_envelopes(records: list[RecordedEvent]) -> list[Envelope]:
    return [Envelope(r.version, r.type, r.schema_version, r.data_json, r.digest) for r in records]


def rerun(store: EventStore, episode_id: str) -> RerunResult:
    """Re-simulate `episode_id` and compare its digest chain with the stored one."""
    records = list(store.read_stream(episode_id))
    if not records:
        raise EpisodeNotFound(f"no episode {episode_id!r} in the store")
    return rerun_records(store, episode_id, records)


def rerun_records(store: EventStore, episode_id: str, records: list[RecordedEvent]) -> RerunResult:
    """`rerun` over a stream already read (a caller that reads it for other reasons too)."""
    produced, actions, error, rules = resimulate(records)
    result = compare(episode_id, stored_envelopes(records), envelopes(produced), actions, error,
                     rules)
    if damage := stored_elsewhere(records, store.stream_head(episode_id)):
        result.match = False  # every reader but one by version sees another stream than this
        result.notes.extend(damage)
    return result


def stored_elsewhere(records: list[RecordedEvent], head: tuple[int, str] | None) -> list[str]:
    """What the log states of the stream beyond its events in version order, if it disagrees
    with them: head columns (what `stream_digest` answers and the next step chains onto) naming
    another event, or commits whose positions put events out of order for every reader of the
    log in position order (`verify`, the read models, the analytics)."""
    problems = []
    if problem := stream_head_problem(records, head):
        problems.append(f"the stream's head columns disagree with its events: {problem}")
    for before, after in itertools.pairwise(records):
        if after.position <= before.position:
            problems.append(f"version {after.version} is stored at position {after.position}, "
                            f"before version {before.version} (position {before.position}): the "
                            "commits' positions were altered, so a reader in log order meets "
                            "the events out of order")
            break
    return problems


def _same_value(stored: str, fresh: str) -> bool:
    try:
        return orjson.loads(stored) == orjson.loads(fresh)
    except orjson.JSONDecodeError:
        return False


def compare(episode_id: str, stored: list[Envelope], fresh: list[Envelope], actions: int,
            error: str | None = None, rules: int | None = None) -> RerunResult:
    """Match when both chains end in the same digest; otherwise locate the first difference."""
    stored_digest = stored[-1].digest if stored else GENESIS_DIGEST
    rerun_digest = fresh[-1].digest if fresh else GENESIS_DIGEST
    result = RerunResult(episode_id, match=False, stored_digest=stored_digest,
                         rerun_digest=rerun_digest, stored_events=len(stored),
                         rerun_events=len(fresh), actions=actions, error=error, rules=rules)
    for i in range(max(len(stored), len(fresh))):
        a = stored[i] if i < len(stored) else None
        b = fresh[i] if i < len(fresh) else None
        if a is not None and a.version != i:
            result.first_difference = i
            result.stored, result.rerun = a, b
            if a.version > i:  # most often a commit deleted, not a column edited
                result.notes.append(f"the stream's event {i + 1} is stored as version {a.version}: "
                                    f"{a.version - i} event(s) before it are missing (a commit "
                                    "deleted), or the version column was altered")
            else:
                result.notes.append(f"the stream's event {i + 1} is stored as version {a.version}: "
                                    "versions run 0, 1, 2, … without gaps (the version column was "
                                    "altered)")
            return result
        if a is None or b is None or (a.type, a.schema_version, a.data_json) != (
                b.type, b.schema_version, b.data_json):
            result.first_difference = i
            result.stored, result.rerun = a, b
            if a is not None and b is not None and a.digest == b.digest:
                result.notes.append(f"version {i}: the stored digest is the one the re-simulated "
                                    "event chains to, so the stored content was altered after it was written")
            if a is not None and b is not None and (a.type, a.schema_version) == (b.type, b.schema_version) \
                    and _same_value(a.data_json, b.data_json):
                result.notes.append(f"version {i}: the stored data is the re-simulated value in other "
                                    "bytes (not the canonical JSON the store writes: spaces, key "
                                    "order or a number's spelling), so it was rewritten after it was "
                                    "written, or written by an orjson before 3.11.7 (which spelled "
                                    "1e+16 as 1e16)")
            return result
        if a.digest != b.digest:
            result.first_difference = i
            result.stored, result.rerun = a, b
            # every event before matched, digest included: this one's stored content no longer
            # hashes to the digest it was written with
            result.notes.append(f"version {i}: same content as re-simulated, but the stored digest "
                                "is not that content's: the event was altered after it was written "
                                "(its data, e.g. an edited action, which the rerun replays as "
                                "stored, or its digest column)")
            return result
    result.match = error is None and stored_digest == rerun_digest
    return result
