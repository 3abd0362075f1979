"""The failure-mode report: a handful of named queries rendered as text, Markdown or self-contained HTML.

The HTML carries its charts as inline SVG generated here (no scripts, no CDN, no network), so the
file can be mailed, archived or opened offline and still reads at a glance.
"""

from __future__ import annotations

import hashlib
import html
import math
import re
import shlex
import time
import unicodedata
from collections.abc import Callable, Iterable, Iterator
from decimal import ROUND_HALF_UP, Decimal
from fractions import Fraction
from typing import Any

from analytics.intervals import percent_text, percent_value, wilson_bounds, wilson_interval
from analytics.service import rows_of, run_named
from analytics.sign_test import holm_beyond_chance, sign_test_p
from analytics.warehouse import Warehouse
from domain import CHAOS_LEVELS, FAILURE_MODES, reward_profile, rules_from_text, task_family
from domain.chaos import SPRUNG_BY_THE_AGENT, level_text, parse_chaos
from domain.labels import control_character, visible_bidi_controls, visible_controls

PALETTE = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7",
           "#9c755f", "#bab0ac")

_ACROSS_AGENTS = """($task IS NULL OR task = $task) AND ($chaos IS NULL OR chaos = $chaos)
  AND ($profile IS NULL OR reward_profile = $profile) AND ($rules IS NULL OR rules = $rules)
"""
"""The report's filters but the agent's, for the tables that set agents side by side."""

_FILTERED = "\nWHERE ($agent IS NULL OR coalesce(agent, '(unknown)') = $agent) AND " + _ACROSS_AGENTS
"""The episodes the report's filters (and every named query's) keep."""


def _across_agents(f: dict[str, Any]) -> dict[str, Any]:
    """The parameters of `_ACROSS_AGENTS` (and of compare_agents, which takes no agent)."""
    return {k: f[k] for k in ("task", "chaos", "profile", "rules")}

_SUMMARY = """
SELECT count(*) AS episodes,
       count(*) FILTER (WHERE outcome IS NOT NULL) AS finished,
       count(*) FILTER (WHERE outcome IS NULL) AS running,
       count(*) FILTER (WHERE outcome = 'success') AS successes,
       round_decimal(count(*) FILTER (WHERE outcome = 'success')
             / nullif(count(*) FILTER (WHERE outcome IS NOT NULL), 0), 4) AS success_rate,
       round_decimal(avg(total_return::DECIMAL(18, 6)) FILTER (WHERE outcome IS NOT NULL), 3) AS mean_return,
       round_decimal(avg(steps) FILTER (WHERE outcome IS NOT NULL), 2) AS mean_steps,
       -- as compare_agents labels and counts them: agents with a finished episode
       count(DISTINCT coalesce(agent, '(unknown)')) FILTER (WHERE outcome IS NOT NULL) AS agents,
       count(DISTINCT task) FILTER (WHERE outcome IS NOT NULL) AS tasks,
       list(DISTINCT rules ORDER BY rules) FILTER (WHERE outcome IS NOT NULL) AS rules_versions,
       list(DISTINCT reward_profile ORDER BY reward_profile) FILTER (WHERE outcome IS NOT NULL)
           AS reward_profiles
FROM episodes
""" + _FILTERED

_INSTANCE = "task, seed, chaos, max_steps, reward_profile, rules"
"""What makes episodes trials of one instance (an agent's): a seed run again is one instance."""

# Instances (as pass_at_k counts them) run more than once: the fewest trials among them, and how many
_REPEATS = """
SELECT min(n) AS fewest, count(*) AS instances FROM (
    SELECT count(*) AS n FROM episodes""" + _FILTERED + f"""AND outcome IS NOT NULL
    GROUP BY coalesce(agent, '(unknown)'), {_INSTANCE} HAVING count(*) > 1
)
"""

_RULES_VERSIONS = "SELECT DISTINCT rules FROM episodes" + _FILTERED + "AND outcome IS NOT NULL ORDER BY rules"

# Success per agent and chaos level (or task), for the report's charts when it covers several
# agents: one bar per agent at each level, so an easy level run by a strong agent never reads as
# chaos helping, and one per agent at each task, so "which tasks does each agent fail" needs no
# report per agent. `{by}` is `chaos` or `task`, never the caller's text.
_BY_AGENT_AND = """
SELECT agent, {by}, episodes, instances, successes,
       round_decimal(successes / episodes, 4) AS success_rate,
       success_rate_low(successes, episodes, instances := instances) AS success_rate_low,
       success_rate_high(successes, episodes, instances := instances) AS success_rate_high
FROM (
    SELECT coalesce(agent, '(unknown)') AS agent, {by},
           count(*) AS episodes,
           count(DISTINCT (""" + _INSTANCE + """)) AS instances,
           count(*) FILTER (WHERE outcome = 'success') AS successes
    FROM episodes
    WHERE outcome IS NOT NULL AND """ + _ACROSS_AGENTS + """
    GROUP BY ALL
)
ORDER BY agent, {by} NULLS LAST
"""


# Each agent's failure modes, for a report over several agents: pooled, one agent's many failures
# of one kind drowned out what the others fail at
_MODES_BY_AGENT = """
SELECT coalesce(agent, '(unknown)') AS agent, failure_mode, count(*) AS episodes,
       round_decimal(count(*) / sum(count(*)) OVER (PARTITION BY coalesce(agent, '(unknown)')), 4) AS share
FROM episodes
WHERE outcome IS NOT NULL AND outcome <> 'success' AND failure_mode IS NOT NULL
  AND """ + _ACROSS_AGENTS + """
GROUP BY 1, 2
ORDER BY agent, episodes DESC, failure_mode
"""


def check_filters(agent: str | None, task: str | None, chaos: str | None = None,
                  profile: str | None = None, rules: str | int | None = None) -> None:
    """ValueError, in words, for a filter no episode can match (every section would be empty):
    a task naming no family, an empty agent, a chaos level that is none, a reward profile or rules
    version that is none; so a caller can say so before it syncs."""
    agent, task, profile = _stripped(agent), _stripped(task), _stripped(profile)
    rules_version(rules)
    if task is not None:
        task_family(task)
    if chaos is not None:
        parse_chaos(chaos)
    if profile is not None:
        reward_profile(profile)
    if agent is not None and not agent:
        raise ValueError("--agent is empty: no episode has an empty agent label")
    if agent is not None and (control := control_character(agent)):
        raise ValueError(f"no episode has that agent: agent labels hold no control characters "
                         f"(it holds {control!r})")


def _query_command(name: str, filters: dict[str, Any]) -> str:
    """The command that runs a named query with the report's filters (the report's own names for
    them are the queries' parameters), quoted for a shell."""
    return shlex.join(["companyos", "analytics", "query", name,
                       *(arg for k, v in filters.items() for arg in ("-p", f"{k}={v}"))])


def rules_version(value: str | int | None) -> int | None:
    """A rules-version filter as its number (text from a form or URL too, read as the named
    queries read it); a ValueError naming the versions when it is none of them."""
    return None if value is None else rules_from_text(value)


def rules_versions(wh: Warehouse, filters: dict[str, Any]) -> list[int]:
    """The rules versions of the finished episodes `filters` keep (agent, task, chaos as a number,
    profile, rules; a missing one is no filter), as the report's summary counts them."""
    keys = ("agent", "task", "chaos", "profile", "rules")
    return [v for (v,) in wh.con.execute(_RULES_VERSIONS, {k: filters.get(k) for k in keys}).fetchall()]


def build(wh: Warehouse, agent: str | None = None, task: str | None = None,
          chaos: str | None = None, profile: str | None = None,
          rules: str | int | None = None) -> dict[str, Any]:
    """Every section of the report as rows (JSON-able)."""
    started = time.perf_counter()
    # as the named queries take them; the chaos level as its number, shown as given
    shown = {"agent": _stripped(agent), "task": _stripped(task), "chaos": _stripped(chaos),
             "profile": _stripped(profile), "rules": rules_version(rules)}
    f = {**shown, "chaos": None if chaos is None else parse_chaos(chaos)}
    summary = rows_of(wh.con.execute(_SUMMARY, f))[0]
    by_task_and_chaos = run_named(wh, "success_by_task_and_chaos", f)
    data = {
        "filters": {k: v for k, v in shown.items() if v is not None},
        "summary": summary,
        "success_by_chaos": success_by_chaos(by_task_and_chaos),
        "success_by_agent_and_chaos": by_agent_and(wh, f, "chaos") if agent is None else [],
        "success_by_agent_and_task": by_agent_and(wh, f, "task") if agent is None else [],
        "success_by_task_and_chaos": by_task_and_chaos,
        "failure_modes": run_named(wh, "failure_modes", {**f, "examples": 3}),
        "failure_modes_by_agent": modes_by_agent(wh, f) if agent is None else [],
        "first_mistake_step": run_named(wh, "first_mistake_step", f),
        "actions_before_failure": run_named(wh, "actions_before_failure",
                                            {**f, "k": LEAD_IN_TOOLS, "top": LEAD_INS}),
        "chaos_impact": run_named(wh, "chaos_impact", f),
        "compare_agents": run_named(wh, "compare_agents", _across_agents(f)) if agent is None else [],
    }
    data["pass_at_k"], pass_note = pass_at_k_section(wh, f)
    data["head_to_head"], paired_note = head_to_head_section(wh, f, data["compare_agents"])
    data["failure_mode_meanings"] = [{"failure_mode": r["failure_mode"],
                                      "meaning": FAILURE_MODES.get(r["failure_mode"], "")}
                                     for r in data["failure_modes"]]
    tools = run_named(wh, "tool_error_rates", {**f, "min_calls": 1})
    data["tool_error_rates"] = tools[:TOOL_ROWS]
    data["notes"] = {"pass_at_k": pass_note}
    if paired_note:
        data["notes"]["head_to_head"] = paired_note
    if tools:
        data["notes"]["tool_error_rates"] = TOOL_TERMS
    versions = summary.pop("rules_versions") or []  # of the finished episodes, which the rates cover
    if len(versions) > 1:
        data["notes"]["summary"] = (
            f"These episodes were judged by rules versions {listed(map(str, versions))}, which "
            "count success and mistakes differently: the rates mix them. Narrow the report to one "
            "version (--rules, or ?rules= in the UI) to compare like with like.")
    elif versions:
        data["notes"]["summary"] = f"These episodes were judged by rules version {versions[0]}."
    profiles = [str(p) for p in summary.pop("reward_profiles") or []]  # (a log naming none: None)
    if len(profiles) > 1:  # a sparse episode's return is not a dense one's: the mean mixes scales
        data["notes"]["summary"] = " ".join(filter(None, [data["notes"].get("summary"), (
            f"They were scored by reward profiles {listed(profiles)}, whose returns are on "
            "different scales: the mean return mixes them. Narrow the report to one profile "
            "(--profile, or ?profile= in the UI) to compare returns.")]))
    agents = agent_count(data["success_by_agent_and_chaos"])
    levels = {r["chaos"] for r in data["success_by_chaos"]}
    pooled = data["chaos_impact"] and (agents or len(levels) > 1)
    notes = [_pooled_chaos_note(agents, levels)] if pooled else []
    sprung = [r["mechanism"] for r in data["chaos_impact"] if r["mechanism"] in SPRUNG_BY_THE_AGENT]
    if sprung:
        notes.append(_sprung_note(sprung))
    if notes:
        data["notes"]["chaos_impact"] = " ".join(notes)
    _mistake_notes(data)
    if note := agents_note(data):
        data["notes"]["compare_agents"] = note
    if agents > CHART_AGENTS:
        for key in ("success_by_agent_and_chaos", "success_by_agent_and_task"):
            data["notes"][key] = (f"The chart above draws the {CHART_AGENTS} agents with the most "
                                  f"episodes; this table lists all {agents}.")
    if len(tools) > TOOL_ROWS:  # agents that invent tool names can make this list long
        data["notes"]["tool_error_rates"] = (
            f"{TOOL_TERMS} {len(tools) - TOOL_ROWS} more tools, with the same or lower error rates, "
            f"are not shown: `{_query_command('tool_error_rates', data['filters'])}` lists them all")
    data["seconds"] = round(time.perf_counter() - started, 3)
    return data


TOOL_TERMS = ("rejected: calls the apps refused, whatever the cause; chaos_rejections: those a chaos "
              "mechanism caused (an outage, a random rejection), not the agent; rejected_under_chaos: "
              "those refused once some chaos had struck the episode, whatever the cause (from medium "
              "chaos up nearly all); top_reject_code: the commonest refusal.")
"""The tool table's columns in words: `chaos_rejections` and `rejected_under_chaos` read alike."""
LEAD_IN_TOOLS, LEAD_INS = 3, 3
"""The report's lead-ins: the last 3 tools up to the deciding step, the 3 commonest per mode."""


def _pooled_chaos_note(agents: int, levels: set[float | None]) -> str:
    """Why the chaos-impact rates mislead when they pool agents or levels, said before the table
    (under it, it was read after the numbers), naming only what this report pools."""
    pooled = [f"{agents} agents"] if agents else []
    pooled += [f"{len(levels)} chaos levels"] if len(levels) > 1 else []
    others = [clause for clause, present in (
        ("those at chaos none (where no mechanism fires)", 0.0 in levels),
        ("those of agents it never met", agents > 1)) if present]
    return (f"Read with care: these rates pool {listed(pooled)}. A mechanism is compared with "
            "every episode it did not fire in" + (f", {listed(others)} included" if others else "")
            + ", so it can look harmless, or even helpful, when it is not (an agent run only at high "
            "chaos makes every mechanism there look helpful). Narrow the report to one agent and one "
            "chaos level to compare like with like.")


def _sprung_note(mechanisms: list[str]) -> str:
    """Why the rows of mechanisms the agent's own calls spring read as help or harm they are not:
    narrowed to one agent and one level, a flawed agent that stopped before submitting made
    random_rejection read +0.4, and one that floundered made an outage read -0.5."""
    fire, them = ("fire", "them") if len(mechanisms) > 1 else ("fires", "it")
    return (f"{listed(mechanisms)} {fire} only when the agent makes a call that springs {them} (a read, "
            "a lookup, a refresh, a submission; an outage strikes any call, so a longer episode "
            f"meets more). Episodes without {them} include those that failed before that call, so "
            f"{'these rows show' if them == 'them' else 'its row shows'} how agents fared that got "
            f"that far, not what the trap costs: an agent that gives up early makes {them} look "
            f"helpful, one that flounders makes {them} look harmful. The mechanisms set at reset "
            "compare like with like.")


def _mistake_notes(data: dict[str, Any]) -> None:
    """Say what the failure-mode and first-mistake shares are of, and why a section is empty: the
    first-mistake shares are of the episodes with a counted mistake, which were read as shares
    of every failure, and a section with nothing to show vanished without a word."""
    s = data["summary"]
    finished, failed = s["finished"], s["finished"] - s["successes"]
    if not finished:
        return
    if not data["failure_modes"]:
        data["notes"]["failure_modes"] = f"None: all {counted(finished, 'finished episode')} succeeded."
    with_one = sum(r["episodes"] for r in data["first_mistake_step"])
    data["notes"]["first_mistake_step"] = (
        f"The shares are of the {with_one:,} finished episodes with a counted mistake, of "
        f"{finished:,} finished ({failed:,} not successful); an episode without one (one that ran "
        "out of steps without a wrong move, say) is not in them." if with_one else
        f"No counted mistake in {counted(finished, 'finished episode')}.")


MIX_TOLERANCE = Fraction(1, 10)
"""How far two agents' shares of episodes at a chaos level (or task) may differ before the report
says their success rates compare unlike episodes."""


def _mixes(rows: list[dict[str, Any]], by: str) -> dict[str, dict[Any, Fraction]]:
    """Each agent's share of its episodes at each value of `by` (chaos or task), exactly: as
    floats, 4/10 - 3/10 came out above a tenth and read as "more than 10 points apart"."""
    counts: dict[str, dict[Any, int]] = {}
    for r in rows:
        counts.setdefault(r["agent"], {})[r[by]] = r["episodes"]
    return {agent: {v: Fraction(n, sum(c.values())) for v, n in c.items()} for agent, c in counts.items()}


def _unlike(mixes: dict[str, dict[Any, Fraction]]) -> bool:
    """Whether some agents' episodes spread over the values differently (beyond MIX_TOLERANCE)."""
    spreads = list(mixes.values())
    values = {v for spread in spreads for v in spread}
    return any(abs(a.get(v, 0) - b.get(v, 0)) > MIX_TOLERANCE
               for a in spreads for b in spreads for v in values)


SIGNIFICANCE = 0.05
"""The head-to-head p-value (unrounded, after Holm's correction) below which the report calls two
agents told apart."""


def agents_note(data: dict[str, Any]) -> str | None:
    """What the interval columns mean, whether the agents ran like episodes at all, and which
    agents these episodes do not tell apart from the best one: a table ranks every agent, and 62%
    against 58% over 50 episodes each is no ranking; nor is 90% at chaos none against 60% at high.
    Two agents are told apart by their intervals, or, where they ran the same instances, by the
    head-to-head sign test (paired seed by seed, 4 points can be a real lead); both must leave
    them alike for the note to say so."""
    agents = data["compare_agents"]
    if len(agents) < 2:
        return None
    said = ("success_rate_low and success_rate_high bound each success rate with 95% confidence "
            "(Wilson's interval, over the agent's instances: a seed run again counts once).")
    paired = {r["other"]: r for r in data.get("head_to_head", [])}
    unlike = [what for what, key, by in (("chaos levels", "success_by_agent_and_chaos", "chaos"),
                                         ("tasks", "success_by_agent_and_task", "task"))
              if _unlike(_mixes(data.get(key, []), by))]
    if unlike:
        where = (" The head-to-head table compares them only on the instances they share." if paired
                 else "")
        return (f"{said} Read with care: these agents ran at {listed(unlike)} in different "
                f"proportions, so their rates compare unlike episodes.{where} Narrow the report to "
                "one chaos level and task (--chaos, --task), or run the agents on the same seeds, "
                "before ranking them.")
    best, *others = ranked(agents)
    beyond = holm_beyond_chance({o: sign_test_p(h["agent_ahead"], h["other_ahead"])
                                 for o, h in paired.items()}, SIGNIFICANCE)
    apart, close, behind = [], [], []
    for r in others:
        name, h = r["agent"], paired.get(r["agent"])
        if name in beyond:
            (behind if h["other_ahead"] > h["agent_ahead"] else apart).append(name)
        elif r["success_rate_high"] < best["success_rate_low"]:
            apart.append(name)
        else:
            close.append(name)
    verdict = []
    if close:
        shown = close[:5] + ([f"{len(close) - 5} more"] if len(close) > 5 else [])
        where = (", and on the instances they share neither is ahead beyond chance (the head-to-head "
                 "table)" if paired else "")
        verdict.append(f"These episodes do not tell {best['agent']} apart from {listed(shown)}: "
                       f"their intervals overlap{where}, so the order between them may be chance. "
                       "Run more episodes before ranking them.")
    if apart and not paired and not close:
        verdict.append(f"{best['agent']}'s interval overlaps no other agent's: its lead is beyond "
                       "the intervals.")
    elif apart:
        whom = "every other agent" if not close and not behind else listed(apart)
        how = ("by their intervals or, where they ran the same instances, by the head-to-head sign "
               "test" if paired else "their intervals do not overlap")
        verdict.append(f"These episodes tell {best['agent']} apart from {whom}: {how}.")
    if behind:
        verdict.append(f"But on the instances they share, {listed(behind)} did better than "
                       f"{best['agent']}, beyond chance (the head-to-head table): {best['agent']}'s "
                       "overall rate rests on episodes outside that comparison (instances the other "
                       "did not run, or trials beyond the other's count of one).")
    return " ".join([said, *verdict])


ALL_TASKS = "(all)"
"""The head_to_head query's task for its rows over every task."""


def head_to_head_section(wh: Warehouse, f: dict[str, Any],
                         agents: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], str | None]:
    """Each agent against the best-rated one on the instances both ran, over every task, and the
    note that says how to read it (or that they share no instance); ([], None) for one agent."""
    if len(agents) < 2:
        return [], None
    best = ranked(agents)[0]["agent"]
    if best != _stripped(best):  # logged by an old release: no parameter keeps the spaces
        return [], (f"The best-rated agent's label, {best!r}, begins or ends with a space, which a "
                    "query parameter drops, so it cannot be compared seed by seed here.")
    rows = [{k: v for k, v in r.items() if k != "task"}  # the per-task rows are the query's
            for r in run_named(wh, "head_to_head", {**_across_agents(f), "agent": best})
            if r["task"] == ALL_TASKS]
    met = {r["other"] for r in rows}
    strangers = [r["agent"] for r in agents if r["agent"] != best and r["agent"] not in met]
    strange = (f" {listed(strangers)} ran no instance in common with {best}, so only the "
               "intervals compare them." if strangers else "")
    if not rows:
        return [], (f"No other agent ran an instance (task, seed, chaos level, step budget, reward "
                    f"profile and rules version) that {best} ran, so there is no paired comparison: "
                    "run the agents on the same seeds to compare them seed by seed.")
    several = (f", with Holm's correction for the {len(rows)} comparisons made at once" if len(rows) > 1
               else "")
    return rows, (
        f"Each agent against {best}, the best-rated, on the instances both ran: agent_ahead counts "
        f"those where {best} succeeded more often, other_ahead those where the other did, even the "
        "rest (where one ran an instance more often, each side's first trials count, as many as "
        "the other's: trials). p_value is the exact sign test of that split, the chance of one at "
        "least as uneven were the two alike, to 4 places (0 is below 0.00005); the note above "
        f"calls a split beyond chance below 0.05, before rounding{several}.{strange} "
        "`companyos analytics query head_to_head -p agent=... -p other=...` splits it by task.")


def _stripped(value: str | None) -> str | None:
    """A filter as every query reads it: its surrounding whitespace dropped (the summary took it
    as given and counted 0 episodes above sections that showed them all)."""
    return value.strip() if isinstance(value, str) else value


TOOL_ROWS = 30
"""The report's tool table stops here (14 tools, plus whatever names agents invented), and says so."""


def success_by_chaos(by_task_and_chaos: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Success per chaos level, summed from the per-task rows (no second pass over episodes)."""
    totals: dict[float | None, list[int]] = {}
    for row in by_task_and_chaos:
        total = totals.setdefault(row["chaos"], [0, 0, 0])
        total[0] += row["episodes"]
        total[1] += row["instances"]  # an instance has one task: no two rows share one
        total[2] += row["successes"]
    order = sorted(totals, key=lambda chaos: (chaos is None, chaos or 0.0))  # NULL last, as SQL
    rows = []
    for chaos in order:
        episodes, instances, successes = totals[chaos]
        low, high = wilson_interval(successes, episodes, instances)
        rows.append({"chaos": chaos, "episodes": episodes, "instances": instances,
                     "successes": successes, "success_rate": _share(successes, episodes),
                     "success_rate_low": low, "success_rate_high": high})
    return rows


def by_agent_and(wh: Warehouse, f: dict[str, Any], by: str) -> list[dict[str, Any]]:
    """Success per agent and chaos level (`by="chaos"`) or task (`by="task"`); [] when the
    episodes are one agent's (the plain success-by-chaos and by-task rows say it all then)."""
    if by not in ("chaos", "task"):  # a column name put into the SQL: never the caller's text
        raise ValueError(f"by must be chaos or task, not {by!r}")
    rows = rows_of(wh.con.execute(_BY_AGENT_AND.format(by=by), _across_agents(f)))
    return rows if agent_count(rows) > 1 else []


def modes_by_agent(wh: Warehouse, f: dict[str, Any]) -> list[dict[str, Any]]:
    """Each agent's failure modes and their shares of its non-successful episodes; [] when they
    are one agent's (the failure-mode table says it all then)."""
    rows = rows_of(wh.con.execute(_MODES_BY_AGENT, _across_agents(f)))
    return rows if agent_count(rows) > 1 else []


PASS_K = 4
"""The largest k the report's pass^k table shows (fewer when the repeated instances ran fewer times)."""


def pass_at_k_section(wh: Warehouse, f: dict[str, Any]) -> tuple[list[dict[str, Any]], str]:
    """pass^1..pass^K per agent and task, over the instances run at least K times, and the note
    that says what it is; without repeated trials, a note that says how to get them. A flaky agent
    (right on 70% of trials, seed by seed) reads as any 70% agent until its trials are set side by
    side: the report had no place for that."""
    fewest, repeated = wh.con.execute(_REPEATS, f).fetchone()
    if not repeated:
        return [], ("Each instance (task, seed, chaos level, step budget, reward profile and rules "
                    "version) ran once, so there is no pass^k: run the same seeds again to see "
                    "whether an agent's successes repeat.")
    k = min(PASS_K, fewest)
    rows: dict[tuple, dict[str, Any]] = {}
    for r in run_named(wh, "pass_at_k", {**f, "k": k}):
        if not r["instances"]:
            continue
        row = rows.setdefault((r["agent"], r["task"]), {
            "agent": r["agent"], "task": r["task"], "instances": r["instances"],
            "instances_left_out": r["instances_left_out"], "mean_trials": r["mean_trials"]})
        row[f"pass^{r['k']}"] = r["pass_hat_k"]
    return list(rows.values()), (
        f"pass^k (τ-bench): the chance that k trials of one instance all succeed, over the "
        f"{repeated:,} instances run at least twice; an agent right on some trials only falls as k "
        f"grows, one that never varies stays level. Instances run fewer than {k} times are left "
        "out (instances_left_out); `companyos analytics query pass_at_k` takes another k.")


def agent_count(rows: list[dict[str, Any]]) -> int:
    """How many agents rows with an `agent` column name."""
    return len({r["agent"] for r in rows})


def _share(part: int, whole: int) -> float:
    """part/whole to 4 decimals as the queries' round_decimal gives it (Python's round of a float
    rounds half to even, and a binary value just under a half-way one down)."""
    return float((Decimal(part) / Decimal(whole)).quantize(Decimal("0.0001"), ROUND_HALF_UP))


# -- text / markdown -------------------------------------------------------------------------------

SECTIONS = (
    ("success_by_chaos", "Success by chaos level"),
    ("success_by_agent_and_chaos", "Success by agent and chaos level"),
    ("success_by_agent_and_task", "Success by agent and task"),
    ("success_by_task_and_chaos", "Success by task and chaos level"),
    ("failure_modes", "Failure modes (share of non-successful episodes)"),
    ("failure_modes_by_agent", "Failure modes by agent (share of each agent's non-successful episodes)"),
    ("failure_mode_meanings", "What these failure modes mean"),
    ("first_mistake_step", "Step of the first mistake"),
    ("actions_before_failure", f"Actions leading into each failure mode (the last {LEAD_IN_TOOLS} "
                               "tools up to the step that decided it)"),
    ("chaos_impact", "Chaos impact (success with and without each mechanism)"),
    ("compare_agents", "Agents compared"),
    ("head_to_head", "Head to head (each agent against the best-rated one, seed by seed)"),
    ("pass_at_k", "Consistency over repeated trials (pass^k)"),
    ("tool_error_rates", "Tool error rates"),
)


NOTES_FIRST = frozenset({"chaos_impact"})
"""Sections whose note is a warning, said before the table rather than after its numbers."""


def sections(data: dict[str, Any],
             with_charts: bool) -> Iterator[tuple[str, list, str | None, str | None]]:
    """(title, rows, note before the table, note after it) of each section with something to
    show, for every renderer alike; a section without rows shows only its note, if any."""
    for key, title in SECTIONS:
        rows = data[key]
        note = data["notes"].get(key) if with_charts else text_note(data, key)
        if not rows and not note:
            continue
        first = key in NOTES_FIRST
        yield title, rows, note if first else None, None if first else note


def _cell(value: Any, column: str = "") -> str:
    if value is None:
        return ""
    if isinstance(value, list):
        return ", ".join(_cell(v, column) for v in value)
    if isinstance(value, float):
        return level_text(value) if column in KEY_NUMBER_COLUMNS else number_text(value)
    return str(value)


KEY_NUMBER_COLUMNS = frozenset({"chaos", "chaos_levels"})
"""Columns whose numbers name a group rather than measure one: shown exactly, since two levels that
differ in the last bits (0.3 and NumPy's 0.30000000000000004) are two groups, and a filter finds
only the value as written."""


_FREE_TEXT = {"agent": ' class="free"', "other": ' class="free"'}
"""Cells of labels the user chose, which may break anywhere: an agent label of 100 characters
without a space pushed the other columns off the screen."""


def _html_cell(column: str, value: Any, episode_href: Callable[[str], str] | None,
               mode_href: Callable[[str, str | None], str] | None = None,
               agent: str | None = None) -> str:
    if column == "example_episode_ids" and episode_href is not None and isinstance(value, list):
        return ", ".join(f'<a href="{_esc(episode_href(str(e)))}">{_esc(e)}</a>' for e in value)
    if column == "failure_mode" and mode_href is not None and isinstance(value, str):
        return f'<a href="{_esc(mode_href(value, agent))}">{_esc(value)}</a>'
    shown = _esc(_cell(value, column))
    return shown.replace("_", "_<wbr>") if column in _BREAKABLE else shown


_BREAKABLE = frozenset({"top_failure_mode"})
"""Columns of names that may break after an underscore: the agents' table, the widest, cut its
last column off at 1280 px."""


def number_text(value: float) -> str:
    """A float for people: up to 6 decimals and no exponent, so 1234567.891 keeps its magnitude
    (`:g` shows 1.23457e+06); exponent form only where fixed point would hide the value."""
    if not math.isfinite(value):
        return str(value)
    if value == 0:
        return "0"
    if abs(value) >= 1e16 or abs(value) < 1e-6:
        return f"{value:.6g}"
    return f"{value:.6f}".rstrip("0").rstrip(".")


TITLE = "CompanyOS failure-mode report"  # every report's title begins so: how a file is known as one


def report_title(data: dict[str, Any], shown: Callable[[str, Any], str] = "{}={}".format) -> str:
    """The report's title naming its filters, each as `shown(name, value)` writes it."""
    filters = ", ".join(shown(k, v) for k, v in data["filters"].items())
    return TITLE + (f" ({filters})" if filters else "")


def _html_title(data: dict[str, Any]) -> str:
    """The title with the agent's label isolated (`<bdi>`): a label's right-to-left override
    turned the title's own words around it backwards. The other filters are the domain's words."""
    return report_title(data, lambda k, v: f"{_esc(k)}=<bdi>{_esc(v)}</bdi>" if k == "agent"
                        else f"{_esc(k)}={_esc(v)}")


def _shown(value: Any) -> Any:
    """A summary figure as a person reads it, as the tables print numbers (11, not 11.0); n/a when
    there is nothing to average."""
    if value is None:
        return "n/a"
    return number_text(value) if isinstance(value, float) else value


def _rate(s: dict[str, Any]) -> str:
    """The success rate as the rates round it; one that reads 100.0% or 0.0% while some episodes
    failed, or succeeded, gets the places that tell it apart (5 failures in 1,000,000 episodes
    read "success 100.0%")."""
    if s["success_rate"] is None:
        return "n/a"
    successes, finished = s["successes"], s["finished"]
    # from the counts: the rate is rounded to 4 places already, and rounding it again read 1 of
    # 22 (4.545%) as 4.6%
    exact = successes / finished if finished else s["success_rate"]
    shown = percent_value(exact, 1)
    places = 1
    while 0 < successes < finished and shown in (0, 100) and places < 12:
        places += 1
        shown = percent_value(successes / finished, places)
    return f"{shown}%"


def _tick(fraction: float, top: float) -> str:
    """An axis tick as a percentage: whole unless the axis is short or the tick falls between
    (a quarter of 50% is 12.5%, which read "12%" beside "38%")."""
    whole = abs(100 * fraction - round(100 * fraction)) < 1e-9
    return percent_text(fraction, 0 if whole and top >= 0.2 else 1)


def summary_line(s: dict[str, Any]) -> str:
    return (f"{counted(s['episodes'], 'episode')} ({s['finished']} finished, {s['running']} running), "
            f"success {_rate(s)}, mean return {_shown(s['mean_return'])}, "
            f"mean steps {_shown(s['mean_steps'])}, "
            f"{counted(s['agents'], 'agent')}, {counted(s['tasks'], 'task')}")


def listed(items: Iterable[str]) -> str:
    """`1, 2 and 4`: "rules versions 1 and 2 and 4" read as a stammer."""
    *rest, last = items
    return f"{', '.join(rest)} and {last}" if rest else last


def counted(n: int, noun: str) -> str:
    """`1 episode`, `2 episodes`: the report read "1 episodes"."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


_MARKUP = re.compile(r"[\\|<>`*\[\]&]|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])")
"""What Markdown reads as markup in a table cell: HTML (`<script>` in an agent's label ran where the
report was rendered), code, emphasis, links, entities and the cell separator. An underscore inside
a word (`stale_data_used`) is no emphasis, so names stay as they read."""


def _md(text: str) -> str:
    """Stored text as Markdown shows it as it is: markup characters escaped with a backslash, and
    control characters written as escapes (a tool name an agent sent with a newline in it split
    its table row over three lines)."""
    return visible_controls(_MARKUP.sub(lambda m: "\\" + m.group(), text))


def to_markdown(data: dict[str, Any]) -> str:
    out = [f"# {_md(report_title(data))}", "", summary_line(data["summary"]), ""]
    if note := data["notes"].get("summary"):
        out += [note, ""]
    for title, rows, before, after in sections(data, with_charts=False):
        out += [f"## {title}", ""]
        if before:
            out += [before, ""]
        if rows:
            cols = list(rows[0])
            out.append("| " + " | ".join(cols) + " |")
            out.append("|" + "|".join("---" for _ in cols) + "|")
            for r in rows:
                out.append("| " + " | ".join(_md(_cell(r[c], c)) for c in cols) + " |")
            out.append("")
        if after:
            out += [after, ""]
    return "\n".join(out)


CHART_NOTES = frozenset({"success_by_agent_and_chaos", "success_by_agent_and_task"})
"""Notes about a chart, which only the HTML report draws: under a Markdown or terminal table, "the
chart above" pointed at nothing."""


def text_note(data: dict[str, Any], key: str) -> str | None:
    """The note under a section's table in a report without charts (Markdown, the terminal)."""
    return None if key in CHART_NOTES else data["notes"].get(key)


def scroll_region(label: str) -> str:
    """The attributes of a box that scrolls sideways (a wide table on a narrow screen): reachable
    by Tab, so a keyboard can scroll it in every browser, and named for a screen reader."""
    return f'tabindex="0" role="region" aria-label="{_esc(label)}"'


# -- SVG charts ------------------------------------------------------------------------------------

def _esc(text: Any) -> str:
    """Stored text as HTML, bidirectional controls as escapes (an agent's label with an override
    read backwards in legends and tables)."""
    return html.escape(visible_bidi_controls(str(text)), quote=True)


def _nice_ceiling(value: float) -> float:
    """A round axis maximum at or above `value` (for fractions: 5%, 10%, 20%, 25%, 50%, 100%)."""
    for step in (0.05, 0.1, 0.2, 0.25, 0.5, 1.0):
        if value <= step:
            return step
    return 1.0


_FONT_PX = 11
_EM_WIDTHS = {**dict.fromkeys("iljI.,:;'|!", 320), **dict.fromkeys("ftr -()[]/\\", 410),
              **dict.fromkeys("mwMW@%", 1040)}
"""Widths in thousandths of an em that differ most from a letter's: the wider of DejaVu Sans's
(Linux's sans-serif) and Arial's, so a label cut to fit fits in either."""


def _char_em(char: str) -> int:
    if char in _EM_WIDTHS:
        return _EM_WIDTHS[char]
    if char.isascii():
        return 730 if char.isupper() else 640
    return 1000 if unicodedata.east_asian_width(char) in "WF" else 680


def _text_px(text: str) -> float:
    """About how wide `text` is at the charts' font: by each character's width, not a count (a
    label of capitals, cut by its count, ran past the chart's edge)."""
    return sum(map(_char_em, text)) * _FONT_PX / 1000


def _fit(label: str, px: float) -> str:
    """`label` cut in the middle to what fits in `px` pixels, marked with an ellipsis (the bar's
    tooltip keeps it whole): long agent names printed over each other, or past the chart's edge.
    The end stays: names that differ only there (`...-temperature-0.2`, `...-0.9`) read apart."""
    if _text_px(label) <= px:
        return label
    room = px - _text_px("\u2026")
    tail = _fitting(reversed(label), room / 3)
    head = _fitting(label, room - _text_px(label[len(label) - tail:]))
    return label[:max(head, 2)] + "\u2026" + label[len(label) - tail:]


def _fitting(chars: Iterable[str], px: float) -> int:
    """How many of `chars`, in order, fit in `px` pixels."""
    kept = 0
    for char in chars:
        px -= _text_px(char)
        if px < 0:
            break
        kept += 1
    return kept


AXIS_LABEL_PX = 120
"""The widest an axis label is drawn whole (about 18 characters, "medium (0.5)" and more)."""


def _label_stride(labels: list[str], slot: float) -> int:
    """Label every how-many-th slot so that the axis labels, up to AXIS_LABEL_PX wide (longer ones
    are cut), do not run into each other: a sweep of 21 chaos levels cut every label to `0.…`."""
    widest = min(max(map(_text_px, labels), default=_FONT_PX), AXIS_LABEL_PX) + 8
    return max(1, math.ceil(widest / slot))


def _svg_start(width: int, height: int, title: str, title_x: float) -> list[str]:
    """A chart's opening tag and title. The viewBox lets it shrink to a narrow screen whole (a
    fixed width alone cut its right part off)."""
    return [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" role="img" aria-label="{_esc(title)}" '
            'font-family="sans-serif" font-size="11">',
            f'<text x="{title_x}" y="16" font-size="13" font-weight="bold">{_esc(title)}</text>']


def bar_chart(labels: list[str], values: list[float], *, title: str, percent: bool = True,
              width: int = 560, color: str = PALETTE[0], notes: list[str] | None = None,
              zoom: bool = False) -> str:
    """Vertical bars with value labels; values are fractions when `percent`.

    `zoom` scales the axis to the largest bar (for distributions) instead of 0-100%.
    """
    height, top, bottom, left = 250, 40, 40, 44
    inner_w, inner_h = width - left - 10, height - top - bottom
    peak = max(values + [1e-9])
    top_value = (_nice_ceiling(peak) if zoom else 1.0) if percent else peak
    n = max(len(values), 1)
    slot = inner_w / n
    bar = min(56.0, slot * 0.7)
    labelled = slot >= 34
    parts = _svg_start(width, height, title, left)
    for i in range(5):
        y = top + inner_h * i / 4
        v = top_value * (1 - i / 4)
        label = _tick(v, top_value) if percent else f"{v:.3g}"
        parts.append(f'<line x1="{left}" x2="{width - 10}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e5e5e5"/>')
        parts.append(f'<text x="{left - 4}" y="{y + 4:.1f}" text-anchor="end" fill="#666">{label}</text>')
    every = _label_stride(labels, slot)  # every how many bars an axis label fits, and its room
    for i, (label, value) in enumerate(zip(labels, values, strict=True)):
        h = 0 if top_value <= 0 else inner_h * max(value, 0) / top_value
        x = left + slot * i + (slot - bar) / 2
        y = top + inner_h - h
        shown = percent_text(value) if percent else f"{value:g}"
        tip = f"{label}: {shown}" + (f" ({notes[i]})" if notes else "")
        parts.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{bar:.1f}" height="{h:.1f}" fill="{color}">'
                     f'<title>{_esc(tip)}</title></rect>')
        if labelled:
            parts.append(f'<text x="{x + bar / 2:.1f}" y="{y - 3:.1f}" text-anchor="middle">'
                         f'{_esc(shown)}</text>')
        if i % every == 0:
            parts.append(f'<text x="{x + bar / 2:.1f}" y="{top + inner_h + 14:.1f}" text-anchor="middle" '
                         f'fill="#333">{_esc(_fit(label, slot * every - 4))}</text>')
    parts.append("</svg>")
    return "".join(parts)


def hbar_chart(labels: list[str], values: list[float], *, title: str, width: int = 560,
               notes: list[str] | None = None, full_scale: float | None = None,
               color: str | None = None,
               intervals: list[tuple[float | None, float | None]] | None = None) -> str:
    """Horizontal bars (fractions), longest first: reads like a ranked list. The longest bar spans
    the chart, unless `full_scale` says which value does (1.0: rates on an absolute scale). Bars
    take the palette in turn, or all `color`. `intervals` draws each bar's (low, high) as a
    whisker, so bars whose whiskers overlap are not read as a ranking."""
    row, top, label_w = 22, 28, 190
    height = top + row * len(values) + 10
    inner_w = width - label_w - 60
    peak = full_scale or max(values + [1e-9])
    parts = _svg_start(width, height, title, 0)
    for i, (label, value) in enumerate(zip(labels, values, strict=True)):
        y = top + row * i
        w = inner_w * value / peak
        note = f" ({notes[i]})" if notes else ""
        low, high = intervals[i] if intervals else (None, None)
        if low is not None and high is not None:
            note += f" (95% interval {percent_text(low)} to {percent_text(high)})"
        shown = _esc(_fit(label, label_w - 8))
        parts.append(f'<text x="{label_w - 6}" y="{y + 14}" text-anchor="end">{shown}</text>')
        fill = color or PALETTE[i % len(PALETTE)]
        parts.append(f'<rect x="{label_w}" y="{y + 3}" width="{w:.1f}" height="{row - 6}" '
                     f'fill="{fill}"><title>{_esc(label)}: {percent_text(value)}{_esc(note)}</title></rect>')
        end = w
        if low is not None and high is not None:
            x0, x1, mid = label_w + inner_w * low / peak, label_w + inner_w * high / peak, y + row / 2
            parts.append(f'<path d="M{x0:.1f} {mid - 4:.1f}v8M{x0:.1f} {mid:.1f}H{x1:.1f}'
                         f'M{x1:.1f} {mid - 4:.1f}v8" stroke="#333" fill="none"/>')
            end = max(end, x1 - label_w)
        parts.append(f'<text x="{label_w + end + 4:.1f}" y="{y + 14}">{percent_text(value)}</text>')
    parts.append("</svg>")
    return "".join(parts)


SERIES_PATTERNS = ("", "M0 6L6 0M-1 1L1 -1M5 7L7 5", "dots", "M0 3H6", "M0 6L6 0M0 0L6 6", "M3 0V6",
                   "M0 0L6 6M-1 5L1 7M5 -1L7 1", "M0 3H6M3 0V6")
"""What each series draws over its colour, in white (solid, /, dots, -, x, |, \\, +): series told
apart by colour alone fail WCAG 1.4.1 for a reader who does not see the colours apart (five of the
palette's colours are under 3:1 against white) or prints the report in grey."""


def _series_fills(title: str, count: int) -> tuple[str, list[str]]:
    """The <defs> of a chart's series patterns and each series' fill; the ids carry a digest of
    the title, so two charts of one page never take each other's patterns."""
    prefix = "p" + hashlib.blake2b(title.encode(), digest_size=4).hexdigest()
    defs, fills = [], []
    for s in range(count):
        colour, mark = PALETTE[s % len(PALETTE)], SERIES_PATTERNS[s % len(SERIES_PATTERNS)]
        if not mark:
            fills.append(colour)
            continue
        drawn = ('<circle cx="3" cy="3" r="1.3" fill="#fff"/>' if mark == "dots"
                 else f'<path d="{mark}" stroke="#fff" stroke-width="1.3"/>')
        defs.append(f'<pattern id="{prefix}-{s}" width="6" height="6" patternUnits="userSpaceOnUse">'
                    f'<path d="M0 0h6v6h-6z" fill="{colour}"/>{drawn}</pattern>')
        fills.append(f"url(#{prefix}-{s})")
    return (f"<defs>{''.join(defs)}</defs>" if defs else ""), fills


def grouped_bar_chart(groups: list[str], series: dict[str, list[float | None]], *, title: str,
                      width: int = 720) -> str:
    """Bars per group (e.g. chaos level) for each series (e.g. task), fractions, with a legend;
    each series has its colour and its pattern (SERIES_PATTERNS)."""
    names = list(series)
    top, bottom, left = 30, 62, 44
    legend = _legend_layout(names, width, left)
    height = 270 + 14 * (legend[-1][1] if legend else 0)  # a row more for each wrapped legend row
    inner_h = 270 - top - bottom
    inner_w = width - left - 10
    slot = inner_w / max(len(groups), 1)
    bar = min(22.0, slot * 0.8 / max(len(names), 1))
    every = _label_stride(groups, slot)
    parts = _svg_start(width, height, title, left)
    defs, fills = _series_fills(title, len(names))
    parts.append(defs)
    for i in range(5):
        y = top + inner_h * i / 4
        parts.append(f'<line x1="{left}" x2="{width - 10}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e5e5e5"/>')
        parts.append(f'<text x="{left - 4}" y="{y + 4:.1f}" text-anchor="end" fill="#666">'
                     f'{100 * (1 - i / 4):.0f}%</text>')
    for g, group in enumerate(groups):
        x0 = left + slot * g + (slot - bar * len(names)) / 2
        for s, name in enumerate(names):
            value = series[name][g]
            if value is None:
                continue
            h = max(inner_h * value, 1.0)  # a run at 0% keeps a stub: no bar means no episodes
            x = x0 + bar * s
            parts.append(f'<rect x="{x:.1f}" y="{top + inner_h - h:.1f}" width="{bar - 1:.1f}" '
                         f'height="{h:.1f}" fill="{fills[s]}"><title>{_esc(name)} @ '
                         f'{_esc(group)}: {percent_text(value)}</title></rect>')
        if g % every == 0:  # the bars' tooltips name every group
            parts.append(f'<text x="{left + slot * g + slot / 2:.1f}" y="{top + inner_h + 14:.1f}" '
                         f'text-anchor="middle" fill="#333">{_esc(_fit(group, slot * every - 4))}</text>')
    for s, (name, (x, row)) in enumerate(zip(names, legend, strict=True)):
        ly = 270 - 26 + 14 * row
        parts.append(f'<rect x="{left + x}" y="{ly - 1}" width="12" height="12" fill="{fills[s]}"/>')
        parts.append(f'<text x="{left + x + 16}" y="{ly + 9}">{_esc(_fit(name, width - left - 30))}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _legend_layout(names: list[str], width: int, left: int) -> list[tuple[int, int]]:
    """Each legend entry's (x offset, row): entries side by side, a new row where the next would
    run past the right edge, so long agent names wrap instead of leaving the chart."""
    placed, x, row = [], 0, 0
    for name in names:
        span = 24 + round(min(_text_px(name), width - left - 30))
        if x and left + x + span > width - 10:
            x, row = 0, row + 1
        placed.append((x, row))
        x += span
    return placed


_LEVEL_NAMES = {level: name for name, level in CHAOS_LEVELS.items()}


def _chaos_label(value: float | None) -> str:
    if value is None:
        return "?"
    name = _LEVEL_NAMES.get(value)
    return f"{name} ({level_text(value)})" if name else level_text(value)


def charts(data: dict[str, Any]) -> list[str]:
    """The report's SVG charts: success by chaos, failure modes, first-mistake distribution."""
    out = []
    by_chaos = data["success_by_chaos"]
    if by_agent := data.get("success_by_agent_and_chaos"):
        out.append(_agents_by_chaos_chart(by_agent))
    elif by_chaos:
        out.append(bar_chart([_chaos_label(r["chaos"]) for r in by_chaos],
                             [exact_rate(r) for r in by_chaos], title="Success rate by chaos level",
                             notes=[counted(r["episodes"], "episode") for r in by_chaos]))
    cells = data["success_by_task_and_chaos"]
    if by_task := data.get("success_by_agent_and_task"):  # pooled, a strong agent's tasks read easy
        out.append(_agents_by_task_chart(by_task))
    elif cells:
        levels = sorted({r["chaos"] for r in cells})
        tasks = sorted({r["task"] for r in cells if r["task"] is not None})
        rate = {(r["task"], r["chaos"]): exact_rate(r) for r in cells}
        out.append(grouped_bar_chart([_chaos_label(c) for c in levels],
                                     {t: [rate.get((t, c)) for c in levels] for t in tasks},
                                     title="Success rate by task and chaos level"))
    modes = data["failure_modes"]
    if modes:  # one colour: by rank, a mode's colour changed from one report to the next
        out.append(hbar_chart([r["failure_mode"] for r in modes], [r["share"] for r in modes],
                              title="Failure modes (share of non-successful episodes)",
                              notes=[counted(r["episodes"], "episode") for r in modes],
                              color=PALETTE[2]))
    first = data["first_mistake_step"]
    if first:
        bars = first_mistake_bars(first)
        out.append(bar_chart([label for label, _, _ in bars], [share for _, share, _ in bars],
                             title="Step of the first mistake (share of the "
                                   f"{counted(sum(r['episodes'] for r in first), 'episode')} "
                                   "with one)",
                             color=PALETTE[2], zoom=True, notes=[note for _, _, note in bars]))
    agents = ranked(data["compare_agents"])
    if len(agents) > 1:  # a row per agent: model names are long
        out.append(hbar_chart([r["agent"] for r in agents], [exact_rate(r) for r in agents],
                              title="Success rate by agent (with its 95% interval)",
                              full_scale=1.0,
                              notes=[counted(r["episodes"], "episode") for r in agents],
                              # from the counts: the columns are rounded to 4 places, and
                              # rounding them again read 95.9594% as 96.0%
                              intervals=[wilson_bounds(r["successes"], r["episodes"], r["instances"])
                                         for r in agents]))
    return out


CHART_AGENTS = 8
"""Agents the success-by-chaos chart draws at most (those with the most episodes): more bars per
level than that stop reading at a glance, and the palette would repeat its colours."""


def chart_agents(rows: list[dict[str, Any]]) -> list[str]:
    """The agents the chart draws, best overall success first (as the agents' own chart ranks them)."""
    totals: dict[str, list[int]] = {}
    for r in rows:
        total = totals.setdefault(r["agent"], [0, 0])
        total[0] += r["episodes"]
        total[1] += r["successes"]
    drawn = sorted(totals, key=lambda a: (-totals[a][0], a))[:CHART_AGENTS]
    return sorted(drawn, key=lambda a: (-totals[a][1] / totals[a][0], a))


def ranked(agents: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """compare_agents' rows best-rated first (ties by name): the order of the agents' chart, and
    which agent the note and the head-to-head table set the others against."""
    return sorted(agents, key=lambda r: (-exact_rate(r), r["agent"]))


def exact_rate(row: dict[str, Any]) -> float:
    """A row's success rate from its counts, for a chart to label: the column is rounded to 4
    places, and labelling it rounded it again (1 of 22, 4.545%, read 4.6%)."""
    return row["successes"] / row["episodes"]


def _agents_by_chaos_chart(rows: list[dict[str, Any]]) -> str:
    levels = sorted({r["chaos"] for r in rows}, key=lambda c: (c is None, c or 0.0))
    return _agents_chart(rows, "chaos", levels, [_chaos_label(c) for c in levels],
                         "Success rate by chaos level and agent")


def _agents_by_task_chart(rows: list[dict[str, Any]]) -> str:
    tasks = sorted({r["task"] for r in rows}, key=lambda t: (t is None, t or ""))
    return _agents_chart(rows, "task", tasks, [str(t) for t in tasks], "Success rate by task and agent")


def _agents_chart(rows: list[dict[str, Any]], by: str, groups: list, labels: list[str],
                  title: str) -> str:
    """A bar per agent (the busiest CHART_AGENTS) in each group of `by`."""
    rate = {(r["agent"], r[by]): exact_rate(r) for r in rows}
    drawn, every = chart_agents(rows), agent_count(rows)
    # the agents left out, said where the eye is (the note under the table was a screen away)
    some = f" (the {len(drawn)} busiest of {every})" if len(drawn) < every else ""
    return grouped_bar_chart(labels, {a: [rate.get((a, g)) for g in groups] for a in drawn},
                             title=title + some)


def first_mistake_bars(rows: list[dict[str, Any]], most: int = 40) -> list[tuple[str, float, str]]:
    """(label, share, note) of a bar per step from the first step with a mistake on, a step no
    episode went wrong at included as an empty bar, so the axis keeps the distribution's shape.
    Past `most` bars the last one holds every later step ("43+"): cut there, those episodes
    were missing from the chart without a word."""
    by_step = {r["first_mistake_step"]: r for r in rows}
    lo, last = min(by_step), max(by_step)
    hi = last if last - lo < most else lo + most - 2  # the steps with a bar of their own
    bars = [(str(step), by_step[step]["share"], _mistake_note(by_step[step])) if step in by_step
            else (str(step), 0.0, "0 episodes") for step in range(lo, hi + 1)]
    if hi < last:
        tail = [r for step, r in by_step.items() if step > hi]
        episodes = sum(r["episodes"] for r in tail)
        bars.append((f"{hi + 1}+", sum(r["share"] for r in tail),
                     f"{counted(episodes, 'episode')} at steps {hi + 1} to {last}"))
    return bars


def _mistake_note(row: dict[str, Any]) -> str:
    return f"{counted(row['episodes'], 'episode')}, mostly {row['most_common_mode']}"


REPORT_CSS = """
body{font-family:system-ui,sans-serif;margin:2rem auto;max-width:980px;color:#222;padding:0 1rem}
h1{font-size:1.5rem}h2{font-size:1.1rem;margin-top:2rem;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:.85rem;margin:.5rem 0}
td,th{border:1px solid #ddd;padding:3px 8px;text-align:left;overflow-wrap:break-word}
td.free{overflow-wrap:anywhere;min-width:8em}
th{background:#f5f5f5}.scroll th{white-space:normal}
p.warning{background:#fff4e0;padding:.4rem .8rem;border-radius:4px}
.scroll{overflow-x:auto;max-width:100%}svg{max-width:100%;height:auto}
.footnote{color:#595959;font-size:.8rem}
.charts{display:flex;flex-wrap:wrap;gap:1.5rem}
.summary{font-size:1rem;background:#f7f7f7;padding:.6rem 1rem;border-radius:6px}
.kpi{display:inline-block;margin-right:2rem;max-width:100%}
.kpi b{display:block;font-size:1.4rem;overflow-wrap:anywhere}
svg rect{stroke:#444;stroke-width:.6}
@media (max-width:640px){.charts{overflow-x:auto}.charts svg{max-width:none}}
"""


REPORT_HEAD = ("<!doctype html><html lang='en'><head><meta charset='utf-8'>"
               "<meta name='viewport' content='width=device-width, initial-scale=1'><title>")
"""With its language (a screen reader chose a voice by guessing) and a viewport (a phone drew it
at desktop width, shrunk)."""
_EARLIER_HEADS = ("<!doctype html><html><head><meta charset='utf-8'><title>",)
"""How reports written by earlier releases begin: a new report replaces them as its own."""


def is_report(head: bytes) -> bool:
    """Whether a file beginning with `head` is a report `to_html` wrote (its title says so), which
    another report may replace; any other page is someone's, and stays."""
    return head.lstrip().startswith(tuple((h + TITLE).encode() for h in (REPORT_HEAD, *_EARLIER_HEADS)))


def to_html(data: dict[str, Any]) -> str:
    """The report as one self-contained HTML document (`analytics report --html`)."""
    return (REPORT_HEAD + _esc(report_title(data)) +
            f"</title><style>{REPORT_CSS}</style></head><body>" + html_body(data) + "</body></html>")


def html_body(data: dict[str, Any], episode_href: Callable[[str], str] | None = None,
              mode_href: Callable[[str, str | None], str] | None = None) -> str:
    """The report's markup without the document around it (styled by REPORT_CSS): the web UI
    puts it in its own page, with `episode_href` making each example episode id a link to that
    episode's timeline (from why agents fail to how one failed, in a click), and `mode_href(mode,
    agent)` each failure mode a link to the list of its episodes (of the row's agent, in a table
    by agent)."""
    s = data["summary"]
    # "none" read as a mode of that name
    top_mode = (data["failure_modes"][0]["failure_mode"] if data["failure_modes"]
                else "no failures" if s["finished"] else "n/a")
    # the running ones named beside the total: the rates beside it leave them out
    episodes = f"{s['episodes']} ({s['running']} running)" if s["running"] else s["episodes"]
    kpis = [("episodes", episodes), ("success rate", _rate(s)),
            ("mean return", _shown(s["mean_return"])), ("mean steps", _shown(s["mean_steps"])),
            ("top failure mode", top_mode)]
    body = [f"<h1>{_html_title(data)}</h1>",
            '<div class="summary">' + "".join(f'<span class="kpi">{_esc(k)}<b>{_esc(v)}</b></span>'
                                              for k, v in kpis) + "</div>",
            *([f"<p>{_esc(note)}</p>"] if (note := data["notes"].get("summary")) else []),
            '<div class="charts">' + "".join(charts(data)) + "</div>"]
    for title, rows, before, after in sections(data, with_charts=True):
        body.append(f"<h2>{_esc(title)}</h2>")
        if before:
            body.append(f"<p class='warning'>{_esc(before)}</p>")
        if rows:
            cols = list(rows[0])
            # a long column name may break after its underscores: the agents' table ran off the
            # screen at 1280 px with `top_failure_mode` and `mean_first_mistake_step` cut off
            head = "".join(f"<th scope='col'>{_esc(c).replace('_', '_<wbr>')}</th>" for c in cols)
            body.append(f'<div class="scroll" {scroll_region(title)}><table><tr>{head}</tr>')
            for r in rows:
                cells = (f"<td{_FREE_TEXT.get(c, '')}>"
                         f"{_html_cell(c, r[c], episode_href, mode_href, r.get('agent'))}</td>"
                         for c in cols)
                body.append("<tr>" + "".join(cells) + "</tr>")
            body.append("</table></div>")
        if after:
            body.append(f"<p>{_esc(after)}</p>")
    running = ("" if not s["running"] else f"{counted(s['running'], 'episode')} still running "
               + ("is" if s["running"] == 1 else "are") + " counted in totals but not in rates. ")
    body.append(f"<p class='footnote'>{running}Generated by companyos analytics report.</p>")
    return "".join(body)
