"""``grain.experimental`` of the library a ``dataset_pairs`` namespace stands for.

Pipelines built by a function of ``lib`` reach the experimental names as
``experimental(lib).InterleaveIterDataset``.
"""

from typing import Any


def experimental(lib: Any) -> Any:
    """``grain.experimental`` for grain's namespace, ``grainlike.experimental`` otherwise."""
    if lib.name == "grain":
        import grain.experimental  # The grain_ref fixture has marked absl flags parsed.

        return grain.experimental
    import grainlike.experimental

    return grainlike.experimental
