"""`GET /analytics` and `GET /analytics/{name}`: named analytics questions over HTTP.

Only named queries run here, never SQL from the network: the name picks a vetted `.sql` file and
every query-string parameter is converted to its declared type and bound by DuckDB. Each request
first syncs the warehouse with the store, so answers are never stale.

Wire it in with `app.include_router(analytics_router(db_url))`.
"""

from __future__ import annotations

from collections.abc import Callable

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse

from analytics import service
from analytics.named import QueryError, UnknownQuery
from analytics.warehouse import WarehouseError
from api.querystring import RepeatedParameter, single_valued


def analytics_router(db: str | Callable[[], str], warehouse: str | None = None) -> APIRouter:
    """A router answering named queries over the store at `db` (a URL, or a function giving one)."""
    router = APIRouter(prefix="/analytics", tags=["Analytics"])

    def db_url() -> str:
        return db() if callable(db) else db

    @router.get("", summary="The named analytics questions and their parameters")
    async def catalogue() -> JSONResponse:
        return JSONResponse(service.describe())

    @router.get("/{name}", summary="Answer a named analytics question; parameters go in the query string",
                responses={400: {"description": "a parameter is unknown or ill-typed"},
                           404: {"description": "no named query has this name"},
                           503: {"description": "the warehouse is busy, another store's or unwritable"}})
    async def answer(name: str, request: Request) -> JSONResponse:
        try:
            params = single_valued(request.query_params.multi_items())
        except RepeatedParameter as exc:
            return _error(400, "invalid_param", str(exc))
        try:
            rows = await run_in_threadpool(service.answer, db_url(), name, params, warehouse)
        except UnknownQuery as exc:
            return _error(404, "unknown_query", str(exc))
        except QueryError as exc:
            return _error(400, "invalid_param", str(exc))
        except WarehouseError as exc:
            return _error(503, "warehouse_unavailable", str(exc))
        return JSONResponse(rows)

    return router


def _error(status: int, code: str, detail: str) -> JSONResponse:
    return JSONResponse({"detail": detail, "code": code}, status_code=status)
