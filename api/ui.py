"""`/ui`: a server-rendered web UI over the episode log and the analytics, for people.

Readers are people who train and evaluate agents and want to see what an agent did and why it
failed: the episode list, one episode's step-by-step timeline, the three apps at any step, and
the failure-mode report. Pages are plain HTML (no JavaScript, nothing fetched from elsewhere), so
they work offline and in any browser.

The UI answers with the same rules as the JSON endpoints because it calls the same code: the
list is `EpisodeLog.list` (the `GET /episodes` filters), an episode and its events come from
one read of its stream (`EpisodeLog.get_with_events`), a step's views from `EpisodeLog.views`,
and the report from `analytics.report`. What differs is only how a refusal is said: an HTML
page, in words, with the JSON endpoint's status. Query parameters are read as text and checked
here, so a bad one is a 400 page rather than FastAPI's JSON 422.

A browser form sends every field, empty ones too ("any task" is `task=`); empty fields mean "no
filter" and are dropped before the log is asked. (`GET /episodes?agent=` is refused as a filter
no episode can match; the form cannot leave a field out, so the UI reads it as unset.)

Wire it in with `app.include_router(ui_router(server.log, db_url))`. The API-key guard sits in
front of the whole app, so these pages need the key like every other route.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import quote

from fastapi import APIRouter, Depends, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from analytics import report, service
from analytics.stores import UnsyncableStore
from analytics.warehouse import WarehouseError
from api.analytics_routes import RETRY_AFTER_S, SYNC_WAIT_S  # as long as the JSON route waits and asks to
from api.episodes import EpisodeLog
from api.guard import proxy_root
from api.querystring import RepeatedParameter, single_valued, unknown_parameter, whole_number
from api.sessions import ApiError
from api.ui_html import ROOT_PATH, UI, episode_url, error_page, ui_href, url
from api.ui_pages import (
    analytics_page,
    episode_list,
    episode_page,
    rerun_page,
    syncing_page,
    views_page,
)
from api.ui_timeline import build_timeline
from domain import CHAOS_LEVELS
from domain.labels import hidden_bidi_controls
from eventstore import CorruptCommit, StoreUnavailable

PAGE_SIZE = 50
MAX_PAGE_SIZE = 500  # as GET /episodes
MAX_OFFSET = 10**9
MAX_POSITION = 2**63 - 1
"""The largest log position a cursor (`before`, `after`) may name, here and in GET /episodes."""
MAX_STEP = 10**6
LIST_WAIT_S = SYNC_WAIT_S
"""How long the list waits for the episodes read model to catch up before it shows what the read
model holds, with a note (after a big run the catch-up took 103 s, a blank page meanwhile); the
catch-up goes on, and a reload shows more."""


class BadParameter(ValueError):
    """A query parameter the UI cannot use; its message says which and why."""


def ui_router(log: EpisodeLog, db: str | Callable[[], str], warehouse: str | None = None) -> APIRouter:
    """The UI's routes over the server's episode log and the store at `db` (for the analytics)."""
    router = APIRouter(tags=["UI"], include_in_schema=False, dependencies=[Depends(_under_root_path)])

    @router.get("/")
    def home() -> RedirectResponse:
        """A person who opens the server's address in a browser lands on the episode list."""
        return RedirectResponse(ui_href())

    def db_url() -> str:
        return db() if callable(db) else db

    @router.get(UI, response_class=HTMLResponse)
    def episodes(request: Request) -> HTMLResponse:
        """The episode list, newest first, filtered and paged like GET /episodes."""
        try:
            params = _params(request, *LIST_FILTERS, "limit", "offset", "before", "after")
            filters = {k: params[k] for k in LIST_FILTERS if k in params}
            limit = _whole(params, "limit", PAGE_SIZE, 1, MAX_PAGE_SIZE)
            place = {"offset": _whole(params, "offset", 0, 0, MAX_OFFSET),
                     **{k: _whole(params, k, None, 0, MAX_POSITION) for k in ("before", "after")}}
            listing = log.list(**filters, limit=limit, **place, wait_s=LIST_WAIT_S)
        except BadParameter as exc:
            return error_page(400, str(exc))
        except ApiError as exc:
            return error_page(exc.status, exc.message)
        return episode_list(listing, _as_the_form_shows(filters),
                            {k: v for k, v in place.items() if v is not None and (v or k != "offset")})

    @router.get(UI + "/episodes/{episode_id}", response_class=HTMLResponse)
    def episode(episode_id: str, request: Request) -> HTMLResponse:
        """One episode: its summary and a page of its steps (`from`: the first step shown)."""
        try:
            first = _whole(_params(request, "from"), "from", 0, 0, MAX_STEP)
            summary, events = log.get_with_events(episode_id)
        except BadParameter as exc:
            return error_page(400, str(exc))
        except ApiError as exc:
            return error_page(exc.status, exc.message)
        timeline = build_timeline(events)
        last = timeline[-1].step
        if first > last:
            return error_page(404, f"episode {episode_id} has no step {first}: its steps are 0 to {last}",
                              (episode_url(episode_id), "the episode"))
        return episode_page(summary, timeline, first)

    @router.get(UI + "/episodes/{episode_id}/rerun", response_class=HTMLResponse)
    def rerun(episode_id: str, request: Request) -> HTMLResponse:
        """The episode re-simulated from its seed and actions, compared with the log by digest."""
        try:
            _params(request)
            result = log.rerun(episode_id)
        except BadParameter as exc:
            return error_page(400, str(exc))
        except ApiError as exc:
            return error_page(exc.status, exc.message)
        return rerun_page(result)

    @router.get(UI + "/episodes/{episode_id}/views", response_class=HTMLResponse)
    def views(episode_id: str, request: Request) -> HTMLResponse:
        """The three apps after step K (default: the last), as GET /episodes/{id}/views."""
        try:
            step = _whole(_params(request, "step"), "step", None, 0, MAX_STEP)
            result = log.views(episode_id, step)
        except BadParameter as exc:
            return error_page(400, str(exc), (episode_url(episode_id), "the episode"))
        except ApiError as exc:  # a step it does not have: back to the episode, which it has
            return error_page(exc.status, exc.message, (episode_url(episode_id), "the episode")
                              if exc.code == "step_not_found" else None)
        return views_page(result)

    @router.get(UI + "/analytics", response_class=HTMLResponse)
    async def analytics(request: Request) -> HTMLResponse:
        """The failure-mode report over the warehouse, synced with the store first."""
        try:
            filters = _params(request, "agent", "task", "chaos", "profile", "rules", "reload")
            if filters.setdefault("reload", "on") not in ("on", "off"):
                raise BadParameter(f"reload must be on or off, not {filters['reload']!r}")
            reloading = filters.pop("reload") == "on"
            report.check_filters(filters.get("agent"), filters.get("task"), filters.get("chaos"),
                                 filters.get("profile"), filters.get("rules"))
            filters = _as_the_form_shows(filters)  # the report's title says them as the form does
        except ValueError as exc:  # BadParameter included
            return error_page(400, str(exc), (ui_href("/analytics"), "the whole report"))
        try:
            # a long sync runs on in the background while the page says how far it got
            job = await service.sync_in_background(db_url(), warehouse, SYNC_WAIT_S)
            if job is not None:
                return syncing_page(job.described(), RETRY_AFTER_S, filters, reloading)
            # synced again, at almost no cost: the job may have ended long before this request
            data = await run_in_threadpool(report_data, db_url(), warehouse, filters)
        except (WarehouseError, UnsyncableStore, StoreUnavailable) as exc:
            return error_page(503, f"the analytics warehouse cannot be used: {exc}")
        except CorruptCommit as exc:
            return error_page(500, f"{exc}; `companyos verify` names every damaged episode")
        return analytics_page(report.html_body(data, episode_href=episode_url,
                                               mode_href=_mode_list(filters)), filters)

    @router.get(UI + "/{rest:path}", response_class=HTMLResponse)
    def not_found(rest: str, request: Request) -> Response:
        """Any other /ui/... path: a page that says so; one ending in a slash leads to the page
        without it (`/ui/` is the list, `/ui/episodes/x/` the episode: it was a 404), and
        `/ui/episodes`, the address a person guesses for the list, to the list."""
        target = rest.rstrip("/")
        if target == "episodes":  # `/ui/episodes/` led to `/ui/episodes`, a 404 page
            target, rest = "", ""
        # `rest` is decoded: sent back as it is, `%3F` became a real query and `%2E%2E` a step
        # out of the UI (`/ui/../episodes`, the JSON API)
        if (not rest or rest.endswith("/")) and not {".", ".."} & set(target.split("/")):
            query = request.url.query
            return RedirectResponse(ui_href(f"/{quote(target, safe='/')}" if target else "")
                                    + (f"?{query}" if query else ""))
        return error_page(404, f"there is no UI page at {ui_href('/' + rest)}")

    return router


async def _under_root_path(request: Request) -> None:
    """Links under the proxy's prefix (`serve --root-path`). Async, so it sets the variable in the
    request's own context, which the handler (on a worker thread or not) runs in."""
    ROOT_PATH.set(proxy_root(request.scope))


def report_data(db_url: str, warehouse: str | None, filters: dict[str, str]) -> dict[str, Any]:
    """The report's data over the warehouse, synced with the store first (as GET /analytics/{name});
    `filters`: agent, task, chaos, profile and rules, each optional."""
    with service.synced(db_url, warehouse) as wh:
        return report.build(wh, **filters)


def _params(request: Request, *takes: str) -> dict[str, str]:
    """The query's parameters, one value each, each one the page `takes` (a typo would otherwise
    show believable, unfiltered data); empty or blank ones (a form's "any", a stray space typed
    in a field) left out."""
    try:
        params = single_valued(request.query_params.multi_items())
    except RepeatedParameter as exc:
        raise BadParameter(str(exc)) from None
    problem = unknown_parameter("this page", params, takes)
    if problem:
        raise BadParameter(problem)
    given = {k: v.strip() for k, v in params.items() if v.strip() != ""}
    if "agent" in given:  # typed as the pages show a label: a bidirectional control as its escape
        given["agent"] = hidden_bidi_controls(given["agent"])
    return given


LIST_FILTERS = ("task", "agent", "outcome", "failure_mode", "rules")
"""What the episode list filters by, as GET /episodes does."""


def _mode_list(filters: dict[str, str]) -> Callable[[str, str | None], str] | None:
    """The address of the list of a failure mode's episodes under the report's filters (and the
    row's agent, in a table by agent), or None when the list cannot apply them all (it filters by
    no chaos level or profile), so a link never leads to more episodes than the report counted."""
    if set(filters) - set(LIST_FILTERS):
        return None
    return lambda mode, agent=None: url(ui_href(), {**filters, **({"agent": agent} if agent else {}),
                                                    "failure_mode": mode})


def _as_the_form_shows(filters: dict[str, str]) -> dict[str, str]:
    """Accepted filters as the form's choices write them (`rules=01` is version 1, `chaos=LOW` is
    low): as given, the select showed "any" beside a filtered list, or offered LOW beside low, and
    the next Filter dropped or doubled the filter."""
    shown = dict(filters)
    if "rules" in shown and (version := whole_number(shown["rules"])) is not None:
        shown["rules"] = str(version)
    if shown.get("chaos", "").lower() in CHAOS_LEVELS:
        shown["chaos"] = shown["chaos"].lower()
    return shown


def _whole(params: dict[str, str], name: str, default: Any, lo: int, hi: int) -> Any:
    """A whole-number parameter within [lo, hi], or `default` when it is absent."""
    raw = params.get(name)
    if raw is None:
        return default
    number = whole_number(raw)
    if number is None or not lo <= number <= hi:
        raise BadParameter(f"{name} must be a whole number from {lo} to {hi}, not {raw!r}")
    return number
