"""`GET /analytics` and `GET /analytics/{name}`: named analytics questions over HTTP.

Only named queries run here, never SQL from the network: the name picks a vetted `.sql` file and
every query-string parameter is converted to its declared type and bound by DuckDB. Each request
first syncs the warehouse with the store, so answers are never stale. A sync that takes longer
than the caller is willing to wait (2 s, or `Prefer: wait=N`) goes on in the background and the
request answers 202 with how far it got, as the web UI's report page does.

Wire it in with `app.include_router(analytics_router(db_url))`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Path, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from analytics import named, service
from analytics.named import QueryError, UnknownQuery
from analytics.stores import UnsyncableStore
from analytics.warehouse import WarehouseError
from api.models import ERROR_RESPONSES, ErrorBody
from api.querystring import STRICT_QUERY, RepeatedParameter, single_valued, whole_number
from eventstore import CorruptCommit, StoreUnavailable

SYNC_WAIT_S = 2.0
"""How long a request waits for a sync before answering 202 (the UI's report page waits as long)."""
MIN_WAIT_S = 0.1
"""The least wait, `Prefer: wait=0` included: what a sync with nothing new needs (milliseconds), so
an up-to-date warehouse answers at once instead of always 202."""
MAX_WAIT_S = 600.0
"""The longest `Prefer: wait` honoured. A waiting request holds no server thread (it awaits the
sync on the event loop), but proxies and clients rarely keep a request open for longer."""
RETRY_AFTER_S = 2
"""When to ask again while a sync runs (the UI's progress page reloads itself as often)."""


class SyncingBody(BaseModel):
    """A 202: the warehouse is still syncing with the store."""

    detail: str = Field(description="how far the sync got, in words")
    code: str = Field(description="always `syncing`")
    synced_events: int = Field(description="events moved so far")
    total_events: int | None = Field(description="events to move, when known")


_JSON_TYPES = {"INTEGER": "integer", "DOUBLE": "number", "BOOLEAN": "boolean", "RULES": "integer"}


def _query_parameters() -> list[dict[str, Any]]:
    """Every query-string parameter a named query takes, for the API's document, saying which
    queries take it and how (the document listed only the name, so a client generated from it
    could pass none)."""
    uses: dict[str, dict[str, list[str]]] = {}  # parameter -> its meaning and terms -> queries
    kinds: dict[str, set[str]] = {}
    for query in named.registry().values():
        for param in query.params:
            said = f"{param.doc} ({param.type.lower()}, {param.terms()})"
            uses.setdefault(param.name, {}).setdefault(said, []).append(query.name)
            kinds.setdefault(param.name, set()).add(_JSON_TYPES.get(param.type, "string"))
    return [{"name": name, "in": "query", "required": False,
             "schema": {"type": next(iter(kinds[name]))} if len(kinds[name]) == 1 else {},
             "description": "; ".join(f"{said}: {', '.join(queries)}" for said, queries in meanings.items())
                            + ". A query that takes no such parameter refuses it (400)."}
            for name, meanings in sorted(uses.items())]


def _responses(described: dict[int, str]) -> dict[int | str, dict[str, Any]]:
    """Error statuses shaped like ErrorBody with this route's own words, and the API key's."""
    return {**ERROR_RESPONSES(401, 403),
            **{code: {"model": ErrorBody, "description": text} for code, text in described.items()}}


def analytics_router(db: str | Callable[[], str], warehouse: str | None = None) -> APIRouter:
    """A router answering named queries over the store at `db` (a URL, or a function giving one)."""
    router = APIRouter(prefix="/analytics", tags=["Analytics"])

    def db_url() -> str:
        return db() if callable(db) else db

    @router.get("", summary="The named analytics questions and their parameters",
                dependencies=STRICT_QUERY, responses=_responses({400: "it takes no query parameter"}))
    async def catalogue() -> JSONResponse:
        return JSONResponse(service.describe())

    @router.get("/{name}", summary="Answer a named analytics question; parameters go in the query string",
                description="The warehouse is synced with the store first. A sync that takes longer "
                            "than 2 s (or the seconds of a `Prefer: wait=N` header, up to 600) goes on "
                            "in the background, and the answer is 202 with how far it got and a "
                            "Retry-After header: ask again then.",
                openapi_extra={"parameters": _query_parameters()},
                responses={200: {"description": "the answer: a list of row objects, one key per column",
                                 "content": {"application/json": {"schema": {
                                     "type": "array", "items": {"type": "object"}}}}},
                           202: {"model": SyncingBody, "description": "still syncing; ask again after "
                                 "Retry-After", "headers": {"Retry-After": {
                                     "description": "seconds", "schema": {"type": "integer"}}}},
                           **_responses({400: "a parameter is unknown, repeated or ill-typed",
                                         404: "no named query has this name",
                                         500: "the store holds damaged data",
                                         503: "the warehouse is busy, another store's or unwritable; "
                                              "or the store's database does not answer"})})
    async def answer(name: Annotated[str, Path(description="the named query: "
                                                  + ", ".join(named.registry()))],
                     request: Request) -> JSONResponse:
        try:
            params = single_valued(request.query_params.multi_items())
            named.get(name).bind(params)  # the caller's mistakes are said before any sync
        except RepeatedParameter as exc:
            return _error(400, "invalid_param", str(exc))
        except UnknownQuery as exc:
            return _error(404, "unknown_query", str(exc))
        except QueryError as exc:
            return _error(400, "invalid_param", str(exc))
        wait_s, preferred = preferred_wait(request.headers.get("prefer"))
        # delta-seconds, as RFC 7240 writes them: `wait=0` is honoured as the least wait (0.1 s)
        applied = {"Preference-Applied": f"wait={int(wait_s)}"} if preferred else {}
        try:
            job = await service.sync_in_background(db_url(), warehouse, wait_s)
            if job is not None:
                return JSONResponse(
                    {"detail": f"the analytics warehouse is syncing with the store: {job.described()}; "
                               f"ask again in {RETRY_AFTER_S} s, or send `Prefer: wait=<seconds>` to wait "
                               "for the answer",
                     "code": "syncing", "synced_events": job.done, "total_events": job.total},
                    status_code=202, headers={"Retry-After": str(RETRY_AFTER_S), **applied})
            # synced again: only what the store gained since a sync begun during this request
            rows = await run_in_threadpool(service.answer, db_url(), name, params, warehouse)
        except WarehouseError as exc:
            return _error(503, "warehouse_unavailable", str(exc))
        except (UnsyncableStore, StoreUnavailable) as exc:
            return _error(503, "store_unavailable", str(exc))
        except CorruptCommit as exc:
            return _error(500, "corrupt_store", f"{exc}; `companyos verify` names every damaged episode")
        return JSONResponse(rows, headers=applied)

    return router


def preferred_wait(prefer: str | None) -> tuple[float, bool]:
    """The seconds to wait for a sync, from an RFC 7240 `Prefer: wait=N` header (capped at
    MAX_WAIT_S, at least MIN_WAIT_S), and whether the header asked; a missing or malformed
    preference waits SYNC_WAIT_S."""
    for preference in (prefer or "").split(","):
        token, _, value = preference.split(";")[0].partition("=")
        if token.strip().lower() != "wait":
            continue
        seconds = whole_number(value.strip().strip('"'))  # delta-seconds: digits only (not "²")
        if seconds is not None:
            return min(max(float(seconds), MIN_WAIT_S), MAX_WAIT_S), True
    return SYNC_WAIT_S, False


def _error(status: int, code: str, detail: str) -> JSONResponse:
    return JSONResponse({"detail": detail, "code": code}, status_code=status)
