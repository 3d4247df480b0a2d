"""Batches onto JAX devices: ``DeviceIterator`` (read ahead by one thread), global arrays, mesh shards.

Buffer safety. On CPU, ``jax.device_put`` of a 64-byte-aligned numpy array does not
copy: the jax array aliases the numpy memory. Batches from worker processes are
views of shared memory, which the loader may hand to the next batch; an array a
user iterator yields may be a buffer it refills. So before a leaf goes to JAX it is
copied (one memcpy, ~0.3 ms per 8 MiB) unless it owns its memory
(``arr.flags.owndata``). ``copy=True`` copies every leaf, ``copy=False`` none.
jax is imported when a DeviceIterator is created or ``make_global_batch`` runs.
"""

from __future__ import annotations

import functools
from typing import Any, Iterator, Optional

import numpy as np

from grainlike.core.errors import check_int
from grainlike.core.protocols import OrbaxCheckpointable
from grainlike.core.read_ahead import ReadAhead
from grainlike.core.tree import DEVICE_KINDS

__all__ = ["DeviceIterator", "make_global_batch"]


def _host_leaf(x: Any, copy: Optional[bool]) -> Any:
    """A numpy leaf that no one else will write to, ready to hand to JAX; other leaves as they are."""
    if isinstance(x, np.generic):
        return np.asarray(x)  # a fresh 0-d array
    if isinstance(x, np.ndarray) and (copy is True or (copy is None and not x.flags.owndata)):
        return np.array(x, copy=True)
    return x


def _batch_sharding(sharding: Any) -> Any:
    """A Sharding for batches; a Mesh splits the leading axis over all its axes."""
    import jax

    if isinstance(sharding, jax.sharding.Mesh):
        return jax.sharding.NamedSharding(
            sharding, jax.sharding.PartitionSpec(tuple(sharding.axis_names))
        )
    if sharding is None or isinstance(sharding, (jax.sharding.Sharding, jax.Device)):
        return sharding
    raise TypeError(
        "sharding must be None, a jax.Device, a jax.sharding.Sharding or a "
        f"jax.sharding.Mesh, got {sharding!r}"
    )


def data_axes(mesh: Any, data_axis: Any) -> tuple:
    """``data_axis`` (a name or a sequence of names) as a tuple of ``mesh``'s axis names.

    Raises:
      TypeError: ``data_axis`` is neither a str nor a sequence of str.
      ValueError: a name that is not an axis of ``mesh``.
    """
    axes = (data_axis,) if isinstance(data_axis, str) else data_axis
    if not isinstance(axes, (tuple, list)) or not axes or not all(isinstance(a, str) for a in axes):
        raise TypeError(f"data_axis must be a mesh axis name or a sequence of them, got {data_axis!r}")
    missing = [a for a in axes if a not in mesh.axis_names]
    if missing:
        raise ValueError(
            f"data axis {missing[0]!r} is not an axis of the mesh, whose axes are "
            f"{tuple(mesh.axis_names)}"
        )
    return tuple(axes)


def process_data_shards(mesh: Any, data_axis: Any, process_index: Optional[int] = None) -> tuple:
    """The shards of the batch axis that one JAX process's devices hold.

    The batch axis of ``NamedSharding(mesh, PartitionSpec(data_axis))`` is split
    into ``count`` shards, one per index along ``data_axis`` (several axes: their
    indices flattened in the order given); devices that differ only along the
    other axes hold the same shard.

    Args:
      mesh: a ``jax.sharding.Mesh``.
      data_axis: the axis name (or names) the batch is split over.
      process_index: the process; default ``jax.process_index()``.

    Returns:
      ``(first, end, count)``: the process holds shards ``[first, end)`` of ``count``.

    Raises:
      ValueError: the process has no device in the mesh; its shards are not
        consecutive; or processes hold different numbers of shards (a batch
        could then not be split into equal per-process parts).
    """
    axes = data_axes(mesh, data_axis)
    if process_index is None:
        import jax

        process_index = jax.process_index()
    names = list(mesh.axis_names)
    order = [names.index(a) for a in axes] + [i for i, a in enumerate(names) if a not in axes]
    devices = np.transpose(np.asarray(mesh.devices), order)
    count = int(np.prod(devices.shape[: len(axes)]))
    owners = np.vectorize(lambda d: d.process_index, otypes=[np.int64])(devices).reshape(count, -1)
    held = {int(p): np.flatnonzero((owners == p).any(axis=1)) for p in np.unique(owners)}
    mine = held.get(process_index)
    if mine is None:
        raise ValueError(f"JAX process {process_index} has no device in the mesh {mesh}")
    if mine[-1] - mine[0] + 1 != len(mine):
        raise ValueError(
            f"JAX process {process_index} holds shards {mine.tolist()} of the batch axis "
            f"{axes} of the mesh, which are not consecutive; order the mesh's devices so "
            "that each process's are adjacent along the data axis"
        )
    sizes = {p: len(s) for p, s in held.items()}
    if len(set(sizes.values())) != 1:
        raise ValueError(
            f"the JAX processes hold different numbers of shards of the batch axis {axes}: "
            f"{sizes} (process: shards); each process must hold as many"
        )
    return int(mine[0]), int(mine[-1]) + 1, count


def _to_device(batch: Any, sharding: Any, copy: Optional[bool], global_batch: bool) -> Any:
    """Puts the numeric leaves of ``batch`` on devices; other leaves stay on the host."""
    import jax

    # jax.tree, not grainlike.core.tree: the batch may already hold jax.Arrays or
    # pytree nodes registered with JAX, and what comes back is JAX's to consume.
    leaves, treedef = jax.tree.flatten(batch)
    where = [i for i, x in enumerate(leaves)
             if (x.dtype.kind in DEVICE_KINDS if isinstance(x, (np.ndarray, np.generic)) else isinstance(x, jax.Array))]
    host = [_host_leaf(leaves[i], copy) for i in where]
    if global_batch:
        out = [jax.make_array_from_process_local_data(sharding, x) for x in host]
    else:
        out = jax.device_put(host, sharding)  # one call for all leaves
    for i, x in zip(where, out):
        leaves[i] = x
    return jax.tree.unflatten(treedef, leaves)


def make_global_batch(local_batch: Any, sharding: Any, *, copy: Optional[bool] = None) -> Any:
    """Assembles each process's local batch into one global ``jax.Array`` per leaf.

    Every JAX process calls this with its own batch (for example from a loader
    with ``ShardByJaxProcess``); the leading axis of the result is the
    concatenation of the local batches over the processes, in the order of the
    devices in ``sharding``. Uses ``jax.make_array_from_process_local_data``; no
    data crosses between processes. Numeric leaves become arrays, other leaves
    (strings) are returned as they are.

    Args:
      local_batch: a pytree of numpy arrays; the leading axis is this process's
        part of the batch.
      sharding: a ``jax.sharding.Sharding`` of the global batch, or a
        ``jax.sharding.Mesh``, meaning the leading axis split over all mesh axes.
      copy: as ``DeviceIterator``'s.

    Returns:
      The batch with global ``jax.Array`` leaves.

    Example:
      mesh = jax.sharding.Mesh(jax.devices(), ("data",))
      batch = make_global_batch(next(it), mesh)
      batch["x"].shape  # (local batch size * jax.process_count(), ...)
    """
    sharding = _batch_sharding(sharding)
    if sharding is None or not hasattr(sharding, "addressable_devices"):
        raise TypeError(
            "make_global_batch needs a jax.sharding.Sharding or Mesh describing the "
            f"global batch, got {sharding!r}"
        )
    return _to_device(local_batch, sharding, copy, global_batch=True)


class DeviceIterator(OrbaxCheckpointable, ReadAhead, Iterator[Any]):
    """Puts each batch on JAX devices, keeping ``prefetch`` batches ready ahead.

    Args:
      iterator: yields batches (pytrees of numpy arrays); usually
        ``iter(DataLoader)``. If it has ``get_state()/set_state()``, so does the
        DeviceIterator, and it can be checkpointed with ``PyGrainCheckpointSave``.
      sharding: where batches go: None (the default device), a ``jax.Device``, a
        ``jax.sharding.Sharding``, or a ``jax.sharding.Mesh`` (leading axis split
        over all its axes). A sharding that spans devices of other JAX processes
        makes global arrays from each process's local batch
        (``make_global_batch``).
      prefetch: batches converted ahead in a background thread; 0 converts in
        ``next()`` with no thread.
      copy: None copies leaves that do not own their memory (shared memory,
        views; see the module docstring); True copies every leaf; False none.

    Reading ahead, the state (after the last batch you received), restoring and
    closing are ``ReadAhead``'s (``grainlike.core.read_ahead``).

    Example:
      with DeviceIterator(iter(loader), prefetch=2) as it:
          for batch in it:  # jax.Arrays
              params = train_step(params, batch)
          state = it.get_state()  # after the last batch you received
    """

    def __init__(self, iterator: Iterator[Any], sharding: Any = None, *, prefetch: int = 2,
                 copy: Optional[bool] = None):
        prefetch = check_int("prefetch", prefetch)
        if copy not in (None, True, False):
            raise ValueError(f"copy must be None, True or False, got {copy!r}")
        import jax

        super().__init__(iter(iterator), prefetch, "DeviceIterator")
        self._sharding = _batch_sharding(sharding)
        global_batch = isinstance(self._sharding, jax.sharding.Sharding) and not (
            self._sharding.is_fully_addressable
        )
        self._convert = functools.partial(_to_device, sharding=self._sharding, copy=copy, global_batch=global_batch)

    def __str__(self) -> str:
        return f"DeviceIterator({self._iterator}, sharding={self._sharding}, prefetch={self._prefetch})"
