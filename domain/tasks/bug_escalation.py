"""bug_escalation: escalate a production bug only if its fresh error rate is high enough."""

from __future__ import annotations

from domain.tasks.common import Family, goal_text

_SERVICES = ("checkout", "search", "payments", "login", "notifications", "reporting",
             "media_upload", "billing")
_SYMPTOMS = ("timeouts", "HTTP 500 errors", "duplicate charges", "blank pages",
             "failed uploads", "stale results")


def _entity(rng, people):
    service = rng.choice(_SERVICES)
    return {"key": service, "service": service, "symptom": rng.choice(_SYMPTOMS),
            "customer_impact": rng.choice(("minor", "moderate", "severe")),
            "oncall": people[3]}


def _goal(d):
    return goal_text(
        f"Support asks to escalate {d['symptom']} in {d['service']} as an incident "
        f"(ticket {d['ticket']}).",
        f"Policy: escalate only if the current error rate of {d['service']} (DataHub metric "
        f"'{d['metric']}') is at least {d['threshold']} percent.",
        d["ticket"], d["type"], d["role"], d["role_title"],
        extra=f"set the priority of {d['ticket']} to critical, ")


FAMILY = Family(
    name="bug_escalation",
    description="Escalate a production bug as an incident if the service's fresh error rate "
                "crosses the bar; otherwise decline the escalation.",
    entity=_entity,
    title=lambda d: f"Escalation request: {d['symptom']} in {d['service']}",
    text=lambda d: (f"Customers report {d['symptom']} in {d['service']} "
                    f"({d['customer_impact']} impact). On call: {d['oncall']}."),
    metric_field="error_rate",
    metric_unit="%",
    metric_description=lambda d: f"Error rate of the {d['service']} service, last hour",
    op=">=",
    scale=0.1,
    bounds=(1, 400),
    threshold=lambda rng, e: rng.randint(10, 50),
    margin=(3, 30),
    approval_type="incident_escalation",
    approval_description="Open a major incident and page the incident team",
    base_fields=("service", "error_rate"),
    extra_fields=("customer_impact", "oncall"),
    roles=(("engineering_manager", "Engineering Manager"),
           ("engineering_deputy", "Deputy Engineering Manager"),
           ("cto", "Chief Technology Officer")),
    confuser=("latency_p95", "ms", "95th percentile latency of {service}", 80, 2500),
    blockers=("Attach logs for the {service} incident", "Reproduce {symptom} in staging"),
    goal=_goal,
    proceed_requirements={"priority": "critical"},
)
