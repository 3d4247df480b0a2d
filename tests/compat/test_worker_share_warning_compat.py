"""Fewer records than ``workers x batch``: grain's partial batches, and a warning naming the fix.

Each worker batches only its own share of the records (in both libraries), so a
worker whose share is below one batch delivers a partial batch where a process
without workers would fill it. grainlike delivers what grain does and says so.
"""

from __future__ import annotations

import warnings

import pytest

import grainlike
from grainlike.core.errors import WorkersDropRemaindersWarning

from tests.compat.dataset_pairs import grain_namespace

pytestmark = pytest.mark.timeout(300)


def _loader(lib, records, workers, batch_size, drop_remainder=False):
    return lib.DataLoader(
        data_source=lib.RangeDataSource(0, records, 1),
        sampler=lib.IndexSampler(records, lib.NoSharding(), shuffle=False, num_epochs=1, seed=0),
        operations=[lib.Batch(batch_size, drop_remainder=drop_remainder)],
        worker_count=workers,
    )


@pytest.mark.parametrize("drop_remainder", [False, True])
def test_data_loader_worker_shares_below_a_batch_warn_and_deliver_as_grain(grain_ref, drop_remainder):
    expected = [b.tolist() for b in _loader(grain_ref, 3, 8, 2, drop_remainder)]
    with pytest.warns(WorkersDropRemaindersWarning, match=r"worker_count=8\) reads 3 records.*Use worker_count=1 or 0"):
        loader = _loader(grainlike, 3, 8, 2, drop_remainder)
    assert [b.tolist() for b in loader] == expected
    assert expected == ([] if drop_remainder else [[0], [1], [2]])


def test_data_loader_full_worker_shares_do_not_warn(grain_ref):
    expected = [b.tolist() for b in _loader(grain_ref, 40, 2, 4)]
    with warnings.catch_warnings():
        warnings.simplefilter("error", WorkersDropRemaindersWarning)
        loader = _loader(grainlike, 40, 2, 4)
        assert [b.tolist() for b in loader] == expected


def _dataset(lib, n, workers, batch_size):
    ds = lib.MapDataset.range(n).to_iter_dataset().batch(batch_size)
    return ds.mp_prefetch(lib.MultiprocessingOptions(num_workers=workers))


def test_mp_prefetch_worker_shares_below_a_batch_warn_and_deliver_as_grain(grain_ref):
    expected = [b.tolist() for b in _dataset(grain_namespace(grain_ref), 3, 4, 2)]
    with pytest.warns(WorkersDropRemaindersWarning, match=r"num_workers=4\) splits 3 elements.*num_workers=1 or 0"):
        ds = _dataset(grainlike, 3, 4, 2)
    assert [b.tolist() for b in ds] == expected


def test_mp_prefetch_full_worker_shares_do_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error", WorkersDropRemaindersWarning)
        ds = _dataset(grainlike, 16, 2, 4)
        assert sorted(x for b in ds for x in b.tolist()) == list(range(16))
