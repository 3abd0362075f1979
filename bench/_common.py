"""Shared helpers for the benchmarks: fresh stores and a stable event payload."""

from __future__ import annotations

import atexit
import os
import shutil
import statistics
import tempfile
import uuid
from collections.abc import Callable

import sqlalchemy as sa

from eventstore import NewEvent

PG_URL = os.environ.get("COMPANYOS_BENCH_PG_URL") or os.environ.get("COMPANYOS_TEST_PG_URL")


_made_dirs: list[str] = []
_made_databases: list[str] = []


def fresh_sqlite_url() -> str:
    """A store in a new temporary directory, removed when the benchmark exits."""
    directory = tempfile.mkdtemp(prefix="companyos-bench-")
    _made_dirs.append(directory)
    return f"sqlite:///{directory}/bench.db"


def _admin() -> sa.Engine:
    return sa.create_engine(sa.make_url(PG_URL).set(drivername="postgresql+psycopg"),
                            isolation_level="AUTOCOMMIT")


def fresh_pg_url() -> str | None:
    """A new empty schema-less database on the PostgreSQL server named by the env, or None;
    dropped when the benchmark exits."""
    if not PG_URL:
        return None
    name = f"bench_{uuid.uuid4().hex[:10]}"
    admin = _admin()
    with admin.connect() as conn:
        conn.exec_driver_sql(f"CREATE DATABASE {name}")
    admin.dispose()
    _made_databases.append(name)
    return str(sa.make_url(PG_URL).set(database=name).render_as_string(hide_password=False))


@atexit.register
def _remove_fresh_stores() -> None:
    """Every run left its stores behind: a default `store_read.py` three SQLite stores of 1M
    events, and a database on the PostgreSQL server per PostgreSQL figure."""
    for directory in _made_dirs:
        shutil.rmtree(directory, ignore_errors=True)
    if _made_databases:
        admin = _admin()
        with admin.connect() as conn:
            for name in _made_databases:
                conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        admin.dispose()


def step_events(step: int) -> list[NewEvent]:
    """Four events shaped like one environment step."""
    return [
        NewEvent("ActionTaken", {"step": step, "action": {"app": "ticketdesk", "method":
                 "update_ticket", "params": {"ticket_id": "T-1042", "field": "priority",
                                              "value": "high"}}}),
        NewEvent("TicketPriorityChanged", {"ticket_id": "T-1042", "priority": "high", "step": step}),
        NewEvent("RewardGranted", {"rule": "step", "value": -0.1, "cause": step * 4}),
        NewEvent("RewardGranted", {"rule": "set_priority", "value": 1.0, "cause": step * 4 + 1}),
    ]


def median_of(measure: Callable[[], float], repeat: int) -> tuple[float, list[float]]:
    """Run `measure` `repeat` times; its median and every figure, in order.

    A shared VM's speed drifts by ±20% from minute to minute: one run says little, the median
    of a few says what the code does (the spread is printed beside it).
    """
    figures = [measure() for _ in range(max(1, repeat))]
    return statistics.median(figures), figures


def spread(figures: list[float]) -> str:
    return "runs=" + ",".join(f"{f:.0f}" for f in figures)
