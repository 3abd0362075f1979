"""The tool catalogue: what an agent can call, with JSON schemas for LLM tool calling / MCP.

An action is ``{"app": ..., "method": ..., "params": {...}}``. ``parse_action`` validates one
by hand against the schemas (no jsonschema in the hot path) and never raises.
"""

from __future__ import annotations

from typing import NamedTuple

from domain.quoting import shown
from domain.ticketdesk import FIELDS, PRIORITIES, SETTABLE_STATUSES


class ToolSpec(NamedTuple):
    app: str
    method: str
    description: str
    parameters: dict  # a JSON schema of type object; treat as read-only

    @property
    def name(self) -> str:
        """``app.method``, e.g. ``ticketdesk.get_ticket``."""
        return f"{self.app}.{self.method}"

    @property
    def function_name(self) -> str:
        """``app_method``: a name valid for OpenAI function calling (apps have no '_')."""
        return f"{self.app}_{self.method}"


def _schema(props: dict | None = None, required: tuple = ()) -> dict:
    return {"type": "object", "properties": props or {}, "required": list(required),
            "additionalProperties": False}


def _s(description: str, **extra) -> dict:
    return {"type": "string", "description": description, **extra}


_TICKET_ID = _s("ticket id, e.g. T-123")
_VALUE_HELP = (f"new value. priority: {'|'.join(PRIORITIES)}; status: "
               f"{'|'.join(SETTABLE_STATUSES)}; verified: true|false; assignee: a person's "
               "name; linked_approval: an approval id (or null to unlink)")

TOOLS: tuple[ToolSpec, ...] = (
    ToolSpec("ticketdesk", "list_tickets", "List all tickets with status, priority, assignee.",
             _schema()),
    ToolSpec("ticketdesk", "search_tickets", "Find tickets whose title or text contains a query.",
             _schema({"query": _s("text to look for")}, ("query",))),
    ToolSpec("ticketdesk", "get_ticket",
             "Read one ticket: fields, details, blocker, linked approval, comments.",
             _schema({"ticket_id": _TICKET_ID}, ("ticket_id",))),
    ToolSpec("ticketdesk", "update_ticket",
             "Set a ticket's priority, assignee, status, verified flag or linked approval.",
             _schema({"ticket_id": _TICKET_ID,
                      "field": _s("field to change", enum=list(FIELDS)),
                      "value": {"type": ["string", "boolean", "null"],
                                "description": _VALUE_HELP}},
                     ("ticket_id", "field", "value"))),
    ToolSpec("ticketdesk", "add_comment", "Add a comment to a ticket.",
             _schema({"ticket_id": _TICKET_ID, "text": _s("the comment")},
                     ("ticket_id", "text"))),
    ToolSpec("datahub", "list_metrics", "List the business metrics DataHub holds.", _schema()),
    ToolSpec("datahub", "query_metric",
             "Read a metric's value; warns when it is stale or a refresh is running.",
             _schema({"metric_name": _s("metric name, e.g. compliance_score.acme")},
                     ("metric_name",))),
    ToolSpec("datahub", "refresh_data",
             "Start refreshing a metric from its source; query it afterwards to poll.",
             _schema({"metric_name": _s("metric name")}, ("metric_name",))),
    ToolSpec("datahub", "get_approver",
             "Look up who holds an approver role, whether they are out of office, and "
             "their delegate.",
             _schema({"role": _s("approver role, e.g. procurement_lead")}, ("role",))),
    ToolSpec("approvalflow", "list_approval_types",
             "List approval types with their approver role and required fields.", _schema()),
    ToolSpec("approvalflow", "submit_approval",
             "Submit an approval request to a named approver with the type's fields.",
             _schema({"approval_type": _s("approval type name"),
                      "approver": _s("the approver's full name"),
                      "data": {"type": "object",
                               "description": "field name -> value; see list_approval_types "
                                              "for the required fields"}},
                     ("approval_type", "approver", "data"))),
    ToolSpec("approvalflow", "check_status",
             "Poll an approval request: pending, approved or rejected (with the reason).",
             _schema({"approval_id": _s("approval id, e.g. APR-1001")}, ("approval_id",))),
    ToolSpec("approvalflow", "escalate",
             "Escalate a rejected approval request for a second review, giving a reason.",
             _schema({"approval_id": _s("approval id"),
                      "reason": _s("why the request should be reconsidered")},
                     ("approval_id", "reason"))),
    ToolSpec("approvalflow", "list_approvals", "List submitted approval requests and status.",
             _schema()),
)

APPS: tuple[str, ...] = ("ticketdesk", "datahub", "approvalflow")

# --- validation --------------------------------------------------------------------------

_TYPES = {
    "string": (str,), "boolean": (bool,), "integer": (int,), "number": (int, float),
    "object": (dict,), "array": (list,), "null": (type(None),),
}
_JSON_NAME = {str: "string", bool: "boolean", int: "integer", float: "number", dict: "object",
              list: "array", type(None): "null"}


class Invalid(NamedTuple):
    code: str
    reason: str


class _Check(NamedTuple):
    name: str
    types: frozenset  # allowed Python types (exact: bool is not an integer here)
    label: str  # JSON type names, for messages
    enum: frozenset | None
    enum_text: str


def _compile(spec: ToolSpec) -> tuple:
    checks = []
    for pname, p in spec.parameters["properties"].items():
        kinds = p["type"] if isinstance(p["type"], list) else [p["type"]]
        enum = p.get("enum")
        checks.append(_Check(pname, frozenset(t for k in kinds for t in _TYPES[k]),
                             " or ".join(kinds), frozenset(enum) if enum else None,
                             ", ".join(enum) if enum else ""))
    return tuple(spec.parameters["required"]), tuple(checks)


# app -> method -> (required names, checks)
_COMPILED: dict[str, dict[str, tuple]] = {app: {} for app in APPS}
for _spec in TOOLS:
    _COMPILED[_spec.app][_spec.method] = _compile(_spec)
_EMPTY: dict = {}
_MISSING = object()  # "no such parameter": matches no JSON type, unlike an empty dict


def parse_action(action) -> tuple[str, str, dict] | Invalid:
    """(app, method, params) of a valid action, or Invalid(code, reason). Never raises."""
    if type(action) is not dict:
        return Invalid("malformed_action",
                       'An action must be a JSON object {"app": ..., "method": ..., '
                       f'"params": {{...}}}}; got {_JSON_NAME.get(type(action), "a value")}.')
    app = action.get("app")
    method = action.get("method")
    if type(app) is not str or type(method) is not str:
        return Invalid("malformed_action",
                       'An action needs string fields "app" and "method" (and "params").')
    tools = _COMPILED.get(app)
    compiled = tools.get(method) if tools is not None else None
    if compiled is None:
        if tools is None:
            return Invalid("unknown_tool",
                           f"Unknown app {shown(app)}; the apps are {', '.join(APPS)}.")
        return Invalid("unknown_tool", f"Unknown tool {app}.{method}; {app} has: "
                       f"{', '.join(tools)}.")
    params = action.get("params", _EMPTY)
    if params is None:
        params = _EMPTY
    checks = compiled[1]
    if type(params) is dict and len(params) == len(checks):
        # fast path: every parameter given, nothing else (all tool parameters are required)
        for c in checks:
            v = params.get(c.name, _MISSING)
            if type(v) not in c.types or (c.enum is not None and v not in c.enum):
                break
        else:
            return app, method, params
    return _explain(app, method, params, compiled)


def _explain(app: str, method: str, params, compiled) -> tuple[str, str, dict] | Invalid:
    """The slow path: the first problem with the params, in words (or the call if none)."""
    if type(params) is not dict:
        return Invalid("invalid_params", f"{app}.{method}: params must be a JSON object.")
    required, checks = compiled
    for pname in required:
        if pname not in params:
            return Invalid("invalid_params",
                           f"{app}.{method}: missing required parameter {shown(pname)}.")
    known = [c.name for c in checks]
    # in key order, not the order they came in: the log keeps the action's keys sorted, so a
    # replay must name the same one (and equal actions must log equal events)
    for k in sorted(params, key=str):
        if k not in known:
            return Invalid("invalid_params",
                           f"{app}.{method}: unexpected parameter {shown(k)}; expected "
                           f"{', '.join(known) or 'no parameters'}.")
    for c in checks:
        if c.name in params:
            v = params[c.name]
            if type(v) not in c.types:
                return Invalid("invalid_params",
                               f"{app}.{method}: {shown(c.name)} must be {c.label}, got "
                               f"{_JSON_NAME.get(type(v), 'a value')}.")
            if c.enum is not None and v not in c.enum:
                return Invalid("invalid_params",
                               f"{app}.{method}: {shown(c.name)} must be one of {c.enum_text}; "
                               f"got {shown(v)}.")
    return app, method, params
