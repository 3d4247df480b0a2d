"""The stage classes the base's methods build, found by name: the base imports none of them.

``MapDataset.batch`` returns a ``BatchMapDataset``, ``MapDataset.source`` a
``SourceMapDataset``, ``IterDataset.mp_prefetch`` a
``MultiprocessPrefetchIterDataset``: subclasses of the base, defined above it in
``transformations/``, ``sources/`` and ``parallel/``. The base asks for them
here by class name (``stage_class``), so ``nodes/`` imports nothing above it and
no module of ``grainlike.dataset`` imports one that imports it back.

Where each stage is defined is declared once, by ``grainlike.dataset``'s
``__init__`` (``declare``), the package whose ``__init__`` runs before any
module under it is imported; ``stage_class`` imports the declaring module the
first time that stage is built. Declared there rather than registered by each
module as it is imported because a registry that modules fill is full only once
all of them are imported, and ``parallel.mp_prefetch`` loads the worker pool and
cloudpickle, which a pipeline in one process never needs: ``import
grainlike.dataset`` costs what it did. A test checks that every name the base
asks for is declared and is a class of the declared module.

Example:
    >>> from grainlike.dataset.nodes.map_dataset import MapDataset
    >>> stage_class("BatchMapDataset").__module__
    'grainlike.dataset.transformations.batch'
"""

from __future__ import annotations

import importlib

__all__ = ["declare", "declared", "stage_class"]

# Stage class name -> the module that defines it; and the classes already imported.
_MODULES: dict[str, str] = {}
_CLASSES: dict[str, type] = {}


def declare(module: str, *names: str) -> None:
    """Declares that ``module`` (a dotted name) defines the stage classes ``names``."""
    for name in names:
        _MODULES[name] = module
        _CLASSES.pop(name, None)


def declared() -> dict[str, str]:
    """Every declared stage: class name -> its module."""
    return dict(_MODULES)


def stage_class(name: str) -> type:
    """The stage class ``name``, its module imported on first use.

    Raises:
      LookupError: no module was declared for ``name``.
    """
    cls = _CLASSES.get(name)
    if cls is None:
        module = _MODULES.get(name)
        if module is None:
            raise LookupError(
                f"no module is declared for the stage {name!r}: grainlike/dataset/__init__.py "
                "declares every stage that MapDataset's and IterDataset's methods build"
            )
        cls = _CLASSES[name] = getattr(importlib.import_module(module), name)
    return cls
