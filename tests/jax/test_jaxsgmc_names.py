"""docs/jax_loops.md maps every public name of JaxSGMC 0.1.5's data and io modules.

The names are JaxSGMC 0.1.5's classes and functions (jax_sgmc/data/core.py,
numpy_loader.py, hdf5_loader.py, tensorflow_loader.py, io.py), listed here
because JaxSGMC is not a test dependency. The grainlike names the table gives
must exist.
"""

import importlib
import os

import grainlike as grain

JAXSGMC_0_1_5 = {
    "data": ["DataLoader", "DeviceDataLoader", "HostDataLoader", "MiniBatchInformation", "CacheState",
             "GetBatchFunction", "MaskedMappedFunction", "UnmaskedMappedFunction", "FullDataMapFunction",
             "FullDataMapperFunction", "random_reference_data", "full_reference_data", "full_data_mapper",
             "tree_dtype_struct", "tree_index"],
    "data.numpy_loader": ["NumpyBase", "DeviceNumpyDataLoader", "NumpyDataLoader"],
    "data.hdf5_loader": ["HDF5Loader"],
    "data.tensorflow_loader": ["TensorflowDataLoader"],
    "io": ["register_dictionize_rule", "pytree_to_dict", "pytree_dict_keys", "dict_to_pytree", "DataCollector",
           "JSONCollector", "HDF5Collector", "MemoryCollector", "load", "save", "no_save", "saving_state", "Saving",
           "PyTree"],
}
DOC = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "jax_loops.md")


def _table() -> str:
    text = open(DOC).read()
    start = text.index("## JaxSGMC: every public name")
    return text[start : text.index("\n## ", start + 1)]


def test_every_jaxsgmc_name_has_a_row():
    table = _table()
    for module, names in JAXSGMC_0_1_5.items():
        for name in names:
            short = module.split(".")[-1] if module != "data" else "data"
            assert f"`{short}.{name}" in table or f"`{module}.{name}" in table, f"{module}.{name}"


def test_the_grainlike_names_the_table_gives_exist():
    for name in ["reference_data", "full_reference_data", "full_data_mapper", "element_spec", "zeros_batch",
                 "DataLoader", "DeviceIterator", "ArraysSource"]:
        assert hasattr(grain, name), name
    for name in ["save", "load", "no_save", "DataCollector", "MemoryCollector", "HDF5Collector",
                 "register_dictionize_rule", "pytree_to_dict", "pytree_dict_keys", "dict_to_pytree", "SavingState"]:
        assert hasattr(grain.io, name), name
    # The table names where JaxSGMC's state and batch-information types live.
    assert hasattr(importlib.import_module("grainlike.jax.jit_batches"), "MiniBatchInformation")
    assert hasattr(importlib.import_module("grainlike.jax.reference_data"), "CacheState")
    table = _table()
    assert "`grainlike.jax.jit_batches.MiniBatchInformation`" in table
    assert "`grainlike.jax.reference_data.CacheState`" in table
