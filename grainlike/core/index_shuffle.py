"""The keyed index permutation grain 0.2.18 shuffles with (``index_shuffle``).

A Feistel network on the bits of the index, keyed by ``std::seed_seq(seed)`` round
keys, with cycle-walking so the result stays in ``[0, max_index]``; the tests check
it against grain's outputs (``tests/data/index_shuffle_vectors.json``). Three ways
to evaluate it, all giving the same numbers: a table of the whole permutation for
a 16-bit block (``max_index <= 2**16``, where cycle-walking a tiny range would take
thousands of encryptions per index) once enough work was spent on it; a scalar
network for Python ints; whole numpy arrays of halves, re-walking only the
elements still out of range.
"""

from __future__ import annotations

import functools
import math
import operator
from typing import Optional, Union

import numpy as np

_M32 = 0xFFFFFFFF
# Indices travel as int64 in and out, so max_index is bounded like the reference's
# ``int64_t`` parameter.
_MAX_INDEX_LIMIT = 2**63 - 1
# Block sizes up to this many bits get a full permutation table.
_TABLE_BITS = 16
# Half-words up to this many bits get a round-function lookup table (scalar path).
_F_TABLE_BITS = 16
# Arrays up to this size go through the scalar path: a vectorised encryption costs
# about ten numpy calls per round whatever the size, a scalar one well under one.
_SCALAR_ARRAY_SIZE = 32


@functools.lru_cache(maxsize=256)
def _round_keys(seed: int, n: int) -> tuple[int, ...]:
    """The ``n`` round keys for ``seed``: C++ ``std::seed_seq{seed}.generate`` (cached: slow in Python)."""
    b = [0x8B8B8B8B] * n
    if n >= 623:
        t = 11
    elif n >= 68:
        t = 7
    elif n >= 39:
        t = 5
    elif n >= 7:
        t = 3
    else:
        t = (n - 1) // 2
    p = (n - t) // 2
    q = p + t
    m = max(2, n)
    for k in range(m):
        x = b[k % n] ^ b[(k + p) % n] ^ b[(k - 1) % n]
        r1 = (1664525 * (x ^ (x >> 27))) & _M32
        if k == 0:
            r2 = r1 + 1
        elif k == 1:
            # The seed sequence holds exactly one word, consumed at k == 1.
            r2 = r1 + 1 + seed
        else:
            r2 = r1 + k % n
        r2 &= _M32
        b[(k + p) % n] = (b[(k + p) % n] + r1) & _M32
        b[(k + q) % n] = (b[(k + q) % n] + r2) & _M32
        b[k % n] = r2
    for k in range(m, m + n):
        x = (b[k % n] + b[(k + p) % n] + b[(k - 1) % n]) & _M32
        r3 = (1566083941 * (x ^ (x >> 27))) & _M32
        r4 = (r3 - k % n) & _M32
        b[(k + p) % n] ^= r3
        b[(k + q) % n] ^= r4
        b[k % n] = r4
    return tuple(b)


def _half_width(max_index: int) -> int:
    """Half the Feistel block width ``W`` for ``max_index >= 1``."""
    # Double precision on purpose: the reference takes ceil(log2(double)), which is
    # what makes max_index == 2**B (and, for large B, values just above it) land in
    # a block one bit too narrow.
    bits = math.ceil(math.log2(max_index))
    bits += bits % 2
    return min(max(bits, 16), 64) // 2


def _half_round(
    src: np.ndarray,
    dst: np.ndarray,
    key: np.unsignedinteger,
    mask: np.unsignedinteger,
    shifts: tuple[np.unsignedinteger, ...],
    d: np.ndarray,
    f: np.ndarray,
    t: np.ndarray,
) -> None:
    """``dst ^= (F(src) ^ key) & mask`` in place; ``d``, ``f``, ``t`` are scratch."""
    sw, s1, s2, s8 = shifts
    np.left_shift(src, sw, out=d)
    d |= src
    np.right_shift(d, s1, out=f)
    np.right_shift(d, s8, out=t)
    f &= t
    np.right_shift(d, s2, out=t)
    f ^= t
    f ^= key
    f &= mask
    dst ^= f


def _encrypt_array(v: np.ndarray, keys: tuple[int, ...], w: int) -> np.ndarray:
    """One Feistel encryption (half width ``w``, raw 32-bit round ``keys``) of the 1-D uint64 array ``v``.

    Only the low ``2 * w`` bits of ``v`` take part (the ``max_index == 2**B`` quirk relies on that).
    """
    # Halves live in a dtype twice their width, so a rotation is one shift of the
    # half doubled (``x | x << W``); bits above W are garbage that the single mask
    # per half-round removes (every step in between is bitwise).
    dt = np.uint32 if w <= 16 else np.uint64
    mask = dt((1 << w) - 1)
    sw, s1, s2, s8 = dt(w), dt(w - 1), dt(w - 2), dt(w - 8)
    left = (v >> np.uint64(w)).astype(dt)
    left &= mask
    right = v.astype(dt)
    right &= mask
    d = np.empty_like(left)
    f = np.empty_like(left)
    t = np.empty_like(left)
    shifts = (sw, s1, s2, s8)
    for i in range(0, len(keys), 2):
        _half_round(right, left, dt(keys[i]), mask, shifts, d, f, t)
        _half_round(left, right, dt(keys[i + 1]), mask, shifts, d, f, t)
    out = left.astype(np.uint64)
    out <<= np.uint64(w)
    out |= right
    return out


# From this range size on, the permutation table's cycle walk is vectorised.
_VECTOR_WALK_MIN = 1 << 12


def _permutation_table(max_index: int, seed: int, rounds: int) -> np.ndarray:
    """``index_shuffle(i)`` for every ``i`` in ``[0, max_index]`` (16-bit block), as a read-only uint16 array."""
    domain = 1 << _TABLE_BITS
    keys = _round_keys(seed, rounds)
    succ_array = _encrypt_array(np.arange(domain, dtype=np.uint64), keys, _TABLE_BITS // 2)
    size = min(max_index + 1, domain)
    if max_index + 1 >= _VECTOR_WALK_MIN:
        # A vectorised walk loops about domain / max_index times (a few dozen here),
        # each step on the shrinking set of starts still out of range: ~2x faster
        # than the plain walk below for ranges this large.
        v = succ_array[:size].copy()
        todo = np.flatnonzero(v > max_index)
        while todo.size:
            v[todo] = succ_array[v[todo]]
            todo = todo[v[todo] > max_index]
    else:
        # A plain walk: the steps taken over all starts add up to at most the domain
        # size (each cycle is walked once between in-range points).
        succ = succ_array.tolist()
        values = []
        for x in range(size):
            y = succ[x]
            while y > max_index:
                y = succ[y]
            values.append(y)
        v = np.array(values, np.uint64)
    if max_index == domain:
        # Quirk: the block drops bit 16, so max_index itself encrypts like 0.
        v = np.append(v, v[0])
    table = v.astype(np.uint16)
    table.flags.writeable = False
    return table


@functools.lru_cache(maxsize=_F_TABLE_BITS + 1)
def _round_function_table(w: int) -> list[int]:
    """``F(x)`` for every W-bit ``x``, as a list (fast to index from Python)."""
    x = np.arange(1 << w, dtype=np.uint64)
    d = x | (x << np.uint64(w))
    f = (d >> np.uint64(w - 1)) & (d >> np.uint64(w - 8)) ^ (d >> np.uint64(w - 2))
    return (f & np.uint64((1 << w) - 1)).tolist()


class _Plan:
    """What evaluating one ``(max_index, seed, rounds)`` needs, computed once."""

    __slots__ = ("max_index", "seed", "rounds", "w", "keys", "masked_pairs", "f_table", "table", "budget")

    def __init__(self, max_index: int, seed: int, rounds: int) -> None:
        self.max_index = max_index
        self.seed = seed
        self.rounds = rounds
        self.table: Optional[np.ndarray] = None
        # Encryptions the scalar walk may still spend before the permutation table
        # is built (None: no table for this block size). Tabulating (one vectorised
        # encryption of the whole 2**16 block) costs about as much as 2**12 scalar
        # encryptions, so a one-off call on a moderate range never pays for it and
        # a full pass over a small range pays at most about twice.
        self.budget: Optional[int] = None
        if max_index == 0:
            self.w, self.keys, self.masked_pairs, self.f_table = 0, (), (), None
            self.table = np.zeros(1, np.uint16)
            self.table.flags.writeable = False
            return
        self.w = w = _half_width(max_index)
        self.keys = keys = _round_keys(seed, rounds)
        mask = (1 << w) - 1
        self.masked_pairs = tuple(
            (keys[i] & mask, keys[i + 1] & mask) for i in range(0, rounds, 2)
        )
        self.f_table = _round_function_table(w) if w <= _F_TABLE_BITS else None
        if 2 * w <= _TABLE_BITS:
            self.budget = (1 << _TABLE_BITS) // 16

    def expected_walk(self) -> float:
        """Mean encryptions per index: block size over range size."""
        return (1 << (2 * self.w)) / (self.max_index + 1)

    def build_table(self) -> np.ndarray:
        """Tabulates the permutation (once: the budget is spent for good)."""
        if self.table is None:
            self.table = _permutation_table(self.max_index, self.seed, self.rounds)
        self.budget = None
        return self.table


# Validated (max_index, seed, rounds) -> _Plan. A plain dict rather than lru_cache:
# the scalar path looks it up before any validation, and a hit means the
# parameters were validated when the entry was made.
_PLANS: dict[tuple[int, int, int], _Plan] = {}
# A plan may hold a 128 KiB permutation table; bound the total.
_MAX_PLANS = 64


def _get_plan(max_index: object, seed: object, rounds: object) -> _Plan:
    """Validates the parameters (unless already cached) and returns their plan."""
    if type(max_index) is int and type(seed) is int and type(rounds) is int:
        plan = _PLANS.get((max_index, seed, rounds))
        if plan is not None:
            return plan
    key = _check_params(max_index, seed, rounds)
    plan = _PLANS.get(key)
    if plan is None:
        plan = _Plan(*key)
        if len(_PLANS) >= _MAX_PLANS:
            _PLANS.clear()
        _PLANS[key] = plan
    return plan


def _encrypt_scalar(v: int, plan: _Plan) -> int:
    """One Feistel encryption of the low ``2 * plan.w`` bits of ``v``."""
    w = plan.w
    mask = (1 << w) - 1
    left = (v >> w) & mask
    right = v & mask
    ft = plan.f_table
    if ft is not None:
        for k0, k1 in plan.masked_pairs:
            left ^= ft[right] ^ k0
            right ^= ft[left] ^ k1
        return (left << w) | right
    s1, s2, s8 = w - 1, w - 2, w - 8
    for k0, k1 in plan.masked_pairs:
        x = right
        left ^= ((((x << 1) | (x >> s1)) & ((x << 8) | (x >> s8)) ^ ((x << 2) | (x >> s2))) & mask) ^ k0
        x = left
        right ^= ((((x << 1) | (x >> s1)) & ((x << 8) | (x >> s8)) ^ ((x << 2) | (x >> s2))) & mask) ^ k1
    return (left << w) | right


def _as_int(value: object, name: str) -> int:
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int, got {value!r}") from None


def _check_params(max_index: object, seed: object, rounds: object) -> tuple[int, int, int]:
    max_index = _as_int(max_index, "max_index")
    seed = _as_int(seed, "seed")
    rounds = _as_int(rounds, "rounds")
    if not 0 <= max_index <= _MAX_INDEX_LIMIT:
        raise ValueError(f"max_index must be an int in [0, 2**63), got {max_index}")
    if not 0 <= seed <= _M32:
        raise ValueError(f"seed must be an int in [0, 2**32), got {seed}")
    if rounds % 2 or not 4 <= rounds <= 1024:
        raise ValueError(f"rounds must be an even integer between 4 and 1024, got {rounds}")
    return max_index, seed, rounds


def _index_error(index: int, max_index: int) -> ValueError:
    return ValueError(f"index must be in [0, max_index], got {index} (max_index={max_index})")


def index_shuffle(
    index: Union[int, np.integer, np.ndarray], max_index: int, seed: int, rounds: int = 4
) -> Union[int, np.ndarray]:
    """Position of ``index`` in the keyed permutation of ``[0, max_index]``.

    Bit-for-bit the same as grain 0.2.18's ``index_shuffle`` (including its
    non-bijective result when ``max_index`` is exactly ``2**B`` for an even
    ``B >= 16``).

    Args:
      index: an int, or a numpy integer array of any shape, in ``[0, max_index]``.
      max_index: the largest index (the permutation covers ``max_index + 1``
        values), in ``[0, 2**63)``.
      seed: the permutation's key, in ``[0, 2**32)``.
      rounds: Feistel rounds, even, in ``[4, 1024]``.

    Returns:
      An int for an int (or numpy integer scalar); an int64 array of the same shape
      for an array.

    Raises:
      ValueError: an argument is out of its range.
      TypeError: an argument is not an integer (or integer array).

    Example:
      >>> sorted(index_shuffle(i, 9, seed=42) for i in range(10)) == list(range(10))
      True
    """
    plan = _get_plan(max_index, seed, rounds)
    if isinstance(index, np.ndarray):
        return _index_shuffle_array(index, plan)
    if type(index) is not int:
        index = _as_int(index, "index")
    max_index = plan.max_index
    if not 0 <= index <= max_index:
        raise _index_error(index, max_index)
    table = plan.table
    if table is None and plan.budget is not None and plan.expected_walk() >= plan.budget:
        table = plan.build_table()
    if table is not None:
        return int(table[index])
    return _walk_scalar(index, plan)


def _walk_scalar(index: int, plan: _Plan) -> int:
    """Encrypt-then-cycle-walk one in-range index."""
    max_index = plan.max_index
    v = _encrypt_scalar(index, plan)
    steps = 1
    while v > max_index:
        v = _encrypt_scalar(v, plan)
        steps += 1
    if plan.budget is not None:
        plan.budget -= steps
        if plan.budget <= 0:
            plan.build_table()
    return v


def _index_shuffle_array(index: np.ndarray, plan: _Plan) -> np.ndarray:
    if not np.issubdtype(index.dtype, np.integer):
        raise TypeError(
            f"index must be an int or an integer array, got an array of {index.dtype}"
        )
    max_index = plan.max_index
    if index.size:
        lo, hi = int(index.min()), int(index.max())
        if lo < 0 or hi > max_index:
            raise _index_error(lo if lo < 0 else hi, max_index)
    table = plan.table
    if table is None and plan.budget is not None:
        # A small range in a 16-bit block: a vectorised walk would loop about
        # 2**16 / max_index times, so tabulate unless the scalar walk is cheaper.
        if index.size * plan.expected_walk() >= plan.budget:
            table = plan.build_table()
    if table is not None:
        return table[index].astype(np.int64)
    if plan.budget is not None or index.size <= _SCALAR_ARRAY_SIZE:
        out = [_walk_scalar(i, plan) for i in index.ravel().tolist()]
        return np.array(out, np.int64).reshape(index.shape)
    v = _encrypt_array(index.astype(np.uint64).reshape(-1), plan.keys, plan.w)
    limit = np.uint64(max_index)
    todo = np.flatnonzero(v > limit)
    # Only out-of-range elements are re-encrypted; the set shrinks geometrically.
    while todo.size:
        again = _encrypt_array(v[todo], plan.keys, plan.w)
        v[todo] = again
        todo = todo[again > limit]
    return v.astype(np.int64).reshape(index.shape)
