"""Pydantic models of the HTTP boundary: request validation and the OpenAPI document.

Responses are built as plain dicts and encoded with orjson; these response models only
document them (and schemathesis checks that the documents hold).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from companyos.env import SEED_MAX
from companyos.runtime import EPISODE_ID_RE, EPISODE_ID_RULE


class ErrorBody(BaseModel):
    detail: str = Field(description="what went wrong, in words")
    code: str = Field(description="a stable machine-readable reason")


_ERROR_TEXT = {
    400: "Bad request: a value the environment cannot use (with the reason)",
    401: "Missing API key or episode token",
    403: "Wrong API key or episode token",
    404: "No such episode (or step)",
    409: "Another step on this episode is running, the episode has finished, the id exists, or "
         "the episode is judged by a rules version this server does not know (code unknown_rules)",
    413: "Request body over the size limit",
    500: "The log is damaged behind the store's back (code log_damaged, naming the stream): "
         "`companyos verify` names every damaged episode",
    503: "The store's database does not answer (code store_unavailable: try again after "
         "`Retry-After` seconds), or takes no writes (store_read_only)",
}


def ERROR_RESPONSES(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` entries for the given error statuses, all shaped like ErrorBody."""
    return {code: {"model": ErrorBody, "description": _ERROR_TEXT[code]} for code in codes}


class ResetRequest(BaseModel):
    """POST /reset (and the WebSocket reset `data`). Every field is optional.

    Strict: `"seed": "7"`, `"chaos": true` or `"text": "yes"` are refused in words, as over the
    WebSocket, rather than quietly converted."""

    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra={
        "examples": [{"seed": 42, "task": "expense_report", "chaos": "medium"}, {}]})

    seed: int | None = Field(default=None, ge=0, le=SEED_MAX,
                             description="seed of the instance (random when omitted)")
    # the server's own rules, stated for clients (schema only: a value breaking one is refused
    # 400 in the environment's words, not with the validator's)
    episode_id: str | None = Field(default=None, max_length=128,
                                   json_schema_extra={"pattern": f"^{EPISODE_ID_RE.pattern}$"},
                                   description="id for the new episode (a fresh uuid when omitted): "
                                               + EPISODE_ID_RULE.removeprefix("episode_id must be "))
    task: str | None = Field(default=None, max_length=100, json_schema_extra={"minLength": 1},
                             description="task family; see /tasks")
    chaos: str | float | None = Field(default=None,
                                      description="none, low, medium, high, or a number in [0, 1]")
    reward_profile: str | None = Field(default=None, max_length=100, json_schema_extra={"minLength": 1},
                                       description="default or sparse")
    max_steps: int | None = Field(default=None, ge=1, le=10_000, description="step budget")
    rules: int | None = Field(default=None, json_schema_extra={"minimum": 1},
                              description="rules version the episode is judged by (the latest "
                                          "when omitted); see /tasks")
    agent: str | None = Field(default=None, min_length=1, max_length=100,
                              description="who is playing, recorded in the log for analytics")
    text: bool | None = Field(default=None,
                              description="include a text rendering of each observation for LLMs")


class StepRequest(BaseModel):
    """POST /step: the action and the episode it belongs to. Strict, as the reset is: a field of
    the wrong type (`"timeout_s": "1"`) is refused, not converted. The action may be any JSON."""

    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra={"examples": [{
        "episode_id": "0f4c...", "episode_token": "...",
        "action": {"app": "ticketdesk", "method": "get_ticket", "params": {"ticket_id": "T-101"}}}]})

    # Any JSON value: one that is not an action is the agent's mistake, rejected in the episode
    # with a penalty as in process (refusing it here would log a different episode).
    action: Any = Field(description='{"app": ..., "method": ..., "params": {...}}; any other '
                                    "value is rejected in the episode as malformed_action")
    episode_id: str = Field(max_length=128, description="from the reset's metadata")
    episode_token: str | None = Field(default=None, max_length=200,
                                      description="from the reset's metadata (or the "
                                                  "X-Episode-Token header)")
    timeout_s: float | None = Field(default=None, gt=0, description="accepted for OpenEnv "
                                    "compatibility; steps take milliseconds")
    request_id: str | None = Field(default=None, max_length=255,
                                   description="accepted for OpenEnv compatibility")


class StepResponse(BaseModel):
    """OpenEnv's reset/step response."""

    observation: dict[str, Any]
    reward: float | None = None
    done: bool = False
    metadata: dict[str, Any] | None = Field(
        default=None, description="episode_id, step, outcome, failure_mode, rejected; after a "
                                  "reset also episode_token and session_id")


class HealthResponse(BaseModel):
    status: str = "healthy"


class ReadyResponse(BaseModel):
    status: str = "ready"
    position: int = Field(description="the store's last position: it moves while episodes are logged")


class MetadataResponse(BaseModel):
    name: str
    description: str
    version: str | None = None
    readme_content: str | None = None
    author: str | None = None
    documentation_url: str | None = None


class SchemaResponse(BaseModel):
    action: dict[str, Any]
    observation: dict[str, Any]
    state: dict[str, Any]
    reset_observation: dict[str, Any] | None = None


class TaskInfo(BaseModel):
    name: str
    description: str


class RulesVersionInfo(BaseModel):
    version: int
    description: str


class TasksResponse(BaseModel):
    tasks: list[TaskInfo]
    chaos_levels: dict[str, float]
    reward_profiles: list[str]
    rules_versions: list[RulesVersionInfo]
    current_rules: int
    failure_modes: dict[str, str]


class EpisodeSummary(BaseModel):
    model_config = ConfigDict(extra="allow")

    episode_id: str
    task: str
    seed: int
    chaos: float
    agent: str | None = None
    reward_profile: str
    max_steps: int | None = None
    rules: int | None = Field(default=None, description="the rules version it was judged by (1 for "
                                                        "logs written before versions existed)")
    started_at: str | None = None
    ended_at: str | None = None
    steps: int
    total_return: float
    outcome: str | None = None
    failure_mode: str | None = None
    events: int
    digest: str


class EpisodeList(BaseModel):
    episodes: list[EpisodeSummary]
    total: int
    limit: int
    offset: int
    next_offset: int | None = Field(None, description="the offset of the next older page, when "
                                    "paging by offset; None at the end or when paging by cursor")
    newer: int = Field(0, description="how many episodes the filters select that are newer than "
                       "this page (its first row is number newer + 1 of total)")
    next_before: int | None = Field(None, description="pass as `before` for the next older page, "
                                    "which stays put while episodes are logged; None at the oldest")
    prev_after: int | None = Field(None, description="pass as `after` for the next newer page; "
                                   "None at the newest")
    read_models_behind: int = Field(0, description="events of the log the list leaves out: above 0 "
                                    "only when the store's database takes no writes (a standby), so "
                                    "the read models cannot be brought up to date and the list shows "
                                    "what they hold, or while `catching_up`")
    catching_up: bool = Field(False, description="the read model is still folding the log (only "
                              "the web UI's list stops waiting for it, after 2 s; GET /episodes "
                              "waits until it is done)")


class StoredEvent(BaseModel):
    version: int
    position: int
    type: str
    schema_version: int
    data: dict[str, Any]
    meta: dict[str, Any]
    digest: str


class EpisodeEvents(BaseModel):
    episode_id: str
    events: list[StoredEvent]
    from_version: int
    next_from_version: int | None = None
    total: int


class EpisodeRerun(BaseModel):
    """`companyos rerun --json`: the episode re-simulated in memory and compared by digest."""

    episode_id: str
    match: bool = Field(description="the re-simulated stream ends in the stored digest")
    stored_digest: str
    rerun_digest: str
    stored_events: int
    rerun_events: int
    actions: int = Field(description="agent actions replayed")
    first_difference: int | None = Field(None, description="stream version where the two part")
    stored: dict[str, Any] | None = Field(None, description="the stored event there")
    rerun: dict[str, Any] | None = Field(None, description="the re-simulated event there")
    error: str | None = Field(None, description="why the re-simulation itself failed")
    notes: list[str] = []
    rules: int | None = Field(None, description="the rules version it was re-simulated under, the one "
                                                "its start names (null: no start to read)")


class EpisodeViews(BaseModel):
    model_config = ConfigDict(extra="allow")

    episode_id: str
    step: int
    steps: int
    ticketdesk: Any = None
    datahub: Any = None
    approvalflow: Any = None
