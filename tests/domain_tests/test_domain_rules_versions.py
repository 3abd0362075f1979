"""Rules versions: version 2 closes the gaps version 1 left, and version 1 still judges as it did,
so a log written before versions existed re-runs to the same events."""

from __future__ import annotations

import pytest
from domain_helpers import act, find_seed, good_data, play

from domain import (
    CURRENT_RULES,
    RULES_VERSIONS,
    TASK_FAMILIES,
    EpisodeSpec,
    checked_rules,
    reset,
    rules_of,
    rules_standing,
    step,
)
from domain.events import (
    ApprovalSubmitted,
    ApproverWentOutOfOffice,
    EpisodeStarted,
    MetricWentStale,
    RewardGranted,
)


def _decline_seed(task="license_renewal", chaos="none"):
    return find_seed(task, chaos, lambda ev: ev[0].target["expected"] == "decline")


def _comment_and_close(s):
    ticket = s.target["ticket"]
    s, _, _ = step(s, act("ticketdesk", "add_comment", ticket_id=ticket, text="does not qualify"))
    s, events, _ = step(s, act("ticketdesk", "update_ticket", ticket_id=ticket, field="status",
                               value="closed"))
    return s, events


def test_the_latest_rules_are_the_default_and_version_1_leaves_the_start_as_it_was():
    assert CURRENT_RULES == max(RULES_VERSIONS) == 4
    assert checked_rules(None) == CURRENT_RULES
    old, _, _ = reset(EpisodeSpec("expense_report", 3, "medium", rules=1))
    new, events, _ = reset(EpisodeSpec("expense_report", 3, "medium"))
    assert "rules" not in old.target and rules_of(old.target) == 1  # as every log before versions
    assert type(events[0]) is EpisodeStarted and events[0].target["rules"] == 4 == rules_of(new.target)
    assert {k: v for k, v in new.target.items() if k != "rules"} == old.target
    for bad in (0, 5):
        with pytest.raises(ValueError, match=f"no rules version {bad}; the versions are 1, 2, 3, 4"):
            reset(EpisodeSpec("expense_report", 3, "medium", rules=bad))
    for bad, shown in ((True, "True"), ("2", "'2'"), (2.0, "2.0")):  # not a version: said as given
        with pytest.raises(ValueError, match=f"rules must be a whole number, one of the versions 1, 2, 3, 4, "
                                             f"not {shown}$"):
            reset(EpisodeSpec("expense_report", 3, "medium", rules=bad))


def test_a_blind_decline_succeeds_under_version_1_and_is_an_irreversible_mistake_under_2():
    seed = _decline_seed()
    old, _ = _comment_and_close(reset(EpisodeSpec("license_renewal", seed, "none", rules=1))[0])
    assert old.outcome == "success"
    new, events = _comment_and_close(reset(EpisodeSpec("license_renewal", seed, "none"))[0])
    assert (new.outcome, new.failure_mode) == ("failure", "irreversible_action")
    assert "without a fresh read" in new.mistakes[0].detail
    assert any(type(e) is RewardGranted and e.rule == "irreversible_mistake" for e in events)


def test_a_decline_after_a_fresh_read_succeeds_and_after_a_stale_one_is_blamed_on_stale_data():
    seed = _decline_seed()
    s, _, _ = reset(EpisodeSpec("license_renewal", seed, "none"))
    s, _, info = step(s, act("datahub", "query_metric", metric_name=s.target["metric"]))
    assert not info.result["stale"]
    assert _comment_and_close(s)[0].outcome == "success"

    def stale_decline(ev):
        return ev[0].target["expected"] == "decline" and any(
            type(e) is MetricWentStale and e.name == ev[0].target["metric"] for e in ev)
    seed = find_seed("license_renewal", "high", stale_decline)
    for rules, outcome, mode in ((1, "success", None), (2, "failure", "stale_data_used")):
        s, _, _ = reset(EpisodeSpec("license_renewal", seed, "high", rules=rules))
        while True:  # a transient outage refuses the query: ask again
            s, _, info = step(s, act("datahub", "query_metric", metric_name=s.target["metric"]))
            if info.result is not None:
                break
        assert info.result["stale"]
        s, _ = _comment_and_close(s)
        while not s.done and s.world.ticketdesk.tickets[s.target["ticket"]]["status"] != "closed":
            s, _ = _comment_and_close(s)  # an outage again
        assert (s.outcome, s.failure_mode) == (outcome, mode)


def _stale_again_after_a_fresh_read(rules):
    """A proceed instance whose metric went stale again right after its first fresh read: closing
    its ticket then is a wrong decision made on data that moved on."""
    for task in TASK_FAMILIES:
        for seed in range(300):
            s, _, _ = reset(EpisodeSpec(task, seed, 1.0, rules=rules))
            tg = s.target
            if (tg["expected"] != "proceed" or s.world.datahub.metrics[tg["metric"]]["stale"]
                    or s.world.ticketdesk.tickets[tg["ticket"]]["blocked_by"] is not None):
                continue
            s, events, info = step(s, act("datahub", "query_metric", metric_name=s.target["metric"]))
            if info.result is None or info.result["stale"]:
                continue
            if any(type(e) is MetricWentStale and e.mechanism == "stale_again" for e in events):
                ticket = s.target["ticket"]
                s, _, info = step(s, act("ticketdesk", "update_ticket", ticket_id=ticket,
                                         field="status", value="closed"))
                if s.done:
                    return s
    raise AssertionError("no instance found")


def test_a_wrong_decision_after_the_metric_went_stale_again_is_a_wrong_decision_in_every_version():
    """`stale_again` keeps the value on its side of the policy: the decision was wrong on the fresh
    read too, so stale data did not cause it (a draft of version 2 blamed stale data)."""
    assert _stale_again_after_a_fresh_read(1).failure_mode == "wrong_decision"
    assert _stale_again_after_a_fresh_read(2).failure_mode == "wrong_decision"


def test_a_decline_on_a_fresh_read_succeeds_after_a_second_read_that_is_stale():
    """A draft of version 2 judged by the last read alone, so checking the value again after
    `stale_again` turned a right decline into a failure: agents would learn to check less."""
    for task in TASK_FAMILIES:
        for seed in range(300):
            s, _, _ = reset(EpisodeSpec(task, seed, "high"))
            tg = s.target
            if (tg["expected"] != "decline" or s.world.datahub.metrics[tg["metric"]]["stale"]
                    or s.world.ticketdesk.tickets[tg["ticket"]]["blocked_by"] is not None):
                continue
            query = act("datahub", "query_metric", metric_name=tg["metric"])
            s, events, info = step(s, query)
            if not any(type(e) is MetricWentStale for e in events):
                continue
            s, _, info = step(s, query)
            if info.result is None or not info.result["stale"]:
                continue
            s, _ = _comment_and_close(s)
            if s.done:
                assert s.outcome == "success", (task, seed, s.failure_mode)
                return
    raise AssertionError("no instance found")


def _grants(events):
    return [e.rule for e in events if type(e) is RewardGranted]


def test_verifying_pays_only_once_the_ticket_is_linked_to_the_approved_request_from_version_2():
    seed = find_seed("expense_report", "none", lambda ev: ev[0].target["expected"] == "proceed")
    verify = act("ticketdesk", "update_ticket", ticket_id=None, field="verified", value=True)
    for rules, paid in ((1, ["step", "verify_ticket"]), (2, ["step"])):
        s, _, _ = reset(EpisodeSpec("expense_report", seed, "none", rules=rules))
        verify["params"]["ticket_id"] = s.target["ticket"]
        s, events, _ = step(s, verify)
        assert s.world.ticketdesk.tickets[s.target["ticket"]]["verified"]
        assert _grants(events) == paid
    # the expert verifies once the request is approved and linked: version 2 pays it then
    for rules in (1, 2):
        s, steps = play("expense_report", seed, "none", rules=rules)
        assert s.outcome == "success"
        assert [g for events in steps for g in _grants(events)].count("verify_ticket") == 1


def _proceed(task="expense_report", chaos="none", rules=None):
    seed = find_seed(task, chaos, lambda ev: ev[0].target["expected"] == "proceed")
    return reset(EpisodeSpec(task, seed, chaos, rules=rules))[0]


def _submit_to(s, role):
    tg = s.target
    name = s.world.datahub.approvers[role]["name"]
    s, _, _ = step(s, act("datahub", "query_metric", metric_name=tg["metric"]))
    return step(s, act("approvalflow", "submit_approval", approval_type=tg["approval_type"],
                       approver=name, data=good_data(s)))


def test_a_request_sent_past_an_available_approver_is_objected_to_from_version_2():
    deputy = None
    for rules in (1, 2):
        s = _proceed(rules=rules)
        primary, deputy = s.target["roles"][:2]
        assert not s.world.datahub.approvers[primary]["out_of_office"]
        s, events, _ = _submit_to(s, deputy)
        submitted = events[1]
        if rules == 1:
            assert submitted.problems == [] and "valid_submission" in _grants(events)
            continue
        # who is available is not said: an agent sending every request to the end of the chain
        # resubmitted to the name the objection gave, never checking who was away
        assert submitted.problems == [
            f"{s.world.datahub.approvers[deputy]['name']} ({deputy}) is a delegate, and an approver "
            "before them on the delegation chain is available to approve it"]
        assert "valid_submission" not in _grants(events)
        assert [m.mode for m in s.mistakes] == ["incorrect_submission"]
        while True:  # the reviewer says why it is rejected
            s, _, info = step(s, act("approvalflow", "check_status", approval_id=submitted.approval_id))
            if info.result["status"] != "pending":
                break
        assert info.result["status"] == "rejected" and "is a delegate" in info.result["reason"]
        s, events, _ = _submit_to(s, primary)  # put right by a request to the approver
        assert _submitted(events).problems == [] and "valid_submission" in _grants(events)


def _submitted(events):
    return next(e for e in events if type(e) is ApprovalSubmitted)


def test_a_delegate_is_the_right_approver_when_everyone_before_them_is_away():
    def primary_away(ev):
        return ev[0].target["expected"] == "proceed" and any(
            type(e) is ApproverWentOutOfOffice and e.role == ev[0].target["roles"][0] for e in ev)
    seed = find_seed("license_renewal", "high", primary_away)
    s, _, _ = reset(EpisodeSpec("license_renewal", seed, "high"))
    deputy = s.target["roles"][1]
    assert not s.world.datahub.approvers[deputy]["out_of_office"]
    events = []
    while not any(type(e) is ApprovalSubmitted for e in events):  # an outage refuses a call: again
        s, events, _ = _submit_to(s, deputy)
    assert not any("is a delegate" in p for p in _submitted(events).problems)


def _triaged(s):
    ticket = s.target["ticket"]
    t = s.world.ticketdesk.tickets[ticket]
    for field, value in (("status", "in_progress"), ("priority", "high"), ("assignee", "Ava Adams")):
        if t[field] is None:
            s, _, _ = step(s, act("ticketdesk", "update_ticket", ticket_id=ticket, field=field, value=value))
    return s


def test_resolving_before_the_task_is_done_is_a_mistake_from_version_2_and_can_be_put_right():
    for rules in (1, 2):
        s = _triaged(_proceed(rules=rules))
        ticket = s.target["ticket"]
        s, events, _ = step(s, act("ticketdesk", "update_ticket", ticket_id=ticket, field="status",
                                   value="resolved"))
        assert s.world.ticketdesk.tickets[ticket]["status"] == "resolved" and not s.done
        if rules == 1:
            assert s.mistakes == ()
            continue
        (mistake,) = s.mistakes
        assert mistake.mode == "premature_resolution" and not mistake.irreversible
        assert mistake.detail.endswith("not verified; no approved request linked")
        ended = s
        while not ended.done:
            ended, _, _ = step(ended, act("ticketdesk", "list_tickets"))
        assert (ended.outcome, ended.failure_mode) == ("truncated", "premature_resolution")
        # finishing the work afterwards is a success: the mistake was put right
        s, events, _ = _submit_to(s, s.target["roles"][0])
        approval = events[1].approval_id
        while s.world.approvalflow.approvals[approval]["status"] != "approved":
            s, _, _ = step(s, act("approvalflow", "check_status", approval_id=approval))
        for field, value in (("linked_approval", approval), ("verified", True)):
            s, _, _ = step(s, act("ticketdesk", "update_ticket", ticket_id=ticket, field=field, value=value))
        assert s.outcome == "success"


def test_a_request_without_a_fresh_read_is_an_irreversible_mistake_from_version_2():
    """handbook_update's policy is an equality: a request that qualifies holds the threshold the
    goal names, so sending that figure unread succeeded on every such instance under version 1."""
    seed = find_seed("handbook_update", "none", lambda ev: ev[0].target["expected"] == "proceed")
    for rules, outcome, mode in ((1, None, None), (2, "failure", "irreversible_action")):
        s, _, _ = reset(EpisodeSpec("handbook_update", seed, "none", rules=rules))
        tg = s.target
        data = {f: tg["threshold"] if f == tg["field"] else tg["fields"][f]
                for f in s.world.approvalflow.types[tg["approval_type"]]["required_fields"]}
        s, events, _ = step(s, act("approvalflow", "submit_approval", approval_type=tg["approval_type"],
                                   approver=s.world.datahub.approvers[tg["role"]]["name"], data=data))
        assert _submitted(events).problems == []  # the guess is right
        assert (s.outcome, s.failure_mode) == (outcome, mode)
        assert ("valid_submission" in _grants(events)) == (rules == 1)


def test_a_request_the_policy_forbids_earns_no_valid_submission_from_version_2():
    seed = _decline_seed()
    for rules in (1, 2):
        s, _, _ = reset(EpisodeSpec("license_renewal", seed, "none", rules=rules))
        s, events, _ = _submit_to(s, s.target["roles"][0])
        assert (s.outcome, s.failure_mode) == ("failure", "wrong_decision")
        assert ("valid_submission" in _grants(events)) == (rules == 1)


def test_a_premature_resolution_does_not_hide_the_mistake_that_kept_the_work_from_being_done():
    s = _triaged(_proceed())
    tg = s.target
    s, _, _ = step(s, act("ticketdesk", "update_ticket", ticket_id=tg["ticket"], field="status",
                          value="resolved"))
    s, _, _ = step(s, act("datahub", "query_metric", metric_name=tg["metric"]))
    s, _, _ = step(s, act("approvalflow", "submit_approval", approval_type=tg["approval_type"],
                          approver=s.world.datahub.approvers[tg["role"]]["name"],
                          data={**good_data(s), next(iter(tg["fields"])): "Something Else"}))
    while not s.done:
        s, _, _ = step(s, act("ticketdesk", "list_tickets"))
    assert [m.mode for m in s.mistakes][:2] == ["premature_resolution", "incorrect_submission"]
    assert s.failure_mode == "incorrect_submission"


def test_from_version_3_refreshing_a_fresh_metric_leaves_its_reads_fresh():
    """A query while a slow refresh of a fresh metric ran read as STALE, so a wrong decision on it
    was labelled stale_data_used (the taxonomy then sent researchers after the wrong cause).
    Version 2 still does so, so its logs re-run to the same events. Seed 13 at `high`: a decline
    whose metric never goes stale and whose refresh is slow."""
    metric = "compliance_score.starling_energy"
    submit = act("approvalflow", "submit_approval", approval_type="vendor_onboarding",
                 approver="Dev Weber", data={"vendor": "Starling Energy", "compliance_score": 58,
                                             "cost_center": "CC-7968", "contract_value": 232000})
    seen = {}
    for rules in (2, 3):
        s, _, _ = reset(EpisodeSpec("vendor_onboarding", 13, "high", rules=rules))
        assert s.target["metric"] == metric and s.target["expected"] == "decline"
        for _ in range(2):
            s, _, _ = step(s, act("datahub", "query_metric", metric_name=metric))
        s, _, _ = step(s, act("datahub", "refresh_data", metric_name=metric))
        s, _, info = step(s, act("datahub", "query_metric", metric_name=metric))
        true_value = s.world.datahub.metrics[metric]["true_value"]
        assert info.result["refreshing"] and info.result["value"] == true_value
        seen[rules] = (info.result["stale"], info.message)
        s, _, _ = step(s, submit)
        seen[rules] += ((s.outcome, s.failure_mode),)
    assert seen[2] == (True, f"{metric} = 58 (STALE, refresh running).", ("failure", "stale_data_used"))
    assert seen[3] == (False, f"{metric} = 58 (refresh running).", ("failure", "wrong_decision"))


def test_from_version_3_a_missing_priority_pays_only_where_the_task_goes_ahead():
    """Version 2 paid +1 for setting the priority chaos cleared on a decline's ticket, which the
    goal only asks to close: an agent that triaged it beat the expert's return (seed 54 at
    `medium`, license_renewal: 16.0 against 15.1)."""
    returns = {}
    for rules in (2, 3):
        s, _, _ = reset(EpisodeSpec("license_renewal", 54, "medium", rules=rules))
        target = s.target
        assert target["expected"] == "decline"
        assert s.world.ticketdesk.tickets[target["ticket"]]["priority"] is None  # chaos cleared it
        total = 0.0
        for action in (act("datahub", "query_metric", metric_name=target["metric"]),
                       act("datahub", "query_metric", metric_name=target["metric"]),
                       act("ticketdesk", "add_comment", ticket_id=target["ticket"], text="does not qualify"),
                       act("ticketdesk", "update_ticket", ticket_id=target["ticket"], field="priority",
                           value="low"),
                       act("ticketdesk", "update_ticket", ticket_id=target["ticket"], field="status",
                           value="closed")):
            s, events, _ = step(s, action)
            total += sum(e.value for e in events if type(e) is RewardGranted)
        assert s.outcome == "success"
        returns[rules] = round(total, 6)
    assert returns == {2: 16.0, 3: 15.0}  # version 3: the extra step's cost, and no pay for it


def test_from_version_3_a_status_cleared_on_a_ticket_chaos_also_blocks_is_not_logged():
    """The block sets the status and unblocking reopens it, so the cleared status was a trap with
    no effect, yet `missing_fields` counted among the chaos the episode met (637 of 1,236
    status-clearing episodes in 5,000 seeds at `high`). Version 2 keeps logging it."""
    from domain.events import TicketBlocked, TicketFieldCleared

    def planted(rules):
        _, events, _ = reset(EpisodeSpec("vendor_onboarding", 19054, "high", rules=rules))
        return [(type(e).__name__, getattr(e, "field", None)) for e in events
                if type(e) in (TicketFieldCleared, TicketBlocked)]

    assert ("TicketFieldCleared", "status") in planted(2)
    assert [kind for kind, _ in planted(3)] == ["TicketBlocked", "TicketBlocked"]
    # a status cleared on a ticket no chaos blocks stays a trap
    seed = find_seed("vendor_onboarding", "high", lambda ev: any(
        type(e) is TicketFieldCleared and e.field == "status" for e in ev)
        and not any(type(e) is TicketBlocked for e in ev))
    _, events, _ = reset(EpisodeSpec("vendor_onboarding", seed, "high", rules=3))
    assert any(type(e) is TicketFieldCleared and e.field == "status" for e in events)


def _other_request(s) -> dict:
    """A complete request of an approval type the task does not ask for, to that type's approver."""
    tg = s.target
    other = next(t for name, t in s.world.approvalflow.types.items() if name != tg["approval_type"])
    return act("approvalflow", "submit_approval", approval_type=other["name"],
               approver=s.world.datahub.approvers[other["approver_role"]]["name"],
               data={f: "x" for f in other["required_fields"]})


@pytest.mark.parametrize("expected", ["decline", "proceed"])
def test_from_version_4_a_request_the_task_does_not_ask_for_is_an_irreversible_mistake(expected):
    """A decline's goal says "submit nothing", yet version 3 checked only the task's own approval
    type, so a request of another type (to anyone) still let the decline succeed; in a task that
    goes ahead the request was a side effect no one judged. Version 3 still judges so."""
    seed = find_seed("license_renewal", "none", lambda ev: ev[0].target["expected"] == expected)
    judged = {}
    for rules in (3, 4):
        s, _, _ = reset(EpisodeSpec("license_renewal", seed, "none", rules=rules))
        s, _, _ = step(s, act("datahub", "query_metric", metric_name=s.target["metric"]))
        s, events, _ = step(s, _other_request(s))
        submitted = next(e for e in events if type(e) is ApprovalSubmitted)
        assert submitted.approval_type != s.target["approval_type"] and not submitted.problems
        judged[rules] = (s.done, [(m.mode, m.irreversible) for m in s.mistakes])
        if rules == 4:
            assert (s.outcome, s.failure_mode) == ("failure", "unrequested_submission")
            said = f"submitted {submitted.approval_id}, a '{submitted.approval_type}' request"
            assert said in s.mistakes[0].detail
            assert any(type(e) is RewardGranted and e.rule == "irreversible_mistake" for e in events)
        elif expected == "decline":
            assert _comment_and_close(s)[0].outcome == "success"  # what version 3 let through
    assert judged == {3: (False, []), 4: (True, [("unrequested_submission", True)])}


def test_from_version_4_a_declines_refused_request_is_no_missing_fields_mistake():
    """A decline's request refused for missing fields sent nothing, and the label version 3 gives it
    (`missing_required_fields`: "never resubmitted complete") tells the agent to do what the task
    forbids. From version 4 it is no mistake; a task that goes ahead still records it."""
    modes = {}
    for expected in ("decline", "proceed"):
        seed = find_seed("license_renewal", "none",
                         lambda ev, expected=expected: ev[0].target["expected"] == expected)
        for rules in (3, 4):
            s, _, _ = reset(EpisodeSpec("license_renewal", seed, "none", rules=rules))
            s, _, info = step(s, act("approvalflow", "submit_approval",
                                     approval_type=s.target["approval_type"],
                                     approver=s.world.datahub.approvers[s.target["role"]]["name"],
                                     data={}))
            assert info.rejected == "missing_required_fields"
            while not s.done:
                s, _, _ = step(s, act("ticketdesk", "list_tickets"))
            modes[expected, rules] = ([m.mode for m in s.mistakes], s.failure_mode)
    assert modes == {("decline", 3): (["missing_required_fields"], "missing_required_fields"),
                     ("decline", 4): ([], "step_budget_exhausted"),
                     ("proceed", 3): (["missing_required_fields"], "missing_required_fields"),
                     ("proceed", 4): (["missing_required_fields"], "missing_required_fields")}


def test_a_logged_rules_value_is_known_a_newer_releases_or_no_version_at_all():
    """verify and resume read a logged value alike: 4.0 and true passed for 4 and 1 (dict keys),
    and 0 or null read as a newer release's episode, where they are damage."""
    assert [rules_standing(v) for v in RULES_VERSIONS] == ["known"] * len(RULES_VERSIONS)
    assert rules_standing(CURRENT_RULES + 1) == rules_standing(10**6) == "newer"
    for value in (4.0, True, False, 0, -1, None, "5", [4]):
        assert rules_standing(value) == "none", value
