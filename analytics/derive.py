"""Derive `episodes`, `steps` and `rewards` from events, in SQL inside DuckDB, one sync batch at a time.

The unit of work is the set of *target* streams: episode streams with events in the batch. A
target that already has rows (an episode that started in an earlier batch) is recomputed from
all its events, old ones read back from `events` and new ones from the batch, and its old rows
are replaced; a fresh target is computed from the batch alone (`derive_fresh`, which the sync runs
on a thread and DuckDB of its own, a batch ahead of the writer's `derive_batch`). Derivation
therefore never depends on where batch boundaries fall: an incremental sync equals a fresh full sync.

Which step an event belongs to: a step is appended atomically as `ActionTaken` followed by its
effects, chaos and rewards, so an event belongs to the latest `ActionTaken` at or before it in
its stream ("owner", kept as the ActionTaken's position). Events before the first action are the
reset. Two ways to find the owner, with the same answer:

- fast (fresh streams): appends are contiguous in position order, so the batch, which arrives in
  position order, is cut into runs (a run starts at every ActionTaken and every change of stream)
  and each row's owner is its run's ActionTaken. `annotate` computes this on Arrow, no sorting.
- slow (continuing streams, and the odd stream with an append that does not start with an action):
  a running max over the stream's events in version order (a SQL window).

Speed notes (DuckDB): JSON is parsed once per event into narrow scalar columns before anything is
grouped; wide strings and LIST columns are never carried through a sort or a group-by.
"""

from __future__ import annotations

from typing import NamedTuple

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

# The event types analytics reads; chaos events (data.cause == "chaos") are read whatever their type.
# ApprovalSubmitted and ApprovalEscalated tell whether a mistake was put right (the decisive step).
FACT_TYPES = ("EpisodeStarted", "EpisodeEnded", "ActionTaken", "ActionRejected", "RewardGranted",
              "MistakeRecorded", "ApprovalSubmitted", "ApprovalEscalated")
_CHAOS_TEXT = '"cause":"chaos"'  # canonical JSON has no whitespace: a cheap pre-filter
_CHAOS_LIKE = f"%{_CHAOS_TEXT}%"


def annotate(batch: pa.Table) -> pa.Table:
    """Add `owner` (position of the ActionTaken heading each row's run, NULL outside a step), `fact`
    (a type derivation reads) and `chaos_hint` (may be a chaos event).

    The batch must be in position order (every reader returns it so). Runs on the sync's reader
    thread, so it overlaps with DuckDB's work on the previous batch.
    """
    n = batch.num_rows
    if n == 0:
        raise ValueError("annotate needs at least one event")
    stream = batch["stream_id"].combine_chunks()
    position = batch["position"].combine_chunks()
    types = batch["type"].combine_chunks()
    changed = pa.concat_arrays([pa.array([True]), pc.not_equal(stream.slice(1), stream.slice(0, n - 1))])
    is_action = pc.equal(types, "ActionTaken")
    none = pa.scalar(None, pa.int64())
    marker = pc.if_else(is_action, position, pc.if_else(changed, pa.scalar(-1, pa.int64()), none))
    owner = pc.fill_null_forward(marker)
    owner = pc.if_else(pc.equal(owner, -1), none, owner)
    fact = pc.is_in(types, value_set=pa.array(FACT_TYPES))
    # a chaos event is a type that can carry a cause (or one the domain does not know) whose JSON
    # says "cause":"chaos"; the substring test is a pre-filter, DuckDB checks the parsed field
    candidate = pc.invert(pc.is_in(types, value_set=pa.array(_never_chaos())))
    hint = pa.repeat(pa.scalar(False), n)
    if pc.any(candidate).as_py():  # substring search only in the candidates' data
        found = pc.match_substring(pc.filter(batch["data"], candidate), _CHAOS_TEXT).combine_chunks()
        hint = pc.replace_with_mask(hint, candidate, found)
    return (batch.append_column("owner", owner).append_column("fact", fact)
            .append_column("chaos_hint", hint))


# Each stream of the batch, once: derive_fresh computes it and hands it to derive_batch.
# odd: a run that does not start with an action after the stream's first action (the run rule
# would leave such rows without their owner), so the stream is derived the slow way.
_AFFECTED = """
CREATE OR REPLACE TEMP TABLE t_affected AS
WITH odd AS (
    SELECT DISTINCT b.stream_id
    FROM batch b JOIN (SELECT stream_id, min(version) AS first_action FROM batch
                       WHERE type = 'ActionTaken' GROUP BY stream_id) a ON a.stream_id = b.stream_id
    WHERE b.owner IS NULL AND b.version > a.first_action
)
SELECT stream_id,
       min(position) AS first_new,
       max(position) AS last_position,
       max(version) AS last_version,
       -- readers give the digest at least on each commit's last event, so on each stream's last
       arg_max(digest, version) FILTER (WHERE digest IS NOT NULL) AS digest,
       count(*) AS new_events,
       bool_or(version = 0 AND type = 'EpisodeStarted') AS starts,
       stream_id IN (SELECT stream_id FROM odd) AS odd
FROM batch GROUP BY stream_id
"""
# The fast targets, found from the batch alone: episodes it starts (so the warehouse holds nothing
# of them yet: a stream's version 0 lies after the checkpoint) whose steps are whole runs.
_FRESH_TARGETS = """
CREATE OR REPLACE TEMP TABLE t_targets AS
SELECT stream_id, last_position, last_version, digest, first_new AS first_position,
       new_events AS event_count, false AS known, false AS slow
FROM t_affected WHERE starts AND NOT odd
"""
# The slow targets, for the writer: odd new episodes, and episodes continuing from an earlier batch.
# Only streams the batch does not start are looked up in `episodes` (the others cannot be there):
# a lookup of every stream scanned the whole table each batch, a cost that grew with the warehouse
# (~40 ms a batch at 1M episodes), where a batch of whole episodes now looks up none.
_SLOW_TARGETS = """
CREATE OR REPLACE TEMP TABLE t_targets AS
SELECT stream_id, last_position, last_version, digest, first_new AS first_position,
       new_events AS event_count, false AS known, true AS slow
FROM batch_streams WHERE starts AND odd
UNION ALL
SELECT a.stream_id, a.last_position, a.last_version, a.digest, e.first_position,
       e.event_count + a.new_events AS event_count, true AS known, true AS slow
FROM (SELECT * FROM batch_streams WHERE NOT starts) a JOIN episodes e ON e.episode_id = a.stream_id
"""

# One narrow row per fact; x holds the type's fields, c the chaos marker. JSON is parsed once.
_FACT_COLUMNS = """
    stream_id, position, version, type, {owner} AS owner,
    CASE WHEN type = 'ActionTaken'
              THEN json_extract_string(data, ['$.step', '$.action.app', '$.action.method', '$.-'])
         WHEN type = 'ActionRejected'
              THEN json_extract_string(data, ['$.step', '$.code', '$.cause', '$.reason'])
         WHEN type = 'RewardGranted' THEN json_extract_string(data, ['$.-', '$.rule', '$.value', '$.-'])
         WHEN type = 'MistakeRecorded'
              THEN json_extract_string(data, ['$.step', '$.mode', '$.subject', '$.irreversible'])
         WHEN type = 'ApprovalSubmitted'
              THEN json_extract_string(data, ['$.step', '$.approval_type', '$.approval_id', '$.problems'])
         WHEN type = 'ApprovalEscalated'
              THEN json_extract_string(data, ['$.-', '$.approval_id', '$.-', '$.-'])
    END AS x,
    CASE WHEN {hint} THEN json_extract_string(data, ['$.cause', '$.mechanism']) END AS c
"""


def _chaos_candidates() -> tuple[str, ...]:
    """Event types that can carry cause="chaos": by the domain's convention, those with a mechanism."""
    from domain.events import EVENT_TYPES

    return tuple(sorted(name for name, cls in EVENT_TYPES.items()
                        if "cause" in cls._fields and "mechanism" in cls._fields))


def _fact_where() -> str:
    """Facts, plus chaos events: LIKE only runs on types that may carry a cause, or types the domain
    does not know (events written by newer code)."""
    return f"(type IN ({_sql_list(FACT_TYPES)}) OR {_chaos_hint_sql()})"


def _sql_list(names: tuple[str, ...]) -> str:
    """Type names (identifiers from the domain's own registry) as a SQL list of literals."""
    return ", ".join("'" + n.replace("'", "''") + "'" for n in names) or "NULL"


def _known_types() -> tuple[str, ...]:
    from domain.events import EVENT_TYPES

    return tuple(sorted(EVENT_TYPES))


def _never_chaos() -> tuple[str, ...]:
    """Known event types that cannot carry cause="chaos" (facts aside, no need to look inside)."""
    candidates = set(_chaos_candidates())
    return tuple(t for t in _known_types() if t not in candidates)


def _chaos_hint_sql() -> str:
    """The SQL twin of annotate's chaos_hint, for events read back from the warehouse."""
    return (f"((type IN ({_sql_list(_chaos_candidates())}) OR type NOT IN ({_sql_list(_known_types())})) "
            f"AND data LIKE '{_CHAOS_LIKE}')")


_FACTS = """
CREATE OR REPLACE TEMP TABLE t_facts AS
WITH parsed AS ({source}),
f AS (
    SELECT stream_id, position, version, type, owner,
           TRY_CAST(x[1] AS INTEGER) AS step, x[2] AS s1, x[3] AS s2, x[4] AS s3,
           c[1] IS NOT DISTINCT FROM 'chaos' AS is_chaos,
           CASE WHEN c[1] = 'chaos' THEN coalesce(c[2], type) END AS mechanism
    FROM parsed
)
{select}
"""
_FAST_SELECT = "SELECT * FROM f"
_SLOW_SELECT = """
SELECT * REPLACE (max(CASE WHEN type = 'ActionTaken' THEN position END)
                      OVER (PARTITION BY stream_id ORDER BY version ROWS UNBOUNDED PRECEDING) AS owner)
FROM f
"""

# Scalar columns, not the lists json_extract_string returns: every step row joins its start, and
# a LIST column carried through that join cost more than the rest of the steps statement.
_START = """
CREATE OR REPLACE TEMP TABLE t_start AS
SELECT stream_id, x[1] AS task, TRY_CAST(x[2] AS BIGINT) AS seed, TRY_CAST(x[3] AS DOUBLE) AS chaos,
       x[4] AS reward_profile, TRY_CAST(x[5] AS INTEGER) AS max_steps,
       -- domain.rules_of: a target naming no rules version was judged by version 1
       CASE WHEN x[6] IS NULL THEN 1 ELSE TRY_CAST(x[6] AS INTEGER) END AS rules,
       m[1] AS agent, m[2] AS started_at
FROM (SELECT stream_id,
             json_extract_string(data, ['$.task', '$.seed', '$.chaos', '$.reward_profile',
                                        '$.max_steps', '$.target.rules']) AS x,
             json_extract_string(meta, ['$.agent', '$.recorded_at']) AS m
      FROM ({source}) WHERE version = 0)
"""

_CHAOS = """
CREATE OR REPLACE TEMP TABLE t_chaos AS
SELECT stream_id, coalesce(owner, -1) AS owner, version, mechanism FROM t_facts WHERE is_chaos
"""

_STEPS = """
CREATE OR REPLACE TEMP TABLE t_steps AS
WITH extra AS (
    SELECT owner,
           count(*) FILTER (WHERE type = 'ActionRejected') AS rejections,
           arg_min(s1, version) FILTER (WHERE type = 'ActionRejected') AS reject_code,
           arg_min(s3, version) FILTER (WHERE type = 'ActionRejected') AS reject_reason,
           arg_min(s2, version) FILTER (WHERE type = 'ActionRejected') AS reject_cause,
           round(sum(TRY_CAST(s2 AS DOUBLE)) FILTER (WHERE type = 'RewardGranted'), 6) AS reward,
           arg_min(s1, version) FILTER (WHERE type = 'MistakeRecorded') AS mistake,
           count(*) FILTER (WHERE type = 'MistakeRecorded') AS mistakes,
           count(*) FILTER (WHERE is_chaos) AS chaos_events,
           bool_or(type = 'EpisodeEnded') AS terminal
    FROM t_facts WHERE owner IS NOT NULL AND type <> 'ActionTaken'
    GROUP BY owner
), epochs AS (
    -- the chaos that had fired by each chaos event (few per episode); a step reads the latest epoch
    SELECT c.stream_id, c.owner, list(DISTINCT p.mechanism ORDER BY p.mechanism) AS active
    FROM t_chaos c JOIN t_chaos p ON p.stream_id = c.stream_id AND p.owner <= c.owner
    GROUP BY c.stream_id, c.owner
), now AS (
    SELECT owner, list(DISTINCT mechanism ORDER BY mechanism) AS chaos_now
    FROM t_chaos WHERE owner >= 0 GROUP BY owner
), latest AS (
    SELECT a.position, a.stream_id, max(e.owner) AS epoch
    FROM t_facts a JOIN epochs e ON e.stream_id = a.stream_id AND a.position >= e.owner
    WHERE a.type = 'ActionTaken'
    GROUP BY a.position, a.stream_id
), active AS (
    SELECT l.position AS owner, e.active AS chaos_active
    FROM latest l JOIN epochs e ON e.stream_id = l.stream_id AND e.owner = l.epoch
)
SELECT a.stream_id AS episode_id, st.task, st.agent, st.chaos,
       a.step, a.position, a.version,
       -- json_extract_string spells any JSON value as text (an app of 1, a method of ["x"]): the
       -- domain's malformed_action says which actions had no string app and method
       CASE WHEN x.reject_code IS DISTINCT FROM 'malformed_action' THEN a.s1 END AS app,
       CASE WHEN x.reject_code IS DISTINCT FROM 'malformed_action' THEN a.s2 END AS method,
       CASE WHEN x.reject_code IS DISTINCT FROM 'malformed_action' AND a.s1 IS NOT NULL
                 AND a.s2 IS NOT NULL THEN a.s1 || '.' || a.s2
            ELSE '(malformed)' END AS tool,
       coalesce(x.rejections, 0) = 0 AS accepted,
       x.reject_code, x.reject_reason, x.reject_cause,
       coalesce(x.reward, 0) AS reward,
       x.mistake, coalesce(x.mistakes, 0) AS mistakes,
       coalesce(x.chaos_events, 0) AS chaos_events,
       coalesce(n.chaos_now, []) AS chaos_now,
       coalesce(ac.chaos_active, []) AS chaos_active,
       coalesce(x.terminal, false) AS terminal
FROM t_facts a
JOIN t_start st ON st.stream_id = a.stream_id
LEFT JOIN extra x ON x.owner = a.position
LEFT JOIN now n ON n.owner = a.position
LEFT JOIN active ac ON ac.owner = a.position
WHERE a.type = 'ActionTaken'
"""

_REWARDS = """
CREATE OR REPLACE TEMP TABLE t_rewards AS
SELECT f.stream_id AS episode_id, f.s1 AS rule, count(*) AS grants,
       round(sum(TRY_CAST(f.s2 AS DOUBLE)), 6) AS total, min(s.step) AS first_step
FROM t_facts f LEFT JOIN t_steps s ON s.position = f.owner
WHERE f.type = 'RewardGranted'
GROUP BY f.stream_id, f.s1
"""

_EPISODES = """
CREATE OR REPLACE TEMP TABLE t_episodes AS
WITH en AS (
    SELECT stream_id,
           arg_max(json_extract_string(data, ['$.outcome', '$.failure_mode', '$.steps', '$.total_return']),
                   version) AS x
    FROM ({source}) GROUP BY stream_id
),
agg AS (
    SELECT episode_id AS stream_id,
           count(*) AS actions,
           min(step) FILTER (WHERE NOT accepted) AS first_rejection_step,
           count(*) FILTER (WHERE NOT accepted) AS rejected_actions,
           max(step) AS last_step
    FROM t_steps GROUP BY episode_id
),
rew AS (SELECT episode_id AS stream_id, sum(total) AS reward_sum FROM t_rewards GROUP BY episode_id),
mech AS (
    SELECT stream_id, count(*) AS chaos_events,
           list(DISTINCT mechanism ORDER BY mechanism) AS chaos_mechanisms
    FROM t_chaos GROUP BY stream_id
),
-- whether a recorded mistake was put right, `_resolved` of domain/outcomes.py mirrored: a rejection
-- escalated, or followed by a later submission of its approval type; missing fields followed by
-- any later submission of the type; other problems by a later one without problems
subm AS (
    SELECT stream_id, step, s1 AS approval_type, s2 AS approval_id, s3 = '[]' AS clean
    FROM t_facts WHERE type = 'ApprovalSubmitted'
),
esc AS (SELECT DISTINCT stream_id, s1 AS approval_id FROM t_facts WHERE type = 'ApprovalEscalated'),
-- a rejection is recorded when it happens, but it is only a mistake if left unhandled: one that
-- was handled (chaos rejects correct requests too) is never the agent's mistake
handled AS (
    SELECT m.position FROM t_facts m
    WHERE m.type = 'MistakeRecorded' AND m.s1 = 'rejection_not_handled'
      AND (EXISTS (SELECT 1 FROM esc WHERE esc.stream_id = m.stream_id AND esc.approval_id = m.s2)
           OR EXISTS (SELECT 1 FROM subm a JOIN subm b ON b.stream_id = a.stream_id
                      AND b.approval_type = a.approval_type
                      WHERE a.stream_id = m.stream_id AND a.approval_id = m.s2 AND b.step > m.step))
),
firsts AS (
    SELECT stream_id, min(step) AS first_mistake_step, arg_min(s1, version) AS first_mistake_mode,
           count(*) AS mistakes
    FROM t_facts
    WHERE type = 'MistakeRecorded' AND position NOT IN (SELECT position FROM handled)
    GROUP BY stream_id
),
-- the decisive step, as domain/outcomes.py decides the failure mode: the irreversible mistake that
-- ended the episode, or on truncation the first mistake never put right; else the last step
-- carrying the mode, else the last step
mist AS (
    SELECT m.stream_id, m.step, m.version, m.s3 = 'true' AS irreversible,
           m.s1 = en.x[2] AS decides, en.x[1] AS outcome,
           CASE WHEN m.s1 = 'rejection_not_handled' THEN m.position IN (SELECT position FROM handled)
                WHEN m.s1 = 'missing_required_fields'
                     THEN EXISTS (SELECT 1 FROM subm b WHERE b.stream_id = m.stream_id
                                  AND b.approval_type = m.s2 AND b.step > m.step)
                ELSE EXISTS (SELECT 1 FROM subm b WHERE b.stream_id = m.stream_id
                             AND b.approval_type = m.s2 AND b.step > m.step AND b.clean)
           END AS resolved
    FROM t_facts m JOIN en ON en.stream_id = m.stream_id
    WHERE m.type = 'MistakeRecorded' AND en.x[1] IN ('failure', 'truncated')
),
decisive AS (
    SELECT stream_id,
           coalesce(CASE WHEN outcome = 'failure' THEN min(step) FILTER (WHERE irreversible AND decides)
                         ELSE arg_min(step, version)
                                  FILTER (WHERE NOT irreversible AND NOT resolved AND decides)
                    END,
                    max(step) FILTER (WHERE decides)) AS step
    FROM mist GROUP BY stream_id, outcome
),
lead AS (
    SELECT s.episode_id AS stream_id, list(s.tool ORDER BY s.version) AS lead_in
    FROM t_steps s JOIN agg a ON a.stream_id = s.episode_id
    LEFT JOIN decisive d ON d.stream_id = s.episode_id
    WHERE s.step <= coalesce(d.step, a.last_step)
      AND s.step > coalesce(d.step, a.last_step) - 5
    GROUP BY s.episode_id
)
SELECT t.stream_id AS episode_id,
       st.task, st.seed, st.chaos, st.agent, st.reward_profile, st.max_steps, st.rules,
       en.x[1] AS outcome,
       en.x[2] AS failure_mode,
       coalesce(TRY_CAST(en.x[3] AS INTEGER), a.actions, 0) AS steps,
       coalesce(TRY_CAST(en.x[4] AS DOUBLE), round(r.reward_sum, 6), 0) AS total_return,
       round(coalesce(r.reward_sum, 0), 6) AS reward_sum,
       fm.first_mistake_step, fm.first_mistake_mode, coalesce(fm.mistakes, 0) AS mistakes,
       a.first_rejection_step, coalesce(a.rejected_actions, 0) AS rejected_actions,
       coalesce(m.chaos_events, 0) AS chaos_events,
       coalesce(m.chaos_mechanisms, []) AS chaos_mechanisms,
       coalesce(l.lead_in, []) AS lead_in,
       st.started_at,
       t.first_position, t.last_position, t.event_count, t.last_version, t.digest
FROM t_targets t
JOIN t_start st ON st.stream_id = t.stream_id
LEFT JOIN en ON en.stream_id = t.stream_id
LEFT JOIN agg a ON a.stream_id = t.stream_id
LEFT JOIN firsts fm ON fm.stream_id = t.stream_id
LEFT JOIN rew r ON r.stream_id = t.stream_id
LEFT JOIN mech m ON m.stream_id = t.stream_id
LEFT JOIN lead l ON l.stream_id = t.stream_id
"""

_STEP_COLUMNS = ("episode_id, task, agent, chaos, step, position, version, app, method, tool, accepted, "
                 "reject_code, reject_reason, reject_cause, reward, mistake, chaos_events, chaos_now, "
                 "chaos_active, terminal")
_REPLACE = (
    "DELETE FROM steps WHERE position >= $old_lo "
    "AND episode_id IN (SELECT stream_id FROM t_targets WHERE known)",
    "DELETE FROM rewards WHERE episode_id IN (SELECT stream_id FROM t_targets WHERE known)",
    "DELETE FROM episodes WHERE first_position >= $old_lo "
    "AND episode_id IN (SELECT stream_id FROM t_targets WHERE known)",
)
_INSERT = (
    f"INSERT INTO steps ({_STEP_COLUMNS}) SELECT {_STEP_COLUMNS} FROM t_steps",
    "INSERT INTO rewards BY NAME SELECT * FROM t_rewards",
    "INSERT INTO episodes BY NAME SELECT * FROM t_episodes",
)
_TEMP = ("t_affected", "t_targets", "t_start", "t_facts", "t_chaos", "t_steps", "t_rewards", "t_episodes")


def _rows(columns: str, where: tuple[str, str], fast: bool | None, with_old: bool,
          every_stream: bool = False) -> str:
    """SELECT `columns` over the target events: fast targets' batch rows, or slow targets' rows.

    `where` is (filter on batch rows, filter on warehouse rows); `every_stream` says every stream
    of the batch is a fast target, so no filter on streams is needed.
    """
    batch_cols = columns.format(owner="owner", hint="chaos_hint")
    if fast:
        streams = "" if every_stream else " AND stream_id IN (SELECT stream_id FROM t_targets WHERE NOT slow)"
        return f"SELECT {batch_cols} FROM batch WHERE {where[0]}{streams}"
    which = "" if fast is None else "WHERE slow"
    sql = (f"SELECT {batch_cols} FROM batch WHERE {where[0]} "
           f"AND stream_id IN (SELECT stream_id FROM t_targets {which})")
    if with_old:
        old_cols = columns.format(owner="NULL::BIGINT", hint=_chaos_hint_sql())
        sql += (f" UNION ALL SELECT {old_cols} FROM events "
                "WHERE position >= $old_lo AND position < $batch_lo "
                f"AND stream_id IN (SELECT stream_id FROM t_targets WHERE known) AND {where[1]}")
    return sql


class Fresh(NamedTuple):
    """What `derive_fresh` makes of a batch: its streams (t_affected) and the rows of its fast
    targets (None when it has none)."""

    streams: pa.Table
    steps: pa.Table | None
    rewards: pa.Table | None
    episodes: pa.Table | None


# derive_fresh keys each stream by a small integer while it derives (joins and groups on it cost
# less than on a 36-character id); its rows get their episode ids back on the way out, by Arrow's
# `take` from the batch's dictionary of ids
_FRESH_OUT = (("steps", f"SELECT {_STEP_COLUMNS} FROM t_steps",
               f"INSERT INTO steps ({_STEP_COLUMNS}) SELECT * FROM fresh_steps"),
              ("rewards", "SELECT * FROM t_rewards",
               "INSERT INTO rewards BY NAME SELECT * FROM fresh_rewards"),
              ("episodes", "SELECT * FROM t_episodes",
               "INSERT INTO episodes BY NAME SELECT * FROM fresh_episodes"))


def _with_ids(table: pa.Table, key: str, ids: pa.Array) -> pa.Table:
    """`table` with its integer stream keys in column `key` replaced by the stream ids they index."""
    where = table.schema.get_field_index(key)
    return table.set_column(where, key, pc.take(ids, table[key]))


def derive_fresh(con: duckdb.DuckDBPyConnection, batch: pa.Table) -> Fresh:
    """Derive the episodes `batch` starts whose steps are whole runs (the fast targets), from the
    batch alone, on a DuckDB of the caller's own; and list the batch's streams for derive_batch.

    It needs nothing from the warehouse, so the sync runs it on a thread of its own, overlapping
    the warehouse's writes of the batch before (`derive_batch` then derives only the slow targets).
    Streams are keyed by their index in the batch's dictionary of ids meanwhile (see _with_ids).
    `batch` must carry `annotate`'s columns.
    """
    ids = pc.dictionary_encode(batch["stream_id"].combine_chunks())
    keyed = batch.set_column(batch.schema.get_field_index("stream_id"), "stream_id", ids.indices)
    try:
        con.register("batch", keyed)
        con.execute(_AFFECTED)
        con.execute(_FRESH_TARGETS)
        targets, affected = con.execute(
            "SELECT count(*), (SELECT count(*) FROM t_affected) FROM t_targets").fetchall()[0]
        streams = _with_ids(con.sql("SELECT * FROM t_affected").to_arrow_table(), "stream_id", ids.dictionary)
        if not targets:
            return Fresh(streams, None, None, None)
        _derive(con, fast=True, every_stream=targets == affected)
        return Fresh(streams, *(_with_ids(con.sql(sql).to_arrow_table(), "episode_id", ids.dictionary)
                                for _, sql, _ in _FRESH_OUT))
    finally:
        _drop_temp(con)
        con.unregister("batch")


def derive_batch(con: duckdb.DuckDBPyConnection, batch_lo: int, fresh: Fresh) -> int:
    """Write episodes, steps and rewards for the episodes touched by the registered `batch`: the
    fast targets' rows `derive_fresh` made of it (`fresh`), and the slow targets derived here.

    `batch` must carry `annotate`'s columns. Runs inside the caller's transaction (the one that
    inserts the batch and moves the checkpoint); `batch_lo` is the batch's first position.
    Returns the number of episodes written.
    """
    con.register("batch_streams", fresh.streams)
    try:
        con.execute(_SLOW_TARGETS)
    finally:
        con.unregister("batch_streams")
    written = _insert_fresh(con, fresh)
    slow, old_lo = con.execute("SELECT count(*), min(first_position) FILTER (WHERE known) "
                               "FROM t_targets").fetchone()
    if slow:
        with_old = old_lo is not None
        params = {"old_lo": old_lo, "batch_lo": batch_lo} if with_old else None
        _derive(con, fast=False, params=params, with_old=with_old)
        if with_old:
            for sql in _REPLACE:
                con.execute(sql, {"old_lo": old_lo} if "$old_lo" in sql else None)
        for sql in _INSERT:
            con.execute(sql)
    _drop_temp(con)
    return slow + written


def _insert_fresh(con: duckdb.DuckDBPyConnection, fresh: Fresh) -> int:
    """Insert the rows `derive_fresh` made; returns how many episodes they hold."""
    if fresh.episodes is None:
        return 0
    for (name, _, sql), table in zip(_FRESH_OUT, fresh[1:], strict=True):
        con.register(f"fresh_{name}", table)
        try:
            con.execute(sql)
        finally:
            con.unregister(f"fresh_{name}")
    return fresh.episodes.num_rows


def _derive(con: duckdb.DuckDBPyConnection, *, fast: bool, every_stream: bool = False,
            params: dict | None = None, with_old: bool = False) -> None:
    """Fill t_facts ... t_episodes for the targets in t_targets: all fast (owners by the run rule,
    from the batch alone) or all slow (owners by the window over all their events)."""
    source = _rows(_FACT_COLUMNS, ("(fact OR chaos_hint)", _fact_where()), fast, with_old, every_stream)
    con.execute(_FACTS.format(source=source, select=_FAST_SELECT if fast else _SLOW_SELECT), params)
    start = _rows("stream_id, version, data, meta", ("type = 'EpisodeStarted'",) * 2, None, with_old)
    con.execute(_START.format(source=start), params)
    con.execute(_CHAOS)
    con.execute(_STEPS)
    con.execute(_REWARDS)
    ends = _rows("stream_id, version, data", ("type = 'EpisodeEnded'",) * 2, None, with_old)
    con.execute(_EPISODES.format(source=ends), params)


def _drop_temp(con: duckdb.DuckDBPyConnection) -> None:
    for name in _TEMP:
        con.execute(f"DROP TABLE IF EXISTS {name}")
