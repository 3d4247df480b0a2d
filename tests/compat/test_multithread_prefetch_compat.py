"""``multithread_prefetch`` against grain 0.2.18 with 0 to 3 threads.

The same elements in the same order (random draws per thread as per worker), the
same state before every step, restores across the two libraries and at every step.
"""

import pytest

from grainlike.dataset.conformance import assert_equal_output_after_checkpoint
from tests.compat.dataset_pairs import GRAINLIKE, check_pipeline, grain_namespace
from tests.compat.experimental_pairs import experimental
from tests.compat.test_mp_prefetch_compat import _pipeline as mp_prefetch_pipeline
from tests.helpers.leaks import no_leaks  # noqa: F401  (a fixture)


def _pipeline(lib, threads, n=17):
    # mp_prefetch's differential pipeline, without workers (a random map on the
    # iterator draws per thread as per worker; a filter makes the shares uneven).
    ds = mp_prefetch_pipeline(lib, 0, n=n)
    return experimental(lib).multithread_prefetch(ds, num_threads=threads, buffer_size=2)


@pytest.mark.parametrize("threads", [0, 1, 2, 3])
def test_multithread_prefetch_matches_reference(grain_ref, threads):
    values = check_pipeline(lambda lib: _pipeline(lib, threads), grain_namespace(grain_ref))
    assert sorted(int(x) for b in values for x, _ in zip(b[0], b[1])) == sorted(
        x * 3 for x in range(17) if (x * 3) % 4 != 1
    )


def test_multithread_prefetch_orders_as_mp_prefetch(no_leaks):
    mp = _pipeline(GRAINLIKE, 0).mp_prefetch(GRAINLIKE.MultiprocessingOptions(num_workers=2))
    threads = _pipeline(GRAINLIKE, 2)
    a, b = list(mp), list(threads)
    assert [x[0].tolist() for x in a] == [x[0].tolist() for x in b]
    assert [x[1].tolist() for x in a] == [x[1].tolist() for x in b]


def test_multithread_prefetch_restores_at_every_step(no_leaks):
    assert_equal_output_after_checkpoint(_pipeline(GRAINLIKE, 2, n=9))


def test_multithread_prefetch_keeps_the_dataset_options(grain_ref):
    for lib in (grain_namespace(grain_ref), GRAINLIKE):
        ds = lib.MapDataset.range(4000).to_iter_dataset().filter(lambda x: x < 2)
        ds = lib.WithOptionsIterDataset(ds, lib.DatasetOptions(filter_raise_threshold_ratio=0.5))
        ds = experimental(lib).multithread_prefetch(ds, num_threads=2, buffer_size=1)
        with pytest.raises(ValueError, match="filter"):
            list(ds)


def test_a_source_that_cannot_be_sliced_raises_value_error_as_reference(grain_ref):
    for lib in (grain_namespace(grain_ref), GRAINLIKE):

        class Source(lib.IterDataset):
            def __iter__(self):
                raise AssertionError("not reached")

        with pytest.raises(ValueError, match="Cannot slice"):
            experimental(lib).multithread_prefetch(Source(), num_threads=2, buffer_size=1)


def _sequential_pipeline(lib, threads, source):
    # A shuffle above the source shuffles each thread's contiguous range; a
    # random map on the iterator draws per thread. (A batch between the source
    # and to_iter_dataset() would keep the whole source's length, as in grain.)
    if source == "range":
        ds = lib.MapDataset.range(2, 41, 3)
    else:
        ds = lib.MapDataset.source([x * 3 for x in range(13)])
    ds = ds.shuffle(seed=5).map(lambda x: x + 1).to_iter_dataset()
    ds = ds.random_map(lambda x, rng: (x, int(rng.integers(0, 1 << 30))), seed=9).batch(2)
    return experimental(lib).multithread_prefetch(ds, num_threads=threads, buffer_size=2, sequential_slice=True)


@pytest.mark.parametrize("threads", [2, 3])
@pytest.mark.parametrize("source", ["range", "source"])
def test_multithread_prefetch_sequential_slice_matches_reference(grain_ref, threads, source):
    values = check_pipeline(lambda lib: _sequential_pipeline(lib, threads, source), grain_namespace(grain_ref))
    assert len(values) > threads


def test_multithread_prefetch_sequential_slice_reads_contiguous_ranges_and_leaves_the_dataset_whole():
    ds = GRAINLIKE.MapDataset.range(10).to_iter_dataset()
    threaded = experimental(GRAINLIKE).multithread_prefetch(ds, num_threads=3, buffer_size=1, sequential_slice=True)
    # Threads read [0, 4), [4, 7), [7, 10), in turn.
    assert list(threaded) == [0, 4, 7, 1, 5, 8, 2, 6, 9, 3]
    assert list(ds) == list(range(10))  # each thread sliced a copy


def test_multithread_prefetch_sequential_slice_restores_at_every_step(no_leaks):
    assert_equal_output_after_checkpoint(_sequential_pipeline(GRAINLIKE, 3, "range"))


def test_a_source_that_cannot_be_sliced_sequentially_raises_value_error_as_reference(grain_ref):
    for lib in (grain_namespace(grain_ref), GRAINLIKE):

        class Source(lib.MapDataset):
            def __len__(self):
                return 4

            def __getitem__(self, index):
                return index

        with pytest.raises(ValueError, match="Cannot slice `MapDataset` source"):
            experimental(lib).multithread_prefetch(
                Source().map(lambda x: x).to_iter_dataset(), num_threads=2, buffer_size=1, sequential_slice=True
            )
