"""Batches drawn from inside ``jax.jit`` / ``lax.scan``, through an ordered host callback.

``InJitIterator.draw()`` returns the next ``batches_per_call`` batches stacked on a
new leading axis, so a jitted ``lax.scan`` over many steps visits the host once per
``batches_per_call`` steps; ``next()`` returns one batch per call. Failures never
raise inside the callback (see ``grainlike.jax.host_callbacks``). The stacks come
back as one host-to-device transfer per draw onto the device the computation runs
on; for batches sharded over several devices or JAX processes, use a
``DeviceIterator``. For a device-side cache handing out one batch at a time, see
``grainlike.reference_data``. Importing this module costs numpy only.
"""

from __future__ import annotations

import itertools
from typing import Any, Callable, Iterator, Optional

import numpy as np

from grainlike.core import tree
from grainlike.core.errors import check_int, is_int
from grainlike.core.protocols import ClosesOnExit
from grainlike.core.read_ahead import ReadAhead
from grainlike.jax.host_callbacks import CallbackErrors, host_callback
from grainlike.jax.jit_batches import _device_specs, _numeric

__all__ = ["InJitIterator"]

# Batches per host visit of scan() when batches_per_call is not given.
_DEFAULT_K = 8


class _Stacks:
    """Pulls ``k`` batches at a time from an iterator and stacks them (numpy)."""

    def __init__(self, iterator: Iterator[Any], k: int):
        self._iterator = iterator
        self.k = k

    def __next__(self) -> Any:
        batches = list(itertools.islice(self._iterator, self.k))
        if not batches:
            raise EOFError("InJitIterator: the wrapped iterator has ended")
        if len(batches) < self.k:
            raise EOFError(
                f"InJitIterator: the wrapped iterator ended after {len(batches)} of "
                f"the {self.k} batches of a draw; use a loader that repeats "
                "(num_epochs=None), a step count it covers, or next() (one batch "
                "per call)"
            )
        return tree.stack([_numeric(b, "InJitIterator") for b in batches])


def _check_shape(x: Any, spec: Any) -> None:
    """A batch of another shape than the compiled program's is a clear error (the callback casts)."""
    x = np.asarray(x)
    if x.shape != tuple(spec.shape):
        raise ValueError(
            f"InJitIterator: a batch of shape {x.shape[1:]} where the compiled program "
            f"expects {tuple(spec.shape[1:])}; a short final batch? Use Batch(..., "
            "drop_remainder=True) or Batch(..., pad=True)"
        )


class InJitIterator(ClosesOnExit):
    """Feeds batches to jitted code: ``draw()`` returns the next ``k`` batches, stacked.

    Args:
      iterator: yields numeric batches (pytrees of numpy arrays), usually
        ``iter(DataLoader)``; if it has ``get_state()/set_state()``, so does this.
      batches_per_call: ``k``, batches returned by one ``draw()`` (one host round
        trip); ``scan`` needs ``num_steps`` to be a multiple of it. None (the
        default): ``scan`` uses 8 and ``draw()`` is an error (it would return 8
        stacked batches to code that may expect one); ``next()`` returns one.
      prefetch: stacks of ``k`` batches prepared ahead in a background thread; 0
        reads in the callback itself.
      spec: optional per-batch ``jax.ShapeDtypeStruct`` pytree (e.g.
        ``element_spec(loader)``); without it the first stack is read when
        ``draw`` is first traced, to learn the shapes.

    At the end of the data (use a loader that repeats, or a step count the
    loader covers) or when reading a batch fails, the callback returns zeros
    and ``ok=False``; the exception (``EOFError`` at the end) is raised by
    ``grainlike.host_errors()`` around the jitted call or by the feed's next
    host call. ``get_state()`` is the wrapped iterator's state after the last
    batch delivered to jitted code: call it once the computation has finished
    (``jax.block_until_ready``).

    A feed serves either ``draw()``/``scan()`` or ``next()``, whichever is used first.

    Example:
      feed = InJitIterator(iter(loader), batches_per_call=8)

      @jax.jit
      def train(params):
          return feed.scan(train_step, params, num_steps=64)  # 8 host visits

      params, losses = train(params)
      jax.block_until_ready(params)
      state = feed.get_state()  # after the 64th batch
    """

    def __init__(self, iterator: Iterator[Any], *, batches_per_call: Optional[int] = None,
                 prefetch: int = 1, spec: Any = None):
        batches_per_call = check_int("batches_per_call", batches_per_call, 1, none_ok=True)
        prefetch = check_int("prefetch", prefetch)
        iterator = iter(iterator)
        self._explicit_k = batches_per_call is not None
        self._k = batches_per_call if batches_per_call is not None else _DEFAULT_K
        self._mode: Optional[str] = None  # "draw" or "next", fixed by the first use
        self._spec = spec  # per batch, as given
        self._chunk_spec: Any = None  # per draw, canonical dtypes
        self._stacks = _Stacks(iterator, self._k)
        # Reads stacks ahead; the state is the wrapped iterator's after the last
        # stack delivered, also when a draw ends part-way through a stack.
        self._feed = ReadAhead(iterator, prefetch, "InJitIterator", items=self._stacks, keep_state=True)
        self._errors = CallbackErrors("InJitIterator")

    @property
    def batches_per_call(self) -> int:
        return self._k

    def _use(self, mode: str) -> None:
        """Fixes the feed to ``draw`` (stacks of k) or ``next`` (one batch) on first use."""
        with self._feed.lock:
            if self._mode is None:
                if mode == "next":
                    self._k = self._stacks.k = 1  # nothing was read yet
                self._mode = mode
            elif self._mode != mode:
                raise ValueError(
                    f"this InJitIterator serves {self._mode}() already; a feed serves either "
                    "draw()/scan() or next(): make a second feed for the other"
                )

    def _host_draw(self) -> Any:
        """The io_callback: the next stack."""
        import jax

        with self._feed.lock:
            stack, state = self._feed.read()
            # The specs are JAX pytrees (possibly the user's, from element_spec), so the
            # stack is matched to them with JAX's own tree functions. A stack that does
            # not match is not delivered: the position stays before it.
            jax.tree.map(_check_shape, stack, self._chunk_spec)
            self._feed.deliver(state)
        return stack

    def _spec_of_draw(self) -> Any:
        import jax

        with self._feed.lock:
            if self._chunk_spec is None and self._spec is None:
                self._chunk_spec = _device_specs(self._feed.peek())
            elif self._chunk_spec is None:
                self._chunk_spec = jax.tree.map(lambda s: jax.ShapeDtypeStruct(
                    (self._k,) + tuple(s.shape), jax.dtypes.canonicalize_dtype(s.dtype)), self._spec)
            return self._chunk_spec

    def draw(self, *, with_ok: bool = False) -> Any:
        """The next ``batches_per_call`` batches, stacked on a new leading axis.

        Call inside jitted code (or eagerly); each call is one ordered host
        callback, so draws happen in program order across calls and jits. Every
        batch of the stack counts as delivered: use them all (``lax.scan`` over
        the leading axis), or call ``next()`` for one batch at a time.

        Args:
          with_ok: also return ``ok``, a bool scalar, False when the draw failed
            (the end of the data, ...) and the stack is zeros.

        Raises:
          ValueError: ``batches_per_call`` was not given.
          Exception: one a callback of this feed caught and no one raised yet
            (called eagerly, this draw's).
        """
        if not self._explicit_k:
            raise ValueError(
                "InJitIterator.draw() returns batches_per_call batches stacked on a new "
                "leading axis, and every one of them counts as delivered; pass "
                "batches_per_call=k explicitly (and use all k), or call next() for one batch"
            )
        ok, stack = self._callback("draw")
        return (stack, ok) if with_ok else stack

    def _callback(self, mode: str) -> tuple:
        """``(ok, stack or batch)`` of one ordered callback of ``mode``; raises at once when not traced."""
        import jax

        self._errors.raise_pending()
        self._use(mode)
        fn, spec = self._host_draw, self._spec_of_draw()
        if mode == "next":
            spec = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape[1:], s.dtype), spec)
            fn = lambda: jax.tree.map(lambda x: x[0], self._host_draw())  # noqa: E731
        ok, out = host_callback(self._errors, fn, spec)
        self._errors.check(ok)
        return ok, out

    def next(self, *, with_ok: bool = False) -> Any:
        """The next batch (one ordered host callback per call), inside jitted code or eagerly.

        Args:
          with_ok: also return ``ok``, a bool scalar, False when no batch was
            delivered (the end of the data, ...) and the batch is zeros.

        Raises:
          Exception: one a callback of this feed caught and no one raised yet
            (called eagerly, this call's).
        """
        ok, batch = self._callback("next")
        return (batch, ok) if with_ok else batch

    def scan(self, step: Callable[[Any, Any], tuple], carry: Any, num_steps: int, *,
             with_ok: bool = False) -> tuple:
        """``lax.scan`` of ``step(carry, batch) -> (carry, out)`` over ``num_steps`` batches.

        One ``draw()`` per ``batches_per_call`` steps. Returns ``(carry, outs)``
        with ``outs`` stacked over the ``num_steps`` steps. When a draw fails
        (the end of the data, ...), ``step`` is skipped for it and every later
        one: ``carry`` is the one after the last batch delivered and those
        steps' ``outs`` are zeros.

        Args:
          with_ok: also return ``ok``, a bool scalar, False when a draw failed:
            ``(carry, outs, ok)``.

        Raises:
          ValueError: num_steps is not a positive multiple of batches_per_call.
          Exception: one a callback of this feed caught and no one raised yet.
        """
        import jax
        import jax.numpy as jnp

        if not is_int(num_steps) or num_steps <= 0 or num_steps % self._k:
            raise ValueError(
                f"num_steps must be a positive multiple of batches_per_call={self._k}, "
                f"got {num_steps!r}"
            )

        def inner(c: Any, stack: Any) -> tuple:
            return jax.lax.scan(step, c, stack)

        def outer(c: tuple, _: Any) -> tuple:
            c, all_ok = c
            ok, stack = self._callback("draw")
            # The steps of a draw that delivered nothing are skipped, not run on zeros.
            skipped = jax.eval_shape(inner, c, stack)[1]
            c, outs = jax.lax.cond(
                ok, inner,
                lambda c, _: (c, jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), skipped)),
                c, stack,
            )
            return (c, all_ok & ok), outs

        (carry, ok), outs = jax.lax.scan(outer, (carry, jnp.bool_(True)), None,
                                         length=num_steps // self._k)
        outs = jax.tree.map(lambda x: x.reshape((num_steps,) + x.shape[2:]), outs)
        return (carry, outs, ok) if with_ok else (carry, outs)

    def get_state(self) -> Any:
        """The wrapped iterator's state after the last batch delivered to jitted code.

        Raises:
          Exception: one a callback of this feed caught and no one raised yet
            (raised once; the next call returns the state).
        """
        self._errors.raise_pending()
        return self._feed.get_state()

    def set_state(self, state: Any) -> None:
        """Restores the wrapped iterator; buffered stacks are dropped.

        An invalid state raises what the wrapped ``set_state`` raises and leaves
        the position unchanged. An exception a callback of this feed caught and
        no one raised yet is raised first (and the state is not set).
        """
        self._errors.raise_pending()
        self._feed.set_state(state)

    def close(self) -> None:
        """Stops the prefetch thread and closes the wrapped iterator. Idempotent.

        Forgets an exception a callback caught and no one raised; raises nothing of it.
        """
        self._errors.clear()
        self._feed.close()
