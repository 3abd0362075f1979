"""The `episodes` read model: one summary row per episode stream, for listing and filtering.

It is kept current by the projector runner (a catch-up before each query), not inside the
append transaction: the store stays domain-agnostic and appends stay as cheap as possible,
and a lagging or damaged read model can always be rebuilt from the log.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

import orjson
import sqlalchemy as sa

from domain import FAILURE_MODES, rules_from_text, rules_of, sim_time, task_family
from domain.labels import control_character
from eventstore import EventStore, RecordedEvent
from projections.runner import Projection, fold_records, read_rows, row_of
from projections.schema import episodes

_loads = orjson.loads

COLUMNS = tuple(c.name for c in episodes.c)


class EpisodesProjection(Projection):
    """Reads only the envelope of most events: it decodes EpisodeStarted and EpisodeEnded, and
    the rewards of an episode only while it is still running (its end carries the return)."""

    name = "episodes"
    version = 2  # 2: the rules column
    table = episodes
    key = "episode_id"
    types = frozenset({"EpisodeStarted", "ActionTaken", "RewardGranted", "EpisodeEnded"})

    def evolve(self, state: dict[str, Any] | None, record: RecordedEvent) -> dict[str, Any] | None:
        type_ = record.type
        if state is None:
            if type_ != "EpisodeStarted" or record.version != 0:
                return None  # not an episode stream (verify reports it)
            data = _loads(record.data_json)
            _check_fields(data, _STARTED_FIELDS)
            meta = _loads(record.meta_json)
            state = {
                "task": data.get("task"), "seed": data.get("seed"), "chaos": data.get("chaos"),
                "agent": _storable_label(meta.get("agent")), "reward_profile": data.get("reward_profile"),
                "max_steps": data.get("max_steps"), "rules": _rules(data),
                "started_at": meta.get("recorded_at"),
                "ended_at": None, "sim_started_at": sim_time(0), "sim_ended_at": None,
                "steps": 0, "total_return": 0.0, "outcome": None, "failure_mode": None,
                "first_position": record.position, "_rewards": [],
            }
        elif type_ == "RewardGranted":
            state["_rewards"].append(record.data_json)  # summed only if the episode is running
        elif type_ == "ActionTaken":
            state["steps"] += 1
        elif type_ == "EpisodeEnded":
            data = _loads(record.data_json)
            _check_fields(data, _ENDED_FIELDS)
            state["outcome"] = data.get("outcome")
            state["failure_mode"] = data.get("failure_mode")
            state["steps"] = data.get("steps", state["steps"])
            # the fold of the held-back rewards only when EpisodeEnded carries no return: as a
            # default argument it ran always (a damaged reward was blamed on EpisodeEnded)
            state["total_return"] = (data["total_return"] if "total_return" in data
                                     else _settle_return(state))
            state["_rewards"] = []
            state["ended_at"] = _loads(record.meta_json).get("recorded_at")
            state["sim_ended_at"] = sim_time(state["steps"])
        return state

    def row(self, stream_id: str, state: dict[str, Any], last: RecordedEvent) -> dict[str, Any]:
        """The row after `last`, the stream's last event."""
        row = {"episode_id": stream_id, **state}
        del row["_rewards"]
        row["total_return"] = _settle_return(state)
        row["events"] = last.version + 1
        row["last_version"] = last.version
        row["digest"] = last.digest
        row["last_position"] = last.position
        return row

    def finished(self, state: dict[str, Any]) -> bool:
        return state["outcome"] is not None

    def load(self, store: EventStore, conn: sa.Connection,
             stream_ids: Sequence[str]) -> dict[str, tuple[int, Any]]:
        rows = read_rows(conn, episodes, "episode_id", stream_ids)
        out = {}
        for sid, row in rows.items():
            version = row["last_version"]
            for column in ("episode_id", "events", "last_version", "digest", "last_position"):
                del row[column]
            row["_rewards"] = []
            out[sid] = (version, row)
        return out


def summarize(stream_id: str, records: Sequence[RecordedEvent],
              on_error: Callable[[str, RecordedEvent, Exception], object] | None = None
              ) -> dict[str, Any] | None:
    """The `episodes` row of one stream, folded from its records with the runner's rules
    (None when the stream is not an episode, or does not fold: `on_error` hears why)."""
    projection = EpisodesProjection()
    projection.on_error = on_error
    entry = fold_records(projection, records).get(stream_id)
    return None if entry is None else row_of(projection, stream_id, entry)


_INT32 = (-2**31, 2**31 - 1)
_INT64 = (-2**63, 2**63 - 1)
_NUMBER = (int, float)
_REQUIRED, _MAY_LACK, _NULLABLE = "required", "may be missing", "may be missing or null"
# field -> (types it may hold, whether it must be there, limit: (low, high) for an integer, the
# column's length for text); what the read model's columns can hold
_STARTED_FIELDS = {"task": (str, _REQUIRED, 100), "seed": (int, _REQUIRED, _INT64),
                   "chaos": (_NUMBER, _REQUIRED, _INT64), "reward_profile": (str, _REQUIRED, 100),
                   "max_steps": (int, _NULLABLE, _INT32)}
_ENDED_FIELDS = {"outcome": (str, _NULLABLE, 20), "failure_mode": (str, _NULLABLE, 100),
                 "steps": (int, _MAY_LACK, _INT32), "total_return": (_NUMBER, _MAY_LACK, _INT64)}


def _rules(started: dict[str, Any]) -> int:
    """The rules version an EpisodeStarted names, checked as the fields above are (an edit behind
    the store's back could make it something the column cannot hold)."""
    named = {"target.rules": rules_of(started.get("target"))}
    _check_fields(named, {"target.rules": (int, _REQUIRED, (1, _INT32[1]))})
    return named["target.rules"]


def _check_fields(data: dict[str, Any], fields: dict[str, tuple]) -> None:
    """ValueError naming the first field the read model's columns cannot hold: an event edited
    behind the store's back (a seed made text, a key dropped, a return made null or an integer
    past 64 bits) then leaves its episode out of the read model, named by `rebuild` and `verify`,
    instead of failing the write of every row (a NOT NULL, type or overflow error) or `verify`
    with a traceback."""
    for name, (kinds, presence, limit) in fields.items():
        if name not in data:
            if presence == _REQUIRED:
                raise ValueError(f"{name} is missing")
            continue
        value = data[name]
        if value is None:
            if presence == _NULLABLE:
                continue
            raise ValueError(f"{name} is null")
        if isinstance(value, bool) or not isinstance(value, kinds):
            raise ValueError(f"{name} is {type(value).__name__} {value!r:.40}")
        if isinstance(limit, int) and len(value) > limit:
            raise ValueError(f"{name} is longer than {limit} characters")
        if isinstance(limit, tuple) and isinstance(value, int) and not limit[0] <= value <= limit[1]:
            raise ValueError(f"{name} {value} is out of range")


def _settle_return(state: dict[str, Any]) -> float:
    """Add the rewards held back since the last row was written, in log order (as the domain)."""
    pending = state["_rewards"]
    if pending:
        total = state["total_return"]
        for data_json in pending:
            data = _loads(data_json)
            value = data.get("value") if isinstance(data, dict) else None
            if isinstance(value, bool) or not isinstance(value, _NUMBER) or (
                    isinstance(value, int) and not _INT64[0] <= value <= _INT64[1]):
                raise ValueError(f"a RewardGranted's value is {value!r:.40}, not a number the "
                                 "read model holds")
            total += value
        state["total_return"] = total
        state["_rewards"] = []
    return state["total_return"]


OUTCOMES = ("success", "failure", "truncated", "running")
"""What an episode listing filters on: the three ends, and `running` for episodes not ended."""


MAX_AGENT_LABEL = 100
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def _storable_label(agent: object) -> str | None:
    """The label as the text column can hold it. New labels are checked at input
    (`agent_label_problem`), but a log written before that may hold a NUL, which PostgreSQL text
    refuses, or a non-string; one such episode would otherwise stop the whole read model."""
    if agent is None or (isinstance(agent, str) and "\x00" not in agent):
        return agent
    return (agent if isinstance(agent, str) else orjson.dumps(agent).decode()).replace("\x00", "\ufffd")


def agent_label_problem(agent: object) -> str | None:
    """What is wrong with an agent label, in words (None: nothing). The label is a text column
    of the read models: PostgreSQL text holds no NUL, so one such label stopped every listing,
    and other control characters break the tables that show it."""
    if not isinstance(agent, str) or not 0 < len(agent) <= MAX_AGENT_LABEL:
        return f"agent must be a string of 1-{MAX_AGENT_LABEL} characters"
    control = control_character(agent)
    if control is not None:
        return f"agent must not hold control characters (it holds {control!r})"
    if not agent.isascii() and (surrogate := _LONE_SURROGATE.search(agent)):  # no UTF-8 log holds one
        return f"agent must be Unicode text (it holds the lone surrogate {surrogate[0]!r})"
    return None


UNKNOWN_AGENT = "(unknown)"
"""How the analytics name the agent of an episode logged without a label."""


def new_agent_label_problem(agent: object) -> str | None:
    """`agent_label_problem`, plus what a new label must not be: the analytics' name for an
    unlabelled episode (they would merge the two), or space at either end (the analytics strip
    parameters, so such a label could never be asked for)."""
    if problem := agent_label_problem(agent):
        return problem
    if agent == UNKNOWN_AGENT:
        return f"agent {UNKNOWN_AGENT!r} is what the analytics call episodes without an agent label"
    if agent != agent.strip():  # type: ignore[union-attr]
        return "agent must not begin or end with spaces"
    return None


def episode_filters(task: str | None = None, agent: str | None = None, outcome: str | None = None,
                    rules: int | str | None = None, *,
                    failure_mode: str | None = None) -> list[sa.ColumnElement[bool]]:
    """The WHERE clauses of an episode listing (every reader of the read model uses these);
    ValueError, in words, for a task, outcome, rules version or failure mode that no episode can
    have."""
    if failure_mode is not None and failure_mode not in FAILURE_MODES:
        raise ValueError(f"unknown failure mode {failure_mode!r}; choose one of "
                         f"{', '.join(FAILURE_MODES)}")
    if rules is not None:
        rules = rules_from_text(rules)
    # None is no filter; an empty value (an unset shell variable) is a wrong one, as for agent
    if outcome is not None and outcome not in OUTCOMES:
        raise ValueError(f"unknown outcome {outcome!r}; choose one of {', '.join(OUTCOMES)}")
    if task is not None:
        task_family(task)  # a typo would otherwise list nothing, without a word
    if isinstance(agent, str):  # as the analytics take it: a label never begins or ends with space
        agent = agent.strip()  # (a pasted `random ` listed nothing)
    if agent is not None and (problem := agent_label_problem(agent)):
        raise ValueError(f"no episode has that agent: {problem}")
    where = []
    if task:
        where.append(episodes.c.task == task)
    if agent == UNKNOWN_AGENT:  # as the analytics name (and pool) episodes logged without one
        where.append(sa.or_(episodes.c.agent.is_(None), episodes.c.agent == agent))
    elif agent:
        where.append(episodes.c.agent == agent)
    if outcome == "running":
        where.append(episodes.c.outcome.is_(None))
    elif outcome:
        where.append(episodes.c.outcome == outcome)
    if rules is not None:
        where.append(episodes.c.rules == rules)
    if failure_mode:
        where.append(episodes.c.failure_mode == failure_mode)
    return where


def list_episodes(conn: sa.Connection, task: str | None = None, agent: str | None = None,
                  outcome: str | None = None, limit: int | None = 50,
                  offset: int = 0, rules: int | str | None = None, *,
                  failure_mode: str | None = None) -> list[dict[str, Any]]:
    """Episodes, newest first (by where they begin in the log), skipping `offset`;
    `outcome="running"` selects episodes that have not ended."""
    query = sa.select(episodes).where(*episode_filters(task, agent, outcome, rules,
                                                       failure_mode=failure_mode))
    query = query.order_by(episodes.c.first_position.desc()).offset(offset or None)
    if limit:
        query = query.limit(limit)
    return [{str(k): v for k, v in row.items()} for row in conn.execute(query).mappings()]


def count_episodes(conn: sa.Connection, task: str | None = None, agent: str | None = None,
                   outcome: str | None = None, rules: int | str | None = None, *,
                   failure_mode: str | None = None) -> int:
    """How many episodes the filters select (a page's "of N")."""
    query = sa.select(sa.func.count()).select_from(episodes).where(
        *episode_filters(task, agent, outcome, rules, failure_mode=failure_mode))
    return conn.execute(query).scalar_one()
