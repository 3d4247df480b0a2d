"""The DataLoader's checkpoint state in grain 0.2.18's legacy JSON format.

``last_seen_indices[str(i)] = shard_index - G + i * S + next_i * G`` with
``G = max(W, 1) * S``; ``last_worker_index`` is the worker that produced last in
the round-robin cycle, -1 when the next one is worker 0. See "State" in
``docs/concepts.md``.

Below the loader's top stage the state is the Dataset API's: with no workers the
reading stage's ``{"next_index": n}``, with workers ``mp_prefetch``'s dict holding
one such state per worker. ``LegacyState`` converts between the two, and checks a
legacy state completely before anything is restored from it.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Sequence

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


def worker_lengths(local_length: int, worker_count: int) -> list[int]:
    """How many shard-local positions each worker reads (worker ``w``: ``w, w + W, ...``)."""
    w = max(worker_count, 1)
    return [max(0, (local_length - i + w - 1) // w) for i in range(w)]


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def parse(state: Any) -> dict:
    """The JSON object of ``get_state()`` bytes (or str) of grain or grainlike.

    Raises:
      TypeError: ``state`` is not bytes or str.
      InvalidStateError: it is not UTF-8 JSON holding an object.
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
    return data


def dumps(state: dict) -> bytes:
    """The bytes ``get_state()`` returns for a legacy state: grain's formatting."""
    return json.dumps(state, indent=4).encode()


@dataclasses.dataclass(frozen=True)
class LegacyState:
    """Converts one loader's states: legacy JSON object <-> positions <-> Dataset state.

    Attributes:
      worker_count: the loader's worker count (0: in process).
      shard_index, shard_count: the loader's sharding.
      sampler_repr, data_source_repr: how the state names the sampler and source.
      worker_lengths: how many positions each worker reads in all.
    """

    worker_count: int
    shard_index: int
    shard_count: int
    sampler_repr: str
    data_source_repr: str
    worker_lengths: Sequence[int]

    @property
    def _w(self) -> int:
        return max(self.worker_count, 1)

    def encode(self, positions: Positions) -> dict:
        """grain's legacy state (a JSON object) of ``positions``."""
        g = self._w * self.shard_count
        last_seen = {
            str(i): int(self.shard_index - g + i * self.shard_count + positions.next_positions[i] * g)
            for i in range(self._w)
        }
        return {
            "version": STATE_VERSION,
            "last_seen_indices": last_seen,
            "last_worker_index": positions.next_worker - 1,
            "worker_count": self.worker_count,
            "sampler": self.sampler_repr,
            "data_source": self.data_source_repr,
        }

    def decode(self, data: Any) -> Positions:
        """The positions of a legacy state, checked completely against this loader.

        Raises:
          InvalidStateError: the state is malformed or belongs to another pipeline.
        """
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
        if not _is_int(data["worker_count"]) or data["worker_count"] != self.worker_count:
            raise InvalidStateError(
                "Worker count in checkpoint does not match dataloader worker count.\n"
                f"worker count in checkpoint: {data['worker_count']}\n"
                f"worker count in dataloader: {self.worker_count}"
            )
        if data["sampler"] != self.sampler_repr:
            raise InvalidStateError(
                "Sampler in checkpoint does not match dataloader sampler.\n"
                f"sampler in checkpoint: {data['sampler']}\n"
                f"sampler in dataloader: {self.sampler_repr}\n"
                "The sampler is compared by `repr(sampler)`."
            )
        if data["data_source"] != self.data_source_repr:
            raise InvalidStateError(
                "DataSource in checkpoint does not match datasource in dataloader.\n"
                f"data source in checkpoint: {data['data_source']}\n"
                f"data source in dataloader: {self.data_source_repr}\n"
                "The data source is compared by `repr(data_source)`."
            )
        w = self._w
        last_seen = data["last_seen_indices"]
        if not isinstance(last_seen, dict) or sorted(last_seen) != sorted(str(i) for i in range(w)):
            raise InvalidStateError(
                f"last_seen_indices must map each worker '0'..'{w - 1}' to an index, "
                f"got {last_seen!r}"
            )
        g = w * self.shard_count
        positions = []
        for i in range(w):
            value = last_seen[str(i)]
            if not _is_int(value):
                raise InvalidStateError(f"last_seen_indices['{i}'] must be an int, got {value!r}")
            offset = value + g - self.shard_index - i * self.shard_count
            if offset % g:
                raise InvalidStateError(
                    f"last_seen_indices['{i}'] = {value} is not an index worker {i} of "
                    f"{w} in shard {self.shard_index} of {self.shard_count} can have produced"
                )
            pos = offset // g
            if pos < 0 or pos > self.worker_lengths[i]:
                raise InvalidStateError(
                    f"last_seen_indices['{i}'] = {value} is out of range: worker {i} "
                    f"reads {self.worker_lengths[i]} positions, the state says {pos} were read"
                )
            positions.append(pos)
        last_worker = data["last_worker_index"]
        if not _is_int(last_worker) or not -1 <= last_worker < w:
            raise InvalidStateError(
                f"last_worker_index must be an int in [-1, {w - 1}], got {last_worker!r}"
            )
        next_worker = (last_worker + 1) % w if self.worker_count else 0
        return Positions(next_positions=positions, next_worker=next_worker)

    def from_dataset_state(self, state: dict) -> Positions:
        """The positions in the state of the stage below the loader's top."""
        if self.worker_count == 0:
            return Positions([state["next_index"]], 0)
        return Positions(
            [s["next_index"] for s in state["iterators_in_use_states"]], state["next_index_in_cycle"]
        )

    def to_dataset_state(self, positions: Positions) -> dict:
        """The state of the stage below the loader's top at ``positions`` (as grain builds it)."""
        if self.worker_count == 0:
            return {"next_index": positions.next_positions[0]}
        w = self.worker_count
        return {
            "next_index_in_cycle": positions.next_worker,
            "next_index_in_datasets": w,
            "iterators_in_use_indices": list(range(w)),
            "iterators_in_use_states": [{"next_index": p} for p in positions.next_positions],
            "exhausted": [0] * w,
            "future_states": {},
        }


def encode(
    positions: Positions,
    worker_count: int,
    shard_index: int,
    shard_count: int,
    sampler_repr: str,
    data_source_repr: str,
) -> bytes:
    """The state as grain's ``get_state()`` bytes."""
    codec = LegacyState(worker_count, shard_index, shard_count, sampler_repr, data_source_repr, ())
    return dumps(codec.encode(positions))


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
    """Parses and validates ``state``; raises before anything is changed."""
    codec = LegacyState(
        worker_count, shard_index, shard_count, sampler_repr, data_source_repr, tuple(worker_lengths)
    )
    return codec.decode(parse(state))
