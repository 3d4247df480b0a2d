"""``HuggingFaceDataSource``: a Hugging Face ``datasets.Dataset`` as a random-access source.

Records come out as dicts of numpy values (the dataset's ``"numpy"`` format:
images decoded to arrays, class labels as integers). A batched read indexes the
dataset once per chunk of keys (``dataset[keys]``), not once per record, which
is what makes Arrow-backed datasets fast.

Workers: a dataset loaded from files (``load_dataset``, ``load_from_disk``,
``Dataset.from_parquet``, ...) is memory-mapped Arrow, and pickles as the names
of its files, so each worker maps the same pages. A dataset built in memory
(``Dataset.from_dict``) would pickle its whole table into every worker: the
first time the source is pickled it is written once to a temporary directory
owned by the source (removed by ``close()`` or at exit) and reloaded
memory-mapped from there. ``datasets`` is imported only by the user's dataset
itself: ``pip install "grainlike[hf]"``.
"""

from __future__ import annotations

import operator
import os
import shutil
import tempfile
import threading
import weakref
from collections.abc import Sequence
from typing import Any, Optional, SupportsIndex

import numpy as np

from grainlike.sources.keys import check_keys
from grainlike.sources.protocol import ClosingSource

__all__ = ["HuggingFaceDataSource"]


def _remove_tree(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)


class HuggingFaceDataSource(ClosingSource):
    """Reads rows of a ``datasets.Dataset`` by index, as dicts of numpy values.

    Args:
      dataset: a ``datasets.Dataset`` (one split; for a ``DatasetDict`` pick one:
        ``dataset["train"]``).
      columns: the columns to read (all when None).

    Raises:
      TypeError: ``dataset`` is not a ``datasets.Dataset`` (a ``DatasetDict`` or an
        ``IterableDataset`` have no random access).
      ValueError: a column is not in the dataset.

    Example:
        import datasets
        mnist = datasets.load_dataset("parquet", data_files="mnist.parquet", split="train")
        source = HuggingFaceDataSource(mnist)
        source[0]  # {"image": uint8 array (28, 28), "label": np.int64}
        source.__getitems__([5, 1, 5])  # one dataset[[5, 1, 5]] call
    """

    def __init__(self, dataset: Any, columns: Optional[Sequence[str]] = None):
        kind = type(dataset)
        if kind.__module__.split(".")[0] != "datasets" or kind.__name__ != "Dataset":
            hint = " (pick a split: dataset['train'])" if kind.__name__ == "DatasetDict" else ""
            raise TypeError(
                f"HuggingFaceDataSource needs a datasets.Dataset, got {kind.__module__}."
                f"{kind.__name__}{hint}"
            )
        self._columns = None if columns is None else list(columns)
        if self._columns is not None:
            missing = [c for c in self._columns if c not in dataset.column_names]
            if missing:
                raise ValueError(
                    f"HuggingFaceDataSource: columns {missing} are not in the dataset "
                    f"(it has {dataset.column_names})"
                )
        self._dataset = dataset
        # Taken now: the copy made for workers has a fingerprint of its own.
        self._fingerprint = dataset._fingerprint
        self._spill_dir: Optional[str] = None
        self._finalizer: Optional[weakref.finalize] = None
        self._lock = threading.Lock()
        self._formatted = None

    def _view(self) -> Any:
        """The dataset in numpy format with the selected columns (built once per process)."""
        view = self._formatted
        if view is None:
            view = self._dataset.with_format("numpy", columns=self._columns)
            self._formatted = view
        return view

    # -- pickling ------------------------------------------------------------------

    def _in_memory(self) -> bool:
        return not self._dataset.cache_files

    def _spill(self) -> None:
        """Moves an in-memory dataset to a memory-mapped copy on disk, once."""
        with self._lock:
            if not self._in_memory():
                return
            import datasets  # pylint: disable=g-import-not-at-top  # the user's dataset has it loaded

            directory = tempfile.mkdtemp(prefix="grainlike-hf-")
            self._finalizer = weakref.finalize(self, _remove_tree, directory)
            self._spill_dir = directory
            self._dataset.flatten_indices().save_to_disk(directory)
            self._dataset = datasets.load_from_disk(directory)
            self._formatted = None

    def __getstate__(self) -> dict:
        if self._in_memory():
            self._spill()
        return {k: v for k, v in self.__dict__.items() if k not in ("_lock", "_formatted", "_finalizer", "_spill_dir")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
        self._formatted = None
        self._finalizer = None
        self._spill_dir = None

    def close(self) -> None:
        """Removes the on-disk copy made for workers, if any (idempotent).

        Only the source that made it removes it; call this when no worker reads it.
        """
        if self._finalizer is not None:
            self._finalizer()


    # -- reading -------------------------------------------------------------------

    # A datasets.Dataset is local Arrow (memory-mapped files, or memory): read in
    # the calling thread by default (grainlike.sources.waiting).
    waits = False

    def __len__(self) -> int:
        return len(self._dataset)

    def _out_of_range(self, key: int) -> IndexError:
        return IndexError(f"record_key {key} is out of range for HuggingFaceDataSource of length {len(self)}")

    def __getitem__(self, record_key: SupportsIndex) -> dict:
        key = operator.index(record_key)
        if key < 0 or key >= len(self):
            raise self._out_of_range(key)
        return self.__getitems__([key])[0]

    def __getitems__(self, record_keys: Sequence[SupportsIndex]) -> list:
        """Reads ``[self[k] for k in record_keys]`` with one ``dataset[keys]`` call."""
        keys = check_keys(record_keys, len(self), self._out_of_range)
        if keys.size == 0:
            return []
        columns = self._view()[keys.tolist()]
        names = list(columns)
        values = [columns[n] for n in names]
        return [{n: v[i] for n, v in zip(names, values)} for i in range(len(keys))]

    def __iter__(self):
        for start in range(0, len(self), 1024):
            yield from self.__getitems__(range(start, min(start + 1024, len(self))))

    # -- identity ------------------------------------------------------------------

    @property
    def dataset(self) -> Any:
        """The wrapped ``datasets.Dataset``."""
        return self._dataset

    def __repr__(self) -> str:
        # The dataset's fingerprint names its content and every transform applied to
        # it (it is how datasets names its own cache files): stable across runs.
        return (
            f"HuggingFaceDataSource(fingerprint={self._fingerprint}, "
            f"len={len(self._dataset)}, columns={self._columns!r})"
        )
