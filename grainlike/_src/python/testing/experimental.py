from grainlike.experimental import assert_equal_output_after_checkpoint

__all__ = ['assert_equal_output_after_checkpoint']
