"""A DataLoader's workers on Ray: ``data_loader_iter(loader)``.

The DataLoader is a pipeline of Dataset stages with ``mp_prefetch`` for its
workers (``grainlike.loader.pipeline``); here that stage is computed by Ray
actors instead (``prefetch.on_ray``), the rest of the loader as it is: the same
batches, in the same order, and grain's legacy JSON state, which restores in a
loader on this host's worker processes and back.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

from grainlike.dataset.nodes.iter_dataset import IterDataset
from grainlike.loader.data_loader import DataLoader, DataLoaderIterator
from grainlike.ray.options import RayOptions
from grainlike.ray.prefetch import on_ray


class _RayDataLoader(DataLoader):
    """A view of a DataLoader whose pipelines run their workers on Ray (built by ``data_loader_iter``)."""

    def __init__(self, loader: DataLoader, ray_options: RayOptions):  # noqa: D107 - no DataLoader.__init__: a view
        self.__dict__.update(loader.__dict__)
        self._ray_options = ray_options
        self._dataset = self._loader_dataset(self._records)

    def _loader_dataset(self, records: Any) -> IterDataset:
        # Also for a restore onto other versions of remote objects (DataLoader._reading).
        return on_ray(super()._loader_dataset(records), self._ray_options)


def data_loader_iter(
    loader: DataLoader,
    *,
    address: Optional[str] = None,
    actor_options: Optional[Mapping[str, Any]] = None,
    elements_per_call: int = RayOptions.elements_per_call,
    bytes_per_call: int = RayOptions.bytes_per_call,
    seconds_per_call: float = RayOptions.seconds_per_call,
    calls_in_flight: int = RayOptions.calls_in_flight,
) -> DataLoaderIterator:
    """``iter(loader)`` with the loader's ``worker_count`` workers as Ray actors.

    The same batches in the same order as ``iter(loader)``, and the same
    ``get_state()`` (grain's JSON bytes): a state saved by either restores in
    the other. Each epoch, call it again (as ``iter(loader)``).

    Args:
      loader: a DataLoader with ``worker_count > 0`` (its workers' number; each
        worker is an actor).
      address, actor_options, elements_per_call, bytes_per_call,
        seconds_per_call, calls_in_flight: as ``grainlike.ray.prefetch``'s.

    Returns:
      A ``DataLoaderIterator``; ``close()`` (or dropping it) kills its actors.

    Raises:
      ValueError: the loader has no workers (``worker_count=0``).
    """
    if not isinstance(loader, DataLoader):
        raise TypeError(f"data_loader_iter takes a grainlike DataLoader, got {type(loader).__name__}")
    if loader.worker_count < 1:
        raise ValueError(
            "data_loader_iter runs a DataLoader's workers on Ray; this loader has worker_count=0. "
            "Build it with worker_count=n (n actors; the batches and state are those of n worker processes)"
        )
    ray_options = RayOptions(
        address=address,
        actor_options=dict(actor_options or {}),
        elements_per_call=elements_per_call,
        bytes_per_call=bytes_per_call,
        seconds_per_call=seconds_per_call,
        calls_in_flight=calls_in_flight,
    )
    return iter(_RayDataLoader(loader, ray_options))
