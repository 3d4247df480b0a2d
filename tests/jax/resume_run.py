"""A sampling run that saves every second step and checkpoints; run as a script by test_io.

    python resume_run.py MODE CHECKPOINT_DIR OUT.npy
MODE: "fresh" (start over), "slow" (fresh, pausing between chunks so it can be
killed), "resume" (continue from the last checkpoint in CHECKPOINT_DIR).
"""

import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import grainlike as grain
from grainlike import io

TOTAL, CHUNK, EVERY = 24, 4, 4


def main(mode: str, checkpoint_dir: str, out: str) -> None:
    data = grain.reference_data({"x": np.arange(50, dtype=np.float32)}, cache_size=3, batch_size=4, seed=1)
    init_save, save, postprocess_save = io.save(
        io.MemoryCollector(), checkpoint_every=EVERY, checkpoint_dir=checkpoint_dir, data=data)
    carry0 = {"w": jnp.float32(0), "key": jax.random.PRNGKey(0)}
    checkpoint = io.load(checkpoint_dir, carry0, data=data) if mode == "resume" else None
    if checkpoint is not None:
        carry, data_state, done = checkpoint.carry, checkpoint.data_state, checkpoint.step
    else:
        carry, data_state, done = carry0, data.init(shuffle=True), 0
    sample = {"w": jnp.float32(0), "x0": jnp.float32(0)}
    saving_state = init_save(sample, carry0, TOTAL // 2, resume=checkpoint)

    def step(c, _):
        carry, data_state, saving_state = c
        data_state, batch, _ = data.next(data_state)
        key, sub = jax.random.split(carry["key"])
        w = carry["w"] * 0.5 + batch["x"].mean() + jax.random.normal(sub)
        carry = {"w": w, "key": key}
        saving_state, _ = save(saving_state, saving_state.step % 2 == 0, {"w": w, "x0": batch["x"][0]},
                               checkpoint=carry, data_state=data_state)
        return (carry, data_state, saving_state), None

    run = jax.jit(lambda c: jax.lax.scan(step, c, None, length=CHUNK)[0])
    c = (carry, data_state, saving_state)
    while done < TOTAL:
        c = jax.block_until_ready(run(c))
        done += CHUNK
        if mode == "slow":
            time.sleep(0.4)
    result = postprocess_save(c[2], None)
    np.savez(out, count=np.asarray(result["sample_count"]), **result["samples"])


if __name__ == "__main__":
    main(*sys.argv[1:4])
