"""Host callbacks that never raise inside jitted code, and ``host_errors`` that raises after.

Every grainlike feed of jitted code (``InJitIterator``, ``reference_data``,
``full_reference_data``, ``io.save``) goes through ``host_callback`` here. No
exception leaves a callback (on GPUs one raised in an ordered callback poisons the
runtime token of ordered effects, and every later computation of the process fails
with it): a callback that fails (the end of the data, a failing source or
transform, a released chain) keeps its exception in its feed's ``CallbackErrors``
and returns zeros of the expected shapes with ``ok=False``; from then on the feed's
callbacks return at once without reading, so no data is skipped or repeated. The
host raises the original exception afterwards: on leaving ``with host_errors():``,
by the feed's next host call, or at once when the call was not traced. Host
callbacks need JAX's ``cpu`` platform (``JAX_PLATFORMS=cuda,cpu``, not ``cuda``
alone). Importing this module costs numpy only.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import sys
import threading
import weakref
from typing import Any, Callable, Optional

import numpy as np

__all__ = ["CallbackErrors", "host_callback", "host_errors"]

_logger = logging.getLogger("grainlike")


class _Registry:
    """Which feeds' callbacks reported a pending exception, by when they last did (bounded, weak).

    A callback reports again each time it runs while its exception is pending, so
    that a ``host_errors`` context around a later computation of that feed raises it.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count = 0
        self._entries: collections.deque = collections.deque(maxlen=64)  # (count, weakref)

    def add(self, errors: "CallbackErrors") -> None:
        with self._lock:
            self._count += 1
            kept = [(n, ref) for n, ref in self._entries if ref() is not None and ref() is not errors]
            self._entries = collections.deque(kept, maxlen=64)
            self._entries.append((self._count, weakref.ref(errors)))

    def mark(self) -> int:
        with self._lock:
            return self._count

    def take_first_since(self, mark: int) -> Optional[BaseException]:
        """The pending exception of the feed that reported first after ``mark``; it is taken."""
        with self._lock:
            reported = [ref() for n, ref in self._entries if n > mark]
        for errors in reported:
            error = errors.take() if errors is not None else None
            if error is not None:
                return error
        return None


_REGISTRY = _Registry()


class CallbackErrors:
    """The exception a feed's host callbacks caught, held until the host raises it (once).

    Args:
      owner: the feed's name, for the log line and for errors.
    """

    def __init__(self, owner: str):
        self._owner = owner
        self._lock = threading.Lock()
        self._pending: Optional[BaseException] = None

    def record(self, error: BaseException) -> None:
        """Keeps ``error`` (the first one, while one is pending). Never raises."""
        with self._lock:
            if self._pending is not None:
                return
            self._pending = error
        _REGISTRY.add(self)
        try:
            try:
                text = str(error)
            except BaseException:
                text = f"<unprintable {type(error).__name__}>"
            _logger.warning(
                "%s: a host callback failed with %s: %s; the jitted computation goes on with "
                "zero-filled data and ok=False, and the exception is raised on the host by "
                "`with grainlike.host_errors():` around the call or by the next call on %s",
                self._owner, type(error).__name__, text, self._owner,
            )
        except BaseException:  # pragma: no cover - a broken handler must not raise here
            pass

    def take(self) -> Optional[BaseException]:
        """The pending exception, if any, which is no longer pending."""
        with self._lock:
            error, self._pending = self._pending, None
            return error

    def clear(self) -> None:
        """Forgets the pending exception without raising it (``close()``)."""
        with self._lock:
            self._pending = None

    def raise_pending(self) -> None:
        """Raises the pending exception, if any, as itself (its traceback and cause kept)."""
        error = self.take()
        if error is not None:
            raise error

    def check(self, ok: Any) -> None:
        """Raises the pending exception now if ``ok`` is a concrete False (an untraced call)."""
        import jax

        if not isinstance(ok, jax.core.Tracer) and not bool(ok):
            self.raise_pending()
            raise RuntimeError(
                f"{self._owner}: the data of this computation is incomplete (ok is False): a host "
                "callback failed, and its exception was raised before (by host_errors or an earlier "
                "call on the feed)"
            )


def _conform(out: Any, specs: Any, owner: str) -> Any:
    """``out`` with ``specs``' structure, shapes and dtypes, or a ValueError naming the difference."""
    import jax

    spec_leaves, treedef = jax.tree.flatten(specs)
    try:
        leaves = treedef.flatten_up_to(out)
    except (TypeError, ValueError) as e:
        raise ValueError(
            f"{owner}: the host returned {jax.tree.structure(out)} where the compiled program "
            f"expects {treedef}"
        ) from e
    conformed = []
    for leaf, spec in zip(leaves, spec_leaves):
        leaf = np.asarray(leaf)
        if leaf.shape != tuple(spec.shape):
            raise ValueError(
                f"{owner}: the host returned an array of shape {leaf.shape} where the compiled "
                f"program expects {tuple(spec.shape)}"
            )
        conformed.append(leaf.astype(spec.dtype, copy=False))
    return treedef.unflatten(conformed)


def host_callback(errors: CallbackErrors, fn: Callable[..., Any], specs: Any, *args: Any) -> tuple:
    """``(ok, outputs)`` of ``fn(*args)`` run on the host by an ordered ``io_callback``.

    ``ok`` is a bool scalar, False when ``fn`` raised (kept in ``errors``) or an
    exception was pending; ``outputs`` are then zeros of ``specs``, else ``fn``'s
    conformed to ``specs``.

    Raises:
      RuntimeError: JAX has no ``cpu`` backend to run host callbacks with.
    """
    import jax
    import jax.numpy as jnp
    from jax.experimental import io_callback

    _require_cpu_backend()

    def callback(*args: Any) -> tuple:
        if errors._pending is None:
            try:
                return np.bool_(True), _conform(fn(*args), specs, errors._owner)
            except BaseException as e:  # reported as data, raised on the host
                errors.record(e)
        else:
            _REGISTRY.add(errors)  # for a host_errors context around this computation
        return np.bool_(False), jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), specs)

    return io_callback(callback, (jax.ShapeDtypeStruct((), jnp.bool_), specs), *args, ordered=True)


_CPU_BACKEND: list = []  # [True] once the cpu backend was found


def _require_cpu_backend() -> None:
    """Raises now, at trace time, if JAX has no ``cpu`` device.

    ``io_callback`` looks one up each time a callback runs (``io_callback_impl`` in
    jax/_src/callback.py); under ``JAX_PLATFORMS=cuda`` that raises inside the callback.
    """
    if _CPU_BACKEND:
        return
    import jax

    try:
        jax.local_devices(backend="cpu")
    except RuntimeError as e:
        raise RuntimeError(
            "grainlike feeds jitted code through jax.experimental.io_callback, which runs host "
            f"callbacks with a 'cpu' device, and JAX has none (jax_platforms="
            f"{jax.config.jax_platforms!r}): set JAX_PLATFORMS=cuda,cpu (your accelerator, then "
            "cpu) before jax is imported, or leave JAX_PLATFORMS unset"
        ) from e
    _CPU_BACKEND.append(True)


class host_errors(contextlib.ContextDecorator):
    """Raises, on exit, the exception a grainlike host callback caught during the context.

    A grainlike callback inside a jitted computation never raises (see the module
    docstring). On leaving this context (or a function decorated with
    ``@host_errors()``), JAX's pending host callbacks are waited for
    (``jax.effects_barrier()``) and the first exception a grainlike callback
    reported during the context (``EOFError`` at the end of the data, say) is
    raised as itself, with its traceback and cause: one it caught, or one caught
    earlier that no one raised yet. Exceptions of other callbacks, and any
    exception already leaving the context, pass unchanged.

    Example:
      with grain.host_errors():
          params = jax.block_until_ready(train(params))   # EOFError at the end of data
    """

    def __enter__(self) -> "host_errors":
        self._mark = _REGISTRY.mark()
        return self

    def __exit__(self, kind: Any, value: Any, traceback: Any) -> bool:
        if value is not None:
            return False
        jax = sys.modules.get("jax")
        if jax is not None:
            jax.effects_barrier()
        error = _REGISTRY.take_first_since(self._mark)
        if error is not None:
            raise error
        return False
