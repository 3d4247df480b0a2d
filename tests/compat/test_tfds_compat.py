"""grainlike against grain 0.2.18 on the same TFDS source.

Both loaders read ``tfds.data_source(...)`` of a dataset built locally (see
``tests/test_tfds.py``); grainlike also reads it through ``TfdsDataSource``. Same
records in the same order, byte-identical state JSON, and a state from either
library restores in the other.
"""

from __future__ import annotations

import json

import pytest

import grainlike

tfds = pytest.importorskip("tensorflow_datasets")

from grainlike.sources.tfds import tfds_source  # noqa: E402
from tests.helpers.pipelines import take  # noqa: E402
from tests.test_tfds import NAME, build_tiny_images  # noqa: E402


@pytest.fixture(scope="module")
def tfds_dir(tmp_path_factory):
    data_dir = str(tmp_path_factory.mktemp("tfds_compat"))
    build_tiny_images(data_dir)
    return data_dir


def make_loader(lib, source, *, workers, shuffle, epochs, shard):
    shard_options = lib.NoSharding() if shard is None else lib.ShardOptions(*shard)

    class KeepIdAndImage(lib.MapTransform):
        def map(self, x):
            return {"id": x["id"], "label": x["label"], "image": x["image"][::4, ::3]}

    return lib.DataLoader(
        data_source=source,
        sampler=lib.IndexSampler(len(source), shard_options, shuffle=shuffle, num_epochs=epochs, seed=7),
        operations=[KeepIdAndImage(), lib.Batch(3)],
        worker_count=workers,
        shard_options=shard_options,
    )


CASES = [
    # (workers, shuffle, epochs, shard). Worker processes are compared against
    # grain in test_workers_compat; over TFDS a grain run with workers costs 8-20 s
    # (spawned workers import grain and TFDS), so the cases here read in process.
    (0, True, 1, None),
    (0, True, 2, (1, 2, False)),
    (0, False, 2, (0, 3, True)),
]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", CASES, ids=["shuffled", "shuffled-shard1of2-2epochs", "shard0of3-drop-2epochs"])
def test_same_records_order_and_state_as_grain(grain_ref, tfds_dir, case):
    workers, shuffle, epochs, shard = case
    split = "train+test[:3]"
    raw = tfds.data_source(NAME, split=split, data_dir=tfds_dir)
    wrapped = tfds_source(NAME, split, data_dir=tfds_dir)
    kw = dict(workers=workers, shuffle=shuffle, epochs=epochs, shard=shard)
    reference = make_loader(grain_ref, raw, **kw)
    mine = make_loader(grainlike, wrapped, **kw)

    # One run of each, with the state taken part-way.
    k = 3
    ig, il = iter(reference), iter(mine)
    head = take(ig, k)
    assert take(il, k) == head
    state_g, state_l = ig.get_state(), il.get_state()
    assert state_l == state_g
    tail = take(ig, 1000)
    assert len(tail) >= 2
    assert take(il, 1000) == tail
    end_state = ig.get_state()
    assert il.get_state() == end_state
    il.close()
    assert json.loads(end_state)["data_source"] == (
        f"ArrayRecordDataSource(name={NAME}, split='{split}', decoders=None)"
    )

    # Cross-restore: grain's state into grainlike (over the raw TFDS source too,
    # which has the same name), and grainlike's into grain.
    for source in [wrapped, raw]:
        il = iter(make_loader(grainlike, source, **kw))
        il.set_state(state_g)
        assert take(il, 1000) == tail
        il.close()
    ig = iter(reference)
    ig.set_state(state_l)
    assert take(ig, 1000) == tail
