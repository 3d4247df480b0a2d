"""grain's private module paths (``grain._src...``) that public projects import.

``grainlike._src`` mirrors them: each module re-exports grainlike objects with
the same meaning and defines nothing. Every name is checked against the object
grainlike documents for it and, where grain 0.2.18 has the same path, against
grain: grain's private object must be grain's public object of the same public
name, so the alias means what grain's does. Every module of grain's wheel has
its grainlike module, or is in ``NO_ALIAS`` (and docs/migrating.md) with the
reason grainlike has none.
"""

from __future__ import annotations

import __future__

import importlib
import importlib.util
import inspect
import os
import subprocess
import sys
import types

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


def _grain_wheel_modules() -> list[str]:
    """Every module of grain's wheel but its tests: ``grain``, ``grain._src.core.config``, ..."""
    spec = importlib.util.find_spec("grain")  # finds the installed package without importing it
    if spec is None or not spec.submodule_search_locations:
        return []
    root = spec.submodule_search_locations[0]
    out = []
    for folder, _, names in os.walk(root):
        for name in names:
            if name.endswith(".py") and not name.endswith("_test.py"):
                parts = os.path.relpath(os.path.join(folder, name), root)[:-3].split(os.sep)
                out.append(".".join(["grain", *parts[: -1 if parts[-1] == "__init__" else None]]))
    return sorted(out)


GRAIN_MODULES = _grain_wheel_modules()
# grain's public faces: a private object exposed there must be grainlike's
# object of the same public name.
PUBLIC = ["", "experimental", "python", "python.experimental", "sources", "transforms", "samplers", "sharding",
          "constants", "checkpoint", "multiprocessing"]
# Older grain releases' paths (code written for them imports these); gone in 0.2.18.
OLDER_GRAIN = {"core.tree", "python.checkpoint_handlers"}
# grain's main branch's paths (code written for newer releases imports these); not in 0.2.18.
NEWER_GRAIN = {"python.checkpoint.elastic_checkpoint"}
# Names grain's main branch adds to a module 0.2.18 has.
NEWER_NAMES = {"python.dataset.transformations.slice": {"ReindexMapDataset"}}

# grain 0.2.18's modules that grainlike has no module for, each with the reason.
# docs/migrating.md lists the same ones ("grain modules grainlike has no path for").
NO_ALIAS = {
    # Execution summaries: helpers over grain's protobufs, which grainlike builds its own way.
    "grain._src.python.dataset.stats_utils": "helpers over grain's execution-summary protobufs (merging workers' summaries, estimating sizes); grainlike builds its summaries in grainlike.dataset.execution_stats and formats them in grainlike.dataset.summary_table",
    # Internals of grain's own machinery, which grainlike does differently.
    "grain._src.core.exceptions": "PyGrainInternalError, which grain raises on an inconsistency of its own (mix, packing); grainlike never raises it",
    "grain._src.core.grain_random": "JAX PRNG-key helpers (as_rng_key, make_rng_key) that nothing in grain 0.2.18 uses; grainlike's random transforms take numpy Generators",
    "grain._src.core.parallel": "a thread-pool helper (run_in_parallel) that nothing else in grain 0.2.18 uses",
    "grain._src.core.profiler": "grain's hooks into JAX's profiler (trace annotations, profiler servers in workers); grainlike adds no profiler annotations",
    "grain._src.core.traceback_util": "grain's traceback filtering (py_traceback_filtering); grainlike does not filter tracebacks",
    "grain._src.core.version": "grain's own version number (`grain.__version__`); grainlike's is `grainlike.__version__`",
    "grain._src.python.checkpoint.base": "grain's background save and load of one state file per process (orbax's PathAwaitingCreation); grainlike's iterators save and load through grainlike.core.state_files",
    "grain._src.python.grain_logging": "sets a process prefix on absl's log handler; grainlike logs through the standard logging module and needs no absl",
    "grain._src.python.ipc.queue": "grain's multiprocessing-queue helpers; grainlike's workers use their own protocol over sockets and shared memory",
    "grain._src.python.ipc.variable_size_queue": "grain's resizable queues for its worker pool; grainlike's workers use their own protocol",
    "grain._src.python.dataset.transformations.autotune": "a placeholder in grain 0.2.18: autotune() raises NotImplementedError",
    # grain's test infrastructure, shipped in its wheel beside its tests.
    "grain._src.core.pytest": "grain's test infrastructure (whether its tests run under pytest)",
    "grain._src.python.dataset.transformations.testing_util": "grain's test infrastructure (base test cases of its packing tests)",
}


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
    # Only imports: no name beyond the re-exported ones and module dunders, and the
    # ``__future__`` feature ``annotations`` where grain's module has it too (its
    # ``from __future__ import annotations`` binds it: ``grain.monitoring.annotations``).
    names = {n for n in vars(module) if not n.startswith("__")}
    if vars(module).get("annotations") is __future__.annotations:
        names.discard("annotations")
    assert names == set(module.__all__)
    for name in module.__all__:
        obj = getattr(module, name)
        if isinstance(obj, types.ModuleType):
            assert obj.__name__.startswith("grainlike.") and not obj.__name__.startswith("grainlike._src"), name
        elif inspect.isclass(obj) or inspect.isroutine(obj):
            assert obj.__module__.startswith("grainlike"), (private, name)
            assert not obj.__module__.startswith("grainlike._src"), (private, name)


@pytest.mark.parametrize("private", ALIAS_MODULES)
def test_alias_means_what_grains_private_name_means(grain_ref, private):
    del grain_ref  # absl flags parsed before grain is imported
    module = importlib.import_module(f"grainlike._src.{private}")
    if private in OLDER_GRAIN | NEWER_GRAIN:
        return
    grain_module = importlib.import_module(f"grain._src.{private}")
    for name in set(module.__all__) - NEWER_NAMES.get(private, set()):
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


def _has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # a package above it is missing
        return False


def test_grains_wheel_is_the_one_counted():
    # 0.2.18's wheel: 74 modules besides its tests (docs/migrating.md counts them).
    assert len(GRAIN_MODULES) == 74, GRAIN_MODULES


@pytest.mark.parametrize("grain_module", GRAIN_MODULES)
def test_every_grain_module_has_its_grainlike_module_or_a_reason(grain_module):
    ours = "grainlike" + grain_module[len("grain"):]
    if grain_module in NO_ALIAS:
        assert not _has_module(ours), f"{ours} exists now: take {grain_module} out of NO_ALIAS"
        return
    module = importlib.import_module(ours)
    if grain_module.startswith("grain._src"):
        assert module.__file__.startswith(_SRC + os.sep), module.__file__


def test_no_alias_names_grain_modules_only():
    assert set(NO_ALIAS) <= set(GRAIN_MODULES), set(NO_ALIAS) - set(GRAIN_MODULES)


def _migrating() -> str:
    return open(os.path.join(os.path.dirname(_SRC), "..", "docs", "migrating.md")).read()


def test_migrating_lists_every_module_without_an_alias_with_its_reason():
    section = _migrating().split("## grain modules grainlike has no path for", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 2 and cells[0].startswith("`grain"):
            rows[cells[0].strip("`")] = cells[1]
    assert rows == NO_ALIAS


def test_migrating_counts_grains_modules_and_their_aliases():
    text = " ".join(_migrating().split())
    aliased = len(GRAIN_MODULES) - len(NO_ALIAS)
    assert f"{len(GRAIN_MODULES)} modules besides its tests" in text
    assert f"{aliased} have grainlike's module of the same path" in text
    assert f"the other {len(NO_ALIAS)} are listed" in text


@pytest.mark.parametrize("private", ALIAS_MODULES)
def test_alias_has_every_public_object_grain_has_at_that_path(grain_ref, private):
    # A name of grain's module whose object grain also exposes publicly (its
    # own class, or one it imports, as batch.tree_lib or process_prefetch.config)
    # is at the alias too: grainlike has every public object (test_namespaces).
    del grain_ref
    if private in OLDER_GRAIN | NEWER_GRAIN:
        return
    public = set()
    for face in PUBLIC:
        module = importlib.import_module(f"grain.{face}" if face else "grain")
        public |= {id(v) for n, v in vars(module).items() if not n.startswith("_")}
    theirs = importlib.import_module(f"grain._src.{private}")
    expected = {
        n for n, v in vars(theirs).items()
        if not n.startswith("_") and id(v) in public and not isinstance(v, (types.ModuleType, str, int))
    }
    ours = importlib.import_module(f"grainlike._src.{private}")
    assert expected <= set(ours.__all__), expected - set(ours.__all__)


def test_determine_worker_count_is_grains(grain_ref, monkeypatch):
    # axlearn sizes its prefetch pool with it: _determine_worker_count(input_worker_count=None).
    del grain_ref
    from grain._src.python.data_loader import _determine_worker_count as theirs

    from grainlike._src.python.data_loader import _determine_worker_count as ours

    assert ours(input_worker_count=None) == theirs(input_worker_count=None) == os.cpu_count()
    for value in (0, 1, 7, 2.9, "3", True, -1):
        assert (ours(value), type(ours(value))) == (theirs(value), type(theirs(value))), value
    for value in ("x", "2.5", [1], object()):
        with pytest.raises(Exception) as expected:
            theirs(value)
        with pytest.raises(type(expected.value)) as got:
            ours(value)
        assert str(got.value) == str(expected.value)
    monkeypatch.setattr(os, "cpu_count", lambda: None)
    with pytest.raises(ValueError) as expected:
        theirs(None)
    with pytest.raises(ValueError, match=expected.value.args[0].replace(".", r"\.")):
        ours(None)


def test_the_data_loader_still_checks_its_worker_count():
    import grainlike

    source = grainlike.RangeDataSource(0, 4, 1)
    sampler = grainlike.SequentialSampler(4, grainlike.NoSharding())
    for bad, error in ((-1, ValueError), (1.5, TypeError), ("2", TypeError)):
        with pytest.raises(error):
            grainlike.DataLoader(data_source=source, sampler=sampler, worker_count=bad)
