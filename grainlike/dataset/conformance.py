"""The checkpoint conformance check every stage, source and loader passes (grain's
``assert_equal_output_after_checkpoint``): a new stage gets its restore test in one line.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from grainlike.core import tree
from grainlike.core.protocols import close_if_closeable, missing_state_methods

__all__ = ["assert_equal_output_after_checkpoint"]


def _spec(state: Any) -> Any:
    """The shape of a state (of the object a DataLoader's JSON bytes encode)."""
    if isinstance(state, (bytes, str)):
        try:
            decoded = json.loads(state)
        except (ValueError, UnicodeDecodeError):
            return tree.spec_like(state)
        if isinstance(decoded, dict):
            return tree.spec_like(decoded)
    return tree.spec_like(state)


def _comparable(value: Any) -> Any:
    """``value`` with other array-likes (``jax.Array``) as numpy, which ``assert_equal`` compares."""

    def leaf(x: Any) -> Any:
        if not isinstance(x, np.ndarray) and hasattr(x, "__array__") and hasattr(x, "shape"):
            return np.asarray(x)
        return x

    return tree.map_structure(leaf, value)


def _iterator(ds: Any) -> Any:
    iterator = iter(ds)
    if missing := missing_state_methods(iterator):
        close_if_closeable(iterator)
        raise TypeError(
            f"assert_equal_output_after_checkpoint: the iterator of {ds!r:.120} "
            f"({type(iterator).__name__}) has no {missing}; checkpointing needs "
            "get_state() and set_state()"
        )
    return iterator


def assert_equal_output_after_checkpoint(ds: Any, *, check_states_after_restore: bool = True) -> None:
    """Tests restoring an iterator to the state before each of its outputs.

    Runs one iterator of ``ds`` to the end, recording ``get_state()`` before each
    ``next()``, then for each recorded state starts a fresh iterator,
    ``set_state(state)`` on it, and checks that:

    - its ``get_state()`` equals the state it was given;
    - it produces exactly the outputs the first iterator produced from there on
      (compared with ``np.testing.assert_equal``);
    - with ``check_states_after_restore``, its ``get_state()`` after each of those
      outputs equals the first iterator's at the same step (a checkpoint taken
      after a restore is the one taken without it);
    - the state keeps its structure (``tree.spec_like``) from step to step.

    Each iterator is closed (``close()``, where it has one) when it is done, so
    loaders with worker processes can be checked too. Keep ``ds`` small: the check
    reads ``n * (n + 1) / 2`` outputs for ``n`` outputs.

    Args:
      ds: anything whose ``iter()`` has ``get_state()`` and ``set_state()``: a
        ``MapDataset`` / ``IterDataset``, a ``DataLoader`` (whose states are JSON
        bytes), or an iterable of your own. Outputs may hold numpy arrays or
        other arrays (``jax.Array``), compared as numpy arrays.
      check_states_after_restore: also compare the states reported after each
        output of a restored iterator (grainlike only; grain checks the first).

    Raises:
      AssertionError: a check failed; the message names the step and the states.
      TypeError: the iterator has no ``get_state`` / ``set_state``.

    Example:
      >>> import grainlike as grain
      >>> loader = grain.DataLoader(
      ...     data_source=grain.RangeDataSource(0, 6, 1),
      ...     sampler=grain.IndexSampler(6, grain.NoSharding(), shuffle=True, num_epochs=1, seed=0),
      ...     operations=[grain.Batch(4)],
      ... )
      >>> assert_equal_output_after_checkpoint(loader)
    """
    checkpoints: list = []
    expected: list = []
    iterator = _iterator(ds)
    try:
        state_spec = None
        while True:
            state = iterator.get_state()
            spec = _spec(state)
            state_spec = spec if state_spec is None else state_spec
            np.testing.assert_equal(
                state_spec,
                spec,
                f"State spec does not match the original state spec at step {len(checkpoints)}."
                f" Expected: {state_spec}, Actual: {spec}",
            )
            try:
                value = next(iterator)
            except StopIteration:
                break
            checkpoints.append(state)
            expected.append(_comparable(value))
        final_state = state
    finally:
        close_if_closeable(iterator)

    assert expected, "Dataset did not produce any elements."
    states_after = checkpoints[1:] + [final_state]

    for i, state in enumerate(checkpoints):
        restored = _iterator(ds)
        try:
            restored.set_state(state)
            actual_state = restored.get_state()
            np.testing.assert_equal(
                actual_state,
                state,
                f"Restored state does not match the original state at step {i}."
                f" Expected: {state}, Actual: {actual_state}",
            )
            values = []
            for j, after in enumerate(states_after[i:], start=i):
                try:
                    values.append(_comparable(next(restored)))
                except StopIteration:
                    break
                if check_states_after_restore:
                    now = restored.get_state()
                    np.testing.assert_equal(
                        now,
                        after,
                        f"After restoring the state of step {i}, the state after step {j} "
                        f"differs from the original run's. Expected: {after}, Actual: {now}",
                    )
            values.extend(_comparable(v) for v in restored)
        finally:
            close_if_closeable(restored)
        np.testing.assert_equal(
            values,
            expected[i:],
            f"Restored values mismatch at step {i} for state {state}."
            f" \nExpected: {expected[i:]}, \nActual: {values}",
        )
