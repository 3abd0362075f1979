"""Counter-based randomness: every draw is a pure function of (seed, purpose, counters).

Nothing here keeps hidden global state, so the same inputs give the same numbers in any
process (blake2b is unsalted, unlike ``hash()``). One digest yields eight uniforms, so the
hot path needs at most one hash per step.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from hashlib import blake2b
from math import gcd
from struct import Struct

_EIGHT = Struct("<8Q")
_SCALE = 2.0**-53


def _key(seed: int, purpose: str, parts: tuple) -> bytes:
    return f"{seed}|{purpose}|{'|'.join(str(p) for p in parts)}".encode()


def uniforms(seed: int, purpose: str, *parts: object) -> tuple[float, ...]:
    """Eight independent uniforms in [0, 1) for (seed, purpose, *parts)."""
    digest = blake2b(_key(seed, purpose, parts)).digest()
    return tuple((x >> 11) * _SCALE for x in _EIGHT.unpack(digest))


_ONE = Struct("<Q")


def digest(prefix: bytes, counter: int) -> bytes:
    """64 random bytes for (prefix, counter): the fast path for per-step draws."""
    return blake2b(prefix + b"%d" % counter).digest()


def prefix(seed: int, purpose: str) -> bytes:
    """The key prefix such that ``digest(prefix(seed, p), i)`` is ``uniforms(seed, p, i)``'s."""
    return f"{seed}|{purpose}|".encode()


def unit(d: bytes, i: int) -> float:
    """The i-th (0..7) uniform in [0, 1) of a 64-byte digest."""
    return (_ONE.unpack_from(d, 8 * i)[0] >> 11) * _SCALE


@lru_cache(maxsize=64)
def _coprimes(n: int) -> tuple[int, ...]:
    return tuple(s for s in range(1, n) if gcd(s, n) == 1) or (1,)


class Stream:
    """A sequential generator for set-up code (task generation, static chaos).

    Block ``i`` of the stream is ``uniforms(seed, purpose, i)``; the stream only remembers
    how far it has read, so two streams with the same (seed, purpose) agree draw for draw.
    """

    __slots__ = ("_prefix", "_block", "_buf")

    def __init__(self, seed: int, purpose: str) -> None:
        self._prefix = prefix(seed, purpose)
        self._block = 0
        self._buf: list[float] = []

    def random(self) -> float:
        buf = self._buf
        if not buf:
            d = blake2b(self._prefix + b"%d" % self._block).digest()
            self._block += 1
            buf.extend((x >> 11) * _SCALE for x in reversed(_EIGHT.unpack(d)))
        return buf.pop()

    def chance(self, p: float) -> bool:
        """True with probability p (always draws, so later draws do not shift with p)."""
        return self.random() < p

    def randint(self, lo: int, hi: int) -> int:
        """An integer in [lo, hi], both ends included."""
        return lo + int(self.random() * (hi - lo + 1))

    def choice(self, seq: Sequence):
        return seq[int(self.random() * len(seq))]

    def sample(self, seq: Sequence, k: int) -> list:
        """k distinct elements of seq (by position), in draw order."""
        n = len(seq)
        if k > n:
            raise ValueError("sample larger than population")
        if 4 * k < n:  # sparse: redraw on collision (no copy of a large population)
            picked: list[int] = []
            while len(picked) < k:
                i = int(self.random() * n)
                if i not in picked:
                    picked.append(i)
            return [seq[i] for i in picked]
        pool = list(seq)
        return [pool.pop(int(self.random() * len(pool))) for _ in range(k)]

    def arrangement(self, seq: Sequence, k: int) -> list:
        """k distinct elements of seq picked with a random offset and a random stride coprime
        to len(seq): two draws instead of k (enough variety for names)."""
        n = len(seq)
        strides = _coprimes(n)
        start = int(self.random() * n)
        stride = strides[int(self.random() * len(strides))]
        return [seq[(start + i * stride) % n] for i in range(k)]

    def shuffled(self, seq: Sequence) -> list:
        return self.sample(seq, len(seq))
