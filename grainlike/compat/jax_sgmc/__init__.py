"""JaxSGMC 0.1.5's ``data``, ``io`` and ``scheduler`` names over grainlike's JAX features.

Code written for JaxSGMC's data access and saving runs with its imports changed
from ``jax_sgmc`` to ``grainlike.compat.jax_sgmc``::

    from grainlike.compat.jax_sgmc import data, io, scheduler
    from grainlike.compat.jax_sgmc.data.numpy_loader import NumpyDataLoader

The loaders draw the same batches as JaxSGMC's (the same numpy random streams);
the batches reach jitted code through grainlike's ``reference_data`` chains and
samples leave it through ``grainlike.io.save`` (``grainlike.jax``). The
differences from JaxSGMC are listed in docs/jax_loops.md. Importing this package
imports nothing; its modules import jax.
"""

__version__ = "0.1.5"  # the JaxSGMC release whose API this package has
