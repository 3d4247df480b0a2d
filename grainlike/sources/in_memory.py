"""``InMemoryDataSource``: records held once in shared memory, read by every process.

Without ``name=`` the data lives in anonymous shared memory (``core.memfd``; where
``memfd_create`` is missing, a POSIX object unlinked as soon as it is opened),
written once and sealed read-only; a loader's workers get its descriptor with the
pipeline (``memfd.shipping``), a forked child inherits the mapping. With ``name=``
(grain's API) it lives in a named segment (``core.named_segments``) that pickles as
its name. Layout and record encoding: ``grainlike.sources.formats.in_memory_records``.

Attaching by name (``InMemoryDataSource(name=...)`` without elements) reads a
segment that any user of the machine could have created first under that name.
The segment is read only if it is this user's and writable by nobody else
(``core.shm_owner.check_own``, else ``UnsafeSegmentError``), and even then its
header is JSON, checked field by field (``formats.in_memory_header``): nothing read
from a segment is ever unpickled. Named segments are created 0600.

Lifetime rules:
  * The owner (the object that created the data) releases it on ``close()``,
    on ``with`` exit, when it is garbage collected, or at interpreter exit:
    it closes its descriptor (anonymous) or unlinks the name (named; only in
    the process that created it, never in a forked child).
  * Copies in other processes never unlink, and never register with
    multiprocessing's resource tracker, so their process exiting leaves the
    segment alone and prints no tracker warning.
  * Arrays returned by ``source[i]`` are read-only views of the mapping (a write in
    one worker would change what every other reads: copy before modifying). They
    keep the mapping alive while referenced, even after the source is closed, and
    hold no descriptor. ``source[i]`` on a closed source raises ``ValueError``.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import threading
import weakref
from collections.abc import Sequence
from typing import Any, Optional, SupportsIndex

import numpy as np

from grainlike.core import memfd
from grainlike.core.named_segments import (
    SegmentMapping,
    attach_untracked,
    create_reserved,
    unlink_owned,
    unlink_untracked,
)
from grainlike.sources.formats import in_memory_header
from grainlike.sources.formats.in_memory_records import (
    MAGIC,
    PICKLED_HEADER_MAGIC,
    PREFIX,
    align,
    encode_scalars,
    flatten,
    is_tree,
    make_builder,
    scalar_getter,
)
from grainlike.sources.protocol import ClosingSource

__all__ = ["InMemoryDataSource", "SharedMemoryDataSource"]


def _close_fd(fd: int) -> None:
    """Finalizer of an anonymous owner: its descriptor goes (mappings stay valid)."""
    try:
        os.close(fd)
    except OSError:
        pass


class InMemoryDataSource(ClosingSource):
    """A source whose records are held once in shared memory and shared by all workers.

    Accepts what Grain's ``SharedMemoryDataSource`` accepts (a sequence of int,
    float, bool, str, bytes and None) and also array data:

    * a numpy array of shape ``(N, ...)``: record ``i`` is ``array[i]``;
    * a dict / tuple (nested) of numpy arrays that all have the same first
      dimension ``N``: record ``i`` has the same structure, holding ``leaf[i]``.

    Array records are read-only views into the shared segment (zero copy); see the
    module docstring for the lifetime rules. Without ``name``, nothing appears in
    ``/dev/shm`` (so its size is no limit) and nothing outlives the processes;
    pickling the source anywhere but to a loader's workers (to a file, to a spawned
    ``multiprocessing`` child) pickles the data by value.

    ``repr`` (stored in checkpoints): for a scalar sequence created with
    ``name=`` it equals Grain's, ``SharedMemoryDataSource([...], name='...')``.
    Otherwise Grain's repr would embed a random segment name, so ours is
    ``SharedMemoryDataSource(len=N, sha1=<hash of the contents>)``: deterministic,
    short, and equal exactly when the data is.

    Args:
      elements: the records, as described above. May be omitted when ``name``
        names an existing segment created by another ``InMemoryDataSource``
        (the new object then attaches to it without owning it).
      name: the name of a POSIX shared-memory segment to create in
        ``/dev/shm`` (so that other processes can attach to it by name) or,
        without ``elements``, to attach to. Default: anonymous memory.

    Raises:
      ValueError: neither ``elements`` nor ``name`` is given; array leaves of
        different lengths; a 0-d array.
      TypeError: an element of a type that cannot be stored; with ``name``, also
        a dict key or container class that the segment's header cannot name
        (keys: str, int, float, bool, None, bytes, tuples of them; classes:
        defined at module level).
      FileExistsError: ``name`` is taken by an existing segment.
      UnsafeSegmentError (a PermissionError): attaching to ``name``, the segment
        is another user's or writable by group or others; nothing of it is read.
      SharedMemoryFullError (an OSError, ENOSPC): with ``name``, ``/dev/shm``
        has too little free space for the data; raised before anything is
        written.

    Example:
        images = np.zeros((1000, 28, 28), np.uint8)
        labels = np.arange(1000)
        with InMemoryDataSource({"image": images, "label": labels}) as source:
            record = source[3]  # {"image": view (28, 28), "label": np.int64(3)}
    """

    def __init__(self, elements: Any = None, *, name: Optional[str] = None):
        self._init_fields(name, None, None)
        if elements is None:
            if name is None:
                raise ValueError("Elements or name must be provided.")
            self._load()  # Reads the description from the segment's header.
            return
        self._meta, leaves = self._describe(elements)
        self._write(leaves, name)

    def _init_fields(self, name: Optional[str], meta: Optional[dict], digest: Optional[str]) -> None:
        self._lock = threading.Lock()
        self._getter = None
        self._leaves = None
        self._closed = False
        self._digest = digest
        self._repr = None
        self._finalizer = None
        self._name = name
        self._meta = meta
        # Anonymous memory: the token naming it in worker shipments, the
        # owner's descriptor (None in a copy), and the mapping.
        self._token: Optional[str] = None
        self._fd: Optional[int] = None
        self._mapping: Any = None

    @staticmethod
    def _describe(elements: Any) -> tuple[dict, list[np.ndarray]]:
        if isinstance(elements, np.ndarray):
            if elements.ndim == 0:
                raise ValueError(
                    f"InMemoryDataSource: a 0-d array ({elements!r}) has no records; "
                    "pass an array of shape (num_records, ...)."
                )
            if elements.dtype.hasobject:
                raise TypeError(
                    f"InMemoryDataSource: arrays of dtype {elements.dtype} cannot be placed "
                    "in shared memory."
                )
            return {"kind": "array", "len": len(elements), "treedef": ("leaf", 0)}, [elements]
        if is_tree(elements):
            named: list = []
            treedef = flatten(elements, named, "")
            if not named:
                raise ValueError(f"InMemoryDataSource: {type(elements).__name__} holds no arrays.")
            lengths = {path: len(a) for path, a in named}
            if len(set(lengths.values())) != 1:
                raise ValueError(
                    "InMemoryDataSource: all arrays need the same first dimension (the "
                    "number of records); got "
                    + ", ".join(f"{path}: {n}" for path, n in lengths.items())
                    + "."
                )
            meta = {"kind": "tree", "len": len(named[0][1]), "treedef": treedef}
            return meta, [a for _, a in named]
        sized = hasattr(elements, "__len__") and hasattr(elements, "__iter__")
        if isinstance(elements, (str, bytes)) or not sized:
            raise TypeError(
                "InMemoryDataSource: elements must be a sequence of int/float/bool/str/"
                "bytes/None, a numpy array, or a dict/tuple of numpy arrays; got "
                f"{type(elements).__name__}."
            )
        if not isinstance(elements, Sequence):
            elements = list(elements)
        return {"kind": "scalars", "len": len(elements), "treedef": None}, encode_scalars(elements)

    def _write(self, leaves: list[np.ndarray], name: Optional[str]) -> None:
        layout = []
        offset = 0
        for leaf in leaves:
            layout.append((offset, leaf.shape, leaf.dtype))
            offset = align(offset + leaf.nbytes)
        self._meta["leaves"] = layout
        header = in_memory_header.encode(self._meta, named=name is not None)
        data_start = align(PREFIX.size + len(header))
        self._meta["data_start"] = data_start
        size = data_start + max(offset, 1)

        def fill(raw: np.ndarray) -> None:
            raw[: PREFIX.size] = np.frombuffer(PREFIX.pack(MAGIC, len(header)), np.uint8)
            raw[PREFIX.size : PREFIX.size + len(header)] = np.frombuffer(header, np.uint8)
            for leaf, (off, shape, dtype) in zip(leaves, layout):
                start = data_start + off
                dst = raw[start : start + leaf.nbytes].view(dtype).reshape(shape)
                np.copyto(dst, leaf, casting="no")

        if name is None:
            self._own_anonymous(size, fill)
            return
        shm = create_reserved(name, size, f"InMemoryDataSource of {self._meta['len']} records")
        try:
            raw = np.frombuffer(shm.buf, np.uint8)
            fill(raw)
            del raw  # Drop the buffer export before the mapping takes over.
        except BaseException:
            shm.close()
            shm.unlink()
            raise
        self._name = shm.name
        self._finalizer = weakref.finalize(self, unlink_owned, shm, os.getpid())
        self._bind(SegmentMapping(shm))

    def _own_anonymous(self, size: int, fill: Any) -> None:
        """Creates the anonymous segment that this object owns, written by ``fill``."""
        if not memfd.available():
            import errno

            raise OSError(
                errno.ENOSYS,
                "InMemoryDataSource without name= keeps its data in anonymous shared memory "
                "(memfd_create on Linux, an unlinked POSIX shared-memory object elsewhere), "
                "which this platform lacks; pass name='<a segment "
                "name>' to use a named POSIX shared-memory segment instead.",
            )
        fd, region = memfd.sealed_segment(size, fill, "grainlike-source")
        self._fd = fd
        self._token = secrets.token_hex(8)
        self._finalizer = weakref.finalize(self, _close_fd, fd)
        _mappings[self._token] = region
        self._bind(region)

    def _bind(self, mapping: Any) -> None:
        """Builds the record getter over ``mapping`` (a ``SegmentMapping`` or a ``memfd.Region``; views only)."""
        meta = self._meta
        root = np.asarray(mapping)  # .base is `mapping`: views keep the mapping alive.
        base = meta["data_start"]
        leaves = []
        for off, shape, dtype in meta["leaves"]:
            dtype = np.dtype(dtype)
            count = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
            leaves.append(root[base + off : base + off + count].view(dtype).reshape(shape))
        if meta["kind"] == "scalars":
            self._getter = scalar_getter(leaves, meta["len"])
        else:
            self._getter = make_builder(meta["treedef"], leaves)
        self._leaves = leaves
        self._mapping = mapping

    def _load(self):
        """Attaches to the named segment (first read in this process); returns the getter."""
        with self._lock:
            if self._closed:
                raise ValueError(
                    f"{self} is closed; arrays read before close() stay valid, but no "
                    "new records can be read."
                )
            if self._getter is not None:
                return self._getter
            try:
                # Refuses another user's segment before reading a byte of it.
                shm = attach_untracked(self._name, "InMemoryDataSource: shared-memory segment")
            except FileNotFoundError:
                raise FileNotFoundError(
                    f"InMemoryDataSource: shared-memory segment {self._name!r} does not "
                    "exist (was the source that created it closed or garbage collected, "
                    "or its process ended?)."
                ) from None
            mapping = SegmentMapping(shm)
            root = np.asarray(mapping)
            if len(root) < PREFIX.size:
                magic, size = b"", 0
            else:
                magic, size = PREFIX.unpack(root[: PREFIX.size].tobytes())
            if magic == PICKLED_HEADER_MAGIC:
                raise ValueError(
                    f"InMemoryDataSource: shared-memory segment {self._name!r} was created "
                    "by an older grainlike, whose pickled header is not read (a pickle can run "
                    "code); create it again with this version."
                )
            if magic != MAGIC:
                raise ValueError(
                    f"InMemoryDataSource: shared-memory segment {self._name!r} was not "
                    "created by InMemoryDataSource (e.g. it is a Grain ShareableList)."
                )
            if self._meta is None:
                data_start = align(PREFIX.size + size)
                if data_start > len(root):
                    raise ValueError(
                        f"InMemoryDataSource: shared-memory segment {self._name!r} has a header "
                        f"of {size} bytes, longer than the segment ({len(root)} bytes)."
                    )
                try:
                    meta = in_memory_header.decode(
                        root[PREFIX.size : PREFIX.size + size].tobytes(), len(root) - data_start
                    )
                except in_memory_header.HeaderError as e:
                    raise ValueError(
                        f"InMemoryDataSource: shared-memory segment {self._name!r} has a "
                        f"malformed header: {e}"
                    ) from None
                meta["data_start"] = data_start
                self._meta = meta
            del root
            self._bind(mapping)
            return self._getter

    # In memory: read in the calling thread by default (grainlike.sources.waiting).
    waits = False

    def __len__(self) -> int:
        return self._meta["len"]

    def __getitem__(self, record_key: SupportsIndex) -> Any:
        return (self._getter or self._load())(record_key)

    def __getitems__(self, record_keys: Sequence[SupportsIndex]) -> list:
        getter = self._getter or self._load()
        return [getter(k) for k in record_keys]

    @property
    def name(self) -> Optional[str]:
        """The named segment's name (as ``SharedMemory.name`` reports it); None for anonymous memory."""
        return self._name

    def content_sha1(self) -> str:
        """SHA-1 of the kind, structure, shapes, dtypes and bytes of every leaf (cached)."""
        if self._digest is None:
            if self._getter is None:
                self._load()
            h = hashlib.sha1()
            h.update(repr((self._meta["kind"], self._meta["len"], self._meta["treedef"])).encode())
            for leaf in self._leaves:
                h.update(repr((leaf.dtype.str, leaf.shape)).encode())
                h.update(memoryview(leaf).cast("B"))
            self._digest = h.hexdigest()
        return self._digest

    def __repr__(self) -> str:
        if self._meta["kind"] == "scalars" and self._name is not None:
            # Grain's (ShareableList's) repr; deterministic because the name is the
            # user's. Cached: the loader asks for it at every checkpoint.
            if self._repr is None:
                self._repr = f"SharedMemoryDataSource({list(self)!r}, name={self._name!r})"
            return self._repr
        return f"SharedMemoryDataSource(len={len(self)}, sha1={self.content_sha1()})"

    def __str__(self) -> str:
        return f"InMemoryDataSource(name={self._name}, len={len(self)})"

    def count(self, value: Any) -> int:
        """How many elements equal ``value`` (grain's, a ``ShareableList``'s, ``count``)."""
        return sum(1 for element in self.__getitems__(range(len(self))) if value == element)

    def index(self, value: Any) -> int:
        """The position of the first element equal to ``value`` (grain's, a ``ShareableList``'s, ``index``).

        Raises:
          ValueError: no element equals ``value``.
        """
        for position, element in enumerate(self.__getitems__(range(len(self)))):
            if value == element:
                return position
        raise ValueError(f"{value!r} not in this container")

    def close(self) -> None:
        """Stops reading; the owner also releases the data (see the module's lifetime rules). Idempotent."""
        with self._lock:
            self._closed = True
            self._getter = None
            self._leaves = None
            self._mapping = None
        if self._finalizer is not None:
            self._finalizer()

    def unlink(self) -> None:
        """Removes the segment's name now (Grain's API). Idempotent.

        On the owner this is what ``close()`` does anyway; on an attached copy it
        removes the name the owner created. Anonymous memory has no name: then
        it does nothing (the memory ends with its last user).
        """
        if self._name is None:
            return
        if self._finalizer is not None:
            self._finalizer()
        else:
            unlink_untracked(self._name)

    def __copy__(self) -> "InMemoryDataSource":
        """Another source on the same memory (named: attached by name); the data is not copied."""
        if self._name is not None or self._closed:
            function, args = self.__reduce__()
            return function(*args)
        copy = InMemoryDataSource.__new__(InMemoryDataSource)
        copy._init_fields(None, self._meta, self._digest)
        copy._token = self._token
        if self._fd is not None:
            copy._fd = os.dup(self._fd)
            copy._finalizer = weakref.finalize(copy, _close_fd, copy._fd)
        copy._bind(self._mapping)
        return copy

    def __deepcopy__(self, memo: dict) -> "InMemoryDataSource":
        # The data is immutable (sealed, mapped read-only): sharing it is a deep copy.
        return self.__copy__()

    def __reduce__(self) -> tuple:
        """By name (named), by descriptor (to a loader's workers), else by value."""
        if self._closed:
            raise ValueError(f"cannot pickle a closed {self}.")
        if self._name is not None:
            return (_named_copy, (self._name, self._meta, self._digest))
        fd = self._fd if self._fd is not None else memfd.shipped(self._token)
        if fd is not None and memfd.ship(self._token, fd):
            return (_shipped_copy, (self._token, self._mapping.size, self._meta, self._digest))
        return (_copy_by_value, (self._meta, self._digest, np.asarray(self._mapping)))


# Mappings of the anonymous memory created in this process, by token, while
# anything uses them: a shipment unpickled in the process that pickled it (not
# a worker) reads the same memory.
_mappings: "weakref.WeakValueDictionary[str, memfd.Region]" = weakref.WeakValueDictionary()


def _named_copy(name: str, meta: dict, digest: Optional[str]) -> InMemoryDataSource:
    """A copy of a named source; it attaches to the segment on its first read."""
    copy = InMemoryDataSource.__new__(InMemoryDataSource)
    copy._init_fields(name, meta, digest)  # A copy never owns the segment.
    return copy


def _shipped_copy(token: str, size: int, meta: dict, digest: Optional[str]) -> InMemoryDataSource:
    """A copy of an anonymous source in a loader's worker, mapping the same memory."""
    copy = InMemoryDataSource.__new__(InMemoryDataSource)
    copy._init_fields(None, meta, digest)
    copy._token = token
    fd = memfd.shipped(token)
    if fd is not None:
        copy._bind(memfd.Region(fd, size, writable=False))
        return copy
    mapping = _mappings.get(token)
    if mapping is None:
        raise ValueError(
            f"InMemoryDataSource: this pickle refers to anonymous shared memory {token} "
            "that was sent to the worker processes of a loader; it can be loaded only "
            "there, or in the process that created the memory while anything there "
            "still uses it. Pickle the source outside a loader to get a copy of the data."
        )
    copy._bind(mapping)
    return copy


def _copy_by_value(meta: dict, digest: Optional[str], raw: np.ndarray) -> InMemoryDataSource:
    """A source owning a new anonymous copy of ``raw`` (a whole segment)."""
    copy = InMemoryDataSource.__new__(InMemoryDataSource)
    copy._init_fields(None, meta, digest)
    copy._own_anonymous(len(raw), lambda dst: np.copyto(dst, np.frombuffer(raw, np.uint8)))
    return copy


SharedMemoryDataSource = InMemoryDataSource
