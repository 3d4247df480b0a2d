"""Module attributes that import their module on first use (PEP 562).

The public modules (``grainlike``, ``grainlike.python``, ``grainlike.experimental``,
...) name things whose modules import jax or orbax, or that are large: they are
listed here and imported when first read, so ``import grainlike`` loads numpy
and the standard library only.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Mapping


def attach(
    module_globals: dict, targets: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list]]:
    """Returns ``(__getattr__, __dir__)`` for a module with lazily imported names.

    Args:
      module_globals: the module's ``globals()``; a name is cached there once read.
      targets: attribute name -> ``"package.module:attribute"`` (that attribute of
        that module) or ``"package.module"`` (the module itself).

    Returns:
      The module's ``__getattr__`` and ``__dir__``.

    Example:
      __getattr__, __dir__ = attach(globals(), {"DeviceIterator": "grainlike.jax.device_iterator:DeviceIterator"})
    """
    module_name = module_globals["__name__"]

    def __getattr__(name: str) -> Any:
        target = targets.get(name)
        if target is None:
            raise AttributeError(f"module {module_name!r} has no attribute {name!r}")
        path, _, attribute = target.partition(":")
        try:
            module = importlib.import_module(path)
        except ModuleNotFoundError as e:
            if e.name != path:
                raise  # Something the module itself imports is missing: say which.
            raise AttributeError(
                f"module {module_name!r} has no attribute {name!r}: {path} is not installed"
            ) from e
        value = getattr(module, attribute) if attribute else module
        module_globals[name] = value
        return value

    def __dir__() -> list:
        return sorted(set(module_globals) | set(targets))

    return __getattr__, __dir__


def attach_submodules(module_globals: dict) -> tuple[Callable[[str], Any], Callable[[], list]]:
    """Returns ``(__getattr__, __dir__)`` for a package whose submodules are attributes.

    After ``import grain`` its packages hold the submodules grain's own imports
    loaded (``grain._src.python.dataset``, ...); a package that uses this reaches
    each of its submodules as an attribute without importing any of them first.

    Args:
      module_globals: the package's ``globals()`` (it has ``__path__``).

    Returns:
      The package's ``__getattr__`` and ``__dir__``.
    """
    import pkgutil

    package = module_globals["__name__"]
    names = {info.name for info in pkgutil.iter_modules(module_globals["__path__"])}
    return attach(module_globals, {name: f"{package}.{name}" for name in sorted(names)})
