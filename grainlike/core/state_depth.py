"""How deep a state given to ``set_state`` may nest: deeper is refused before anything reads it.

A hostile state (a 100,000-deep JSON object, from a file or passed directly) would
otherwise raise ``RecursionError`` wherever it is first printed, copied, compared
or encoded. Used by every grainlike iterator stage's ``set_state``
(``dataset.state.guard_set_state``) and by the reading of state files
(``core.state_files``).
"""

from __future__ import annotations

from typing import Any

from grainlike.core.errors import StateTooDeepError

__all__ = ["MAX_STATE_DEPTH", "check_depth"]

# No iterator's state nests this deep (a stage adds one or two levels; pipelines
# have tens of stages), and Python's default recursion limit (1000) leaves room
# to print, copy and compare one this deep from inside a restore.
MAX_STATE_DEPTH = 100


def check_depth(state: Any, where: Any) -> None:
    """Raises ``StateTooDeepError`` if ``state`` nests dicts, lists or tuples deeper than ``MAX_STATE_DEPTH``.

    Walks without recursion, so any depth (and a structure that contains itself)
    is told.

    Args:
      state: the state.
      where: what the state was given to (a stage) or read from, for the message.

    Raises:
      StateTooDeepError (an ``InvalidStateError``, ``KeyError`` and ``TypeError``).
    """
    pending = [(state, 1)]
    while pending:
        value, depth = pending.pop()
        if isinstance(value, dict):
            children = value.values()
        elif isinstance(value, (list, tuple)):
            children = value
        else:
            continue
        if depth > MAX_STATE_DEPTH:
            raise StateTooDeepError(
                f"{where}: the state is nested deeper than {MAX_STATE_DEPTH} levels of dicts and "
                "lists, which no iterator's state is; refused (nothing changed)"
            )
        pending.extend((child, depth + 1) for child in children)
