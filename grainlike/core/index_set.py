"""A set of indices in a checkpoint state, as a few JSON bytes.

After an elastic restore a state names the indices already delivered above the
first one not delivered (``skip_indices``). Listed one by one they grow with the
work done (296 KB after 40k of 100k records restored onto other processes); here
they are written as the smaller of two forms, both bounded by the span they cover
(which lies in the work still to do):

- ``{"step": s, "ranges": [[start, stop], ...]}``: the indices
  ``range(start, stop, s)`` for each pair (runs: a few bytes each);
- ``{"step": s, "start": a, "count": n, "bitmap": "<base64>"}``: index
  ``a + k * s`` for each set bit ``k < n`` of the zlib-compressed, base64-encoded
  ``numpy.packbits`` bitmap (shuffled records: one bit per index spanned).

A plain list of ints (what grainlike wrote before) still decodes.
"""

from __future__ import annotations

import base64
import zlib
from typing import Any

import numpy as np

from grainlike.core.errors import StateTypeError


def encode(indices: Any, step: int = 1) -> dict:
    """The compact form of ``indices`` (ints, all congruent modulo ``step``).

    Example:
      >>> encode([4, 6, 8, 10, 20], step=2)
      {'step': 2, 'ranges': [[4, 12], [20, 22]]}
    """
    values = np.unique(np.asarray(indices, dtype=np.int64))
    if values.size == 0:
        return {"step": step, "ranges": []}
    # Runs of consecutive indices (``step`` apart).
    breaks = np.flatnonzero(np.diff(values) != step) + 1
    starts = values[np.concatenate([[0], breaks])]
    stops = values[np.concatenate([breaks - 1, [values.size - 1]])] + step
    ranges = {"step": step, "ranges": [[int(a), int(b)] for a, b in zip(starts, stops)]}
    if len(starts) <= 8:
        return ranges
    first = int(values[0])
    offsets = (values - first) // step
    bits = np.zeros(int(offsets[-1]) + 1, dtype=bool)
    bits[offsets] = True
    packed = base64.b64encode(zlib.compress(np.packbits(bits).tobytes(), 9)).decode()
    bitmap = {"step": step, "start": first, "count": int(bits.size), "bitmap": packed}
    # About 11 bytes of JSON per run, 1/6 byte per bit (before zlib) spanned.
    return ranges if 11 * len(starts) <= len(packed) else bitmap


def decode(value: Any, where: str, limit: int) -> list[int]:
    """The sorted indices that ``value`` (``encode``'s dict, or a list of ints) holds.

    Args:
      value: from a state.
      where: names the field in errors, e.g. ``"state['skip_indices']"``.
      limit: the most indices (and the widest span, in steps) accepted; a larger
        set is no state this iterator writes, and is refused before it is expanded.

    Raises:
      StateTypeError (an ``InvalidStateError``): ``value`` is malformed or too large.
    """
    def bad(why: str) -> StateTypeError:
        return StateTypeError(f"{where}: {why}, got {_head(value)}")

    if isinstance(value, list):  # the form written before ranges
        if len(value) > limit or not all(_is_int(v) for v in value):
            raise bad(f"must be a list of at most {limit} ints")
        return sorted(set(value))
    if not isinstance(value, dict) or not _is_int(value.get("step")) or not 0 < value["step"] < 2**63:
        raise bad("must be a list of ints or a dict with a positive int 'step'")
    step = value["step"]
    if set(value) == {"step", "ranges"}:
        ranges = value["ranges"]
        if not isinstance(ranges, list) or not all(
            isinstance(r, list) and len(r) == 2 and all(_is_int(v) for v in r) for r in ranges
        ):
            raise bad("'ranges' must be a list of [start, stop] int pairs")
        total = sum(max(0, -(-(b - a) // step)) for a, b in ranges)
        if total > limit or any(b < a for a, b in ranges):
            raise bad(f"'ranges' must hold at most {limit} indices, each [start, stop] with start <= stop")
        out = [v for a, b in ranges for v in range(a, b, step)]
        return sorted(set(out))
    if set(value) == {"step", "start", "count", "bitmap"}:
        start, count, text = value["start"], value["count"], value["bitmap"]
        if not _is_int(start) or not _is_int(count) or not 0 <= count <= limit or not isinstance(text, str):
            raise bad(f"'start' must be an int, 'count' an int in [0, {limit}], 'bitmap' a string")
        try:
            packed = zlib.decompressobj().decompress(base64.b64decode(text, validate=True), (count + 7) // 8 + 1)
        except (ValueError, zlib.error) as e:
            raise bad(f"'bitmap' is not base64 of zlib data ({e})") from None
        if len(packed) != (count + 7) // 8:
            raise bad(f"'bitmap' must hold {count} bits")
        bits = np.unpackbits(np.frombuffer(packed, dtype=np.uint8))[:count]
        return [start + int(k) * step for k in np.flatnonzero(bits)]
    raise bad("must hold the keys {'step', 'ranges'} or {'step', 'start', 'count', 'bitmap'}")


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and -(2**63) <= x < 2**63


def _head(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 200 else text[:200] + "..."
