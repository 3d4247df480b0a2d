"""``grain._src.python.experimental.device_put.device_put``: grain's private path, re-exported from grainlike."""

from grainlike.jax.device_put import device_put

__all__ = ["device_put"]
