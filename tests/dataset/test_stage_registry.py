"""The base (grainlike/dataset/nodes/) builds its stages by name: every name it asks for is declared.

``MapDataset.batch``, ``IterDataset.mp_prefetch`` and the other methods of the
base ask ``stage_registry.stage_class`` for the classes defined above it;
``grainlike.dataset`` declares where each is defined.
"""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import pytest

import grainlike.dataset
from grainlike.dataset import IterDataset, MapDataset
from grainlike.dataset.nodes import stage_registry

NODES = pathlib.Path(grainlike.dataset.__file__).parent / "nodes"
ROOT = pathlib.Path(grainlike.dataset.__file__).parents[2]


def _names_the_base_asks_for() -> set[str]:
    names = set()
    for path in NODES.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "stage_class":
                assert isinstance(node.args[0], ast.Constant), f"{path.name}: stage_class of a computed name"
                names.add(node.args[0].value)
    return names


def test_every_stage_the_base_builds_is_declared_and_is_a_class_of_its_module():
    asked = _names_the_base_asks_for()
    assert {"BatchMapDataset", "SourceMapDataset", "MultiprocessPrefetchIterDataset"} <= asked
    declared = stage_registry.declared()
    assert asked == set(declared), (asked - set(declared), set(declared) - asked)
    for name, module in declared.items():
        cls = stage_registry.stage_class(name)
        assert cls.__name__ == name and cls.__module__ == module, (name, cls)
        assert issubclass(cls, (MapDataset, IterDataset)), cls


def test_an_undeclared_stage_is_a_lookup_error_naming_it():
    with pytest.raises(LookupError, match="'NoSuchMapDataset'"):
        stage_registry.stage_class("NoSuchMapDataset")


def test_the_base_finds_its_stages_in_a_fresh_process_importing_it_alone():
    # Importing a module of the base runs grainlike.dataset's __init__, which
    # declares the stages; mp_prefetch's module (the worker pool) loads only when used.
    code = (
        "import sys\n"
        "from grainlike.dataset.nodes.map_dataset import MapDataset\n"
        "ds = MapDataset.range(6).map(lambda x: x * 2).batch(4)\n"
        "print([b.tolist() for b in ds.to_iter_dataset()])\n"
        "print('grainlike.dataset.parallel.mp_prefetch' in sys.modules, 'grainlike.workers.pool' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, timeout=60, cwd=ROOT, capture_output=True, text=True
    ).stdout.split("\n")
    assert out[:2] == ["[[0, 2, 4, 6], [8, 10]]", "False False"], out
