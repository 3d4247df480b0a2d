from grainlike.experimental import DatasetOptions, ExecutionTrackingMode
from grainlike.sources import RandomAccessDataSource
from grainlike.dataset.base import DatasetSelectionMap, IteratorContext, MultiprocessingContext
from grainlike.dataset.nodes.element_spec import ShapeDtypeStruct, ShapeDtypeStructProtocol

__all__ = ['DatasetOptions', 'DatasetSelectionMap', 'ExecutionTrackingMode', 'IteratorContext', 'MultiprocessingContext', 'RandomAccessDataSource', 'ShapeDtypeStruct', 'ShapeDtypeStructProtocol']
