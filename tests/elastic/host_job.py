"""One JAX process of a job whose DataLoader checkpoint is restored on another process count.

host_job.py PROCESS_ID NUM_PROCESSES COORDINATOR CHECKPOINT_DIR MODE STEPS WORKERS

MODE "save": run STEPS global steps, write the checkpoint (``process_i-of-N.json``
through the Orbax v1 ``save``), print the records delivered. MODE "restore":
restore from CHECKPOINT_DIR (written by any number of processes), run to the
end, print the records delivered. The global batch is 6 records: each of N
processes loads 6 // N per step.
"""

import asyncio
import json
import pathlib
import sys

import jax

jax.config.update("jax_cpu_collectives_implementation", "gloo")

RECORDS, EPOCHS, GLOBAL_BATCH = 24, 2, 6


def main(process_id, num_processes, coordinator, checkpoint_dir, mode, steps, workers):
    if num_processes > 1:
        jax.distributed.initialize(
            coordinator_address=coordinator,
            num_processes=num_processes,
            process_id=process_id,
            initialization_timeout=60,
        )
    import numpy as np

    import grainlike as grain

    shard = grain.ShardByJaxProcess(drop_remainder=True)
    loader = grain.DataLoader(
        data_source=grain.RangeDataSource(0, RECORDS, 1),
        sampler=grain.IndexSampler(RECORDS, shard, shuffle=True, num_epochs=EPOCHS, seed=5),
        # drop_remainder=False: the last partial batch of each worker counts too.
        operations=[grain.Batch(GLOBAL_BATCH // num_processes)],
        worker_count=workers,
    )
    delivered = []
    with iter(loader) as it:
        if mode == "save":
            for _ in range(steps):
                delivered += np.asarray(next(it)).tolist()
            asyncio.run(_await_twice(it.save(checkpoint_dir)))
        else:
            asyncio.run(_await_twice(it.load(checkpoint_dir)))
            for batch in it:
                delivered += np.asarray(batch).tolist()
    print(json.dumps({"process": process_id, "delivered": delivered}), flush=True)


async def _await_twice(coroutine):
    # Orbax v1: save()/load() return a coroutine that does the writing/reading.
    await (await coroutine)


if __name__ == "__main__":
    a = sys.argv[1:]
    main(int(a[0]), int(a[1]), a[2], pathlib.Path(a[3]), a[4], int(a[5]), int(a[6]))
