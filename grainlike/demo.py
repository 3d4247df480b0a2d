"""End-to-end demo: a JAX classifier trained on handwritten digits fed by grainlike.

Run it with ``./tools/demo`` (or ``python -m grainlike.demo``). It writes
scikit-learn's 1,797 8x8 digits (shipped with scikit-learn) to ArrayRecord files
once; reads them shuffled for several epochs with a decode, a random shift and
``Batch`` in two worker processes, moved to the device ahead of use by a
``DeviceIterator``; trains an MLP with Adam in plain JAX, saving the model and the
pipeline's position with Orbax; stops part-way, as if killed, and resumes from the
last checkpoint in a new process, which checks that the batches it replays are
the ones the first process saw, and reports test accuracy.

Only numpy is imported at module level: the worker processes that run the
transforms below must not pay for importing JAX.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

import grainlike as grain

# Train/test split of the 1,797 digits; the split is fixed so every run agrees.
_NUM_TEST = 360
_SPLIT_SEED = 1234
# Bump when the record layout changes, so an old cache is rebuilt.
_DATA_VERSION = 1
_FINGERPRINTS = "batch_fingerprints.json"


def _encode(image: np.ndarray, label: int) -> bytes:
    """One record: the label byte, then 64 uint8 pixels (row-major 8x8)."""
    pixels = np.clip(np.rint(image * (255.0 / 16.0)), 0, 255).astype(np.uint8)
    return bytes([int(label)]) + pixels.tobytes()


def _write_array_record(path: str, records: list) -> None:
    from array_record.python.array_record_module import ArrayRecordWriter

    # Written under a temporary name and renamed, so an interrupted first run never
    # leaves a truncated file that a later run would take for the cache.
    partial = f"{path}.partial-{os.getpid()}"
    writer = ArrayRecordWriter(partial, "group_size:1")
    try:
        for record in records:
            writer.write(record)
    finally:
        writer.close()
    os.replace(partial, path)


def prepare_data(data_dir: str) -> dict:
    """Writes the digits to ``train.array_record`` / ``test.array_record`` once.

    Args:
      data_dir: where the files go; reused when they are already there.

    Returns:
      ``{"train": path, "test": path}``.
    """
    os.makedirs(data_dir, exist_ok=True)
    paths = {
        split: os.path.join(data_dir, f"digits-v{_DATA_VERSION}-{split}.array_record")
        for split in ("train", "test")
    }
    if all(os.path.exists(p) for p in paths.values()):
        return paths
    from sklearn.datasets import load_digits  # Slow to import; only on the first run.

    digits = load_digits()
    order = np.random.default_rng(_SPLIT_SEED).permutation(len(digits.target))
    test, train = order[:_NUM_TEST], order[_NUM_TEST:]
    for split, idx in (("train", train), ("test", test)):
        _write_array_record(
            paths[split], [_encode(digits.images[i], digits.target[i]) for i in idx]
        )
    return paths


class DecodeDigit(grain.MapTransform):
    """Record bytes to ``{"image": float32[8, 8] in [-1, 1], "label": int32}``."""

    def map(self, record: bytes) -> dict:
        raw = np.frombuffer(record, dtype=np.uint8)
        image = raw[1:].reshape(8, 8).astype(np.float32) * (2.0 / 255.0) - 1.0
        return {"image": image, "label": np.int32(raw[0])}


class RandomShift(grain.RandomMapTransform):
    """With probability ``p``, shifts the image by up to ``max_shift`` pixels each way.

    The draws come from the record's own rng, so they are the same on every run,
    with any number of workers, and after a restore. On 8x8 digits a one-pixel
    shift is already a large change, hence shifting only some of the images.

    Args:
      max_shift: largest shift, in pixels, along each axis.
      p: probability of shifting an image at all.
    """

    def __init__(self, max_shift: int = 1, p: float = 0.5):
        self.max_shift = max_shift
        self.p = p

    def random_map(self, element: dict, rng: np.random.Generator) -> dict:
        if rng.random() >= self.p:
            return element
        dy, dx = rng.integers(-self.max_shift, self.max_shift + 1, size=2)
        image = element["image"]
        shifted = np.full_like(image, -1.0)
        h, w = image.shape
        shifted[max(dy, 0) : h + min(dy, 0), max(dx, 0) : w + min(dx, 0)] = image[
            max(-dy, 0) : h + min(-dy, 0), max(-dx, 0) : w + min(-dx, 0)
        ]
        return {"image": shifted, "label": element["label"]}


def train_loader(path: str, args: argparse.Namespace) -> grain.DataLoader:
    source = grain.ArrayRecordDataSource([path])
    sampler = grain.IndexSampler(
        num_records=len(source),
        shard_options=grain.NoSharding(),
        shuffle=True,
        num_epochs=args.epochs,
        seed=args.seed,
    )
    return grain.DataLoader(
        data_source=source,
        sampler=sampler,
        operations=[
            DecodeDigit(),
            RandomShift(max_shift=1, p=0.5),
            grain.Batch(batch_size=args.batch_size, drop_remainder=True),
        ],
        worker_count=args.workers,
        # The files are local and small; read-ahead threads would only add overhead.
        read_options=grain.ReadOptions(num_threads=0, prefetch_buffer_size=args.batch_size),
    )


def eval_loader(path: str, batch_size: int) -> grain.DataLoader:
    source = grain.ArrayRecordDataSource([path])
    return grain.DataLoader(
        data_source=source,
        sampler=grain.SequentialSampler(len(source), grain.NoSharding()),
        operations=[DecodeDigit(), grain.Batch(batch_size=batch_size)],
        worker_count=0,
    )


def fingerprint(batch: dict) -> str:
    """A short hash of a batch's contents, to compare runs."""
    h = hashlib.sha1()
    for key in sorted(batch):
        h.update(np.ascontiguousarray(batch[key]).tobytes())
    return h.hexdigest()[:12]


def init_state(seed: int, hidden: int) -> dict:
    """MLP parameters (64 -> hidden -> 10) and Adam's moments, as one pytree."""
    import jax
    import jax.numpy as jnp

    k1, k2 = jax.random.split(jax.random.PRNGKey(seed))
    params = {
        "w1": jax.random.normal(k1, (64, hidden)) * jnp.sqrt(2.0 / 64),
        "b1": jnp.zeros(hidden),
        "w2": jax.random.normal(k2, (hidden, 10)) * jnp.sqrt(1.0 / hidden),
        "b2": jnp.zeros(10),
    }
    zeros = jax.tree_util.tree_map(jnp.zeros_like, params)
    return {"params": params, "m": zeros, "v": zeros, "step": jnp.zeros((), jnp.int32)}


def logits_fn(params: dict, images):
    import jax
    import jax.numpy as jnp

    x = jnp.reshape(images, (images.shape[0], -1))
    x = jax.nn.relu(x @ params["w1"] + params["b1"])
    return x @ params["w2"] + params["b2"]


def make_train_step(learning_rate: float):
    """A jitted step: cross-entropy loss, gradients, one Adam update."""
    import jax
    import jax.numpy as jnp

    b1, b2, eps = 0.9, 0.999, 1e-8

    def loss_fn(params, batch):
        logits = logits_fn(params, batch["image"])
        labels = jax.nn.one_hot(batch["label"], 10)
        return -jnp.mean(jnp.sum(labels * jax.nn.log_softmax(logits), axis=-1))

    @jax.jit
    def step(state, batch):
        loss, grads = jax.value_and_grad(loss_fn)(state["params"], batch)
        t = state["step"] + 1
        m = jax.tree_util.tree_map(lambda m, g: b1 * m + (1 - b1) * g, state["m"], grads)
        v = jax.tree_util.tree_map(lambda v, g: b2 * v + (1 - b2) * g * g, state["v"], grads)
        lr = learning_rate * jnp.sqrt(1 - b2**t) / (1 - b1**t)
        params = jax.tree_util.tree_map(
            lambda p, m, v: p - lr * m / (jnp.sqrt(v) + eps), state["params"], m, v
        )
        return {"params": params, "m": m, "v": v, "step": t}, loss

    return step


def accuracy(params: dict, loader: grain.DataLoader) -> float:
    import jax
    import jax.numpy as jnp

    predict = jax.jit(lambda p, x: jnp.argmax(logits_fn(p, x), axis=-1))
    correct = total = 0
    for batch in loader:
        correct += int(jnp.sum(predict(params, batch["image"]) == batch["label"]))
        total += len(batch["label"])
    return correct / total


def run(args: argparse.Namespace) -> dict:
    """Trains from scratch, or from the latest checkpoint with ``args.resume``.

    The first run stops at ``args.stop_at`` (default: half-way), the resumed run
    at the end, where it also measures test accuracy.

    Returns:
      What the run measured: steps, throughput, time to first batch, whether the
      replayed batches matched, and (at the end) test accuracy.
    """
    import jax
    import orbax.checkpoint as ocp
    from tqdm import tqdm

    from grainlike.jax.device_iterator import DeviceIterator

    paths = prepare_data(os.path.join(args.workdir, "data"))
    ckpt_dir = os.path.join(args.workdir, "checkpoints")
    prints_path = os.path.join(args.workdir, _FINGERPRINTS)
    if not args.resume:
        # A new run starts from nothing; the data files above are kept as a cache.
        shutil.rmtree(ckpt_dir, ignore_errors=True)
    loader = train_loader(paths["train"], args)
    total_steps = len(loader)
    stop_at = total_steps if args.resume else (args.stop_at or total_steps // 2)
    if not 0 < stop_at <= total_steps or (not args.resume and stop_at == total_steps):
        raise SystemExit(f"--stop-at must be in [1, {total_steps - 1}], got {stop_at}")
    state = init_state(args.seed, args.hidden)
    train_step = make_train_step(args.learning_rate)
    options = ocp.CheckpointManagerOptions(save_interval_steps=args.checkpoint_every, max_to_keep=2)
    recorded: dict = {}

    t_iter = time.perf_counter()
    # Batches go to the device in a background thread, two ahead of the training
    # step; the iterator's state stays that of the last batch handed out, so a
    # checkpoint neither skips nor repeats the prefetched ones.
    iterator = DeviceIterator(iter(loader), prefetch=2)
    with ocp.CheckpointManager(ckpt_dir, options=options) as manager:
        start_step = 0
        if args.resume:
            start_step = manager.latest_step()
            if start_step is None:
                raise SystemExit(f"--resume: no checkpoint in {ckpt_dir}")
            abstract = jax.tree_util.tree_map(ocp.utils.to_shape_dtype_struct, state)
            restored = manager.restore(
                start_step,
                args=ocp.args.Composite(
                    state=ocp.args.StandardRestore(abstract),
                    data=grain.PyGrainCheckpointRestore(iterator),
                ),
            )
            state = restored.state
            with open(prints_path) as f:
                recorded = json.load(f)

        t_restored = time.perf_counter()
        batch = next(iterator)
        # Cold for the first run (worker processes start), warm after a restore.
        first_batch_s = time.perf_counter() - (t_restored if args.resume else t_iter)
        bar = tqdm(
            total=total_steps * args.batch_size,
            initial=start_step * args.batch_size,
            unit="rec",
            unit_scale=True,
            desc="resumed " if args.resume else "training",
            mininterval=0.25,
        )
        replay_checked = replay_matched = 0
        step = start_step
        loss = float("nan")
        t_train = time.perf_counter()
        while True:
            step += 1
            fp = fingerprint(batch)
            if str(step) in recorded:
                replay_checked += 1
                replay_matched += recorded[str(step)] == fp
            recorded[str(step)] = fp
            state, loss = train_step(state, batch)
            bar.update(args.batch_size)
            if step % 10 == 0:
                bar.set_postfix(loss=f"{float(loss):.3f}")
            # The manager saves only every `save_interval_steps`; the pipeline's part
            # is a few hundred bytes of JSON, whatever the dataset size.
            manager.save(
                step,
                args=ocp.args.Composite(
                    state=ocp.args.StandardSave(state),
                    data=grain.PyGrainCheckpointSave(iterator),
                ),
            )
            if step >= stop_at:
                break
            batch = next(iterator)
        jax.block_until_ready(state)
        train_s = time.perf_counter() - t_train
        bar.close()
        manager.wait_until_finished()
        saved_step = manager.latest_step()
    iterator.close()
    with open(prints_path, "w") as f:
        json.dump(recorded, f)

    result = {
        "start_step": start_step,
        "end_step": step,
        "total_steps": total_steps,
        "saved_step": saved_step,
        "records": (step - start_step) * args.batch_size,
        "train_s": train_s,
        "first_batch_s": first_batch_s,
        "replay_checked": replay_checked,
        "replay_matched": replay_matched,
        "loss": float(loss),
    }
    if step == total_steps:
        result["test_accuracy"] = accuracy(state["params"], eval_loader(paths["test"], 256))
    return result


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m grainlike.demo",
        description="Train a JAX digit classifier fed by grainlike; checkpoint, "
        "interrupt and resume in a new process.",
    )
    parser.add_argument(
        "--workdir",
        default=os.path.join(tempfile.gettempdir(), "grainlike-demo"),
        help="where the data cache and checkpoints go (default: %(default)s)",
    )
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--learning-rate", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--checkpoint-every", type=int, default=25, help="steps between checkpoints")
    parser.add_argument(
        "--stop-at",
        type=int,
        default=None,
        help="step at which the first process stops, as if killed (default: half-way)",
    )
    parser.add_argument("--resume", action="store_true", help="continue from the latest checkpoint")
    return parser.parse_args(argv)


def _forwarded(args: argparse.Namespace) -> list:
    names = ("workdir", "epochs", "batch_size", "workers", "hidden", "learning_rate", "seed", "checkpoint_every")
    return [f"--{name.replace('_', '-')}={getattr(args, name)}" for name in names]


def main(argv=None) -> int:
    args = parse_args(argv)
    result_path = os.path.join(args.workdir, "resumed_result.json")
    if args.resume:
        result = run(args)
        with open(result_path, "w") as f:
            json.dump(result, f)
        return 0

    t0 = time.perf_counter()
    first = run(args)
    print(
        f"Stopped at step {first['end_step']} of {first['total_steps']} as if the job "
        f"were killed; the last checkpoint is step {first['saved_step']}. "
        "Resuming in a new process ...",
        flush=True,
    )
    if os.path.exists(result_path):
        os.remove(result_path)
    # The new process must import this same grainlike, installed or not.
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(grain.__file__)))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
    child = subprocess.run(
        [sys.executable, "-m", "grainlike.demo", "--resume", *_forwarded(args)], env=env
    )
    if child.returncode != 0:
        print(f"The resumed process failed with exit code {child.returncode}.", file=sys.stderr)
        return child.returncode
    with open(result_path) as f:
        second = json.load(f)

    replay_ok = second["replay_matched"] == second["replay_checked"]
    if second["replay_checked"] == 0:
        replay = "no batch to replay (the checkpoint was taken where the run stopped)."
    elif replay_ok:
        replay = f"replayed {second['replay_checked']} batches, identical to the interrupted run's."
    else:
        replay = (
            f"replayed {second['replay_checked']} batches, only {second['replay_matched']} "
            "identical: the restore was NOT exact."
        )
    print(f"The new process restored step {second['start_step']}; {replay}")
    print(f"Test accuracy: {second['test_accuracy']:.1%} on {_NUM_TEST} held-out digits.")
    records = first["records"] + second["records"]
    records_per_s = records / (first["train_s"] + second["train_s"])
    print(
        f"summary: test accuracy {second['test_accuracy']:.1%} | "
        f"{records_per_s:,.0f} records/s through loader + training step | "
        f"time to first batch {first['first_batch_s']:.2f} s (cold start, "
        f"{args.workers} workers), {second['first_batch_s']:.2f} s after restore | "
        f"resumed at step {second['start_step']}/{second['total_steps']} "
        f"{'exactly' if replay_ok else 'NOT exactly'} | "
        f"{time.perf_counter() - t0:.1f} s in all"
    )
    return 0 if replay_ok else 1


if __name__ == "__main__":
    sys.exit(main())
