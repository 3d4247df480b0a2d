"""Pipelines built the same way in grain and in grainlike, for differential tests.

``build(lib, ...)`` takes the module (``grain.python`` or ``grainlike``) and builds
the loader from its own classes, so the two runs share nothing but the recipe.
"""

from __future__ import annotations

import numpy as np

from tests.helpers.leaf_types import type_name


def make_ops(lib, names, batch_size=3, drop_remainder=False):
    """Operations named by short strings, subclassing ``lib``'s transform classes."""

    class PlusOne(lib.MapTransform):
        def map(self, x):
            return {"x": np.asarray(x, dtype=np.int64) + 1, "sq": np.int64(x) * np.int64(x)}

    class ToInt(lib.MapTransform):
        def map(self, x):
            if isinstance(x, (bytes, bytearray)):
                return int(x.decode())
            return int(x)

    class Noise(lib.RandomMapTransform):
        def random_map(self, x, rng):
            return {**x, "noise": rng.integers(0, 2**31)}

    class Noise2(lib.RandomMapTransform):
        def random_map(self, x, rng):
            return {**x, "u": rng.random(2)}

    class DropMultiplesOf3(lib.FilterTransform):
        def filter(self, x):
            return int(np.asarray(x["x"])) % 3 != 0

    out = []
    for n in names:
        if n == "int":
            out.append(ToInt())
        elif n == "map":
            out.append(PlusOne())
        elif n == "rand":
            out.append(Noise())
        elif n == "rand2":
            out.append(Noise2())
        elif n == "filter":
            out.append(DropMultiplesOf3())
        elif n == "batch":
            out.append(lib.Batch(batch_size=batch_size, drop_remainder=drop_remainder))
        else:
            raise ValueError(n)
    return out


def build(lib, source, *, num_records, num_epochs=1, shuffle=False, seed=0,
          shard=(0, 1, False), ops=(), batch_size=3, drop_remainder=False,
          worker_count=0, read_threads=None, **loader_kwargs):
    shard_options = (
        lib.NoSharding() if shard is None else lib.ShardOptions(shard_index=shard[0], shard_count=shard[1], drop_remainder=shard[2])
    )
    sampler = lib.IndexSampler(
        num_records=num_records,
        shard_options=shard_options,
        shuffle=shuffle,
        num_epochs=num_epochs,
        seed=seed,
    )
    kwargs = dict(loader_kwargs)  # e.g. grainlike's warm_start
    if read_threads is not None:
        kwargs["read_options"] = lib.ReadOptions(num_threads=read_threads)
    return lib.DataLoader(
        data_source=source,
        sampler=sampler,
        operations=make_ops(lib, ops, batch_size, drop_remainder),
        worker_count=worker_count,
        shard_options=shard_options,
        **kwargs,
    )


def as_plain(x):
    """Nested structure -> plain Python for exact comparison, keeping every type.

    Lists stay lists and tuples tuples; an array becomes ``(type name, dtype,
    shape, values)``, any other leaf ``(type name, value)`` (``type_name``: a
    ``SharedMemoryArray`` is one from either library, ``numpy.ndarray`` is not).
    """
    if isinstance(x, dict):
        return {k: as_plain(v) for k, v in sorted(x.items())}
    if type(x) in (list, tuple):
        return type(x)(as_plain(v) for v in x)
    if isinstance(x, (list, tuple)):
        return (type_name(x), [as_plain(v) for v in x])
    if isinstance(x, np.ndarray):
        return (type_name(x), str(x.dtype), x.shape, x.tolist())
    if isinstance(x, np.generic):
        return (type_name(x), x.item())
    return (type_name(x), x)


def take(it, n):
    out = []
    for _ in range(n):
        try:
            out.append(as_plain(next(it)))
        except StopIteration:
            break
    return out
