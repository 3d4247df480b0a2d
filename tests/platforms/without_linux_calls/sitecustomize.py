"""With this folder on ``PYTHONPATH``, Python runs without the Linux-only calls that macOS lacks.

Python imports ``sitecustomize`` at start-up, before any user code: this one
removes ``os.memfd_create``, ``os.fork`` and ``os.posix_fallocate``, so
grainlike takes the paths it takes where they are missing (anonymous memory
from unlinked POSIX shared-memory objects, spawned workers, no reservation of
a named segment's pages). Every process started from such a process inherits
the environment, so its worker processes run without them too. Used by
``tests/test_platforms.py`` only; see docs/platforms.md.
"""

import os

for _name in ("memfd_create", "fork", "posix_fallocate"):
    if hasattr(os, _name):
        delattr(os, _name)
del _name
