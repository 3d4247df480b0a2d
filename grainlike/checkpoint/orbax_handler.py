"""Orbax v0's handler for grainlike iterators, in grain 0.2.18's format (see ``grainlike.checkpoint``).

Orbax (and jax, for the process index) load when a class here is first used: the
classes are built on first attribute access, never by ``import grainlike``.

Example:
  import orbax.checkpoint as ocp
  import grainlike as grain

  mngr = ocp.CheckpointManager("/abs/path/checkpoints")
  mngr.save(step, args=ocp.args.Composite(
      state=ocp.args.StandardSave(params),
      data_iter=grain.checkpoint.CheckpointSave(it),
  ))
  ...
  mngr.restore(step, args=ocp.args.Composite(
      state=ocp.args.StandardRestore(params),
      data_iter=grain.checkpoint.CheckpointRestore(it),
  ))
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import types
from typing import Any

from grainlike.checkpoint import elastic_checkpoint
from grainlike.core import state_files
from grainlike.core.protocols import Prefetching, missing_state_methods
from grainlike.core.state_files import (
    _apply_state,
    _read_state_for_process,
    _state_text,
    _write_process_files,
    _write_state,
    load_state_async,
    process_state_path,
    save_state_async,
)

__all__ = [
    "CheckpointHandler",
    "CheckpointRestore",
    "CheckpointSave",
    "PyGrainCheckpointHandler",
    "PyGrainCheckpointRestore",
    "PyGrainCheckpointSave",
    "load_state_async",
    "process_state_path",
    "save_state_async",
]

# grain.checkpoint's names and grain.python's aliases of them: the same classes.
ORBAX_CLASS_NAMES = {
    "CheckpointHandler": "PyGrainCheckpointHandler",
    "CheckpointSave": "PyGrainCheckpointSave",
    "CheckpointRestore": "PyGrainCheckpointRestore",
    "PyGrainCheckpointHandler": "PyGrainCheckpointHandler",
    "PyGrainCheckpointSave": "PyGrainCheckpointSave",
    "PyGrainCheckpointRestore": "PyGrainCheckpointRestore",
}
# Where the classes say they live: Orbax records the handler's typestr in each
# checkpoint, and pickle looks the classes up by module and name.
_PUBLIC_MODULE = "grainlike.checkpoint"


def _check_iterator(item: Any, method: str, args_name: str) -> None:
    if isinstance(item, (list, tuple)):
        # A list is for handler subclasses that override save()/restore()
        # (MaxText's): each entry is an iterator or a tuple starting with one.
        for i, entry in enumerate(item):
            inner = entry[0] if isinstance(entry, tuple) and entry else entry
            if missing := missing_state_methods(inner, (method,)):
                raise TypeError(
                    f"{args_name} takes an iterator with get_state()/set_state(), or a "
                    "list of them for a handler subclass that overrides save()/restore(); "
                    f"got a {type(item).__name__} whose entry {i} is "
                    f"{type(inner).__name__}, which has no {missing}"
                )
        return
    if missing := missing_state_methods(item, (method,)):
        raise TypeError(
            f"{args_name} takes an iterator with get_state()/set_state(), such as "
            f"iter(DataLoader) or a DeviceIterator; got {type(item).__name__}, which "
            f"has no {missing}"
        )


def _save_now(directory: Any, item: Any) -> None:
    """Writes ``item``'s files into the existing ``directory``: its shard states (if any), then its state."""
    elastic_checkpoint.write_shard_state_texts(directory, elastic_checkpoint.shard_state_texts(item))
    _write_process_files(directory, _state_text(item))


async def _write_item(directory: Any, state: str, shard_texts: dict[int, str]) -> None:
    """Writes the texts read at ``save()``, once Orbax has created ``directory``."""
    if shard_texts:
        if hasattr(directory, "await_creation"):  # Orbax's PathAwaitingCreation
            directory = await directory.await_creation()
        await asyncio.to_thread(elastic_checkpoint.write_shard_state_texts, directory, shard_texts)
    await _write_state(directory, state)


def _restores_from_shard_states(directory: Any, item: Any) -> bool:
    """Whether ``item`` restores from ``shard_state_*.json`` (grain main's rule, plus: such files exist).

    An iterator with shard states restores from them when the checkpoint was
    written by another number of processes.
    """
    return (
        isinstance(item, elastic_checkpoint.ShardStatesCheckpointable)
        and state_files._process_index_and_count()[1] != elastic_checkpoint.get_checkpoint_process_count(directory)
        and any(directory.glob("shard_state_*.json"))
    )


# -- Orbax v0: CheckpointHandler and its args, built on first use --------------------

_build_lock = threading.Lock()
_built: dict[str, type] = {}


def _build_orbax_classes() -> dict[str, type]:
    with _build_lock:
        if _built:
            return _built
        try:
            import orbax.checkpoint as ocp
            from orbax.checkpoint import future as ocp_future
        except ImportError as e:
            raise ImportError(
                "grainlike's Orbax checkpointing needs orbax-checkpoint: "
                "pip install 'grainlike[orbax]'"
            ) from e

        class PyGrainCheckpointHandler(ocp.AsyncCheckpointHandler):
            """Orbax handler for grainlike (and grain) iterators: ``grain.checkpoint.CheckpointHandler``.

            Writes ``process_{i}-of-{n}.json`` per JAX process, as grain does: a
            DataLoader iterator's state bytes, or a Dataset iterator's state dict
            as indented JSON. With
            async checkpointing the state is read when ``save()`` is called, and
            only the file write runs in the background (in Orbax's commit
            thread), so the iterator can be advanced at once.

            Example:
              mngr.save(step, args=ocp.args.Composite(
                  state=ocp.args.StandardSave(params),
                  data_iter=grainlike.checkpoint.CheckpointSave(it)))
            """

            async def async_save(
                self, directory: Any, item: Any = None, args: Any = None
            ) -> list:
                if type(self).save is not PyGrainCheckpointHandler.save:
                    # A subclass that overrides save() (MaxText's does) gets it
                    # called as Orbax calls grain's synchronous handler: once the
                    # directory exists, before the save returns; nothing is left
                    # to run in the background.
                    kwargs = {"args": args} if item is None else {"item": item, "args": args}
                    ocp_future.CommitFutureAwaitingContractedSignals(
                        asyncio.to_thread(self.save, directory, **kwargs),
                        name="grainlike_iterator_state",
                    ).result()
                    return []
                item = item if item is not None else args.item
                # Now, not when the write runs.
                state = _state_text(item)
                shard_texts = elastic_checkpoint.shard_state_texts(item)
                # Orbax's commit thread waits for its "directory created" signals,
                # then writes; save() does not wait for it.
                return [
                    ocp_future.CommitFutureAwaitingContractedSignals(
                        _write_item(directory, state, shard_texts), name="grainlike_iterator_state"
                    )
                ]

            def save(self, directory: Any, item: Any = None, args: Any = None) -> None:
                item = item if item is not None else args.item
                _save_now(directory, item)

            def restore(self, directory: Any, item: Any = None, args: Any = None) -> Any:
                item = item if item is not None else getattr(args, "item", None)
                if item is None:
                    raise ValueError(
                        "CheckpointRestore needs the iterator to restore into: "
                        "CheckpointRestore(iter(loader))"
                    )
                if _restores_from_shard_states(directory, item):
                    # As grain main's handler: no prefetch started.
                    elastic_checkpoint.restore_elastic_iterator(directory, item)
                    return item
                text, filename = _read_state_for_process(item, directory)
                _apply_state(item, text, filename)
                # As grain: start the workers now, so loading overlaps the rest
                # of the restore.
                if isinstance(item, Prefetching):
                    item.start_prefetch()
                return item

            def structure(self, directory: Any) -> Any:
                return None

            def metadata(self, directory: Any) -> Any:
                return None

            def finalize(self, directory: Any) -> None:
                pass

            def close(self) -> None:
                pass

            @classmethod
            def typestr(cls) -> str:
                return f"{cls.__module__}.{cls.__qualname__}"

        @dataclasses.dataclass
        class PyGrainCheckpointSave(ocp.args.CheckpointArgs):
            """Orbax save args: ``CheckpointSave(iterator)`` (alias ``PyGrainCheckpointSave``)."""

            item: Any

            def __post_init__(self):
                # Here, not in the handler: an error inside Orbax's async save
                # leaves its background threads waiting for minutes.
                _check_iterator(self.item, "get_state", "PyGrainCheckpointSave")

        @dataclasses.dataclass
        class PyGrainCheckpointRestore(ocp.args.CheckpointArgs):
            """Orbax restore args: ``CheckpointRestore(iterator)`` (alias ``PyGrainCheckpointRestore``).

            Restores the iterator in place.
            """

            item: Any

            def __post_init__(self):
                _check_iterator(self.item, "set_state", "PyGrainCheckpointRestore")

        classes = {
            "PyGrainCheckpointHandler": PyGrainCheckpointHandler,
            "PyGrainCheckpointSave": PyGrainCheckpointSave,
            "PyGrainCheckpointRestore": PyGrainCheckpointRestore,
        }
        # A stable name, as if defined at module level: Orbax records the handler's
        # typestr in the checkpoint, and pickle finds the classes by it.
        for name, cls in classes.items():
            cls.__module__ = _PUBLIC_MODULE
            cls.__qualname__ = name
            for attr in vars(cls).values():
                func = getattr(attr, "__func__", attr)
                if isinstance(func, types.FunctionType):
                    func.__qualname__ = f"{name}.{func.__name__}"
        ocp.args.register_with_handler(PyGrainCheckpointHandler, for_save=True)(
            PyGrainCheckpointSave
        )
        ocp.args.register_with_handler(PyGrainCheckpointHandler, for_restore=True)(
            PyGrainCheckpointRestore
        )
        _built.update({alias: classes[name] for alias, name in ORBAX_CLASS_NAMES.items()})
        return _built


def __getattr__(name: str) -> Any:
    if name in ORBAX_CLASS_NAMES:
        value = _build_orbax_classes()[name]
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(ORBAX_CLASS_NAMES))
