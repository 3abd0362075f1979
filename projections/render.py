"""Text renderings of the app views (board, catalogue, queue) for people and LLMs.

They read only the views' JSON (`domain.views`), so a stored read model and a live world
render the same way.
"""

from __future__ import annotations

from typing import Any

import orjson

from domain.tools import APPS

TITLES = {"ticketdesk": "TicketDesk board", "datahub": "DataHub catalogue",
          "approvalflow": "ApprovalFlow queue"}
_STATUS_ORDER = ("open", "in_progress", "blocked", "resolved", "closed", None)


def _v(value: Any) -> str:
    return "-" if value is None or value == "" else str(value)


def render_ticketdesk(view: dict[str, Any]) -> str:
    """Tickets grouped by status, like a board's columns."""
    tickets = view.get("tickets", [])
    lines = [f"{TITLES['ticketdesk']} — {len(tickets)} ticket(s)"]
    columns: dict[Any, list[dict]] = {}
    for t in tickets:
        status = "blocked" if t.get("blocked_by") else t.get("status")
        columns.setdefault(status, []).append(t)
    order = list(_STATUS_ORDER) + [s for s in columns if s not in _STATUS_ORDER]
    for status in order:
        if status not in columns:
            continue
        lines.append(f"  [{status or 'no status'}]")
        for t in columns[status]:
            flags = [f"priority {_v(t.get('priority'))}", f"assignee {_v(t.get('assignee'))}"]
            if t.get("verified"):
                flags.append("verified")
            if t.get("blocked_by"):
                flags.append(f"blocked by {t['blocked_by']}")
            if t.get("linked_approval"):
                flags.append(f"approval {t['linked_approval']}")
            lines.append(f"    {t.get('ticket_id')}  {t.get('title', '')}")
            lines.append(f"      {', '.join(flags)}")
            for comment in t.get("comments") or []:
                lines.append(f"      comment: {comment}")
    return "\n".join(lines)


def render_datahub(view: dict[str, Any]) -> str:
    """Metrics with freshness, then the approver directory with out-of-office and delegates."""
    metrics = view.get("metrics", [])
    approvers = view.get("approvers", [])
    lines = [f"{TITLES['datahub']} — {len(metrics)} metric(s), {len(approvers)} approver(s)"]
    for m in metrics:
        state = []
        if m.get("stale"):
            state.append("STALE")
        if m.get("refreshing"):
            state.append("refreshing")
        shown = f"  {m.get('name')} = {_v(m.get('value'))} {m.get('unit') or ''}".rstrip()
        lines.append(f"{shown} (as of {_v(m.get('as_of'))})"
                     + (f" [{', '.join(state)}]" if state else ""))
    for a in approvers:
        line = f"  {a.get('role')}: {a.get('name')} <{a.get('email')}>, {a.get('title')}"
        if a.get("out_of_office"):
            line += f" — OUT OF OFFICE until {_v(a.get('until'))}"
        if a.get("delegate_role"):
            line += f"; delegate: {a['delegate_role']}"
        lines.append(line)
    return "\n".join(lines)


def render_approvalflow(view: dict[str, Any]) -> str:
    """Approval types with their approver role and required fields, then the request queue."""
    types = view.get("approval_types", [])
    approvals = view.get("approvals", [])
    lines = [f"{TITLES['approvalflow']} — {len(approvals)} request(s)"]
    for t in types:
        fields = ", ".join(t.get("required_fields") or []) or "none"
        lines.append(f"  type {t.get('name')}: approver {t.get('approver_role')}; "
                     f"requires {fields}")
    for a in approvals:
        line = (f"  {a.get('approval_id')} {a.get('approval_type')} -> {a.get('approver')} "
                f"[{a.get('status')}]")
        if a.get("reason"):
            line += f": {a['reason']}"
        lines.append(line)
        if a.get("data"):
            lines.append(f"    data: {orjson.dumps(a['data'], option=orjson.OPT_SORT_KEYS).decode()}")
    return "\n".join(lines)


RENDERERS = {"ticketdesk": render_ticketdesk, "datahub": render_datahub,
             "approvalflow": render_approvalflow}


def render_views(views: dict[str, Any]) -> str:
    """All three apps as text, in a fixed order."""
    return "\n\n".join(RENDERERS[app](views[app]) for app in APPS if app in views)
