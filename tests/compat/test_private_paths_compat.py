"""grain's private module paths (``grain._src...``) that public projects import.

``grainlike._src`` mirrors them: each module re-exports grainlike objects with
the same meaning and defines nothing. Every name is checked against the object
grainlike documents for it and, where grain 0.2.18 has the same path, against
grain: grain's private object must be grain's public object of the same public
name, so the alias means what grain's does.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys

import pytest

import grainlike

_SRC = os.path.join(os.path.dirname(grainlike.__file__), "_src")
# Every alias module under grainlike/_src (packages hold no names).
ALIAS_MODULES = sorted(
    os.path.relpath(os.path.join(folder, name), _SRC)[:-3].replace(os.sep, ".")
    for folder, _, names in os.walk(_SRC)
    for name in names
    if name.endswith(".py") and name != "__init__.py"
)
# grain's public faces: a private object exposed there must be grainlike's
# object of the same public name.
PUBLIC = ["", "experimental", "python", "python.experimental", "sources", "transforms", "samplers", "sharding",
          "constants", "checkpoint", "multiprocessing"]
# Older grain releases' paths (code written for them imports these); gone in 0.2.18.
OLDER_GRAIN = {"core.tree", "python.checkpoint_handlers"}


def _public_names(root: str, obj) -> list[str]:
    out = []
    for face in PUBLIC:
        module = importlib.import_module(f"{root}.{face}" if face else root)
        out += [f"{face}:{n}" for n, v in vars(module).items() if v is obj and not n.startswith("_")]
    return out


def _resolve(root: str, target: str):
    module, attribute = target.split(":")
    return getattr(importlib.import_module(f"{root}.{module}" if module else root), attribute)


@pytest.mark.parametrize("private", ALIAS_MODULES)
def test_alias_module_only_re_exports_grainlike_objects(private):
    module = importlib.import_module(f"grainlike._src.{private}")
    # Only imports: no name beyond the re-exported ones and module dunders.
    assert {n for n in vars(module) if not n.startswith("__")} == set(module.__all__)
    for name in module.__all__:
        obj = getattr(module, name)
        assert getattr(obj, "__module__", "grainlike").startswith("grainlike"), (private, name)
        assert not getattr(obj, "__module__", "").startswith("grainlike._src"), (private, name)


@pytest.mark.parametrize("private", ALIAS_MODULES)
def test_alias_means_what_grains_private_name_means(grain_ref, private):
    del grain_ref  # absl flags parsed before grain is imported
    module = importlib.import_module(f"grainlike._src.{private}")
    if private in OLDER_GRAIN:
        return
    grain_module = importlib.import_module(f"grain._src.{private}")
    for name in module.__all__:
        theirs = getattr(grain_module, name)  # grain 0.2.18 has the name at that path
        ours = getattr(module, name)
        public = _public_names("grain", theirs)
        if public:
            # grain exposes it publicly: the alias is grainlike's object of that public name.
            assert any(ours is _resolve("grainlike", p) for p in public), (private, name, public)
        else:
            # grain-internal: a class of the same name, a function, or the same kind of value.
            if isinstance(theirs, type):
                assert isinstance(ours, type) and ours.__name__ == theirs.__name__, (private, name)
            elif callable(theirs):
                assert callable(ours), (private, name)
            else:
                assert type(ours).__name__ == type(theirs).__name__, (private, name)


def test_migrating_lists_every_alias_module():
    text = open(os.path.join(os.path.dirname(_SRC), "..", "docs", "migrating.md")).read()
    for private in ALIAS_MODULES:
        names = importlib.import_module(f"grainlike._src.{private}").__all__
        row = next((line for line in text.splitlines() if line.startswith(f"| `grain._src.{private}`")), None)
        assert row is not None, private
        assert all(f"`{n}`" in row for n in names), (private, [n for n in names if f"`{n}`" not in row])


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


def _plus(x, y):
    return x + y


def test_pretty_transform_names_equal_grains(grain_ref):
    import functools

    from grain._src.core import transforms as theirs

    from grainlike._src.core import transforms as ours

    class Named(ours.Map):
        def map(self, x):
            return x

        def __str__(self):
            return "Named!"

    class NamedTheirs(theirs.Map):
        def map(self, x):
            return x

        def __str__(self):
            return "Named!"

    class Plain(ours.Filter):
        def filter(self, x):
            return True

    class PlainTheirs(theirs.Filter):
        def filter(self, x):
            return True

    # grain names a transform object by its class, or by its own str(); a
    # callable by its name, the last three parts of its file and its line.
    for mine, grains in [(_plus, _plus), (lambda x: x,) * 2, (functools.partial(_plus, 1),) * 2, (list, list),
                         (Named(), NamedTheirs()), (Plain(), PlainTheirs())]:
        expected = theirs.get_pretty_transform_name(grains).replace("Theirs", "")
        assert ours.get_pretty_transform_name(mine) == expected
    assert ours.get_pretty_transform_name(_plus).startswith("_plus @ .../tests/compat/test_private_paths_compat.py:")


def test_import_grainlike_does_not_import_the_private_paths():
    code = "import sys, grainlike, grainlike.python, grainlike.experimental; " \
           "print(sorted(m for m in sys.modules if m.startswith('grainlike._src')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
