"""``grain._src.python.testing.experimental``: grain's private path, re-exported from grainlike."""

from grainlike.experimental import assert_equal_output_after_checkpoint

__all__ = ['assert_equal_output_after_checkpoint']
