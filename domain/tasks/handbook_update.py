"""handbook_update: publish a handbook change only if it was drafted on the current policy."""

from __future__ import annotations

from domain.tasks.common import Family, goal_text

_SECTIONS = ("remote_work", "parental_leave", "travel_policy", "code_of_conduct",
             "expense_policy", "security_training", "holiday_calendar", "onboarding")
_CHANGES = ("clarify eligibility", "update the approval steps", "add a FAQ",
            "align with the new law", "shorten the notice period", "add examples")


def _entity(rng, people):
    section = rng.choice(_SECTIONS)
    return {"key": section, "section": section, "summary": rng.choice(_CHANGES),
            "effective_date": f"2024-0{rng.randint(4, 9)}-01", "author": people[4]}


def _goal(d):
    return goal_text(
        f"{d['author']} drafted a change to the handbook section {d['section']} "
        f"({d['summary']}; ticket {d['ticket']}).",
        f"Policy: the draft was written against policy version {d['threshold']}; publish it "
        f"only if the current version (DataHub metric '{d['metric']}') equals "
        f"{d['threshold']}.",
        d["ticket"], d["type"], d["role"], d["role_title"])


FAMILY = Family(
    name="handbook_update",
    description="Publish an employee-handbook change if it was drafted against the current "
                "policy version; otherwise send it back.",
    entity=_entity,
    title=lambda d: f"Handbook update: {d['section']}",
    text=lambda d: (f"{d['author']} proposes to {d['summary']} in the {d['section']} "
                    f"section, effective {d['effective_date']}."),
    metric_field="policy_version",
    metric_unit="version",
    metric_description=lambda d: f"Current published version of the {d['section']} policy",
    op="==",
    scale=1,
    bounds=(1, 20),
    threshold=lambda rng, e: rng.randint(2, 9),
    margin=(1, 2),
    approval_type="handbook_update",
    approval_description="Publish a change to the employee handbook",
    base_fields=("section", "policy_version"),
    extra_fields=("effective_date", "summary"),
    roles=(("hr_director", "HR Director"),
           ("hr_deputy", "Deputy HR Director"),
           ("chief_people_officer", "Chief People Officer")),
    confuser=("policy_ack_rate", "%", "Share of staff who acknowledged {section}", 20, 100),
    blockers=("Legal review of the {section} draft", "Translate the {section} draft"),
    goal=_goal,
    proceed_requirements={},
)
