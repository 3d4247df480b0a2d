"""``HuggingFaceDataSource``: a Hugging Face ``datasets.Dataset`` as a random-access source.

A dataset loaded from files is memory-mapped Arrow and pickles as the names of its
files, so each worker maps the same pages. A dataset built in memory
(``Dataset.from_dict``) would pickle its whole table into every worker: the first
time the source is pickled it is written once to a temporary directory owned by
the source (removed by ``close()`` or at exit) and reloaded memory-mapped from there.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import weakref
from collections.abc import Sequence
from typing import Any, Optional, SupportsIndex

from grainlike.sources.keys import check_keys
from grainlike.sources.protocol import ClosingSource

__all__ = ["HuggingFaceDataSource"]


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

    _per_process = ("_lock", "_formatted", "_finalizer")

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
        self._init_per_process()

    def _init_per_process(self) -> None:
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

    def _spill(self) -> None:
        """Moves an in-memory dataset (one without cache files) to a memory-mapped copy on disk, once."""
        with self._lock:
            if self._dataset.cache_files:
                return
            import datasets  # pylint: disable=g-import-not-at-top  # the user's dataset has it loaded

            directory = tempfile.mkdtemp(prefix="grainlike-hf-")
            self._finalizer = weakref.finalize(self, shutil.rmtree, directory, ignore_errors=True)
            self._dataset.flatten_indices().save_to_disk(directory)
            self._dataset = datasets.load_from_disk(directory)
            self._formatted = None

    def __getstate__(self) -> dict:
        self._spill()
        return super().__getstate__()

    def close(self) -> None:
        """Removes the on-disk copy made for workers, if any (idempotent).

        Only the source that made it removes it; call this when no worker reads it.
        """
        if self._finalizer is not None:
            self._finalizer()

    # A datasets.Dataset is local Arrow (memory-mapped files, or memory): read in
    # the calling thread by default (grainlike.sources.waiting).
    waits = False

    def __len__(self) -> int:
        return len(self._dataset)

    def __getitem__(self, record_key: SupportsIndex) -> dict:
        return self.__getitems__([self._check_key(record_key)])[0]

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
