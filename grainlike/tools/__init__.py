"""Command-line tools (also callable from Python).

* ``grainlike-convert`` (``grainlike.tools.convert``): writes ArrayRecord files in
  the record format of ``grainlike.formats`` from a folder of images (one
  sub-folder per class), ``.npy`` / ``.npz`` arrays, a TFDS split, or any
  grainlike source.
* ``grainlike-inspect`` (``grainlike.tools.inspect``): explains a checkpoint
  state file in words (sampler, source, each worker's position, epoch), or
  summarises an ArrayRecord file (record count, a decoded record).

Both run as ``python -m grainlike.tools.convert ...`` too. Importing this
package imports nothing beyond the standard library.
"""
