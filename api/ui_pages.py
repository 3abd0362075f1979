"""The UI's pages as HTML: episode list, one episode's timeline, the apps at a step, analytics.

Each function takes what the episode log (or the report) already answered and returns the page;
none of them reads the store, so the routes decide what is fetched and how errors are said.
"""

from __future__ import annotations

from typing import Any

from fastapi.responses import HTMLResponse

from analytics.report import REPORT_CSS
from api.ui_html import (
    Markup,
    episode_url,
    esc,
    json_text,
    level,
    link,
    number,
    page,
    pre_json,
    select,
    summary_list,
    table,
    text_cell,
    text_input,
    ui_href,
    url,
    views_url,
)
from api.ui_timeline import Step
from domain import CHAOS_LEVELS, FAILURE_MODES, REWARD_PROFILES, RULES_VERSIONS, TASK_FAMILIES
from domain.tools import APPS
from projections.episodes import OUTCOMES, UNKNOWN_AGENT
from projections.rerun import mismatch_line


def _outcome(outcome: str | None) -> Markup:
    if outcome is None:
        return Markup("<span class='muted'>running</span>")
    css = "ok" if outcome == "success" else "bad"
    return Markup(f"<span class='{css}'>{esc(outcome)}</span>")


def _failure(mode: str | None) -> Markup:
    """A failure mode with its meaning on hover (the taxonomy's words)."""
    if not mode:
        return Markup("")
    meaning = FAILURE_MODES.get(mode, "")
    return Markup(f"<span title='{esc(meaning)}'>{esc(mode)}</span>")


# -- the episode list ---------------------------------------------------------------------------


PAGE_SIZES = (50, 100, 200, 500)
"""The list's page sizes on offer (GET /episodes takes up to 500): 232,000 episodes at 50 a page
were 4,640 clicks from end to end, and `limit` could be set only in the address."""


def _page_size(limit: int) -> Markup:
    sizes = sorted({*PAGE_SIZES, limit})  # an address's own size stays chosen
    options = "".join(f'<option value="{n}"{" selected" if n == limit else ""}>{n}</option>' for n in sizes)
    return Markup(f'<label>per page<select name="limit">{options}</select></label>')


def episode_list(listing: dict[str, Any], filters: dict[str, str],
                 place: dict[str, int] | None = None) -> HTMLResponse:
    """`GET /ui`: the listing (as `GET /episodes` answers it), a filter form and a pager. `place`:
    the page's `offset`, `before` or `after` as its address gave them, for a reload link."""
    place = place or {}
    form = Markup(
        f'<form class="filters" method="get" action="{esc(ui_href())}">'
        + select("task", "task", TASK_FAMILIES, filters.get("task"))
        + text_input("agent", "agent", filters.get("agent"))
        + select("outcome", "outcome", OUTCOMES, filters.get("outcome"))
        + select("failure_mode", "failure mode", list(FAILURE_MODES), filters.get("failure_mode"))
        + select("rules", "rules", [str(v) for v in RULES_VERSIONS], filters.get("rules"))
        + _page_size(listing["limit"])
        + '<button type="submit">Filter</button>'
        + f'<a href="{esc(ui_href())}">clear</a></form>')
    rows = [[link(episode_url(e["episode_id"]), e["episode_id"]), e["task"], e["agent"] or UNKNOWN_AGENT,
             _outcome(e["outcome"]), _failure(e["failure_mode"]), e["steps"],
             number(e["total_return"]), e["seed"], level(e["chaos"]), e["rules"], e["started_at"]]
            for e in listing["episodes"]]
    newer, total = listing["newer"], listing["total"]
    shown = (f"episodes {newer + 1}–{newer + len(rows)} of {total}" if rows
             else f"no episodes on this page ({total} match)" if total else "No episodes match.")
    body = [f"<h1>Episodes</h1>{form}<p>{esc(shown)}</p>"]
    if listing.get("catching_up"):
        again = url(ui_href(), {**filters, "limit": listing["limit"], **place})
        body.append(f"<p role='status'>The list is catching up with the log: "
                    f"{listing['read_models_behind']:,} events are not listed yet. The catch-up goes "
                    f"on meanwhile; {link(again, 'reload the page')} to see more.</p>")
    elif behind := listing.get("read_models_behind"):
        body.append(f"<p class='muted'>The read models are {behind} events behind the log, and the "
                    "store's database takes no writes (a standby?), so they cannot be brought up to "
                    "date: the episodes logged since are not listed.</p>")
    if rows:
        body.append(table(["episode", "task", "agent", "outcome", "failure mode", "steps", "return",
                           "seed", "chaos", "rules", "started"], rows, numeric=frozenset({5, 6, 7, 8, 9}),
                           free_text=frozenset({0, 2})))
    body.append(_pager(listing, filters))
    return page(_list_title(filters, newer, len(rows)), "".join(body))


def _list_title(filters: dict[str, str], newer: int, shown: int) -> str:
    """The list's title names its filters and rows: every page read "Episodes", so the browser's
    history held a row of look-alikes."""
    narrowed = ", ".join(f"{k} {v}" for k, v in filters.items())
    rows = f"{newer + 1}–{newer + shown}" if shown else "none"
    return f"Episodes ({narrowed}; {rows})" if narrowed else f"Episodes ({rows})"


OLDEST = 0
"""`after` for the oldest page: every episode began after log position 0."""


def _pager(listing: dict[str, Any], filters: dict[str, str]) -> Markup:
    """Links by the listing's cursors, which hold still while episodes are logged: paged by offset,
    10 episodes logged meanwhile made "older →" repeat 10 rows."""
    limit, total, newer = listing["limit"], listing["total"], listing["newer"]
    keep = {**filters, "limit": limit}
    parts = []
    if not listing["episodes"]:
        if total:  # past either end (an edited or old address): one step on would still be empty
            parts.append(link(url(ui_href(), keep), "« the newest episodes"))
            parts.append(link(url(ui_href(), {**keep, "after": OLDEST}), "the oldest episodes »"))
        return Markup(f"<div class='pager'>{''.join(parts)}</div>")
    if listing["prev_after"] is not None:
        if newer > limit:
            parts.append(link(url(ui_href(), keep), "« newest"))
        parts.append(link(url(ui_href(), {**keep, "after": listing["prev_after"]}), "← newer"))
    if listing["next_before"] is not None:
        parts.append(link(url(ui_href(), {**keep, "before": listing["next_before"]}), "older →"))
        if total - newer - len(listing["episodes"]) > limit:
            parts.append(link(url(ui_href(), {**keep, "after": OLDEST}), "oldest »"))
    return Markup(f"<div class='pager'>{''.join(parts)}</div>")


# -- one episode --------------------------------------------------------------------------------


TIMELINE_PAGE = 200
"""Steps per timeline page: a 10,000-step episode would be one page of tens of megabytes."""


def timeline_url(episode_id: str, step: int) -> str:
    """The episode's page whose timeline shows `step`, scrolled to it."""
    first = step - step % TIMELINE_PAGE
    return url(episode_url(episode_id), {"from": first or None}) + f"#step-{step}"


def _step_link(episode_id: str, step: int) -> Markup:
    """The timeline's step number, linking to the apps after it; named in full for a screen
    reader's list of links, where "0", "1", "2" said nothing."""
    return Markup(f'<a href="{esc(views_url(episode_id, step))}" '
                  f'aria-label="the apps after step {step}">{step}</a>')


def episode_page(summary: dict[str, Any], timeline: list[Step], first: int = 0) -> HTMLResponse:
    """`GET /ui/episodes/{id}?from=K`: the summary, then what steps K to K+199 did and led to."""
    episode_id = summary["episode_id"]
    pairs = [("episode", episode_id), ("task", summary.get("task")), ("seed", summary.get("seed")),
             ("chaos", level(summary.get("chaos"))), ("agent", summary.get("agent") or UNKNOWN_AGENT),
             ("reward profile", summary.get("reward_profile")), ("rules", summary.get("rules")),
             ("outcome", _outcome(summary.get("outcome"))),
             ("failure mode", _failure_line(summary.get("failure_mode"))),
             ("return", number(summary.get("total_return"))),
             ("steps", f"{summary.get('steps')} of {summary.get('max_steps')}"),
             ("events", summary.get("events")),
             ("digest", Markup(f"<code>{esc(summary.get('digest'))}</code>")),
             ("started", summary.get("started_at")), ("ended", summary.get("ended_at") or "—"),
             ("goal", summary.get("goal"))]
    last = timeline[-1].step
    shown = [s for s in timeline if first <= s.step < first + TIMELINE_PAGE]
    pager = _timeline_pager(episode_id, first, last) if first or last >= TIMELINE_PAGE else ""
    body = [f"<h1>Episode {esc(episode_id)}</h1>", summary_list(pairs),
            f"<p>{link(views_url(episode_id, last), 'The apps after the last step')} · "
            f"{link(episode_url(episode_id) + '/rerun', 'Re-simulate it and check the digest')}</p>",
            "<h2>Timeline</h2>", pager, _timeline_table(episode_id, shown), pager]
    steps = f", steps {first}–{min(first + TIMELINE_PAGE - 1, last)}" if pager else ""
    return page(f"Episode {episode_id}{steps}", "".join(body))


def _timeline_pager(episode_id: str, first: int, last: int) -> Markup:
    here = episode_url(episode_id)
    parts = [f"<span class='muted'>steps {first} to {min(first + TIMELINE_PAGE, last + 1) - 1} "
             f"of 0 to {last}</span>"]
    if first > 0:
        parts.append(link(url(here, {"from": max(0, first - TIMELINE_PAGE) or None}), "← earlier steps"))
    if first + TIMELINE_PAGE <= last:
        parts.append(link(url(here, {"from": first + TIMELINE_PAGE}), "later steps →"))
    return Markup(f"<div class='pager'>{''.join(parts)}</div>")


def _failure_line(mode: str | None) -> Markup:
    if not mode:
        return Markup("—")
    meaning = FAILURE_MODES.get(mode)
    return Markup(f"<b>{esc(mode)}</b>" + (f" — {esc(meaning)}" if meaning else ""))


def _timeline_table(episode_id: str, timeline: list[Step]) -> Markup:
    rows, attrs = [], []
    for s in timeline:
        rows.append([_step_link(episode_id, s.step), _action_cell(s), _result_cell(s),
                     _effects_cell(s), _rewards_cell(s), _mistakes_cell(s), _chaos_cell(s)])
        css = "mistake" if s.mistakes or (s.ended and s.ended.get("outcome") != "success") \
            else "rejected" if s.rejected else ""
        attrs.append(f'id="step-{s.step}"' + (f' class="{css}"' if css else ""))
    return table(["step", "action", "result", "effects", "rewards", "mistakes", "chaos"], rows,
                 row_attrs=attrs)


def _action_cell(s: Step) -> Markup:
    if s.step == 0:
        return Markup(f"<span class='muted'>reset: {s.events} events build the world</span>")
    if s.tool is None:
        return Markup(f"<b>malformed action</b><br><code>{esc(json_text(s.action))}</code>")
    return Markup(f"<b>{esc(s.tool)}</b><br><code>{esc(json_text(s.arguments))}</code>")


def _result_cell(s: Step) -> Markup:
    parts = []
    if s.step > 0:
        if s.rejected is not None:
            r = s.rejected
            parts.append(f"<span class='bad'>rejected</span> <code>{esc(r.get('code'))}</code>: "
                         f"{esc(r.get('reason'))}")
        else:
            parts.append("<span class='ok'>accepted</span>")
    if s.ended is not None:
        e = s.ended
        mode = f" ({esc(e.get('failure_mode'))})" if e.get("failure_mode") else ""
        parts.append(f"<br><b>episode ended: {esc(e.get('outcome'))}{mode}</b>, "
                     f"return {esc(number(e.get('total_return')))}")
    return Markup("".join(parts))


def _effects_cell(s: Step) -> Markup:
    return Markup("<br>".join(f"{esc(e['type'])} <code>{esc(json_text(_without_cause(e['data'])))}</code>"
                              for e in s.effects))


def _without_cause(data: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in data.items() if k not in ("cause", "mechanism")}


def _rewards_cell(s: Step) -> Markup:
    if not s.rewards:
        return Markup("")
    lines = [f"{esc(r.get('rule'))} {esc(_signed(r.get('value')))}" for r in s.rewards]
    if len(s.rewards) > 1:
        lines.append(f"<i>total {esc(_signed(s.reward))}</i>")
    return Markup("<br>".join(lines))


def _signed(value: Any) -> str:
    return f"{value:+g}" if isinstance(value, int | float) else str(value)


def _mistakes_cell(s: Step) -> Markup:
    return Markup("<br>".join(
        f"<b>{esc(m.get('mode'))}</b>{' (irreversible)' if m.get('irreversible') else ''}: "
        f"{esc(m.get('detail'))}" for m in s.mistakes))


def _chaos_cell(s: Step) -> Markup:
    return Markup("<br>".join(
        f"<span class='chaos'>{esc(c['mechanism'] or 'chaos')}</span>: {esc(c['type'])} "
        f"<code>{esc(json_text(_without_cause(c['data'])))}</code>" for c in s.chaos))


# -- re-simulation ------------------------------------------------------------------------------


def rerun_page(result: dict[str, Any]) -> HTMLResponse:
    """`GET /ui/episodes/{id}/rerun`: deterministic replay, checked: equal digests, or where the
    re-simulated stream parts from the stored one."""
    episode_id = result["episode_id"]
    if result["match"]:
        verdict = (f"<p class='ok'><b>Match.</b> Re-simulated from its seed, options and "
                   f"{result['actions']} actions under rules version {esc(result['rules'])}, the "
                   "episode gives the stored stream: "
                   f"{result['rerun_events']} events, digest <code>{esc(result['rerun_digest'])}</code>.</p>")
    else:
        line = mismatch_line(result)
        verdict = f"<p class='error'><b>Mismatch.</b> {esc(line[:1].upper() + line[1:])}.</p>"
    parts = [f"<h1>Episode {esc(episode_id)} — re-simulated</h1>", verdict]
    if result.get("error"):
        parts.append(f"<p class='bad'>{esc(result['error'])}</p>")
    parts += [f"<p>{esc(note)}</p>" for note in result.get("notes") or []]
    if result.get("first_difference") is not None:
        parts.append(f"<h2>First difference: version {result['first_difference']}</h2>")
        parts.append(table(["stored", "re-simulated"],
                           [[_envelope_cell(result.get("stored")), _envelope_cell(result.get("rerun"))]]))
    parts.append(f"<p>{link(episode_url(episode_id), 'back to the episode')}</p>")
    return page(f"Episode {episode_id} re-simulated", "".join(parts))


def _envelope_cell(envelope: dict[str, Any] | None) -> Markup:
    return pre_json(envelope) if envelope is not None else Markup("<span class='muted'>(none)</span>")


# -- the apps at one step -----------------------------------------------------------------------


def views_page(result: dict[str, Any]) -> HTMLResponse:
    """`GET /ui/episodes/{id}/views?step=K`: step K's facts, then the three apps after it."""
    episode_id, step, steps = result["episode_id"], result["step"], result["steps"]
    nav = [link(timeline_url(episode_id, step), "back to the episode")]
    if step > 0:
        nav.insert(0, link(views_url(episode_id, step - 1), f"← step {step - 1}"))
    if step < steps:
        nav.append(link(views_url(episode_id, step + 1), f"step {step + 1} →"))
    ep = result["episode"]
    body = [f"<h1>Episode {esc(episode_id)} — step {step} of {steps}</h1>",
            f"<p class='muted'>{esc(ep.get('task'))}, seed {esc(ep.get('seed'))}, "
            f"chaos {esc(level(ep.get('chaos')))}, agent <bdi>{esc(ep.get('agent') or UNKNOWN_AGENT)}</bdi>; "
            f"the apps after stream version {esc(result.get('version'))}</p>",
            f"<div class='pager'>{''.join(nav)}</div>", _step_facts(result)]
    for app in APPS:
        body.append(f"<h2>{esc(app)}</h2>{app_view(result.get(app))}")
    return page(f"Episode {episode_id} step {step}", "".join(body))


def _step_facts(result: dict[str, Any]) -> Markup:
    if result["step"] == 0:  # with the chaos planted at reset, as `replay --step 0` shows it
        said = "<p>Step 0: the world right after reset, before the agent's first action.</p>"
        return Markup(said) + summary_list(_chaos_pairs(result)) if result.get("chaos") else Markup(said)
    info = result.get("result") or {}
    pairs: list[tuple[str, Any]] = [("action", Markup(f"<code>{esc(json_text(result['action']))}</code>"))]
    if info.get("rejected"):
        said = f"<code>{esc(info['rejected'])}</code>: {esc(info.get('message'))}"
        pairs.append(("rejected", Markup(said)))
    else:
        pairs.append(("message", info.get("message")))
        if info.get("result") is not None:
            pairs.append(("result", pre_json(info["result"])))
    if result.get("rewards"):
        pairs.append(("rewards", ", ".join(f"{r.get('rule')} {_signed(r.get('value'))}"
                                           for r in result["rewards"])))
    pairs += _chaos_pairs(result)
    if result.get("ended"):
        e = result["ended"]
        pairs.append(("episode ended", f"{e.get('outcome')}"
                      + (f" ({e['failure_mode']})" if e.get("failure_mode") else "")))
    return summary_list(pairs)


def _chaos_pairs(result: dict[str, Any]) -> list[tuple[str, Any]]:
    return [("chaos", f"{c.get('mechanism') or 'chaos'}: {c.get('type')}") for c in result.get("chaos") or []]


def app_view(view: Any) -> Markup:
    """An app's view: each list of records as a table, anything else as JSON."""
    if not isinstance(view, dict):
        return pre_json(view)
    parts = []
    for key, value in view.items():
        parts.append(f"<h3>{esc(key)}</h3>")
        if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            columns: list[str] = []
            for record in value:
                columns.extend(k for k in record if k not in columns)
            parts.append(table(columns, [[_view_cell(r.get(c)) for c in columns] for r in value]))
        elif isinstance(value, list) and not value:
            parts.append("<p class='muted'>none</p>")
        elif isinstance(value, dict | list):
            parts.append(pre_json(value))
        else:
            parts.append(f"<p>{text_cell(value)}</p>")
    return Markup("".join(parts))


def _view_cell(value: Any) -> Any:
    if value is None:
        return Markup("<span class='muted'>—</span>")
    if isinstance(value, bool):
        return "yes" if value else "no"
    return value


# -- analytics ----------------------------------------------------------------------------------


def analytics_page(report_body: str, filters: dict[str, str]) -> HTMLResponse:
    """`GET /ui/analytics`: the report `companyos analytics report --html` writes, inside the UI:
    the same markup (analytics.report.html_body) and style, one renderer and one escaping."""
    here = esc(ui_href("/analytics"))
    form = Markup(
        f'<form class="filters" method="get" action="{here}">'
        + select("task", "task", TASK_FAMILIES, filters.get("task"))
        + select("chaos", "chaos", _chaos_choices(filters.get("chaos")), filters.get("chaos"))
        + select("profile", "profile", REWARD_PROFILES, filters.get("profile"))
        + select("rules", "rules", [str(v) for v in RULES_VERSIONS], filters.get("rules"))
        + text_input("agent", "agent", filters.get("agent"))
        + f'<button type="submit">Filter</button><a href="{here}">clear</a></form>')
    narrowed = ", ".join(f"{k} {v}" for k, v in filters.items() if v)
    return page(f"Analytics ({narrowed})" if narrowed else "Analytics", form + report_body,
                head=f"<style>{REPORT_CSS}</style>")


def _chaos_choices(chosen: str | None) -> list[str]:
    """The named levels, and a number the page was asked for (`?chaos=0.3`, from a sweep), so the
    form keeps it: with the names alone the select showed "any" and the next Filter dropped it."""
    return [*CHAOS_LEVELS, chosen] if chosen and chosen not in CHAOS_LEVELS else list(CHAOS_LEVELS)


def syncing_page(how_far: str, refresh_s: int, filters: dict[str, str],
                 reloading: bool = True) -> HTMLResponse:
    """`GET /ui/analytics` while a long sync runs: how far it got, reloading itself until the
    report is ready (202: the work is accepted and under way), with a link that stops the reloads
    (a page that reloads with no way to stop it fails WCAG 2.2.1). The link comes first and takes
    the focus: at the end of the text, a screen reader starting over every 2 s never reached it."""
    here = ui_href("/analytics")
    still = url(here, {**filters, "reload": "off"})
    if reloading:
        said = (f"<p><a href=\"{esc(still)}\" autofocus>Stop reloading</a>: this page reloads itself "
                f"{refresh_s} s after each answer and shows the report when the sync is done.</p>")
    else:
        said = (f"<p>This page does not reload itself: {link(still, 'check again')}, or "
                f"{link(url(here, filters), f'reload every {refresh_s} s')} until the report is ready.</p>")
    body = (f"<h1>Syncing the warehouse</h1>{said}<p>The analytics read a DuckDB warehouse fed from "
            f"the store; it is catching up: {esc(how_far)}.</p>"
            "<p class='muted'>The sync goes on if you leave.</p>")
    return page("Analytics", body, status=202,
                head=f"<meta http-equiv='refresh' content='{int(refresh_s)}'>" if reloading else "")
