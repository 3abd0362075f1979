"""Canonical encoding and the digest chain: the bytes that make replay comparable across processes."""

from __future__ import annotations

import hashlib
import math
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
