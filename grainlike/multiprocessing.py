"""``grain.multiprocessing``: worker options and arrays in shared memory."""

from grainlike.core.shared_memory_array import SharedMemoryArray, SharedMemoryArrayMetadata
from grainlike.dataset.nodes.options import MultiprocessingOptions

__all__ = ["MultiprocessingOptions", "SharedMemoryArray", "SharedMemoryArrayMetadata"]
