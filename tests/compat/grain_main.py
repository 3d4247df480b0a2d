"""grain 0.2.18's DataLoader with the one change grain's main branch made to it.

Between the ``v0.2.18`` tag and grain's main branch, ``grain/_src/python/data_loader.py``
changed in one place (commit 5bad1a2, "Fixed bug in DataLoader where sharding
remainder was always dropped, ignoring ShardOptions.drop_remainder=False"): the
length of ``_SamplerMapDataset``, the shard's positions. grain 0.2.18 gives every
shard ``len(sampler) // shard_count`` positions; main gives, without
``drop_remainder``, the first ``len(sampler) % shard_count`` shards one more.
Samplers, sharding, the state codec and the workers did not change. So the
reference for grain main's DataLoader is grain 0.2.18's with that length
recomputed after its own constructor ran: ``reference_main_loader`` does that
for the duration of a test (``monkeypatch`` undoes it).
"""

from __future__ import annotations

from typing import Any


def reference_main_loader(grain_ref: Any, monkeypatch: Any) -> Any:
    """``grain_ref`` (``grain.python`` 0.2.18) whose DataLoader shards as grain's main branch."""
    from grain._src.python import data_loader

    released_init = data_loader._SamplerMapDataset.__init__

    def init_as_main(self, data_source, sampler, shard_options):
        released_init(self, data_source, sampler, shard_options)
        if not shard_options.drop_remainder:
            total = self._sampler_size()
            per_shard, left = divmod(total, shard_options.shard_count)
            self.length = per_shard + int(shard_options.shard_index < left)

    monkeypatch.setattr(data_loader._SamplerMapDataset, "__init__", init_as_main)
    return grain_ref
