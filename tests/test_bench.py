"""The benchmarks clean up after themselves."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa

from tests.conftest import PG_URL, _pg_engine

pytestmark = pytest.mark.pg  # it lists the server's databases before and after

BENCH = Path(__file__).resolve().parent.parent / "bench"


def _bench_databases() -> set[str]:
    if not PG_URL:
        return set()
    engine = _pg_engine()
    try:
        with engine.connect() as conn:
            return set(conn.scalars(sa.text("SELECT datname FROM pg_database "
                                            "WHERE datname LIKE 'bench\\_%'")))
    finally:
        engine.dispose()


def test_a_benchmark_removes_the_stores_it_made(tmp_path):
    """`bench/store_read.py` and `store_append.py` (and `env_steps.py`) left every SQLite store
    they made in the temporary directory, and a database per run on the PostgreSQL server."""
    before = _bench_databases()
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    out = subprocess.run([sys.executable, str(BENCH / "store_read.py"), "--events", "2000",
                          "--repeat", "1"], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1].startswith("sqlite_read_all_events_per_s=")
    assert not list(tmp_path.glob("companyos-bench-*"))
    assert _bench_databases() <= before
