"""Query strings read one value per name, the same way on every route."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated, Any

from fastapi import Depends, Request
from pydantic import BeforeValidator, Field


class RepeatedParameter(ValueError):
    """A name appeared twice in a query string: which value was meant cannot be known."""

    def __init__(self, name: str) -> None:
        super().__init__(f"parameter {name!r} is given more than once")


def single_valued(pairs: Iterable[tuple[str, str]]) -> dict[str, str]:
    """The query's parameters as a dict, refusing a repeated name rather than keeping the last."""
    params: dict[str, str] = {}
    for key, value in pairs:
        if key in params:
            raise RepeatedParameter(key)
        params[key] = value
    return params


MAX_DIGITS = 300
"""Digits a whole number may have: far past every range the server takes, so an out-of-range number
is refused by its caller's range check, in its words ("seed … is outside …", not "seed must be an
integer"), while int() stays cheap (its cost grows with the square of the length)."""


def whole_number(text: str, signed: bool = False) -> int | None:
    """`text` as an integer when it is one as a person writes it: ASCII digits (after a `-` when
    `signed`), surrounding spaces dropped, at most MAX_DIGITS of them; else None. int() alone also
    reads "1_000", "+3" and other scripts' digits ("٣", "²"), which no other input path takes."""
    text = text.strip()
    digits = text[1:] if signed and text.startswith("-") else text
    if not (digits.isascii() and digits.isdigit() and len(digits) <= MAX_DIGITS):
        return None
    return int(text)


def _whole_or_refused(value: Any) -> Any:
    """A query value read as whole_number reads it; pydantic's own int() took "1_0" as 10, "+5"
    and "5.0" as 5, where the web UI's pages refuse them."""
    if not isinstance(value, str):
        return value
    number = whole_number(value)
    if number is None:
        raise ValueError(f"must be a whole number written in digits, not {value[:40]!r}")
    return number


def whole_number_in(lo: int, hi: int) -> Any:
    """The type of an integer query parameter from lo to hi, written in ASCII digits. The range
    sits inside the digits check, so the OpenAPI schema keeps its minimum and maximum (put in
    `Query`, after the check, they came out as "ge" and "le", which JSON Schema does not know)."""
    return Annotated[Annotated[int, Field(ge=lo, le=hi)], BeforeValidator(_whole_or_refused)]


async def strict_query(request: Request) -> None:
    """A route dependency (async: no thread hop for the async routes): refuse a query parameter
    the route does not declare, or one given twice. FastAPI ignores the first and keeps the
    last of the second, so a typo (`/episodes?outcomes=success`) silently answered with the
    unfiltered list."""
    from api.sessions import ApiError

    declared = sorted(_declared(getattr(request.scope.get("route"), "dependant", None)))
    try:
        given = single_valued(request.query_params.multi_items())
    except RepeatedParameter as exc:
        raise ApiError(400, "invalid_query", str(exc)) from None
    problem = unknown_parameter(request.url.path, given, declared)
    if problem:
        raise ApiError(400, "invalid_query", problem)


def unknown_parameter(path: str, given: Iterable[str], takes: Iterable[str]) -> str | None:
    """What is wrong, in words, when `given` holds a name `path` does not take (None: nothing)."""
    takes = sorted(takes)
    unknown = next((name for name in given if name not in takes), None)
    if unknown is None:
        return None
    said = f"it takes {', '.join(takes)}" if takes else "it takes none"
    return f"{path} has no query parameter {unknown[:60]!r}; {said}"


def _declared(dependant) -> set[str]:
    """The query parameters a route (FastAPI's Dependant of its endpoint) and its dependencies read."""
    if dependant is None:
        return set()
    names = {param.alias for param in dependant.query_params}
    for sub in dependant.dependencies:
        names |= _declared(sub)
    return names


STRICT_QUERY = [Depends(strict_query)]
"""`dependencies=` for a route whose query string is checked by strict_query."""
