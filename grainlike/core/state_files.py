"""The iterator state files of a checkpoint: ``process_{i}-of-{n}.json``, in grain's format.

Each JAX process writes its iterator's state (indices, never data) with the bytes
grain's handler writes, so checkpoints restore across the two libraries: a
DataLoader iterator's ``get_state()`` bytes as they are, a Dataset iterator's dict
as ``json.dumps(state, indent=4)``. The form follows what ``get_state()`` returns,
so any iterator with ``get_state``/``set_state`` checkpoints. Orbax v1 calls
``save_state_async``/``load_state_async`` (through ``OrbaxCheckpointable``); Orbax
v0's handler (``grainlike.checkpoint.orbax_handler``) writes the same files.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import secrets
import threading
from typing import Any, Awaitable

from grainlike.core.errors import InvalidStateError, add_note
from grainlike.core.protocols import Checkpointable, ProcessStatesMerger, missing_state_methods
from grainlike.core.state_depth import check_depth

__all__ = ["ProcessStatesMerger", "load_state_async", "process_state_path", "save_state_async"]


def _process_index_and_count() -> tuple[int, int]:
    # Same rule as grain: without jax there is one process.
    try:
        import jax
    except ImportError:
        return 0, 1
    return jax.process_index(), jax.process_count()


def process_state_path(directory: Any) -> Any:
    """The file this JAX process's iterator state lives in under ``directory``.

    Args:
      directory: an ``etils.epath.Path`` or ``pathlib.Path``.

    Returns:
      ``directory / f"process_{jax.process_index()}-of-{jax.process_count()}.json"``.

    Example:
      >>> import pathlib
      >>> process_state_path(pathlib.Path("ckpt/7/data_iter")).name
      'process_0-of-1.json'
    """
    index, count = _process_index_and_count()
    return directory / f"process_{index}-of-{count}.json"


def _state_text(iterator: Any) -> str:
    """The iterator's state as the text written to the checkpoint file."""
    if missing_state_methods(iterator, ("get_state",)):
        raise TypeError(
            "a grainlike checkpoint holds an iterator with get_state()/set_state() "
            f"(iter(DataLoader), a Dataset iterator, DeviceIterator), got {type(iterator).__name__}"
        )
    state = iterator.get_state()
    if isinstance(state, (bytes, bytearray)):
        return bytes(state).decode()
    if isinstance(state, str):
        return state
    if isinstance(state, dict):
        return json.dumps(state, indent=4)
    raise TypeError(
        f"{type(iterator).__name__}.get_state() returned {type(state).__name__}; a "
        "grainlike checkpoint stores the bytes of a DataLoader iterator's get_state() "
        "or the dict of a Dataset iterator's"
    )


def _current_state(iterator: Any) -> Any:
    """The iterator's state now, whose form (dict, str or bytes) its ``set_state`` takes."""
    return iterator.get_state() if isinstance(iterator, Checkpointable) else None


def _parse_json(text: str, source: Any) -> Any:
    """The JSON state in ``text``, read from ``source``.

    Raises:
      InvalidStateError: ``text`` is not JSON (empty, a pickle, too deep to parse),
        or ``StateTooDeepError``: it nests deeper than any state; both name ``source``.
    """
    try:
        text.encode()  # Bytes that were not UTF-8 are read as lone surrogates.
        state = json.loads(text)
    except (ValueError, RecursionError) as e:
        head = text[:40] + ("..." if len(text) > 40 else "")
        raise InvalidStateError(
            f"{source} does not hold a JSON state ({type(e).__name__}: {str(e)[:200]}): {head!r}"
        ) from None
    check_depth(state, source)
    return state


def _state_from_text(iterator: Any, text: str, source: Any = None) -> Any:
    """The file's text (from ``source``) in the form ``iterator.set_state`` takes."""
    current = _current_state(iterator)
    if isinstance(current, dict):
        return _parse_json(text, source)
    if isinstance(current, str):
        return text
    # Bytes that are not UTF-8 go back as read (decoded with "surrogateescape").
    return text.encode(errors="surrogateescape")


def _missing_state_error(filename: Any) -> ValueError:
    directory = filename.parent
    try:
        present = sorted(p.name for p in directory.iterdir()) if directory.exists() else None
    except OSError:
        present = None
    if present is None:
        where = f"the directory {directory} does not exist"
    elif present:
        where = f"it holds {present}"
    else:
        where = "it is empty"
    index, count = _process_index_and_count()
    return ValueError(
        f"File {filename} does not exist: there is no data-iterator state for JAX "
        f"process {index} of {count} in this checkpoint ({where}). A checkpoint "
        "restores on another number of processes from all the files "
        "process_*-of-N.json of one other number N."
    )


def _apply_state(iterator: Any, text: str, filename: Any) -> None:
    state = _state_from_text(iterator, text, filename)
    try:
        iterator.set_state(state)
    except Exception as e:
        # Name the file: with several items in a checkpoint, which one did not fit
        # is the first thing a user needs to know. Subclasses (a KeyError or
        # IndexError too, as grain raises) keep their type and get a note.
        if type(e) is InvalidStateError:
            raise InvalidStateError(f"cannot restore the iterator from {filename}: {e}") from e
        add_note(e, f"grainlike: while restoring the iterator from {filename}")
        raise


_PROCESS_FILE = re.compile(r"process_(\d+)-of-(\d+)\.json")

def _write_process_files(directory: Any, text: str) -> None:
    """Writes this process's state file, the only file of an iterator checkpoint.

    No other file goes beside it: tools read the directory as grain writes it
    (MaxText counts ``process_*-of-*.json`` to find the process count).
    """
    _write_file(process_state_path(directory), text)


def _read_state_for_process(iterator: Any, directory: Any) -> tuple[str, Any]:
    """This process's state text and the file(s) it came from.

    A checkpoint of N other processes is restored elastically: a DataLoader iterator
    merges the N states; a Dataset iterator takes the state if all N wrote the same.
    """
    filename = process_state_path(directory)
    if filename.exists():
        # Written whole by a rename: a reader sees the old file or the new one.
        return filename.read_bytes().decode(errors="surrogateescape"), filename
    _, count = _process_index_and_count()
    found: dict[int, dict[int, Any]] = {}
    if directory.exists():
        for path in directory.iterdir():
            m = _PROCESS_FILE.fullmatch(path.name)
            if m:
                found.setdefault(int(m.group(2)), {})[int(m.group(1))] = path
    found.pop(count, None)
    if len(found) != 1 or set(next(iter(found.values()))) != set(range(next(iter(found)))):
        # No other process count, several, or not all files of one: nothing to merge.
        raise _missing_state_error(filename)
    ((old_count, paths),) = found.items()
    texts = {i: path.read_bytes().decode(errors="surrogateescape") for i, path in paths.items()}
    where = directory / f"process_*-of-{old_count}.json"
    try:
        return _elastic_state_text(iterator, texts, old_count), where
    except InvalidStateError as e:
        raise InvalidStateError(f"cannot restore the iterator from {where}: {e}") from e


def _elastic_state_text(iterator: Any, texts: dict, old_count: int) -> str:
    """The state text for this process, continuing the states of ``old_count`` processes."""
    if isinstance(_current_state(iterator), dict):
        states = {i: _parse_json(t, f"process_{i}-of-{old_count}.json") for i, t in texts.items()}
        if len(states) != old_count or any(s != states[0] for s in states.values()):
            raise InvalidStateError(
                f"the checkpoint holds the states of {len(states)} of {old_count} processes, "
                "not all the same: a Dataset iterator restores on another number of "
                "processes only from a state every process shares (ElasticIterator's)"
            )
        return texts[0]
    return _merger_of(iterator)._merge_process_states(texts, old_count)


def _merger_of(iterator: Any) -> ProcessStatesMerger:
    """The iterator, or the one it wraps (a DeviceIterator's), that merges process states."""
    node = iterator
    for _ in range(8):
        if isinstance(node, ProcessStatesMerger):
            return node
        node = getattr(node, "_iterator", None)
    raise InvalidStateError(
        f"a {type(iterator).__name__} restores only with the number of processes that "
        "wrote its checkpoint: only DataLoader iterators (and wrappers of one) restore "
        "on another number"
    )


def _temporary_name(filename: Any) -> str:
    """A name beside ``filename`` that no other writer uses, in this process or another.

    Threads of one process saving into one directory (several iterators, or
    Orbax's commit threads of several saves) each write their own temporary file,
    so none renames or deletes another's.
    """
    return f".{filename.name}.tmp-{os.getpid()}-{threading.get_ident()}-{secrets.token_hex(8)}"


def _write_file(filename: Any, text: str) -> None:
    """Writes ``text`` to ``filename`` whole or not at all (a temporary file renamed over it).

    The rename replaces the file in one step: a reader opens either the file
    that was there or the new one, never a part of either.
    """
    tmp = filename.parent / _temporary_name(filename)
    try:
        tmp.write_text(text)
        tmp.replace(filename)
    except BaseException:
        try:
            tmp.unlink()
        except Exception:  # pylint: disable=broad-except
            pass
        raise


async def _write_state(directory: Any, state: str) -> None:
    if hasattr(directory, "await_creation"):  # Orbax's PathAwaitingCreation
        directory = await directory.await_creation()
    await asyncio.to_thread(_write_process_files, directory, state)


# -- Orbax v1: StatefulCheckpointable -----------------------------------------------


async def save_state_async(iterator: Any, directory: Any) -> Awaitable[None]:
    """Orbax v1 ``StatefulCheckpointable.save`` for an iterator.

    The state is read now, in the caller's thread; advancing the iterator after
    this returns does not change what is written. The returned coroutine waits for
    the directory and writes the file; Orbax runs it in the background.

    Args:
      iterator: has ``get_state()`` returning bytes (a DataLoader iterator) or a
        dict (a Dataset iterator).
      directory: an Orbax ``PathAwaitingCreation`` (has ``await_creation()``) or a
        path that already exists.

    Returns:
      A coroutine, not yet awaited, that writes ``process_{i}-of-{n}.json``.

    Example:
      class MyIterator:
          async def save(self, directory):
              return await save_state_async(self, directory)

          async def load(self, directory):
              return await load_state_async(self, directory)
    """
    return _write_state(directory, _state_text(iterator))


async def load_state_async(iterator: Any, directory: Any) -> Awaitable[None]:
    """Orbax v1 ``StatefulCheckpointable.load`` for an iterator.

    Args:
      iterator: has ``set_state``; it gets the file's JSON as a dict if its
        ``get_state()`` returns a dict (a Dataset iterator, or a wrapper of one),
        otherwise the file's bytes.
      directory: the checkpoint directory of this item.

    Returns:
      A coroutine, not yet awaited, that reads ``process_{i}-of-{n}.json`` and
      restores the iterator from it. Raises ValueError naming the file if it is
      missing, and ``InvalidStateError`` if it belongs to another pipeline.
    """

    async def read() -> None:
        text, filename = await asyncio.to_thread(_read_state_for_process, iterator, directory)
        _apply_state(iterator, text, filename)

    return read()
