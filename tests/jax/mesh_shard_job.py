"""One JAX process of a job whose loader is ``grain.loader(...).shard(mesh)``.

mesh_shard_job.py PROCESS_ID NUM_PROCESSES COORDINATOR

For 0 and 2 workers it reads every global batch of a shuffled loader with a
random map and a map with index, and prints (as the last line, JSON) each
global batch gathered from all processes, the rows and values of this
process's addressable shard, and the batch read after a restore from the state
after batch 2. Then the same loader on a mesh whose data axis has size 1 (the
other axis spans the processes): every process reads every row.
"""

import json
import sys

import jax

RECORDS, GLOBAL_BATCH = 44, 8  # 5 full global batches and one of 4 records


def builder(grain):
    return (
        grain.loader(list(range(RECORDS)))
        .shuffle(3)
        .random_map(lambda x, rng: {"x": x, "r": int(rng.integers(1000))})
        .map_with_index(lambda i, e: {**e, "i": i})
        .batch(GLOBAL_BATCH)
    )


def plain(batch):
    import numpy as np

    return {k: np.asarray(v).tolist() for k, v in batch.items()}


def main(process_id, num_processes, coordinator):
    # Collectives between processes on the CPU go through gloo; set before initialize.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator_address=coordinator,
        num_processes=num_processes,
        process_id=process_id,
        initialization_timeout=60,
    )
    import numpy as np
    from jax.experimental import multihost_utils
    from jax.sharding import Mesh

    import grainlike as grain

    mesh = Mesh(np.array(jax.devices()), ("data",))
    runs = {}
    for workers in (0, 2):
        loader = builder(grain).workers(workers).shard(mesh, data_axis_name="data").build()
        gathered, local = [], []
        with iter(loader) as it:
            for n, batch in enumerate(it):
                gathered.append(plain(multihost_utils.process_allgather(batch, tiled=True)))
                (shard,) = batch["x"].addressable_shards
                rows = shard.index[0]
                local.append([rows.start, rows.stop, np.asarray(shard.data).tolist()])
                if n == 1:
                    state = it.get_state()
        with iter(loader) as it:
            it.set_state(state)
            restored = plain(multihost_utils.process_allgather(next(it), tiled=True))
        runs[workers] = {"global": gathered, "local": local, "restored": restored, "len": len(loader)}

    replicated_mesh = Mesh(np.array(jax.devices()).reshape(1, num_processes), ("data", "model"))
    with iter(builder(grain).shard(replicated_mesh).build()) as it:
        batch = next(it)
        (shard,) = batch["x"].addressable_shards
        replicated = {"shape": list(batch["x"].shape), "local": np.asarray(shard.data).tolist()}
    print(json.dumps({"process": jax.process_index(), "runs": runs, "replicated": replicated}), flush=True)
    jax.distributed.shutdown()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
