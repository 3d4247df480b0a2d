from grainlike.jax.device_put import device_put

__all__ = ["device_put"]
