"""The worker pool's warm start: a held worker's outputs computed in the calling process.

See ``WorkerPool``: when ``next()`` has to start the workers and ``warm_start``
is set, each worker starts held; until it reports that it has loaded its task,
the calling process computes its outputs with the same code from the same
state, then tells it where to go on.
"""

from __future__ import annotations

from typing import Any

from grainlike.core.errors import WorkerDiedError, add_note
from grainlike.workers.error_transfer import rebuild_error
from grainlike.workers.liveness import exit_error
from grainlike.workers.messages import ERR, EXIT, READY, START


class WarmStart:
    """``WorkerPool``'s methods for held workers (its attributes ``_held``, ``_local``, ``_task``, ...)."""

    def _release_ready(self) -> None:
        """Lets every held worker that has loaded its task go on by itself."""
        sd = self._shutdown
        if sd.launch_error is not None:
            raise sd.launch_error
        for w in range(sd.launched):
            if not self._held[w] or self.exhausted[w] or self._failed[w]:
                continue
            if not self._streams[w].carry and not sd.results[w].poll():
                continue
            msg, _ = self._message(w)
            if msg[0] == ERR:  # The task failed to load in the worker.
                raise self._failure(w, rebuild_error(w, sd.procs[w].pid, msg))
            if msg[0] == EXIT:
                raise self._failure(w, exit_error(self._shutdown.procs[w].pid, w, self._w, self.states[w], msg, self._then()))
            if msg[0] != READY:
                raise RuntimeError(f"unexpected message from held worker {w}: {msg[0]!r}")
            local = self._local.pop(w, None)
            if local is not None:
                local.close()
            try:
                sd.controls[w].send((START, self.states[w]))
            except (OSError, ValueError):
                # The worker died after it reported ready.
                if self._closed:
                    raise self._closed_error(w) from None
                raise self._failure(w, self._died_error(w)) from None
            self._held[w] = False
        self._holding = any(self._held)

    def _local_output(self, w: int) -> tuple[bool, Any]:
        """Worker ``w``'s next output, computed here; ``(False, None)`` at its end."""
        local = self._local.get(w)
        if local is None:
            local = self._task.outputs(w, self._w, self.states[w], None)
            self._local[w] = local
        try:
            state, output = next(local)
        except StopIteration:
            # As for a worker's "end".
            del self._local[w]
            self.exhausted[w] = True
            self.states[w] = self._task.end_state(w, self._w, self.states[w])
            self._advance(w)
            return False, None
        except SystemExit as e:  # It would end worker w's process (see main), not the caller's.
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            raise WorkerDiedError(
                f"Worker process was terminated unexpectedly with exit code {code}: "
                f"sys.exit({e.code!r}) in the outputs of grainlike worker {w} of {self._w}, "
                "computed in the calling process while the worker starts (warm_start); "
                f"its state after its last delivered output: {self.states[w]!r}"
            ) from e
        except Exception as e:
            add_note(
                e,
                f"grainlike: raised in the calling process, which computes worker {w}'s "
                "outputs while it starts (warm_start=False runs every transform in the "
                "workers)",
            )
            raise
        self.states[w] = state
        self._advance(w)
        return True, output
