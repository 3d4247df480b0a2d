from grainlike.core.pack_and_batch import PackAndBatchOperation

__all__ = ['PackAndBatchOperation']
