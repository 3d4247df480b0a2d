"""grainlike's modules mirror grain 0.2.18's, name for name.

Every public name of grain's ten public modules is either present in grainlike's
mirror of that module, with the same kind of object and the same aliasing, or
listed in docs/migrating.md's table of names grainlike does not have.
"""

from __future__ import annotations

import importlib
import inspect
import itertools
import pathlib
import re
import subprocess
import sys
import types

import pytest

from tests.compat.conftest import grain_ref  # noqa: F401  (the reference grain, as a fixture)

ROOT = pathlib.Path(__file__).resolve().parents[1]

# grain's module -> grainlike's mirror of it.
MIRRORS = {
    "grain": "grainlike",
    "grain.python": "grainlike.python",
    "grain.experimental": "grainlike.experimental",
    "grain.python.experimental": "grainlike.python.experimental",
    "grain.checkpoint": "grainlike.checkpoint",
    "grain.constants": "grainlike.constants",
    "grain.multiprocessing": "grainlike.multiprocessing",
    "grain.samplers": "grainlike.samplers",
    "grain.sharding": "grainlike.sharding",
    "grain.sources": "grainlike.sources",
    "grain.transforms": "grainlike.transforms",
}


@pytest.fixture(scope="module")
def grain_modules(grain_ref):
    del grain_ref  # Imported, with absl's flags marked parsed.
    return {name: importlib.import_module(name) for name in MIRRORS}


def _public(module) -> list[str]:
    return sorted(n for n in dir(module) if not n.startswith("_"))


def _mirror(grain_name: str):
    return importlib.import_module(MIRRORS[grain_name])


def _unlisted_key(grain_module: str, name: str) -> str:
    # grain.python.experimental holds the same names as grain.experimental.
    if grain_module == "grain.python.experimental":
        grain_module = "grain.experimental"
    return f"{grain_module}.{name}"


def _listed_differences() -> dict[str, str]:
    """The names docs/migrating.md lists as not in grainlike, with their reasons."""
    text = (ROOT / "docs" / "migrating.md").read_text()
    section = text.split("## Names grainlike does not have", 1)[1].split("\n## ", 1)[0]
    listed = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 2 or not cells[0].startswith("`"):
            continue
        for name in re.findall(r"`(grain[\w.]*)`", cells[0]):
            listed[name] = cells[1]
    return listed


def _value(module, name):
    try:
        return getattr(module, name)
    except AttributeError:
        return None


def test_every_grain_name_is_mirrored_or_listed(grain_modules):
    listed = _listed_differences()
    missing = []
    for grain_name, module in grain_modules.items():
        mirror = _mirror(grain_name)
        for name in _public(module):
            if not hasattr(mirror, name) and _unlisted_key(grain_name, name) not in listed:
                missing.append(f"{MIRRORS[grain_name]}.{name}")
    assert not missing, f"grain names neither in grainlike nor in docs/migrating.md: {missing}"


def test_listed_names_are_grain_names_grainlike_lacks(grain_modules):
    listed = _listed_differences()
    for key, reason in listed.items():
        grain_name, _, name = key.rpartition(".")
        assert grain_name in MIRRORS, f"{key}: not in one of grain's public modules"
        assert hasattr(grain_modules[grain_name], name), f"{key} is not a grain name"
        assert not hasattr(_mirror(grain_name), name), f"{key} is in grainlike now: unlist it"
        assert len(reason) > 10, f"{key} is listed without a reason"


def test_present_names_are_the_same_kind_of_object(grain_modules):
    for grain_name, module in grain_modules.items():
        mirror = _mirror(grain_name)
        for name in _public(module):
            ours = _value(mirror, name)
            if ours is None:
                continue
            theirs = getattr(module, name)
            where = f"{MIRRORS[grain_name]}.{name}"
            if isinstance(theirs, types.ModuleType):
                assert isinstance(ours, types.ModuleType), where
                assert ours.__name__ == theirs.__name__.replace("grain", "grainlike", 1), where
            elif inspect.isclass(theirs):
                assert inspect.isclass(ours), where
            elif callable(theirs) and not type(theirs).__name__ == "Config":
                assert callable(ours) and not inspect.isclass(ours), where
            elif isinstance(theirs, (str, frozenset)):
                assert ours == theirs, where


def _present_objects(grain_modules):
    """(where, grain's object, grainlike's object) for every present class, function and alias."""
    out = []
    for grain_name, module in grain_modules.items():
        mirror = _mirror(grain_name)
        for name in _public(module):
            theirs = getattr(module, name)
            if isinstance(theirs, (types.ModuleType, str, frozenset)):
                continue
            ours = _value(mirror, name)
            if ours is not None:
                out.append((f"{grain_name}.{name}", theirs, ours))
    return out


def test_grain_aliases_are_aliases_in_grainlike(grain_modules):
    # e.g. grain.transforms.Map is grain.python.MapTransform, and
    # grain.sources.SharedMemoryDataSource is grain.python.InMemoryDataSource.
    objects = _present_objects(grain_modules)
    pairs = 0
    for (wa, ga, la), (wb, gb, lb) in itertools.combinations(objects, 2):
        if ga is gb:
            pairs += 1
            assert la is lb, f"{wa} is {wb} in grain, not in grainlike"
    assert pairs > 40


def test_class_hierarchy_matches_grain(grain_modules):
    classes = [(w, g, l) for w, g, l in _present_objects(grain_modules) if inspect.isclass(g)]
    for (wa, ga, la), (wb, gb, lb) in itertools.permutations(classes, 2):
        if ga is not gb and gb in ga.__mro__:
            # issubclass() refuses protocols with data members (ShapeDtypeStructProtocol).
            assert lb in la.__mro__ or issubclass(la, lb), f"{wa} subclasses {wb} in grain, not in grainlike"


def test_grain_python_aliases_of_transform_classes():
    import grainlike
    import grainlike.python as gp
    import grainlike.transforms as t

    assert gp.MapTransform is t.Map and gp.RandomMapTransform is t.RandomMap
    assert gp.FilterTransform is t.Filter and gp.MapWithIndexTransform is t.MapWithIndex
    assert grainlike.experimental.MapWithIndexTransform is t.MapWithIndex
    assert gp.InMemoryDataSource is grainlike.sources.SharedMemoryDataSource
    assert gp.PyGrainDatasetIterator is grainlike.DataLoaderIterator
    assert gp.experimental.index_shuffle is grainlike.experimental.index_shuffle


def test_faces_import_neither_jax_nor_orbax():
    faces = [m for m in MIRRORS.values()]
    code = (
        "import importlib, sys\n"
        f"for name in {faces!r}:\n"
        "    module = importlib.import_module(name)\n"
        "    exec(f'from {name} import *', {})\n"
        "import grainlike\n"
        "grainlike.config.update('py_debug_mode', True)\n"
        "heavy = [m for m in ('jax', 'orbax', 'grain', 'absl') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60, cwd=ROOT)


def test_star_import_gives_grain_python_names_except_the_orbax_ones(grain_modules):
    namespace: dict = {}
    exec("from grainlike.python import *", namespace)
    theirs = set(_public(grain_modules["grain.python"]))
    ours = set(namespace)
    orbax_names = {"PyGrainCheckpointHandler", "PyGrainCheckpointSave", "PyGrainCheckpointRestore"}
    assert theirs - ours == orbax_names


def test_missing_lazy_name_is_an_attribute_error():
    import grainlike

    with pytest.raises(AttributeError, match="no attribute 'NoSuchName'"):
        grainlike.NoSuchName  # noqa: B018
    assert not hasattr(grainlike.experimental, "NoSuchName")


# --- config -----------------------------------------------------------------------


@pytest.fixture()
def fresh_config():
    from grainlike.core.config import Config

    return Config()


def _grain_option_names(grain_ref):
    del grain_ref
    from grain._src.core import config as grain_config

    return sorted(f.name[len("grain_"):] for f in grain_config._GRAIN_FLAGS)


def test_config_has_grain_options_and_defaults(grain_ref, fresh_config):
    import grain

    names = _grain_option_names(grain_ref)
    assert names
    for name in names:
        assert fresh_config.get_or_default(name) == grain.config.get_or_default(name), name
        assert getattr(fresh_config, name) == grain.config.get_or_default(name), name


def test_config_update_sets_what_is_read(fresh_config):
    fresh_config.update("py_debug_mode", True)
    fresh_config.update("tf_lookup_batch_size", 7)
    assert fresh_config.py_debug_mode is True
    assert fresh_config.get_or_default("tf_lookup_batch_size") == 7


def test_config_errors_are_grains(grain_ref, fresh_config):
    import grain

    cases = [
        lambda c: c.update("no_such_option", 1),
        lambda c: c.no_such_option,
        lambda c: setattr(c, "py_debug_mode", True),
    ]
    for case in cases:
        with pytest.raises(Exception) as theirs:
            case(grain.config)
        with pytest.raises(Exception) as ours:
            case(fresh_config)
        assert isinstance(ours.value, type(theirs.value)), (ours.value, theirs.value)
    with pytest.raises(ValueError, match="no_such_option.*py_debug_mode"):
        fresh_config.update("no_such_option", 1)
    # Unlike grain's, introspection of an unknown name is an AttributeError too.
    assert getattr(fresh_config, "__wrapped__", None) is None


def test_grainlike_config_is_one_object():
    import grainlike
    import grainlike.python

    assert grainlike.python.config is grainlike.config


def test_worker_and_shared_memory_errors_are_public_and_lazy():
    """The errors a training loop catches are importable from the top level, and
    reaching them does not load the worker pool at ``import grainlike``."""
    import subprocess
    import sys

    code = (
        "import sys, grainlike\n"
        "assert 'grainlike.workers.pool' not in sys.modules\n"
        "from grainlike.core import errors as workers\n"
        "from grainlike.core import shm_owner\n"
        "assert grainlike.WorkerDiedError is workers.WorkerDiedError\n"
        "assert grainlike.WorkerStalledError is workers.WorkerStalledError\n"
        "assert grainlike.ForeignWorkersError is workers.ForeignWorkersError\n"
        "assert grainlike.WorkerError is workers.WorkerError\n"
        "assert grainlike.SharedMemoryFullError is shm_owner.SharedMemoryFullError\n"
        "assert issubclass(grainlike.WorkerDiedError, RuntimeError)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_the_names_static_tools_read_are_those_import_grainlike_gives():
    # ``import grainlike`` loads its names on first use; type checkers, IDEs and
    # the API docs read them from the ``if TYPE_CHECKING:`` imports instead.
    import ast

    import grainlike

    tree = ast.parse(pathlib.Path(grainlike.__file__).read_text())
    block = next(n for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING")
    static = {
        alias.asname or alias.name: (node.module, alias.name)
        for node in block.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    for name, (module, attribute) in static.items():
        assert getattr(grainlike, name) is getattr(importlib.import_module(module), attribute), name
    # Every name of __all__ but the submodule and the shared-memory array (whose
    # module is loaded only when it is used).
    assert set(static) == set(grainlike.__all__) - {"experimental", "SharedMemoryArray"}


def test_the_builder_is_grainlike_loader_in_a_fresh_process():
    # ``grainlike.loader(source)`` (docs/training.md) before anything else imported the package.
    code = "import grainlike; print([b.tolist() for b in grainlike.loader(list(range(5))).batch(2).build()])"
    out = subprocess.run([sys.executable, "-c", code], check=True, timeout=60, cwd=ROOT, capture_output=True, text=True)
    assert out.stdout.strip() == "[[0, 1], [2, 3], [4]]"


def test_grains_submodules_are_attributes_loaded_on_first_use():
    # After ``import grain``, grain.sources, grain.samplers, ... and grain._src are
    # attributes; grainlike's are too, listed by dir() and imported only when read.
    code = (
        "import sys, grainlike\n"
        "names = ('sources', 'samplers', 'sharding', 'transforms', 'constants', 'multiprocessing', 'checkpoint',\n"
        "         'experimental', 'python', '_src')\n"
        "assert all(n in dir(grainlike) for n in names), [n for n in names if n not in dir(grainlike)]\n"
        "assert not [n for n in names if f'grainlike.{n}' in sys.modules]\n"
        "assert grainlike.sources.RandomAccessDataSource is grainlike.RandomAccessDataSource\n"
        "assert grainlike._src.python.dataset.stats.Stats.__module__ == 'grainlike.dataset.stats'\n"
        "assert 'stats' in dir(grainlike._src.python.dataset)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60, cwd=ROOT)
