from grainlike.core.shared_memory_array import SharedMemoryArray, SharedMemoryArrayMetadata, copy_to_shm, open_from_shm, unlink_shm

__all__ = ['SharedMemoryArray', 'SharedMemoryArrayMetadata', 'copy_to_shm', 'open_from_shm', 'unlink_shm']
