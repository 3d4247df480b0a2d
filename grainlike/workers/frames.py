"""The binary framing of a worker's outputs: arrays as raw bytes, each tree's layout sent once.

A worker's ``OUT`` and ``OUTS`` messages are frames, not pickles: the consumer
receives hundreds of outputs a second, and unpickling one batch (its
``SharedMemoryArray`` leaf, its dtype, the array's reconstruction) costs it more
than everything else it does for that batch. A frame is::

    length    -1, then the frame's length (8 bytes, big-endian): how
              ``Connection.send_bytes`` frames any message, in its long form
    header    "GL", kind (b"O": OUT, b"S": OUTS), has-definitions, record count,
              new-segment count (16 bytes)
    offsets   each record's offset in the message (u32), padded to 16 bytes
    segments  an OUT's new segments: (seg_id, size) (u64 each)
    records   each at a multiple of 16 bytes

and a record, one output and the worker's state after it::

    header    layout id, the definition's offset and length, the state's
              offset and length (u32 each; 24 bytes)
    table     per leaf its shape, then its data's offset in the record (an
              inline leaf) or its segment id (a leaf in shared memory)
    def       the layout's definition (pickled), in the first record of a layout
              after the worker started or was reset; else absent
    state     the state, pickled, opaque: unpickled only when a state is asked for
    data      inline leaves' bytes, each at a multiple of 16 bytes

A layout is the output's tree structure with each leaf's type, dtype, number of
dimensions, order and writability, as a pickle of the same protocol would
deliver them (``Writer.record``). The worker numbers the layouts it meets and
sends each definition once; the consumer keeps them per worker, each with a
function compiled for it (``Layout``), so an output costs it a ``struct``
unpack and one array per leaf. An output this cannot describe exactly (a leaf
that is no array, an array of Python objects, a dtype with metadata, a node of
a type pickling would rebuild otherwise) travels as a ``FALLBACK`` record: the
output pickled, as before frames.

Definitions, states and fallback outputs are pickled by the worker and come
over its private socket only; nothing in shared memory is ever unpickled.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import pickle
import struct
from typing import Any, Optional

from multiprocessing.reduction import ForkingPickler

import numpy as np

from grainlike.core import tree
from grainlike.core.shared_memory_array import SharedMemoryArray
from grainlike.workers.messages import OUT, OUTS
from grainlike.workers.shm import _FORTRAN, _SHARED, ShmLeaf

# Frame kinds.
OUT_KIND = b"O"
OUTS_KIND = b"S"
_MAGIC = b"GL"
# A frame's length, as multiprocessing frames a message of any size (-1, then 8 bytes).
_LENGTH = struct.Struct("!iQ")
_FRAME = struct.Struct("<2s1s?III")  # magic, kind, has definitions, records, new segments, 0
_AT = _LENGTH.size  # Where the frame's header is in its message.
_SEGMENT = struct.Struct("<QQ")
_RECORD = struct.Struct("<IIIII4x")  # layout id, definition offset and length, state offset and length
_LAYOUT_ID = struct.Struct("<I")
FALLBACK = 0xFFFFFFFF
# A worker describes at most this many layouts; later ones travel as fallback records.
MAX_LAYOUTS = 1024
_ALIGN = 16

# Leaf kinds in a layout: where the data is, and how the array is made.
_INLINE, _SEGMENT_LEAF = 0, 1
# Tree nodes a layout may hold: pickling rebuilds them as ``tree.unflatten_as`` does.
_NODE_TYPES = frozenset({dict, list, tuple, type(None), collections.OrderedDict, collections.defaultdict})
_OFFSETS = [struct.Struct(f"<{n}I") for n in range(1, 65)]


class Malformed(Exception):
    """A frame that does not parse; the pool raises it as a ``RuntimeError`` naming the worker."""


def _up(n: int) -> int:
    return (n + _ALIGN - 1) & -_ALIGN


# -- the worker's side ----------------------------------------------------------------------


def _plain_dataclass(x: Any) -> bool:
    """Whether ``x`` is a dataclass instance that pickles as its fields, as ``tree`` rebuilds it."""
    t = type(x)
    if not dataclasses.is_dataclass(t) or getattr(t, "tree_leaf", False):
        return False
    if (
        t.__reduce_ex__ is not object.__reduce_ex__
        or t.__reduce__ is not object.__reduce__
        or getattr(t, "__getstate__", None) is not getattr(object, "__getstate__", None)
        or hasattr(t, "__setstate__")
        or "__slots__" in vars(t)
    ):
        return False
    return set(getattr(x, "__dict__", ("",))) == {f.name for f in dataclasses.fields(t)}


def _plain_node(x: Any) -> bool:
    """Whether ``x``, a node of ``tree``, is rebuilt by ``tree.unflatten_as`` as pickling rebuilds it."""
    t = type(x)
    if t in _NODE_TYPES:
        return True
    if isinstance(x, tuple):  # A namedtuple made by collections.namedtuple or typing.NamedTuple.
        return t.__bases__ == (tuple,) and hasattr(t, "_fields")
    return _plain_dataclass(x)


def _leaf_signature(x: Any, protocol: int) -> Optional[tuple]:
    """What a layout says of leaf ``x``, delivered as a pickle of ``protocol`` would be; None if a frame cannot."""
    t = type(x)
    if t is ShmLeaf:
        return (_SEGMENT_LEAF, x.layout, np.dtype(x.dtype), len(x.shape))
    if t is not np.ndarray and t is not SharedMemoryArray:
        return None
    dtype = x.dtype
    if dtype.hasobject or dtype.metadata is not None or dtype.itemsize == 0:
        return None
    flags = x.flags
    key = dtype if dtype.names is None else (dtype, dtype.isalignedstruct)
    if protocol < 5:  # A copy, writable, in C order or else in Fortran order.
        if not dtype.isnative:  # (Which numpy converts, for some dtypes, to the native byte order.)
            return None
        return (_INLINE, t, key, x.ndim, "F" if flags.f_contiguous and not flags.c_contiguous else "C", False)
    return (_INLINE, t, key, x.ndim, _order(x, flags), not flags.writeable)


def _order(x: np.ndarray, flags: Any) -> Any:
    """How a pickle (protocol 5) lays ``x`` out: ``"C"``, ``"F"``, or the axes that transpose its bytes' order back.

    numpy keeps a C- or Fortran-ordered array so, and its writability; one
    whose axes are a contiguous block in another order (a transpose) travels
    in that order and is transposed back on arrival; any other (strided,
    reversed) is copied in C order. (Protocol 4 copies every array, writable,
    in C order unless it is Fortran-ordered.)
    """
    if flags.c_contiguous:
        return "C"
    if flags.f_contiguous:
        return "F"
    strides = x.strides
    by_stride = sorted(range(x.ndim), key=lambda i: (-abs(strides[i]), i))
    if not x.transpose(by_stride).flags.c_contiguous:
        return "C"
    axes = [0] * x.ndim
    for j, i in enumerate(by_stride):
        axes[i] = j
    return tuple(axes)


class Writer:
    """A worker's encoder of records and frames; numbers the layouts and announces each once.

    ``record(state, output)`` is one output's record; ``frame(kind, records,
    new_segments)`` the message carrying records. After a reset the consumer
    may have dropped records that announced layouts: ``forget_announced()``
    makes the next record of each layout announce it again.
    """

    def __init__(self) -> None:
        self._ids: dict = {}  # layout key -> (id, struct of its table, definition bytes)
        self._announced: set = set()

    def forget_announced(self) -> None:
        self._announced = set()

    def _layout(self, output: Any, protocol: int) -> Optional[tuple]:
        """``(key, leaves, structure)`` of ``output``; None if a frame cannot carry it exactly."""
        t = type(output)
        if t is np.ndarray or t is SharedMemoryArray or t is ShmLeaf:
            leaves: list = [output]
            structure: Any = None
        elif t is dict and all(type(k) is str for k in output):
            leaves = list(output.values())
            structure = tuple(output)
            if not all(type(v) in _LEAF_TYPES for v in leaves):
                return self._tree_layout(output, protocol)
        else:
            return self._tree_layout(output, protocol)
        signatures = []
        for x in leaves:
            signature = _leaf_signature(x, protocol)
            if signature is None:
                return None
            signatures.append(signature)
        return (structure, tuple(signatures)), leaves, structure

    def _tree_layout(self, output: Any, protocol: int) -> Optional[tuple]:
        plain = [True]

        def visit(node: Any) -> bool:
            # (Called on every node and leaf; every leaf is an array by now.)
            if type(node) not in _LEAF_TYPES and not _plain_node(node):
                plain[0] = False
            return False

        leaves = tree.flatten(output)
        if not leaves or not all(type(x) in _LEAF_TYPES for x in leaves):
            return None
        skeleton = tree.map_structure(lambda _: 0, output, is_leaf=visit)
        if not plain[0]:
            return None
        try:
            structure = pickle.dumps(skeleton, protocol=5)
        except Exception:  # noqa: BLE001 - the fallback pickle says why, if it fails too
            return None
        signatures = tuple(_leaf_signature(x, protocol) for x in leaves)
        if None in signatures:
            return None
        return (structure, signatures), leaves, structure

    def record(self, state: Any, output: Any, protocol: int = 5) -> Any:
        """One output's record (a multiple of 16 bytes), delivered as a pickle of ``protocol`` would be.

        ``ForkingPickler``'s protocol (4 before Python 3.14) for an output with
        leaves in shared memory (an ``OUT``), 5 for others (``OUTS``), as these
        were pickled before frames: the arrays' order and writability follow.
        """
        dumps = ForkingPickler.dumps if protocol < 5 else functools.partial(pickle.dumps, protocol=5)
        state_bytes = dumps(state)
        found = self._layout(output, protocol)
        entry = None
        if found is not None:
            key, leaves, structure = found
            signatures = key[1]
            entry = self._ids.get(key)
            if entry is None and len(self._ids) < MAX_LAYOUTS:
                entry = self._define(key, structure)
        if entry is None:
            payload = dumps(output)
            head = _RECORD.pack(FALLBACK, 0, 0, _RECORD.size, len(state_bytes))
            used = _RECORD.size + len(state_bytes) + len(payload)
            return b"".join((head, state_bytes, payload, bytes(_up(used) - used)))
        layout_id, table, definition = entry
        if layout_id in self._announced:
            definition = b""
        def_at = _RECORD.size + table.size
        state_at = def_at + len(definition)
        data = _up(state_at + len(state_bytes))
        values: list = []
        placed = []
        for x, signature in zip(leaves, signatures):
            if type(x) is ShmLeaf:
                values.extend(x.shape)
                values.append(x.seg_id)
            else:
                order = signature[4]
                if type(order) is tuple:  # The shape of its bytes' order (``_order``).
                    values.extend(x.shape[i] for i in sorted(range(x.ndim), key=order.__getitem__))
                else:
                    values.extend(x.shape)
                values.append(data)
                placed.append((data, x, order))
                data = _up(data + x.nbytes)
        out = bytearray(data)
        _RECORD.pack_into(out, 0, layout_id, def_at, len(definition), state_at, len(state_bytes))
        table.pack_into(out, _RECORD.size, *values)
        out[def_at:state_at] = definition
        out[state_at : state_at + len(state_bytes)] = state_bytes
        for at, x, order in placed:
            if not x.size:
                continue
            if order == "C" and x.flags.c_contiguous:
                try:
                    out[at : at + x.nbytes] = x.data.cast("B")  # (The commonest: its bytes as they are.)
                    continue
                except (TypeError, ValueError, NotImplementedError):  # (A dtype with no buffer format.)
                    pass
            if type(order) is tuple:  # Its bytes in their order (axes sorted by stride), as a pickle does.
                x = x.transpose(sorted(range(x.ndim), key=order.__getitem__))
                order = "C"
            np.ndarray(x.shape, x.dtype, out, at, order=order)[...] = x
        self._announced.add(layout_id)
        return out

    def _define(self, key: tuple, structure: Any) -> tuple:
        layout_id = len(self._ids)
        _, signatures = key
        leaves = []
        for s in signatures:
            if s[0] == _SEGMENT_LEAF:
                leaves.append(s)
            else:
                kind, t, dtype, ndim, order, read_only = s
                leaves.append((kind, t, dtype if type(dtype) is not tuple else dtype[0], ndim, order, read_only))
        definition = pickle.dumps((structure, leaves), protocol=5)
        entry = (layout_id, _table(leaves), definition)
        self._ids[key] = entry
        return entry


_LEAF_TYPES = frozenset({np.ndarray, SharedMemoryArray, ShmLeaf})


def _table(leaves: list) -> struct.Struct:
    """Each leaf's shape, then its data's offset or its segment id."""
    return struct.Struct("<" + "".join("q" * leaf[3] + "Q" for leaf in leaves))


def frame(kind: bytes, records: list, segments: list = ()) -> bytes:
    """The message carrying ``records`` (from ``Writer.record``) and an OUT's new ``segments`` ``[(seg_id, size)]``.

    Its length comes first, as ``Connection.send_bytes`` frames a message
    (always the long form: the offsets in it count from the message's start),
    so the consumer reads a message into one buffer and makes arrays on it.
    """
    n = len(records)
    defines = any(r[8:12] != b"\0\0\0\0" for r in records)
    head = _AT + _FRAME.size + 4 * n
    at = _up(head) + _SEGMENT.size * len(segments)
    offsets = []
    for r in records:
        offsets.append(at)
        at += len(r)
    parts = [
        _LENGTH.pack(-1, at - _AT),
        _FRAME.pack(_MAGIC, kind, defines, n, len(segments), 0),
        struct.pack(f"<{n}I", *offsets),
        bytes(_up(head) - head),
    ]
    parts.extend(_SEGMENT.pack(*s) for s in segments)
    parts.extend(records)
    return b"".join(parts)


# -- the consumer's side ---------------------------------------------------------------------


class Layout:
    """A layout as the consumer keeps it: ``build(buf, pos, segments)`` makes the output of a record at ``pos``.

    ``build`` is compiled for the layout (as ``collections.namedtuple`` compiles
    its class): one ``struct`` unpack of the table, then each leaf's array and
    the tree, with no loop over leaves or kinds. Its source holds only names
    and numbers made here; the layout's dtypes, types and keys are bound as values.
    """

    __slots__ = ("build",)

    def __init__(self, structure: Any, leaves: list):
        table = _table(leaves)
        bound: dict = {"unpack": table.unpack_from, "new": _new}
        lines = ["def build(buf, pos, segments):", f"    v = unpack(buf, pos + {_RECORD.size})"]
        at = 0
        for k, leaf in enumerate(leaves):
            if leaf[0] == _SEGMENT_LEAF:
                _, shm_layout, dtype, ndim = leaf
                t = SharedMemoryArray if shm_layout == _SHARED else np.ndarray
                order, axes, read_only = ("F" if shm_layout == _FORTRAN else "C"), None, False
            else:
                _, t, dtype, ndim, order, read_only = leaf
                axes = order if type(order) is tuple else None
                order = "C" if axes else order
                if t is not np.ndarray and t is not SharedMemoryArray:
                    raise Malformed(f"a layout names leaf type {t!r}")
            if order not in ("C", "F") or type(ndim) is not int or not 0 <= ndim <= 64:
                raise Malformed(f"a layout with order {order!r}, {ndim!r} dimensions")
            bound[f"t{k}"], bound[f"d{k}"], bound[f"x{k}"] = t, np.dtype(dtype), axes
            shape, where = (f"v[{at}]" if ndim == 1 else f"v[{at}:{at + ndim}]"), f"v[{at + ndim}]"
            if leaf[0] == _SEGMENT_LEAF:
                # On a lease, which returns the segment when its last array goes (``shm``).
                lines.append(f"    lease_type, address, info = segments.leases[{where}]")
                lines.append("    lease = lease_type.from_address(address)")
                lines.append("    lease.info = info")
                lines.append(f"    a{k} = new(t{k}, {shape}, d{k}, lease, 0, None, {order!r})")
            else:
                lines.append(f"    a{k} = new(t{k}, {shape}, d{k}, buf, pos + {where}, None, {order!r})")
            if axes is not None:
                lines.append(f"    a{k} = a{k}.transpose(x{k})")
            if read_only:
                lines.append(f"    a{k}.flags.writeable = False")
            at += ndim + 1
        arrays = [f"a{k}" for k in range(len(leaves))]
        if structure is None:
            if len(leaves) != 1:
                raise Malformed(f"a layout of one leaf with {len(leaves)}")
            lines.append("    return a0")
        elif type(structure) is tuple:
            if len(structure) != len(leaves):
                raise Malformed(f"a layout of {len(structure)} keys with {len(leaves)} leaves")
            bound.update((f"k{k}", key) for k, key in enumerate(structure))
            lines.append("    return {" + ", ".join(f"k{k}: a{k}" for k in range(len(leaves))) + "}")
        else:
            bound["skeleton"], bound["unflatten"] = pickle.loads(structure), tree.unflatten_as
            lines.append(f"    return unflatten(skeleton, [{', '.join(arrays)}])")
        exec(compile("\n".join(lines), "<grainlike.workers.frames layout>", "exec"), bound)  # noqa: S102
        self.build = bound["build"]


@functools.lru_cache(maxsize=256)
def _layout(definition: bytes) -> Layout:
    """The layout a definition describes: compiled once, whichever worker (or pool) sends it."""
    structure, leaves = pickle.loads(definition)
    return Layout(structure, leaves)


def message(buf: Any, layouts: dict) -> tuple:
    """A worker's message: a frame as ``(OUT or OUTS, buf, record offsets, new segments)``; any other unpickled.

    Registers the layouts the frame defines in ``layouts`` (all of them, also
    from records that will be dropped: the worker does not define them again).

    Raises:
      Malformed: the frame is truncated or does not parse.
    """
    if buf[_AT : _AT + 2] != _MAGIC:  # A pickle, after its length (starting with its PROTO opcode, 0x80).
        return ForkingPickler.loads(memoryview(buf)[4 if buf[:4] != b"\xff\xff\xff\xff" else 12 :])
    try:
        magic, kind, defines, n, n_segments, _ = _FRAME.unpack_from(buf, _AT)
        if magic != _MAGIC or kind not in (OUT_KIND, OUTS_KIND) or not n or (n > 1 and kind == OUT_KIND):
            raise Malformed(f"a frame of kind {kind!r} with {n} records")
        offsets = (_OFFSETS[n - 1] if n <= 64 else struct.Struct(f"<{n}I")).unpack_from(buf, _AT + _FRAME.size)
        segments = []
        if n_segments:
            at = _up(_AT + _FRAME.size + 4 * n)
            segments = [_SEGMENT.unpack_from(buf, at + _SEGMENT.size * i) for i in range(n_segments)]
        if defines:
            for pos in offsets:
                _, def_at, def_len, _, _ = _RECORD.unpack_from(buf, pos)
                if def_len:
                    start = pos + def_at
                    layouts[_LAYOUT_ID.unpack_from(buf, pos)[0]] = _layout(bytes(buf[start : start + def_len]))
    except (Malformed, MemoryError):
        raise
    except Exception as e:  # noqa: BLE001 - whatever the bytes made fail
        raise Malformed(f"{type(e).__name__}: {e}") from None
    return (OUT if kind == OUT_KIND else OUTS), buf, offsets, segments


_new = np.ndarray.__new__
# An OUT frame of one record and no new segments, up to its record's layout id.
_PLAIN_OUT = struct.Struct("<12x2s1s?IIIII")
PLAIN_OUT_AT = _up(_AT + _FRAME.size + 4)  # Where its record is.
PLAIN_OUT_OFFSETS = (PLAIN_OUT_AT,)


def plain_out(buf: Any, layouts: dict, segments: Any) -> Any:
    """The output of the commonest message, an ``OUT`` of a known layout using no new segment; else ``None``.

    What ``message`` and ``output`` do for it, in one step (the consumer gets
    one such message per output of a pipeline whose batches are in shared
    memory). Such messages of one layout have the same header:
    ``layouts[None]`` keeps the last one's, with its layout.

    Raises:
      Malformed: as ``output``.
    """
    last = layouts.get(None)
    if last is not None and buf.startswith(last[0], _AT):
        layout = last[1]
    else:
        if len(buf) < _PLAIN_OUT.size:
            return None
        magic, kind, defines, n, n_segments, _, at, layout_id = _PLAIN_OUT.unpack_from(buf, 0)
        if magic != _MAGIC or kind != OUT_KIND or defines or n_segments or n != 1 or at != PLAIN_OUT_AT:
            return None
        layout = layouts.get(layout_id)
        if layout is None:
            return None
        layouts[None] = (bytes(buf[_AT : _PLAIN_OUT.size]), layout)
    try:
        return layout.build(buf, PLAIN_OUT_AT, segments)
    except MemoryError:
        raise
    except Exception as e:  # noqa: BLE001 - whatever the bytes made fail
        raise Malformed(f"{type(e).__name__}: {e}") from None


def output(buf: Any, pos: int, layouts: dict, segments: Any = None) -> Any:
    """The output of the record at ``pos`` (``segments``: the worker's ``SegmentReader``, for an OUT).

    Raises:
      Malformed: the record is truncated, or names a layout or segment never defined.
    """
    try:
        layout = layouts.get(_LAYOUT_ID.unpack_from(buf, pos)[0])
        if layout is not None:
            return layout.build(buf, pos, segments)
        layout_id, _, _, state_at, state_len = _RECORD.unpack_from(buf, pos)
        if layout_id != FALLBACK:
            raise Malformed(f"a record of layout {layout_id}, which was never defined")
        pickled = memoryview(buf)[pos + state_at + state_len :]
    except (Malformed, MemoryError):
        raise
    except Exception as e:  # noqa: BLE001 - whatever the bytes made fail
        raise Malformed(f"{type(e).__name__}: {e}") from None
    # A fallback record (an error unpickling the output itself is raised as it is).
    payload = pickle.loads(pickled)
    return payload if segments is None else segments.materialize(payload)


def entries(buf: Any, offsets: tuple, layouts: dict) -> list:
    """``(buf, pos, build)`` of each record of an ``OUTS`` frame: ``build(buf, pos, None)`` makes its output.

    ``build`` is its layout's (None for a record that is not a layout's, or
    whose layout is unknown: ``output`` says why), found once per frame.
    """
    unpack, get = _LAYOUT_ID.unpack_from, layouts.get
    try:
        return [(buf, pos, getattr(get(unpack(buf, pos)[0]), "build", None)) for pos in offsets]
    except Exception:  # noqa: BLE001 - output() says what is wrong with them
        return [(buf, pos, None) for pos in offsets]


def state(buf: Any, pos: int, *_: Any) -> Any:
    """The state in the record at ``pos``, unpickled (a new object each call)."""
    _, _, _, state_at, state_len = _RECORD.unpack_from(buf, pos)
    start = pos + state_at
    return pickle.loads(memoryview(buf)[start : start + state_len])
