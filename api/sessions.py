"""Sessions that live in the log: a cache of running episodes in front of their event streams.

A session *is* an episode stream. The server keeps recently used episodes in memory, but the log
holds the truth: a step for an episode that is not cached (another worker started it, the
server restarted, the cache let it go) loads it from its stream and continues exactly where the
log says. Nothing but the log is needed to check an episode's token either: its sha256 lives in
the `EpisodeStarted` envelope's meta (never in a digest), so any process can verify it.

Concurrency: one step at a time per episode. A second step that arrives while one is running
gets 409 instead of queueing (the agent sent two actions for one observation). Across processes
the store's optimistic concurrency does the same: a stale expected version is a 409 too, and the
cached copy is dropped so the next step reloads.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
import threading
import time
from collections import OrderedDict
from functools import cache
from typing import Any

import sqlalchemy as sa

import domain
from companyos.env import episode_state, spec_from_options
from companyos.runtime import (
    EpisodeNotFound,
    EpisodeRuntime,
    UnknownRules,
    episode_id_problem,
    new_episode_id,
)
from eventstore import TOKEN_META_KEY, ConcurrencyError, CorruptCommit, EventStore, StoreClosed, WriterBusy
from eventstore.backends import WAIT_FOR_WRITERS
from eventstore.engine import pooler_hint
from projections.episodes import new_agent_label_problem

RESET_FIELDS = ("seed", "episode_id", "task", "chaos", "reward_profile", "max_steps", "rules", "agent",
                "text")
STEP_WAIT_S = 30.0
"""How long reading an episode waits for this process's running step on it; past that it loads
the episode from the log, as it does when another process stepped it."""
_HIDDEN_META = frozenset({TOKEN_META_KEY})

log = logging.getLogger("uvicorn.error")  # where the server's operators read errors


class ApiError(Exception):
    """A request the server refuses, with its HTTP status and a stable machine-readable code."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message

    def body(self) -> dict[str, Any]:
        return {"detail": self.message, "code": self.code}


def log_damaged(exc: CorruptCommit) -> ApiError:
    """A stored commit no longer unpacks: the server's fault, said in words, nothing else lost."""
    return ApiError(500, "log_damaged", f"{exc}; `companyos verify` names every damaged episode")


@cache
def outage_classes() -> tuple[type[Exception], ...]:
    """What a database outage raises (a lost PostgreSQL connection, a full disk, a locked
    file): SQLAlchemy's wrappers, or the drivers' own from the store's raw cursors. Errors of
    other kinds (a constraint, bad SQL) are bugs and stay 500s."""
    import sqlite3

    # sa.exc.TimeoutError: every pooled connection busy for pool_timeout (a database that hangs
    # or holds a lock): as much an outage as a refused connection, and as retryable
    # StoreClosed: a request that outlived the server's store, at shutdown
    classes: tuple[type[Exception], ...] = (sa.exc.OperationalError, sa.exc.InterfaceError,
                                            sa.exc.TimeoutError, sqlite3.OperationalError,
                                            sqlite3.InterfaceError, StoreClosed)
    try:
        import psycopg  # a dependency; loaded anyway when the store is PostgreSQL
    except ImportError:
        return classes
    return (*classes, psycopg.OperationalError, psycopg.InterfaceError)


@cache
def pooler_classes() -> tuple[type[Exception], ...]:
    """What a statement a transaction pooler lost raises: psycopg's own from the store's raw
    cursors, SQLAlchemy's ProgrammingError around it elsewhere (which `store_outage` tells from
    a bug by its words)."""
    try:
        import psycopg
    except ImportError:
        return ()
    return (psycopg.errors.InvalidSqlStatementName, psycopg.errors.DuplicatePreparedStatement,
            sa.exc.ProgrammingError)


def store_outage(exc: BaseException) -> ApiError | None:
    """A database outage as the 503 `store_unavailable` a client may retry, logged here with the
    driver's words (they can name hosts and tables, so the client gets only the kind); None for
    any other exception. Without it such a request was a bare "Internal Server Error", and a
    WebSocket dropped with no frame. A prepared statement a transaction pooler lost is one too
    (the store's URL lacks `?prepare_threshold=none`): it was a 500 that read as a server bug."""
    if writes_refused(exc):
        log.warning("the store's database refuses this server's writes", exc_info=exc)
        return ApiError(503, "store_read_only", "the store's database refuses writes "
                        f"({type(getattr(exc, 'orig', None) or exc).__name__}): this server can read "
                        "episodes but not log new steps")
    hint = pooler_hint(exc)
    if hint is None and not isinstance(exc, outage_classes()):
        return None
    log.warning("the store's database failed under a request" + (f"; {hint}" if hint else ""), exc_info=exc)
    return outage_answer(exc, hint)


@cache
def write_refused_classes() -> tuple[type[Exception], ...]:
    """What a database that refuses writes raises (`store_outage` tells them by SQLSTATE):
    psycopg's own from the store's raw cursors, SQLAlchemy's wrappers elsewhere."""
    try:
        import psycopg
    except ImportError:
        return ()
    return (psycopg.errors.ReadOnlySqlTransaction, psycopg.errors.InsufficientPrivilege,
            sa.exc.InternalError, sa.exc.ProgrammingError)


_WRITES_REFUSED = frozenset({"25006", "42501"})
"""PostgreSQL's read_only_sql_transaction and insufficient_privilege: a read-only database or
role, which the server opened as a store and could serve reads from; a write was a bare 500."""


def writes_refused(exc: BaseException) -> bool:
    """A database that takes no writes: PostgreSQL's two SQLSTATEs, or SQLite's SQLITE_READONLY
    (a store file or folder this process may not write), which retrying never mends."""
    error = getattr(exc, "orig", None) or exc
    code = getattr(error, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF == _SQLITE_READONLY
    return getattr(error, "sqlstate", None) in _WRITES_REFUSED


_SQLITE_READONLY = 8


def outage_answer(exc: BaseException, hint: str | None = None) -> ApiError:
    """The 503 for a database outage, naming only its kind (no driver words), not logged."""
    failed = f"the store's database failed ({type(getattr(exc, 'orig', None) or exc).__name__})"
    said = f"{failed}: {hint}" if hint else f"{failed}; try again once it is back"
    return ApiError(503, "store_unavailable", said)


def refusal(exc: BaseException) -> ApiError | None:
    """What to tell the client of an exception: an ApiError as it is, a database outage as
    `store_outage` says it; None for anything else (a bug: let it propagate)."""
    return exc if isinstance(exc, ApiError) else store_outage(exc)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def public_meta(meta: dict[str, Any]) -> dict[str, Any]:
    """An envelope's meta without secrets (the token hash), for the episode log endpoints."""
    if not _HIDDEN_META.intersection(meta):
        return meta
    return {k: v for k, v in meta.items() if k not in _HIDDEN_META}


def check_episode_id(episode_id: Any) -> str:
    if problem := episode_id_problem(episode_id):
        raise ApiError(400, "invalid_episode_id", problem)
    return episode_id


def chosen_token(headers: list[str], given: str | None) -> str | None:
    """The episode token of a request: `given` (body or query) or its X-Episode-Token header.
    Two that differ are refused (the body's won without a word, so a stale header went
    unnoticed), and so are two X-Episode-Token headers that differ (the first or the last won,
    where repeated query parameters are refused). Whitespace around a header's value is no part
    of it (RFC 9110): a proxy or client that left a trailing space got 403 `wrong_token`."""
    headers = [header.strip(" \t") for header in headers]
    if len(set(headers)) > 1:
        raise ApiError(400, "conflicting_tokens", "the request has X-Episode-Token headers that "
                       "differ; send the episode's token once")
    header = headers[0] if headers else None
    if header and given and header != given:
        raise ApiError(400, "conflicting_tokens", "the episode_token given and the X-Episode-Token "
                       "header differ; send the episode's token once")
    return given or header


def split_session_key(key: str) -> tuple[str, str | None]:
    """`<episode_id>.<token>` (an MCP session id) -> (episode_id, token); a bare id has no token.

    Tokens are URL-safe base64 (no '.'), so the last '.' separates them even when the id has dots.
    """
    episode_id, dot, token = key.rpartition(".")
    if dot and episode_id and token and "." not in token and len(token) >= 20:
        return episode_id, token
    return key, None


ENDED_KEPT = 64
"""Ended episodes kept in a worker's cache, the latest ones (a client's last /state after the end
is served from memory); older ones are read from the log again if asked for."""


class Session:
    """One cached running episode; `lock` admits one step at a time."""

    __slots__ = ("episode_id", "runtime", "lock", "last_used", "attached", "token_hash", "text")

    def __init__(self, runtime: EpisodeRuntime) -> None:
        self.episode_id = runtime.episode_id
        self.runtime: EpisodeRuntime | None = runtime
        self.lock = threading.Lock()
        self.last_used = time.monotonic()
        self.attached = 0  # WebSocket connections bound to it: such a session stays cached
        meta = runtime.start_meta or {}
        self.token_hash: str | None = meta.get(TOKEN_META_KEY)
        self.text = bool(meta.get("text", False))


class SessionManager:
    """Starts, finds and steps episodes for every face of the server (HTTP, WebSocket, MCP)."""

    def __init__(self, store: EventStore, cache_size: int, idle_timeout_s: float) -> None:
        self.store = store
        self.cache_size = cache_size
        self.idle_timeout_s = idle_timeout_s
        self._cache: OrderedDict[str, Session] = OrderedDict()
        self._ended: OrderedDict[str, None] = OrderedDict()  # cached or not, in the order they ended
        self._mutex = threading.Lock()

    # -- the cache -----------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._cache)

    def cached(self, episode_id: str) -> Session | None:
        return self._cache.get(episode_id)

    def _insert(self, session: Session) -> Session:
        with self._mutex:
            existing = self._cache.get(session.episode_id)
            if existing is not None:
                self._cache.move_to_end(session.episode_id)
                return existing
            self._cache[session.episode_id] = session
            if len(self._cache) > self.cache_size:
                self._trim()
            return session

    def _trim(self) -> None:
        """Drop least recently used sessions that no socket holds and no step is using."""
        excess = len(self._cache) - self.cache_size
        for episode_id in list(self._cache):
            if excess <= 0:
                break
            session = self._cache[episode_id]
            if session.attached or session.lock.locked():
                continue
            del self._cache[episode_id]
            excess -= 1

    def evict_idle(self, now: float | None = None) -> int:
        """Let idle sessions leave the cache (their streams stay in the log); returns how many."""
        deadline = (time.monotonic() if now is None else now) - self.idle_timeout_s
        with self._mutex:
            idle = [eid for eid, s in self._cache.items()
                    if s.last_used < deadline and not s.attached and not s.lock.locked()]
            for episode_id in idle:
                del self._cache[episode_id]
        return len(idle)

    def forget(self, episode_id: str) -> bool:
        """Drop an episode from the cache (MCP session DELETE); the log keeps it."""
        with self._mutex:
            session = self._cache.get(episode_id)
            if session is None or session.attached or session.lock.locked():
                return False
            del self._cache[episode_id]
            return True

    def attach(self, session: Session) -> None:
        with self._mutex:
            session.attached += 1

    def detach(self, session: Session) -> None:
        with self._mutex:
            session.attached = max(0, session.attached - 1)
            session.last_used = time.monotonic()

    # -- starting and finding episodes ---------------------------------------------------------

    def start(self, options: dict[str, Any]) -> tuple[Session, str, dict[str, Any]]:
        """Start a new episode from reset options; returns (session, token, reset payload)."""
        opts = dict(options)
        unknown = sorted(set(opts) - set(RESET_FIELDS))
        if unknown:
            raise ApiError(400, "invalid_reset", f"unknown reset fields {unknown}; "
                           f"known: {', '.join(RESET_FIELDS)}")
        seed = opts.pop("seed", None)
        episode_id = opts.pop("episode_id", None)
        episode_id = new_episode_id() if episode_id is None else check_episode_id(episode_id)
        text = opts.pop("text", False)
        if not isinstance(text, bool):
            raise ApiError(400, "invalid_reset", "text must be true or false")
        agent = opts.pop("agent", None)
        if agent is not None and (problem := new_agent_label_problem(agent)):
            raise ApiError(400, "invalid_reset", problem)
        try:
            spec = spec_from_options(seed, opts)
        except ValueError as exc:
            raise ApiError(400, "invalid_reset", str(exc)) from None
        token = secrets.token_urlsafe(24)
        meta: dict[str, Any] = {TOKEN_META_KEY: hash_token(token), "agent": agent or "api"}
        if text:
            meta["text"] = True
        try:
            runtime, info = EpisodeRuntime.start(self.store, spec, episode_id=episode_id,
                                                 durability="step", meta=meta)
        except ConcurrencyError:
            raise ApiError(409, "episode_exists",
                           f"episode {episode_id!r} already exists; omit episode_id for a fresh "
                           "one, or act on it with its token") from None
        session = self._insert(Session(runtime))
        payload = self._payload(session, runtime, info, reward=None)
        payload["metadata"]["episode_token"] = token
        payload["metadata"]["session_id"] = f"{episode_id}.{token}"
        return session, token, payload

    def get(self, episode_id: Any, token: str | None) -> Session:
        """The episode's session, loaded from the log when not cached, after checking its token."""
        episode_id = check_episode_id(episode_id)
        session = self._cache.get(episode_id)
        if session is None:
            session = self._insert(Session(self._reload(episode_id)))
        else:
            with self._mutex:
                if episode_id in self._cache:
                    self._cache.move_to_end(episode_id)
        self.check_token(session, token)
        return session

    def get_by_key(self, key: Any, token: str | None) -> Session:
        """The session a key names: `<episode_id>.<token>`, or an episode id with `token` given
        apart. An id may itself hold a dot and end like a token (`run.<32 hex digits>`), so:
        with a token given apart, the whole key is tried as the id first (the key's tail would
        not be the token used anyway); without one, a split that names no episode, or one whose
        token is not the tail (a `run` episode beside `run.<hex>`), is retried as the whole id,
        which then asks for its token."""
        if not isinstance(key, str):
            return self.get(key, token)
        episode_id, key_token = split_session_key(key)
        if key_token is None:
            return self.get(key, token)
        whole_is_an_id = episode_id_problem(key) is None
        if token is not None and whole_is_an_id:
            try:
                return self.get(key, token)
            except ApiError as exc:
                if exc.code != "episode_not_found":
                    raise
            return self.get(episode_id, token)
        try:
            return self.get(episode_id, token or key_token)
        except ApiError as exc:
            if exc.code not in ("episode_not_found", "wrong_token") or not whole_is_an_id:
                raise
            try:
                return self.get(key, token)  # token is None here: a dotted id asks for its token
            except ApiError as whole:  # no such id either: the split's answer names the id part
                raise (exc if whole.code == "episode_not_found" else whole) from None

    @staticmethod
    def check_token(session: Session, token: str | None) -> None:
        if session.token_hash is None:
            raise ApiError(403, "no_token", f"episode {session.episode_id!r} was not started by "
                           "this server and has no token; it can be read but not acted on")
        if not token:
            raise ApiError(401, "token_required",
                           "this needs the episode's token (returned by reset): the "
                           "X-Episode-Token header, or episode_token in the body (POST /step) "
                           "or the query (GET /state, /ws)")
        if not isinstance(token, str) or not hmac.compare_digest(hash_token(token),
                                                                 session.token_hash):
            raise ApiError(403, "wrong_token", "the episode token does not match this episode")

    # -- stepping ------------------------------------------------------------------------------

    def step(self, session: Session, action: Any, check_fresh: bool = True,
             after_step: int | None = None) -> dict[str, Any]:
        """One step, logged before it returns. `check_fresh` compares the cached copy with the
        log first (one indexed read), so HTTP steps can hop between worker processes. `after_step`:
        the step the caller last saw (a WebSocket's), refused if another client of this process
        stepped since, as a step another process logged first is."""
        if not session.lock.acquire(blocking=False):
            raise ApiError(409, "step_in_progress",
                           "another step on this episode is still running; one step at a time")
        try:
            runtime = session.runtime
            if runtime is None or (check_fresh and self._stale(runtime)):
                runtime = session.runtime = self._reload(session.episode_id)
            if after_step is not None and runtime.state.step != after_step:
                raise ApiError(409, "conflict", f"another client stepped this episode since this "
                               f"socket's step {after_step}; this action was not applied")
            try:
                info = runtime.step(action)
            except domain.EpisodeFinished:  # the domain refuses a step after the end
                raise _finished(session.episode_id) from None
            except ConcurrencyError:
                session.runtime = None  # its state ran ahead of the log: reload next time
                raise ApiError(409, "conflict", "another step on this episode was logged first "
                               "(by another process); this action was not applied") from None
            except ValueError as exc:  # too big for the log (a body limit over 1 MiB lets it in)
                raise ApiError(413, "action_too_large", f"{exc}; this action was not applied") from None
            except WriterBusy:  # nothing written and nothing applied: the copy is as good as before,
                raise  # and a step another process logs meanwhile stays a conflict, not built upon
            except BaseException:
                session.runtime = None
                raise
            session.last_used = time.monotonic()
            payload = self._payload(session, runtime, info, reward=info.reward)
        finally:
            session.lock.release()
        if runtime.state.done:
            self._ended_now(session.episode_id)
        return payload

    def _ended_now(self, episode_id: str) -> None:
        """Note an episode that just ended; past ENDED_KEPT of them, the one that ended first
        leaves the cache (its log answers a late /state): kept until the cache was full, ended
        episodes made a worker grow ~20 KB an episode, to 170 MB, with 8 running at a time."""
        with self._mutex:
            self._ended[episode_id] = None
            while len(self._ended) > ENDED_KEPT:
                oldest, _ = self._ended.popitem(last=False)
                session = self._cache.get(oldest)
                if session is not None and not session.attached and not session.lock.locked():
                    del self._cache[oldest]

    def state(self, session: Session) -> dict[str, Any]:
        """The state the log holds: the cached copy unless another process stepped it since."""
        return episode_state(self.refresh(session))

    def refresh(self, session: Session) -> EpisodeRuntime:
        """The episode as the log holds it, kept as the cached copy unless a step is running (it
        refreshes the copy itself). A socket resuming an episode calls it: steps over it skip the
        freshness query, so a copy another process stepped past would refuse its first step."""
        runtime = session.runtime
        if runtime is not None and session.lock.locked():
            # a step of this process is running on the copy, and the log is ahead of the copy
            # until it returns: wait for that step rather than load the whole episode again
            # (~0.5 s for 8,000 steps); on the event loop, stop here and wait on a thread
            if not WAIT_FOR_WRITERS.get():
                raise WriterBusy("a step on this episode is running")
            if session.lock.acquire(timeout=STEP_WAIT_S):
                runtime = session.runtime
                session.lock.release()
        if runtime is None or self._stale(runtime):
            runtime = self._reload(session.episode_id)
            if session.lock.acquire(blocking=False):
                session.runtime = runtime
                session.lock.release()
        return runtime

    def _stale(self, runtime: EpisodeRuntime) -> bool:
        # another process stepped the episode if the log moved past what this copy wrote
        return self.store.stream_version(runtime.episode_id) != runtime.stored_version

    def _reload(self, episode_id: str) -> EpisodeRuntime:
        try:
            return EpisodeRuntime.load(self.store, episode_id)
        except EpisodeNotFound:
            raise ApiError(404, "episode_not_found", f"no episode {episode_id!r}") from None
        except CorruptCommit as exc:
            raise log_damaged(exc) from None
        except UnknownRules as exc:
            raise ApiError(409, "unknown_rules", str(exc)) from None

    @staticmethod
    def _payload(session: Session, runtime: EpisodeRuntime, info: Any,
                 reward: float | None) -> dict[str, Any]:
        """OpenEnv's step/reset shape: observation, reward, done, metadata."""
        observation = runtime.observe(info)
        if session.text:
            observation = observation.with_text()
        state = runtime.state
        return {
            "observation": observation,
            "reward": reward,
            "done": bool(state.done),
            "metadata": {
                "episode_id": session.episode_id,
                "step": state.step,
                "outcome": info.outcome,
                "failure_mode": info.failure_mode,
                "rejected": info.rejected,
            },
        }


def _finished(episode_id: str) -> ApiError:
    return ApiError(409, "episode_finished",
                    f"episode {episode_id!r} has finished; reset to start a new one")
