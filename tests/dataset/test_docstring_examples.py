"""The examples in the Dataset API's docstrings run and print what they show."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = ["base", "batch", "filter", "limit", "map", "mix", "options", "prefetch", "repeat", "seed", "shuffle", "slice", "source", "thread_prefetch", "zip"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(f"grainlike.dataset.{name}")
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
