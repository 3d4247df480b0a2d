from grainlike.core.operations import BatchOperation, FilterOperation, MapOperation, RandomMapOperation

__all__ = ['BatchOperation', 'FilterOperation', 'MapOperation', 'RandomMapOperation']
