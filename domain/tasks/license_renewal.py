"""license_renewal: renew software seats only if they are used enough."""

from __future__ import annotations

from domain.tasks.common import Family, goal_text, slug

_PRODUCTS = ("Figma", "Jira", "Slack", "Zoom", "Tableau", "Miro", "GitHub", "Salesforce",
             "Notion", "Datadog")


def _entity(rng, people):
    product = rng.choice(_PRODUCTS)
    seats = rng.randint(10, 400)
    return {"key": slug(product), "product": product, "seats": seats,
            "annual_cost": seats * rng.randint(5, 40) * 12,
            "cost_center": f"CC-{rng.randint(1000, 9999)}"}


def _goal(d):
    return goal_text(
        f"The {d['product']} subscription ({d['seats']} seats) is up for renewal "
        f"(ticket {d['ticket']}).",
        f"Policy: renew only if seat utilisation (DataHub metric '{d['metric']}') is at "
        f"least {d['threshold']} percent.",
        d["ticket"], d["type"], d["role"], d["role_title"])


FAMILY = Family(
    name="license_renewal",
    description="Renew a software subscription if its fresh seat utilisation justifies it; "
                "otherwise let it lapse.",
    entity=_entity,
    title=lambda d: f"Renew {d['product']} licenses ({d['seats']} seats)",
    text=lambda d: (f"The {d['product']} subscription for {d['seats']} seats expires soon. "
                    f"Annual cost {d['annual_cost']} USD, cost center {d['cost_center']}."),
    metric_field="license_utilization",
    metric_unit="%",
    metric_description=lambda d: f"Share of {d['product']} seats used in the last 30 days",
    op=">=",
    scale=1,
    bounds=(1, 100),
    threshold=lambda rng, e: rng.randint(50, 80),
    margin=(2, 25),
    approval_type="license_renewal",
    approval_description="Renew a software subscription",
    base_fields=("product", "seats", "license_utilization"),
    extra_fields=("annual_cost", "cost_center"),
    roles=(("it_manager", "IT Manager"),
           ("it_deputy", "Deputy IT Manager"),
           ("cio", "Chief Information Officer")),
    confuser=("license_seats", "seats", "Seats currently provisioned for {product}", 5, 500),
    blockers=("Confirm the seat count for {product}", "Collect the {product} usage export"),
    goal=_goal,
    proceed_requirements={},
)
