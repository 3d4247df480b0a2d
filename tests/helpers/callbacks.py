"""Checks that no grainlike host callback raises, or returns what the program does not expect.

On GPUs an exception raised inside an ordered ``io_callback`` poisons every later
computation of the process, and JAX raises inside the callback too when the
returned arrays differ from the declared shapes and dtypes. On the CPU neither
shows, so ``callbacks_never_raise`` watches every callback function that grainlike
hands to ``jax.experimental.io_callback`` or ``jax.pure_callback`` (callbacks made
elsewhere, e.g. by a test, are left alone) and fails the test if one raised or
returned something other than its declared result.
"""

from __future__ import annotations

import sys
import traceback

import pytest


def _is_grainlike(frame) -> bool:
    return frame.f_globals.get("__name__", "").split(".")[0] == "grainlike"


def _mismatch(out, result_shape_dtypes) -> str:
    """'' when ``out`` matches the declared result (structure, shapes, canonical dtypes)."""
    import jax
    import numpy as np

    specs, treedef = jax.tree.flatten(result_shape_dtypes)
    leaves, out_treedef = jax.tree.flatten(out)
    if out_treedef != treedef:
        return f"structure {out_treedef}, declared {treedef}"
    for i, (leaf, spec) in enumerate(zip(leaves, specs)):
        leaf = np.asarray(leaf)
        dtype = jax.dtypes.canonicalize_dtype(leaf.dtype)
        if leaf.shape != tuple(spec.shape) or dtype != spec.dtype:
            return f"leaf {i}: {leaf.shape} {dtype}, declared {tuple(spec.shape)} {spec.dtype}"
    return ""


def _watched(callback, result_shape_dtypes, problems: list, calls: list):
    def call(*args, **kwargs):
        calls.append(getattr(callback, "__qualname__", repr(callback)))
        try:
            out = callback(*args, **kwargs)
        except BaseException:
            problems.append("a grainlike host callback raised:\n" + traceback.format_exc())
            raise
        mismatch = _mismatch(out, result_shape_dtypes)
        if mismatch:
            problems.append(f"a grainlike host callback returned {mismatch}")
        return out

    return call


@pytest.fixture
def callbacks_never_raise(monkeypatch):
    """Fails the test if a callback grainlike passed to JAX raised or returned a wrong result.

    Yields the list of the watched callbacks' calls (their names), so a test can
    check that its case really went through a callback.
    """
    import jax
    import jax.experimental

    problems: list = []
    calls: list = []
    for module, name in ((jax.experimental, "io_callback"), (jax, "pure_callback")):
        original = getattr(module, name)

        def patched(callback, result_shape_dtypes, *args, _original=original, **kwargs):
            if _is_grainlike(sys._getframe(1)):
                callback = _watched(callback, result_shape_dtypes, problems, calls)
            return _original(callback, result_shape_dtypes, *args, **kwargs)

        monkeypatch.setattr(module, name, patched)
    yield calls
    assert not problems, "\n".join(problems)
