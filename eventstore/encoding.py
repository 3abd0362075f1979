"""Canonical encoding and the digest chain: the bytes that make replay comparable across processes."""

from __future__ import annotations

import hashlib
import json
import math
import re
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


_STDLIB = json.JSONDecoder(parse_constant=_not_json, parse_float=_finite)
TOO_DEEP = "nested too deeply to parse (orjson's limit: 1,024 levels)"
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
        return _STDLIB.decode(text)
    except UnicodeDecodeError as exc:  # past the surrogate orjson stopped at
        raise json.JSONDecodeError(f"not valid UTF-8 ({exc.reason} at byte {exc.start})", "", 0) from None
    except RecursionError:
        raise json.JSONDecodeError(TOO_DEEP, "", 0) from None
