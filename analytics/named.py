"""The registry of named queries: parse `analytics/queries/*.sql`, check and bind their parameters.

Values arrive as text (CLI `--param k=v`, HTTP query strings) or as JSON values; they are converted
to each parameter's declared type and bound by DuckDB, so nothing from a caller is ever spliced
into SQL.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from functools import cache
from importlib.resources import files
from typing import Any

from domain.labels import control_character

_PARAM = re.compile(r"^param\s+(?P<name>[a-z_][a-z0-9_]*)\s+(?P<type>[A-Z]+)"
                    r"(?:\[(?P<lo>-?\d+)?\.\.(?P<hi>-?\d+)?\])?"
                    r"(?:\s*=\s*(?P<default>'[^']*'|[^:]+?))?\s*:\s*(?P<doc>.*)$")
"""`-- param NAME TYPE[lo..hi] = default: what it means`; the range (INTEGER only, either end may be
left open) and the default are optional; without a default the parameter is required."""
INT32 = 2**31 - 1
"""DuckDB binds an INTEGER parameter as 32 bits: an end a header leaves open is this far, so the range
a query publishes is the one it accepts."""
TYPES = ("VARCHAR", "INTEGER", "DOUBLE", "BOOLEAN", "CHAOS", "TASK", "PROFILE", "RULES")
MAX_TEXT = 1000


class QueryError(ValueError):
    """A named query was asked for wrongly: unknown name, unknown or ill-typed parameter."""


class UnknownQuery(QueryError):
    """No named query has that name."""


@dataclass(frozen=True)
class Param:
    name: str
    type: str
    default: Any
    required: bool
    doc: str
    lo: int | None = None  # the smallest value accepted (INTEGER; an open end is -INT32), else None
    hi: int | None = None

    def __post_init__(self) -> None:
        if self.type == "INTEGER":  # the range published is the one accepted: DuckDB's 32 bits
            object.__setattr__(self, "lo", -INT32 if self.lo is None else max(self.lo, -INT32))
            object.__setattr__(self, "hi", INT32 if self.hi is None else min(self.hi, INT32))

    def describe(self) -> str:
        return f"{self.name} ({self.type.lower()}, {self.terms()}): {self.doc}"

    def terms(self) -> str:
        """Its range, as the header writes it, and its default: `1..5, default 3`."""
        default = ("required" if self.required else "optional" if self.default is None  # not "default None"
                   else f"default {self.default!r}")
        if self.lo is None and self.hi is None:
            return default
        return f"{'' if self.lo is None else self.lo}..{'' if self.hi is None else self.hi}, {default}"


@dataclass(frozen=True)
class NamedQuery:
    name: str
    description: str
    sql: str
    params: tuple[Param, ...] = field(default_factory=tuple)

    def bind(self, values: dict[str, Any] | None) -> dict[str, Any]:
        """Every declared parameter with a typed value; raises QueryError naming what is wrong."""
        values = dict(values or {})
        known = {p.name: p for p in self.params}
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise QueryError(f"query {self.name!r} has no parameter {', '.join(map(repr, unknown))}; "
                             f"it takes: {self.signature()}")
        bound = {}
        for p in self.params:
            if p.name in values and values[p.name] is not None:
                bound[p.name] = convert(self.name, p, values[p.name])
            elif p.required:
                raise QueryError(f"query {self.name!r} needs parameter {p.name!r} ({p.type.lower()})")
            else:
                bound[p.name] = p.default
        return bound

    def signature(self) -> str:
        return ", ".join(p.describe() for p in self.params) or "no parameters"


def convert(query: str, p: Param, value: Any) -> Any:
    """A caller's value as the parameter's type (text from a command line or URL, or JSON)."""

    def bad(why: str) -> QueryError:
        shown = repr(value)
        shown = shown if len(shown) <= 60 else f"{shown[:57]}..."
        return QueryError(f"query {query!r}: parameter {p.name!r} must be {why}, got {shown}")

    # surrounding whitespace is dropped from every value, text as numbers (`k= 3`, `task= x`)
    text = value.strip() if isinstance(value, str) else None
    if p.type == "VARCHAR":
        if text is None:
            raise bad("text")
        if not text:  # a filter no row can match (usually an unset shell variable)
            raise bad("non-empty text")
        if len(text) > MAX_TEXT:
            raise bad(f"at most {MAX_TEXT} characters")
        if control_character(text):  # no stored label holds one; a NUL would reach HTML as is
            raise bad("text without control characters")
        return text
    if p.type == "BOOLEAN":
        if isinstance(value, bool):
            return value
        if text is not None and text.lower() in ("true", "1", "yes", "false", "0", "no"):
            return text.lower() in ("true", "1", "yes")
        raise bad("true or false")
    if p.type == "INTEGER":
        if isinstance(value, bool):
            raise bad("an integer")
        if isinstance(value, int):
            number = value
        elif text is not None and re.fullmatch(r"-?[0-9]+", text):  # ASCII digits (no +, as every route)
            # int() of a thousand digits is slow: past 20 significant ones it is beyond any range
            significant = text.lstrip("-").lstrip("0")
            number = int(text) if len(significant) <= 20 else (-1 if text[0] == "-" else 1) * 10**21
        else:
            raise bad("an integer")
        if not p.lo <= number <= p.hi:
            raise bad(f"between {p.lo} and {p.hi}")
        return number
    if p.type == "TASK":  # a typo would otherwise match nothing and answer with empty rows
        from domain import TASK_FAMILIES, task_family

        try:
            return task_family(text if text is not None else value).name
        except ValueError:
            raise bad(f"a task family ({', '.join(TASK_FAMILIES)})") from None
    if p.type == "PROFILE":  # as TASK: a typo would answer with empty rows
        from domain import REWARD_PROFILES, reward_profile

        try:
            return reward_profile(text)
        except ValueError:
            raise bad(f"a reward profile ({', '.join(REWARD_PROFILES)})") from None
    if p.type == "RULES":  # as TASK: a version that is none would answer with empty rows
        from domain import rules_from_text

        try:
            return rules_from_text(value)
        except ValueError as exc:
            raise QueryError(f"query {query!r}: parameter {p.name!r}: {exc}") from None
    if p.type == "CHAOS":
        from domain.chaos import parse_chaos

        try:
            return parse_chaos(text if text is not None else value)
        except ValueError as exc:
            raise QueryError(f"query {query!r}: parameter {p.name!r}: {exc}") from None
    # DOUBLE
    if isinstance(value, bool):
        raise bad("a number")
    try:
        number = float(text if text is not None else value)
    except (TypeError, ValueError):
        raise bad("a number") from None
    if not math.isfinite(number):
        raise bad("a finite number")
    return number


def _with_default(query: str, p: Param, raw: str | None) -> Param:
    """`p` with the header's default (checked like a caller's value); required when there is none."""
    if raw is None:
        return replace(p, required=True)
    raw = raw.strip()
    if raw.upper() == "NULL":
        return p
    if raw.startswith("'"):
        return replace(p, default=raw[1:-1])
    return replace(p, default=convert(query, p, raw))


def parse(name: str, text: str) -> NamedQuery:
    """A NamedQuery from a .sql file's text: leading `--` lines are the description and params."""
    description: list[str] = []
    params: list[Param] = []
    body: list[str] = []
    header = True
    for line in text.splitlines():
        stripped = line.strip()
        if header and stripped.startswith("--"):
            comment = stripped[2:].strip()
            if comment.startswith("param "):
                m = _PARAM.match(comment)
                if not m or m["type"] not in TYPES or (m["lo"] or m["hi"]) and m["type"] != "INTEGER":
                    raise ValueError(f"{name}.sql: bad parameter line {comment!r}")
                lo, hi = (None if m[k] is None else int(m[k]) for k in ("lo", "hi"))
                declared = Param(m["name"], m["type"], None, False, m["doc"].strip(), lo, hi)
                params.append(_with_default(name, declared, m["default"]))
            elif comment:
                description.append(comment)
            continue
        header = False
        body.append(line)
    sql = "\n".join(body).strip().rstrip(";")
    for p in params:
        if f"${p.name}" not in sql:
            raise ValueError(f"{name}.sql declares parameter {p.name!r} but never uses ${p.name}")
    undeclared = set(re.findall(r"\$([a-z_][a-z0-9_]*)", sql)) - {p.name for p in params}
    if undeclared:
        raise ValueError(f"{name}.sql uses undeclared parameters {sorted(undeclared)}")
    return NamedQuery(name, " ".join(description), sql, tuple(params))


@cache
def registry() -> dict[str, NamedQuery]:
    """Every named query shipped in analytics/queries/, by name."""
    folder = files("analytics.queries")
    found = {}
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".sql"):
            name = entry.name[:-4]
            found[name] = parse(name, entry.read_text(encoding="utf-8"))
    return found


def get(name: str) -> NamedQuery:
    queries = registry()
    if name not in queries:
        raise UnknownQuery(f"no named query {name!r}; known queries: {', '.join(queries)}")
    return queries[name]


def parse_assignments(pairs: list[str] | None) -> dict[str, str]:
    """`["k=v", ...]` from the command line as a dict; a bad or repeated pair is a QueryError."""
    out: dict[str, str] = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        name = key.strip()
        if not sep or not name:
            raise QueryError(f"--param takes NAME=VALUE, got {pair!r}")
        if name in out:  # as the HTTP route refuses `?k=1&k=2`: which of the two was meant?
            raise QueryError(f"parameter {name!r} is given more than once; give each --param once")
        out[name] = value
    return out
