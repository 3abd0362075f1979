"""`companyos serve`: the agent server (OpenEnv HTTP + WebSocket + MCP) on Uvicorn.

The app is handed to Uvicorn as an import string with a factory (`api.app:create_app`), not
imported here: companyos/ sits below api/ in the layers, and an import string is also what
Uvicorn needs to start several worker processes. Settings travel to the workers as COMPANYOS_*
environment variables, which `api.config.ServerConfig.from_env` reads.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import typer

from companyos.commands.options import DbOption, named_path, seconds
from companyos.commands.output import fail
from companyos.config import api_key_problem, resolve_db
from eventstore import shown_url

APP_FACTORY = "api.app:create_app"
# Uvicorn's sans-I/O WebSocket protocol, answering handshakes it refuses (see api/handshake.py);
# an import string too, so every worker process loads it.
WS_PROTOCOL = "api.handshake:AnsweringWebSocketProtocol"
# Uvicorn's httptools protocol with a deadline for request headers (see api/httpprotocol.py).
HTTP_PROTOCOL = "api.httpprotocol:TimelyHttpProtocol"
DEFAULT_MAX_BODY = 256 * 1024


def register(app: typer.Typer) -> None:
    app.command("serve")(serve)


def serve(
    host: str = typer.Option("127.0.0.1", "--host", help="Interface to listen on."),
    port: int = typer.Option(8000, "--port", min=0, max=65535, help="TCP port."),
    db: str | None = DbOption,
    warehouse: Path | None = typer.Option(None, "--warehouse", parser=named_path,
                                          help="DuckDB file for /analytics and the UI's report "
                                               "(default: beside a SQLite store, else "
                                               "./<database>.duckdb)."),
    workers: int = typer.Option(1, "--workers", min=1, max=64,
                                help="Worker processes; any of them can serve any episode."),
    max_sessions: int = typer.Option(1024, "--max-sessions", min=1,
                                     help="Concurrent WebSocket sessions per worker; one more "
                                          "gets a CAPACITY_REACHED frame."),
    cache_size: int = typer.Option(4096, "--cache-size", min=1,
                                   help="Running episodes kept in memory per worker."),
    idle_timeout: float = typer.Option(300.0, "--idle-timeout", parser=seconds(0.001, 366 * 86400),
                                       help="Seconds before an idle episode leaves the cache "
                                            "(never the log); from 0.001 to a year."),
    max_body: int = typer.Option(DEFAULT_MAX_BODY, "--max-body", min=1024,
                                 help="Largest request body / WebSocket message in bytes."),
    root_path: str = typer.Option("", "--root-path",
                                  help="The path prefix a reverse proxy serves this under "
                                       "(e.g. /companyos), for the UI's links and the API docs."),
    log_level: str = typer.Option("warning", "--log-level",
                                  help="Uvicorn log level: critical, error, warning, info, "
                                       "debug or trace."),
) -> None:
    """Serve environments to agents (OpenEnv HTTP/WebSocket, MCP), the episode log, and a web UI at /ui.

    Set COMPANYOS_API_KEY to require `Authorization: Bearer <key>` on every route but the probes
    /health and /ready.
    """
    import uvicorn
    from uvicorn.config import LOG_LEVELS

    if log_level not in LOG_LEVELS:
        fail(f"--log-level must be one of {', '.join(LOG_LEVELS)}, not {log_level!r}")
    api_key = os.environ.get("COMPANYOS_API_KEY")
    if api_key == "":  # `COMPANYOS_API_KEY=$KEY` with KEY unset served every route to anyone
        fail("COMPANYOS_API_KEY is set but empty (an unset shell variable?): set it to the key, or "
             "unset it to serve without one")
    if api_key and (problem := api_key_problem(api_key.strip())):  # said now, not as every
        fail(f"COMPANYOS_API_KEY: {problem}")  # client's "wrong API key"
    warehouse_file = _warehouse_file(warehouse) if warehouse else ""
    root_path = _prefix(root_path)
    port = _check_can_listen(host, port)
    url = resolve_db(db)
    _open_store_once(url)  # create / migrate before the workers race to do it
    os.environ.update({
        "COMPANYOS_DB": url,
        # absolute, so every worker names the same file whatever it does with its directory
        "COMPANYOS_WAREHOUSE": warehouse_file,
        "COMPANYOS_MAX_SESSIONS": str(max_sessions),
        "COMPANYOS_CACHE_SIZE": str(max(cache_size, max_sessions)),
        "COMPANYOS_IDLE_TIMEOUT": str(idle_timeout),
        "COMPANYOS_MAX_BODY": str(max_body),
        # the supervisor is this process: its workers stop with it (not a lone server with its shell)
        "COMPANYOS_EXIT_WITH": str(os.getpid()) if workers > 1 else "",
    })
    descriptors = _raise_descriptor_limit()
    auth = "API key required" if api_key else "no API key"
    store = shown_url(url)
    base = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
    # the pages' links lead under the prefix, so the address above is a dead end without the proxy
    proxied = (f"; the pages' links lead under {root_path}: open them through the proxy that serves it"
               if root_path else "")
    typer.echo(f"companyos serve: {base} ({workers} worker(s), store {store}, {auth})\n"
               f"  web UI {base}/ui, API docs {base}/docs{proxied}")
    if descriptors is not None and descriptors < max_sessions + DESCRIPTOR_HEADROOM:
        typer.echo(f"note: this process may open {descriptors} files, too few for --max-sessions "
                   f"{max_sessions} (each session holds a connection): past about "
                   f"{max(descriptors - DESCRIPTOR_HEADROOM, 0)} clients are dropped without an "
                   "answer; raise `ulimit -n` or lower --max-sessions", err=True)
    settings = dict(factory=True, host=host, port=port, workers=workers, log_level=log_level,
                    root_path=root_path, http=HTTP_PROTOCOL, ws=WS_PROTOCOL, ws_max_size=max_body,
                    ws_ping_interval=20.0, ws_ping_timeout=20.0, backlog=4096, timeout_keep_alive=30,
                    timeout_worker_healthcheck=WORKER_READY_S)
    if workers == 1:
        uvicorn.run(APP_FACTORY, **settings)
    else:
        _supervise(uvicorn.Config(APP_FACTORY, **settings))


WORKER_READY_S = 30
"""How long a worker may take to answer the supervisor's health check, and a new one to start
in a rolling restart (SIGHUP): at Uvicorn's 5 s, a restart under load gave up half-way ("was not
ready in time"), leaving one worker of the old code."""


def _supervise(config) -> None:
    """Run the workers under Uvicorn's supervisor, which stops listening as it begins to stop: it
    kept its copy of the listening socket open until every worker had ended, so the kernel still
    accepted connections that no one would serve, reset seconds later (a client cannot tell that
    from a step lost mid-way: "may or may not have been applied"). Now they are refused at once."""
    from uvicorn.supervisors import Multiprocess

    class Supervisor(Multiprocess):
        def terminate_all(self) -> None:
            for sock in self.sockets:  # the workers close their copies as they begin to stop
                sock.close()
            super().terminate_all()

    Supervisor(config, sockets=[config.bind_socket()]).run()


DESCRIPTOR_HEADROOM = 128
"""Files a worker holds besides its sessions' sockets: the store, the warehouse, probes, logs."""


def _raise_descriptor_limit() -> int | None:
    """Raise this process's soft limit of open files to its hard limit (the workers inherit it),
    as servers do: at the usual soft 1,024, sockets past ~1,000 were dropped without an answer,
    below the default --max-sessions. Returns the limit now in force (None where unknown)."""
    try:
        import resource
    except ImportError:  # not POSIX
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            soft = wanted
        except (ValueError, OSError):  # a limit the kernel will not grant: keep the old one
            pass
    return None if soft == resource.RLIM_INFINITY else soft


def _check_can_listen(host: str, port: int) -> int:
    """Say in one line, before the banner, that the address is unknown (exit 2) or taken
    (exit 1): Uvicorn would log it after the banner and exit with code 3. Returns the port to
    serve: for `--port 0` a free one the kernel picked, so the banner names where it listens."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except (socket.gaierror, UnicodeError) as exc:
        fail(f"cannot listen on {host!r}: {getattr(exc, 'strerror', None) or exc}")
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as Uvicorn binds
        try:
            probe.bind(address)
        except OSError as exc:
            fail(f"cannot listen on {host}:{port}: {exc.strerror}", 1)
        return probe.getsockname()[1]


def _prefix(root_path: str) -> str:
    """`/companyos` from `/companyos/` or `companyos`; refuse what cannot be a path prefix (exit 2).

    ASCII only: Uvicorn encodes the prefix as ASCII for every request's raw path."""
    prefix = "/" + root_path.strip("/") if root_path.strip("/") else ""
    if not (prefix.isascii() and prefix.isprintable()) or any(c in prefix for c in ' ?#%"<>\\'):
        fail(f"--root-path {root_path!r} is not a URL path prefix such as /companyos")
    return prefix


def _warehouse_file(warehouse: Path) -> str:
    """The --warehouse as an absolute path; a directory, the SQLite store, a file that is no DuckDB
    database or another application's DuckDB database is refused now (exit 2), as the analytics
    commands refuse it, not at every analytics request (HTTP 503)."""
    from analytics.warehouse import holds_no_warehouse

    path = warehouse.expanduser().absolute()
    if problem := holds_no_warehouse(path):
        fail(problem)
    return str(path)


def _open_store_once(url: str) -> None:
    """Create or migrate the store; an in-memory SQLite store is refused (exit 2): each worker
    would hold its own, its one connection would be shared by the request threads (a reader's
    rollback ended a writer's transaction: appends were lost), and it is gone when the server stops."""
    from companyos.config import in_memory_store, read_only_refusal
    from eventstore import EventStore

    if in_memory_store(url):
        fail(f"the store {url!r} is an in-memory SQLite store, which the server cannot share "
             "between its threads and workers and which is gone when it stops; name a file, "
             "e.g. sqlite:///companyos.db")
    if refused := read_only_refusal(url, "the server logs episodes and keeps its read models up to date"):
        fail(refused)
    EventStore.open(url).close()
