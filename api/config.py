"""Server settings, read from the environment so every Uvicorn worker process builds the same app."""

from __future__ import annotations

import os
from dataclasses import dataclass, fields

from companyos.config import api_key_problem

DEFAULT_MAX_SESSIONS = 1024
DEFAULT_CACHE_SIZE = 4096
DEFAULT_IDLE_TIMEOUT_S = 300.0
DEFAULT_MAX_BODY_BYTES = 256 * 1024
"""Largest request body (and WebSocket message) accepted: far above any real action, and far
below the store's 1 MiB event limit, so an accepted action can always be logged."""

_ENV = {
    "db": "COMPANYOS_DB",
    "warehouse": "COMPANYOS_WAREHOUSE",
    "api_key": "COMPANYOS_API_KEY",
    "max_sessions": "COMPANYOS_MAX_SESSIONS",
    "cache_size": "COMPANYOS_CACHE_SIZE",
    "idle_timeout_s": "COMPANYOS_IDLE_TIMEOUT",
    "max_body_bytes": "COMPANYOS_MAX_BODY",
    "inline_steps": "COMPANYOS_INLINE_STEPS",
    "exit_with_parent": "COMPANYOS_EXIT_WITH",
}


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """What one server process needs; `from_env` is what `companyos serve` workers use.

    - max_sessions: concurrent WebSocket sessions; one more gets a CAPACITY_REACHED frame.
    - cache_size: live episodes kept in memory; the least recently used idle one leaves first.
    - idle_timeout_s: an episode untouched this long leaves the cache (never the log).
    - inline_steps: run a WebSocket step on the event loop instead of a thread. Faster on SQLite
      (a step is ~0.1 ms of CPU and the GIL serialises threads anyway); None picks it for SQLite.
    - warehouse: the DuckDB file the analytics routes and the UI sync and read (None: the analytics
      default, beside a SQLite store or ./<database>.duckdb).
    - exit_with_parent: the pid of the process whose death shuts this one down (the supervisor of
      `serve --workers N`: killed outright, it leaves its workers serving the port). A pid, not
      "my parent": a worker still starting when the supervisor dies already has another parent.
    """

    db: str | None = None
    warehouse: str | None = None
    api_key: str | None = None
    max_sessions: int = DEFAULT_MAX_SESSIONS
    cache_size: int = DEFAULT_CACHE_SIZE
    idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    inline_steps: bool | None = None
    exit_with_parent: int | None = None

    def __post_init__(self) -> None:
        if self.max_sessions < 1:
            raise ValueError("max_sessions must be at least 1")
        if self.cache_size < 1:
            raise ValueError("cache_size must be at least 1")
        if self.idle_timeout_s <= 0:
            raise ValueError("idle_timeout_s must be positive")
        if self.max_body_bytes < 1024:
            raise ValueError("max_body_bytes must be at least 1024")
        if self.api_key is not None and (problem := api_key_problem(self.api_key)):
            raise ValueError(f"{problem} (COMPANYOS_API_KEY)")

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> ServerConfig:
        env = os.environ if environ is None else environ
        kwargs: dict = {}
        types = {f.name: f.type for f in fields(cls)}
        for name, var in _ENV.items():
            raw = env.get(var)
            if raw is None or raw == "":
                continue
            kind = types[name]
            try:
                if "bool" in kind:
                    kwargs[name] = raw.strip().lower() in ("1", "true", "yes", "on")
                elif "int" in kind:
                    kwargs[name] = int(raw)
                elif "float" in kind:
                    kwargs[name] = float(raw)
                elif name == "api_key":  # a key file or secret mount often ends in a newline
                    kwargs[name] = raw.strip()
                else:
                    kwargs[name] = raw
            except ValueError:
                raise ValueError(f"{var}={raw!r} is not a valid {kind.split()[0]}") from None
        return cls(**kwargs)
