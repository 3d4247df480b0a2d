"""pytest plugin for running grain's own test files against grainlike.

Loaded with ``-p grain_alias`` in a separate pytest process (see
``test_grain_own_tests.py``). ``import grain...`` then resolves, in order, to

1. a file copied from grain's wheel beside the tests (``GRAIN_SUITE_ROOT``): the
   tests' own helpers (``transformations/testing_util.py``, ``core/pytest.py``)
   and test modules that other test modules import. ``from grain._src.x import
   helper`` looks the name up under the module's own name (``grainlike._src.x``),
   so such a file is found under that name too;
2. grainlike's module of the same path (``grain._src.x`` -> ``grainlike._src.x``,
   ``grain.python`` -> ``grainlike.python``), the module object itself; ``grain``
   is a module with grainlike's attributes whose ``__file__`` is in the copied tree.

A path that neither has fails to import, as it would for a user, except the
grain-internal modules in ``_PLACEHOLDERS``: a test file imports them for a few
of its tests only, and the rest of the file runs against a placeholder module
whose every attribute raises ``AttributeError`` naming the module (the tests
that use them fail, and are listed in exclusions.py).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import os
import sys
import types

_ROOT = os.environ["GRAIN_SUITE_ROOT"]


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, target: str) -> None:
        self._target = target

    def create_module(self, spec):
        module = importlib.import_module(self._target)
        self._spec = module.__spec__
        return module

    def exec_module(self, module) -> None:
        # The import system stamped the alias's spec on grainlike's module: give
        # it back its own, so that grainlike's imports and pickling see no change.
        module.__spec__ = self._spec


# ``from grain._src.core import tree_lib`` asks for it under grainlike's name.
_TREE_LIB = ("grain._src.core.tree_lib", "grainlike._src.core.tree_lib")


def _import_jax_as_grains_tree_lib_does() -> None:
    # grain's tree_lib imports jax when it is installed, so in grain's tests jax is
    # in sys.modules once tree_lib is; some read sys.modules["jax"] (batch_test).
    # grainlike never imports jax on its own: without this, whether those tests
    # find it would depend on which test file the worker ran before.
    if "jax" not in sys.modules and importlib.util.find_spec("jax") is not None:
        importlib.import_module("jax")


# grain-internal modules with no counterpart in grainlike -> why a test file imports them.
_PLACEHOLDERS = {
    "grain.proto": "the package of execution_summary_pb2",
    "grain.proto.execution_summary_pb2": "dataset_test.py imports grain's execution-summary protobuf and uses none of it",
}


class _Placeholder(types.ModuleType):
    def __init__(self, name: str, why: str) -> None:
        super().__init__(name)
        self.__why = why

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        raise AttributeError(
            f"{self.__name__} is a grain internal with no grainlike counterpart (placeholder of "
            f"tests/grain_suite/grain_alias.py: {self.__why}); no {name!r}"
        )


class _PlaceholderLoader(importlib.abc.Loader):
    def __init__(self, grain_name: str) -> None:
        self._grain_name = grain_name

    def create_module(self, spec):
        module = _Placeholder(spec.name, _PLACEHOLDERS[self._grain_name])
        module.__path__ = []  # Packages and modules alike: submodules resolve through the finder.
        return module

    def exec_module(self, module) -> None:
        pass


class _GrainPackage(types.ModuleType):
    """``grain`` itself: grainlike's names, with ``__file__`` in the copied wheel tree.

    Some test modules find their data beside ``grain.__file__`` (their
    ``setup_module`` points absl's ``--test_srcdir`` at ``<grain>/_src/python``,
    where the wheel keeps ``testdata``): here that is the copy the tests run in.
    Every other attribute is grainlike's.
    """

    def __getattr__(self, name):
        if name.startswith("__") and name not in ("__version__", "__all__"):
            raise AttributeError(name)
        return getattr(importlib.import_module("grainlike"), name)

    def __dir__(self):
        return dir(importlib.import_module("grainlike"))


class _GrainPackageLoader(importlib.abc.Loader):
    def create_module(self, spec):
        module = _GrainPackage("grain")
        module.__file__ = os.path.join(_ROOT, "__init__.py")
        module.__path__ = []  # submodules resolve through the finder
        return module

    def exec_module(self, module) -> None:
        pass


class _GrainToGrainlike(importlib.abc.MetaPathFinder):
    @staticmethod
    def _placeholder(fullname: str, grain_name: str):
        return importlib.util.spec_from_loader(fullname, _PlaceholderLoader(grain_name), is_package=True)

    def find_spec(self, fullname, path=None, target=None):
        if fullname in _TREE_LIB:
            _import_jax_as_grains_tree_lib_does()
        if fullname.startswith("grainlike._src."):
            copied = os.path.join(_ROOT, *fullname.split(".")[1:]) + ".py"
            if os.path.isfile(copied):
                return importlib.util.spec_from_file_location(fullname, copied)
            # `from grain._src.x import module` looks the module up under grainlike's name.
            grain_name = "grain" + fullname[len("grainlike") :]
            if grain_name in _PLACEHOLDERS and importlib.util.find_spec(fullname.rpartition(".")[0]) is not None:
                return self._placeholder(fullname, grain_name)
            return None
        if fullname == "grain":
            return importlib.util.spec_from_loader(fullname, _GrainPackageLoader(), is_package=True)
        if not fullname.startswith("grain."):
            return None
        parts = fullname.split(".")[1:]
        copied = os.path.join(_ROOT, *parts) + ".py"
        if parts and os.path.isfile(copied):
            return importlib.util.spec_from_file_location(fullname, copied)
        mirror = "grainlike" + fullname[len("grain") :]
        try:
            found = importlib.util.find_spec(mirror)
        except ModuleNotFoundError:
            found = None
        if found is None:
            if fullname in _PLACEHOLDERS:
                return self._placeholder(fullname, fullname)
            return None
        is_package = found.submodule_search_locations is not None
        return importlib.util.spec_from_loader(fullname, _AliasLoader(mirror), is_package=is_package)


sys.meta_path.insert(0, _GrainToGrainlike())


def pytest_configure(config) -> None:
    # Bazel runs each grain test file through absltest.main(), which parses
    # absl's flags; under pytest only a few test modules do it themselves, so
    # whether --test_tmpdir (create_tempfile) could be read depended on which
    # files shared a worker process. Parse them here, with their defaults.
    del config
    from absl import flags

    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()
