"""``TfDataIterDataset``: a ``tf.data.Dataset`` read as a stream of numpy elements.

The iterator yields what ``dataset.as_numpy_iterator()`` yields. Its state is
``{"elements_consumed": n}``; tf.data has no random access, so a restore reads
``dataset.skip(n)`` (TensorFlow still computes the skipped elements), exact only
when the pipeline yields the same elements on every iteration (no unseeded random
ops; ``shuffle(..., seed=s, reshuffle_each_iteration=False)``). For finite data
that fits in memory, ``grainlike.sources.TfDataSource`` gives random access.
With workers, worker ``w`` of ``W`` builds the dataset itself and reads
``dataset.shard(W, w)`` (with ``sequential_slice=True``, its contiguous part).
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, Optional, Union

from grainlike.dataset.nodes.iter_dataset import IterDataset
from grainlike.dataset.nodes.iterator import DatasetIterator
from grainlike.dataset.nodes.state import non_negative_int, require_keys
from grainlike.sources.tf_data import is_tf_dataset

__all__ = ["TfDataIterDataset"]


class _TfDataDatasetIterator(DatasetIterator):
    """Reads one ``as_numpy_iterator()``; the state counts the elements it returned."""

    def __init__(self, parent: "TfDataIterDataset"):
        super().__init__()
        self._dataset = parent._sliced_dataset()
        self._name = str(parent)
        self._consumed = 0
        self._iterator: Optional[Iterator[Any]] = None

    def __next__(self) -> Any:
        self._assert_not_closed()
        if self._iterator is None:
            # Built at the first next(): a set_state just after creation costs nothing.
            dataset = self._dataset.skip(self._consumed) if self._consumed else self._dataset
            self._iterator = dataset.as_numpy_iterator()
        element = next(self._iterator)
        self._consumed += 1
        return element

    def get_state(self) -> dict:
        return {"elements_consumed": self._consumed}

    def set_state(self, state: dict) -> None:
        require_keys(state, self, ("elements_consumed",))
        self._consumed = non_negative_int(state, "elements_consumed", self)
        self._iterator = None

    def _close(self) -> None:
        super()._close()
        self._iterator = None

    def __str__(self) -> str:
        return f"TfDataDatasetIterator({self._name})"


class TfDataIterDataset(IterDataset):
    """The elements of a ``tf.data.Dataset``, as numpy, with a checkpointable position.

    Args:
      dataset: a ``tf.data.Dataset``, or a function of no arguments that builds
        one (needed with workers: it is sent to each worker and called there).

    Raises:
      TypeError: ``dataset`` is neither (when built, or, for a function, when it
        returns something else); pickling one built from a dataset object.

    Example:
      def make_pipeline():
          ds = tf.data.Dataset.from_tensor_slices({"x": xs, "y": ys})
          return ds.map(parse).shuffle(1000, seed=0, reshuffle_each_iteration=False)

      ds = TfDataIterDataset(make_pipeline).batch(32).mp_prefetch()
      it = iter(ds)
      batch = next(it)
      state = it.get_state()   # the elements each worker consumed
    """

    def __init__(self, dataset: Union[Any, Callable[[], Any]]):
        super().__init__()
        if is_tf_dataset(dataset):
            self._dataset, self._make = dataset, None
        elif callable(dataset):
            self._dataset, self._make = None, dataset
        else:
            raise TypeError(
                "TfDataIterDataset takes a tf.data.Dataset or a function that returns one, got "
                f"{type(dataset).__name__}: {dataset!r:.100}"
            )
        self._slice: Optional[tuple[slice, bool]] = None

    def _built(self) -> Any:
        if self._make is None:
            return self._dataset
        value = self._make()
        if not is_tf_dataset(value):
            raise TypeError(
                f"TfDataIterDataset: the result of {getattr(self._make, '__name__', self._make)}() must be a "
                f"tf.data.Dataset, got {type(value).__name__}: {value!r:.100}"
            )
        return value

    def _sliced_dataset(self) -> Any:
        dataset = self._built()
        if self._slice is None:
            return dataset
        sl, sequential = self._slice
        if not sequential:
            return dataset.shard(sl.step, sl.start)
        from grainlike.dataset.nodes.worker_slice import sequential_range  # Only for sequential slices.

        count = int(dataset.cardinality())
        if count < 0:
            raise ValueError(
                f"{self}: sequential_slice=True needs the number of elements, and this dataset's "
                f"cardinality() is {'infinite' if count == -1 else 'unknown'}; use "
                "sequential_slice=False (each worker reads dataset.shard(W, w))"
            )
        start, end = sequential_range(count, sl, self)
        return dataset.skip(start).take(end - start)

    def set_slice(self, sl: slice, sequential_slice: bool = False) -> None:
        """Keeps worker ``sl.start`` of ``sl.step``'s share (``mp_prefetch`` calls it on a worker's copy)."""
        if self._slice is not None:
            raise ValueError(f"{self} is sliced already ({self._slice[0]}); slice the original dataset")
        self._slice = (sl, sequential_slice)

    def __iter__(self) -> DatasetIterator:
        return _TfDataDatasetIterator(self)

    def __copy__(self) -> "TfDataIterDataset":
        # Threads (multithread_prefetch) copy stages without pickling: a dataset object is fine there.
        out = object.__new__(type(self))
        out.__dict__.update(self.__dict__)
        return out

    def __getstate__(self) -> dict:
        if self._make is None:
            raise TypeError(
                "TfDataIterDataset over a tf.data.Dataset object cannot be sent to worker processes "
                "(tf.data datasets do not pickle): pass a function that builds the dataset, "
                "TfDataIterDataset(make_pipeline), and each worker calls it"
            )
        return self.__dict__.copy()

    def __str__(self) -> str:
        what = type(self._dataset).__name__ if self._make is None else getattr(self._make, "__qualname__", "function")
        where = "" if self._slice is None else f", slice={self._slice[0]}"
        return f"TfDataIterDataset({what}{where})"
