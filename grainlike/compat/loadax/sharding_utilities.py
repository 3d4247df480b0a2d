"""``loadax.sharding_utilities``: meshes for FSDP and DDP training."""

from __future__ import annotations

from typing import TYPE_CHECKING, Tuple

if TYPE_CHECKING:
    from jax.sharding import Mesh

ShardingPreset = Tuple["Mesh", Tuple[str, ...]]


def fsdp_sharding() -> ShardingPreset:
    """A mesh with the JAX processes along ``"data"`` and each one's devices along ``"model"``.

    Returns:
      ``(mesh, ("data", "model"))``: shape ``(process_count, devices // process_count)``.

    Raises:
      AssertionError: the device count is not a multiple of the process count.
    """
    import jax
    import numpy as np
    from jax.sharding import Mesh

    devices = jax.devices()
    num_data_shards = jax.process_count()
    if len(devices) % num_data_shards:
        raise AssertionError("Number of devices must be divisible by number of data shards")
    axis_names = ("data", "model")
    return Mesh(np.array(devices).reshape(num_data_shards, len(devices) // num_data_shards), axis_names), axis_names


def ddp_sharding() -> ShardingPreset:
    """A mesh with every device along ``"data"``: parameters replicated, batches split.

    Loadax 0.2.1 reshapes the devices to ``(process_count,)``, which fails with
    more than one device per process; where it works (one device per process)
    the mesh is the same as this one.

    Returns:
      ``(mesh, ("data",))``.

    Raises:
      AssertionError: the device count is not a multiple of the process count.
    """
    import jax
    import numpy as np
    from jax.sharding import Mesh

    devices = jax.devices()
    if len(devices) % jax.process_count():
        raise AssertionError("Number of devices must be divisible by number of data shards")
    axis_names = ("data",)
    return Mesh(np.array(devices), axis_names), axis_names
