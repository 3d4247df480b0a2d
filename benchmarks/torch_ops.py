"""The benchmark pipelines as torch map-style datasets."""

import numpy as np
import torch.utils.data

from benchmarks.workloads import crop_flip, decode_resize_normalise


def identity(x):
    return x


class Small(torch.utils.data.Dataset):
    """W1: record ``i`` is ``i``, through the same identity map as the other libraries."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        # The source read and the per-record map, as grain's DataLoader does them.
        return identity(i)


class Images(torch.utils.data.Dataset):
    def __init__(self, path, seed=0):
        self.path = path
        self.seed = seed
        self._source = None

    def __len__(self):
        # Known up front: opening an ArrayRecord reader in the parent before torch
        # forks its workers makes them crash on their first read.
        from benchmarks.workloads import N_IMAGES

        return N_IMAGES

    def __getitem__(self, i):
        if self._source is None:
            from grainlike import ArrayRecordDataSource

            self._source = ArrayRecordDataSource(self.path)
        x = decode_resize_normalise(self._source[i])
        # A per-record generator, as the other libraries use.
        return crop_flip(x, np.random.default_rng([self.seed, i]))


class Big(torch.utils.data.Dataset):
    def __init__(self, source):
        self.source = source

    def __len__(self):
        return len(self.source)

    def __getitem__(self, i):
        return self.source[i]
