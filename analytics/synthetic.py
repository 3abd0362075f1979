"""Synthetic episode streams shaped like the domain's, for warehouse tests and scale benchmarks.

The real environment is the source of truth; this generator exists so the warehouse can be tested
and benchmarked at sizes (millions of episodes) and shapes (open episodes, malformed actions,
episodes spanning sync batches) the environment does not produce on demand. It follows the event
contract: `EpisodeStarted` first (agent in meta), world events, per step `ActionTaken` then effects
or `ActionRejected`, chaos events (`cause="chaos"`), `RewardGranted{rule, value, cause}`,
`MistakeRecorded`, finally `EpisodeEnded`.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from domain.chaos import CHAOS_LEVELS as CHAOS_LEVEL_NAMES
from domain.chaos import MECHANISMS as CHAOS_MECHANISMS
from domain.outcomes import FAILURE_MODES, FIRST_JUDGED_BY
from eventstore import GENESIS_DIGEST, NewEvent, canonical_json
from eventstore.encoding import chain_digests
from eventstore.ids import new_event_ids
from eventstore.packing import COMMIT_COLUMNS, compress, make_commit

TASKS = ("vendor_onboarding", "expense_report", "bug_escalation", "license_renewal", "handbook_update")
CHAOS_LEVELS = tuple(CHAOS_LEVEL_NAMES.values())
AGENTS = ("expert", "random", "noop")
TOOLS = (
    ("ticketdesk", "list_tickets"), ("ticketdesk", "get_ticket"), ("ticketdesk", "update_ticket"),
    ("datahub", "query_metric"), ("datahub", "refresh_data"), ("datahub", "get_approver"),
    ("approvalflow", "submit_approval"), ("approvalflow", "check_status"), ("approvalflow", "escalate"),
)
MECHANISMS = tuple(m for m in CHAOS_MECHANISMS if m not in ("stale_metric", "transient_outage"))
# synthetic episodes name no rules version, so they are version 1's, which has none of the later modes
MODES = tuple(m for m in FAILURE_MODES
              if m not in ("invalid_tool_calls", "step_budget_exhausted") and m not in FIRST_JUDGED_BY)
REJECT_CODES = ("invalid_params", "not_found", "precondition_failed", "unknown_tool", "transient_outage")


@dataclass
class Episode:
    """One generated episode: its stream id, its events and the facts a test tallies independently."""

    episode_id: str
    agent: str
    task: str
    seed: int
    chaos: float
    events: list[NewEvent] = field(default_factory=list)
    outcome: str | None = None
    failure_mode: str | None = None
    steps: int = 0
    total_return: float = 0.0
    first_mistake_step: int | None = None


def episode(index: int, seed: int = 0, agent: str | None = None, finish: bool = True,
            task: str | None = None) -> Episode:
    """The `index`-th synthetic episode; `finish=False` leaves it open (no EpisodeEnded yet)."""
    rng = random.Random(seed * 1_000_003 + index)
    agent = agent or AGENTS[index % len(AGENTS)]
    task = task or TASKS[index % len(TASKS)]
    chaos = CHAOS_LEVELS[(index // len(TASKS)) % len(CHAOS_LEVELS)]
    ep = Episode(f"syn-{seed}-{index:08d}", agent, task, 1000 + index % 97, chaos)
    meta = {"agent": agent}
    ev = ep.events

    def add(type_: str, data: dict[str, Any]) -> int:
        ev.append(NewEvent(type_, data, 1, None, meta if not ev else None))
        return len(ev) - 1

    max_steps = 12
    add("EpisodeStarted", {
        "task": task, "seed": ep.seed, "chaos": chaos, "reward_profile": "default",
        "max_steps": max_steps, "goal": f"Complete the {task.replace('_', ' ')} for case {index}: "
        "set the ticket priority, verify the metric is fresh and route the approval.",
        "target": {"ticket_id": f"T-{1000 + index % 900}", "approve": rng.random() < 0.8}})
    add("TicketCreated", {"ticket_id": f"T-{1000 + index % 900}", "title": f"{task} request",
                          "description": "Customer asked for the workflow to be completed this week; "
                          "see the attached vendor record.", "status": "open", "priority": None,
                          "assignee": None, "details": {"vendor": f"Vendor {index % 50}"},
                          "cause": "task", "mechanism": None})
    add("MetricPublished", {"name": "compliance_score", "value": round(rng.uniform(50, 99), 1),
                            "unit": "points", "description": "Vendor compliance score",
                            "as_of": "2026-01-01T00:00:00Z"})
    add("ApproverRegistered", {"role": "finance", "name": "Dana Reyes", "email": "dana@example.com",
                               "title": "Finance lead", "delegate_role": "cfo"})
    mechanisms: list[str] = []
    if rng.random() < chaos:
        m = "stale_metric"
        mechanisms.append(m)
        add("MetricWentStale", {"name": "compliance_score", "value": 70.0, "true_value": 61.0,
                                "as_of": "2025-12-01T00:00:00Z", "cause": "chaos", "mechanism": m})
    steps = rng.randint(2, max_steps) if finish else rng.randint(1, 4)
    mistake_p = 0.05 + 0.25 * chaos + (0.3 if agent != "expert" else 0.0)
    ret = 0.0
    for step in range(1, steps + 1):
        r = rng.random()
        if agent == "random" and r < 0.05:
            action: Any = "not an action" if r < 0.02 else {"app": "mailbox", "method": "send"}
        else:
            app, method = TOOLS[rng.randrange(len(TOOLS))]
            action = {"app": app, "method": method, "params": {"ticket_id": f"T-{1000 + index % 900}"}}
        at = add("ActionTaken", {"step": step, "action": action})
        trigger = at
        if not isinstance(action, dict) or action.get("app") == "mailbox" or rng.random() < 0.1 + 0.2 * chaos:
            code = "unknown_tool" if not isinstance(action, dict) or action.get("app") == "mailbox" \
                else REJECT_CODES[rng.randrange(len(REJECT_CODES))]
            chaos_rej = code == "transient_outage"
            trigger = add("ActionRejected", {"step": step, "code": code, "reason": f"rejected: {code}",
                                             "cause": "chaos" if chaos_rej else "rules",
                                             "mechanism": "transient_outage" if chaos_rej else None})
            if chaos_rej:
                mechanisms.append("transient_outage")
            add("RewardGranted", {"rule": "failed_call", "value": -0.3, "cause": trigger})
            ret += -0.3
        else:
            trigger = add("TicketPriorityChanged", {"ticket_id": f"T-{1000 + index % 900}",
                                                    "priority": "high", "previous": None})
            if rng.random() < 0.3:
                add("RewardGranted", {"rule": "set_priority", "value": 1.0, "cause": trigger})
                ret += 1.0
        if rng.random() < 0.1 * chaos:
            m = MECHANISMS[rng.randrange(len(MECHANISMS))]
            mechanisms.append(m)
            add("ApproverWentOutOfOffice", {"role": "finance", "until": "2026-02-01", "cause": "chaos",
                                            "mechanism": m})
        add("RewardGranted", {"rule": "step", "value": -0.1, "cause": at})
        ret += -0.1
        if ep.first_mistake_step is None and rng.random() < mistake_p / 3:
            ep.first_mistake_step = step
            mode = MODES[rng.randrange(len(MODES))]
            ep.failure_mode = mode
            add("MistakeRecorded", {"step": step, "mode": mode, "subject": "T-1", "detail": "oops",
                                    "irreversible": mode == "irreversible_action"})
    ep.steps = steps
    if finish:
        success = ep.first_mistake_step is None and rng.random() < (0.9 if agent == "expert" else 0.05)
        if success:
            ep.outcome, ep.failure_mode = "success", None
            add("RewardGranted", {"rule": "success", "value": 15.0, "cause": len(ev) - 1})
            ret += 15.0
        elif steps == max_steps and ep.failure_mode is None:
            ep.outcome, ep.failure_mode = "truncated", "step_budget_exhausted"
        else:
            ep.outcome = "failure"
            ep.failure_mode = ep.failure_mode or "invalid_tool_calls"
        ep.total_return = round(ret, 6)
        add("EpisodeEnded", {"outcome": ep.outcome, "failure_mode": ep.failure_mode, "steps": steps,
                             "total_return": ep.total_return})
    else:
        ep.total_return = round(ret, 6)
    return ep


def episodes(count: int, seed: int = 0, start: int = 0) -> Iterator[Episode]:
    for i in range(start, start + count):
        yield episode(i, seed)


def fill_sqlite(url: str, count: int, seed: int = 0, start: int = 0, batch: int = 2000) -> int:
    """Append `count` synthetic episodes to a SQLite store in bulk; returns the events written.

    Each episode is one commit row, as `companyos run --durability episode` writes it, packed and
    digest-chained as the store does (eventstore.packing), and inserted through one raw connection
    with executemany: appending a million episodes one by one would outlast the benchmark itself.
    """
    import sqlite3

    from eventstore import EventStore
    from eventstore.engine import sqlite_file

    EventStore.open(url).close()  # create and migrate
    con = sqlite3.connect(sqlite_file(url), isolation_level=None)
    try:
        con.execute("PRAGMA journal_mode=WAL")
        con.execute("PRAGMA synchronous=OFF")
        position = con.execute("SELECT coalesce(max(position), 0) FROM commits").fetchone()[0]
        written = 0
        rows: list[tuple] = []
        for i, ep in enumerate(episodes(count, seed, start)):
            row = commit_row(ep, position)
            position = row[0]
            written += len(ep.events)
            rows.append(row)
            if (i + 1) % batch == 0:
                _insert_commits(con, rows)
                rows = []
        _insert_commits(con, rows)
    finally:
        con.close()
    return written


_RECORDED = {"recorded_at": "2026-01-01T00:00:00+00:00"}


def commit_row(ep: Episode, after: int) -> tuple:
    """The `commits` row of `ep` as one append after position `after`, in COMMIT_COLUMNS order,
    built by the store's own encoding, digest chain and packing."""
    plain = canonical_json(_RECORDED).decode()
    types = [e.type for e in ep.events]
    schemas = [e.schema_version for e in ep.events]
    datas = [canonical_json(e.data).decode() for e in ep.events]
    metas = [canonical_json({**e.meta, **_RECORDED}).decode() if e.meta else None
             for e in ep.events]
    commit = make_commit(ep.episode_id, 0, new_event_ids(len(types)), types, schemas, datas,
                         chain_digests(GENESIS_DIGEST, types, schemas, datas), plain,
                         metas if any(metas) else None, [], compress)
    return (after + commit.count, *commit[:5])


def _insert_commits(con, rows: list[tuple]) -> None:
    if not rows:
        return
    con.execute("BEGIN")
    con.executemany(f"INSERT INTO commits ({COMMIT_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?)", rows)
    con.execute("COMMIT")
