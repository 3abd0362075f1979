"""Parquet export of the warehouse, partitioned by task family, for Spark, Trino or another DuckDB.

Layout: DIR/<table>/task_family=<family>/data_0.parquet (Hive partitioning), plus
DIR/_companyos_export.json describing what was exported up to which store position. A re-export
replaces the tables it wrote before; it refuses a directory holding such tables that it did not
export (other files in DIR are left alone).
"""

from __future__ import annotations

import json
import re
import shutil
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from analytics.warehouse import Warehouse
from eventstore import TOKEN_META_KEY

MARKER = "_companyos_export.json"


class ExportRefused(ValueError):
    """The target is not a directory companyos may write an export into (the caller's choice)."""

# Every exported table gets a `task` column to partition on (events and rewards through their episode).
_TABLES = {
    "episodes": "SELECT *, coalesce(task, '(unknown)') AS task_family FROM episodes",
    "steps": "SELECT *, coalesce(task, '(unknown)') AS task_family FROM steps",
    "rewards": "SELECT r.*, coalesce(e.task, '(unknown)') AS task_family FROM rewards r "
               "LEFT JOIN episodes e ON e.episode_id = r.episode_id",
    # an episode's token hash (which the API never shows either) stays out of files handed around
    "events": f"SELECT v.* REPLACE (CASE WHEN v.meta LIKE '%\"{TOKEN_META_KEY}\"%' THEN "
              f"json_remove(v.meta, '$.{TOKEN_META_KEY}')::VARCHAR ELSE v.meta END AS meta), "
              "coalesce(e.task, '(none)') AS task_family FROM events v "
              "LEFT JOIN episodes e ON e.episode_id = v.stream_id",
}


def export(wh: Warehouse, target: str | Path, tables: tuple[str, ...] = tuple(_TABLES)) -> dict:
    """Write each table as Parquet partitioned by task family; returns the manifest.

    Raises ExportRefused for a target that is a file or holds tables companyos did not write, and
    OSError (or duckdb.IOException) when the file system refuses. Every table is first written to
    a staging directory; only once all are complete are they swapped in (a rename each) and the
    manifest replaced, and the previous tables removed last, so a failed or interrupted export
    leaves the previous export as it was, not a mix of two. What an export killed mid-swap left
    is undone by the next one (`_recover`).
    """
    root = Path(target)
    if root.exists() and not root.is_dir():
        raise ExportRefused(f"{root} is a file, not a directory")
    root.mkdir(parents=True, exist_ok=True)
    marker = root / MARKER
    existing = [t for t in tables if (root / t).exists()]
    if existing and not marker.exists() and not set(existing) <= _swapped_in_by_a_killed_export(root):
        raise ExportRefused(f"{root} already holds {', '.join(existing)} that companyos did not export; "
                            "choose an empty directory")
    if marker.exists() or _swapped_in_by_a_killed_export(root):  # only where companyos exported
        _recover(root)
    manifest = {"position": wh.checkpoint, "exported_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "partitioning": "hive: task_family", "tables": {}}
    staged: dict[str, Path] = {}
    written = _aside(root, MARKER, "tmp")
    try:
        for table in tables:
            staged[table] = _aside(root, table, "tmp")
            manifest["tables"][table] = {"rows": _write(wh, table, staged[table]), "path": table}
        written.write_text(json.dumps(manifest, indent=2))
        old = _swap_in(root, staged, then=lambda: written.replace(marker))
    finally:
        for staging in staged.values():
            shutil.rmtree(staging, ignore_errors=True)  # what was not swapped in
        written.unlink(missing_ok=True)
    for replaced in old:  # only once the new export is whole, manifest included
        shutil.rmtree(replaced, ignore_errors=True)
    return manifest


def _write(wh: Warehouse, table: str, staging: Path) -> int:
    """Write `table` into the directory `staging`; the rows written."""
    sql = _TABLES[table]
    rows = wh.con.execute(f"COPY ({sql}) TO '{_quote(staging)}' "
                          "(FORMAT parquet, PARTITION_BY (task_family), COMPRESSION zstd)"
                          ).fetchone()[0]  # COPY answers with the rows it wrote
    if rows == 0:  # no partition, so no file: readers globbing DIR/<table>/*/*.parquet would fail
        empty = staging / "task_family=(none)"
        empty.mkdir(parents=True, exist_ok=True)
        wh.con.execute(f"COPY (SELECT * EXCLUDE (task_family) FROM ({sql}) LIMIT 0) "
                       f"TO '{_quote(empty / 'data_0.parquet')}' (FORMAT parquet)")
    return rows


def _swap_in(root: Path, staged: dict[str, Path], then: Callable[[], object]) -> list[Path]:
    """Rename every staged table into place, the previous ones aside (`.<table>.<id>.old`), then
    run `then` (the manifest's replacement), and return the tables set aside; a failure puts back
    what was swapped so far. Renames only: the window in which a kill could leave a mix is a few
    system calls, and `_recover` undoes it."""
    swapped: list[tuple[Path, Path | None]] = []
    try:
        for table, staging in staged.items():
            final = root / table
            aside = None
            if final.exists():
                aside = _aside(root, table, "old")
                final.rename(aside)
            swapped.append((final, aside))
            staging.rename(final)
        then()
    except BaseException:
        for final, aside in reversed(swapped):
            if final.exists():  # swapped in (a table new to the directory too: no manifest
                shutil.rmtree(final)  # would describe it, and the next export would refuse it)
            if aside is not None:
                aside.rename(final)
        raise
    return [aside for _, aside in swapped if aside is not None]


def _recover(root: Path) -> None:
    """Undo what an export killed in its middle left: a table set aside and not replaced is put
    back; staging, and tables set aside and replaced, are removed. (One export at a time per
    directory: a second one running would find the first's staging gone.)"""
    for table in _TABLES:
        for aside in sorted(_set_aside(root, table, "old")):
            if not (root / table).exists():
                aside.rename(root / table)
            else:
                shutil.rmtree(aside, ignore_errors=True)
        for staging in _set_aside(root, table, "tmp"):
            shutil.rmtree(staging, ignore_errors=True)
    for manifest in _set_aside(root, MARKER, "tmp"):
        manifest.unlink(missing_ok=True)


def _aside(root: Path, name: str, kind: str) -> Path:
    """A new name beside `name` for a table (or manifest) staged ("tmp") or set aside ("old")."""
    return root / f".{name}.{uuid.uuid4().hex[:8]}.{kind}"


def _set_aside(root: Path, name: str, kind: str) -> list[Path]:
    """What `_aside` names in `root`, and nothing else: a glob `.steps.*.tmp` took a user's own
    `.steps.backup.tmp` for staging, and removed it."""
    pattern = re.compile(rf"\.{re.escape(name)}\.[0-9a-f]{{8}}\.{kind}")
    return [path for path in root.glob(f".{name}.*.{kind}") if pattern.fullmatch(path.name)]


def _swapped_in_by_a_killed_export(root: Path) -> set[str]:
    """The tables a first export into `root`, killed among its renames, may have swapped in: those
    its manifest lists, which it writes beside the marker's place before the first rename and
    which only a kill leaves behind (the next export refused them as someone else's)."""
    tables: set[str] = set()
    for written in _set_aside(root, MARKER, "tmp"):
        try:
            tables |= set(json.loads(written.read_text())["tables"])
        except (OSError, ValueError, KeyError, TypeError):
            continue  # cut short or not ours: it vouches for nothing
    return tables


def _quote(path: Path) -> str:
    """A path as a SQL string literal (COPY's target cannot be a bound parameter), absolute: DuckDB
    reads a leading `~` as the home directory, and wrote there while Python made a directory `~`."""
    return str(path.absolute()).replace("'", "''")
