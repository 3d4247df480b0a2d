"""``grain.checkpoint``: saving and restoring iterators with Orbax.

``CheckpointHandler`` with the args ``CheckpointSave`` / ``CheckpointRestore``
(also named ``PyGrainCheckpointHandler``, ``PyGrainCheckpointSave`` and
``PyGrainCheckpointRestore``, as in ``grain.python``) checkpoint DataLoader and
Dataset iterators in grain's file format. They are implemented in
``grainlike.checkpoint.orbax_handler`` and load Orbax on first use, never at
import; the state files they write and read, and Orbax v1's
``save_state_async`` / ``load_state_async``, in ``grainlike.core.state_files``
(below the loader and the Dataset stages, whose iterators' ``save``/``load``
use them).
"""

from grainlike.checkpoint.orbax_handler import ORBAX_CLASS_NAMES as _ORBAX_CLASS_NAMES
from grainlike.core.lazy import attach as _attach
from grainlike.core.state_files import load_state_async, process_state_path, save_state_async

__getattr__, __dir__ = _attach(
    globals(), {name: f"grainlike.checkpoint.orbax_handler:{name}" for name in _ORBAX_CLASS_NAMES}
)

# The Orbax classes are left out: a star import stays free of orbax.
__all__ = ["load_state_async", "process_state_path", "save_state_async"]
