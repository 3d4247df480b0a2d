"""The iterator's checkpoint state in grain 0.2.18's JSON format.

``last_seen_indices[str(i)] = shard_index - G + i * S + next_i * G`` with
``G = max(W, 1) * S``; ``last_worker_index`` is the worker that produced last in
the round-robin cycle, -1 when the next one is worker 0. See "State" in
``docs/concepts.md``.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

# One class for every iterator's refused state, DataLoader and Dataset stages alike.
from grainlike.core.errors import InvalidStateError

STATE_VERSION = 2
_KEYS = ("last_seen_indices", "last_worker_index", "worker_count", "sampler", "data_source")


@dataclasses.dataclass
class Positions:
    """Where each worker is: the next position it reads, and whose turn is next."""

    next_positions: list[int]
    next_worker: int


def source_repr(source: Any) -> str:
    """How a source is named in the state: grain's rule (no data in the state)."""
    import numpy as np

    if isinstance(source, (list, tuple, np.ndarray)):
        return str(type(source))
    return repr(source)


def encode(
    positions: Positions,
    worker_count: int,
    shard_index: int,
    shard_count: int,
    sampler_repr: str,
    data_source_repr: str,
) -> bytes:
    """The state as grain's ``get_state()`` bytes."""
    w = max(worker_count, 1)
    g = w * shard_count
    last_seen = {
        str(i): int(shard_index - g + i * shard_count + positions.next_positions[i] * g)
        for i in range(w)
    }
    state = {
        "version": STATE_VERSION,
        "last_seen_indices": last_seen,
        "last_worker_index": positions.next_worker - 1,
        "worker_count": worker_count,
        "sampler": sampler_repr,
        "data_source": data_source_repr,
    }
    return json.dumps(state, indent=4).encode()


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def decode(
    state: Any,
    *,
    worker_count: int,
    shard_index: int,
    shard_count: int,
    sampler_repr: str,
    data_source_repr: str,
    worker_lengths: list[int],
) -> Positions:
    """Parses and validates ``state``; raises before anything is changed.

    Args:
      state: bytes (or str) as written by ``get_state()`` of grain or grainlike.
      worker_count: the loader's worker count (0 for in-process).
      shard_index, shard_count: the loader's sharding.
      sampler_repr, data_source_repr: the loader's sampler and source names.
      worker_lengths: how many positions each worker has in total.

    Raises:
      TypeError: state is not bytes or str.
      InvalidStateError: the state is malformed or belongs to another pipeline.
    """
    if isinstance(state, (bytes, bytearray, memoryview)):
        try:
            text = bytes(state).decode()
        except UnicodeDecodeError as e:
            raise InvalidStateError(f"state is not UTF-8 text: {e}") from None
    elif isinstance(state, str):
        text = state
    else:
        raise TypeError(
            f"set_state expects the bytes returned by get_state(), got {type(state).__name__}"
        )
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as e:
        # ValueError: JSONDecodeError, and also an int literal longer than Python's
        # int-from-string limit (4300 digits).
        head = text[:60] + ("..." if len(text) > 60 else "")
        raise InvalidStateError(f"state is not valid JSON ({e}): {head!r}") from None
    if not isinstance(data, dict):
        raise InvalidStateError(f"state must be a JSON object, got {type(data).__name__}")
    missing = [k for k in _KEYS if k not in data]
    if missing:
        raise InvalidStateError(f"state is missing the field(s) {missing}")
    version = data.get("version", STATE_VERSION)
    if not _is_int(version) or version > STATE_VERSION or version < 1:
        raise InvalidStateError(
            f"state version {version!r} is not supported (this version reads versions "
            f"1 to {STATE_VERSION})"
        )
    if not _is_int(data["worker_count"]) or data["worker_count"] != worker_count:
        raise InvalidStateError(
            "Worker count in checkpoint does not match dataloader worker count.\n"
            f"worker count in checkpoint: {data['worker_count']}\n"
            f"worker count in dataloader: {worker_count}"
        )
    if data["sampler"] != sampler_repr:
        raise InvalidStateError(
            "Sampler in checkpoint does not match dataloader sampler.\n"
            f"sampler in checkpoint: {data['sampler']}\n"
            f"sampler in dataloader: {sampler_repr}\n"
            "The sampler is compared by `repr(sampler)`."
        )
    if data["data_source"] != data_source_repr:
        raise InvalidStateError(
            "DataSource in checkpoint does not match datasource in dataloader.\n"
            f"data source in checkpoint: {data['data_source']}\n"
            f"data source in dataloader: {data_source_repr}\n"
            "The data source is compared by `repr(data_source)`."
        )
    w = max(worker_count, 1)
    last_seen = data["last_seen_indices"]
    if not isinstance(last_seen, dict) or sorted(last_seen) != sorted(str(i) for i in range(w)):
        raise InvalidStateError(
            f"last_seen_indices must map each worker '0'..'{w - 1}' to an index, "
            f"got {last_seen!r}"
        )
    g = w * shard_count
    positions = []
    for i in range(w):
        value = last_seen[str(i)]
        if not _is_int(value):
            raise InvalidStateError(
                f"last_seen_indices['{i}'] must be an int, got {value!r}"
            )
        offset = value + g - shard_index - i * shard_count
        if offset % g:
            raise InvalidStateError(
                f"last_seen_indices['{i}'] = {value} is not an index worker {i} of "
                f"{w} in shard {shard_index} of {shard_count} can have produced"
            )
        pos = offset // g
        if pos < 0 or pos > worker_lengths[i]:
            raise InvalidStateError(
                f"last_seen_indices['{i}'] = {value} is out of range: worker {i} "
                f"reads {worker_lengths[i]} positions, the state says {pos} were read"
            )
        positions.append(pos)
    last_worker = data["last_worker_index"]
    if not _is_int(last_worker) or not -1 <= last_worker < w:
        raise InvalidStateError(
            f"last_worker_index must be an int in [-1, {w - 1}], got {last_worker!r}"
        )
    next_worker = (last_worker + 1) % w if worker_count else 0
    return Positions(next_positions=positions, next_worker=next_worker)
