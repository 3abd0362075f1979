"""The scripted expert: reads observations only (never the hidden state) and solves the tasks.

Its plan, recomputed from what it knows before every step:

1. read the goal (ticket, metric, policy, approval type, role) and the main ticket;
2. resolve blockers, innermost first (closing a blocked ticket or a blocker is irreversible);
3. read the decision metric until two fresh reads agree it is fresh (refreshing stale data and
   polling a running refresh), because a metric may go stale again after its first fresh read;
4. decline: comment, then close the ticket. Proceed: learn the approval type's required
   fields, triage the ticket, find an available approver along the delegation chain and look
   them up twice (an approver may leave right after the first lookup), submit, poll, escalate
   a rejection once (or resubmit if the data was wrong), then link, verify and resolve.

A transient outage is retried as is.
"""

from __future__ import annotations

import re

_TICKET = re.compile(r"ticket (T-\d+)")
_METRIC = re.compile(r"metric '([^']+)'")
_AT_LEAST = re.compile(r"is at least (-?\d+(?:\.\d+)?)")
_EQUALS = re.compile(r"\) equals (-?\d+(?:\.\d+)?)")
_TYPE = re.compile(r"submit a '([a-z_]+)' approval")
_ROLE = re.compile(r"\(role '([a-z_]+)'\)")
_PRIORITY = re.compile(r"set the priority of T-\d+ to (\w+)")


def _act(app: str, method: str, **params) -> dict:
    return {"app": app, "method": method, "params": params}


class ExpertAgent:
    name = "expert"

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed
        self.reset({"goal": ""})

    # --- bookkeeping ----------------------------------------------------------------------

    def reset(self, observation: dict) -> None:
        goal = observation.get("goal") or ""
        self.ticket = _first(_TICKET, goal)
        self.metric = _first(_METRIC, goal)
        at_least, equals = _first(_AT_LEAST, goal), _first(_EQUALS, goal)
        self.op, self.threshold = (">=", float(at_least)) if at_least else (
            "==", float(equals) if equals else 0.0)
        self.atype = _first(_TYPE, goal)
        self.role = _first(_ROLE, goal)
        self.priority = _first(_PRIORITY, goal)
        self.field = self.metric.split(".")[0] if self.metric else ""
        self.tickets: dict[str, dict] = {}
        self.m_value = None
        self.m_stale = True
        self.m_refreshing = False
        self.m_fresh_reads = 0
        self.required: list[str] | None = None
        self.approvers: dict[str, dict] = {}
        self.lookups: dict[str, int] = {}
        self.approval: str | None = None
        self.a_status: str | None = None
        self.a_reason = ""
        self.escalated = False
        self.commented = False
        self.last: dict | None = None
        self.errors = 0

    def _absorb(self, obs: dict) -> None:
        last = self.last
        if last is None:
            return
        if obs.get("error"):
            if obs["error"] != "transient_outage":
                self.errors += 1
                self._recover(last, obs)
            return
        res = obs.get("result") or {}
        method = last["method"]
        p = last["params"]
        if method == "get_ticket":
            t = res["ticket"]
            self.tickets[t["ticket_id"]] = t
        elif method == "query_metric":
            self.m_value = res["value"]
            self.m_stale = res["stale"]
            self.m_refreshing = res["refreshing"]
            self.m_fresh_reads = self.m_fresh_reads + 1 if not res["stale"] else 0
        elif method == "refresh_data":
            self.m_refreshing = True
        elif method == "get_approver":
            self.approvers[res["role"]] = res
            self.lookups[res["role"]] = self.lookups.get(res["role"], 0) + 1
        elif method == "list_approval_types":
            for t in res["approval_types"]:
                if t["name"] == self.atype:
                    self.required = t["required_fields"]
        elif method == "submit_approval":
            self.approval, self.a_status = res["approval_id"], "pending"
            self.escalated = False
        elif method == "check_status":
            self.a_status, self.a_reason = res["status"], res.get("reason") or ""
        elif method == "escalate":
            self.a_status, self.escalated = "escalated", True
        elif method == "add_comment":
            self.commented = True
        elif method == "update_ticket":
            t = self.tickets.get(p["ticket_id"])
            if t is not None:
                self.tickets[p["ticket_id"]] = {**t, p["field"]: p["value"]}
            for u in res.get("unblocked", ()):
                if u in self.tickets:
                    self.tickets[u] = {**self.tickets[u], "blocked_by": None, "status": "open"}

    def _recover(self, last: dict, obs: dict) -> None:
        """Forget what a refused call shows we had wrong, so the plan re-reads it."""
        method = last["method"]
        if method == "submit_approval":
            self.required = None
            self.lookups = {}
            self.approvers = {}
        elif method == "update_ticket":
            self.tickets.pop(last["params"].get("ticket_id"), None)

    # --- acting ---------------------------------------------------------------------------

    def act(self, observation: dict) -> dict:
        if self.last is not None and observation.get("error") == "transient_outage":
            return self.last
        self._absorb(observation)
        self.last = self._next()
        return self.last

    def _next(self) -> dict:
        main = self.ticket
        t = self.tickets.get(main)
        if t is None:
            return _act("ticketdesk", "get_ticket", ticket_id=main)
        # 1. blockers, innermost first
        if t["blocked_by"]:
            b = t["blocked_by"]
            seen = {main}
            while b in self.tickets and self.tickets[b]["blocked_by"] and b not in seen:
                seen.add(b)
                b = self.tickets[b]["blocked_by"]
            if b not in self.tickets:
                return _act("ticketdesk", "get_ticket", ticket_id=b)
            return _act("ticketdesk", "update_ticket", ticket_id=b, field="status",
                        value="resolved")
        # 2. fresh data, confirmed by a second fresh read
        if self.m_value is None or self.m_refreshing or self.m_fresh_reads < 2:
            if self.m_value is not None and self.m_stale and not self.m_refreshing:
                return _act("datahub", "refresh_data", metric_name=self.metric)
            return _act("datahub", "query_metric", metric_name=self.metric)
        v = self.m_value
        qualifies = v >= self.threshold if self.op == ">=" else abs(v - self.threshold) < 1e-9
        if not qualifies:
            if not self.commented:
                return _act("ticketdesk", "add_comment", ticket_id=main, text=(
                    f"Declined: {self.metric} is {v}, which does not meet the policy "
                    f"({self.op} {self.threshold:g}). Nothing was submitted."))
            return _act("ticketdesk", "update_ticket", ticket_id=main, field="status",
                        value="closed")
        return self._proceed(t)

    def _proceed(self, t: dict) -> dict:
        main = self.ticket
        if self.approval is None or self.a_status == "rejected" and self.escalated:
            if self.required is None:
                return _act("approvalflow", "list_approval_types")
            fix = self._triage(t)
            if fix is not None:
                return fix
            approver = self._approver()
            if isinstance(approver, dict):
                return approver
            return _act("approvalflow", "submit_approval", approval_type=self.atype,
                        approver=approver, data=self._data(t))
        if self.a_status in ("pending", "escalated"):
            return _act("approvalflow", "check_status", approval_id=self.approval)
        if self.a_status == "rejected":
            if "does not match" in self.a_reason:
                # our figures were out of date: re-read the data, then resubmit
                self.m_fresh_reads = 0
                self.m_stale = True
                self.approval = None
                return _act("datahub", "refresh_data", metric_name=self.metric)
            return _act("approvalflow", "escalate", approval_id=self.approval,
                        reason="All fields match the ticket and fresh DataHub data; "
                               "please review again.")
        # approved
        fix = self._triage(t)
        if fix is not None:
            return fix
        if t["linked_approval"] != self.approval:
            return _act("ticketdesk", "update_ticket", ticket_id=main,
                        field="linked_approval", value=self.approval)
        if not t["verified"]:
            return _act("ticketdesk", "update_ticket", ticket_id=main, field="verified",
                        value=True)
        return _act("ticketdesk", "update_ticket", ticket_id=main, field="status",
                    value="resolved")

    def _triage(self, t: dict) -> dict | None:
        main = self.ticket
        details = t.get("details") or {}
        want = self.priority or details.get("impact") or "medium"
        if t["priority"] is None or (self.priority and t["priority"] != self.priority):
            return _act("ticketdesk", "update_ticket", ticket_id=main, field="priority",
                        value=want)
        if t["assignee"] is None:
            return _act("ticketdesk", "update_ticket", ticket_id=main, field="assignee",
                        value=details.get("owner") or "unassigned")
        if t["status"] is None:
            return _act("ticketdesk", "update_ticket", ticket_id=main, field="status",
                        value="in_progress")
        return None

    def _approver(self) -> str | dict:
        """The name of a confirmed available approver, or the lookup to do next."""
        role = self.role
        visited = set()
        while role and role not in visited:
            visited.add(role)
            a = self.approvers.get(role)
            if a is None:
                return _act("datahub", "get_approver", role=role)
            if a["out_of_office"]:
                role = a["delegate_role"]
                continue
            if self.lookups.get(role, 0) < 2:
                return _act("datahub", "get_approver", role=role)
            return a["name"]
        return _act("datahub", "get_approver", role=self.role)

    def _data(self, t: dict) -> dict:
        details = t.get("details") or {}
        data = {}
        for f in self.required or ():
            if f == self.field:
                data[f] = self.m_value
            elif f in details:
                data[f] = details[f]
            elif f == "ticket_id":
                data[f] = self.ticket
        return data


def _first(pattern: re.Pattern, text: str):
    m = pattern.search(text)
    return m.group(1) if m else None
