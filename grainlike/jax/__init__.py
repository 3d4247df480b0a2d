"""Feeding JAX: batches onto devices, batches and saving inside ``jax.jit``.

One module per role; each imports jax where it is used, never at import:

- ``device_iterator``: ``DeviceIterator`` (batches put on devices a few ahead by
  one read-ahead thread), ``make_global_batch`` and the mesh's data shards.
- ``device_put``: grain's ``experimental.device_put`` Dataset stage.
- ``batch_specs``: ``element_spec`` and ``zeros_batch`` of a loader.
- ``host_callbacks``: the ordered host callbacks every in-jit feed goes through,
  which never raise inside jitted code, and ``host_errors``.
- ``jit_batches``: what the in-jit feeds share (batch checks, masks,
  ``MiniBatchInformation``, ``ArraysSource``).
- ``in_jit_iterator``: ``InJitIterator``, a loader's batches inside jit.
- ``reference_data``: JaxSGMC's chains of batches (``reference_data``).
- ``full_data``: every record once inside jit (``full_reference_data``).
- ``in_jit_saving``: saving samples from jit, resumable runs (``grainlike.io``).
- ``sample_collectors``: where saved samples go on the host (memory, HDF5);
- ``pytree_dicts``: pytrees as nested dicts with JaxSGMC's keys, and back.
- ``evaluation``: ``evaluate``, a metric over a whole split.

The public names are on ``grainlike`` itself (``grainlike.DeviceIterator``, ...).
"""
