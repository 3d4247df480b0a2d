"""The benchmark transforms as grain transform classes (importable by workers)."""

import absl.flags

absl.flags.FLAGS.mark_as_parsed()
import grain.python as lib  # noqa: E402

from benchmarks.workloads import crop_flip, decode_resize_normalise


class Identity(lib.MapTransform):
    def map(self, x):
        return x


class DecodeResize(lib.MapTransform):
    def map(self, x):
        return decode_resize_normalise(x)


class CropFlip(lib.RandomMapTransform):
    def random_map(self, x, rng):
        return crop_flip(x, rng)
