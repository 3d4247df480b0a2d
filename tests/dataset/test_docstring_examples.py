"""The examples in the docstrings of the Dataset API and its neighbours run and print what they show."""

from __future__ import annotations

import doctest
import importlib
import tempfile

import pytest

# Modules with ``>>>`` examples; each runs at least one.
MODULES = [
    *(
        f"grainlike.dataset.{name}"
        for name in [
            "base", "batch", "cache", "elastic", "element_spec", "interleave", "limit", "multithread",
            "options", "packing", "packing_concat_split", "performance", "rebatch", "rng_pool", "source",
            "tfrecord", "thread_prefetch",
        ]
    ),
    "grainlike.core.pack_and_batch",
    "grainlike.io",
    "grainlike.jax_loops",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name, tmp_path, monkeypatch):
    # Examples are copied by readers: one that writes files must clean them up.
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
    assert not list(scratch.iterdir()), f"{name}'s examples left temporary files"
