"""``ReadOptions`` against grain 0.2.18: the warning for a buffer smaller than the threads."""

import logging

import pytest

from grainlike.dataset.nodes.options import ReadOptions

GRAINS_TEXT = (
    "prefetch_buffer_size=5 is smaller than num_threads=10. This will limit the number of threads that can "
    "actually be used in parallel to 5, potentially hurting performance. Please set prefetch_buffer_size >= "
    "num_threads."
)


def test_a_buffer_smaller_than_the_threads_warns_with_grains_text(grain_ref, caplog):
    with caplog.at_level(logging.WARNING):
        grain_ref.ReadOptions(num_threads=10, prefetch_buffer_size=5)
    assert GRAINS_TEXT in caplog.text  # grain's own warning says it
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="grainlike"):
        ReadOptions(num_threads=10, prefetch_buffer_size=5)
    assert [r.getMessage() for r in caplog.records] == [GRAINS_TEXT]


@pytest.mark.parametrize("threads, buffer", [(10, 0), (10, 10), (0, 3), (16, 500)])
def test_no_read_ahead_or_a_large_enough_buffer_does_not_warn(caplog, threads, buffer):
    with caplog.at_level(logging.WARNING, logger="grainlike"):
        ReadOptions(num_threads=threads, prefetch_buffer_size=buffer)
    assert not caplog.records
