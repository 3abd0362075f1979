"""expense_report: file an expense claim only if the department budget still covers it."""

from __future__ import annotations

from domain.tasks.common import Family, goal_text

_DEPTS = ("marketing", "sales", "engineering", "support", "design", "research")
_PURPOSE = ("a client dinner", "conference travel", "a team offsite", "software training",
            "a trade-show booth", "customer visits")


def _entity(rng, people):
    dept = rng.choice(_DEPTS)
    return {"key": dept, "employee": people[2], "department": dept,
            "amount": rng.randint(200, 4000), "purpose": rng.choice(_PURPOSE),
            "receipt_id": f"RCPT-{rng.randint(10000, 99999)}",
            "cost_center": f"CC-{rng.randint(1000, 9999)}"}


def _goal(d):
    return goal_text(
        f"{d['employee']} filed an expense report of {d['amount']} USD for {d['purpose']} "
        f"(ticket {d['ticket']}).",
        f"Policy: an expense may be approved only if the remaining budget of the "
        f"{d['department']} department (DataHub metric '{d['metric']}') is at least "
        f"{d['threshold']}, the claimed amount.",
        d["ticket"], d["type"], d["role"], d["role_title"])


FAMILY = Family(
    name="expense_report",
    description="Get an employee's expense report approved if the department's fresh "
                "remaining budget covers it; otherwise decline it.",
    entity=_entity,
    title=lambda d: f"Expense report: {d['employee']}, {d['amount']} USD",
    text=lambda d: (f"{d['employee']} ({d['department']}) claims {d['amount']} USD for "
                    f"{d['purpose']}. Receipt {d['receipt_id']}, cost center "
                    f"{d['cost_center']}."),
    metric_field="budget_remaining",
    metric_unit="USD",
    metric_description=lambda d: f"Remaining budget of the {d['department']} department",
    op=">=",
    scale=1,
    bounds=(0, 60000),
    threshold=lambda rng, e: e["amount"],
    margin=(50, 3000),
    approval_type="expense_report",
    approval_description="Reimburse an employee's business expense",
    base_fields=("employee", "amount", "budget_remaining"),
    extra_fields=("receipt_id", "cost_center"),
    roles=(("finance_manager", "Finance Manager"),
           ("finance_deputy", "Deputy Finance Manager"),
           ("cfo", "Chief Financial Officer")),
    confuser=("expenses_ytd", "USD", "Expenses so far this year, {department}", 1000, 90000),
    blockers=("Missing receipt scan from {employee}", "Confirm cost center for {employee}"),
    goal=_goal,
    proceed_requirements={},
)
