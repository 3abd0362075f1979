"""HTML building blocks of the web UI: escaping, the page shell, tables, JSON, error pages.

Everything a user (or an agent) controls reaches the page through `esc` or `text_cell`, never
by string concatenation: agent labels, actions and rejection reasons are arbitrary text, and a
page that pasted them in raw would run whatever script an agent sent. Markup built here is
wrapped in `Markup`, so the table helpers can tell "already safe HTML" from "text to escape" and
escaping is the default rather than something each caller must remember.

The pages need no JavaScript, fonts or other files: the machines that look at them are often
offline, so the CSS is inline and the headers forbid loading anything else.
"""

from __future__ import annotations

import html
import json
from collections.abc import Iterable, Mapping
from contextvars import ContextVar
from typing import Any
from urllib.parse import quote, urlencode

from fastapi.responses import HTMLResponse

from analytics.report import number_text, scroll_region
from domain.chaos import level_text
from domain.labels import visible_bidi_controls

CSP = ("default-src 'none'; style-src 'unsafe-inline'; img-src data:; "
       "form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
"""Nothing but inline styles and data: images: the SVG charts are inline markup, not scripts.
form-action, frame-ancestors and base-uri do not fall back to default-src, so they are said too."""

HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff",
           "Referrer-Policy": "no-referrer", "Cache-Control": "no-store"}

UI = "/ui"

ROOT_PATH: ContextVar[str] = ContextVar("ui_root_path", default="")
"""The prefix a reverse proxy mounts the server under (ASGI's root_path, `serve --root-path`), set
per request by the UI's routes and the guard. A context variable, not a parameter of every page
builder: every link on every page needs it, and it is the same for the whole request."""


def ui_href(suffix: str = "") -> str:
    """A UI address as the browser must ask for it: under the proxy's prefix."""
    return ROOT_PATH.get() + UI + suffix


_CSS = """
body{font-family:system-ui,sans-serif;margin:0 auto;max-width:1200px;color:#222;padding:0 1rem 2rem}
nav{display:flex;flex-wrap:wrap;gap:.4rem 1.2rem;align-items:center;padding:.6rem 0;
border-bottom:1px solid #ddd;margin-bottom:1rem}
nav b{margin-right:1rem}nav a{text-decoration:none}
h1{font-size:1.4rem;overflow-wrap:anywhere}h2{font-size:1.1rem;margin-top:1.6rem;border-bottom:1px solid #ddd}
h3{font-size:1rem}
.scroll{overflow-x:auto;max-width:100%}
table{border-collapse:collapse;font-size:.85rem;margin:.5rem 0}
td,th{border:1px solid #ddd;padding:3px 8px;text-align:left;vertical-align:top;overflow-wrap:break-word}
th{background:#f5f5f5;white-space:nowrap}
td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
td.free{overflow-wrap:anywhere;min-width:8em}
code,pre{font-family:ui-monospace,monospace;font-size:.8rem}
pre{background:#f7f7f7;padding:.5rem;overflow-x:auto;white-space:pre-wrap;word-break:break-word}
td code{white-space:pre-wrap;word-break:break-word}
dl.summary{display:grid;grid-template-columns:max-content minmax(0,1fr);gap:.2rem 1rem}
dl.summary dt{font-weight:bold}dl.summary dd{margin:0;overflow-wrap:anywhere}
dl.summary code{white-space:pre-wrap;overflow-wrap:anywhere}
form.filters{display:flex;gap:.8rem;flex-wrap:wrap;align-items:end;margin:.5rem 0}
form.filters label{display:flex;flex-direction:column;font-size:.8rem}
.pager{display:flex;gap:1.5rem;margin:.6rem 0}
.rejected{background:#fff4e0}.mistake{background:#fde8e8}.chaos{color:#8a4b00}
.ok{color:#116329}.bad{color:#b42318}.muted{color:#595959}p.muted{overflow-wrap:anywhere}
td b,td code{unicode-bidi:isolate}
.error{background:#fde8e8;border:1px solid #f3b4b4;padding:.8rem 1rem;border-radius:6px;
overflow-wrap:anywhere}select{max-width:100%}
"""


class Markup(str):
    """HTML that is already safe to put in a page (built here from escaped parts)."""


def esc(value: Any) -> str:
    """Text as HTML (quotes too, so the result is also safe inside an attribute), bidirectional
    controls shown as escapes (domain.labels.visible_bidi_controls): an override reversed what a
    step's parameters, a rejection or an agent's label read as."""
    return html.escape(visible_bidi_controls("" if value is None else str(value)), quote=True)


def text_cell(value: Any) -> str:
    """What a table cell shows: Markup as is, JSON structures as JSON, anything else as text."""
    if isinstance(value, Markup):
        return value
    if isinstance(value, dict | list):
        return f"<code>{esc(json_text(value))}</code>"
    if isinstance(value, float):
        return esc(number(value))
    return esc(value)


def number(value: float | int | None) -> str:
    """A number for people, as the report writes them: no float noise (-15.499999999999995 shows
    as -15.5) and no exponent hiding a magnitude."""
    if value is None:
        return ""
    if isinstance(value, float):
        return number_text(value)
    return str(value)


def level(value: float | None) -> str:
    """A chaos level exactly (0.30000000000000004 is not 0.3): what reruns it is what is shown."""
    return "" if value is None else level_text(value)


def json_text(value: Any, indent: int | None = None) -> str:
    """A JSON value as text. The stdlib encoder, not orjson: an agent's action may hold any JSON
    (integers past 64 bits among it), and showing it must not be what fails."""
    if indent is None:
        return json.dumps(value, ensure_ascii=False, separators=(", ", ": "), default=str)
    return json.dumps(value, ensure_ascii=False, indent=indent, default=str)


def pre_json(value: Any) -> Markup:
    return Markup(f"<pre>{esc(json_text(value, indent=2))}</pre>")


def link(href: str, label: Any) -> Markup:
    return Markup(f'<a href="{esc(href)}">{text_cell(label)}</a>')


def url(path: str, params: Mapping[str, Any] | None = None) -> str:
    """A UI URL; parameters that are None or empty are left out."""
    kept = {k: v for k, v in (params or {}).items() if v is not None and v != ""}
    return path + ("?" + urlencode(kept) if kept else "")


def episode_url(episode_id: str) -> str:
    return ui_href(f"/episodes/{quote(episode_id, safe='')}")


def views_url(episode_id: str, step: int) -> str:
    return url(f"{episode_url(episode_id)}/views", {"step": step})


def table(headers: Iterable[str], rows: Iterable[Iterable[Any]], *,
          row_attrs: Iterable[str] | None = None, numeric: frozenset[int] = frozenset(),
          free_text: frozenset[int] = frozenset()) -> Markup:
    """A table; cells go through `text_cell`. `row_attrs` are trusted attribute strings. Columns
    in `free_text` (labels and ids the user chose) may break anywhere: 100 characters without a
    space pushed the other columns off the screen."""
    headers = list(headers)
    head = "".join(f"<th scope='col'>{esc(h)}</th>" for h in headers)
    attrs = iter(row_attrs) if row_attrs is not None else None
    body = []
    for row in rows:
        attr = next(attrs) if attrs is not None else ""
        cells = "".join(f'<td class="num">{text_cell(c)}</td>' if i in numeric
                        else f'<td class="free">{text_cell(c)}</td>' if i in free_text
                        else f"<td>{text_cell(c)}</td>" for i, c in enumerate(row))
        body.append(f"<tr{' ' + attr if attr else ''}>{cells}</tr>")
    # in a box that scrolls sideways on a narrow screen, rather than squeezing every column; a
    # focusable, named region, so a keyboard can scroll it in every browser
    return Markup(f'<div class="scroll" {scroll_region("table of " + ", ".join(headers))}><table>'
                  f"<thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table></div>")


def summary_list(pairs: Iterable[tuple[str, Any]]) -> Markup:
    return Markup('<dl class="summary">' + "".join(f"<dt>{esc(k)}</dt><dd>{text_cell(v)}</dd>"
                                                   for k, v in pairs) + "</dl>")


def select(name: str, label: str, choices: Iterable[str], chosen: str | None) -> Markup:
    """A select with an "any" choice first (sent as an empty field, which the routes drop)."""
    options = ['<option value="">any</option>']
    for choice in choices:
        mark = " selected" if choice == chosen else ""
        options.append(f'<option value="{esc(choice)}"{mark}>{esc(choice)}</option>')
    return Markup(f'<label>{esc(label)}<select name="{esc(name)}">{"".join(options)}</select></label>')


def text_input(name: str, label: str, value: str | None) -> Markup:
    # a bidirectional control shown as its escape, as in the tables (raw, an override made the box
    # read evil00001 for evil\u202e10000); the routes read the escape back (ui._params)
    return Markup(f'<label>{esc(label)}<input type="text" name="{esc(name)}" value="{esc(value)}"></label>')


def nav() -> Markup:
    return Markup(f'<nav><b>CompanyOS</b><a href="{esc(ui_href())}">Episodes</a>'
                  f'<a href="{esc(ui_href("/analytics"))}">Analytics</a>'
                  f'<a href="{esc(ROOT_PATH.get())}/docs">API docs</a></nav>')


def page(title: str, body: str, *, status: int = 200, head: str = "") -> HTMLResponse:
    """A whole page: nav bar, title, body (trusted markup); `head` is extra trusted <head> markup."""
    return HTMLResponse(document(title, body, head), status_code=status, headers=HEADERS)


def document(title: str, body: str, head: str = "") -> str:
    return ("<!doctype html><html lang='en'><head><meta charset='utf-8'>"
            "<meta name='viewport' content='width=device-width, initial-scale=1'>"
            f"<title>{esc(title)} · CompanyOS</title>{head}<style>{_CSS}</style></head>"
            f"<body>{nav()}<main>{body}</main></body></html>")


_TITLES = {400: "Bad request", 401: "API key needed", 403: "Wrong API key", 404: "Not found",
           405: "Method not allowed", 413: "Too large", 500: "Server error", 503: "Unavailable"}


def error_page(status: int, message: str, back: tuple[str, str] | None = None) -> HTMLResponse:
    """The UI's error page: the status and what went wrong, in words, and a link back to where the
    reader came from (`back`: its address and name; the episode list when there is none)."""
    return HTMLResponse(error_document(status, message, back), status_code=status, headers=HEADERS)


def error_document(status: int, message: str, back: tuple[str, str] | None = None) -> str:
    """The error page's HTML; the API-key guard sends it too, as plain ASGI."""
    title = _TITLES.get(status, "Error")
    href, name = back or (ui_href(), "the episode list")
    body = (f"<h1>{status} {esc(title)}</h1><p class='error'>{esc(message)}</p>"
            f"<p><a href='{esc(href)}'>Back to {esc(name)}</a></p>")
    return document(title, body)


def is_ui_path(path: str) -> bool:
    """The pages a browser asks for: the UI, the root that leads there, and the API docs the UI
    links to (refused as JSON, the UI's "API docs" link led to a 401 in JSON)."""
    return path == "/" or path == UI or path.startswith(UI + "/") or path in DOC_PAGES


DOC_PAGES = frozenset({"/docs", "/redoc"})
