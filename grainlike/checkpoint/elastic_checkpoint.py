"""Checkpoints of elastic iterators, one file per data shard, as in grain's main branch.

grain's main branch (newer than 0.2.18; ``grain._src.python.checkpoint.
elastic_checkpoint``) saves an iterator that reads a fixed number of data shards,
spread over however many processes run, as one ``shard_state_{i}.json`` per
shard ``i``: the shard's state as ``json.dumps(state, indent=4)``. A job of
another number of processes restores from those files: process ``p`` of ``P``
takes shards ``p, p + P, p + 2P, ...``, so every shard, and every element of it,
goes on exactly once.

The iterator tells its shards' states: ``get_shard_states()`` returns ``{global
shard index: state}`` for the shards this process reads, ``set_shard_states``
takes the same for the shards it is to read, and ``shard_options`` says which
those are (``ShardStatesCheckpointable``; grain main's ``ElasticIterator`` over
an ``IterDataset`` has them). grainlike's ``ElasticIterator`` is grain 0.2.18's,
over a ``MapDataset``: its state, one global index every shard shares, restores
on any number of shards from the process files, and it has no shard states.

The Orbax handler (``grainlike.checkpoint.CheckpointHandler``) writes these files
beside ``process_{i}-of-{n}.json`` for such an iterator, and restores from them
when the checkpoint was written by another number of processes, as grain main's.

Example:
  save_elastic_iterator(directory, it)       # shard_state_{i}.json per shard of it
  ...
  restore_elastic_iterator(directory, it2)   # on a job of another process count
"""

from __future__ import annotations

import json
from typing import Any, Protocol, runtime_checkable

from grainlike.core.state_files import _write_file

__all__ = [
    "ShardStatesCheckpointable",
    "get_checkpoint_process_count",
    "restore_elastic_iterator",
    "save_elastic_iterator",
]


@runtime_checkable
class ShardStatesCheckpointable(Protocol):
    """An iterator over a fixed set of data shards that saves and restores each shard's state.

    ``shard_options.shard_index`` / ``shard_count`` are this process's place in
    the job; it reads the global shards ``shard_index, shard_index +
    shard_count, ...``.
    """

    @property
    def shard_options(self) -> Any: ...

    def get_shard_states(self) -> dict[int, Any]: ...

    def set_shard_states(self, state: dict[int, Any]) -> None: ...


def shard_state_path(directory: Any, shard_index: int) -> Any:
    """The file of global shard ``shard_index``'s state: ``directory / f"shard_state_{shard_index}.json"``."""
    return directory / f"shard_state_{shard_index}.json"


def get_checkpoint_process_count(directory: Any) -> int:
    """The number of processes that wrote the checkpoint in ``directory``.

    The largest ``n`` of its ``process_{i}-of-{n}.json`` files; 0 if it has none.
    """
    process_count = 0
    for path in directory.glob("process_*-of-*.json"):
        process_count = max(process_count, int(path.name[: -len(".json")].split("-of-")[1]))
    return process_count


def shard_state_texts(item: Any) -> dict[int, str]:
    """The text of each ``shard_state_{i}.json`` of ``item``, read now; empty if it has no shard states.

    An iterator with the methods of ``ShardStatesCheckpointable`` whose
    ``get_shard_states`` raises ``NotImplementedError`` (grain main's
    ``ElasticIterator`` over a ``MapDataset``) has none.
    """
    if not isinstance(item, ShardStatesCheckpointable):
        return {}
    try:
        states = item.get_shard_states()
    except NotImplementedError:
        return {}
    return {int(index): json.dumps(state, indent=4) for index, state in states.items()}


def write_shard_state_texts(directory: Any, texts: dict[int, str]) -> None:
    """Writes ``shard_state_texts``' files into ``directory``, each whole or not at all."""
    for index, text in texts.items():
        _write_file(shard_state_path(directory, index), text)


def save_elastic_iterator(directory: Any, item: ShardStatesCheckpointable) -> None:
    """Saves ``item``'s shard states to ``directory``, one ``shard_state_{i}.json`` per shard.

    As grain main's: shard ``i``'s state (a value of ``item.get_shard_states()``)
    as ``json.dumps(state, indent=4)``. Every process saves its own shards into
    the same directory.

    Args:
      directory: an existing ``etils.epath.Path`` or ``pathlib.Path``.
      item: has ``get_shard_states()`` returning ``{global shard index: state}``.
    """
    for index, state in item.get_shard_states().items():
        _write_file(shard_state_path(directory, index), json.dumps(state, indent=4))


def restore_elastic_iterator(directory: Any, item: ShardStatesCheckpointable) -> None:
    """Restores ``item`` from the ``shard_state_{i}.json`` files in ``directory``.

    As grain main's: this process (``item.shard_options``: index ``p`` of ``P``)
    reads shards ``p, p + P, p + 2P, ...`` up to the first missing file, and
    hands ``{shard index: state}`` to ``item.set_shard_states``. A process with
    no shard left (more processes than shards) gets ``{}``.

    Args:
      directory: the directory ``save_elastic_iterator`` wrote.
      item: has ``shard_options`` and ``set_shard_states``.

    Raises:
      ValueError: ``directory`` holds no ``shard_state_*.json`` file at all (not
        a checkpoint of shard states; grain main would restore nothing).
    """
    shard_index = item.shard_options.shard_index
    shard_count = item.shard_options.shard_count
    states = {}
    # Shards are spread unevenly over processes, so read until one is missing.
    while (path := shard_state_path(directory, shard_index)).exists():
        states[shard_index] = json.loads(path.read_text())
        shard_index += shard_count
    if not states and not any(directory.glob("shard_state_*.json")):
        raise ValueError(
            f"{directory} holds no shard_state_*.json file: it is not a checkpoint "
            "written by save_elastic_iterator (or by the Orbax handler for an "
            "iterator with shard states)"
        )
    item.set_shard_states(states)
