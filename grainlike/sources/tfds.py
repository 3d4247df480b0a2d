"""TensorFlow Datasets splits as grainlike sources.

``tfds.data_source(...)`` works with the loader as it is; ``TfdsDataSource`` reads
the same split faster and more safely: through grainlike's ``ArrayRecordDataSource``
(batched reads, readers opened in the process that reads), with TFDS's own ``repr``
(so checkpoints move between the two), and decoding errors that name the key, split
and file. TFDS is imported only where needed (and by unpickling a source in a
worker); TensorFlow is never needed to read.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, Optional, SupportsIndex

from grainlike.core.errors import add_note
from grainlike.sources.array_record import ArrayRecordDataSource
from grainlike.sources.protocol import ClosingSource

__all__ = ["TfdsDataSource", "from_tfds", "is_tfds_source", "tfds_source"]

# How TFDS names its sources' modules; checked by name so that recognising a
# TFDS source never imports TFDS.
_TFDS_MODULE_PREFIX = "tensorflow_datasets."


def is_tfds_source(obj: Any) -> bool:
    """Whether ``obj`` is a source returned by ``tfds.data_source`` (any format); does not import TFDS."""
    module = type(obj).__module__ or ""
    return module.startswith(_TFDS_MODULE_PREFIX) and hasattr(obj, "dataset_info")


def _is_tfds_array_record_source(obj: Any) -> bool:
    return is_tfds_source(obj) and type(obj).__name__ == "ArrayRecordDataSource"


class TfdsDataSource(ClosingSource):
    """One split of a TFDS dataset stored as ArrayRecord, decoded like TFDS.

    Returns exactly the records of the TFDS source it is built from
    (``source[k] == tfds_src[k]``), and has the same ``len`` and ``repr``, so
    checkpoints are interchangeable with Grain's over ``tfds.data_source``.

    Args:
      source: the result of ``tfds.data_source(name, split=...)`` or
        ``builder.as_data_source(split=...)`` for one split, of a dataset built
        with ``file_format="array_record"``.

    Raises:
      TypeError: ``source`` is not a TFDS ArrayRecord source (a dict of splits,
        a Parquet source or anything else); the message says what was given.

    Example:
        import tensorflow_datasets as tfds
        raw = tfds.data_source("mnist", split="train[:10%]")
        source = TfdsDataSource(raw)
        repr(source)  # "ArrayRecordDataSource(name=mnist, split='train[:10%]', decoders=None)"
        source.__getitems__([3, 1, 4])  # three decoded examples, one read
    """

    def __init__(self, source: Any):
        if isinstance(source, dict):
            raise TypeError(
                "TfdsDataSource takes the source of one split; got a dict of splits "
                f"{sorted(map(str, source))}. Pass split='train' (or another split) to "
                "tfds.data_source, or wrap each value."
            )
        if not _is_tfds_array_record_source(source):
            raise TypeError(
                "TfdsDataSource needs a TFDS ArrayRecord source (tfds.data_source(...) "
                "of a dataset built with file_format='array_record'); got "
                f"{type(source).__module__}.{type(source).__qualname__}: {source!r:.200}"
            )
        self.dataset_info = source.dataset_info
        self.split = source.split
        self.decoders = source.decoders
        self.deserialize_method = source.deserialize_method
        # TFDS's own repr formula (it maps decoders to their types through
        # dm-tree); taken verbatim so a checkpoint's source name matches Grain's.
        self._repr = repr(source)
        instructions = self.dataset_info.splits[self.split].file_instructions
        if not instructions:
            raise ValueError(f"{self._repr}: split {self.split!r} selects no files.")
        self._records = ArrayRecordDataSource(list(instructions))
        # Checked once here rather than per record: an unknown method would fail
        # every read the same way.
        self._method = getattr(self.deserialize_method, "name", str(self.deserialize_method))
        if self._method not in ("RAW_BYTES", "DESERIALIZE_NO_DECODE", "DESERIALIZE_AND_DECODE"):
            raise ValueError(
                f"{self._repr}: unsupported deserialize_method {self.deserialize_method!r}; "
                "expected one of tfds.decode.DeserializeMethod's RAW_BYTES, "
                "DESERIALIZE_NO_DECODE or DESERIALIZE_AND_DECODE."
            )
        if self._method == "DESERIALIZE_AND_DECODE" and self.dataset_info.features is None:
            raise ValueError(f"{self._repr}: the dataset has no features, so it cannot decode.")

    def __len__(self) -> int:
        return len(self._records)

    def _deserialize(self, record: bytes) -> Any:
        if self._method == "RAW_BYTES":
            return record
        if self._method == "DESERIALIZE_NO_DECODE":
            return self.dataset_info.file_format.deserialize(record)
        return self.dataset_info.features.deserialize_example_np(record, decoders=self.decoders)

    def _decode(self, key: int, record: bytes) -> Any:
        try:
            return self._deserialize(record)
        except Exception as e:
            add_note(e, f"grainlike: while decoding record_key {key} of {self._repr} ({self._where(key)})")
            raise

    def _where(self, key: int) -> str:
        file_index, position = self._records._locate(key)
        return f"record {position} of file {self._records._paths[file_index]!r}"

    def __getitem__(self, record_key: SupportsIndex) -> Any:
        key = record_key.__index__()
        return self._decode(key, self._records[key])

    def __getitems__(self, record_keys: Sequence[SupportsIndex]) -> list:
        """Reads ``[self[k] for k in record_keys]`` with one read per file touched."""
        records = self._records.__getitems__(record_keys)
        return [self._decode(int(k), r) for k, r in zip(record_keys, records)]

    @property
    def waits(self) -> bool:
        """Whether reads wait (a file is remote), so that they run in threads by default."""
        return self._records.waits

    @property
    def features(self) -> Any:
        """The dataset's ``tfds.features.FeaturesDict``."""
        return self.dataset_info.features

    @property
    def paths(self) -> list[str]:
        """The ArrayRecord files the split reads, in key order."""
        return self._records.paths

    def close(self) -> None:
        """Closes open file readers. Idempotent; a later read reopens them."""
        self._records.close()

    def __repr__(self) -> str:
        return self._repr


def from_tfds(source: Any) -> Any:
    """The grainlike source to hand to ``DataLoader`` for what ``tfds.data_source`` returned.

    A TFDS ArrayRecord source becomes a ``TfdsDataSource``; a dict of splits
    becomes a dict of them; any other source (Parquet, or not TFDS at all) is
    returned unchanged, since it already works with the loader. Does not import
    TFDS.
    """
    if isinstance(source, dict) and source and all(map(is_tfds_source, source.values())):
        return {split: from_tfds(s) for split, s in source.items()}
    if _is_tfds_array_record_source(source):
        return TfdsDataSource(source)
    return source


def tfds_source(
    name: str,
    split: Optional[str],
    data_dir: Optional[str | os.PathLike] = None,
    decoders: Optional[Any] = None,
    **data_source_kwargs: Any,
) -> Any:
    """Opens a prepared TFDS dataset split as a grainlike source.

    A thin wrapper over ``tfds.data_source`` followed by ``from_tfds``.

    Args:
      name: the dataset name, optionally with config and version
        (``"mnist"``, ``"imagenet2012:5.1.0"``).
      split: a split or TFDS split expression (``"train"``, ``"train[:10%]"``,
        ``"train+test"``); ``None`` gives a dict of all splits.
      data_dir: where the prepared dataset lives (TFDS's default when ``None``).
      decoders: TFDS decoders, e.g. ``{"image": tfds.decode.SkipDecoding()}``
        to get encoded image bytes and decode them in a transform instead.
      **data_source_kwargs: passed to ``tfds.data_source`` (``builder_kwargs``,
        ``download``, ``deserialize_method``, ...).

    Returns:
      A ``TfdsDataSource`` for an ArrayRecord dataset (the TFDS source itself
      for other formats), or a dict of them when ``split`` is ``None``.

    Raises:
      ImportError: ``tensorflow-datasets`` is not installed.
      tfds.core.registered.DatasetNotFoundError: no such dataset.

    Example:
        source = tfds_source("tiny_images", "train", data_dir="/tmp/tfds")
        source[0]["image"].shape  # (8, 6, 3)
    """
    try:
        import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
    except ImportError as e:
        raise ImportError(
            f"tfds_source({name!r}) needs tensorflow-datasets: pip install 'grainlike[tfds]' "
            "(TensorFlow itself is not needed to read)."
        ) from e
    if data_dir is not None:
        data_dir = os.path.expanduser(os.fspath(data_dir))
    source = tfds.data_source(name, split=split, data_dir=data_dir, decoders=decoders, **data_source_kwargs)
    return from_tfds(source)
