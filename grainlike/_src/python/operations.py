from grainlike.core.operations import BatchOperation, FilterOperation, MapOperation, Operation, RandomMapOperation

__all__ = ['BatchOperation', 'FilterOperation', 'MapOperation', 'Operation', 'RandomMapOperation']
