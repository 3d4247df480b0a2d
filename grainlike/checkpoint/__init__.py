"""``grain.checkpoint``: saving and restoring iterators with Orbax.

``CheckpointHandler`` with the args ``CheckpointSave`` / ``CheckpointRestore`` (also
named ``PyGrainCheckpoint*``, as in ``grain.python``; in ``orbax_handler``, loading
Orbax on first use) write and read the state files of ``grainlike.core.state_files``
(``process_{i}-of-{n}.json``, byte for byte grain's), which also holds Orbax v1's
``save_state_async`` / ``load_state_async``, used by iterators' ``save``/``load``.
``elastic_checkpoint`` holds grain main's ``save_elastic_iterator`` /
``restore_elastic_iterator`` (one ``shard_state_{i}.json`` per data shard).
"""

from grainlike.checkpoint.orbax_handler import ORBAX_CLASS_NAMES as _ORBAX_CLASS_NAMES
from grainlike.core.lazy import attach as _attach
from grainlike.core.state_files import load_state_async, process_state_path, save_state_async

__getattr__, __dir__ = _attach(
    globals(), {name: f"grainlike.checkpoint.orbax_handler:{name}" for name in _ORBAX_CLASS_NAMES}
)

# The Orbax classes are left out: a star import stays free of orbax.
__all__ = ["load_state_async", "process_state_path", "save_state_async"]
