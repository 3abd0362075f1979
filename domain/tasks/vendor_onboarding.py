"""vendor_onboarding: onboard a supplier only if its fresh compliance score passes."""

from __future__ import annotations

from domain.tasks.common import Family, goal_text, slug

_ADJ = ("Northwind", "Bluepeak", "Ironleaf", "Silverline", "Brightwater", "Redstone",
        "Greenfield", "Oakridge", "Starling", "Copperhill", "Lumen", "Harbor")
_NOUN = ("Logistics", "Analytics", "Supplies", "Systems", "Foods", "Labs", "Partners",
         "Print", "Energy", "Security")
_CATEGORY = ("office supplies", "cloud hosting", "catering", "courier services",
             "security audits", "market research", "hardware leasing")


def _entity(rng, people):
    vendor = f"{rng.choice(_ADJ)} {rng.choice(_NOUN)}"
    return {"key": slug(vendor), "vendor": vendor, "category": rng.choice(_CATEGORY),
            "contract_value": rng.randint(5, 250) * 1000,
            "cost_center": f"CC-{rng.randint(1000, 9999)}"}


def _goal(d):
    return goal_text(
        f"{d['requester']} wants {d['vendor']} onboarded as a supplier of {d['category']} "
        f"(ticket {d['ticket']}).",
        f"Policy: a vendor may be onboarded only if its current compliance score (DataHub "
        f"metric '{d['metric']}') is at least {d['threshold']}.",
        d["ticket"], d["type"], d["role"], d["role_title"])


FAMILY = Family(
    name="vendor_onboarding",
    description="Onboard a new supplier if its fresh compliance score meets the policy; "
                "otherwise decline it.",
    entity=_entity,
    title=lambda d: f"Onboard vendor {d['vendor']}",
    text=lambda d: (f"{d['requester']} asks to onboard {d['vendor']} for {d['category']}. "
                    f"Contract value {d['contract_value']} USD/year, cost center "
                    f"{d['cost_center']}."),
    metric_field="compliance_score",
    metric_unit="points",
    metric_description=lambda d: f"Compliance score (0-100) of vendor {d['vendor']}",
    op=">=",
    scale=1,
    bounds=(5, 100),
    threshold=lambda rng, e: rng.randint(60, 80),
    margin=(3, 20),
    approval_type="vendor_onboarding",
    approval_description="Add a new vendor to the approved supplier list",
    base_fields=("vendor", "compliance_score"),
    extra_fields=("cost_center", "contract_value"),
    roles=(("procurement_lead", "Procurement Lead"),
           ("procurement_deputy", "Deputy Procurement Lead"),
           ("operations_director", "Director of Operations")),
    confuser=("vendor_spend", "USD", "Spend with {vendor} this year", 0, 90000),
    blockers=("Collect the W-9 tax form from {vendor}", "Security questionnaire for {vendor}"),
    goal=_goal,
    proceed_requirements={},
)
