"""Chunks: runs of elements that ``to_iter_dataset()``'s reading hands over in one call.

A batch over maps and filters over the reading iterator
(``MapDataset.to_iter_dataset().map(f).filter(g).batch(n)``, and the DataLoader,
which is built so) moves whole chunks: the batch asks its parent for the
elements it still needs (``take(k)``), each map and filter runs its function in
a loop over the chunk, and the reading hands over up to ``k`` elements it read
at once. The outputs, their order, the states and the errors are those of
``next()`` element by element: the functions run on the elements the batch
needs, when it needs them; a function that fails stops its chunk at the failing
element, the stages after it run on the elements before it (an error they raise
there comes first), and the reading is moved to just after the failing element,
where ``next()`` would have left it. A stage whose state counts the elements
that passed it (``random_map``, ``map_with_index``) counts a whole chunk at once
and asks the chunk (``on_fail``) to recount it if a stage above fails: it would
have counted every element up to the failing one.

The elements may carry metadata (the DataLoader's ``Record``s): a chunk then
holds their data in ``values`` and the metadata as columns in ``meta``, and the
stages' functions are ``ColumnFunction``s, which read the columns (a record's
rng, built only when a random transform asks for it) instead of one ``Record``
per element. Any other function gets the ``Record``s themselves. A stage takes
chunks where its parent hands them over (``core.protocols.TakesChunks``).
"""

from __future__ import annotations

from typing import Any, Optional


class Chunk:
    """Elements a reading iterator handed over at once, as the stages above it transform them.

    Attributes:
      values: the elements (of elements with metadata, their data).
      meta: None, or the elements' metadata as columns (``head``, ``select``,
        ``concat`` and ``elements(values)``), in the order of ``values``.
      start: the reading position of the first element.
      positions: None while the elements sit at consecutive positions from
        ``start``; else the position of each.
      reader: the reading iterator, moved back after an error (``rewind``).
      error: an error at the element after the last one (raised by the
        consumer, after the elements before it).
      on_fail: functions ``fail`` calls with the failing element's reading
        position (stages that count the elements they passed recount them).
    """

    __slots__ = ("values", "meta", "start", "positions", "reader", "error", "on_fail")

    def __init__(self, values: list, start: int, reader: Any, meta: Any = None):
        self.values = values
        self.meta = meta
        self.start = start
        self.positions: Optional[list] = None
        self.reader = reader
        self.error: Optional[BaseException] = None
        self.on_fail: list = []

    def position(self, i: int) -> int:
        """The reading position of element ``i``."""
        return self.start + i if self.positions is None else self.positions[i]

    def elements(self) -> list:
        """The elements themselves (with metadata: built from the columns)."""
        return self.values if self.meta is None else self.meta.elements(self.values)

    def fail(self, i: int, error: BaseException) -> None:
        """Element ``i`` failed: the reading goes on after it, and the chunk ends before it."""
        position = self.position(i)
        self.reader.rewind(position + 1)
        for recount in self.on_fail:
            recount(position)
        del self.values[i:]
        if self.meta is not None:
            self.meta = self.meta.head(i)
        if self.positions is not None:
            del self.positions[i:]
        self.error = error  # An earlier element than any error before.

    def select(self, keep: list) -> None:
        """Keeps the elements whose flag in ``keep`` is true."""
        if all(keep):
            return
        sel = [i for i, k in enumerate(keep) if k]
        self.values = [self.values[i] for i in sel]
        if self.meta is not None:
            self.meta = self.meta.select(sel)
        positions = self.positions
        self.positions = [self.start + i for i in sel] if positions is None else [positions[i] for i in sel]


class ColumnFunction:
    """A stage's function over elements with metadata that works on a chunk's columns.

    Called with one element (a ``Record``) where elements come one at a time;
    on a chunk, the stages call the method of their kind: ``map_columns`` and
    ``filter_columns`` append one result per element to ``out`` and raise at
    the first failing element (its index is ``len(out)``). It notes its own
    errors (naming the element by its metadata).
    """

    # Whether a batch stage may stack the values itself (into rows, as they come)
    # and hand the result to ``batch_columns``.
    stacks_values = False
    # The user's own functions it calls (which error messages name).
    user_functions: tuple = ()

    def map_columns(self, values: list, meta: Any, out: list) -> None:
        """A map's outputs."""
        raise NotImplementedError

    def filter_columns(self, values: list, meta: Any, out: list) -> None:
        """A filter's verdicts."""
        raise NotImplementedError

    def batch_columns(self, values: list, meta: Any, stacked: Any, alloc: Any) -> Any:
        """The batch of a chunk's elements, their values stacked already (``stacked``) or not (None).

        ``meta`` None: ``values`` are whole elements, which came one at a time.
        """
        raise NotImplementedError


def user_functions(fn: Any) -> tuple:
    """The user's functions that a stage's function is or calls."""
    return fn.user_functions if isinstance(fn, ColumnFunction) else (fn,)
