"""``ParquetIterDataset``: the rows of Parquet files, in order (grain's experimental one).

Each row group is read whole into numpy columns; an element is ``{column: value}``
of one row. The state is grain's ``{"row_group", "index_within_row_group"}``.
Paths may be local or ``file://``, ``s3://``, ``gs://`` URLs; ``pyarrow`` is
imported when a file is opened.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, Optional, Union

from grainlike.dataset.nodes.iter_dataset import IterDataset
from grainlike.dataset.nodes.iterator import DatasetIterator
from grainlike.sources.formats import remote_files as remote
from grainlike.sources.formats import remote_pins
from grainlike.sources.formats.parquet_files import columns_to_numpy, open_parquet

__all__ = ["ParquetIterDataset"]

_CYCLE_LENGTH = 16


class _ParquetDatasetIterator(DatasetIterator):
    """Reads one Parquet file's rows; the state counts row groups and rows in them.

    A remote file's state also pins the version read (``"object"``), so a restore
    reads the same bytes or fails clearly.
    """

    def __init__(self, path: str, options: remote.RemoteOptions, read_kwargs: dict):
        super().__init__()
        self._path = path
        self._options = options
        self._read_kwargs = read_kwargs
        self._pin = remote.object_info(path, options) if remote.is_remote(path) else None
        self._file = open_parquet(path, options, read_kwargs, self._pin)
        self._row_group = 0
        self._index = 0
        self._read_row_group()

    def _read_row_group(self) -> None:
        table = self._file.read_row_group(self._row_group)
        self._row_group_len = len(table)
        self._columns = columns_to_numpy(table)

    def __next__(self) -> dict:
        self._assert_not_closed()
        while self._index >= self._row_group_len:
            if self._row_group >= self._file.num_row_groups - 1:
                raise StopIteration
            self._row_group += 1
            self._index = 0
            self._read_row_group()
        i = self._index
        self._index += 1
        return {name: column[i] for name, column in self._columns.items()}

    def get_state(self) -> dict:
        state: dict = {"row_group": self._row_group, "index_within_row_group": self._index}
        if self._pin is not None:
            state["object"] = remote_pins.pin_state(self._pin)
        return state

    def _restore_version(self, saved: Any) -> None:
        """Reopens the file at the version a checkpoint was taken on, or says why it cannot."""
        pin = remote_pins.pin_from_state(self._path, saved)
        if remote_pins.same_version(pin, self._pin):
            return
        try:
            self._file = open_parquet(self._path, self._options, self._read_kwargs, pin)
        except (remote.ObjectChangedError, FileNotFoundError) as e:
            raise remote_pins.saved_version_gone(self._path, pin, self._pin) from e
        self._pin = pin

    def set_state(self, state: dict) -> None:
        try:
            row_group = int(state["row_group"])
            index = int(state["index_within_row_group"])
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(
                f"ParquetIterDataset state must be {{'row_group': int, 'index_within_row_group': "
                f"int}}, got {state!r}"
            ) from e
        if "object" in state and self._pin is not None:
            self._restore_version(state["object"])
        if not 0 <= row_group < max(self._file.num_row_groups, 1) or index < 0:
            raise ValueError(
                f"ParquetIterDataset state {state!r} is outside {self._path!r}, which has "
                f"{self._file.num_row_groups} row groups"
            )
        self._row_group = row_group
        self._index = index
        self._read_row_group()

    def _close(self) -> None:
        super()._close()
        self._columns = {}
        self._file.close()

    def __str__(self) -> str:
        return f"ParquetDatasetIterator(path={self._path!r})"


class ParquetIterDataset(IterDataset):
    """Iterates the rows of one or more Parquet files (``grain.experimental.ParquetIterDataset``).

    Args:
      path: a path or URL (``str``, ``os.PathLike``, ``epath.Path``) or a sequence of
        them. Several files are interleaved, at most 16 read at a time.
      remote_options: credentials, retries, read-ahead and cache for remote files
        (grainlike only; see ``grainlike.sources.formats.remote_files.RemoteOptions``).
      **read_kwargs: passed to ``pyarrow.parquet.ParquetFile``.

    Example:
        ds = ParquetIterDataset(["part-0.parquet", "part-1.parquet"])
        it = iter(ds)
        first = next(it)        # {"text": "...", "label": 3}
        state = it.get_state()  # {"row_group": 0, "index_within_row_group": 1} (one file)
    """

    def __init__(
        self,
        path: Union[str, os.PathLike, Sequence[Union[str, os.PathLike]]],
        *,
        remote_options: Optional[remote.RemoteOptions] = None,
        **read_kwargs: Any,
    ):
        super().__init__()
        if isinstance(path, (str, bytes, os.PathLike)):
            self._paths = [path]
        else:
            self._paths = list(path)
        self._remote_options = remote_options or remote.RemoteOptions()
        self._read_kwargs = read_kwargs

    def __iter__(self) -> DatasetIterator:
        if len(self._paths) == 1:
            url = self._paths[0]
            url = os.fsdecode(url) if isinstance(url, bytes) else remote.to_url(url)
            return _ParquetDatasetIterator(url, self._remote_options, self._read_kwargs)
        from grainlike.dataset.transformations.interleave import InterleaveIterDataset  # Only for several files.

        datasets = [
            ParquetIterDataset(p, remote_options=self._remote_options, **self._read_kwargs)
            for p in self._paths
        ]
        return InterleaveIterDataset(datasets, cycle_length=_CYCLE_LENGTH).__iter__()

    def set_slice(self, sl: slice, sequential_slice: bool = False) -> None:
        """Keeps the files ``paths[sl]`` (how grain shards this dataset over workers)."""
        del sequential_slice
        self._paths = self._paths[sl]

    def __str__(self) -> str:
        return f"ParquetIterDataset(paths={len(self._paths)})"
