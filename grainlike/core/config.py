"""``grainlike.config``: grain's global options (absl flags ``--grain_*`` there), in a plain object.

Same names, defaults and errors as ``grain.config``, so code that reads or sets
them runs unchanged. grainlike behaves the same whatever they are set to: the
``tf_*`` options configure grain's TensorFlow backend, the ``py_*`` ones grain's
debugging and telemetry, which grainlike reports its own way.
"""

from __future__ import annotations

import threading
from typing import Any

from grainlike.core.errors import UnrecognizedOptionError

# grain 0.2.18's options (without the ``grain_`` flag prefix) and their defaults.
_DEFAULTS: dict[str, Any] = {
    "tf_interleaved_shuffle": False,
    "tf_interleaved_shuffle_block_size": 10,
    "tf_interleaved_shuffle_parallel_blocks": 10,
    "tf_lookup_batch_size": 100,
    "tf_lookup_num_parallel_calls": -1,
    "tf_lookup_fast_warmup": False,
    "tf_optimized_sequential_read": False,
    "tf_prefetch_buffer_size": -1,
    "py_debug_mode": False,
    "py_dataset_visualization_output_dir": None,
    "py_relay_sigterm_to_main": False,
    "py_traceback_filtering": "auto",
}


def _unrecognized(name: str) -> UnrecognizedOptionError:
    return UnrecognizedOptionError(
        f"Unrecognized config option: {name} (the options are {', '.join(_DEFAULTS)})"
    )


class Config:
    """Process-wide options with grain's names: read ``config.<name>``, set with ``update``.

    Example:
      >>> config = Config()
      >>> config.update("py_debug_mode", True)
      >>> config.py_debug_mode
      True
      >>> config.get_or_default("tf_lookup_batch_size")
      100
    """

    def __init__(self) -> None:
        object.__setattr__(self, "_values", dict(_DEFAULTS))
        object.__setattr__(self, "_lock", threading.Lock())

    def __getattr__(self, name: str) -> Any:
        # Only called for names that are not methods or the two fields above.
        values = self.__dict__.get("_values")
        if values is None or name not in values:
            raise _unrecognized(name)
        return values[name]

    def get_or_default(self, name: str) -> Any:
        """Returns the option's value (grain: its default when flags are unparsed)."""
        return self.__getattr__(name)

    def __setattr__(self, name: str, value: Any) -> None:
        raise ValueError("Please use update().")

    def update(self, name: str, value: Any) -> None:
        """Sets option ``name`` (without grain's ``grain_`` flag prefix) to ``value``.

        Raises:
          UnrecognizedOptionError: (a ValueError) ``name`` is not one of grain's
            options.
        """
        if name not in _DEFAULTS:
            raise _unrecognized(name)
        with self._lock:
            self._values[name] = value

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | set(_DEFAULTS))

    def __repr__(self) -> str:
        return f"Config({self._values!r})"


config = Config()
