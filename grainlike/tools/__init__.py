"""Command-line tools (also callable from Python).

* ``grainlike-convert`` (``grainlike.tools.convert``): writes ArrayRecord files in
  the record format of ``grainlike.formats`` from a folder of images (one
  sub-folder per class), ``.npy`` / ``.npz`` arrays, a TFDS split, or any
  grainlike source.
* ``grainlike-inspect`` (``grainlike.tools.inspect_cli``): explains a checkpoint
  state file in words (sampler, source, each worker's position, epoch), or
  summarises an ArrayRecord file (record count, a decoded record).

Both run as ``python -m grainlike.tools.convert ...`` and ``python -m
grainlike.tools.inspect_cli ...`` too. Importing this package imports nothing
beyond the standard library.

No module here is named ``inspect``: a file of that name would shadow the
standard library's for any script run from this folder. The old name
``grainlike.tools.inspect`` stays an attribute of this package.
"""

from grainlike.core.lazy import attach as _attach

# The module's name before it became inspect_cli.
__getattr__, __dir__ = _attach(globals(), {"inspect": "grainlike.tools.inspect_cli"})
