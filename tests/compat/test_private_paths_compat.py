"""grain's private module paths (``grain._src...``) that public projects import.

``grainlike._src`` mirrors them: each module re-exports grainlike objects with
the same meaning and defines nothing. Every name is checked against the object
grainlike documents for it and, where grain 0.2.18 has the same path, against
grain: grain's private object must be grain's public object of the same public
name, so the alias means what grain's does.
"""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

# grain._src.<module> -> {name: "<public module under grain/grainlike>:<attribute>"}.
# A target without a grain counterpart (grain has it only privately, or not at
# all in 0.2.18) starts with "grainlike." and is checked in grainlike only.
ALIASES = {
    "python.dataset.dataset": {
        "MapDataset": ":MapDataset",
        "IterDataset": ":IterDataset",
        "DatasetIterator": ":DatasetIterator",
        "apply_transformations": "experimental:apply_transformations",
        "WithOptionsIterDataset": "experimental:WithOptionsIterDataset",
    },
    "python.dataset.base": {
        "DatasetOptions": "experimental:DatasetOptions",
        "ExecutionTrackingMode": "experimental:ExecutionTrackingMode",
        "RandomAccessDataSource": "sources:RandomAccessDataSource",
    },
    "python.dataset.transformations.zip": {
        "ZipIterDataset": "experimental:ZipIterDataset",
        "ZipMapDataset": "experimental:ZipMapDataset",
    },
    "python.dataset.transformations.flatmap": {
        "FlatMapIterDataset": "experimental:FlatMapIterDataset",
        "FlatMapMapDataset": "experimental:FlatMapMapDataset",
    },
    "python.dataset.transformations.interleave": {"InterleaveIterDataset": "experimental:InterleaveIterDataset"},
    "python.dataset.transformations.limit": {"LimitIterDataset": "experimental:LimitIterDataset"},
    "python.dataset.transformations.map": {"RngPool": "experimental:RngPool"},
    "python.dataset.transformations.packing": {"FirstFitPackIterDataset": "experimental:FirstFitPackIterDataset"},
    "python.dataset.transformations.packing_concat_then_split": {
        "BOSHandling": "experimental:BOSHandling",
        "ConcatThenSplitIterDataset": "experimental:ConcatThenSplitIterDataset",
    },
    "python.dataset.transformations.prefetch": {"ThreadPrefetchIterDataset": "experimental:ThreadPrefetchIterDataset"},
    "python.dataset.transformations.shuffle": {
        "WindowShuffleIterDataset": "experimental:WindowShuffleIterDataset",
        "WindowShuffleMapDataset": "experimental:WindowShuffleMapDataset",
    },
    "python.dataset.sources.parquet_dataset": {"ParquetIterDataset": "experimental:ParquetIterDataset"},
    "python.dataset.sources.tfrecord_dataset": {
        "TFRecordIterDataset": "experimental:TFRecordIterDataset",
        "_TFRecordDatasetIterator": "grainlike.dataset.tfrecord:_TFRecordDatasetIterator",
        "_TFRecordReader": "grainlike.dataset.tfrecord:_TFRecordReader",
    },
    "python.dataset.elastic_iterator": {"ElasticIterator": "experimental:ElasticIterator"},
    "core.sharding": {
        "NoSharding": "sharding:NoSharding",
        "ShardByJaxProcess": "sharding:ShardByJaxProcess",
        "ShardOptions": "sharding:ShardOptions",
    },
    "core.transforms": {
        "Batch": "transforms:Batch",
        "Filter": "transforms:Filter",
        "Map": "transforms:Map",
        "MapWithIndex": "transforms:MapWithIndex",
        "RandomMap": "transforms:RandomMap",
    },
    "core.constants": {
        name: f"constants:{name}" for name in ["DATASET_INDEX", "EPOCH", "INDEX", "RECORD", "RECORD_KEY", "SEED"]
    },
    # grain 0.2.18 calls it tree_lib; older releases (and code written for them) tree.
    "core.tree": {name: f"grainlike.core.tree:{name}" for name in ["flatten", "map_structure", "spec_like", "unflatten_as"]},
    "core.tree_lib": {
        name: f"grainlike.core.tree:{name}" for name in ["flatten", "map_structure", "spec_like", "unflatten_as"]
    },
    "python.options": {"MultiprocessingOptions": ":MultiprocessingOptions", "ReadOptions": ":ReadOptions"},
    "python.data_sources": {
        "ArrayRecordDataSource": "sources:ArrayRecordDataSource",
        "RangeDataSource": "sources:RangeDataSource",
        "SharedMemoryDataSource": "sources:SharedMemoryDataSource",
    },
    "python.samplers": {
        "IndexSampler": "samplers:IndexSampler",
        "Sampler": "samplers:Sampler",
        "SequentialSampler": "samplers:SequentialSampler",
    },
    "python.data_loader": {"DataLoader": ":DataLoader", "DataLoaderIterator": ":DataLoaderIterator"},
    "python.load": {"load": ":load"},
    "python.record": {"Record": ":Record", "RecordMetadata": ":RecordMetadata"},
    "python.testing.experimental": {
        "assert_equal_output_after_checkpoint": "experimental:assert_equal_output_after_checkpoint"
    },
    "python.experimental.index_shuffle.python.index_shuffle_module": {"index_shuffle": "experimental:index_shuffle"},
    "python.checkpoint.handler": {
        "CheckpointHandler": "checkpoint:CheckpointHandler",
        "CheckpointRestore": "checkpoint:CheckpointRestore",
        "CheckpointSave": "checkpoint:CheckpointSave",
    },
    # Older grain releases' module (MaxText-era code imports it); gone in 0.2.18.
    "python.checkpoint_handlers": {
        "PyGrainCheckpointHandler": "grainlike.checkpoint:PyGrainCheckpointHandler",
        "PyGrainCheckpointRestore": "grainlike.checkpoint:PyGrainCheckpointRestore",
        "PyGrainCheckpointSave": "grainlike.checkpoint:PyGrainCheckpointSave",
    },
}


def _resolve(root: str, target: str):
    module, attribute = target.split(":")
    if not module.startswith("grainlike."):
        module = f"{root}.{module}" if module else root
    return getattr(importlib.import_module(module), attribute)


@pytest.mark.parametrize("private", sorted(ALIASES))
def test_alias_module_re_exports_the_documented_grainlike_objects(private):
    module = importlib.import_module(f"grainlike._src.{private}")
    assert sorted(module.__all__) == sorted(ALIASES[private])
    # Only imports: no name beyond the re-exported ones and module dunders.
    assert {n for n in vars(module) if not n.startswith("__")} == set(ALIASES[private])
    for name, target in ALIASES[private].items():
        assert getattr(module, name) is _resolve("grainlike", target), (private, name)


@pytest.mark.parametrize("private", sorted(ALIASES))
def test_alias_means_what_grains_private_name_means(grain_ref, private):
    del grain_ref  # absl flags parsed before grain is imported
    differential = {n: t for n, t in ALIASES[private].items() if not t.startswith("grainlike.")}
    if not differential:
        # grain 0.2.18 has no such path (or only private objects there); the
        # grainlike objects are checked by the test above.
        assert private in {"core.tree", "core.tree_lib", "python.checkpoint_handlers"}
        return
    grain_module = importlib.import_module(f"grain._src.{private}")
    for name, target in differential.items():
        assert getattr(grain_module, name) is _resolve("grain", target), (private, name)


def test_tree_aliases_behave_as_grains_tree_lib(grain_ref):
    del grain_ref
    import numpy as np
    from grain._src.core import tree_lib

    from grainlike._src.core import tree

    x = {"a": np.zeros((2, 3)), "b": (1, [2.0, np.ones(2)])}
    assert tree.spec_like(x) == tree_lib.spec_like(x)
    assert tree.unflatten_as(x, [1, 2, 3, 4]) == tree_lib.unflatten_as(x, [1, 2, 3, 4])
    assert [type(v) for v in tree.flatten(x)] == [type(v) for v in tree_lib.flatten(x)]
    assert tree.map_structure(np.shape, x) == tree_lib.map_structure(np.shape, x)


def test_import_grainlike_does_not_import_the_private_paths():
    code = "import sys, grainlike, grainlike.python, grainlike.experimental; " \
           "print(sorted(m for m in sys.modules if m.startswith('grainlike._src')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
