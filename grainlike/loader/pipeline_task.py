"""The DataLoader's pipeline as a task for the worker pool.

Worker ``w`` of ``W`` reads local positions ``w, w + W, ...``; its state is the
count of those it has read (an int), and the loader's checkpoint is these counts
plus whose turn is next (``Positions``).
"""

from __future__ import annotations

from typing import Any, Iterator, Optional

from grainlike.core.tree import Allocator
from grainlike.dataset.workers import WorkerPool
from grainlike.loader.options import MultiprocessingOptions
from grainlike.loader.pipeline import Pipeline, describe_op
from grainlike.loader.state import Positions


class PipelineTask:
    """A ``WorkerTask`` over a ``Pipeline``: states are positions.

    Args:
      pipeline: the loader's work.
    """

    def __init__(self, pipeline: Pipeline):
        self.pipeline = pipeline

    def outputs(
        self, worker_index: int, worker_count: int, state: int, alloc: Optional[Allocator]
    ) -> Iterator[tuple[int, Any]]:
        self.pipeline.batch_alloc = alloc
        return self.pipeline.outputs(worker_index, worker_count, state)

    def end_state(self, worker_index: int, worker_count: int, state: int) -> int:
        # Like grain, a worker's position stays at its last delivered output;
        # restoring re-reads (and again drops) what a filter removed after it.
        return state

    def pickling_error(self, error: Exception) -> BaseException:
        """A TypeError naming the source, sampler or operation that cannot be pickled."""
        import cloudpickle

        pipeline = self.pipeline
        parts = [("data_source", pipeline.data_source), ("sampler", pipeline.sampler)]
        parts += [(f"operations[{i}] {describe_op(op)}", op) for i, op in enumerate(pipeline.operations)]
        for label, part in parts:
            try:
                cloudpickle.dumps(part)
            except Exception as inner:
                return TypeError(
                    f"cannot send the pipeline to worker processes: {label} cannot be "
                    f"pickled ({type(inner).__name__}: {inner}). Workers need picklable "
                    "sources and transforms; use worker_count=0 to run in process."
                )
        return TypeError(f"cannot send the pipeline to worker processes: {error}")


class PipelineWorkers(WorkerPool):
    """The loader's worker pool; ``positions`` is its checkpoint.

    Args:
      pipeline: the work; worker ``w`` reads positions ``w, w + W, ...``.
      worker_count: number of worker processes (> 0).
      positions: where each worker starts and whose turn is first.
      options: buffer size per worker, profiling, warm start.
    """

    def __init__(
        self,
        pipeline: Pipeline,
        worker_count: int,
        positions: Positions,
        options: MultiprocessingOptions,
    ):
        super().__init__(
            PipelineTask(pipeline),
            worker_count,
            positions.next_positions,
            positions.next_worker,
            buffer_size=options.per_worker_buffer_size,
            profile=options.enable_profiling,
            warm_start=options.warm_start,
        )

    @property
    def positions(self) -> Positions:
        """Each worker's next position and whose turn is next."""
        return Positions(list(self.states), self.next_worker)
