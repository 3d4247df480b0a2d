"""The leak check itself: it fails on anonymous shared memory a test left behind.

Batches and anonymous sources live in memfd segments, which no ``/dev/shm``
listing shows; the check counts their descriptors and mappings instead.
"""

import gc
import os

import numpy as np
import pytest

from grainlike.core import memfd
from tests.helpers.leaks import LeakCheck, memfd_usage

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(not memfd.available(), reason="no memfd_create on this platform"),
]


def test_a_segment_left_mapped_is_reported():
    check = LeakCheck()
    fd, region = memfd.new_segment(4096)
    os.close(fd)
    try:
        with pytest.raises(AssertionError, match="anonymous shared memory left"):
            check.assert_clean(timeout=0.2)
    finally:
        del region
        gc.collect()
    check.assert_clean()


def test_a_segment_descriptor_left_open_is_reported():
    check = LeakCheck()
    fd, region = memfd.new_segment(4096)
    del region
    gc.collect()
    try:
        assert memfd_usage()[1] == check.memfd[1]  # Unmapped: only the descriptor is left.
        with pytest.raises(AssertionError, match="anonymous shared memory left"):
            check.assert_clean(timeout=0.2)
    finally:
        os.close(fd)
    check.assert_clean()


def test_an_array_freed_by_collection_is_not_a_leak():
    check = LeakCheck()
    fd, region = memfd.new_segment(4096)
    os.close(fd)
    array = np.asarray(region)
    del region
    # A reference cycle keeps the mapping until the check's own collection.
    cycle: list = [array]
    cycle.append(cycle)
    del array, cycle
    check.assert_clean()


def test_a_mapping_from_before_the_check_is_not_a_leak():
    fd, region = memfd.new_segment(4096)
    os.close(fd)
    check = LeakCheck()
    assert check.memfd[1] >= 1
    check.assert_clean()
    del region
