"""Versions of the task rules: what counts as success, as a mistake and as a milestone.

A log keeps the version its episodes were judged by, so a fix to the rules changes new episodes
only: an old log still re-runs to the same events and digests. Version 1 is the rule set of every
log written before versions existed; its episodes carry no version at all (their ``EpisodeStarted``
is byte for byte what it was), later ones carry ``"rules"`` in the hidden ``target``.
"""

from __future__ import annotations

import re

RULES_VERSIONS: dict[int, str] = {
    1: "the first rule set: a right decision succeeds without reading the data; valid_submission "
       "pays for a request the policy forbids and verify_ticket at any time; any approver on "
       "the delegation chain is accepted; resolving the ticket early says nothing",
    2: "closing a decline's ticket or submitting the task's request without a fresh read of the "
       "decision metric is an irreversible mistake; valid_submission pays only for a request "
       "that qualifies, verify_ticket only once the ticket is linked to the approved request; a "
       "request sent to a delegate while an approver before them is available is objected to; "
       "resolving the task's ticket before the task is done is a mistake (premature_resolution)",
    3: "as version 2, but a metric read while a refresh of it runs is as stale as the metric is "
       "(refreshing a fresh metric made its reads stale, and a decision on them was labelled "
       "stale_data_used); set_missing_priority pays only on the task's ticket of a task that goes "
       "ahead (it paid for triaging a decline's ticket); a status cleared on a ticket chaos also "
       "blocks is not logged (the block overwrote it: a trap with no effect)",
    4: "as version 3, but a request of a type the task does not ask for is an irreversible mistake "
       "(unrequested_submission: a decline's 'submit nothing' held only for the task's own type, "
       "so any other request still succeeded); a decline's request refused for missing fields is "
       "no missing_required_fields mistake (nothing was sent, and resubmitting is what the task "
       "forbids)",
}
CURRENT_RULES = max(RULES_VERSIONS)


def checked_rules(value: object) -> int:
    """`value` as a rules version (None: the current one); a ValueError naming the versions otherwise."""
    if value is None:
        return CURRENT_RULES
    versions = ", ".join(str(v) for v in RULES_VERSIONS)
    if isinstance(value, bool) or not isinstance(value, int):  # True, 2.0, "2": said as given
        raise ValueError(f"rules must be a whole number, one of the versions {versions}, not {value!r}")
    if value not in RULES_VERSIONS:
        raise ValueError(f"no rules version {value}; the versions are {versions}")
    return value


def rules_standing(value: object) -> str:
    """What a logged episode's rules version is to this release: "known"; "newer", a whole number
    past its versions (a newer release's episode, in a shared store); or "none", no version at all
    (4.0 and true passed for 4 and 1, and 0 or null read as a newer release's): a damaged log."""
    if type(value) is not int or value < 1:
        return "none"
    return "known" if value in RULES_VERSIONS else "newer" if value > CURRENT_RULES else "none"


def unknown_rules_text(version: int) -> str:
    """How `verify` and `resume` say that an episode's rules version is a newer release's."""
    known = ", ".join(str(v) for v in RULES_VERSIONS)
    return f"judged by rules version {version}, which this companyos does not know (it knows {known})"


def rules_from_text(value: object) -> int:
    """A rules version given as a number or as its digits (a form field, a URL, a command line's
    `-p rules=2`), as `checked_rules` takes it: every surface reads `" 2 "` and refuses `"+2"`,
    `"2.0"` and `"two"` alike. Filters, where None means "any version", check for None first."""
    if isinstance(value, str) and re.fullmatch(r"\s*[0-9]{1,9}\s*", value):
        value = int(value)
    return checked_rules(value)


def stamped(target: dict, version: int) -> dict:
    """The hidden target of an episode judged by `version` (version 1 leaves it as it was)."""
    return target if version == 1 else {**target, "rules": version}


def rules_of(target: object) -> int:
    """The rules version an episode's target names (1 for logs that name none; a damaged log's
    target that is no object names none either)."""
    return target.get("rules", 1) if type(target) is dict else 1
