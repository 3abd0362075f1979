"""`/docs` and `/redoc`: the API docs (Swagger UI, ReDoc) served from an installed package, not a CDN.

FastAPI's default page loads Swagger UI's script and style from cdn.jsdelivr.net, so on a machine
without internet (where this product is meant to run) the "API docs" link in every UI page opened
a blank page. The `fastapi-offline` package ships those files (Swagger UI 5, which reads the
OpenAPI 3.1 that FastAPI writes); they are served under `/docs/assets/`, behind the same API key
as the rest.
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel

DOCS = "/docs"
ASSETS = DOCS + "/assets"
HEADERS = {"Content-Security-Policy": "frame-ancestors 'none'", "X-Frame-Options": "DENY",
           "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer"}
"""The docs pages are not to be framed by another site (clickjacking) nor leak their URL: as the
UI's pages. Their scripts are Swagger UI's and ReDoc's own, inline ones included, so no script
policy is set beyond what they need (none)."""


def add_api_docs(app: FastAPI) -> None:
    """Serve Swagger UI at /docs and ReDoc at /redoc from local files (create the app with
    `docs_url=None, redoc_url=None`)."""
    from importlib.resources import files

    assets = files("fastapi_offline") / "static"  # the package's data: Swagger UI's files
    app.mount(ASSETS, StaticFiles(directory=str(assets)), name="swagger-ui-assets")
    oauth2_redirect = DOCS + "/oauth2-redirect"

    @app.get(DOCS, include_in_schema=False)
    async def docs(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "").rstrip("/")  # behind a proxy's path prefix
        return _guarded(get_swagger_ui_html(
            openapi_url=root + (app.openapi_url or "/openapi.json"), title=f"{app.title} - API docs",
            swagger_js_url=f"{root}{ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{root}{ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{root}{ASSETS}/favicon.png",
            oauth2_redirect_url=root + oauth2_redirect))

    @app.get(oauth2_redirect, include_in_schema=False)
    async def docs_oauth2_redirect() -> HTMLResponse:
        return _guarded(get_swagger_ui_oauth2_redirect_html())

    @app.get("/redoc", include_in_schema=False)
    async def redoc(request: Request) -> HTMLResponse:
        """The same reference as ReDoc renders it (the package ships its script too)."""
        root = request.scope.get("root_path", "").rstrip("/")
        return _guarded(get_redoc_html(openapi_url=root + (app.openapi_url or "/openapi.json"),
                                       title=f"{app.title} - API reference", with_google_fonts=False,
                                       redoc_js_url=f"{root}{ASSETS}/redoc.standalone.js",
                                       redoc_favicon_url=f"{root}{ASSETS}/favicon.png"))


def _guarded(page: HTMLResponse) -> HTMLResponse:
    page.headers.update(HEADERS)
    return page


_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")


def with_exact_bounds(document: dict, models: dict[str, type[BaseModel]]) -> dict:
    """`document` (FastAPI's OpenAPI) with the numeric bounds of `models`' schemas as Pydantic states
    them. FastAPI's OpenAPI model holds every bound as a float, so the seed's maximum, 2**63 - 1,
    was published as 9.223372036854776e+18 (2**63): a seed the document allowed was refused, and a
    whole-number bound read as 0.0 where the models say 0."""
    schemas = document.get("components", {}).get("schemas", {})
    for name, model in models.items():
        if name in schemas:
            _restore_bounds(schemas[name], model.model_json_schema(ref_template="{model}"))
    return document


def _restore_bounds(published: object, exact: object) -> None:
    """Walk both schemas together, copying `exact`'s bounds into `published` where both hold one."""
    if isinstance(published, dict) and isinstance(exact, dict):
        for key in _BOUNDS:
            if key in published and isinstance(exact.get(key), int | float):
                published[key] = exact[key]
        for key, value in published.items():
            if key in exact:
                _restore_bounds(value, exact[key])
    elif isinstance(published, list) and isinstance(exact, list) and len(published) == len(exact):
        for a, b in zip(published, exact, strict=True):
            _restore_bounds(a, b)
