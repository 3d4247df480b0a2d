"""``grain._src.python.ipc.shared_memory_array``: grain's private path, re-exported from grainlike."""

from grainlike.core.shared_memory_array import SharedMemoryArray, SharedMemoryArrayMetadata, copy_to_shm, open_from_shm, unlink_shm

__all__ = ['SharedMemoryArray', 'SharedMemoryArrayMetadata', 'copy_to_shm', 'open_from_shm', 'unlink_shm']
