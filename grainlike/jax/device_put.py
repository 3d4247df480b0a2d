"""``grain.experimental.device_put``: a Dataset whose elements are put on JAX devices.

Two thread stages, as in grain (so the state is the dataset's own); a numpy leaf
that does not own its memory is copied first, as in ``DeviceIterator``.
"""

from __future__ import annotations

from typing import Any

from grainlike.dataset.nodes.iter_dataset import IterDataset
from grainlike.dataset.transformations.thread_prefetch import ThreadPrefetchIterDataset

__all__ = ["device_put"]


class _PutOnDevice:
    """``jax.device_put(element, device)``, after copying leaves that alias a buffer."""

    def __init__(self, device: Any):
        self._device = device

    def __call__(self, element: Any) -> Any:
        import jax

        from grainlike.jax.device_iterator import _host_leaf

        return jax.device_put(jax.tree.map(lambda x: _host_leaf(x, None), element), self._device)

    def __repr__(self) -> str:
        return f"device_put(device={self._device})"


def device_put(
    ds: IterDataset, device: Any, *, cpu_buffer_size: int = 4, device_buffer_size: int = 2
) -> IterDataset:
    """Puts the elements of ``ds`` on ``device``, computing and transferring ahead.

    Args:
      ds: the dataset.
      device: what ``jax.device_put`` takes: a ``jax.Device``, a ``Sharding``, or
        a tree of them matching the elements.
      cpu_buffer_size: elements computed ahead on the host.
      device_buffer_size: elements put on the devices ahead of use.

    Returns:
      An IterDataset of the elements as ``jax.Array`` trees.

    Raises:
      ImportError: jax is not installed.
      ValueError: a buffer size is negative.

    Example:
      >>> import jax
      >>> from grainlike.dataset import MapDataset
      >>> ds = MapDataset.range(4).to_iter_dataset().batch(2)
      >>> [type(b).__name__ for b in device_put(ds, jax.devices()[0])]
      ['ArrayImpl', 'ArrayImpl']
    """
    ds = ThreadPrefetchIterDataset(ds, prefetch_buffer_size=cpu_buffer_size)
    import jax  # noqa: F401  (raises ImportError here, as grain, when jax is absent)

    ds = ds.map(_PutOnDevice(device))
    return ThreadPrefetchIterDataset(ds, prefetch_buffer_size=device_buffer_size)
