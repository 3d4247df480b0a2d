from grainlike.dataset.stats import (
    IPL_CAT_ENQUEUE,
    IPL_CAT_PREFETCH,
    IPL_CAT_PREPROCESSING,
    IPL_CAT_READ,
    IPL_CAT_UNKNOWN,
    HashableWeakRef,
    NodeType,
    Stats,
    StatsConfig,
    Timer,
    make_stats,
    record_next_duration_if_output,
    trace_input_pipeline,
    trace_input_pipeline_next,
    trace_input_pipeline_prefetch,
)

__all__ = ['HashableWeakRef', 'IPL_CAT_ENQUEUE', 'IPL_CAT_PREFETCH', 'IPL_CAT_PREPROCESSING', 'IPL_CAT_READ',
           'IPL_CAT_UNKNOWN', 'NodeType', 'Stats', 'StatsConfig', 'Timer', 'make_stats',
           'record_next_duration_if_output', 'trace_input_pipeline', 'trace_input_pipeline_next',
           'trace_input_pipeline_prefetch']
