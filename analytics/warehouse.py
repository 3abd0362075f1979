"""The DuckDB warehouse: one file beside the store, holding events and the tables derived from them.

Tables (see docs/analytics.md for every column):

- `events`    one row per stored event (the store packs an append's events into one `commits`
              row; the sync unpacks them): position, stream_id, version, type, schema_version,
              data (JSON text), meta (JSON text). The store's integrity fields (event_id, the
              per-event digest) stay in the store; each episode's head digest is in `episodes`.
- `episodes`  one row per episode stream (a stream whose first event is `EpisodeStarted`).
- `steps`     one row per agent action (`ActionTaken`).
- `sync_state` key/value bookkeeping: the checkpoint, the store it belongs to, the derivation
              version. It is written in the same transaction as the rows it describes.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path

import duckdb

from analytics.intervals import WILSON_MACROS
from analytics.paths import why_not_written
from analytics.sign_test import SIGN_TEST_MACRO
from analytics.sync_progress import Progress, running_sync
from eventstore import shown_url
from eventstore.engine import normalise_url, sqlite_file

# Bump when the derived tables' definition changes: a warehouse built by older code is rebuilt.
DERIVE_VERSION = 6  # 2: lead_in ends at the decisive step; 3: a finished episode's return unrounded;
# 4: a rejection that was handled is not a mistake (first_mistake_step, first_mistake_mode, mistakes);
# 5: an action whose app or method is no string is '(malformed)', not a tool named after its JSON;
# 6: episodes.rules (the rebuild recreates the tables, so the column is there)

SCHEMA = """
CREATE TABLE IF NOT EXISTS sync_state (key VARCHAR PRIMARY KEY, value VARCHAR NOT NULL);
CREATE TABLE IF NOT EXISTS events (
    position BIGINT NOT NULL,
    stream_id VARCHAR NOT NULL,
    version INTEGER NOT NULL,
    type VARCHAR NOT NULL,
    schema_version INTEGER NOT NULL,
    data VARCHAR NOT NULL {zstd}, -- JSON text
    meta VARCHAR NOT NULL        -- JSON text (one value per commit: dictionaries beat zstd)
);
CREATE TABLE IF NOT EXISTS episodes (
    episode_id VARCHAR NOT NULL,
    task VARCHAR,
    seed BIGINT,
    chaos DOUBLE,
    agent VARCHAR,
    reward_profile VARCHAR,
    max_steps INTEGER,
    rules INTEGER,                -- the rules version the episode was judged by (1 when unnamed)
    outcome VARCHAR,              -- success | failure | truncated | NULL while running
    failure_mode VARCHAR,         -- exactly one for every finished non-success
    steps INTEGER,                -- agent actions taken
    total_return DOUBLE,          -- EpisodeEnded.total_return, or the rewards so far while running
    reward_sum DOUBLE,            -- sum of RewardGranted values (equals total_return when ended)
    first_mistake_step INTEGER,   -- step of the first MistakeRecorded
    first_mistake_mode VARCHAR,
    mistakes INTEGER,
    first_rejection_step INTEGER, -- step of the first ActionRejected
    rejected_actions INTEGER,
    chaos_events INTEGER,         -- events with cause = "chaos"
    chaos_mechanisms VARCHAR[],   -- distinct mechanisms that fired, sorted
    lead_in VARCHAR[],            -- tools of the last (up to 5) steps up to the decisive step
                                  -- (the step whose mistake decided failure_mode, else the last)
    started_at VARCHAR,           -- wall clock of EpisodeStarted (envelope meta)
    first_position BIGINT NOT NULL,
    last_position BIGINT NOT NULL,
    event_count INTEGER NOT NULL,
    last_version INTEGER NOT NULL,
    digest VARCHAR                -- the stream's head digest (equals `companyos run --json`)
);
CREATE TABLE IF NOT EXISTS steps (
    episode_id VARCHAR NOT NULL,
    task VARCHAR,                 -- the episode's task, agent and chaos level, repeated here so
    agent VARCHAR,                -- per-step questions filter without a join
    chaos DOUBLE,
    step INTEGER,                 -- ActionTaken.step
    position BIGINT NOT NULL,     -- of the ActionTaken event
    version INTEGER NOT NULL,
    app VARCHAR,
    method VARCHAR,
    tool VARCHAR,                 -- "app.method", or "(malformed)" when the action was not one
    accepted BOOLEAN NOT NULL,
    reject_code VARCHAR,
    reject_reason VARCHAR {zstd},
    reject_cause VARCHAR,         -- rules | chaos
    reward DOUBLE NOT NULL,       -- sum of the rewards granted in this step
    mistake VARCHAR,              -- failure mode of the (first) MistakeRecorded in this step
    chaos_events INTEGER NOT NULL,
    chaos_now VARCHAR[],          -- chaos mechanisms that fired during this step
    chaos_active VARCHAR[],       -- chaos mechanisms that had fired in the episode up to this step
    terminal BOOLEAN NOT NULL     -- the episode ended in this step
);
CREATE TABLE IF NOT EXISTS rewards (
    episode_id VARCHAR NOT NULL,
    rule VARCHAR,
    grants INTEGER NOT NULL,      -- RewardGranted events of this rule in the episode
    total DOUBLE,                 -- their summed value
    first_step INTEGER            -- step of the first grant (NULL: granted at reset)
);
"""


class WarehouseError(RuntimeError):
    """The warehouse cannot be used as asked (busy, built from another store, ...)."""


class WarehouseBusy(WarehouseError):
    """Another process held the file for longer than the caller would wait: a condition of the
    moment, not of the warehouse."""


class WarehousePathError(WarehouseError):
    """The path given for the warehouse cannot hold one (a directory, the SQLite store, not DuckDB)."""


def default_path(db_url: str) -> Path:
    """The warehouse file beside a SQLite store (x/companyos.db -> x/companyos.duckdb), else ./."""
    parsed = normalise_url(db_url)
    store_file = sqlite_file(parsed)
    if store_file is not None:
        return Path(store_file).with_suffix(".duckdb")
    name = (parsed.database or "companyos").replace(os.sep, "_")
    return Path(f"{name}.duckdb")


def store_label(db_url: str) -> str:
    """The store's URL as the user gave it, without its password: what the warehouse remembers it
    was built from (it showed the driver SQLAlchemy is given, `postgresql+psycopg://`)."""
    return shown_url(db_url)


ROUND_DECIMAL = ("CREATE OR REPLACE TEMP MACRO round_decimal(x, places) AS "
                 "round(x::DECIMAL(38, 12), places)::DOUBLE")
"""Rounding as decimals round, for the queries' rates, shares and means: DuckDB's round of a DOUBLE
takes a binary value just under a half-way one down (53/160 = 0.33125 gave 0.3312, a mean of
-9.1625 gave -9.162); rounded to 12 places first, the value is its decimal self again."""

BUSY_WAIT_S = 30.0
"""How long opening the warehouse waits for another process that holds it, unless that process
is syncing it and the caller follows the sync."""


class Warehouse:
    """An open DuckDB warehouse file. Open it, use it, close it: DuckDB allows one writer process."""

    def __init__(self, path: str | os.PathLike, read_only: bool = False, memory_limit: str = "3GB",
                 threads: int | None = None, wait: float | None = None,
                 follow: Progress | None = None) -> None:
        """`wait`: how long to wait for another process that holds the file (BUSY_WAIT_S). With
        `follow`, a holder that is syncing is waited for as long as its sync runs, and `follow`
        hears its progress."""
        self.path = Path(path)
        self.read_only = read_only
        if read_only and not self.path.exists():
            raise WarehouseError(f"no warehouse at {self.path}; run `companyos analytics sync` first")
        if not read_only:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise WarehousePathError(f"cannot create the warehouse {self.path}: "
                                         f"{why_not_written(self.path, exc)}") from exc
        config = {"memory_limit": memory_limit, **OFFLINE}
        if threads:
            config["threads"] = str(threads)
        self.con = _connect(self.path, read_only, config, BUSY_WAIT_S if wait is None else wait, follow)
        if problem := _someone_elses(self.con):
            self.con.close()
            raise WarehousePathError(_not_ours(self.path, problem))
        self.con.execute("SET enable_progress_bar = false")
        self.con.execute(ROUND_DECIMAL)
        for macro in (*WILSON_MACROS, SIGN_TEST_MACRO):
            self.con.execute(macro)
        if not read_only:
            try:
                with self.writing():
                    self._create()
            except WarehouseError:
                self.con.close()
                raise

    def _create(self) -> None:
        """Create missing tables; long JSON text is zstd-compressed where this DuckDB supports choosing.

        DuckDB's default string compression analysis costs more than reading the store; zstd is
        about twice as fast to write and half the size, and only the rare raw-event scan reads it.
        `meta` keeps the default: one value per commit repeats down its rows, which DuckDB's
        dictionaries store in half zstd's bytes for two thirds of its CPU.
        """
        try:
            self.con.execute(SCHEMA.replace("{zstd}", "USING COMPRESSION zstd"))
        except (duckdb.BinderException, duckdb.ParserException, duckdb.NotImplementedException):
            self.con.execute(SCHEMA.replace("{zstd}", ""))

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        """DuckDB failing to write the file (a full disk, a read-only directory) as a
        WarehouseError, said in one line: the world's fault, and the failed transaction is rolled
        back, so the next run resumes from the checkpoint."""
        try:
            yield
        except (duckdb.IOException, duckdb.TransactionException, duckdb.FatalException) as exc:
            if isinstance(exc, duckdb.TransactionException) and "Failed to commit" not in str(exc):
                raise
            reason = str(exc)
            for prefix in ("TransactionContext Error: ", "IO Error: ", "FATAL Error: "):
                reason = reason.removeprefix(prefix)
            raise WarehouseError(f"cannot write the warehouse {self.path}: {reason}") from exc

    def close(self) -> None:
        self.con.close()

    def __enter__(self) -> Warehouse:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- bookkeeping ---------------------------------------------------------------------------

    def state(self) -> dict[str, str]:
        try:
            return dict(self.con.execute("SELECT key, value FROM sync_state").fetchall())
        except duckdb.CatalogException:
            return {}

    @property
    def checkpoint(self) -> int:
        return int(self.state().get("position", 0))

    def set_state(self, **values: object) -> None:
        """Upsert bookkeeping values; call inside the transaction that wrote the rows they describe."""
        self.con.executemany(
            "INSERT OR REPLACE INTO sync_state VALUES (?, ?)", [(k, str(v)) for k, v in values.items()])

    def reset(self) -> None:
        """Forget everything: the next sync reads the store from position 0. The tables are made
        anew, so a warehouse built by older code gains the columns the derivation now writes."""
        if self.read_only:
            raise WarehouseError(f"cannot rebuild the warehouse {self.path}: {NOT_WRITABLE}")
        with self.writing():
            self.con.execute("BEGIN")
            for table in ("events", "episodes", "steps", "rewards", "sync_state"):
                self.con.execute(f"DROP TABLE IF EXISTS {table}")
            self._create()
            self.con.execute("COMMIT")
            self.con.execute("CHECKPOINT")

    def counts(self) -> dict[str, int]:
        return {t: self.con.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
                for t in ("events", "episodes", "steps", "rewards")}


def open_for_sync(path: str | os.PathLike, follow: Progress | None = None) -> Warehouse:
    """The warehouse a sync brings up to date. One this process may not write (a read-only file
    or file system, another user's file) is opened read-only: it still answers while the store
    holds nothing newer, and the sync says so in words when it does."""
    path = Path(path)
    read_only = path.is_file() and not os.access(path, os.W_OK)
    return Warehouse(path, read_only=read_only, follow=follow)


NOT_WRITABLE = "this process may not write the file (a read-only file or file system)"


SQLITE_HEADER = b"SQLite format 3\x00"
DUCKDB_MAGIC = b"DUCK"
"""Bytes 8-11 of every DuckDB database file."""
OFFLINE = {"autoinstall_known_extensions": False, "autoload_known_extensions": False}
"""Only what the wheel has built in (JSON, Parquet): DuckDB would otherwise fetch an extension over
the network to open, say, a SQLite file given as the warehouse, and write into it."""


def path_problem(path: Path) -> str | None:
    """Why `path` can hold no warehouse, read off the file without opening it (so `serve` can say
    it at start, and nothing is locked): a directory, a SQLite database, a file that is no DuckDB
    database. None: a DuckDB file, an empty one, or none yet."""
    if path.is_dir():
        return f"the warehouse {path} is a directory; pass a file, e.g. {path / 'companyos.duckdb'}"
    head = _head(path)
    if head is not None and head.startswith(SQLITE_HEADER):
        return (f"{path} is a SQLite database (the event store?), not a DuckDB warehouse; pass "
                "another --warehouse, e.g. the same name ending in .duckdb")
    if head and head[8:12] != DUCKDB_MAGIC:  # (an empty file may be one another process is creating)
        # DuckDB would open a CSV, JSON or Parquet file as an empty in-memory database: a sync
        # would "succeed" keeping nothing, and every read would fail
        return (f"{path} is not a valid DuckDB database file; pass another --warehouse (a new file "
                "is created), or move this one away")
    return None


def holds_no_warehouse(path: Path) -> str | None:
    """`path_problem`, and for a DuckDB file another application's tables, looked at through a
    read-only connection that is closed at once (so `serve` can say it at start). A file another
    process holds is not judged here: whoever opens it next judges it."""
    if problem := path_problem(path):
        return problem
    if not _head(path):
        return None  # none yet, or one being created: the sync makes it a warehouse
    try:
        con = duckdb.connect(str(path.absolute()), read_only=True, config=OFFLINE)
    except duckdb.Error:
        return None  # locked by a sync, or a fault the first open will word
    with contextlib.closing(con):
        problem = _someone_elses(con)
    return _not_ours(path, problem) if problem else None


def _not_ours(path: Path, problem: str) -> str:
    return f"{path} {problem}; pass another --warehouse (a new file is created): this one is left as it is"


def _connect(path: Path, read_only: bool, config: dict, wait: float,
             follow: Progress | None) -> duckdb.DuckDBPyConnection:
    """Connect, waiting a while if another process holds the file (DuckDB allows one writer), and
    with `follow` for as long as the holder is syncing it.

    A path that is no DuckDB file (a directory, the SQLite store itself, anything else) is a
    WarehouseError in words, never opened for writing.
    """
    if problem := path_problem(path):
        raise WarehousePathError(problem)
    deadline = time.monotonic() + wait
    delay = 0.05
    while True:
        new = not path.exists()
        try:
            # absolute: DuckDB reads a leading `~` as the home directory, where the checks above
            # looked at a directory named `~`
            return duckdb.connect(str(path.absolute()), read_only=read_only, config=config)
        except duckdb.IOException as exc:
            if COULD_NOT_WRITE in str(exc):  # a full disk: a condition of the machine, not the path
                if new:  # DuckDB made the file, then could not write it whole: every later open
                    _drop_new(path)  # would refuse it as no DuckDB file
                reason = _first_line(exc).removeprefix("IO Error: ")
                raise WarehouseError(f"cannot write the warehouse {path}: {reason}") from exc
            if new and any(words in str(exc) for words in COULD_NOT_CREATE):  # the machine's, too
                raise WarehouseError(f"cannot create the warehouse {path}: "
                                     f"{_first_line(exc).removeprefix('IO Error: ')}") from exc
            if not _lock_conflict(exc):
                raise WarehousePathError(f"cannot open the warehouse {path}: {_first_line(exc)}") from exc
            running = running_sync(path, _holder_pid(str(exc))) if follow is not None else None
            if running is not None:
                follow(*running)
                deadline = max(deadline, time.monotonic() + wait)
            if time.monotonic() >= deadline:
                raise WarehouseBusy(
                    f"the warehouse {path} is in use by another process (DuckDB allows one writer); "
                    "try again when it is done") from exc
            time.sleep(delay)
            delay = min(delay * 2, 1.0)


LOCK_CONFLICT = "Could not set lock on file"
"""DuckDB's words when another process holds the file; the message also holds the path, so a
bare "lock" would match a directory such as `blocks/`."""


def _someone_elses(con: duckdb.DuckDBPyConnection) -> str | None:
    """Why a DuckDB file is no warehouse, if it holds tables or views but no `sync_state` (every
    warehouse creates that first): another application's database, whose tables of the same
    names a sync would write into and `--rebuild` empty."""
    names = [name for (name,) in con.execute(
        "SELECT table_name FROM information_schema.tables WHERE table_catalog = current_database() "
        "ORDER BY table_name").fetchall()]
    if not names or ("sync_state" in names and _ours(con)):
        return None
    shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
    return f"is a DuckDB database of something else, not a CompanyOS warehouse (it holds {shown})"


def _ours(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether `sync_state` is the warehouse's own: (key, value) text with key as its primary key.
    Another application's table of that name (an id and a timestamp, say) was taken for one, and
    the sync added its tables to that file, and `--rebuild` emptied the other table."""
    columns = con.execute(
        "SELECT column_name, data_type FROM information_schema.columns WHERE table_catalog = "
        "current_database() AND table_name = 'sync_state' ORDER BY ordinal_position").fetchall()
    keyed = con.execute(
        "SELECT constraint_column_names FROM duckdb_constraints() WHERE database_name = "
        "current_database() AND table_name = 'sync_state' AND constraint_type = 'PRIMARY KEY'"
    ).fetchall()
    return columns == [("key", "VARCHAR"), ("value", "VARCHAR")] and keyed == [(["key"],)]


COULD_NOT_WRITE = "Could not write file"
"""DuckDB's words when the OS refuses a write (a full disk, a file size limit)."""
COULD_NOT_CREATE = ("Read-only file system", "Permission denied", "Operation not permitted")
"""The OS's words when a directory takes no new file: the machine's condition, as a full disk is
(exit code 1), where a path under a file or in no directory is the caller's (exit code 2)."""


def _drop_new(path: Path) -> None:
    """Remove what a failed first open left (an empty file, or part of its header), and its WAL."""
    for made in (path, path.with_name(f"{path.name}.wal")):
        with contextlib.suppress(OSError):
            made.unlink()


def _lock_conflict(exc: duckdb.IOException) -> bool:
    """Another process holds the file (worth waiting for), not a file DuckDB cannot open."""
    return LOCK_CONFLICT in str(exc)


_HOLDER_PID = re.compile(r"\(PID (\d+)\)")
"""How DuckDB names the process holding the file in its lock-conflict message."""


def _holder_pid(lock_error: str) -> int | None:
    """The process DuckDB says holds the file, from its lock-conflict message (None if unsaid)."""
    found = _HOLDER_PID.search(lock_error)
    return int(found.group(1)) if found else None


def _head(path: Path) -> bytes | None:
    """The first bytes of an existing file, enough to tell DuckDB's and SQLite's apart; None when
    there is no file to read (DuckDB says what is wrong with an unreadable one when it opens it)."""
    try:
        with path.open("rb") as file:
            return file.read(len(SQLITE_HEADER))
    except OSError:
        return None


def _first_line(exc: Exception) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
