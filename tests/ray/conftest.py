"""Helpers of the Ray tests: pipelines, their reference runs on mp_prefetch, and our actors' liveness.

Each test module starts its own Ray (a module-scoped fixture) on this machine's
loopback address only, and shuts it down at its end.
"""

from __future__ import annotations

import contextlib
import time

import numpy as np

import grainlike as grain

N = 48
BIG = 40_000  # float32: 160 kB per element, over Ray's inline limit (the object store carries it)


def pipeline(n: int = N, big: bool = False):
    """``range(n)`` as dicts (with an array of ``BIG`` floats if ``big``), filtered and batched by 3.

    The transforms are defined here, inside a function: they travel by value
    (cloudpickle), so the actors need not import the test modules.
    """

    def make(x):
        out = {"x": np.int64(x), "v": np.full((4,), x, np.int32)}
        if big:
            out["big"] = np.full((BIG,), x, np.float32)
        return out

    ds = grain.MapDataset.range(n).to_iter_dataset().map(make)
    return ds.filter(lambda e: int(e["x"]) % 7 != 3).batch(3)


def values(batch) -> list:
    return [int(v) for v in np.asarray(batch["x"]).reshape(-1)]


def run(it, steps=None) -> tuple[list, list]:
    """``(elements, state after each)`` of ``steps`` next() calls (all if None)."""
    out, states = [], []
    while steps is None or len(out) < steps:
        try:
            batch = next(it)
        except StopIteration:
            break
        out.append(values(batch))
        states.append(it.get_state())
    return out, states


def mp_reference(ds, workers: int, state=None) -> tuple[list, list]:
    """The elements and states of ``ds.mp_prefetch(num_workers=workers)`` (from ``state``)."""
    with contextlib.closing(iter(ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=workers)))) as it:
        if state is not None:
            it.set_state(state)
        return run(it)


def actor_names(ray, prefix: str = "grainlike-") -> set:
    """Names of the live actors named ``prefix...`` (a pool's ``name_prefix``; default: all of grainlike's)."""
    return {a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a["name"].startswith(prefix)}


def actor_dead(ray, handle, timeout: float = 20.0) -> bool:
    """Whether ``handle``'s actor dies within ``timeout``: calls to it fail as to a dead actor.

    ``ray.kill`` returns before the actor is gone: a call sent right after it may still run.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            ray.get(handle.where.remote(), timeout=max(deadline - time.monotonic(), 0.1))
        except ray.exceptions.RayActorError:
            return True
        except ray.exceptions.GetTimeoutError:
            return False
        time.sleep(0.1)
    return False


def object_store_objects() -> int:
    """How many objects Ray's object stores hold (every node's), from the raylets' memory summary."""
    import re

    from ray._private.internal_api import memory_summary

    found = re.search(r"Plasma memory usage .*?, (\d+) objects", memory_summary(stats_only=True))
    assert found, "Ray's memory summary has no object count"
    return int(found.group(1))


def wait_until(predicate, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()
