"""Names of the meta features grain's index-based pipelines attach to records.

They start with ``_`` because users may read them but should not set them. The
values are grain 0.2.18's, so code that looks records up by them keeps working.
"""

# The record's position in the stream of all records (globally unique), from 0.
INDEX = "_index"

# Key of the record in its data source (in the selected dataset when mixing), from 0.
RECORD_KEY = "_record_key"

# Which dataset the record comes from; present only when mixing datasets, from 0.
DATASET_INDEX = "_dataset_index"

# The record's epoch (over its own dataset when mixing), from 1.
EPOCH = "_epoch"

# Seed for stateless random operations, unique per record and per epoch.
SEED = "_seed"

# The serialized record.
RECORD = "_record"

META_FEATURES = frozenset([INDEX, RECORD_KEY, DATASET_INDEX, EPOCH, SEED, RECORD])

__all__ = ["DATASET_INDEX", "EPOCH", "INDEX", "META_FEATURES", "RECORD", "RECORD_KEY", "SEED"]
