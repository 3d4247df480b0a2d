"""cloudpickle that keeps the file names of user code, for worker processes.

cloudpickle (3.1 and later) pickles a function defined in ``__main__``, a
notebook cell or a closure by value and names its code ``<dynamic-code>``, so a
transform that fails in a worker shows ``File "<dynamic-code>", line 4`` where the
user wrote it. ``dumps`` keeps each code object's ``co_filename``: a worker's
traceback names the user's file and, where the file is readable there, shows the
line. The bytes are otherwise cloudpickle's; ``cloudpickle.loads`` (or
``pickle.loads``) reads them.
"""

from __future__ import annotations

import functools
import io
import types
from typing import Any

_DYNAMIC = "<dynamic-code>"


def code_with_filename(code: types.CodeType, filename: str) -> types.CodeType:
    """``code`` named ``filename`` again (called when the bytes are loaded)."""
    return code.replace(co_filename=filename)


@functools.cache
def _pickler() -> type:
    import cloudpickle  # only where something is pickled for a worker

    class Pickler(cloudpickle.Pickler):
        def reducer_override(self, value):
            if type(value) is types.CodeType and value.co_filename != _DYNAMIC:
                # The renamed copy comes back here and takes cloudpickle's own way.
                return code_with_filename, (value.replace(co_filename=_DYNAMIC), value.co_filename)
            return super().reducer_override(value)

    Pickler.protocol_default = cloudpickle.DEFAULT_PROTOCOL
    return Pickler


def dumps(obj: Any) -> bytes:
    """``cloudpickle.dumps(obj)``, keeping the file names of the code it pickles by value."""
    pickler = _pickler()
    buffer = io.BytesIO()
    pickler(buffer, protocol=pickler.protocol_default).dump(obj)
    return buffer.getvalue()
