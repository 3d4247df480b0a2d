"""``ParquetDataSource``: random access to the rows of Parquet files.

A batched read reads each row group it touches once (only the selected columns)
and takes the rows it needs before converting them to numpy. The last few row
groups read stay decoded, so reads in order, or shuffled within a window, read
each row group once. Files are opened lazily, in the process that reads.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Sequence
from concurrent import futures
from typing import Any, Optional, SupportsIndex

import numpy as np

from grainlike.core.errors import add_note
from grainlike.sources.formats import remote_files as remote
from grainlike.sources.formats import remote_pins
from grainlike.sources.formats.parquet_files import columns_to_numpy, open_parquet
from grainlike.sources.keys import check_keys, group_by
from grainlike.sources.protocol import FileSource

__all__ = ["ParquetDataSource", "columns_to_numpy"]

_MAX_OPENING_THREADS = 64


class ParquetDataSource(FileSource):
    """Reads rows of Parquet files as dicts of numpy values, by global row number.

    Args:
      paths: a path or URL (``str``, ``os.PathLike``, ``epath.Path``) or a sequence
        of them.
      columns: the columns to read (all when None); a record has these keys.
      remote_options: how remote files are reached (credentials, retries,
        read-ahead, a local cache); see ``grainlike.sources.formats.remote_files.RemoteOptions``.
      cached_row_groups: how many decoded row groups each process keeps.
      **read_kwargs: passed to ``pyarrow.parquet.ParquetFile`` (as grain's
        ``ParquetIterDataset`` passes them).

    Raises:
      FileNotFoundError: a file does not exist (named in the message).
      ValueError: ``paths`` is empty; a file is not Parquet; a column is missing.

    Example:
        source = ParquetDataSource(["train-0.parquet", "train-1.parquet"], columns=["text"])
        source[5]  # {"text": "..."}
        source.__getitems__([9, 2, 9])  # each row group touched is read once
        repr(source)  # "ParquetDataSource(hash_of_paths=<sha1>, columns=['text'])"
    """

    _per_process = ("_files", "_tables", "_lock", "_pid")

    def __init__(
        self,
        paths: Any,
        columns: Optional[Sequence[str]] = None,
        *,
        remote_options: Optional[remote.RemoteOptions] = None,
        cached_row_groups: int = 4,
        **read_kwargs: Any,
    ):
        if isinstance(paths, (str, bytes, os.PathLike)):
            paths = [paths]
        paths = [remote.to_url(p) for p in paths]
        if not paths:
            raise ValueError("ParquetDataSource: the list of paths is empty.")
        if cached_row_groups < 1:
            raise ValueError(f"ParquetDataSource: cached_row_groups must be >= 1, got {cached_row_groups}")
        self._paths = paths
        self._columns = None if columns is None else list(columns)
        self._options = remote_options or remote.RemoteOptions()
        self._cached_row_groups = cached_row_groups
        self._read_kwargs = read_kwargs
        # Each remote file is pinned to the version seen here, in every process
        # that reads it: a file overwritten during an epoch raises
        # ObjectChangedError instead of mixing rows of two versions.
        self._pins = [remote.object_info(p, self._options) if remote.is_remote(p) else None for p in paths]
        self._lay_out()
        self._init_per_process()

    def _lay_out(self) -> None:
        """Reads every file's row group sizes (of the pinned versions)."""
        with futures.ThreadPoolExecutor(min(len(self._paths), _MAX_OPENING_THREADS)) as pool:
            metas = list(pool.map(self._row_group_sizes, range(len(self._paths))))
        # One entry per row group of every file: (file index, row group index), and
        # _ends[g]: one past the global key of row group g's last row.
        self._groups = [(f, g) for f, sizes in enumerate(metas) for g in range(len(sizes))]
        sizes = [n for s in metas for n in s]
        self._ends = np.cumsum(np.asarray(sizes, dtype=np.int64)).astype(np.int64)
        self._firsts = self._ends - np.asarray(sizes, dtype=np.int64)
        self._len = int(self._ends[-1]) if len(self._ends) else 0

    def _row_group_sizes(self, file_index: int) -> list:
        path = self._paths[file_index]
        pf = open_parquet(path, self._options, self._read_kwargs, self._pins[file_index])
        try:
            if self._columns is not None:
                names = set(pf.schema_arrow.names)
                missing = [c for c in self._columns if c not in names]
                if missing:
                    raise ValueError(
                        f"ParquetDataSource: columns {missing} are not in {path!r} "
                        f"(it has {sorted(names)})"
                    )
            meta = pf.metadata
            return [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
        finally:
            pf.close()

    def _init_per_process(self) -> None:
        # Idle open files, per file index: a reading thread takes one (or opens one)
        # and puts it back, so threads read in parallel and no handle is shared.
        self._files: dict = {}
        self._tables: OrderedDict = OrderedDict()
        self._lock = threading.Lock()
        self._pid = os.getpid()

    def _state(self) -> None:
        if self._pid != os.getpid():
            self._init_per_process()

    def _read_row_group(self, file_index: int, row_group: int) -> Any:
        with self._lock:
            idle = self._files.get(file_index)
            pf = idle.pop() if idle else None
        if pf is None:
            pf = open_parquet(
                self._paths[file_index], self._options, self._read_kwargs, self._pins[file_index]
            )
        try:
            return pf.read_row_group(row_group, columns=self._columns)
        finally:
            with self._lock:
                self._files.setdefault(file_index, []).append(pf)

    def _row_group(self, group: int) -> Any:
        """The Arrow table of row group ``group`` (global numbering), cached."""
        with self._lock:
            table = self._tables.get(group)
            if table is not None:
                self._tables.move_to_end(group)
                return table
        table = self._read_row_group(*self._groups[group])
        with self._lock:
            self._tables[group] = table
            while len(self._tables) > self._cached_row_groups:
                self._tables.popitem(last=False)
        return table

    def close(self) -> None:
        """Closes idle open files and drops cached row groups; a later read reopens them."""
        self._state()
        with self._lock:
            files, self._files = self._files, {}
            self._tables.clear()
        for idle in files.values():
            for pf in idle:
                pf.close()

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, record_key: SupportsIndex) -> dict:
        return self.__getitems__([self._check_key(record_key)])[0]

    def __getitems__(self, record_keys: Sequence[SupportsIndex]) -> list:
        """Reads ``[self[k] for k in record_keys]``, each row group touched once."""
        self._state()
        keys = check_keys(record_keys, self._len, self._out_of_range)
        if keys.size == 0:
            return []
        groups = np.searchsorted(self._ends, keys, side="right")
        rows = keys - self._firsts[groups]
        out: list = [None] * len(keys)
        for members in group_by(groups):
            group = int(groups[members[0]])
            try:
                table = self._row_group(group)
                columns = columns_to_numpy(table.take(rows[members]))
            except Exception as e:
                file_index, row_group = self._groups[group]
                shown = keys[members][:8].tolist()
                add_note(
                    e,
                    f"ParquetDataSource: while reading record_keys {shown}"
                    f"{'...' if len(members) > 8 else ''} (row group {row_group} of "
                    f"{self._paths[file_index]!r})"
                )
                raise
            names = list(columns)
            values = [columns[n] for n in names]
            for j, i in enumerate(members.tolist()):
                out[i] = {n: v[j] for n, v in zip(names, values)}
        return out

    def __iter__(self):
        for start in range(0, self._len, 1024):
            yield from self.__getitems__(range(start, min(start + 1024, self._len)))

    def object_pins(self) -> dict:
        """``{url: pin}`` of the remote files, at the versions read (empty if all are local)."""
        return {p: remote_pins.pin_state(pin) for p, pin in zip(self._paths, self._pins) if pin is not None}

    def at_versions(self, pins: dict) -> "ParquetDataSource":
        """A copy reading the remote files at the versions ``pins`` names (``PinsRemoteObjects``)."""
        saved = remote_pins.pins_from_state(self.object_pins(), pins, repr(self))
        if all(remote_pins.same_version(saved[p], pin) for p, pin in zip(self._paths, self._pins) if pin is not None):
            return self
        copy = self._copy()
        copy._pins = [saved.get(p, pin) for p, pin in zip(self._paths, self._pins)]
        try:
            copy._lay_out()
        except (remote.ObjectChangedError, FileNotFoundError) as e:
            for path, old, new in zip(self._paths, copy._pins, self._pins):
                if new is not None and not remote_pins.same_version(old, new):
                    raise remote_pins.saved_version_gone(path, old, new) from e
            raise
        return copy

    def __repr__(self) -> str:
        return f"ParquetDataSource(hash_of_paths={self._hash_of_paths()}, columns={self._columns!r})"

