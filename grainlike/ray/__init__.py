"""Workers on a Ray cluster: ``mp_prefetch``'s worker slices as Ray actors.

For hosts whose cores cannot feed their accelerators: CPU machines join a Ray
cluster and compute the pipeline's workers there, with what a pipeline
promises on one host: the same elements in the same order, the same state
(a state saved here restores in ``mp_prefetch`` and back, also onto another
number of workers), every element once after a worker's actor or node dies.

* ``prefetch(dataset, num_workers, address=...)``: ``dataset.mp_prefetch(...)``
  on Ray (the Dataset API).
* ``data_loader_iter(loader, address=...)``: ``iter(loader)`` with the
  DataLoader's workers on Ray.
* ``init_local(**ray_init_kwargs)``: a local Ray instance bound to 127.0.0.1,
  without a dashboard (what ``prefetch`` starts when no cluster is given).

``ray`` is imported when workers start, not by ``import grainlike.ray``.
See docs/ray.md.
"""

from grainlike.ray.loader import data_loader_iter
from grainlike.ray.local import init_local
from grainlike.ray.options import RayOptions
from grainlike.ray.prefetch import RayPrefetchDatasetIterator, RayPrefetchIterDataset, prefetch

__all__ = [
    "RayOptions",
    "RayPrefetchDatasetIterator",
    "RayPrefetchIterDataset",
    "data_loader_iter",
    "init_local",
    "prefetch",
]
