"""The event store's contract, on SQLite and PostgreSQL alike."""

from __future__ import annotations

import dataclasses
import enum
import multiprocessing as mp
import os
import re
import sqlite3
import subprocess
import sys
import threading
import time
import uuid

import pytest

from eventstore import (
    ConcurrencyError,
    CorruptCommit,
    EventStore,
    NewEvent,
    StoreUnavailable,
    Upcasters,
    canonical_json,
    chain_digest,
)
from eventstore.engine import normalise_url
from eventstore.records import MAX_EVENT_BYTES
from tests import tamper
from tests.conftest import append_behind_a_held_lock, poll_count, unique_stream


@pytest.fixture
def store(store_url):
    s = EventStore.open(store_url)
    yield s
    s.close()


def test_round_trip_keeps_order_versions_and_data(store):
    stream = unique_stream()
    recorded = store.append(stream, [NewEvent("Opened", {"b": 2, "a": [1, "x", None]}),
                                     NewEvent("Noted", {"text": "naïve ☃"}, meta={"agent": "a1"})],
                            None)
    assert [r.version for r in recorded] == [0, 1]
    read = list(store.read_stream(stream))
    assert read == recorded
    assert read[0].data == {"a": [1, "x", None], "b": 2}
    assert read[0].data_json == '{"a":[1,"x",null],"b":2}'  # canonical: sorted, compact
    assert read[1].data == {"text": "naïve ☃"}
    assert read[1].meta["agent"] == "a1" and "recorded_at" in read[1].meta
    assert read[0].position < read[1].position
    tail = [r for r in store.read_all(after_position=recorded[0].position - 1)
            if r.stream_id == stream]
    assert tail == recorded
    assert store.stream_version(stream) == 1
    assert store.stream_version(unique_stream()) is None


def test_read_all_is_lazy_and_sees_what_was_appended_before_iteration_began(store):
    """A reader may set up its iterator early (a follower, a projection runner): it reads only
    when iterated, so events appended in between are part of what it returns."""
    stream = unique_stream()
    first = store.append(stream, [NewEvent("A", {"n": 0})], None)[0]
    events = store.read_all(after_position=first.position - 1)
    store.append(stream, [NewEvent("A", {"n": 1}), NewEvent("A", {"n": 2})], 0)
    assert [r.data["n"] for r in events if r.stream_id == stream] == [0, 1, 2]


def test_canonical_json_spells_numbers_as_every_supported_orjson_does():
    """The digest is over these bytes, so their spelling is part of the log's format: orjson
    3.11.7 began writing 1e16 as 1e+16, and an episode logged under one version then failed
    `companyos rerun` under the other, as if tampered with. pyproject's lower bound keeps every
    supported version on one spelling; a change in a later orjson fails here first."""
    values = [1e16, 2.5e16, 1.5e-7, 5e-324, 1.7976931348623157e308, 123456789012345.6, 0.1, -0.0,
              1e15, -(2**63), 7]
    assert canonical_json(values) == (b"[1e+16,2.5e+16,1.5e-7,5e-324,1.7976931348623157e+308,"
                                      b"123456789012345.6,0.1,-0.0,1000000000000000.0,"
                                      b"-9223372036854775808,7]")


def test_digest_chains_type_version_and_data_but_not_meta(store):
    a, b = unique_stream(), unique_stream()
    ra = store.append(a, [NewEvent("E", {"x": 1}, meta={"who": "one"}), NewEvent("F", {})], None)
    rb = store.append(b, [NewEvent("E", {"x": 1}, meta={"who": "two"}), NewEvent("F", {})], None)
    assert ra[-1].digest == rb[-1].digest == store.stream_digest(a)
    expected = chain_digest(chain_digest("", "E", 1, '{"x":1}'), "F", 1, "{}")
    assert store.stream_digest(a) == expected
    c = unique_stream()
    store.append(c, [NewEvent("E", {"x": 2}), NewEvent("F", {})], None)
    assert store.stream_digest(c) != expected


def test_stale_expected_version_raises_concurrency_error_naming_versions(store):
    stream = unique_stream()
    store.append(stream, [NewEvent("A", {})], None)
    store.append(stream, [NewEvent("B", {})], 0)
    with pytest.raises(ConcurrencyError) as err:
        store.append(stream, [NewEvent("C", {})], 0)
    assert err.value.expected == 0 and err.value.actual == 1
    assert stream in str(err.value)
    with pytest.raises(ConcurrencyError):
        store.append(stream, [NewEvent("C", {})], None)
    with pytest.raises(ConcurrencyError):
        store.append(unique_stream(), [NewEvent("C", {})], 3)
    assert [r.type for r in store.read_stream(stream)] == ["A", "B"]


def test_stale_version_is_detected_by_another_store_instance(store_url):
    """A writer's cached stream head must never let it write past someone else's append."""
    stream = unique_stream()
    one, two = EventStore.open(store_url), EventStore.open(store_url)
    one.append(stream, [NewEvent("A", {})], None)
    two.append(stream, [NewEvent("B", {})], 0)
    with pytest.raises(ConcurrencyError):
        one.append(stream, [NewEvent("C", {})], 0)
    assert [r.type for r in one.read_stream(stream)] == ["A", "B"]
    one.close()
    two.close()


def test_retry_with_same_event_ids_returns_stored_records(store):
    stream = unique_stream()
    events = [NewEvent("A", {"n": 1}, event_id=f"id-{uuid.uuid4().hex}"),
              NewEvent("B", {"n": 2}, event_id=f"id-{uuid.uuid4().hex}")]
    first = store.append(stream, events, None)
    again = store.append(stream, events, None)
    assert again == first
    assert len(list(store.read_stream(stream))) == 2
    fresh = EventStore.open(str(store.engine.url.render_as_string(hide_password=False)))
    assert fresh.append(stream, events, None) == first
    fresh.close()


def test_only_the_same_append_again_is_a_retry(store):
    """The ids of a committed append in another order, or a part of them, were answered as its
    retry with whichever event came last: `append_head` said version 0 of a stream at 1."""
    stream = unique_stream()
    a, b = (NewEvent(t, {}, event_id=f"id-{uuid.uuid4().hex}") for t in "AB")
    first = store.append(stream, [a, b], None)
    assert store.append_head(stream, [a, b], None) == (1, first[-1].digest)  # the same: a retry
    for events, expected in (([b, a], None), ([a], 1), ([b], 1)):  # ([b], 0): where it stands
        for write in (store.append, store.append_head):  # a clash of ids, or of versions
            with pytest.raises((ValueError, ConcurrencyError)):
                write(stream, events, expected)
    assert [r.event_id for r in store.read_stream(stream)] == [a.event_id, b.event_id]


def test_append_head_writes_what_append_would_and_says_where_the_stream_stands(store):
    """The runtime's write: the same commit as `append` (same digests, same concurrency check,
    the same idempotent retry), answered with the stream's head instead of its records."""
    stream, twin = unique_stream(), unique_stream()
    events = [NewEvent("A", {"n": 1}), NewEvent("B", {"n": 2})]
    head = store.append_head(stream, events, None)
    recorded = store.append(twin, events, None)
    assert head == (1, recorded[-1].digest) and (head.version, head.digest) == tuple(head)
    stored = list(store.read_stream(stream))
    assert [(r.type, r.data, r.digest) for r in stored] == [(r.type, r.data, r.digest) for r in recorded]
    assert store.append_head(stream, [NewEvent("C", {})], head.version).version == 2
    with pytest.raises(ConcurrencyError):
        store.append_head(stream, [NewEvent("D", {})], head.version)
    with pytest.raises(ValueError, match="at least one event"):
        store.append_head(stream, [], 2)
    ided = [NewEvent("E", {"n": 5}, event_id=f"id-{uuid.uuid4().hex}")]
    first = store.append_head(stream, ided, 2)
    assert store.append_head(stream, ided, 2) == first == (3, list(store.read_stream(stream))[-1].digest)
    assert [r.type for r in store.read_stream(stream)] == ["A", "B", "C", "E"]


def test_create_streams_writes_several_new_streams_at_once_as_append_would(store):
    """`companyos run`'s group commit: each stream is the commit `append(..., None)` writes
    (same events, digests and head), and the streams follow one another in the global order."""
    a, b, twin = unique_stream(), unique_stream(), unique_stream()
    events = [NewEvent("A", {"n": 1}), NewEvent("B", {"n": 2}, meta={"agent": "x"})]
    after = max((r.position for r in store.read_all()), default=0)
    streams = [store.new_stream(a, events), store.new_stream(b, [NewEvent("C", {"n": 3})])]
    assert store.stream_version(a) is None  # built, not written
    heads = store.create_streams(streams)
    recorded = store.append(twin, events, None)
    assert heads == [s.head for s in streams] == [(1, recorded[-1].digest), (0, store.stream_digest(b))]
    assert [(r.type, r.data, r.meta.get("agent"), r.digest) for r in store.read_stream(a)] == [
        (r.type, r.data, r.meta.get("agent"), r.digest) for r in recorded]
    logged = [(r.stream_id, r.version) for r in store.read_all(after) if r.stream_id in (a, b)]
    assert logged == [(a, 0), (a, 1), (b, 0)]
    assert store.append_head(a, [NewEvent("D", {})], 1).version == 2  # the heads are the store's
    assert store.create_streams([]) == []


def test_create_streams_takes_a_generator_and_refuses_what_is_no_list_of_streams(store):
    """A generator was used up by the first pass over it: nothing written, `[]` returned."""
    names = [unique_stream() for _ in range(3)]
    heads = store.create_streams(store.new_stream(name, [NewEvent("A", {})]) for name in names)
    assert len(heads) == 3 and [store.stream_version(name) for name in names] == [0, 0, 0]
    one = store.new_stream(unique_stream(), [NewEvent("A", {})])
    with pytest.raises(TypeError, match="not one NewStream: pass \\[stream\\]"):
        store.create_streams(one)
    for wrong in (None, "streams", {"a": one}):
        with pytest.raises(TypeError, match="streams must be a list"):
            store.create_streams(wrong)
    assert store.stream_version(one.commit.stream_id) is None


def test_new_stream_refuses_what_append_would_and_names_the_stream(store):
    stream = unique_stream()
    with pytest.raises(ValueError, match=f"stream '{stream}': .*non-finite"):
        store.new_stream(stream, [NewEvent("A", {"x": float("nan")})])
    with pytest.raises(ValueError, match="at least one event"):
        store.new_stream(stream, [])
    with pytest.raises(ValueError, match="stream_id"):
        store.new_stream("", [NewEvent("A", {})])


def test_a_type_or_event_id_holding_the_record_separator_is_refused_and_nothing_is_written(store):
    """Commit payloads are fields joined by U+001E (eventstore.packing.pack): a type or an id
    holding it would split into two fields and read back as other events, so it is refused in
    words, by append and new_stream alike; the same text in data or meta is only escaped JSON."""
    stream = unique_stream()
    bad_type, bad_id = "B\x1eC", "id\x1e1"
    for events, words in (([NewEvent("A", {}), NewEvent(bad_type, {})],
                           f"event type {bad_type!r} holds U+001E"),
                          ([NewEvent("A", {}, event_id=bad_id)], f"event_id {bad_id!r} holds U+001E")):
        words = re.escape(words)
        with pytest.raises(ValueError, match=words):
            store.append(stream, events, None)
        with pytest.raises(ValueError, match=f"stream '{stream}': .*{words}"):
            store.new_stream(stream, events)
    assert store.stream_version(stream) is None
    store.append(stream, [NewEvent("A\x1f", {"text": "a\x1eb"}, meta={"note": "\x1e"})], None)
    [record] = store.read_stream(stream)
    assert (record.type, record.data, record.meta["note"]) == ("A\x1f", {"text": "a\x1eb"}, "\x1e")


def test_create_streams_is_all_or_nothing(store):
    taken, shared = unique_stream(), f"id-{uuid.uuid4().hex}"
    store.append(taken, [NewEvent("A", {}, event_id=shared)], None)

    def refused(streams, error, words):
        with pytest.raises(error, match=words):
            store.create_streams([store.new_stream(stream_id, events) for stream_id, events in streams])
        for stream_id, _ in streams:
            if stream_id != taken:
                assert store.stream_version(stream_id) is None, stream_id

    ok = [NewEvent("A", {"n": 1})]
    refused([(unique_stream(), ok), (taken, ok)], ConcurrencyError, re.escape(repr(taken)))
    fresh = unique_stream()
    refused([(unique_stream(), ok), (fresh, ok), (fresh, ok)], ValueError, "same stream twice")
    refused([(unique_stream(), ok), (unique_stream(), [NewEvent("A", {}, event_id=shared)])],
            ValueError, "already stored")
    twice = f"id-{uuid.uuid4().hex}"
    refused([(unique_stream(), [NewEvent("A", {}, event_id=twice)]),
             (unique_stream(), [NewEvent("A", {}, event_id=twice)])], ValueError, "event_id twice")
    assert store.stream_version(taken) == 0


def test_create_streams_writes_only_streams_this_store_built(store, tmp_path):
    """Each database gets its payload in its own encoding (SQLite: lz4 bytes, PostgreSQL: text)."""
    with EventStore.open(f"sqlite:///{tmp_path / 'other.db'}") as other:
        stream = unique_stream()
        with pytest.raises(ValueError, match="built by another store"):
            store.create_streams([other.new_stream(stream, [NewEvent("A", {"n": 1})])])
    assert store.stream_version(stream) is None


def test_event_id_used_in_another_stream_is_refused(store):
    shared = f"id-{uuid.uuid4().hex}"
    store.append(unique_stream(), [NewEvent("A", {}, event_id=shared)], None)
    other = unique_stream()
    with pytest.raises(ValueError, match="already stored"):
        store.append(other, [NewEvent("A", {}, event_id=shared)], None)
    assert store.stream_version(other) is None


@dataclasses.dataclass
class _Reading:
    value: float


class _Limit(enum.Enum):
    NONE = float("inf")


@pytest.mark.parametrize("bad, message", [
    (NewEvent("", {}), "non-empty"),
    (NewEvent("X" * 201, {}), "longer than"),
    (NewEvent("T", {"when": object()}), "not JSON-serialisable"),
    (NewEvent("T", {"n": float("nan")}), "non-finite"),
    (NewEvent("T", {"xs": [1.0, {"deep": float("-inf")}]}), "non-finite"),
    (NewEvent("T", {"reading": _Reading(float("nan"))}), "non-finite"),  # orjson wrote null
    (NewEvent("T", {"limit": _Limit.NONE}), "non-finite"),
    (NewEvent("T", {}, schema_version=True), "schema_version"),
    (NewEvent("T", ["not", "an", "object"]), "JSON object"),
    (NewEvent("T", {"blob": "x" * (MAX_EVENT_BYTES + 1)}), "limit"),
    (NewEvent("T", {}, schema_version=0), "schema_version"),
    # past 32 bits: stored, it stopped every analytics sync of the store as a damaged commit
    (NewEvent("T", {}, schema_version=2**31), "schema_version must be a positive integer of at most"),
    (NewEvent("T", {}, event_id=""), "event_id"),
])
def test_a_batch_with_one_bad_event_writes_nothing(store, bad, message):
    stream = unique_stream()
    before = store.last_position()
    with pytest.raises(ValueError, match=message):
        store.append(stream, [NewEvent("Good", {"n": 1}), bad], None)
    assert store.stream_version(stream) is None
    assert store.last_position() == before


def test_nulls_and_tuples_are_stored_as_json_would_read_them(store):
    stream = unique_stream()
    data = {"none": None, "pair": (1, 2), "nested": {"z": None, "a": [None, 1.5]}}
    recorded = store.append(stream, [NewEvent("T", data), NewEvent("U", {"k": None})], None)
    expected = {"nested": {"a": [None, 1.5], "z": None}, "none": None, "pair": [1, 2]}
    assert [r.data for r in store.read_stream(stream)] == [expected, {"k": None}]
    assert recorded[0].data_json == '{"nested":{"a":[null,1.5],"z":null},"none":null,"pair":[1,2]}'


@pytest.mark.parametrize("stream_id", ["", "s" * 201, None, 17])
def test_bad_stream_ids_are_refused(store, stream_id):
    with pytest.raises(ValueError, match="stream_id"):
        store.append(stream_id, [NewEvent("A", {})], None)


def test_upcasters_lift_old_events_on_read(store_url):
    upcasters = Upcasters()

    @upcasters.upcaster("PriceSet", 1)
    def _cents(data):
        return {"cents": data["euros"] * 100}

    upcasters.register("PriceSet", 2, lambda data: {**data, "currency": "EUR"})
    plain = EventStore.open(store_url)
    stream = unique_stream()
    plain.append(stream, [NewEvent("PriceSet", {"euros": 3}),
                          NewEvent("PriceSet", {"cents": 5, "currency": "USD"}, schema_version=3),
                          NewEvent("Other", {"euros": 1})], None)
    lifted = EventStore.open(store_url, upcasters=upcasters)
    read = list(lifted.read_stream(stream))
    assert [(r.schema_version, r.data) for r in read] == [
        (3, {"cents": 300, "currency": "EUR"}),
        (3, {"cents": 5, "currency": "USD"}),
        (1, {"euros": 1}),
    ]
    # digests speak of the stored bytes, so upcasting never breaks the chain
    assert read[-1].digest == plain.stream_digest(stream)
    mine = [r for r in lifted.read_all(read[0].position - 1, limit=3) if r.stream_id == stream]
    assert mine[0].data == {"cents": 300, "currency": "EUR"}
    with pytest.raises(ValueError, match="already registered"):
        upcasters.register("PriceSet", 1, lambda d: d)
    for args, words in ((("PriceSet", 0, lambda d: d), "lifts a schema version"),  # never ran
                        (("PriceSet", "1", lambda d: d), "lifts a schema version"),
                        (("PriceSet", 4, {"cents": 1}), "must be callable"),
                        (("", 4, lambda d: d), "non-empty string")):
        with pytest.raises(ValueError, match=words):
            Upcasters().register(*args)
    # an upcaster that returns no dict is named, not read back as an event whose data is a list
    wrapped = Upcasters()
    wrapped.register("PriceSet", 1, lambda data: [data])
    broken = EventStore.open(store_url, upcasters=wrapped)
    with pytest.raises(TypeError, match="the upcaster of PriceSet v1 returned list, not the event's data"):
        list(broken.read_stream(stream))
    broken.close()
    plain.close()
    lifted.close()


def test_read_all_pages_through_large_ranges_with_limit(store):
    stream = unique_stream()
    recorded = store.append(stream, [NewEvent("N", {"i": i}) for i in range(2500)], None)
    start = recorded[0].position - 1
    got = list(store.read_all(after_position=start, limit=2500))
    assert [r.data["i"] for r in got if r.stream_id == stream] == list(range(2500))
    assert len(list(store.read_all(after_position=start, limit=7))) == 7


@pytest.mark.parametrize("read, words", [
    (lambda s: s.read_all(after_position=1.5), "after_position must be a whole number, not float"),
    (lambda s: s.read_all(after_position=2**63), "after_position must be from 0 to 2\\*\\*63 - 1"),
    (lambda s: s.read_all(limit=-1), "limit must be from 0"),  # was read as "nothing"
    (lambda s: s.read_all(limit="10"), "limit must be a whole number, not str"),
    (lambda s: list(s.read_stream("x", from_version=1.5)), "from_version must be a whole number"),
    (lambda s: list(s.read_stream("x", from_version=2**63)), "from_version must be from 0"),
    (lambda s: s.count_events(2**63), "after_position must be from 0"),  # the driver's OverflowError
    (lambda s: s.count_events(0, upto=True), "upto must be a whole number, not bool"),
    (lambda s: s.commit_rows(0, -1), "commits must be from 0"),  # SQLite read it as "all rows"
    (lambda s: s.commit_rows(-1, 10), "after must be from 0"),
    # a stream id no stream can have: SQLite read 42 as "42", PostgreSQL raised its own errors
    (lambda s: list(s.read_stream(42)), "stream_id must be a non-empty string"),
    (lambda s: s.stream_version(42), "stream_id must be a non-empty string"),
    (lambda s: s.stream_digest(""), "stream_id must be a non-empty string"),
    (lambda s: list(s.read_stream("a\x00")), "holds a NUL or a lone surrogate"),
    (lambda s: s.stream_version("\ud800"), "holds a NUL or a lone surrogate"),
])
def test_a_reader_given_no_position_says_so_in_words(store, read, words):
    with pytest.raises(ValueError, match=words):
        read(store)


def test_readers_take_numpy_integers_as_positions(store):
    import numpy as np

    stream = unique_stream()
    recorded = store.append(stream, [NewEvent("N", {"i": i}) for i in range(3)], None)
    start = np.int64(recorded[0].position - 1)
    assert [r.data["i"] for r in store.read_all(after_position=start, limit=np.int32(2))] == [0, 1]
    assert [r.version for r in store.read_stream(stream, from_version=np.uint8(2))] == [2]
    assert store.count_events(start, upto=np.int64(recorded[-1].position)) == 3


def test_raw_commit_rows_page_by_position_and_by_stream(store):
    """Readers that unpack commits themselves (the projections) get the rows `read_all` reads:
    bounded by position, paged, and in stream order for parallel scans."""
    from eventstore.packing import unpack

    streams = sorted(unique_stream() for _ in range(3))
    commits = []  # (stream, last position) in append order
    for i in range(2):
        for stream in streams:
            version = None if i == 0 else 1
            last = store.append(stream, [NewEvent("N", {"i": i}), NewEvent("M", {})], version)[-1]
            commits.append((stream, last.position))
    start, end = commits[0][1] - 2, commits[-1][1]
    rows = store.commit_rows(start, 100, upto=end)
    assert [(r[1], r[0]) for r in rows] == commits
    assert store.count_events(start) == 12
    assert [e for r in rows for e in unpack(r)] == list(store.read_all(start, limit=12))
    assert [r[0] for r in store.commit_rows(start, 2)] == [p for _, p in commits[:2]]
    assert [r[0] for r in store.commit_rows(start, 100, upto=commits[2][1])] == [p for _, p in commits[:3]]
    by_stream = [(r[1], r[2]) for r in store.commit_rows_by_stream((streams[0], -1), streams[2], end, 100)
                 if r[1] in streams]
    assert by_stream == [(streams[0], 0), (streams[0], 2), (streams[1], 0), (streams[1], 2)]
    assert [r[2] for r in store.commit_rows_by_stream((streams[0], 0), None, end, 1)] == [2]
    assert set(streams) <= set(store.stream_ids(end))
    assert not set(streams) & set(store.stream_ids(start))


@pytest.mark.parametrize("events, column", [
    (4, "digest"),  # a step-sized commit
    (100, "id"),  # a commit big enough to be read lazily
    (4, "event_meta"),  # a commit whose events carry their own meta
])
def test_a_commit_with_a_column_cut_short_is_refused_not_read_short(store, events, column):
    stream = unique_stream()
    meta = {"agent": "a1"} if column == "event_meta" else None
    recorded = store.append(stream, [NewEvent("N", {"i": i}, meta=meta) for i in range(events)],
                            None)
    position = recorded[-1].position
    tamper.edit_payload(store.engine, position, lambda payload: payload[column].pop())
    with pytest.raises(CorruptCommit, match=f"{stream}.*position {position}.*differ in length"):
        list(store.read_stream(stream))
    with pytest.raises(CorruptCommit, match=f"position {position}"):
        list(store.read_all(after_position=recorded[0].position - 1))


# -- across processes -------------------------------------------------------------------------

def _race_append(args):
    url, stream, name = args
    store = EventStore.open(url)
    try:
        store.append(stream, [NewEvent("Claimed", {"by": name})], 0)
        return "won"
    except ConcurrencyError:
        return "lost"
    finally:
        store.close()


def test_two_processes_racing_at_the_same_version_one_wins(store_url):
    store = EventStore.open(store_url)
    for _ in range(3):
        stream = unique_stream()
        store.append(stream, [NewEvent("Created", {})], None)
        with mp.get_context("spawn").Pool(2) as pool:
            results = pool.map(_race_append, [(store_url, stream, "a"), (store_url, stream, "b")])
        assert sorted(results) == ["lost", "won"]
        assert [r.type for r in store.read_stream(stream)] == ["Created", "Claimed"]
    store.close()


def _writer(args):
    url, prefix, count = args
    store = EventStore.open(url)
    for i in range(count):
        store.append(f"{prefix}-{i}", [NewEvent("W", {"i": i, "k": k}) for k in range(3)], None)
    store.close()
    return count


def _follower(url, start, expected, queue):
    """Follow read_all like a projector: the cursor only moves forward, so a late lower position is lost."""
    store = EventStore.open(url)
    seen: list[int] = []
    cursor = start
    give_up = time.monotonic() + 60  # a safety net only: the writers finish in seconds
    while len(seen) < expected and time.monotonic() < give_up:
        batch = list(store.read_all(after_position=cursor, limit=500))
        if not batch:
            continue
        seen.extend(r.position for r in batch)
        cursor = batch[-1].position
    store.close()
    queue.put(seen)


def test_concurrent_writers_and_a_following_reader_never_miss_an_event(store_url):
    store = EventStore.open(store_url)
    start = store.last_position()
    writers, per_writer = 4, 150
    expected = writers * per_writer * 3
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    reader = ctx.Process(target=_follower, args=(store_url, start, expected, queue))
    reader.start()
    prefix = unique_stream("w")
    with ctx.Pool(writers) as pool:
        pool.map(_writer, [(store_url, f"{prefix}-{w}", per_writer) for w in range(writers)])
    seen = queue.get(timeout=120)
    reader.join(timeout=30)
    stored = [r.position for r in store.read_all(after_position=start)
              if r.stream_id.startswith(prefix)]
    assert len(stored) == expected
    assert seen == sorted(seen), "read_all must deliver positions in ascending order"
    assert set(stored) <= set(seen), "the follower skipped events that committed behind its cursor"
    store.close()


_DIGEST_SCRIPT = """
import sys
from eventstore import EventStore, NewEvent
store = EventStore.open(sys.argv[1])
stream = sys.argv[2]
made = {"z": 1, "a": {"y": [3, 2], "b": "é"}, "set": sorted({"q", "p", "r"})}
store.append(stream, [NewEvent("Made", made), NewEvent("Done", {"ok": True, "f": 0.1})], None)
print(store.stream_digest(stream))
"""


def test_digests_are_equal_across_processes_with_different_hash_seeds(store_url):
    digests = set()
    for seed in ("0", "1", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run([sys.executable, "-c", _DIGEST_SCRIPT, store_url, unique_stream()],
                             env=env, capture_output=True, text=True, check=True)
        digests.add(out.stdout.strip())
    assert len(digests) == 1


@pytest.mark.parametrize("url, words", [
    ("notaurl://x", "not a database URL"),
    ("sqlite:////nonexistent-dir/deeper/store.db", "cannot open the store"),
    ("postgresql://someone:secret@127.0.0.1:1/nowhere", "cannot open the store"),
])
def test_a_store_that_cannot_be_opened_is_refused_in_words(url, words):
    with pytest.raises(StoreUnavailable, match=words) as err:
        EventStore.open(url)
    assert "secret" not in str(err.value), "passwords never appear in messages"


def test_a_refused_url_is_named_as_the_user_spelled_it():
    """SQLAlchemy renders a SQLite URI's `file:` as `file%3A`: the message named a URL no one typed."""
    url = "sqlite:///file:/nonexistent-dir/deeper/store.db?mode=ro&uri=true"
    with pytest.raises(StoreUnavailable, match="cannot open the store") as err:
        EventStore.open(url)
    assert url in str(err.value) and "%3A" not in str(err.value)


def test_a_connection_the_server_dropped_is_replaced_not_failed(fresh_pg_url):
    """After a PostgreSQL restart or failover (here: its backends terminated) the next append
    and read used a dead pooled connection and failed (a bare 500 in the server)."""
    import sqlalchemy as sa

    store = EventStore.open(fresh_pg_url)
    stream = unique_stream()
    store.append(stream, [NewEvent("Opened", {"n": 0})], None)
    assert len(list(store.read_stream(stream))) == 1
    killer = sa.create_engine(normalise_url(fresh_pg_url), isolation_level="AUTOCOMMIT")
    with killer.connect() as conn:
        killed = conn.execute(sa.text(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()")).scalar()
    killer.dispose()
    assert killed >= 1
    store.append(stream, [NewEvent("Noted", {"n": 1})], 0)
    assert [r.data["n"] for r in store.read_stream(stream)] == [0, 1]
    store.close()


def test_a_read_whose_connection_the_server_drops_logs_no_pool_traceback(fresh_pg_url, caplog):
    """A read whose backend was terminated under it (a failover, pg_terminate_backend) handed the
    dead connection back to the pool, whose reset then failed and logged a traceback in `serve`'s
    log; a write already invalidated such a connection."""
    import logging

    import sqlalchemy as sa

    store = EventStore.open(fresh_pg_url)
    failed: list[BaseException] = []

    def reading() -> None:
        try:
            store._backend.fetch("SELECT pg_sleep(%s)", (30,))
        except Exception as exc:  # noqa: BLE001 - the test inspects it
            failed.append(exc)

    killer = sa.create_engine(normalise_url(fresh_pg_url), isolation_level="AUTOCOMMIT")
    with caplog.at_level(logging.ERROR, logger="sqlalchemy.pool"):
        read = threading.Thread(target=reading, daemon=True)
        read.start()
        with killer.connect() as conn:  # once the read is running
            killed = poll_count(conn, "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE "
                                "datname = current_database() AND query LIKE 'SELECT pg_sleep%'")
        killer.dispose()
        read.join(30)
    assert killed and len(failed) == 1, failed
    assert not [r for r in caplog.records if r.name.startswith("sqlalchemy.pool")], caplog.text
    stream = unique_stream()
    store.append(stream, [NewEvent("Opened", {"n": 0})], None)
    assert [r.data["n"] for r in store.read_stream(stream)] == [0]
    store.close()


def test_a_full_disk_is_said_as_such_not_hidden_by_a_failed_rollback(tmp_path):
    """SQLite rolls back a transaction whose write fails for space itself; the second ROLLBACK's
    'no transaction is active' used to be all a user saw of a full disk."""
    store = EventStore.open(f"sqlite:///{tmp_path / 'full.db'}")
    store.append("kept", [NewEvent("E", {"x": 1})], None)
    store._backend._write_connection().execute("PRAGMA max_page_count = 40")  # a disk of 160 KB
    with pytest.raises(sqlite3.OperationalError, match="database or disk is full"):
        for i in range(100):
            store.append(f"s{i}", [NewEvent("E", {"x": os.urandom(10000).hex()})], None)  # incompressible
    assert [e.data for e in store.read_stream("kept")] == [{"x": 1}]
    store.close()


_FORKED_STORE: EventStore | None = None  # the parent's store, inherited by forked children


def _append_and_read_back(prefix: str, count: int) -> list[str]:
    """What went wrong in this process, appending and reading back `count` new streams."""
    problems = []
    for i in range(count):
        stream = f"{prefix}-{i}"
        try:
            _FORKED_STORE.append(stream, [NewEvent("Forked", {"i": i})], None)
            if [e.data["i"] for e in _FORKED_STORE.read_stream(stream)] != [i]:
                problems.append(f"{stream}: read back wrong")
        except Exception as exc:  # noqa: BLE001 - every failure is the finding
            problems.append(f"{stream}: {type(exc).__name__}: {exc}")
    return problems


def _forked_child(prefix: str, queue) -> None:
    queue.put(_append_and_read_back(prefix, 30))


def test_a_store_used_before_a_fork_keeps_working_in_parent_and_children(store_url):
    """multiprocessing forks on Linux: a child drew the parent's pooled PostgreSQL connections, and
    both processes read each other's results ("the last operation didn't produce records", "can't
    change 'autocommit' now"), or hung. Each process now opens its own."""
    global _FORKED_STORE
    _FORKED_STORE = store = EventStore.open(store_url)
    try:
        prefix = unique_stream()
        assert _append_and_read_back(f"{prefix}-before", 3) == []  # the pool holds connections now
        ctx = mp.get_context("fork")
        queue = ctx.Queue()
        children = [ctx.Process(target=_forked_child, args=(f"{prefix}-c{k}", queue), daemon=True)
                    for k in range(2)]
        for child in children:
            child.start()
        try:
            parent = _append_and_read_back(f"{prefix}-p", 30)
            found = [queue.get(timeout=60) for _ in children]
            for child in children:
                child.join(timeout=60)
        finally:
            for child in children:  # a hung child (the bug's symptom) fails the test, not the run
                child.terminate()
        assert parent == [] and found == [[], []], (parent, found)
        assert [child.exitcode for child in children] == [0, 0]
        names = [f"{prefix}-before-{i}" for i in range(3)] + [
            f"{prefix}-{who}-{i}" for who in ("p", "c0", "c1") for i in range(30)]
        assert [store.stream_version(name) for name in names] == [0] * len(names)  # none lost
    finally:
        _FORKED_STORE = None
        store.close()


def test_the_append_api_refuses_wrong_types_in_words_and_takes_what_python_code_passes(store):
    """expected_version "0" made "expected version 0, but the stream is at version 0", and True
    counted as 1; a StrEnum event type was refused as "longer than 200 characters"; a NUL or a
    lone surrogate in a stream id failed inside PostgreSQL's driver (and was stored on SQLite)."""
    import enum

    import numpy as np

    class Kind(enum.StrEnum):
        OPENED = "Opened"

    stream = unique_stream()
    store.append(stream, [NewEvent(Kind.OPENED, {})], None)
    for bad in ("0", True, 0.0):
        with pytest.raises(ValueError, match="expected_version must be an integer"):
            store.append(stream, [NewEvent("Noted", {})], bad)
    recorded = store.append(stream, [NewEvent("Noted", {})], np.int64(0))
    assert [type(e.type) for e in store.read_stream(stream)] == [str, str]
    assert [e.type for e in store.read_stream(stream)] == ["Opened", "Noted"]
    assert recorded[0].version == 1
    for name in ("a\x00b", "lone \ud800 surrogate"):
        with pytest.raises(ValueError, match="NUL or a lone surrogate"):
            store.append(name, [NewEvent("Opened", {})], None)
        # so for an event type or id: SQLite stored them, PostgreSQL's driver refused in its words,
        # and a surrogate failed in a codec's naming neither field
        for events, what in (([NewEvent(name, {})], "event type"),
                             ([NewEvent("Opened", {}, event_id=name)], "event_id")):
            with pytest.raises(ValueError, match=f"{what} .* holds a NUL or a lone surrogate"):
                store.append(stream, events, 1)
    for negative in (-1, -5, np.int64(-1)):  # -1 made a new stream, as None does
        with pytest.raises(ValueError, match=f"expected_version must be a version .*not {negative}"):
            store.append(unique_stream(), [NewEvent("Opened", {})], negative)
    assert store.stream_version(stream) == 1  # nothing refused was written


def test_events_may_come_from_any_iterable_and_a_lone_event_or_none_is_refused_in_words(store):
    """A generator of events failed with "object of type 'generator' has no len()", None was
    taken for no events at all, and a lone NewEvent was iterated into its fields ("expected
    NewEvent, got str")."""
    stream = unique_stream()
    written = store.append(stream, (NewEvent(t, {}) for t in ("Opened", "Noted")), None)
    assert [e.version for e in written] == [0, 1]
    head = store.append_head(stream, iter([NewEvent("Closed", {})]), 1)
    assert head.version == 2
    fresh = store.new_stream(unique_stream(), (NewEvent("Opened", {}) for _ in range(2)))
    assert [h.version for h in store.create_streams([fresh])] == [1]
    for bad, words in ((NewEvent("Noted", {}), "not one NewEvent: pass \\[event\\]"),
                       (None, "not NoneType"), ("Noted", "not str"), ({"type": "Noted"}, "not dict"),
                       (5, "not int")):
        for write, args in ((store.append, (stream, bad, 2)), (store.append_head, (stream, bad, 2)),
                            (store.new_stream, (unique_stream(), bad))):
            with pytest.raises(TypeError, match=f"events must be a list of NewEvent, {words}"):
                write(*args)
    assert store.stream_version(stream) == 2  # nothing refused was written


def test_an_empty_append_still_checks_the_expected_version(store):
    stream = unique_stream()
    store.append(stream, [NewEvent("Opened", {})], None)
    assert store.append(stream, [], 0) == []
    for stale in (None, 3):
        with pytest.raises(ConcurrencyError):
            store.append(stream, [], stale)
    assert store.append(unique_stream(), [], None) == []  # a new stream, as expected
    with pytest.raises(ConcurrencyError):
        store.append(unique_stream(), [], 0)


def test_a_closed_store_refuses_to_be_used(store_url):
    """It reconnected quietly (on SQLite re-opening a writer and its lock file that nothing closed)."""
    from eventstore import StoreClosed

    store = EventStore.open(store_url)
    stream = unique_stream()
    store.append(stream, [NewEvent("Opened", {})], None)
    store.close()
    store.close()  # closing twice is harmless
    for use in (lambda: store.append(stream, [NewEvent("Noted", {})], 0),
                lambda: list(store.read_stream(stream)), lambda: list(store.read_all()),
                lambda: store.stream_version(stream)):
        with pytest.raises(StoreClosed, match="the event store is closed"):
            use()
    with EventStore.open(store_url) as reopened:
        assert reopened.stream_version(stream) == 0


def test_a_bad_synchronous_is_named_not_blamed_on_the_url(tmp_path):
    with pytest.raises(ValueError, match="synchronous must be one of") as refused:
        EventStore.open(f"sqlite:///{tmp_path / 's.db'}", synchronous="fsync")
    assert "not a database URL" not in str(refused.value)


def test_a_postgresql_server_that_never_answers_fails_to_open_in_seconds(monkeypatch):
    """A partitioned or hung server (the TCP handshake done by the kernel, then silence) kept a
    connect waiting as long as the kernel would: a server start, a step or /ready hung with it."""
    import socket

    from eventstore import StoreUnreachable, engine

    monkeypatch.setattr(engine, "PG_CONNECT_TIMEOUT_S", 1)
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        port = silent.getsockname()[1]
        for url in (f"postgresql://x@127.0.0.1:{port}/db",  # the store's default timeout
                    f"postgresql://x@127.0.0.1:{port}/db?connect_timeout=1"):  # the URL's own
            refused = []

            def opening(url: str = url, refused: list = refused) -> None:
                with pytest.raises(StoreUnreachable, match="cannot open the store") as caught:
                    EventStore.open(url)
                refused.append(caught.value)

            attempt = threading.Thread(target=opening, daemon=True)
            attempt.start()
            attempt.join(60)  # a guard, not a measurement: without a timeout it never returns
            assert refused, f"opening {url} still waits for a server that never answers"


def test_postgresql_connections_notice_a_server_gone_silent_and_the_url_wins(pg_database_url):
    """An established connection to a server that went silent (a partition, a failover without a
    reset) held a request until the kernel gave up, minutes later: keepalives and libpq's
    `tcp_user_timeout` end it in about a minute, as a 503. A URL's own value is kept."""
    from eventstore.engine import PG_DEAD_PEER

    for url, user_timeout in ((pg_database_url, "60000"),
                              (f"{pg_database_url}?tcp_user_timeout=5000", "5000")):
        with EventStore.open(url) as store:
            raw = store.engine.raw_connection()
            try:
                given = raw.driver_connection.info.get_parameters()
            finally:
                raw.close()
        assert given["tcp_user_timeout"] == user_timeout
        assert {k: given[k] for k in PG_DEAD_PEER if k != "tcp_user_timeout"} == {
            k: str(v) for k, v in PG_DEAD_PEER.items() if k != "tcp_user_timeout"}


def test_read_stream_pages_through_a_long_stream(store, monkeypatch):
    """It fetched a stream's every commit at once: a long stream of big events was all in memory
    before its first event was handed out."""
    from eventstore import backends
    from eventstore import store as store_module

    monkeypatch.setattr(store_module, "STREAM_PAGE_COMMITS", 3)
    stream = unique_stream()
    version = None
    for i in range(10):  # ten commits of two events
        version = store.append(stream, [NewEvent("A", {"i": i, "k": 0}), NewEvent("A", {"i": i, "k": 1})],
                               version)[-1].version
    fetched = []
    real_fetch = backends.Backend._fetch  # what every backend's reads go through

    def fetch(self, sql, params, text_factory=None):
        rows = real_fetch(self, sql, params, text_factory)
        fetched.append(len(rows))
        return rows

    monkeypatch.setattr(backends.Backend, "_fetch", fetch)
    everything = list(store.read_stream(stream))
    assert [e.version for e in everything] == list(range(20))
    assert max(fetched) == 3 and sum(fetched) == 10  # pages of three commits, each read once
    fetched.clear()
    assert [e.version for e in store.read_stream(stream, from_version=7)] == list(range(7, 20))
    assert [e.data for e in store.read_stream(stream, from_version=19)] == [{"i": 9, "k": 1}]


def _append_one(url_and_stream: tuple) -> None:
    _FORKED_STORE.append(url_and_stream[1], [NewEvent("Forked", {})], None)


def test_a_child_forked_while_another_thread_writes_can_write(tmp_path):
    """The SQLite writer's thread lock, held by another thread at the fork, stayed held forever
    in the child, whose first append hung; and its inherited writer connection was rolled back
    from the child. The child now has its own lock and connection."""
    global _FORKED_STORE
    url = f"sqlite:///{tmp_path / 's.db'}"
    _FORKED_STORE = store = EventStore.open(url)
    try:
        store.append("warm", [NewEvent("Opened", {})], None)  # the writer connection exists
        backend = store._backend
        backend._lock.acquire()  # as an append on another thread would hold it at the fork
        try:
            child = mp.get_context("fork").Process(target=_append_one, args=((url, "child"),),
                                                   daemon=True)
            child.start()
            child.join(timeout=30)
            if child.is_alive():
                child.terminate()
        finally:
            backend._lock.release()
        assert child.exitcode == 0
        assert store.stream_version("child") == 0
        store.append("parent", [NewEvent("Opened", {})], None)  # the parent's writer still works
    finally:
        _FORKED_STORE = None
        store.close()


def test_a_postgresql_append_behind_a_held_lock_fails_in_words_not_hangs(pg_database_url, monkeypatch):
    """PostgreSQL waits for a lock forever by default: a `LOCK TABLE` in a maintenance session, or
    a transaction left open in psql, hung every step. The store waits as long as SQLite's writers
    do (a test shortens it), then the append fails as an outage, and nothing half-done stays."""
    from api.sessions import outage_classes
    from eventstore import engine

    monkeypatch.setattr(engine, "PG_LOCK_TIMEOUT_MS", 300)
    stream = unique_stream()
    with EventStore.open(pg_database_url) as store:
        store.append(stream, [NewEvent("Opened", {})], None)
        failed = append_behind_a_held_lock(store, stream, pg_database_url)
        # an outage, as the server answers it (503 store_unavailable, retryable)
        assert len(failed) == 1 and isinstance(failed[0], outage_classes()), failed
        assert "lock timeout" in str(failed[0])
        assert [e.type for e in store.read_stream(stream)] == ["Opened"]
        store.append(stream, [NewEvent("Noted", {})], 0)  # the lock gone, the same append succeeds
        assert store.stream_version(stream) == 1


def test_a_lock_timeout_while_the_store_opens_is_an_outage_not_a_wrong_call(pg_database_url):
    """A server error with a SQLSTATE while the store opened (a lock timeout on alembic_version,
    a terminated backend) was StoreUnavailable, exit code 2, as a wrong URL is; it is worth
    trying again, as the same error a moment later in a command is (exit 1)."""
    import psycopg

    from eventstore import StoreUnreachable

    EventStore.open(pg_database_url).close()
    slow = f"{pg_database_url}?options=-c%20lock_timeout%3D300"
    with psycopg.connect(pg_database_url) as holder:
        holder.execute("LOCK TABLE alembic_version IN ACCESS EXCLUSIVE MODE")
        with pytest.raises(StoreUnreachable, match="lock timeout"):
            EventStore.open(slow)
        holder.rollback()
    EventStore.open(slow).close()


def test_a_lock_timeout_set_elsewhere_wins_over_the_stores(pg_database_url, monkeypatch):
    """The URL's options, PGOPTIONS (which a fixed `options` made libpq ignore, search_path and
    all) and the role's or database's own setting each keep theirs, 0 (off) included."""
    import sqlalchemy as sa

    from eventstore.engine import create_engine

    own = f"{pg_database_url}?options=-c%20lock_timeout%3D2500"

    def lock_timeout(url: str) -> str:
        engine = create_engine(url)
        try:
            with engine.connect() as conn:
                return conn.exec_driver_sql("SHOW lock_timeout").scalar()
        finally:
            engine.dispose()

    assert lock_timeout(pg_database_url) == "1min"
    assert lock_timeout(own) == "2500ms"
    assert lock_timeout(f"{pg_database_url}?options=-c%20lock_timeout%3D0") == "0"  # off, on purpose
    monkeypatch.setenv("PGOPTIONS", "-c lock_timeout=3500")
    assert lock_timeout(pg_database_url) == "3500ms"
    monkeypatch.delenv("PGOPTIONS")
    database = pg_database_url.rsplit("/", 1)[1].split("?")[0]
    admin = sa.create_engine(normalise_url(pg_database_url), isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'ALTER DATABASE "{database}" SET lock_timeout = 4500')
        assert lock_timeout(pg_database_url) == "4500ms"
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'ALTER DATABASE "{database}" RESET lock_timeout')
        admin.dispose()


@pytest.mark.parametrize("client_encoding", ["LATIN1", "WIN1252", "SQL_ASCII"])
def test_postgresql_text_round_trips_whatever_client_encoding_the_environment_sets(
        pg_database_url, monkeypatch, client_encoding):
    """libpq takes its client encoding from PGCLIENTENCODING: set to LATIN1 in the shell that
    ran `companyos rerun` or `verify`, an episode logged with an emoji in an action failed
    ("has no equivalent in encoding LATIN1"), and SQL_ASCII crashed the store's open with a
    TypeError traceback (psycopg then hands out bytes). The store's text is Unicode: it talks
    UTF-8, unless the URL itself names a client_encoding."""
    stream = unique_stream()
    data = {"text": "Grüße — 😀", "name": "Zoë"}
    store = EventStore.open(pg_database_url)
    try:
        store.append(stream, [NewEvent("Said", data)], expected_version=None)
    finally:
        store.close()
    monkeypatch.setenv("PGCLIENTENCODING", client_encoding)
    store = EventStore.open(pg_database_url)
    try:
        [event] = list(store.read_stream(stream))
        assert event.data == data
        store.append(stream, [NewEvent("Said", data)], expected_version=0)
        assert [e.data for e in store.read_stream(stream)] == [data, data]
        text = canonical_json(data).decode()  # the bytes logged before the variable was set
        assert store.stream_digest(stream) == chain_digest(chain_digest("", "Said", 1, text), "Said", 1, text)
    finally:
        store.close()
    # named in the URL itself, SQL_ASCII is refused in words (a TypeError traceback before)
    with pytest.raises(StoreUnavailable, match="client_encoding=SQL_ASCII makes the driver hand out bytes"):
        EventStore.open(f"{pg_database_url}?client_encoding=sql_ascii")


_ENCODED = "ENCODING '{}' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0"


@pytest.mark.pg
@pytest.mark.parametrize("encoding", ["LATIN1", "WIN1252"])
def test_a_postgresql_database_that_cannot_hold_every_character_is_refused_at_open(encoding):
    """A LATIN1 database took the first episodes and then failed a step whose action held an
    emoji with psycopg's UntranslatableCharacter (over HTTP a bare 500): it is refused when the
    store opens, in words, before anything is written."""
    from tests.conftest import _pg_engine, _throwaway_pg_database

    with _throwaway_pg_database(_ENCODED.format(encoding)) as url:
        with pytest.raises(StoreUnavailable, match=f"has the encoding {encoding}, .* needs a UTF8 database"):
            EventStore.open(url)
        engine = _pg_engine(url.rsplit("/", 1)[1])
        try:
            with engine.connect() as conn:
                assert conn.exec_driver_sql("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'"
                                            ).scalar() == 0
        finally:
            engine.dispose()


@pytest.mark.pg
def test_a_sql_ascii_postgresql_database_keeps_any_text_as_sent():
    """SQL_ASCII stores the bytes it is sent, so UTF-8 text round-trips: it serves as a store."""
    from tests.conftest import _throwaway_pg_database

    data = {"text": "Grüße — 😀"}
    with _throwaway_pg_database(_ENCODED.format("SQL_ASCII")) as url:
        store = EventStore.open(url)
        try:
            store.append("s", [NewEvent("Said", data)], expected_version=None)
            assert [e.data for e in store.read_stream("s")] == [data]
            assert store.stream_digest("s") == chain_digest("", "Said", 1, canonical_json(data).decode())
        finally:
            store.close()


_LOCK_HOLDER = """
import fcntl, sys
held = open(sys.argv[1], "a+")
fcntl.flock(held.fileno(), fcntl.LOCK_EX)
print("held", flush=True)
sys.stdin.read()  # until the test closes our stdin
"""


def _free(lock_path: str) -> bool:
    """Whether a new open file description (another writer process's view) can take the lock."""
    import fcntl

    with open(lock_path, "a+") as probe:
        try:
            fcntl.flock(probe.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        fcntl.flock(probe.fileno(), fcntl.LOCK_UN)
        return True


def _appending(store: EventStore, stream: str, expected: int) -> tuple[threading.Thread, list]:
    outcome: list = []

    def append() -> None:
        try:
            outcome.append(store.append(stream, [NewEvent("Noted", {})], expected))
        except BaseException as exc:  # noqa: BLE001 - the test inspects it
            outcome.append(exc)

    attempt = threading.Thread(target=append, daemon=True)
    attempt.start()
    return attempt, outcome


def _until_it_waits(file_lock, outcome: list, why: str = "") -> None:
    """Until an append waits for the lock file's helper (a guard, no timing); it must not have
    ended meanwhile."""
    deadline = time.monotonic() + 30
    while not file_lock._waiting:
        assert time.monotonic() < deadline and outcome == [], why or outcome
        time.sleep(0.01)


def test_a_sqlite_append_behind_a_stopped_writer_fails_in_words_not_hangs(tmp_path, monkeypatch):
    """Writer processes queue on an flock of `<db>-writer.lock`, which has no timeout: a writer
    stopped (Ctrl-Z, SIGSTOP) while it held it kept every other writer waiting for ever. The wait
    now ends after SQLite's busy timeout (a test shortens it) as a locked SQLite store does,
    an outage naming the lock; nothing is written, and once the holder is gone, writes go on
    and leave the lock free."""
    import signal

    from api.sessions import outage_classes
    from eventstore import engine

    monkeypatch.setattr(engine, "SQLITE_BUSY_TIMEOUT_MS", 300)
    db = tmp_path / "s.db"
    lock_path = f"{db}-writer.lock"
    with EventStore.open(f"sqlite:///{db}") as store:
        store.append("s", [NewEvent("Opened", {})], None)
        holder = subprocess.Popen([sys.executable, "-c", _LOCK_HOLDER, lock_path],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            assert holder.stdout.readline() == "held\n"
            os.kill(holder.pid, signal.SIGSTOP)  # the writer is suspended, its lock held
            attempt, outcome = _appending(store, "s", 0)
            attempt.join(60)  # a guard, not a measurement: before, it never returned
            assert not attempt.is_alive(), "the append still waits for the stopped writer"
            assert len(outcome) == 1 and isinstance(outcome[0], outage_classes()), outcome
            assert isinstance(outcome[0], sqlite3.OperationalError)
            assert outcome[0].sqlite_errorcode == sqlite3.SQLITE_BUSY
            assert "database is locked" in str(outcome[0]) and lock_path in str(outcome[0])
            assert [e.type for e in store.read_stream("s")] == ["Opened"]
        finally:
            os.kill(holder.pid, signal.SIGCONT)
            holder.stdin.close()  # it lets go of the lock as it exits
            holder.wait(30)
        # the given-up wait gets the lock once the holder is gone, and lets it go: another
        # process can take it, though this one has not written since
        deadline = time.monotonic() + 30
        while not _free(lock_path):
            assert time.monotonic() < deadline, "the abandoned wait kept the writer lock"
            time.sleep(0.01)
        store.append("s", [NewEvent("Noted", {})], 0)
        assert store.stream_version("s") == 1 and _free(lock_path)


_DIES_HOLDING_THE_LOCK = """
import fcntl, os, sys, threading, time
from eventstore import EventStore, NewEvent
store = EventStore.open(sys.argv[1])
store.append("s", [NewEvent("Opened", {})], None)
lock = store._backend._process_file_lock()
other = os.open(sys.argv[2], os.O_RDWR)
fcntl.flock(other, fcntl.LOCK_EX)  # another writer: the next append waits through the helper
waiting = threading.Thread(target=store.append, args=("s", [NewEvent("Noted", {})], 0))
waiting.start()
deadline = time.monotonic() + 30
while not lock._waiting:
    assert time.monotonic() < deadline, "the append never waited for the helper"
    time.sleep(0.01)
fcntl.flock(other, fcntl.LOCK_UN)
waiting.join()
assert lock.acquire(True, 10)  # as an append does, mid-write
if os.fork() == 0:  # a worker forked while the lock was held
    print(os.getpid(), flush=True)  # the fork's handlers have run
    time.sleep(120)
    os._exit(0)
os._exit(0)  # killed while it held the lock: no unlock, no close
"""


def test_a_writer_that_dies_holding_the_lock_does_not_leave_it_to_its_children(tmp_path):
    """A forked child inherited the store's lock-file descriptors (the helper thread's too), which
    share the parent's flock: a parent that died while it held the lock left it held for as long
    as the child lived, and every other writer failed after the busy timeout."""
    import signal

    db = tmp_path / "s.db"
    lock_path = f"{db}-writer.lock"
    script = subprocess.Popen([sys.executable, "-c", _DIES_HOLDING_THE_LOCK, f"sqlite:///{db}",
                               lock_path], stdout=subprocess.PIPE, text=True)
    line = script.stdout.readline()  # the child's: it keeps the pipe open, so no read to its end
    script.stdout.close()
    assert line, f"the script ended without forking (exit {script.wait(60)})"
    child = int(line)
    try:
        assert script.wait(60) == 0
        os.kill(child, 0)  # still alive, its inherited descriptors with it
        assert _free(lock_path), "the dead writer's lock is still held through its child"
        with EventStore.open(f"sqlite:///{db}") as store:
            store.append("s", [NewEvent("Noted", {})], 1)
            assert store.stream_version("s") == 2
    finally:
        os.kill(child, signal.SIGKILL)


def test_a_store_dropped_without_close_leaves_no_descriptor_of_its_writer_lock(tmp_path):
    """RL scripts drop environments without `close()`: each dropped store kept its writer lock's
    descriptor open, until the process ran out of them."""
    import gc

    db = tmp_path / "s.db"
    lock_path = os.path.realpath(f"{db}-writer.lock")

    def lock_descriptors() -> int:
        return sum(os.path.realpath(f"/proc/self/fd/{fd}") == lock_path for fd in os.listdir("/proc/self/fd")
                   if os.path.exists(f"/proc/self/fd/{fd}"))

    for i in range(5):
        store = EventStore.open(f"sqlite:///{db}")
        store.append(f"s{i}", [NewEvent("Opened", {})], None)
        assert lock_descriptors() == 1
        del store
        gc.collect()
        assert lock_descriptors() == 0
    with EventStore.open(f"sqlite:///{db}") as store:  # closed as usual: closed once, no error
        store.append("t", [NewEvent("Opened", {})], None)
    gc.collect()
    assert lock_descriptors() == 0


def test_no_descriptor_left_for_the_writer_lock_fails_the_append_not_the_lock(tmp_path, monkeypatch):
    """With no file descriptor left, the store turned its cross-process writer lock off for good
    and went on writing without it."""
    import errno

    real_open = os.open

    def no_descriptors_left(path, *args, **kwargs):
        if str(path).endswith("-writer.lock"):
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
        return real_open(path, *args, **kwargs)

    db = tmp_path / "s.db"
    with EventStore.open(f"sqlite:///{db}") as store:
        monkeypatch.setattr(os, "open", no_descriptors_left)
        with pytest.raises(sqlite3.OperationalError, match="writer lock .*Too many open files"):
            store.append("s", [NewEvent("Opened", {})], None)
        assert store.stream_version("s") is None
        monkeypatch.setattr(os, "open", real_open)
        store.append("s", [NewEvent("Opened", {})], None)  # descriptors back: under the lock again
        assert store._backend._file_lock is not None


def test_an_append_that_takes_over_a_given_up_wait_writes_under_the_lock(tmp_path, monkeypatch):
    """After a timed-out wait, the process's request for the lock is still queued in the kernel.
    The next append waits on that same request; it must hold the lock while it writes, and leave
    it free afterwards."""
    import fcntl

    from eventstore import engine
    from eventstore.backends import SqliteBackend

    db = tmp_path / "s.db"
    lock_path = f"{db}-writer.lock"
    with EventStore.open(f"sqlite:///{db}") as store, open(lock_path, "a+") as held:
        store.append("s", [NewEvent("Opened", {})], None)
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)  # another writer process
        monkeypatch.setattr(engine, "SQLITE_BUSY_TIMEOUT_MS", 200)
        attempt, outcome = _appending(store, "s", 0)
        attempt.join(60)
        assert isinstance(outcome[0], sqlite3.OperationalError), outcome

        monkeypatch.setattr(engine, "SQLITE_BUSY_TIMEOUT_MS", 60_000)
        lock_free_while_writing: list[bool] = []
        real_insert = SqliteBackend._insert

        def insert(self, *args, **kwargs):
            lock_free_while_writing.append(_free(lock_path))
            return real_insert(self, *args, **kwargs)

        monkeypatch.setattr(SqliteBackend, "_insert", insert)
        attempt, outcome = _appending(store, "s", 0)
        waiting = store._backend._file_lock
        _until_it_waits(waiting, outcome)  # on the given-up request
        assert waiting._pending and outcome == [] and lock_free_while_writing == []
        fcntl.flock(held.fileno(), fcntl.LOCK_UN)
        attempt.join(60)
        assert not attempt.is_alive() and len(outcome) == 1, outcome
        assert [r.type for r in outcome[0]] == ["Noted"]
        assert lock_free_while_writing == [False]
        assert _free(lock_path) and store.stream_version("s") == 1


def test_a_ctrl_c_as_the_writer_lock_is_granted_lets_it_go(tmp_path):
    """A Ctrl-C (KeyboardInterrupt) can end an append's wait for the writer lock just as the
    helper thread is granted it. That lock was then used and let go by no one: every other writer
    process waited behind this idle one until it wrote again or ended (an interactive session
    that caught the Ctrl-C could hold it for hours), and its next contended wait ended at once as
    'granted' while the helper's new request still queued behind the other writer."""
    import fcntl

    db = tmp_path / "s.db"
    lock_path = f"{db}-writer.lock"
    waiting = threading.Event()

    class CtrlCAsGranted(threading.Condition):
        """The append's wait: the Ctrl-C arrives as the helper's grant wakes it."""

        def wait(self, timeout=None):
            waiting.set()
            super().wait(timeout)  # only the helper's notify ends it (the timeout is 60 s)
            raise KeyboardInterrupt

    with EventStore.open(f"sqlite:///{db}") as store, open(lock_path, "a+") as held:
        store.append("s", [NewEvent("Opened", {})], None)
        file_lock = store._backend._process_file_lock()
        file_lock._state = CtrlCAsGranted(threading.Lock())
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)  # another writer process
        attempt, outcome = _appending(store, "s", 0)
        assert waiting.wait(60)
        fcntl.flock(held.fileno(), fcntl.LOCK_UN)  # the helper is granted the lock
        attempt.join(60)
        assert not attempt.is_alive() and len(outcome) == 1, outcome
        assert isinstance(outcome[0], KeyboardInterrupt), outcome
        assert _free(lock_path), "the interrupted append left this process holding the lock"
        assert store.stream_version("s") == 0

        file_lock._state = threading.Condition(threading.Lock())
        store.append("s", [NewEvent("Noted", {})], 0)  # uncontended
        fcntl.flock(held.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)  # another writer again
        attempt, outcome = _appending(store, "s", 1)
        _until_it_waits(file_lock, outcome,
                        "an append went on while another process held the writer lock")
        fcntl.flock(held.fileno(), fcntl.LOCK_UN)
        attempt.join(60)
        assert not attempt.is_alive() and len(outcome) == 1, outcome
        assert [r.type for r in outcome[0]] == ["Noted"]
        assert _free(lock_path) and store.stream_version("s") == 2


@pytest.mark.parametrize("taken", ["thread lock", "lock file", "granted lock file"])
def test_a_ctrl_c_as_a_writer_lock_is_taken_lets_it_go(tmp_path, monkeypatch, taken):
    """A Ctrl-C (KeyboardInterrupt) is raised as the call that took a writer lock returns (a C
    call's return, or the end of the wait for the helper's grant), before the append could note
    the lock taken. The lock then stayed taken with no one to let it go: the process's other
    threads failed after the busy timeout behind the thread lock, and other writer processes
    waited on the lock file until this one wrote again."""
    import fcntl

    from eventstore import engine

    monkeypatch.setattr(engine, "SQLITE_BUSY_TIMEOUT_MS", 2000)  # the old code's failure, sooner
    db = tmp_path / "s.db"
    lock_path = f"{db}-writer.lock"
    armed = threading.Event()

    class CtrlCAsTaken:
        """The store's thread lock; the Ctrl-C comes as its acquire returns."""

        def __init__(self, lock):
            self._real = lock

        def acquire(self, *args, **kwargs):
            got = self._real.acquire(*args, **kwargs)
            if armed.is_set():
                armed.clear()
                raise KeyboardInterrupt
            return got

        def __getattr__(self, name):
            return getattr(self._real, name)

        def __enter__(self):
            return self._real.__enter__()

        def __exit__(self, *exc):
            return self._real.__exit__(*exc)

    real_flock = fcntl.flock

    def flock_then_ctrl_c(fd, operation):
        real_flock(fd, operation)
        if operation == fcntl.LOCK_EX | fcntl.LOCK_NB and armed.is_set():
            armed.clear()
            raise KeyboardInterrupt

    class CtrlCAsTheWaitEnds(threading.Condition):
        """The lock file's condition; the Ctrl-C comes as the granted caller lets it go."""

        waiter = None

        def wait(self, timeout=None):
            self.waiter = threading.get_ident()
            return super().wait(timeout)

        def __exit__(self, *exc):
            super().__exit__(*exc)
            if threading.get_ident() == self.waiter and armed.is_set():
                armed.clear()
                raise KeyboardInterrupt

    with EventStore.open(f"sqlite:///{db}") as store, open(lock_path, "a+") as held:
        store.append("s", [NewEvent("Opened", {})], None)
        backend = store._backend
        armed.set()
        if taken == "thread lock":
            backend._lock = CtrlCAsTaken(backend._lock)
        elif taken == "lock file":
            monkeypatch.setattr(fcntl, "flock", flock_then_ctrl_c)
        else:
            file_lock = backend._process_file_lock()
            file_lock._state = CtrlCAsTheWaitEnds(threading.Lock())
            fcntl.flock(held.fileno(), fcntl.LOCK_EX)  # another writer process
        attempt, outcome = _appending(store, "s", 0)
        if taken == "granted lock file":
            _until_it_waits(file_lock, outcome)
            fcntl.flock(held.fileno(), fcntl.LOCK_UN)  # the helper is granted the lock
        attempt.join(60)
        assert not attempt.is_alive() and len(outcome) == 1, outcome
        assert isinstance(outcome[0], KeyboardInterrupt) and not armed.is_set(), outcome
        assert _free(lock_path), "the interrupted append left this process holding the lock"
        attempt, outcome = _appending(store, "s", 0)  # another thread of the process
        attempt.join(60)
        assert not attempt.is_alive() and len(outcome) == 1, outcome
        assert [r.type for r in outcome[0]] == ["Noted"], outcome
        assert _free(lock_path) and store.stream_version("s") == 1


@pytest.mark.parametrize("shortage", ["descriptor", "thread"])
def test_a_wait_the_helper_could_not_take_on_leaves_later_appends_working(tmp_path, monkeypatch,
                                                                         shortage):
    """Handing a contended wait to the helper thread can fail: no descriptor left for its `dup`
    (EMFILE), no thread to be had. The lock still counted that request as pending, which no helper
    would ever serve: every later append of the process waited for a grant that never came and
    failed 'database is locked' (the server's steps: 503), with the lock free."""
    import errno
    import fcntl

    from eventstore import engine

    db = tmp_path / "s.db"
    lock_path = f"{db}-writer.lock"
    monkeypatch.setattr(engine, "SQLITE_BUSY_TIMEOUT_MS", 2000)  # a stuck wait fails sooner
    with EventStore.open(f"sqlite:///{db}") as store, open(lock_path, "a+") as held:
        store.append("s", [NewEvent("Opened", {})], None)
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)  # another writer process
        with monkeypatch.context() as short:
            if shortage == "descriptor":
                def dup(fd):
                    raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
                short.setattr(os, "dup", dup)
            else:
                def start(self):
                    raise RuntimeError("can't start new thread")
                short.setattr(threading.Thread, "start", start)
            with pytest.raises((OSError, RuntimeError)):
                store.append("s", [NewEvent("Noted", {})], 0)
        fcntl.flock(held.fileno(), fcntl.LOCK_UN)
        store.append("s", [NewEvent("Noted", {})], 0)  # the lock is free

        fcntl.flock(held.fileno(), fcntl.LOCK_EX)  # and a wait is served again
        attempt, outcome = _appending(store, "s", 1)
        time.sleep(0.2)  # it waits (not a measurement)
        fcntl.flock(held.fileno(), fcntl.LOCK_UN)
        attempt.join(60)
        assert not attempt.is_alive() and len(outcome) == 1, outcome
        assert [r.type for r in outcome[0]] == ["Noted"]
        assert _free(lock_path) and store.stream_version("s") == 2


def test_a_sqlite_append_queued_behind_another_thread_gives_up_after_the_busy_timeout(
        tmp_path, monkeypatch):
    """Threads of one process queue for the store's writer before its lock file (the server has
    16 step threads). That wait had no limit: behind a stopped writer process each thread waited
    for the thread ahead of it to give up, then a busy timeout of its own, so the server's last
    step was answered 503 only after 16 busy timeouts. The whole wait now has the limit, as a
    connection waiting for SQLite's own lock does."""
    from eventstore import engine

    monkeypatch.setattr(engine, "SQLITE_BUSY_TIMEOUT_MS", 300)
    db = tmp_path / "s.db"
    with EventStore.open(f"sqlite:///{db}") as store:
        store.append("s", [NewEvent("Opened", {})], None)
        writer = store._backend._lock
        writer.acquire()  # another thread's append, waiting for a stopped writer process
        try:
            for write in ("append", "create_streams"):
                outcome: list = []

                def attempt_write(write=write, outcome=outcome) -> None:
                    try:
                        if write == "append":
                            store.append("s", [NewEvent("Noted", {})], 0)
                        else:
                            store.create_streams([store.new_stream("t", [NewEvent("Opened", {})])])
                        outcome.append("written")
                    except BaseException as exc:  # noqa: BLE001 - the test inspects it
                        outcome.append(exc)

                attempt = threading.Thread(target=attempt_write, daemon=True)
                attempt.start()
                attempt.join(60)  # a guard, not a measurement: before, it waited for the thread
                assert not attempt.is_alive(), f"{write} still waits for the other thread"
                assert len(outcome) == 1 and isinstance(outcome[0], sqlite3.OperationalError), outcome
                assert outcome[0].sqlite_errorcode == sqlite3.SQLITE_BUSY
                assert "database is locked" in str(outcome[0])
        finally:
            writer.release()
        assert store.stream_version("s") == 0 and store.stream_version("t") is None
        store.append("s", [NewEvent("Noted", {})], 0)
        assert store.stream_version("s") == 1


@pytest.mark.parametrize("write", ["append", "create_streams"])
def test_a_ctrl_c_as_begin_returns_leaves_no_transaction_open(tmp_path, monkeypatch, write):
    """A Ctrl-C handled just as `BEGIN IMMEDIATE` returned (a notebook's interrupt, a second
    Ctrl-C) left the writer connection inside its transaction, holding SQLite's write lock: every
    later append of the process failed "cannot start a transaction within a transaction", and
    every other writer waited out the busy timeout. The transaction is rolled back."""
    from eventstore.backends import SqliteBackend

    db = tmp_path / "s.db"
    real_connection = SqliteBackend._write_connection

    class InterruptedCursor:
        def __init__(self, cursor):
            self._cursor = cursor

        def execute(self, sql, *args):
            result = self._cursor.execute(sql, *args)
            if sql == "BEGIN IMMEDIATE":
                raise KeyboardInterrupt
            return result

        def __getattr__(self, name):
            return getattr(self._cursor, name)

    class InterruptedConnection:
        def __init__(self, connection):
            self._connection = connection

        def cursor(self):
            return InterruptedCursor(self._connection.cursor())

    with EventStore.open(f"sqlite:///{db}") as store:
        store.append("s", [NewEvent("Opened", {})], None)
        with monkeypatch.context() as interrupted:
            interrupted.setattr(SqliteBackend, "_write_connection",
                                lambda self, *a: InterruptedConnection(real_connection(self, *a)))
            with pytest.raises(KeyboardInterrupt):
                if write == "append":
                    store.append("s", [NewEvent("Noted", {})], 0)
                else:
                    store.create_streams([store.new_stream("t", [NewEvent("Opened", {})])])
        other = sqlite3.connect(db, timeout=0)  # another writer is not kept waiting
        other.execute("BEGIN IMMEDIATE")
        other.rollback()
        other.close()
        store.append("s", [NewEvent("Noted", {})], 0)
        assert store.stream_version("s") == 1 and store.stream_version("t") is None


def test_an_append_as_a_given_up_grant_is_let_go_still_writes_under_the_lock(tmp_path, monkeypatch):
    """The helper thread lets go of a grant whose caller gave up. An append of the same process
    that came as it did so (its quick try reads no lock) could see the request as settled while
    the grant still stood: its own try then merely confirmed the lock this description held, and
    the helper's unlock dropped it under the append. The request is settled only after the unlock."""
    import fcntl

    from eventstore import engine, writerlock
    from eventstore.backends import SqliteBackend

    db = tmp_path / "s.db"
    lock_path = f"{db}-writer.lock"
    unlocking, go, unlocked = threading.Event(), threading.Event(), threading.Event()
    real_flock = fcntl.flock

    def flock(fd, operation):
        helper = threading.current_thread().name == "companyos-writer-lock"
        if helper and operation == fcntl.LOCK_UN:
            unlocking.set()
            go.wait(2)  # a guard: with the fix, the append waits for this unlock to end
            real_flock(fd, operation)
            unlocked.set()
            return None
        return real_flock(fd, operation)

    monkeypatch.setattr(writerlock, "fcntl", type("Fcntl", (), {
        "flock": staticmethod(flock), "LOCK_EX": fcntl.LOCK_EX, "LOCK_NB": fcntl.LOCK_NB,
        "LOCK_UN": fcntl.LOCK_UN}))
    with EventStore.open(f"sqlite:///{db}") as store, open(lock_path, "a+") as held:
        store.append("s", [NewEvent("Opened", {})], None)
        real_flock(held.fileno(), fcntl.LOCK_EX)  # another writer process
        monkeypatch.setattr(engine, "SQLITE_BUSY_TIMEOUT_MS", 200)
        attempt, outcome = _appending(store, "s", 0)
        attempt.join(60)
        assert isinstance(outcome[0], sqlite3.OperationalError), outcome  # it gave up
        monkeypatch.setattr(engine, "SQLITE_BUSY_TIMEOUT_MS", 60_000)
        real_flock(held.fileno(), fcntl.LOCK_UN)  # the helper is granted, and lets it go
        assert unlocking.wait(30)

        lock_free_while_writing: list[bool] = []
        real_insert = SqliteBackend._insert

        def insert(self, *args, **kwargs):
            go.set()
            assert unlocked.wait(30)
            lock_free_while_writing.append(_free(lock_path))
            return real_insert(self, *args, **kwargs)

        monkeypatch.setattr(SqliteBackend, "_insert", insert)
        store.append("s", [NewEvent("Noted", {})], 0)
        assert lock_free_while_writing == [False], "the append wrote without the writer lock"
        assert _free(lock_path) and store.stream_version("s") == 1


def test_an_event_whose_stored_json_was_damaged_is_named_when_decoded(store):
    """`record.data` raised orjson's bare JSONDecodeError, which named no stream or position."""
    stream = unique_stream()
    recorded = store.append(stream, [NewEvent("A", {"n": 1}), NewEvent("B", {"n": 2})], None)
    tamper.edit_event(store.engine, stream, 1, "data", lambda _old: '{"broken')
    first, second = store.read_stream(stream)
    assert first.data == {"n": 1}
    with pytest.raises(CorruptCommit, match=rf"stream '{stream}': the event at version 1 \(position "
                                            rf"{recorded[1].position}\) does not decode: "
                                            "its data is not JSON"):
        _ = second.data
    tamper.edit_payload(store.engine, recorded[1].position, lambda p: p.__setitem__("meta", "[1"))
    with pytest.raises(CorruptCommit, match="at version 0 .* does not decode: its meta is not JSON"):
        _ = next(iter(store.read_stream(stream))).meta
