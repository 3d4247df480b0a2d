"""Feeding JAX: batches onto devices, batches and saving inside ``jax.jit`` (docs/architecture.md).

One module per role; each imports jax where it is used, never at import. The
public names are on ``grainlike`` itself (``grainlike.DeviceIterator``, ...).
"""
