"""What the five task families share: one workflow shape, different business content.

Every instance has a main ticket, a decision metric compared with a threshold by a policy,
an approval type whose approver role has a delegation chain, and noise (other tickets,
metrics, roles and approval types). The policy decides the right outcome:

- ``proceed``: submit the approval with correct, fresh data to an available approver, get it
  approved, link it to the ticket, verify and resolve the ticket;
- ``decline``: submit nothing, comment on the ticket and close it.

The seed decides names, ids, amounts, thresholds and the outcome; ``domain.chaos`` adds the
traps. Values of a metric are multiples of ``scale`` (1 or 0.1); they are handled as integer
multiples internally so that generated numbers are exact.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from domain.chaos import value_of, with_static_chaos
from domain.datahub import TODAY
from domain.events import (
    ApprovalTypeDefined,
    ApproverRegistered,
    MetricPublished,
    TicketCreated,
)
from domain.rng import Stream

DECLINE_SHARE = 0.4  # share of instances whose right outcome is "do not push it through"

FIRST = ("Ava", "Ben", "Chloe", "Dev", "Elena", "Farid", "Grace", "Hiro", "Ines", "Jonas",
         "Kara", "Liam", "Maya", "Nikhil", "Olga", "Pablo", "Quinn", "Rosa", "Sami", "Tara",
         "Umar", "Vera", "Wen", "Yusuf", "Zoe", "Amara", "Bruno", "Celine", "Dmitri", "Esme")
LAST = ("Adams", "Brooks", "Chen", "Diaz", "Evans", "Fischer", "Garcia", "Haddad", "Ito",
        "Jensen", "Kowalski", "Lopez", "Moreau", "Nakamura", "Okafor", "Patel", "Rossi",
        "Silva", "Tanaka", "Usman", "Varga", "Weber", "Xu", "Yilmaz", "Zhang", "Novak")
IMPACTS = ("low", "medium", "high")

NOISE_TICKETS = (
    ("Laptop battery swelling", "The laptop of a new hire has a swollen battery."),
    ("Update the onboarding slides", "Slides still show last year's org chart."),
    ("Broken link on careers page", "The 'apply' button returns a 404."),
    ("Renew office parking permits", "Permits for level B expire at month end."),
    ("Printer on floor 3 keeps jamming", "Tray 2 jams on every duplex job."),
    ("Quarterly access review", "Review admin access to the finance share."),
    ("Conference room display flickers", "The display in room Atlas flickers on HDMI."),
    ("Migrate wiki pages", "Move the team pages to the new wiki space."),
    ("Order ergonomic chairs", "Three chairs requested by the design team."),
    ("Rotate API keys", "Rotate the staging API keys before the audit."),
)
NOISE_METRICS = (
    ("headcount.engineering", "people", "Engineering headcount", 40, 160),
    ("nps.quarterly", "points", "Net promoter score, last quarter", 10, 70),
    ("uptime.api_gateway", "%", "API gateway uptime, 30 days", 97, 100),
    ("open_tickets.support", "tickets", "Open support tickets", 20, 400),
    ("churn_rate.monthly", "%", "Monthly customer churn", 1, 9),
)
NOISE_ROLES = (
    ("security_officer", "Security Officer"),
    ("legal_counsel", "Legal Counsel"),
    ("office_manager", "Office Manager"),
)
NOISE_TYPES = (
    ("travel_request", "office_manager", ["traveller", "destination", "dates"],
     "Business travel booking"),
    ("access_request", "security_officer", ["employee", "system"],
     "Access to a restricted system"),
    ("contract_review", "legal_counsel", ["counterparty", "contract_value"],
     "Legal review of a contract"),
)


class Family(NamedTuple):
    """The business content of one family. Functions receive the task's Stream."""

    name: str
    description: str
    entity: Callable[[Stream, list[str]], dict]  # (rng, people) -> ticket details + 'key'
    title: Callable[[dict], str]
    text: Callable[[dict], str]
    metric_field: str  # metric name is f"{metric_field}.{entity['key']}"
    metric_unit: str
    metric_description: Callable[[dict], str]
    op: str  # ">=" or "=="
    scale: float  # 1 or 0.1
    bounds: tuple[int, int]  # lowest and highest value, in multiples of scale
    threshold: Callable[[Stream, dict], int]  # in multiples of scale
    margin: tuple[int, int]  # distance of the true value from the threshold (multiples)
    approval_type: str
    approval_description: str
    base_fields: tuple[str, ...]
    extra_fields: tuple[str, ...]  # chaos may make these required too
    roles: tuple[tuple[str, str], ...]  # (role, title): primary, deputy, backup
    confuser: tuple[str, str, str, int, int]  # another metric of the same entity
    blockers: tuple[str, ...]  # titles of tickets that may block the main one ({x} = name)
    goal: Callable[[dict], str]
    proceed_requirements: dict  # extra fields the main ticket must have on success


class Instance(NamedTuple):
    goal: str
    budget: int  # step budget without chaos
    events: list
    target: dict


def people(rng: Stream, n: int) -> list[str]:
    return [f"{f} {last}" for f, last in zip(rng.arrangement(FIRST, n),
                                             rng.arrangement(LAST, n), strict=True)]


def email(name: str) -> str:
    return name.lower().replace(" ", ".") + "@example.com"


def slug(text: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in text.lower()).strip("_")


def build(fam: Family, seed: int) -> Instance:
    rng = Stream(seed, f"task:{fam.name}")
    folks = people(rng, 14)
    ent = fam.entity(rng, folks)
    key = ent.pop("key")
    owner, requester = folks[0], folks[1]
    # in key order, as the log holds it (canonical JSON): an episode continued from the log then
    # shows and quotes the details in the order the live one did
    details = dict(sorted({**ent, "requester": requester, "owner": owner,
                           "impact": rng.choice(IMPACTS)}.items()))
    ids = rng.sample(range(100, 1000), 8)
    main = f"T-{ids[0]}"
    metric = f"{fam.metric_field}.{key}"

    thr_k = fam.threshold(rng, ent)
    proceed = not rng.chance(DECLINE_SHARE)
    lo, hi = fam.bounds
    d = rng.randint(*fam.margin)
    if fam.op == "==":
        true_k = thr_k if proceed else thr_k + min(d, 2)
    elif proceed:
        true_k = min(hi, thr_k + d)
    else:
        true_k = max(lo, thr_k - d)
    threshold = value_of(thr_k, fam.scale)
    details_view = dict(details)
    goal = fam.goal({**details, "ticket": main, "metric": metric, "threshold": threshold,
                     "type": fam.approval_type, "role": fam.roles[0][0],
                     "role_title": fam.roles[0][1]})

    events: list = []
    # tickets: the main one among noise, in a seeded order
    n_noise = rng.randint(2, 4)
    noise = rng.sample(NOISE_TICKETS, n_noise)
    main_pos = rng.randint(0, n_noise)
    for i in range(n_noise + 1):
        if i == main_pos:
            events.append(TicketCreated(
                main, fam.title(details), fam.text(details), "open",
                "high" if fam.proceed_requirements else details["impact"], owner,
                details_view, "task", None))
        else:
            title, text = noise[i - (i > main_pos)]
            tid = f"T-{ids[1 + i]}"
            events.append(TicketCreated(
                tid, title, text, rng.choice(("open", "in_progress")), rng.choice(IMPACTS),
                rng.choice(folks[2:6]), {"requester": rng.choice(folks[6:10])}, "task", None))
    # metrics: the decision metric, a confusable one about the same entity, noise
    cname, cunit, cdesc, clo, chi = fam.confuser
    metrics = [
        MetricPublished(metric, value_of(true_k, fam.scale), fam.metric_unit,
                        fam.metric_description(details), TODAY),
        MetricPublished(f"{cname}.{key}", rng.randint(clo, chi), cunit,
                        cdesc.format(**details), TODAY),
    ]
    for name, unit, desc, mlo, mhi in rng.sample(NOISE_METRICS, 2):
        metrics.append(MetricPublished(name, rng.randint(mlo, mhi), unit, desc, TODAY))
    events.extend(rng.shuffled(metrics))
    # the approver directory: the family's chain, then other roles
    names = folks[8:]
    chain = fam.roles
    for i, (role, title) in enumerate(chain):
        delegate = chain[i + 1][0] if i + 1 < len(chain) else None
        events.append(ApproverRegistered(role, names[i], email(names[i]), title, delegate))
    for j, (role, title) in enumerate(NOISE_ROLES):
        n = names[len(chain) + j]
        events.append(ApproverRegistered(role, n, email(n), title, None))
    # approval types
    types = [ApprovalTypeDefined(fam.approval_type, chain[0][0], list(fam.base_fields),
                                 fam.approval_description)]
    for name, role, fields, desc in rng.sample(NOISE_TYPES, 2):
        types.append(ApprovalTypeDefined(name, role, list(fields), desc))
    events.extend(rng.shuffled(types))

    target = {
        "family": fam.name,
        "ticket": main,
        "expected": "proceed" if proceed else "decline",
        "metric": metric,
        "field": fam.metric_field,
        "op": fam.op,
        "threshold": threshold,
        "scale": fam.scale,
        "bounds": [lo, hi],
        "approval_type": fam.approval_type,
        "role": chain[0][0],
        "fields": {k: v for k, v in details.items()
                   if k in fam.base_fields or k in fam.extra_fields},
        "extra_fields": list(fam.extra_fields),
        "blocker_titles": [t.format(**details) for t in fam.blockers],
        "requirements": dict(fam.proceed_requirements) if proceed else {},
        "roles": [role for role, _ in chain],
        "owner": owner,
        "spread": fam.margin[1],
        "spare_ticket_ids": [f"T-{ids[6]}", f"T-{ids[7]}"],
    }
    budget = 18 + len(fam.proceed_requirements) + rng.randint(0, 4)
    return Instance(goal, budget, events, target)


def goal_text(intro: str, policy: str, ticket: str, atype: str, role: str, role_title: str,
              extra: str = "") -> str:
    """The shared wording of goals: an intro, the policy, then what to do either way."""
    return (
        f"{intro} {policy} If it qualifies: {extra}submit a '{atype}' approval to the "
        f"{role_title} (role '{role}') or, if they are away, their delegate, with every field "
        f"that approval type requires; get it approved, link it to {ticket}, mark {ticket} "
        f"verified and resolve it. If it does not qualify: submit nothing, add a comment to "
        f"{ticket} explaining why and close it."
    )


def generate(fam: Family, seed: int, chaos: float, status_under_block: bool = True) -> Instance:
    """The family's instance for `seed`, with the chaos that strikes at reset applied
    (`status_under_block`: see `with_static_chaos`)."""
    return with_static_chaos(build(fam, seed), seed, chaos, status_under_block)
