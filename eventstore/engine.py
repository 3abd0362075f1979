"""Engines for the store: SQLite in WAL mode with explicit transactions, PostgreSQL through psycopg 3."""

from __future__ import annotations

import os
import weakref
from urllib.parse import parse_qs, unquote, urlsplit

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.pool import StaticPool
from sqlalchemy.util import asbool

SQLITE_SYNCHRONOUS = ("normal", "full")
PG_CONNECT_TIMEOUT_S = 10
SQLITE_BUSY_TIMEOUT_MS = 60_000
"""How long a waiting SQLite writer (or a reader during recovery) waits for the file's lock."""
PG_LOCK_TIMEOUT_MS = SQLITE_BUSY_TIMEOUT_MS
"""How long a PostgreSQL statement waits for a lock (`lock_timeout`) when nothing else set one: as
long as SQLite's writers wait for theirs. PostgreSQL's default waits forever, so a lock held by
someone else (a `LOCK TABLE` in a maintenance session, a transaction left open in psql) hung
every step."""


class UnsuitableEncoding(Exception):
    """A PostgreSQL database whose encoding cannot hold every character: agents send any Unicode
    (an emoji in an action), which a LATIN1 database refused in the middle of an episode."""


STORE_ENCODINGS = ("UTF8", "SQL_ASCII")
"""Server encodings that keep any UTF-8 text: UTF8, and SQL_ASCII, which stores the bytes as sent."""


class BadSynchronous(ValueError):
    """A `synchronous=` the store cannot apply: a value it does not know, or any for PostgreSQL."""


_DECODES_DATABASE = sa.make_url("sqlite:///%41").database == "A"
"""Whether this SQLAlchemy decodes %xx in a URL's database name: 2.1 does, 2.0 does not."""


def parse_url(url: str | sa.URL) -> sa.URL:
    """`sa.make_url` with the database name's %xx decoded on every SQLAlchemy version: under 2.0,
    `sqlite:///a%3F.db` was a file named `a%3F.db` and `sqlite:///%00` one named `%00`, where the
    README (and 2.1) say `a?.db` and a refused NUL."""
    parsed = sa.make_url(url)
    if isinstance(url, str) and not _DECODES_DATABASE and parsed.database:
        parsed = parsed.set(database=unquote(parsed.database))
    return parsed


def normalise_url(url: str) -> sa.URL:
    """Accept plain `postgresql://` URLs and route them to psycopg 3, the driver we test against."""
    parsed = parse_url(url)
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed


def _check_every_argument_has_a_value(url: str) -> None:
    """SQLAlchemy drops a query argument without `=` (`?readonly`, `?ro`): the store opened
    read-write as if it were absent, and `sqlite:////tmp/a?.db` opened `/tmp/a`."""
    if not isinstance(url, str):
        return
    query = url.rpartition("@")[2].partition("?")[2]
    bare = [part for part in query.split("&") if part and "=" not in part]
    if bare:
        raise ValueError(f"the query argument {unquote(bare[0])!r} has no value: write name=value, "
                         "and a '?' in a file name as %3F")


def in_memory_sqlite(url: str | sa.URL) -> bool:
    """Whether the URL names an in-memory SQLite database (`sqlite://`, `sqlite:///`,
    `:memory:`, or a URI such as `file:db?mode=memory&uri=true`) or SQLite's anonymous temporary
    file (the URI `file:` with no name), which live in one process and are gone when it ends."""
    parsed = parse_url(url)
    if parsed.get_backend_name() != "sqlite":
        return False
    database = parsed.database or ""
    return (database in ("", ":memory:") or sqlite_uri_mode(parsed) == "memory"
            or database.startswith("file::memory:") or _uri_file(parsed) == "")


def sqlite_file(url: str | sa.URL) -> str | None:
    """The file of a file-backed SQLite URL; None for in-memory SQLite and any other database.

    A URI-form URL (`sqlite:///file:x.db?mode=ro&uri=true`) names its file inside the URI: the
    file is what the writer lock, the warehouse's default path and the readers need, so the two
    spellings of one store must agree on it.
    """
    parsed = parse_url(url)
    if parsed.get_backend_name() != "sqlite" or in_memory_sqlite(parsed):
        return None
    uri_file = _uri_file(parsed)
    return parsed.database if uri_file is None else uri_file


def _uri_file(parsed: sa.URL) -> str | None:
    """The file a SQLite URI-form URL names ("" for `file:` alone, SQLite's anonymous temporary
    file); None when the URL is not in URI form."""
    database = parsed.database or ""
    if database[:5].lower() != "file:" or not asbool(parsed.query.get("uri", False)):
        return None
    return unquote(urlsplit(database).path)


def sqlite_uri_mode(url: str | sa.URL) -> str | None:
    """The `mode=` of a SQLite URI URL (`sqlite:///file:x.db?mode=ro&uri=true`: "ro"), else None;
    also when the URI itself holds it (`file:x.db%3Fmode=ro`)."""
    return _sqlite_uri_argument(url, "mode")


def sqlite_read_only(url: str | sa.URL) -> bool:
    """Whether a SQLite URL opens its file read-only: `mode=ro`, or `immutable=1`."""
    return sqlite_uri_mode(url) == "ro" or sqlite_immutable(url)


def sqlite_immutable(url: str | sa.URL) -> bool:
    """Whether a SQLite URL says `immutable=1`: read-only media, where SQLite cannot make the
    WAL's shared-memory file, so every reader of the file must say it too."""
    return (_sqlite_uri_argument(url, "immutable") or "").lower() in ("1", "true", "yes", "on")


def _sqlite_uri_argument(url: str | sa.URL, name: str) -> str | None:
    """A SQLite URI argument of the URL's query or of the URI itself, else None."""
    parsed = parse_url(url)
    if parsed.get_backend_name() != "sqlite":
        return None
    value = parsed.query.get(name)
    if isinstance(value, tuple):
        value = value[-1]
    if value is None and (parsed.database or "")[:5].lower() == "file:":
        values = parse_qs(urlsplit(parsed.database).query).get(name)
        value = values[-1] if values else None
    return value


def create_engine(url: str, synchronous: str | None = None) -> sa.Engine:
    _check_every_argument_has_a_value(url)
    parsed = normalise_url(url)
    if parsed.get_backend_name() == "sqlite":
        if "\x00" in (parsed.database or ""):  # sqlite3 raised "embedded null byte" on connect
            raise ValueError("a file name cannot hold a NUL character (%00)")
        engine = _sqlite_engine(parsed, synchronous or "normal")
        if in_memory_sqlite(parsed):  # one connection, the database itself: a child has its copy
            return engine
        return _pooled_per_process(engine)
    if synchronous is not None:
        raise BadSynchronous("synchronous= applies to SQLite only; PostgreSQL durability is the server's")
    # pre-ping: a connection the server dropped (a restart, a failover, a terminated backend) is
    # replaced when it is checked out, instead of failing the step or request that drew it.
    # connect_timeout: a server that does not answer (a partition, a hung host) fails a connect
    # in seconds rather than the kernel's minutes; a URL's own ?connect_timeout= wins.
    connect_args = {} if "connect_timeout" in parsed.query else {"connect_timeout": PG_CONNECT_TIMEOUT_S}
    # client_encoding: the store's text is Unicode, so it talks UTF-8 whatever libpq would take
    # from PGCLIENTENCODING or the database (LATIN1 failed on an emoji that a UTF8 database held,
    # SQL_ASCII made psycopg hand out bytes); a URL's own ?client_encoding= wins.
    if "client_encoding" not in parsed.query:
        connect_args["client_encoding"] = "utf8"
    elif str(parsed.query["client_encoding"]).replace("_", "").lower() == "sqlascii":
        raise ValueError("client_encoding=SQL_ASCII makes the driver hand out bytes, not text, which "
                         "the store cannot read; leave it out: the store talks UTF-8")
    # a server that went silent (a partition, a failover with no reset): a request waited on it
    # until the kernel gave up, minutes later, and only then became a 503. Keepalives and a bound
    # on unacknowledged data end such a connection in about a minute; a URL's own values win
    connect_args.update({name: value for name, value in PG_DEAD_PEER.items() if name not in parsed.query})
    prepare, parsed = _prepare_threshold(parsed)
    connect_args.update(prepare)
    engine = sa.create_engine(parsed, pool_size=8, max_overflow=32, pool_pre_ping=True,
                              connect_args=connect_args)
    event.listen(engine, "connect", _bounded_lock_waits)
    return _pooled_per_process(engine)


PG_DEAD_PEER = {"keepalives": 1, "keepalives_idle": 30, "keepalives_interval": 10,
                "keepalives_count": 3, "tcp_user_timeout": 60_000}
"""libpq's settings that notice a PostgreSQL server gone silent: an idle connection is probed
after 30 s and dropped after 3 unanswered probes; sent data unacknowledged for 60 s (the store's
lock wait) ends it too."""


POOLER_HINT = ("a transaction pooler (PgBouncer's pool_mode=transaction) between the store and "
               "PostgreSQL runs each transaction on any server connection, where psycopg's prepared "
               "statements are missing: add ?prepare_threshold=none to the store's URL")


def _prepare_threshold(url: sa.URL) -> tuple[dict[str, int | None], sa.URL]:
    """The URL's `?prepare_threshold=` as psycopg's connect argument (none given: no argument,
    psycopg's default), and the URL without it (it is psycopg's setting, not a libpq parameter,
    which psycopg would refuse): `none` prepares no statement, which a transaction pooler needs;
    a whole number, the runs of a statement after which psycopg prepares it.

    Not `none` by default: prepared statements make PostgreSQL appends 10-17% faster (measured
    with `bench/store_append.py`), and only a transaction pooler loses them."""
    value = url.query.get("prepare_threshold")
    if value is None:
        return {}, url
    if isinstance(value, tuple):
        value = value[-1]
    url = url.difference_update_query(["prepare_threshold"])
    if value.strip().lower() == "none":
        return {"prepare_threshold": None}, url
    if value.strip().isdigit():
        return {"prepare_threshold": int(value)}, url
    raise ValueError(f"prepare_threshold={value!r}: use none (behind a transaction pooler such as "
                     "PgBouncer) or a whole number of runs after which a statement is prepared")


def pooler_hint(exc: BaseException) -> str | None:
    """What to do about a statement that failed because a transaction pooler dropped (or kept) a
    prepared statement of psycopg's, else None."""
    text = str(getattr(exc, "orig", None) or exc)
    if 'prepared statement "_pg3_' in text and ("does not exist" in text or "already exists" in text):
        return POOLER_HINT
    return None


def _bounded_lock_waits(dbapi_conn, _record) -> None:
    """Give a new PostgreSQL connection the store's lock_timeout, unless something already set
    one: the URL's `?options=`, PGOPTIONS, or `ALTER ROLE/DATABASE ... SET lock_timeout` (a
    startup option would override the last two, and a fixed `options` would drop PGOPTIONS).

    In the same round trip, floats are sent to it with every digit (`extra_float_digits = 3`):
    set to 0 by a role, database or PGOPTIONS, the read models' floats read back rounded to 15
    digits, and `verify` called a sound log's read models broken; and a database whose encoding
    cannot hold every character is refused (UnsuitableEncoding) before anything is written."""
    with dbapi_conn.cursor() as cursor:
        # the setting's source, not its value: a lock_timeout of 0 set on purpose stays 0
        cursor.execute("SELECT source, set_config('extra_float_digits', '3', false), "
                       "current_setting('server_encoding') FROM pg_settings WHERE name = 'lock_timeout'")
        source, _, encoding = cursor.fetchone()
        if encoding not in STORE_ENCODINGS:
            dbapi_conn.close()
            raise UnsuitableEncoding(encoding)
        if source == "default":
            cursor.execute(f"SET lock_timeout = {int(PG_LOCK_TIMEOUT_MS)}")
    dbapi_conn.commit()


_PER_PROCESS: weakref.WeakSet[sa.Engine] = weakref.WeakSet()


def _pooled_per_process(engine: sa.Engine) -> sa.Engine:
    """A pooled connection opened before a fork stays the parent's: the child opens its own.

    Without this a forked child (multiprocessing's default start method on Linux) drew the
    parent's PostgreSQL sockets from the pool, and both processes read each other's results.
    The child replaces each engine's pool without closing what it holds (`dispose(close=False)`,
    SQLAlchemy's answer to os.fork(): closing would end the parent's sessions too). This runs at
    the fork, before any pre-ping could talk on an inherited socket.
    """
    _PER_PROCESS.add(engine)
    return engine


def _forget_the_parents_connections() -> None:
    for engine in list(_PER_PROCESS):
        try:
            engine.dispose(close=False)
        except Exception:  # noqa: BLE001, S112 - one engine's failure must not leave the others
            continue


os.register_at_fork(after_in_child=_forget_the_parents_connections)


_SQLITE_URI_ARGUMENTS = ("cache", "immutable", "mode", "nolock", "psow", "vfs")
_PYSQLITE_ARGUMENTS = frozenset({"uri", "timeout", "isolation_level", "detect_types",
                                 "check_same_thread", "cached_statements"})


def _check_sqlite_uri(url: sa.URL) -> None:
    """With `uri=true` the driver passes every other argument into a URI, where SQLite drops
    one it does not know (`mdoe=ro`: the store opened read-write), and reads the name as a URI
    only when it begins with `file:` (else `store.db?mode=ro` was a new file of that name).
    Without it, the driver ignores every argument but its own (a typo such as `?mdoe=ro`, or
    `?mode=ro` without `uri=true`), and the store opened as if it were absent (SQLAlchemy 2.1
    warns, 2.0 said nothing)."""
    if not asbool(url.query.get("uri", False)):
        ignored = sorted(set(url.query) - _PYSQLITE_ARGUMENTS)
        if ignored:
            raise ValueError(f"SQLite takes no query argument {', '.join(map(repr, ignored))} here; its "
                             "URI arguments (mode=ro, immutable=1, ...) need uri=true as well")
        return
    database = url.database or ""
    if database[:5].lower() != "file:":
        raise ValueError(f"with uri=true SQLite reads the file name as a URI only when it begins with "
                         f"file: (sqlite:///file:{database or 'store.db'}?...&uri=true); as it is, "
                         "the store would be a file named with the arguments in its name")
    unknown = sorted(set(url.query) - _PYSQLITE_ARGUMENTS - set(_SQLITE_URI_ARGUMENTS))
    if unknown:
        raise ValueError(f"SQLite takes no URI argument {', '.join(map(repr, unknown))}; its URI "
                         f"arguments are {', '.join(_SQLITE_URI_ARGUMENTS)}")


def _sqlite_engine(url: sa.URL, synchronous: str) -> sa.Engine:
    if synchronous not in SQLITE_SYNCHRONOUS:
        raise BadSynchronous(f"synchronous must be one of {SQLITE_SYNCHRONOUS}, not {synchronous!r}")
    _check_sqlite_uri(url)
    in_memory = in_memory_sqlite(url)
    kwargs: dict = {}
    if in_memory:
        kwargs = {"poolclass": StaticPool, "connect_args": {"check_same_thread": False}}
    engine = sa.create_engine(url, **kwargs)

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn, _record) -> None:
        # Take transaction control from pysqlite so writers can BEGIN IMMEDIATE (SQLAlchemy recipe).
        dbapi_conn.isolation_level = None
        cursor = dbapi_conn.cursor()
        if not in_memory:
            cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA synchronous={synchronous.upper()}")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA cache_size=-65536")
        cursor.execute("PRAGMA wal_autocheckpoint=16384")
        cursor.execute("PRAGMA mmap_size=1073741824")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: sa.Connection) -> None:
        # A writer takes the write lock up front: no deadlock-prone lock upgrade mid-transaction.
        write = conn.get_execution_options().get("companyos_write", False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")

    return engine
