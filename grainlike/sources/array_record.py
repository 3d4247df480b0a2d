"""``ArrayRecordDataSource``: random access to records in ArrayRecord files.

Readers are opened lazily, in the process that reads, one per file, and shared by
its threads (ArrayRecord readers are thread-safe); they are dropped when the source
is pickled, and a forked process opens its own (an inherited reader crashes on its
first read). Remote files are copied once into a local cache (the reader opens local
files only); while one file is read the next is fetched in the background.
"""

from __future__ import annotations

import bisect
import logging
import operator
import os
import re
import threading
from collections.abc import Sequence
from concurrent import futures
from typing import Any, Optional, SupportsIndex

import numpy as np

from grainlike.core.errors import InvalidStateError, RecordKeyOutOfRangeError, SourceFileNotFoundError
from grainlike.sources.formats import remote_files as remote
from grainlike.sources.formats import remote_pins
from grainlike.sources.formats.remote_options import local_path
from grainlike.sources.formats.file_cache import cache_for
from grainlike.sources.formats.array_record_files import (
    BASE_READER_OPTIONS,
    count_remote_records,
    missing_file_error,
    open_reader,
)
from grainlike.sources.keys import check_keys, group_by
from grainlike.sources.protocol import FileSource

__all__ = ["ArrayRecordDataSource", "RecordKeyOutOfRangeError", "SourceFileNotFoundError"]

_log = logging.getLogger(__name__)

_MAX_COUNTING_THREADS = 64
_SLICED_PATH = re.compile(r"(.*)\[(\d+):(\d+)\]")

# Readers inherited through fork(): never used or destroyed in the child (their
# destructor may touch state that only exists in the parent), just kept here.
_ABANDONED_READERS: list = []


def _is_file_instruction(x: Any) -> bool:
    return (
        not isinstance(x, (str, bytes, os.PathLike))
        and hasattr(x, "filename")
        and hasattr(x, "skip")
        and hasattr(x, "take")
    )


def _warn_group_size(path: str, reader: Any) -> None:
    options = reader.writer_options_string()
    match = re.search(r"group_size:(\d+)", options or "")
    if match and match.group(1) != "1":
        _log.warning(
            "ArrayRecord file %s was written with group_size:%s; random access reads a "
            "whole group per record. Write files with 'group_size:1' for speed.",
            path,
            match.group(1),
        )


def _normalize_paths(paths: Any) -> list:
    if isinstance(paths, (str, os.PathLike)) or _is_file_instruction(paths):
        return [paths]
    if isinstance(paths, Sequence) and not isinstance(paths, bytes):
        if len(paths) == 0:
            raise ValueError("ArrayRecordDataSource: the list of paths is empty.")
        for i, p in enumerate(paths):
            if not (isinstance(p, (str, os.PathLike)) or _is_file_instruction(p)):
                raise ValueError(
                    f"ArrayRecordDataSource: paths[{i}] is {p!r} of type "
                    f"{type(p).__name__}; expected a str, an os.PathLike or a file "
                    "instruction (an object with filename, skip and take)."
                )
        return list(paths)
    raise ValueError(
        f"ArrayRecordDataSource: unsupported paths {paths!r:.200} of type "
        f"{type(paths).__name__}; pass a path (str or os.PathLike), a file instruction "
        "(filename, skip, take), or a sequence of them."
    )


def _count_records(filename: str, remote_options: Optional[remote.RemoteOptions], pin: Optional[dict] = None) -> int:
    """The number of records of a file (its footer only; default options, as Grain)."""
    reader = open_reader(filename, "", remote_options, pin)
    try:
        return reader.num_records()
    finally:
        reader.close()


def _read_instruction(
    path: Any, remote_options: Optional[remote.RemoteOptions] = None
) -> tuple[str, int, int]:
    """Returns ``(filename, first position, end position)`` for one path."""
    if _is_file_instruction(path):
        filename = os.fspath(path.filename)
        start, take = operator.index(path.skip), operator.index(path.take)
        if start < 0 or take < 0:
            raise ValueError(
                f"ArrayRecordDataSource: file instruction for {filename!r} has skip={start}, "
                f"take={take}; both must be >= 0."
            )
        end = start + take
    elif m := _SLICED_PATH.fullmatch(os.fspath(path)):
        # Grain's "file[start:end]" syntax: no need to open the file to count.
        filename, start, end = m.group(1), int(m.group(2)), int(m.group(3))
    else:
        filename = os.fspath(path)
        if remote.is_remote(filename):
            return filename, 0, count_remote_records(filename, remote_options)
        return filename, 0, _count_records(filename, remote_options)
    if not remote.is_remote(filename) and not os.path.exists(local_path(filename)):
        raise missing_file_error(filename)
    return filename, start, max(end, start)


class ArrayRecordDataSource(FileSource):
    """Reads records (``bytes``) from one or more ArrayRecord files.

    Same records, length and ``repr`` as Grain's ``ArrayRecordDataSource`` for the
    same paths, so checkpoints are interchangeable.

    Args:
      paths: a path (``str`` or ``os.PathLike``), a file instruction (an object
        with ``filename``, ``skip`` and ``take``, such as TFDS returns), Grain's
        ``"file[start:end]"`` string form, or a sequence of these. Instructions
        select records ``[skip, skip + take)`` of their file without opening it.
      reader_options: extra ArrayRecord reader options, e.g.
        ``{"index_storage_option": "offloaded"}``.
      remote_options: for ``s3://``, ``gs://`` and other fsspec URLs: credentials,
        retries and the local cache the files are copied to when first read
        (grainlike only; see ``grainlike.sources.remote.RemoteOptions``).

    Raises:
      SourceFileNotFoundError: a path does not exist (named in the message); a
        ``FileNotFoundError`` and a ``RuntimeError``, as Grain raises.
      ValueError: ``paths`` is empty or holds something that is not a path; a
        file is not an ArrayRecord file.

    Example:
        source = ArrayRecordDataSource(["train-0.array_record", "train-1.array_record"])
        first = source[0]  # bytes
        batch = source.__getitems__([7, 3, 7])  # one read per file touched
        repr(source)  # 'ArrayRecordDataSource(hash_of_paths=<sha1 of the filenames>)'
    """

    _per_process = ("_readers", "_lock", "_pid")
    _key_error = RecordKeyOutOfRangeError

    def __init__(
        self,
        paths: Any,
        reader_options: Optional[dict[str, str]] = None,
        *,
        remote_options: Optional[remote.RemoteOptions] = None,
    ):
        self._remote_options = remote_options
        extra = ",".join(f"{k}:{v}" for k, v in (reader_options or {}).items())
        self._reader_options = f"{BASE_READER_OPTIONS},{extra}" if extra else BASE_READER_OPTIONS
        normalized = _normalize_paths(paths)
        # Counting records opens every file: overlap that I/O.
        with futures.ThreadPoolExecutor(min(len(normalized), _MAX_COUNTING_THREADS)) as pool:
            instructions = list(pool.map(lambda p: _read_instruction(p, remote_options), normalized))
        self._paths = [f for f, _, _ in instructions]
        # Size and version of each remote file, read while counting: every process
        # finds its cached copy without asking the store, and copies that version.
        self._infos = {f: i for f in self._paths if (i := remote.known_info(f)) is not None}
        self._starts = [s for _, s, _ in instructions]
        counts = [e - s for _, s, e in instructions]
        # _firsts[i]: global key of file i's first record; _ends[i]: one past its last.
        self._ends = list(np.cumsum(counts, dtype=np.int64).tolist())
        self._firsts = [0] + self._ends[:-1]
        self._len = self._ends[-1]
        self._init_per_process()

    def _init_per_process(self) -> None:
        self._readers: list = [None] * len(self._paths)
        self._lock = threading.Lock()
        self._pid = os.getpid()

    def _abandon_if_forked(self) -> None:
        if self._pid != os.getpid():
            # Forked since readers were opened: abandon the inherited ones.
            _ABANDONED_READERS.extend(r for r in self._readers if r is not None)
            self._init_per_process()

    def _reader(self, file_index: int):
        self._abandon_if_forked()
        reader = self._readers[file_index]
        if reader is None:
            with self._lock:
                reader = self._readers[file_index]
                if reader is None:
                    filename = self._paths[file_index]
                    reader = open_reader(
                        filename, self._reader_options, self._remote_options,
                        self._infos.get(filename),
                    )
                    _warn_group_size(filename, reader)
                    self._readers[file_index] = reader
                    self._fetch_ahead(file_index + 1)
        return reader

    def _fetch_ahead(self, file_index: int) -> None:
        """Starts copying remote file ``file_index`` into the cache, in the background."""
        if file_index >= len(self._paths) or self._readers[file_index] is not None:
            return
        filename = self._paths[file_index]
        if not remote.is_remote(filename):
            return
        cache = cache_for(self._remote_options or remote.RemoteOptions())
        # A failure is not reported here: the read of that file will retry and raise.
        remote.submit(cache.fetch, filename, self._infos.get(filename))

    def close(self) -> None:
        """Closes the open readers. Idempotent; a later read opens them again."""
        self._abandon_if_forked()
        with self._lock:
            readers, self._readers = self._readers, [None] * len(self._paths)
        for reader in readers:
            if reader is not None:
                reader.close()

    def object_pins(self) -> dict:
        """``{url: pin}`` of the remote files, at the versions read (empty if all are local)."""
        return {f: remote_pins.pin_state(self._infos[f]) for f in self._paths if f in self._infos}

    def at_versions(self, pins: dict) -> "ArrayRecordDataSource":
        """A copy reading the remote files at the versions ``pins`` names (``PinsRemoteObjects``).

        Also raises ``InvalidStateError`` if a saved version holds fewer records than this source reads.
        """
        saved = remote_pins.pins_from_state(self.object_pins(), pins, repr(self))
        changed = {f: pin for f, pin in saved.items() if not remote_pins.same_version(pin, self._infos[f])}
        if not changed:
            return self
        for file_index, filename in enumerate(self._paths):
            pin = changed.get(filename)
            if pin is None:
                continue
            try:
                count = _count_records(filename, self._remote_options, pin)
            except (remote.ObjectChangedError, FileNotFoundError) as e:
                raise remote_pins.saved_version_gone(filename, pin, self._infos[filename]) from e
            needed = self._starts[file_index] + self._ends[file_index] - self._firsts[file_index]
            if count < needed:
                raise InvalidStateError(
                    f"the state was saved on version {pin['version']} of {filename!r}, which has "
                    f"{count} records; this source reads {needed} from it (version "
                    f"{self._infos[filename]['version']}). Build the source on the data the "
                    "checkpoint was taken on."
                )
        copy = self._copy()
        copy._infos = {**self._infos, **changed}
        return copy

    def __len__(self) -> int:
        return self._len

    def _read_error(self, file_index: int, keys: Sequence[int], positions: Sequence[int], e):
        shown = ", ".join(map(str, list(keys)[:8])) + (", ..." if len(keys) > 8 else "")
        where = ", ".join(map(str, list(positions)[:8])) + (", ..." if len(positions) > 8 else "")
        noun = "record_key" if len(keys) == 1 else "record_keys"
        return RuntimeError(
            f"ArrayRecordDataSource: failed to read {noun} {shown} (position {where} in "
            f"file {self._paths[file_index]!r}): {e}"
        )

    def _locate(self, key: int) -> tuple[int, int]:
        """The index of the file holding global key ``key`` and the record's position in that file."""
        file_index = bisect.bisect_right(self._ends, key)
        return file_index, key - self._firsts[file_index] + self._starts[file_index]

    def __getitem__(self, record_key: SupportsIndex) -> bytes:
        key = self._check_key(record_key)
        file_index, position = self._locate(key)
        reader = self._reader(file_index)
        try:
            return reader.read([position])[0]
        except Exception as e:
            raise self._read_error(file_index, [key], [position], e) from e

    def __getitems__(self, record_keys: Sequence[SupportsIndex]) -> list:
        """Reads ``[self[k] for k in record_keys]`` with one batched read per file."""
        keys = check_keys(record_keys, self._len, self._out_of_range)
        if keys.size == 0:
            return []
        if len(self._paths) == 1:
            return self._read_file(0, keys, keys + self._starts[0])
        file_indices = np.searchsorted(np.asarray(self._ends, np.int64), keys, side="right")
        offsets = np.asarray(self._starts, np.int64) - np.asarray(self._firsts, np.int64)
        positions = keys + offsets[file_indices]
        out: list = [None] * len(keys)
        for group in group_by(file_indices):
            file_index = int(file_indices[group[0]])
            records = self._read_file(file_index, keys[group], positions[group])
            for i, record in zip(group.tolist(), records):
                out[i] = record
        return out

    def _read_file(self, file_index: int, keys: np.ndarray, positions: np.ndarray) -> list:
        reader = self._reader(file_index)
        try:
            return reader.read(positions.tolist())
        except Exception as e:
            # Name the first key that fails on its own, not the whole batch.
            for key, position in zip(keys.tolist(), positions.tolist()):
                try:
                    reader.read([position])
                except Exception as single:
                    raise self._read_error(file_index, [key], [position], single) from single
            raise self._read_error(file_index, keys.tolist(), positions.tolist(), e) from e

    def __repr__(self) -> str:
        # Only the file names enter the hash (not skip/take), exactly as in Grain.
        return f"ArrayRecordDataSource(hash_of_paths={self._hash_of_paths()})"
