"""The random agent: a uniformly chosen tool each step, with arguments drawn from what it has
seen so far (the goal's ids and names, ids and names in tool results) plus some noise: now and
then a malformed action, an unknown tool, a wrong or missing parameter.

Seeded with its own ``random.Random(seed)``; cheap enough for bulk runs.
"""

from __future__ import annotations

import random
import re

from domain.ticketdesk import FIELDS, PRIORITIES, SETTABLE_STATUSES
from domain.tools import TOOLS

_IDS = re.compile(r"T-\d+")
_QUOTED = re.compile(r"'([a-z_.]+)'")
_WORD = re.compile(r"[A-Za-z]{4,}")
NOISE = 0.05  # share of deliberately broken actions
_JUNK = (
    "help", None, [], {"app": "ticketdesk"}, {"app": "mail", "method": "send", "params": {}},
    {"app": "ticketdesk", "method": "delete_ticket", "params": {}},
    {"app": "datahub", "method": "query_metric", "params": {}},
    {"app": "ticketdesk", "method": "get_ticket", "params": {"ticket_id": 7}},
)
_TEXTS = ("Looks good.", "Checked.", "Please advise.", "Declining per policy.", "Done.")
_CALLS = tuple((t.app, t.method, tuple(t.parameters["properties"])) for t in TOOLS)


class RandomAgent:
    name = "random"

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.reset({"goal": ""})

    def reset(self, observation: dict) -> None:
        goal = observation.get("goal") or ""
        self.ids = list(dict.fromkeys(_IDS.findall(goal))) or ["T-100"]
        self.goal_ids = self.ids[:]
        quoted = list(dict.fromkeys(_QUOTED.findall(goal)))
        self.metrics = [q for q in quoted if "." in q] or ["revenue"]
        self.goal_metrics = self.metrics[:]
        self.names = [q for q in quoted if "." not in q] or ["manager"]  # types and roles
        self.words = _WORD.findall(goal)[:20] or ["ticket"]
        self.people: list[str] = []
        self.approvals: list[str] = []
        self.data: dict = {}
        self.last: dict | None = None

    def _absorb(self, obs: dict) -> None:
        res = obs.get("result")
        if not res or self.last is None or obs.get("error"):
            return
        method = self.last.get("method")
        if method in ("list_tickets", "search_tickets"):
            for t in res["tickets"]:
                if t["ticket_id"] not in self.ids:
                    self.ids.append(t["ticket_id"])
        elif method == "get_ticket":
            t = res["ticket"]
            self.data.update(t["details"])
            if t["blocked_by"] and t["blocked_by"] not in self.ids:
                self.ids.append(t["blocked_by"])
            if t["assignee"] and t["assignee"] not in self.people:
                self.people.append(t["assignee"])
        elif method == "list_metrics":
            for m in res["metrics"]:
                if m["name"] not in self.metrics:
                    self.metrics.append(m["name"])
        elif method == "query_metric":
            self.data[res["metric"].split(".")[0]] = res["value"]
        elif method == "get_approver":
            for v in (res["name"], res["delegate_name"]):
                if v and v not in self.people:
                    self.people.append(v)
            if res["delegate_role"] and res["delegate_role"] not in self.names:
                self.names.append(res["delegate_role"])
        elif method == "list_approval_types":
            for t in res["approval_types"]:
                for v in (t["name"], t["approver_role"]):
                    if v not in self.names:
                        self.names.append(v)
        elif method in ("submit_approval", "check_status") and res["approval_id"] not in \
                self.approvals:
            self.approvals.append(res["approval_id"])
        elif method == "list_approvals":
            for a in res["approvals"]:
                if a["approval_id"] not in self.approvals:
                    self.approvals.append(a["approval_id"])

    def act(self, observation: dict) -> dict:
        self._absorb(observation)
        rng = self.rng
        if rng.random() < NOISE:
            junk = rng.choice(_JUNK)
            self.last = None
            return junk
        app, method, names = _CALLS[int(rng.random() * len(_CALLS))]
        params = {}
        for pname in names:
            params[pname] = self._arg(pname, params)
        self.last = {"app": app, "method": method, "params": params}
        return self.last

    def _arg(self, pname: str, params: dict):
        rng = self.rng
        if pname == "ticket_id":
            # what the goal names is what it has seen most prominently
            return rng.choice(self.goal_ids if rng.random() < 0.5 else self.ids)
        if pname == "field":
            return rng.choice(FIELDS)
        if pname == "value":
            field = params.get("field")
            if field == "priority":
                return rng.choice(PRIORITIES)
            if field == "status":
                return rng.choice(SETTABLE_STATUSES)
            if field == "verified":
                return rng.random() < 0.5
            if field == "assignee":
                return rng.choice(self.people) if self.people else "someone"
            return rng.choice(self.approvals) if self.approvals else None
        if pname in ("text", "reason"):
            return rng.choice(_TEXTS)
        if pname == "query":
            return rng.choice(self.words)
        if pname == "metric_name":
            return rng.choice(self.goal_metrics if rng.random() < 0.5 else self.metrics)
        if pname in ("role", "approval_type"):
            return rng.choice(self.names)
        if pname == "approver":
            return rng.choice(self.people) if self.people else "someone"
        if pname == "approval_id":
            return rng.choice(self.approvals) if self.approvals else "APR-1001"
        if pname == "data":
            keys = list(self.data)
            return {k: self.data[k] for k in keys if rng.random() < 0.5}
        return None
