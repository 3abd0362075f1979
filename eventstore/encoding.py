"""Canonical encoding and the digest chain: the bytes that make replay comparable across processes."""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import math
import re
import threading
from typing import Any

import orjson

_OPTIONS = orjson.OPT_SORT_KEYS
GENESIS_DIGEST = ""


def _reject_non_finite(value: Any) -> None:
    """orjson silently writes NaN/Infinity as null; canonical data must round-trip, so refuse them."""
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"non-finite number {value!r} is not valid JSON")
    elif isinstance(value, dict):
        for item in value.values():
            _reject_non_finite(item)
    elif isinstance(value, list | tuple):
        for item in value:
            _reject_non_finite(item)
    elif isinstance(value, enum.Enum):  # orjson writes a member as its value
        _reject_non_finite(value.value)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):  # ... an instance as a dict
        for field in dataclasses.fields(value):
            _reject_non_finite(getattr(value, field.name))


def canonical_json(value: Any) -> bytes:
    """JSON with sorted keys, no whitespace, UTF-8: the one encoding every digest is computed over."""
    try:
        encoded = orjson.dumps(value, option=_OPTIONS)
    except TypeError as exc:  # orjson.JSONEncodeError subclasses TypeError
        raise ValueError(f"not JSON-serialisable: {exc}") from None
    # orjson writes NaN and Infinity as null: a value that does not survive the round trip gets
    # the slow walk (tuples also differ from their decoded lists, harmlessly).
    if b"null" in encoded and orjson.loads(encoded) != value:
        _reject_non_finite(value)
    return encoded


def decode_json(raw: str | bytes) -> Any:
    return orjson.loads(raw)


_EMPTY_DIGEST_STATE = hashlib.blake2b(digest_size=16)


def chain_digest(previous: str, type_: str, schema_version: int, data_json: str) -> str:
    """Digest of one event chained to its predecessor; meta and wall-clock time never enter it."""
    hasher = _EMPTY_DIGEST_STATE.copy()  # copying a fresh state beats constructing one
    hasher.update(f"{previous}\x1f{type_}\x1f{schema_version}\x1f{data_json}".encode())
    return hasher.hexdigest()


def chain_digests(previous: str, types: list[str], schema_versions: list[int],
                  data_jsons: list[str]) -> list[str]:
    """`chain_digest` over a batch, each event chained to the one before (an append's digests)."""
    digests = []
    for type_, schema_version, data_json in zip(types, schema_versions, data_jsons, strict=True):
        previous = chain_digest(previous, type_, schema_version, data_json)
        digests.append(previous)
    return digests


# -- reading JSON from outside ----------------------------------------------------------------
# One parser for every door, so the same bytes are the same action over HTTP, WebSocket, MCP and
# the Gym adapter (and so log the same episode). orjson parses almost everything. It refuses one
# thing JSON allows: a string escape of a lone surrogate ("\ud800"), text no UTF-8 log can hold;
# the stdlib parser takes it and the domain logs the escape spelled out. And it reads an integer
# past 64 bits as a float, losing digits, where the stdlib (and so a caller in process) keeps the
# integer: text with such a run of digits goes to the stdlib parser too. NaN and Infinity are not
# JSON (RFC 8259), nor is a number too big for a double: refused (the stdlib would take them, and
# the log would hold null).

def _not_json(name: str) -> Any:
    raise json.JSONDecodeError(f"{name} is not a JSON number", name, 0)


def _finite(text: str) -> float:
    value = float(text)
    if value - value != 0.0:  # inf (NaN cannot be spelled as a number)
        raise json.JSONDecodeError(f"the number {text[:40]} is infinity when parsed as double", text, 0)
    return value


def _integer(text: str) -> int:
    """Python turns at most 4,300 digits into an int by default (a guard against quadratic
    conversion); its plain ValueError passed every door's JSON handling and became a 500 or a
    dropped socket. The bound is fixed, not the process's setting, so every process reads alike."""
    digits = len(text.lstrip("-"))
    try:
        if digits > _MAX_DIGITS:
            raise ValueError
        return int(text)
    except ValueError:  # also a process whose own limit (sys.set_int_max_str_digits) is lower
        limit = f"the {_MAX_DIGITS:,} digits read" if digits > _MAX_DIGITS else "this process reads"
        raise json.JSONDecodeError(f"an integer of {digits:,} digits is longer than {limit}", "",
                                   0) from None


_MAX_DIGITS = 4_300
_STDLIB = json.JSONDecoder(parse_constant=_not_json, parse_float=_finite, parse_int=_integer)
TOO_DEEP = ("nested too deeply to parse (1,024 levels at most; about 990 in text holding a "
            "19-digit number or a lone-surrogate escape)")
# 19 digits in a row: maybe an integer orjson would turn into a float (2**64 has 20 digits, and
# -2**63 - 1 only 19); a pattern for each type, so a WebSocket frame (text) is not copied to bytes
# to be searched
_LONG_DIGITS = {bytes: re.compile(rb"[0-9]{19}"), str: re.compile("[0-9]{19}")}


def parse_json(raw: bytes | str) -> Any:
    """The JSON value of `raw` as every door reads it (HTTP, WebSocket, MCP, the Gym adapter);
    json.JSONDecodeError (a ValueError) saying what is wrong."""
    if _LONG_DIGITS[str if isinstance(raw, str) else bytes].search(raw) is None:
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            if "depth limit" in str(exc):
                raise json.JSONDecodeError(TOO_DEEP, "", 0) from None
            if "surrogate" not in str(exc):
                raise
    try:
        text = raw.decode() if isinstance(raw, bytes | bytearray) else raw
    except UnicodeDecodeError as exc:  # past the surrogate orjson stopped at
        raise json.JSONDecodeError(f"not valid UTF-8 ({exc.reason} at byte {exc.start})", "", 0) from None
    return _on_fresh_stack(text)


def _on_fresh_stack(text: str) -> Any:
    """The stdlib parser on a thread of its own. It recurses once a level, so on the caller's stack
    how deep it could go depended on how deep the caller was: the same bytes parsed over one
    door and were too deep over another. A new thread starts every door at the same depth."""
    outcome: list[Any] = []

    def parse() -> None:
        try:
            outcome.append(_STDLIB.decode(text))
        except RecursionError:
            outcome.append(json.JSONDecodeError(TOO_DEEP, "", 0))
        except BaseException as exc:  # raised in the caller, as if parsed there (no JSON value
            outcome.append(exc)  # is an exception)

    parser = threading.Thread(target=parse, name="json-parse")
    parser.start()
    parser.join()
    if isinstance(outcome[0], BaseException):
        raise outcome[0]
    return outcome[0]


def reply_json(value: Any) -> bytes:
    """The JSON of a reply. orjson writes no lone surrogate, yet a reply may echo one the caller
    sent (an unknown message type, a JSON-RPC id): the stdlib writes it back as the escape it
    came in (`\\ud800`), so the reply is sent instead of failing the request or the socket."""
    try:
        return orjson.dumps(value)
    except orjson.JSONEncodeError:
        return json.dumps(value, ensure_ascii=True, separators=(",", ":"), allow_nan=False).encode()
