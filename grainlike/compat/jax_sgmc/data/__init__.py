"""``jax_sgmc.data``: the feeds and loader base classes of ``data.core`` (JaxSGMC 0.1.5's names).

The loaders are in ``data.numpy_loader``, ``data.hdf5_loader`` and
``data.tensorflow_loader``, as in JaxSGMC.
"""

from grainlike.compat.jax_sgmc.data.core import *  # noqa: F401,F403
from grainlike.compat.jax_sgmc.data.core import __all__  # noqa: F401
