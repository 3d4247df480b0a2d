"""How an exception crosses from a worker to the consumer: sent whole or in parts, rebuilt there.

``send_error`` (in the worker) and ``rebuild_error`` (in the consumer);
``explain_unpicklable`` names the part of an output that cannot be sent.
"""

from __future__ import annotations

import traceback
from typing import Any

from multiprocessing.reduction import ForkingPickler

import cloudpickle
import numpy as np

from grainlike.core import tree
from grainlike.core.errors import WorkerError, add_note, traceback_from_frames
from grainlike.workers.messages import ERR, DescribesOutputs


def _safe(fn, fallback: str) -> str:
    try:
        return str(fn())
    except Exception as e:  # Formatting user objects may raise anything.
        try:
            return f"{fallback} ({type(e).__name__}: {e})"
        except Exception:
            return fallback


def _error_text(error: BaseException) -> str:
    """The exception's message, or as much of it as can be recovered."""
    try:
        return str(error)
    except Exception as e:
        args = _safe(lambda: repr(error.args), "<args that cannot be printed>")
        return f"<str() of the exception raised {type(e).__name__}; its args: {args}>"


def _pickled(obj: Any) -> "tuple[bytes | None, str]":
    """``(cloudpickle bytes, "")``, or ``(None, why not)`` when they cannot be rebuilt."""
    try:
        payload = cloudpickle.dumps(obj)
        cloudpickle.loads(payload)  # Some objects pickle but cannot be rebuilt.
        return payload, ""
    except BaseException as e:  # noqa: B902 - any failure means: send less
        return None, _safe(lambda error=e: f"{type(error).__name__}: {error}", type(e).__name__)


def send_error(conn, state: Any, error: BaseException) -> None:
    """Sends ``error`` to the consumer: itself if possible, else its type, text and notes.

    Every part is made safely, so that an exception that cannot be printed or
    pickled still reaches the consumer (which rebuilds it: ``rebuild_error``).
    """
    tb = _safe(
        lambda: "".join(traceback.format_exception(type(error), error, error.__traceback__)),
        "<the traceback could not be formatted>",
    )
    payload, why = _pickled(error)
    type_payload = None
    if payload is None:
        type_payload, _ = _pickled(type(error))
    notes = [_safe(lambda n=n: n, "<a note that cannot be printed>") for n in getattr(error, "__notes__", ())]
    name = _safe(lambda: f"{type(error).__module__}.{type(error).__qualname__}", "<unknown type>")
    # (file, line, function) per frame: the consumer rebuilds them as the raised exception's traceback.
    try:
        frames = [(str(f.filename), int(f.lineno or 0), str(f.name)) for f in traceback.extract_tb(error.__traceback__)]
    except Exception:  # noqa: BLE001 - the text traceback above still travels
        frames = []
    conn.send((ERR, state, payload, name, _error_text(error), tb, type_payload, notes, why, frames))


def explain_unpicklable(error: BaseException, output: Any, origin: str) -> None:
    """Adds a note to ``error`` naming the part of ``output`` that cannot be pickled, and ``origin``."""
    culprit = f"the output itself ({type(output).__module__}.{type(output).__qualname__})"
    try:
        for path, leaf in tree.flatten_with_path(output):
            try:
                ForkingPickler.dumps(leaf)
            except Exception:
                kind = type(leaf)
                what = f"{kind.__module__}.{kind.__qualname__}"
                if isinstance(leaf, np.ndarray) and leaf.dtype == object:
                    # A Batch stacked what a transform returned: name the item's type.
                    for item in leaf.flat:
                        try:
                            ForkingPickler.dumps(item)
                        except Exception:
                            what = f"an object array holding {type(item).__module__}.{type(item).__qualname__}"
                            break
                culprit = f"the leaf at {path or '<root>'} ({what})"
                break
    except Exception:
        pass
    if "__main__" in culprit:
        advice = (
            "Its class is defined in __main__, which worker processes do not run: "
            "define it in a module that both processes can import."
        )
    else:
        advice = (
            "Keep locks, open files, generators and similar objects out of outputs, "
            "or give their class __getstate__/__reduce__."
        )
    add_note(
        error,
        f"grainlike: a worker's output cannot be sent to the consumer: {culprit} cannot be "
        f"pickled. Outputs crossing processes must be picklable. {advice} {origin}",
    )


def describe_origin(task: Any, worker_index: int, worker_count: int, before: Any, after: Any) -> str:
    """Where an output came from: the task's ``describe_output`` if it has one, else its states."""
    if isinstance(task, DescribesOutputs):
        try:
            return task.describe_output(worker_index, worker_count, before, after)
        except Exception:  # noqa: BLE001 - the states still say where
            pass
    return f"The output came after worker state {before!r} (its state after it: {after!r})."


def rebuild_error(w: int, pid: int, msg: tuple) -> BaseException:
    """The exception a worker sent (see ``send_error``), as close to itself as possible.

    In order: the exception itself; else an instance of its type carrying its
    message and notes; else a ``WorkerError`` naming the type.
    """
    _, _, payload, type_name, text, tb, type_payload, notes, why, frames = msg
    error = None
    if payload is not None:
        try:
            error = cloudpickle.loads(payload)
            notes = []  # They travelled with it.
        except Exception as e:
            error, why = None, f"{type(e).__name__}: {e}"
    if error is None and type_payload is not None:
        try:
            cls = cloudpickle.loads(type_payload)
            error = cls.__new__(cls)
            error.args = (text,)
        except Exception:
            error = None
    if error is None:
        error = WorkerError(f"{type_name}: {text}")
        why = f"grainlike: the worker's {type_name} could not be sent ({why}) nor rebuilt from its type"
    elif why:
        why = (
            f"grainlike: the worker's exception could not be sent as itself ({why}); this is "
            f"an instance of its type rebuilt from its message, without its other "
            f"attributes; the message: {text}"
        )
    for note in notes:
        add_note(error, note)
    if why:
        add_note(error, why)
    # The worker's frames as the traceback's innermost entries (as grain does);
    # the note repeats them only where they could not be rebuilt.
    rebuilt = traceback_from_frames(frames)
    if rebuilt is not None:
        add_note(error, f"grainlike: raised in worker {w} (pid {pid}); the worker's frames are the last entries of the traceback above")
    else:
        add_note(error, f"grainlike: raised in worker {w} (pid {pid}); the worker's traceback:\n{tb.rstrip()}")
    return error.with_traceback(rebuilt)
