"""Concat-then-split packing (grain's ``ConcatThenSplitIterDataset``).

Elements are concatenated until some feature reaches its target length; the
element that overflows is split and its rest starts the next packed element.
The state is grain's: the parent's state before the element split last, the
slices of it still to be packed, and how many packed elements were emitted
since; a restore re-reads that element and re-packs up to there.
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import enum
import logging
from typing import Any, Collection, Mapping, Optional, Sequence

import numpy as np

from grainlike.core.errors import StateIndexError, StateTypeError, is_int
from grainlike.dataset.nodes.iter_dataset import IterDataset
from grainlike.dataset.nodes.iterator import DatasetIterator
from grainlike.dataset.transformations.packing import sequence_length
from grainlike.dataset.nodes.state import non_negative_int

__all__ = ["BOSHandling", "ConcatThenSplitIterDataset"]

_logger = logging.getLogger("grainlike")

# (start, stop) of a feature still to pack; this one means the whole feature.
_WHOLE = (-1, -1)


def _is_slice(sl: Any) -> bool:
    """Whether ``sl`` is a state's ``(start, stop)`` pair: ``(-1, -1)`` or ``0 <= start <= stop``."""
    if not isinstance(sl, (list, tuple)) or len(sl) != 2:
        return False
    if any(not is_int(v) for v in sl):
        return False
    return tuple(sl) == _WHOLE or 0 <= sl[0] <= sl[1] < 2**63


class BOSHandling(enum.Enum):
    """What packing does with BOS (beginning of sequence) tokens."""

    # Leave the inputs as they are.
    DO_NOTHING = enum.auto()
    # Replace the first token of each packed sequence (and of each split rest) by BOS.
    REPLACE_FIRST_TOKEN_WITH_BOS = enum.auto()


@dataclasses.dataclass(frozen=True)
class _Piece:
    """An element of the parent (read after ``parent_state``), or the part ``slices`` selects."""

    parent_state: Any
    features: Mapping[str, Any]
    slices: Mapping[str, tuple]

    def feature(self, key: str) -> Any:
        value = self.features[key]
        sl = self.slices.get(key, _WHOLE)
        if sl != _WHOLE and np.ndim(value) != 0:
            return value[sl[0] : sl[1]]
        return value

    def split(self, points: Mapping[str, int]) -> tuple[Optional["_Piece"], "_Piece"]:
        """(left, right) at ``points``; (None, self) when every point is 0.

        A point is where the feature's new slice ends: an index into the whole
        feature for a feature that overflows, and the sliced length for one that
        fits (grain's convention, kept so that states and outputs agree).
        """
        if all(p == 0 for p in points.values()):
            return None, self
        left, right = {}, {}
        for key, point in points.items():
            sl = self.slices[key]
            start, stop = sl if sl != _WHOLE else (0, sequence_length(self.features[key]))
            left[key] = (start, point)
            right[key] = (point, stop)
        return _Piece(self.parent_state, self.features, left), _Piece(self.parent_state, self.features, right)


class _ConcatThenSplitDatasetIterator(DatasetIterator):
    """See the module docstring; the state is checkpointed when the buffer is empty."""

    def __init__(self, parent: DatasetIterator, config: "ConcatThenSplitIterDataset"):
        super().__init__(parent)
        self._lengths = dict(config._length_struct)
        self._meta = frozenset(config._meta_features)
        self._split_full = config._split_full_length_features
        self._bos_keys = (
            frozenset(config._bos_features)
            if config._bos_handling == BOSHandling.REPLACE_FIRST_TOKEN_WITH_BOS
            else frozenset()
        )
        self._bos_token_id = config._bos_token_id
        self._arange = np.arange(max(self._lengths.values()), dtype=np.int32)
        self._arange.flags.writeable = False
        self._clear()
        self._checkpoint()

    def _clear(self) -> None:
        self._packed: collections.deque = collections.deque()
        self._remainder: Optional[_Piece] = None
        self._stopped = False

    def _empty_slices(self) -> dict:
        return {k: _WHOLE for k in self._lengths if k not in self._meta}

    def _checkpoint(self) -> None:
        if self._remainder is None:
            self._state_parent = self._parent.get_state()
            self._state_slices = self._empty_slices()
        else:
            self._state_parent = self._remainder.parent_state
            self._state_slices = self._remainder.slices
        self._emitted_since_checkpoint = 0

    def get_state(self) -> dict:
        return {
            "parent_state": copy.deepcopy(self._state_parent),
            "remainder_slices": {k: tuple(v) for k, v in self._state_slices.items()},
            "elements_from_buffer_after_checkpoint": self._emitted_since_checkpoint,
        }

    def set_state(self, state: dict) -> None:
        keys = ("parent_state", "remainder_slices", "elements_from_buffer_after_checkpoint")
        if not isinstance(state, dict) or set(state) != set(keys):
            raise StateTypeError(f"{self}: a state must be a dict with the keys {keys}, got {state!r}")
        steps = non_negative_int(state, "elements_from_buffer_after_checkpoint", self)
        slices = state["remainder_slices"]
        if not isinstance(slices, dict):
            raise StateTypeError(f"{self}: state['remainder_slices'] must be a dict, got {slices!r}")
        for key, sl in slices.items():
            if key not in self._lengths or not _is_slice(sl):
                raise StateTypeError(
                    f"{self}: state['remainder_slices'][{key!r}] must be a (start, stop) pair of "
                    f"ints for one of the features {sorted(self._lengths)}, got {sl!r}"
                )
        # A JSON round trip turns the (start, stop) tuples into lists.
        slices = {k: tuple(v) for k, v in slices.items()}
        # Checked by replaying it: keep the state to go back to if it does not fit.
        previous = self.get_state()
        try:
            self._restore(state["parent_state"], slices, steps)
        except StopIteration as e:
            self._restore(previous["parent_state"], previous["remainder_slices"],
                          previous["elements_from_buffer_after_checkpoint"])
            raise StateIndexError(
                f"{self}: the state's remainder or state['elements_from_buffer_after_checkpoint'] "
                f"= {steps} runs past the end of the parent: {state!r}"
            ) from e

    def _restore(self, parent_state: Any, slices: dict, steps: int) -> None:
        self._parent.set_state(parent_state)
        self._clear()
        if any(sl != _WHOLE for sl in slices.values()):
            features = next(self._parent)
            self._remainder = _Piece(parent_state, features, slices)
        self._checkpoint()
        for _ in range(steps):
            next(self)

    def _full_length(self, piece: _Piece) -> bool:
        full = False
        for key, target in self._lengths.items():
            n = sequence_length(piece.feature(key))
            if n > target:
                return False
            if n == target:
                full = True
        return full

    def _add(self, piece: _Piece, buffer: list, tokens: dict) -> Optional[_Piece]:
        """Adds ``piece`` (or as much of it as fits) to ``buffer``; returns what is left."""
        new_tokens: dict = {}
        points: dict = {}
        split = False
        for key, target in self._lengths.items():
            n = sequence_length(piece.feature(key))
            available = target - tokens[key]
            if key in self._meta:
                if n > available:
                    _logger.error(
                        "Meta feature %r limited packing. Resulting sequences might have "
                        "unnecessary padding. Feature %r has sequence_length=%d but only %d "
                        "tokens are available (target_sequence_length=%d). Consider increasing "
                        "the target sequence length for %r.",
                        key, key, n, available, target, key,
                    )
                    return piece
                new_tokens[key] = n
            elif n > available:
                split = True
                sl = piece.slices[key]
                points[key] = (0 if sl == _WHOLE else sl[0]) + available
                new_tokens[key] = available
            else:
                points[key] = n
                new_tokens[key] = n
        piece, rest = piece.split(points) if split else (piece, None)
        if piece is not None:
            buffer.append(piece)
        for key, n in new_tokens.items():
            tokens[key] += n
        return rest

    def _pack(self, pieces: Sequence[_Piece]) -> dict:
        out: dict = {}
        for key, target in self._lengths.items():
            meta = key in self._meta
            first = np.asarray(pieces[0].features[key])
            values = np.zeros((target, *first.shape[1:]), first.dtype)
            if not meta:
                segment_ids = np.zeros(target, np.int32)
                positions = np.zeros(target, np.int32)
            bos = key in self._bos_keys
            end = 0
            for segment_id, piece in enumerate(pieces, 1):
                sequence = piece.feature(key)
                start = end
                end = start + sequence_length(sequence)
                if end > target:
                    raise AssertionError(
                        f"Feature {key!r}: cannot pack a sequence into [{start}:{end}] of "
                        f"{target} values in {self}"
                    )
                values[start:end] = sequence
                if bos:
                    values[start] = self._bos_token_id
                if not meta:
                    segment_ids[start:end] = segment_id
                    positions[start:end] = self._arange[: end - start]
            out[key] = values
            if not meta:
                out[f"{key}_segment_ids"] = segment_ids
                out[f"{key}_positions"] = positions
        return out

    def _check(self, features: Any) -> None:
        if type(features) is not dict and not isinstance(features, Mapping):
            raise ValueError(
                f"Parent elements must be unnested dictionaries but got {type(features).__name__}: "
                f"{features!r:.200}"
            )
        if features.keys() != self._lengths.keys():
            from grainlike.core.tree import spec_like

            no_length = sorted(set(features) - set(self._lengths), key=str)
            no_feature = sorted(set(self._lengths) - set(features), key=str)
            raise ValueError(
                f"Parent element has structure {spec_like(dict(features))} but target sequence length is "
                f"{self._lengths}. There must be a sequence length for each feature. Features without a "
                f"length: {no_length}; lengths without a feature: {no_feature}."
            )

    def __next__(self) -> dict:
        self._assert_not_closed()
        if self._packed:
            self._emitted_since_checkpoint += 1
            return self._packed.popleft()
        if self._stopped:
            raise StopIteration
        # Nothing buffered but maybe a remainder: the state is simple here.
        self._checkpoint()
        buffer: list = []
        tokens = {k: 0 for k in self._lengths}
        parent = self._parent
        while True:
            if self._remainder is not None:
                self._remainder = self._add(self._remainder, buffer, tokens)
                if self._remainder is not None:
                    break
            parent_state = parent.get_state()
            try:
                features = next(parent)
            except StopIteration:
                self._stopped = True
                break
            self._check(features)
            piece = _Piece(parent_state, features, self._empty_slices())
            if not self._split_full and self._full_length(piece):
                self._packed.append(self._pack([piece]))
                continue
            self._remainder = self._add(piece, buffer, tokens)
            if self._remainder is not None:
                break
        if buffer:
            self._packed.appendleft(self._pack(buffer))
        if self._stopped and self._remainder is not None:
            self._packed.append(self._pack([self._remainder]))
            self._remainder = None
        if self._packed:
            self._emitted_since_checkpoint += 1
            return self._packed.popleft()
        self._checkpoint()
        raise StopIteration

    def __str__(self) -> str:
        return f"ConcatThenSplitDatasetIterator(length_struct={self._lengths})"


class ConcatThenSplitIterDataset(IterDataset):
    """Concatenates the elements of ``parent`` and splits them at the target lengths.

    Args:
      parent: elements are flat dicts of arrays (first axis the sequence; other
        axes the same in every element) or scalars (length 1).
      length_struct: target length per feature; every feature needs one.
      meta_features: features never split (copied to both sides of a split) and
        without ``*_segment_ids`` / ``*_positions``.
      split_full_length_features: with False, an element with a feature at its
        full length is emitted as it is, ahead of the buffer.
      bos_handling: ``BOSHandling.REPLACE_FIRST_TOKEN_WITH_BOS`` writes
        ``bos_token_id`` over the first token of every packed sequence of the
        ``bos_features``.
      bos_features: the features BOS handling applies to.
      bos_token_id: the BOS token, needed with BOS handling.

    Raises:
      ValueError: BOS arguments given with ``DO_NOTHING``, no ``bos_token_id``
        with BOS handling, or meta features among the BOS features.

    Example:
      >>> import numpy as np
      >>> from grainlike.dataset import MapDataset
      >>> ds = MapDataset.source([{"t": np.arange(n) + 1} for n in (3, 4, 2)]).to_iter_dataset()
      >>> [p["t"].tolist() for p in ConcatThenSplitIterDataset(ds, length_struct={"t": 4})]
      [[1, 2, 3, 1], [2, 3, 4, 1], [2, 0, 0, 0]]
    """

    def __init__(
        self,
        parent: IterDataset,
        *,
        length_struct: Mapping[str, int],
        meta_features: Collection[str] = (),
        split_full_length_features: bool = True,
        bos_handling: BOSHandling = BOSHandling.DO_NOTHING,
        bos_features: Collection[str] = (),
        bos_token_id: Optional[int] = None,
    ):
        super().__init__(parent)
        if bos_handling == BOSHandling.DO_NOTHING and (bos_token_id is not None or bos_features):
            raise ValueError(
                f"bos_handling={bos_handling} indicates that BOS handling is not used, so "
                f"bos_token_id ({bos_token_id!r}) and bos_features ({bos_features!r}) should not be set."
            )
        if bos_handling != BOSHandling.DO_NOTHING and bos_token_id is None:
            raise ValueError(f"bos_token_id must be set if bos_handling is {bos_handling}.")
        if not set(meta_features).isdisjoint(set(bos_features)):
            raise ValueError(
                f"bos_features and meta_features should not overlap. bos_features: {bos_features}, "
                f"meta_features: {meta_features}"
            )
        self._length_struct = length_struct
        self._meta_features = meta_features
        self._split_full_length_features = split_full_length_features
        self._bos_handling = bos_handling
        self._bos_features = bos_features
        self._bos_token_id = bos_token_id

    def __iter__(self) -> _ConcatThenSplitDatasetIterator:
        return _ConcatThenSplitDatasetIterator(self._parent.__iter__(), self)

    def __str__(self) -> str:
        return f"ConcatThenSplitIterDataset(length_struct={dict(self._length_struct)})"
