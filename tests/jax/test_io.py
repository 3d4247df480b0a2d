"""grainlike.io: saving inside jit/scan into collectors, pytree dicts, checkpoints that resume."""

from __future__ import annotations

import concurrent.futures
import os
import signal
import subprocess
import sys
import time
from collections import namedtuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grainlike import io
from tests.helpers.processes import run_in_session

pytestmark = pytest.mark.timeout(180)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def keep_every_second(collector):
    init_save, save, postprocess_save = io.save(collector)

    def update(saving_state, it):
        saving_state = save(saving_state, jnp.mod(it, 2) == 0, {"iteration": it})
        return saving_state

    saving_state = init_save({"iteration": jnp.array(0)}, {}, 3)
    final_state, _ = jax.lax.scan(update, saving_state, jnp.arange(5))
    return postprocess_save(final_state, None)


def test_jaxsgmc_documented_example_keeps_every_second_sample():
    saved = keep_every_second(io.MemoryCollector())
    assert int(saved["sample_count"]) == 3
    assert saved["samples"]["iteration"].tolist() == [0, 2, 4]


def test_memory_collector_writes_an_npz_per_chain(tmp_path):
    collector = io.MemoryCollector(save_dir=str(tmp_path))
    init_save, save, post = io.save(collector)
    a = init_save({"p": {"w": jnp.zeros(2)}, "l": [jnp.int32(0)]}, None, 4)
    b = init_save({"p": {"w": jnp.zeros(2)}, "l": [jnp.int32(0)]}, None, 4)

    def run(state, scale):
        def body(s, i):
            return save(s, True, {"p": {"w": jnp.ones(2) * i * scale}, "l": [i]})

        return jax.jit(lambda s: jax.lax.scan(body, s, jnp.arange(4))[0])(state)

    out_a, out_b = post(run(a, 1)), post(run(b, 10))
    assert out_a["samples"]["p"]["w"][:, 0].tolist() == [0, 1, 2, 3]
    assert out_b["samples"]["l"][0].tolist() == [0, 1, 2, 3]
    assert out_b["samples"]["p"]["w"][:, 1].tolist() == [0, 10, 20, 30]
    with np.load(tmp_path / "chain_1.npz") as f:
        assert sorted(f.files) == ["l/list_element_0", "p/w"]
        assert f["p/w"][:, 0].tolist() == [0, 10, 20, 30]


def test_hdf5_collector_writes_datasets_named_by_the_pytree(tmp_path):
    h5py = pytest.importorskip("h5py", reason="h5py is in the hdf5 extra")
    with h5py.File(tmp_path / "samples.h5", "w") as f:
        saved = keep_every_second(io.HDF5Collector(f))
        assert saved["samples"]["iteration"][:].tolist() == [0, 2, 4]
        assert f["/chain~0/iteration"][:].tolist() == [0, 2, 4]


def test_more_samples_than_room_is_a_clear_error():
    init_save, save, post = io.save(io.MemoryCollector())
    state = init_save({"i": jnp.int32(0)}, None, 2)
    with pytest.raises(IndexError, match="more than the samples_collected=2"):
        with io_host_errors():
            jax.block_until_ready(jax.lax.scan(lambda s, i: save(s, True, {"i": i}), state, jnp.arange(3)))


def io_host_errors():
    from grainlike.jax.host_callbacks import host_errors

    return host_errors()


Pair = namedtuple("Pair", "a b")


def test_pytree_dict_round_trip_with_jaxsgmcs_keys():
    tree = {"a": 0.0, "b": {"b1": [0.0, 0.1], "b2": Pair(1, (2, 3))}}
    as_dict = io.pytree_to_dict(tree)
    assert as_dict == {"a": 0.0, "b": {"b1": {"list_element_0": 0.0, "list_element_1": 0.1},
                                       "b2": {"a": 1, "b": {"list_element_0": 2, "list_element_1": 3}}}}
    assert io.dict_to_pytree(as_dict, tree) == tree
    assert io.dict_to_pytree(as_dict["b"], tree["b"]) == tree["b"]
    assert io.pytree_dict_keys({"a": [0.0, 1.0], "b": 2.0}) == [("a", "list_element_0"), ("a", "list_element_1"), ("b",)]
    with pytest.raises(KeyError, match="b/b2"):
        io.dict_to_pytree({"a": 0.0, "b": {"b1": as_dict["b"]["b1"]}}, tree)


def run_script(mode, checkpoint_dir, out):
    proc, stdout, stderr = run_in_session(
        [sys.executable, os.path.join(HERE, "resume_run.py"), mode, str(checkpoint_dir), str(out)],
        timeout=120, cwd=ROOT, env=dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT),
    )
    assert proc.returncode == 0, stderr[-3000:]
    with np.load(out) as f:
        return {k: f[k] for k in f.files}


def test_a_run_killed_with_sigkill_resumes_to_the_same_samples(tmp_path):
    # The run never killed goes on beside the killed one (each is a JAX program, seconds to start).
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        fresh = pool.submit(run_script, "fresh", tmp_path / "whole", tmp_path / "whole.npz")
        checkpoint = _killed_run(tmp_path)
        whole = fresh.result()
    assert int(whole["count"]) == 12
    assert len(set(whole["w"].tolist())) == 12
    assert 0 < checkpoint.step < 24

    resumed = run_script("resume", tmp_path / "killed", tmp_path / "resumed.npz")
    assert int(resumed["count"]) == 12
    assert resumed["w"].tolist() == whole["w"].tolist()
    assert resumed["x0"].tolist() == whole["x0"].tolist()


def _killed_run(tmp_path):
    """The checkpoint of a run killed with SIGKILL after its first checkpoint."""
    checkpoints = tmp_path / "killed"
    proc = subprocess.Popen(
        [sys.executable, os.path.join(HERE, "resume_run.py"), "slow", str(checkpoints), str(tmp_path / "never.npz")],
        cwd=ROOT, env=dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 90
        while not (checkpoints / "chain_0.ckpt.npz").exists():
            assert proc.poll() is None and time.monotonic() < deadline, "no checkpoint was written"
            time.sleep(0.02)
        time.sleep(0.5)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    assert not (tmp_path / "never.npz").exists()
    return io.load(str(checkpoints))


def test_checkpoint_holds_carry_samples_and_data_position(tmp_path):
    import grainlike as grain

    data = grain.reference_data({"x": np.arange(9)}, cache_size=2, batch_size=2)
    init_save, save, post = io.save(io.MemoryCollector(), checkpoint_every=3, checkpoint_dir=str(tmp_path), data=data)
    state = init_save({"x": jnp.zeros(2, jnp.int32)}, {"n": jnp.int32(0)}, 5)

    def body(c, _):
        d, s, n = c
        d, batch, _ = data.next(d)
        s, _ = save(s, True, {"x": batch["x"]}, checkpoint={"n": n + 1}, data_state=d)
        return (d, s, n + 1), batch["x"]

    (d, s, n), xs = jax.jit(lambda c: jax.lax.scan(body, c, None, length=4))((data.init(shuffle=True), state, 0))
    jax.block_until_ready(s)
    checkpoint = io.load(str(tmp_path), {"n": jnp.int32(0)}, data=data)
    assert checkpoint.step == 3 and checkpoint.saved_samples == 3 and int(checkpoint.carry["n"]) == 3
    assert checkpoint.arrays["sample:x"].tolist() == xs[:3].tolist()
    _, batch, _ = data.next(checkpoint.data_state)
    assert batch["x"].tolist() == xs[3].tolist()
    with pytest.raises(ValueError, match="checkpoint_dir"):
        io.save(io.MemoryCollector(), checkpoint_every=2)
    init_save, save, _ = io.save(io.MemoryCollector(), checkpoint_every=2, checkpoint_dir=str(tmp_path))
    with pytest.raises(ValueError, match=r"pass that reference_data as io.save\(..., data=...\)"):
        save(init_save({"x": jnp.int32(0)}, None, 1), True, {"x": jnp.int32(1)},
             data_state=data.init())


def test_no_save_keeps_the_kept_samples_on_the_device_as_jaxsgmc_does():
    # JaxSGMC 0.1.5's documented example: keep every second of 5 iterations, room for 3.
    import jax
    import jax.numpy as jnp

    from grainlike import io

    init_save, save, postprocess_save = io.no_save()
    state = init_save({"iteration": jnp.array(0)}, None, 3)

    def update(state, it):
        return save(state, jnp.mod(it, 2) == 0, {"iteration": it})

    final, _ = jax.jit(lambda s: jax.lax.scan(update, s, jnp.arange(5)))(state)
    out = postprocess_save(final, None)
    assert int(out["sample_count"]) == 3
    assert out["samples"]["iteration"].tolist() == [0, 2, 4]


def test_a_dictionize_rule_names_the_leaves_of_a_users_node():
    from grainlike import io

    class Params:
        def __init__(self, w, b):
            self.w, self.b = w, b

    # A rule names the leaves of a pytree node (JAX leaves are leaves, as in JaxSGMC).
    jax.tree_util.register_pytree_node(Params, lambda p: ((p.w, p.b), None), lambda _, c: Params(*c))

    @io.register_dictionize_rule(Params)
    def _params(node):
        return [("weights", node.w), ("bias", node.b)]

    tree = {"layer": Params([1.0, 2.0], 3.0)}
    assert io.pytree_to_dict(tree) == {"layer": {"weights": {"list_element_0": 1.0, "list_element_1": 2.0}, "bias": 3.0}}
    assert io.pytree_dict_keys(tree) == [
        ("layer", "weights", "list_element_0"), ("layer", "weights", "list_element_1"), ("layer", "bias"),
    ]
    with pytest.raises(ValueError, match="already registered"):
        io.register_dictionize_rule(Params)(_params)


def test_an_update_traced_with_an_earlier_save_is_reported_not_silently_empty():
    # A module-level update function that calls whatever `save` currently is: jit
    # traces it once, with the first io.save(...)'s callbacks.
    import jax
    import jax.numpy as jnp

    from grainlike import io

    current = {}

    def update(state, it):
        return current["save"](state, True, {"x": it})

    run = jax.jit(lambda s: jax.lax.scan(update, s, jnp.arange(3.0))[0])

    def one_run():
        init_save, current["save"], postprocess_save = io.save(io.MemoryCollector())
        state = init_save({"x": jnp.float32(0)}, None, 3)
        return postprocess_save(run(state), None)

    first = one_run()
    assert first["samples"]["x"].tolist() == [0.0, 1.0, 2.0]
    with pytest.raises(RuntimeError, match="traced with the save of another io.save"):
        one_run()
