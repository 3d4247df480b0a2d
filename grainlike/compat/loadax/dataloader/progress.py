"""``loadax.dataloader.progress``: how far an iterator has read."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class Progress:
    """How far a Loadax iterator has read (``iterator.progress()``).

    grainlike's own iterators report their position as ``get_state()``, which
    ``set_state`` restores; ``len(loader)`` is their number of batches.

    Attributes:
      items_processed: indices read so far (a ``Dataloader`` counts whole
        batches of ``batch_size``, as Loadax's does, so after the last, shorter
        batch it can exceed ``items_total``).
      items_total: indices this process reads in a pass.
    """

    items_processed: int
    items_total: int

    def __repr__(self) -> str:
        return f"Progress(items_processed={self.items_processed}, items_total={self.items_total})"
