"""What the server says about the environment: tools (OpenAI and MCP shapes), tasks, schemas.

All of it is derived from the domain's catalogue at import time, so the HTTP, WebSocket and MCP
faces can never disagree with the tools the environment actually accepts.
"""

from __future__ import annotations

from functools import cache
from importlib import metadata as importlib_metadata
from typing import Any

import domain

NAME = "companyos"
DESCRIPTION = ("CompanyOS: an event-sourced RL environment in which an agent completes messy "
               "enterprise workflows across TicketDesk, DataHub and ApprovalFlow while the apps "
               "misbehave (missing fields, stale data, out-of-office approvers, rejections).")


@cache
def version() -> str:
    try:
        return importlib_metadata.version("companyos")
    except importlib_metadata.PackageNotFoundError:  # pragma: no cover - always installed
        return "0.0.0"


@cache
def _by_name() -> dict[str, tuple[str, str]]:
    names: dict[str, tuple[str, str]] = {}
    for tool in domain.TOOLS:
        names[tool.name] = names[tool.function_name] = (tool.app, tool.method)
    return names


def action_from_tool_call(name: Any, arguments: Any) -> dict[str, Any]:
    """An MCP / function call -> the environment's action. Unknown names still become actions
    (`app.method` or `app_method` split at the first separator), so the environment rejects them
    with its penalty and explains why, exactly as for a bad action sent to /step."""
    if not isinstance(name, str):
        return {"app": name, "method": None, "params": arguments}
    known = _by_name().get(name)
    if known is not None:
        app, method = known
    else:
        app, sep, method = name.partition(".")
        if not sep:
            app, _, method = name.partition("_")
    return {"app": app, "method": method, "params": {} if arguments is None else arguments}


def tool_envelope(data: Any) -> tuple[str, Any]:
    """Read a step's payload: OpenEnv's MCP-style actions (`{"type": "list_tools"}`,
    `{"type": "call_tool", "tool_name": ..., "arguments": ...}`, what its MCPToolClient sends) or
    an action. ("tools", observation) lists the tools without a step; ("action", action) is
    stepped. Only a payload without `app` and `method` is an envelope, and HTTP and WebSocket both
    read it here, so the same payload logs the same step on either."""
    if isinstance(data, dict) and "app" not in data and "method" not in data:
        kind = data.get("type")
        if kind == "list_tools":
            tools = [{"name": t["name"], "description": t["description"],
                      "input_schema": t["inputSchema"]} for t in mcp_tools()]
            return "tools", {"observation": {"tools": tools}, "reward": None, "done": False}
        if kind == "call_tool":
            return "action", action_from_tool_call(data.get("tool_name"), data.get("arguments"))
    return "action", data


@cache
def openai_tools() -> list[dict[str, Any]]:
    """Tools in OpenAI function-calling format (names `app_method`: dots are not allowed there)."""
    return [{"type": "function",
             "function": {"name": t.function_name, "description": t.description,
                          "parameters": t.parameters}}
            for t in domain.TOOLS]


@cache
def mcp_tools() -> list[dict[str, Any]]:
    """Tools as MCP `tools/list` returns them; `tools/call` also accepts `app.method` names."""
    return [{"name": t.function_name, "title": t.name,
             "description": t.description, "inputSchema": t.parameters}
            for t in domain.TOOLS]


@cache
def action_schema() -> dict[str, Any]:
    apps = sorted({t.app for t in domain.TOOLS})
    variants = [{"title": t.name, "description": t.description,
                 "type": "object",
                 "properties": {"app": {"const": t.app}, "method": {"const": t.method},
                                "params": _params_schema(t)},
                 "required": ["app", "method", "params"] if t.parameters.get("required")
                 else ["app", "method"]}
                for t in domain.TOOLS]
    return {
        "title": "Action",
        "description": "One tool call. An unknown tool or bad params is not an HTTP error: the "
                       "environment rejects the action with a penalty and says why.",
        "type": "object",
        "properties": {"app": {"type": "string", "enum": apps},
                       "method": {"type": "string"},
                       "params": {"type": ["object", "null"]}},
        "required": ["app", "method"],
        "anyOf": variants,
    }


def _params_schema(tool: domain.ToolSpec) -> dict[str, Any]:
    """As the environment reads `params`: absent or null is no parameters, which a tool without
    required ones accepts, so the schema accepts exactly the calls the environment does."""
    if tool.parameters.get("required"):
        return tool.parameters
    return {"anyOf": [tool.parameters, {"type": "null"}]}


_OBSERVATION_SCHEMA: dict[str, Any] = {
    "title": "Observation",
    "description": "What the agent sees after reset or a step: the goal, the step clock, the "
                   "tool's result, a message, the rejection's code, whether and how the episode "
                   "ended, the tool names, and (when the episode was reset with text=true) a text "
                   "rendering for LLMs.",
    "type": "object",
    "properties": {
        "goal": {"type": "string", "description": "The task, in words."},
        "step": {"type": "integer", "minimum": 0, "description": "Actions taken so far."},
        "steps_remaining": {"type": "integer", "minimum": 0},
        "result": {"type": ["object", "null"], "description": "The tool's answer, its keys the "
                   "tool's own (warnings included); null after reset and when the action was rejected."},
        "message": {"type": "string", "description": "What happened, in words (why, when rejected)."},
        "error": {"type": ["string", "null"], "description": "The rejection's code (unknown_tool, "
                  "invalid_params, malformed_action, a rule's or chaos's own), null when accepted."},
        "done": {"type": "boolean"},
        "outcome": {"enum": ["success", "failure", "truncated", None],
                    "description": "How the episode ended; null while it runs."},
        "tools": {"type": "array", "items": {"type": "string"}, "description": "app.method names."},
        "text": {"type": "string", "description": "The rendering an LLM reads (reset with text=true)."},
    },
    "required": ["goal", "step", "steps_remaining", "result", "message", "error", "done", "outcome"],
    "additionalProperties": False,
}

_STATE_SCHEMA: dict[str, Any] = {
    "title": "State",
    "type": "object",
    "properties": {
        "episode_id": {"type": ["string", "null"]},
        "step_count": {"type": "integer", "minimum": 0},
        "task": {"type": "string"}, "seed": {"type": "integer"}, "chaos": {"type": "number"},
        "reward_profile": {"type": "string"},
        "rules": {"type": "integer", "minimum": 1,
                  "description": "the rules version the episode is judged by (GET /tasks lists them)"},
        "max_steps": {"type": "integer"},
        "done": {"type": "boolean"}, "total_return": {"type": "number"},
        "outcome": {"type": ["string", "null"]}, "failure_mode": {"type": ["string", "null"]},
        "agent": {"type": ["string", "null"]},
    },
    "required": ["episode_id", "step_count"],
    "additionalProperties": True,
}


@cache
def schemas() -> dict[str, Any]:
    """GET /schema: OpenEnv's combined schemas of action, observation and state."""
    return {"action": action_schema(), "observation": _OBSERVATION_SCHEMA,
            "reset_observation": _OBSERVATION_SCHEMA, "state": _STATE_SCHEMA}


@cache
def readme() -> str:
    lines = [f"# {NAME}", "", DESCRIPTION, "",
             "Reset with `{\"seed\", \"task\", \"chaos\", \"reward_profile\", \"max_steps\", "
             "\"rules\"}`; "
             "act with `{\"app\": ..., \"method\": ..., \"params\": {...}}`. A bad action is "
             "rejected with a penalty and the observation says why.", "", "## Tasks", ""]
    lines += [f"- `{f.name}`: {f.description}" for f in domain.TASK_FAMILIES.values()]
    lines += ["", f"Chaos levels: {', '.join(domain.CHAOS_LEVELS)} (or a number in [0, 1]).", "",
              f"Rules versions: {', '.join(map(str, domain.RULES_VERSIONS))} (the latest, "
              f"{domain.CURRENT_RULES}, unless a reset names another).",
              "", "## Tools", ""]
    lines += [f"- `{t.name}`: {t.description}" for t in domain.TOOLS]
    return "\n".join(lines) + "\n"


@cache
def env_metadata() -> dict[str, Any]:
    """GET /metadata, in OpenEnv's EnvironmentMetadata shape."""
    return {"name": NAME, "description": DESCRIPTION, "version": version(),
            "readme_content": readme(), "author": "CompanyOS", "documentation_url": None}
