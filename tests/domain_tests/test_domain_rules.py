"""Chaos, tasks, rewards and failure modes."""

from __future__ import annotations

from collections import Counter

import pytest
from domain_helpers import act, find_seed, good_data, play

from domain import (
    CHAOS_LEVELS,
    FAILURE_MODES,
    REWARD_PROFILES,
    TASK_FAMILIES,
    EpisodeSpec,
    parse_chaos,
    reset,
    step,
)
from domain.chaos import MECHANISMS, SPRUNG_BY_THE_AGENT
from domain.events import (
    ApproverWentOutOfOffice,
    EpisodeEnded,
    MetricWentStale,
    MistakeRecorded,
    RewardGranted,
    TicketBlocked,
)

# --- chaos -------------------------------------------------------------------------------


def test_parse_chaos():
    assert parse_chaos("none") == 0.0 and parse_chaos(" HIGH ") == CHAOS_LEVELS["high"]
    assert parse_chaos(0.3) == 0.3 and parse_chaos("0.7") == 0.7 and parse_chaos(1) == 1.0
    assert CHAOS_LEVELS["none"] < CHAOS_LEVELS["low"] < CHAOS_LEVELS["medium"] < \
        CHAOS_LEVELS["high"] <= 1.0
    assert parse_chaos(".5") == parse_chaos("5e-1") == parse_chaos("+0.5") == 0.5
    for bad in ("chaotic", 1.5, -0.1, float("nan"), True, None, [0.2]):
        with pytest.raises(ValueError):
            parse_chaos(bad)
    # text is an ASCII decimal, as every other number: float() read full-width digits, and `0_5`
    # as 5 ("outside [0, 1]", a puzzle for whoever typed 0.5)
    for bad in ("\uff10.5", "0_5", "nan", "inf", "1,5", ""):
        with pytest.raises(ValueError, match="unknown chaos level"):
            parse_chaos(bad)


@pytest.mark.parametrize("zero", [-0.0, "-0", "-0.0", 0, "none"])
def test_every_spelling_of_chaos_zero_gives_the_same_episode(zero):
    """-0.0 is 0 as a level, but canonical JSON keeps its sign: it logged a different stream."""
    assert repr(parse_chaos(zero)) == "0.0"
    _, events, _ = reset(EpisodeSpec("expense_report", 7, parse_chaos(zero)))
    assert events == reset(EpisodeSpec("expense_report", 7, 0.0))[1]


def _chaos_events(steps):
    return [e for st in steps for e in st if getattr(e, "cause", None) == "chaos"]


def test_no_chaos_at_none_and_every_mechanism_fires_at_high():
    fired = Counter()
    for task in TASK_FAMILIES:
        for seed in range(30):
            assert not _chaos_events(play(task, seed, "none")[1])
            for e in _chaos_events(play(task, seed, "high")[1]):
                assert e.mechanism in MECHANISMS
                fired[e.mechanism] += 1
    assert set(fired) == set(MECHANISMS), set(MECHANISMS) - set(fired)


def test_the_mechanisms_said_to_be_sprung_by_the_agent_never_fire_at_reset():
    """chaos_impact's note tells the two kinds apart: a mechanism set at reset is a fair trial of
    the agent, one the agent's own calls spring is met only by agents that get that far."""
    at_reset, later = set(), set()
    for task in TASK_FAMILIES:
        for seed in range(30):
            first, *rest = play(task, seed, "high")[1]
            at_reset |= {e.mechanism for e in _chaos_events([first])}
            later |= {e.mechanism for e in _chaos_events(rest)}
    assert at_reset == set(MECHANISMS) - set(SPRUNG_BY_THE_AGENT)
    assert later == set(SPRUNG_BY_THE_AGENT)


def test_chaos_grows_with_level():
    counts = {}
    for level in ("low", "medium", "high"):
        counts[level] = sum(len(_chaos_events(play(t, s, level, "noop")[1]))
                            for t in TASK_FAMILIES for s in range(20))
    assert counts["low"] < counts["medium"] < counts["high"]


# --- tasks -------------------------------------------------------------------------------


def test_task_families_vary_and_sometimes_must_not_be_pushed_through():
    assert set(TASK_FAMILIES) == {"vendor_onboarding", "expense_report", "bug_escalation",
                                  "license_renewal", "handbook_update"}
    for name, fam in TASK_FAMILIES.items():
        assert fam.description and "\n" not in fam.description
        expected = Counter()
        tickets = set()
        for seed in range(100):
            s = reset(EpisodeSpec(name, seed, "none"))[0]
            expected[s.target["expected"]] += 1
            tickets.add(s.target["ticket"])
            assert s.max_steps > 10 and s.target["ticket"] in s.goal
        assert expected["proceed"] >= 35 and expected["decline"] >= 20, (name, expected)
        assert len(tickets) >= 80


# --- rewards -----------------------------------------------------------------------------


def _grants(steps):
    return [e for st in steps for e in st if type(e) is RewardGranted]


def test_no_milestone_pays_twice():
    once = {r.name for r in REWARD_PROFILES["default"] if r.once}
    for task in TASK_FAMILIES:
        for seed in range(6):
            for agent in ("random", "expert"):
                for level in ("none", "high"):
                    c = Counter(g.rule for g in _grants(play(task, seed, level, agent)[1]))
                    assert all(c[name] <= 1 for name in once), c


def test_milestones_cannot_be_farmed():
    # rules version 1 pays for verifying at any time: the farm below is the one paying once stops
    s, _, _ = reset(EpisodeSpec("expense_report", 3, "none", rules=1))
    main, metric = s.target["ticket"], s.target["metric"]
    farm = [act("datahub", "query_metric", metric_name=metric),
            act("ticketdesk", "update_ticket", ticket_id=main, field="verified", value=True),
            act("ticketdesk", "update_ticket", ticket_id=main, field="verified", value=False)]
    pays = Counter()
    for i in range(15):
        s, events, info = step(s, farm[i % 3])
        for e in events:
            if type(e) is RewardGranted:
                pays[e.rule] += 1
    assert pays["query_fresh_data"] == 1 and pays["verify_ticket"] == 1
    assert pays["step"] == 15


def test_grant_cause_points_at_the_triggering_event():
    for task in TASK_FAMILIES:
        s, steps = play(task, 2, "medium", "random")
        log = [e for st in steps for e in st]
        for g in (e for e in log if type(e) is RewardGranted):
            rule = next(r for r in REWARD_PROFILES["default"] if r.name == g.rule)
            assert type(log[g.cause]) is rule.event_type


def test_default_and_sparse_profiles():
    rules = {r.name: r.value for r in REWARD_PROFILES["default"]}
    assert rules["step"] == -0.1 and rules["success"] == 15.0 and rules["timeout"] == -5.0
    assert rules["set_missing_priority"] == 1.0 and rules["verify_ticket"] == 1.5
    assert rules["approved"] == 3.0 and rules["valid_submission"] == 2.0
    assert rules["unknown_tool"] == -1.0 and rules["failed_call"] == -0.3
    for task in TASK_FAMILIES:
        s, steps = play(task, 1, "low", profile="sparse")
        assert s.outcome == "success" and s.total_return == 1.0
        s, steps = play(task, 1, "low", "noop", profile="sparse")
        assert s.total_return == 0.0 and not _grants(steps)


def test_step_reward_is_sum_of_grants():
    s, _, _ = reset(EpisodeSpec("license_renewal", 5, "medium"))
    s, events, info = step(s, "garbage")
    assert info.reward == pytest.approx(sum(e.value for e in events if type(e) is RewardGranted))
    assert info.reward == pytest.approx(-1.1)


# --- termination and failure modes --------------------------------------------------------


def test_every_non_success_has_exactly_one_documented_failure_mode():
    for task in TASK_FAMILIES:
        for seed in range(10):
            for agent in ("random", "noop", "expert"):
                s, steps = play(task, seed, "medium", agent)
                ends = [e for st in steps for e in st if type(e) is EpisodeEnded]
                assert len(ends) == 1 and steps[-1][-1] is ends[0]
                end = ends[0]
                if end.outcome == "success":
                    assert end.failure_mode is None
                else:
                    assert end.failure_mode in FAILURE_MODES


def _blocked(events):
    return any(type(e) is TicketBlocked for e in events)


def test_closing_a_blocked_ticket_is_irreversible():
    seed = find_seed("vendor_onboarding", "high", _blocked)
    s, _, _ = reset(EpisodeSpec("vendor_onboarding", seed, "high"))
    main = s.target["ticket"]
    s, events, info = step(s, act("ticketdesk", "update_ticket", ticket_id=main,
                                  field="status", value="closed"))
    assert s.done and s.outcome == "failure" and info.terminated
    assert s.failure_mode == "blocked_ticket_mishandled"
    assert any(type(e) is MistakeRecorded and e.irreversible for e in events)
    assert any(type(e) is RewardGranted and e.rule == "irreversible_mistake" for e in events)


def test_submitting_to_an_out_of_office_approver_is_irreversible():
    seed = find_seed("expense_report", "high",
                     lambda ev: any(type(e) is ApproverWentOutOfOffice for e in ev)
                     and ev[0].target["expected"] == "proceed")
    s, _, _ = reset(EpisodeSpec("expense_report", seed, "high"))
    tg = s.target
    away = s.world.datahub.approvers[tg["role"]]
    assert away["out_of_office"]
    data = {f: tg["fields"].get(f, 1) for f in s.world.approvalflow.types[tg["approval_type"]]
            ["required_fields"]}
    data[tg["field"]] = 1
    s, events, info = step(s, act("approvalflow", "submit_approval",
                                  approval_type=tg["approval_type"], approver=away["name"],
                                  data=data))
    assert s.outcome == "failure" and s.failure_mode == "routed_to_ooo_approver"


def test_deciding_on_stale_data_is_blamed_on_stale_data():
    def misleading(ev):
        st = [e for e in ev if type(e) is MetricWentStale]
        if not st or ev[0].target["expected"] != "decline":
            return False
        tg = ev[0].target
        return st[0].value >= tg["threshold"] if tg["op"] == ">=" else \
            st[0].value == tg["threshold"]
    seed = find_seed("license_renewal", "high", misleading)
    s, _, _ = reset(EpisodeSpec("license_renewal", seed, "high"))
    tg = s.target
    s, _, info = step(s, act("datahub", "query_metric", metric_name=tg["metric"]))
    assert info.result["stale"] and info.result["warnings"]
    lead = next(a for a in s.world.datahub.approvers.values()
                if a["role"] in tg["roles"] and not a["out_of_office"])
    data = {f: tg["fields"].get(f, info.result["value"])
            for f in s.world.approvalflow.types[tg["approval_type"]]["required_fields"]}
    s, events, info = step(s, act("approvalflow", "submit_approval",
                                  approval_type=tg["approval_type"], approver=lead["name"],
                                  data=data))
    if not s.done:  # a transient outage: try again
        s, events, info = step(s, act("approvalflow", "submit_approval",
                                      approval_type=tg["approval_type"], approver=lead["name"],
                                      data=data))
    assert s.outcome == "failure" and s.failure_mode == "stale_data_used"


def test_truncation_is_blamed_on_the_first_unrepaired_mistake():
    s, _, _ = reset(EpisodeSpec("handbook_update", 0, "none", max_steps=4))
    tg = s.target
    lead = s.world.datahub.approvers[tg["role"]]["name"]
    bad = act("approvalflow", "submit_approval", approval_type=tg["approval_type"],
              approver=lead, data={})
    s, _, _ = step(s, bad)  # missing fields: the first decisive mistake
    for _ in range(3):
        s, events, info = step(s, "nonsense")
    assert s.outcome == "truncated" and info.truncated
    assert s.failure_mode == "missing_required_fields"


def test_truncation_after_mostly_invalid_calls():
    s, _, _ = reset(EpisodeSpec("bug_escalation", 0, "none", max_steps=5))
    for _ in range(5):
        s, events, info = step(s, {"app": "nope"})
    assert s.failure_mode == "invalid_tool_calls"


def test_failure_modes_are_documented():
    assert {"stale_data_used", "routed_to_ooo_approver", "missing_required_fields",
            "rejection_not_handled", "blocked_ticket_mishandled", "irreversible_action",
            "invalid_tool_calls", "step_budget_exhausted"} <= set(FAILURE_MODES)
    assert all(isinstance(v, str) and v for v in FAILURE_MODES.values())


def _submit(s, approver, data):
    tg = s.target
    return step(s, act("approvalflow", "submit_approval", approval_type=tg["approval_type"],
                       approver=approver, data=data))


def _first(task, expected):
    return find_seed(task, "none", lambda ev: ev[0].target["expected"] == expected)


def test_decision_modes_wrong_decision_and_irreversible_action():
    seed = _first("vendor_onboarding", "decline")
    s, _, _ = reset(EpisodeSpec("vendor_onboarding", seed, "none"))
    lead = s.world.datahub.approvers[s.target["role"]]["name"]
    blind, _, _ = _submit(s, lead, good_data(s))
    assert blind.outcome == "failure" and blind.failure_mode == "irreversible_action"
    s, _, info = step(s, act("datahub", "query_metric", metric_name=s.target["metric"]))
    assert not info.result["stale"]
    s, _, _ = _submit(s, lead, good_data(s))
    assert s.outcome == "failure" and s.failure_mode == "wrong_decision"
    seed = _first("expense_report", "proceed")
    s, _, _ = reset(EpisodeSpec("expense_report", seed, "none"))
    s, _, _ = step(s, act("ticketdesk", "update_ticket", ticket_id=s.target["ticket"],
                          field="status", value="closed"))
    assert s.outcome == "failure" and s.failure_mode == "irreversible_action"


def test_incorrect_submission_is_blamed_before_the_rejection_it_causes():
    seed = _first("license_renewal", "proceed")
    s, _, _ = reset(EpisodeSpec("license_renewal", seed, "none", max_steps=7))
    lead = s.world.datahub.approvers[s.target["role"]]["name"]
    s, _, _ = step(s, act("datahub", "query_metric", metric_name=s.target["metric"]))  # read first
    data = {**good_data(s), "product": "Something Else"}
    s, events, _ = _submit(s, lead, data)
    aid = events[1].approval_id
    s, _, info = step(s, act("approvalflow", "check_status", approval_id=aid))
    assert info.result["status"] == "rejected" and "does not match" in info.result["reason"]
    while not s.done:
        s, _, _ = step(s, act("ticketdesk", "list_tickets"))
    assert [m.mode for m in s.mistakes] == ["incorrect_submission", "rejection_not_handled"]
    assert s.failure_mode == "incorrect_submission"


def test_a_repaired_mistake_is_not_blamed():
    seed = _first("handbook_update", "proceed")
    s, _, _ = reset(EpisodeSpec("handbook_update", seed, "none", max_steps=4))
    lead = s.world.datahub.approvers[s.target["role"]]["name"]
    s, _, _ = step(s, act("datahub", "query_metric", metric_name=s.target["metric"]))  # read first
    s, _, _ = _submit(s, lead, {})
    s, _, _ = _submit(s, lead, good_data(s))
    s, _, _ = step(s, act("ticketdesk", "list_tickets"))
    assert s.outcome == "truncated" and [m.mode for m in s.mistakes] == [
        "missing_required_fields"]
    assert s.failure_mode == "step_budget_exhausted"


def test_an_ignored_rejection_is_rejection_not_handled():
    from companyos.agents import make_agent
    from domain import observe
    for seed in range(200):
        agent = make_agent("expert", seed)
        s, _, info = reset(EpisodeSpec("bug_escalation", seed, "high"))
        if s.target["expected"] != "proceed":
            continue
        obs = observe(s, info)
        agent.reset(obs)
        rejected = False
        while not s.done:
            a = act("ticketdesk", "list_tickets") if rejected else agent.act(obs)
            s, _, info = step(s, a)
            obs = observe(s, info)
            rejected = rejected or (isinstance(info.result, dict)
                                    and info.result.get("status") == "rejected")
        if rejected:
            assert s.outcome == "truncated" and s.failure_mode == "rejection_not_handled"
            return
    raise AssertionError("no random rejection found")


def test_closing_a_blocker_instead_of_resolving_it_is_irreversible():
    seed = find_seed("bug_escalation", "high", _blocked)
    s, events, _ = reset(EpisodeSpec("bug_escalation", seed, "high"))
    blocker = s.world.ticketdesk.tickets[s.target["ticket"]]["blocked_by"]
    while s.world.ticketdesk.tickets[blocker]["blocked_by"]:
        blocker = s.world.ticketdesk.tickets[blocker]["blocked_by"]
    s, _, _ = step(s, act("ticketdesk", "update_ticket", ticket_id=blocker, field="status",
                          value="closed"))
    if not s.done:  # a transient outage: try again
        s, _, _ = step(s, act("ticketdesk", "update_ticket", ticket_id=blocker,
                              field="status", value="closed"))
    assert s.outcome == "failure" and s.failure_mode == "blocked_ticket_mishandled"
