"""grainlike.ray on a two-node Ray cluster on this machine (real raylets, loopback only):
a node that leaves mid-epoch takes its workers with it; they restart on the other
node from their last delivered elements, and the iteration goes on with every
element once, in mp_prefetch's order, with its states."""

from __future__ import annotations

import contextlib
import gc

import pytest

from tests.ray.conftest import actor_names, mp_reference, pipeline, run, wait_until

ray = pytest.importorskip("ray", reason="grainlike.ray needs Ray (the ray extra)")

import grainlike.ray as grain_ray  # noqa: E402
from grainlike.ray.local import loopback  # noqa: E402

pytestmark = pytest.mark.timeout(300)

# A node that stops answering is declared dead after ~3 s (Ray's default: ~15-30 s).
_FAST_NODE_DEATH = {"health_check_period_ms": 1000, "health_check_failure_threshold": 3, "health_check_timeout_ms": 1000}


@pytest.fixture(scope="module")
def cluster():
    """A head node and a worker node, 2 CPUs each, both bound to 127.0.0.1; the driver on the head."""
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()
    # (Ray's settings in os.environ, such as the RAY_AUTH_MODE a local instance
    # sets, stay: this process's Ray keeps them in its own state too.)
    with loopback():
        c = Cluster(
            initialize_head=True,
            head_node_args={"num_cpus": 2, "include_dashboard": False, "_system_config": _FAST_NODE_DEATH},
        )
        try:
            worker = c.add_node(num_cpus=2)
            c.connect()
        except BaseException:
            c.shutdown()
            raise
    try:
        yield c, worker
    finally:
        gc.collect()  # (see test_local.py's fixture)
        ray.shutdown()
        c.shutdown()


def test_cluster_is_on_loopback(cluster):
    nodes = [n for n in ray.nodes() if n["Alive"]]
    assert len(nodes) == 2 and {n["NodeManagerAddress"] for n in nodes} == {"127.0.0.1"}


def test_node_that_leaves_mid_epoch_every_element_once_in_order(cluster):
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    c, worker_node = cluster
    ds = pipeline(big=True)
    expected, expected_states = mp_reference(ds, 2)
    # Both workers on the worker node while it lives (soft: elsewhere once it is gone).
    on_worker_node = NodeAffinitySchedulingStrategy(node_id=worker_node.node_id, soft=True)
    dataset = grain_ray.prefetch(ds, 2, actor_options={"scheduling_strategy": on_worker_node})
    with contextlib.closing(iter(dataset)) as it:
        got, got_states = run(it, 3)
        pool = it._pool
        assert {ray.get(a.where.remote())[1] for a in pool.actors.values()} == {worker_node.node_id}
        c.remove_node(worker_node, allow_graceful=False)
        middle, middle_states = [], []
        while pool.restarts < 2:  # each worker finds out when it has delivered what it had received
            element, state = run(it, 1)
            assert element, "the iteration ended before both workers restarted"
            middle += element
            middle_states += state
        head = c.head_node.node_id
        assert [ray.get(pool.actors[w].where.remote())[1] for w in (0, 1)] == [head, head]
        rest, rest_states = run(it)
    assert got + middle + rest == expected
    assert got_states + middle_states + rest_states == expected_states
    assert wait_until(lambda: not actor_names(ray, pool.name_prefix))
