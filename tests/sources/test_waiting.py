"""Which sources' reads wait (grainlike/sources/waiting.py): decided by type and declaration."""

from __future__ import annotations

import numpy as np
import pytest

from grainlike.sources import DeclaresWaiting, InMemoryDataSource, RangeDataSource
from grainlike.sources.waiting import declared_waits, source_waits


class Plain:
    def __len__(self):
        return 3

    def __getitem__(self, key):
        return key


class DeclaredLocal(Plain):
    waits = False


class DeclaredWaiting(DeclaredLocal):
    waits = True  # a subclass may say otherwise


class PerInstance(Plain):
    def __init__(self, remote: bool):
        self.remote = remote

    @property
    def waits(self) -> bool:
        return self.remote


@pytest.mark.parametrize(
    "source",
    [[1, 2], (1, 2), range(3), np.arange(3), np.zeros((2, 2)), RangeDataSource(0, 3, 1), DeclaredLocal(), PerInstance(False)],
    ids=["list", "tuple", "range", "array", "2d array", "RangeDataSource", "declared", "property"],
)
def test_sources_in_memory_or_declared_local_do_not_wait(source):
    assert source_waits(source) is False


@pytest.mark.parametrize(
    "source", [Plain(), DeclaredWaiting(), PerInstance(True), {0: "a"}],
    ids=["unknown type", "declared", "property", "dict"],
)
def test_sources_of_unknown_types_or_declared_waiting_wait(source):
    assert source_waits(source) is True


def test_in_memory_data_source_does_not_wait():
    source = InMemoryDataSource([1, 2, 3])
    try:
        assert source_waits(source) is False
    finally:
        source.close()


def test_functions_and_transforms_declare_with_an_attribute():
    def f(x):
        return x

    assert declared_waits(f) is None and not isinstance(f, DeclaresWaiting)
    f.waits = True
    assert declared_waits(f) is True and isinstance(f, DeclaresWaiting)
    assert declared_waits(np.bool_(False)) is None  # numpy's own attributes are no declaration


def test_a_declaration_that_is_not_a_bool_names_the_class_and_the_values_accepted():
    class Odd(Plain):
        waits = 1

    with pytest.raises(TypeError, match=r"Odd.waits must be True .* or False .*got 1"):
        source_waits(Odd())
