"""A small training run that tests/checkpoint/test_kill_anywhere.py kills at any moment.

    kill_anywhere_train.py WORKDIR --workers W [--device]

A DataLoader with W worker processes reads an in-memory source, one epoch,
shuffled (with ``--device``, its batches put on the device two ahead by a
``DeviceIterator``); a numpy "model" is updated from every batch; an asynchronous Orbax
CheckpointManager saves model and iterator every ``SAVE_EVERY`` steps. Every
delivered record id goes to ``WORKDIR/log`` (``"<step> <id>"`` per line, fsynced
before the step counts). A run resumes from the latest complete checkpoint:
it restores model and iterator, trims the log to the checkpoint's step and
checks that the restored model is the one the trimmed log implies (exit 3 if
not). Markers on stdout say where it is: ``imported``, ``started <step>``,
``step <k>``, ``saved <k>``, ``done``.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

NUM_RECORDS = 512
BATCH = 2
SAVE_EVERY = 4
SEED = 11
MODEL_SIZE = 16 * 1024  # float64: 128 KiB


def marker(text: str) -> None:
    os.write(1, (text + "\n").encode())


def loader(lib, worker_count: int):
    return lib.DataLoader(
        data_source=lib.InMemoryDataSource(list(range(NUM_RECORDS))),
        sampler=lib.IndexSampler(NUM_RECORDS, lib.NoSharding(), shuffle=True, num_epochs=1, seed=SEED),
        operations=[lib.Batch(BATCH)],
        worker_count=worker_count,
    )


def read_log(path: str, last_step: int) -> list[tuple[int, int]]:
    """The log's complete lines up to ``last_step``: ``[(step, id), ...]``."""
    if not os.path.exists(path):
        return []
    with open(path) as f:
        text = f.read()
    entries = []
    for line in text.split("\n")[:-1]:  # the last piece has no newline: cut by a kill
        step, record = map(int, line.split())
        if step <= last_step:
            entries.append((step, record))
    return entries


def write_log(path: str, entries: list[tuple[int, int]]) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write("".join(f"{s} {i}\n" for s, i in entries))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(os.path.dirname(path), os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def model_of(entries: list[tuple[int, int]]) -> np.ndarray:
    """The model after training on ``entries``: every step adds its ids' sum; [0] counts ids."""
    model = np.full(MODEL_SIZE, float(sum(i for _, i in entries)))
    model[0] += len(entries)
    return model


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("workdir")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--device", action="store_true", help="through a DeviceIterator")
    args = parser.parse_args()

    import orbax.checkpoint as ocp

    import grainlike as grain
    from grainlike.jax.device_iterator import DeviceIterator

    marker("imported")
    log_path = os.path.join(args.workdir, "log")
    options = ocp.CheckpointManagerOptions(
        save_interval_steps=SAVE_EVERY, max_to_keep=2, enable_async_checkpointing=True
    )
    it = iter(loader(grain, args.workers))
    if args.device:
        # Batches put on the device ahead of the loop, as in training; the state
        # saved is that of the batches the loop received.
        it = DeviceIterator(it, prefetch=2)
    with ocp.CheckpointManager(os.path.join(args.workdir, "ckpt"), options=options) as mngr, it:
        step = mngr.latest_step() or 0
        model = np.zeros(MODEL_SIZE)
        entries: list[tuple[int, int]] = []
        if step:
            restored = mngr.restore(step, args=ocp.args.Composite(
                model=ocp.args.StandardRestore(model),
                data=grain.checkpoint.CheckpointRestore(it),
            ))
            model = np.asarray(restored.model)
            entries = read_log(log_path, step)
            steps = sorted({s for s, _ in entries})
            if steps != list(range(1, step + 1)) or not np.array_equal(model, model_of(entries)):
                print(f"checkpoint {step} does not match the log: steps {steps}", file=sys.stderr)
                return 3
        write_log(log_path, entries)
        marker(f"started {step}")
        with open(log_path, "a") as log:
            for batch in it:
                step += 1
                ids = [int(i) for i in np.asarray(batch)]
                log.write("".join(f"{step} {i}\n" for i in ids))
                log.flush()
                os.fsync(log.fileno())
                # A new array each step: the save in flight keeps the one it was given.
                model = model + sum(ids)
                model[0] += len(ids)
                marker(f"step {step}")
                if mngr.save(step, args=ocp.args.Composite(
                    model=ocp.args.StandardSave(model), data=grain.checkpoint.CheckpointSave(it)
                )):
                    marker(f"saved {step}")
        mngr.wait_until_finished()
    marker("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
