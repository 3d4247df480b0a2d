"""A Dataset iterator saves and loads its state as Orbax v1 does (async save/load)."""

from __future__ import annotations

import asyncio
import json

from grainlike.dataset import MapDataset


def test_save_then_load_continues_where_the_saved_iterator_was(tmp_path):
    ds = MapDataset.range(20).seed(3).shuffle().to_iter_dataset().map_with_index(lambda i, x: (i, x)).batch(3)
    it = iter(ds)
    for _ in range(2):
        next(it)
    saved = it.get_state()

    async def save():
        write = await it.save(tmp_path)
        next(it)  # Advancing after save() returns does not change what is written.
        await write

    asyncio.run(save())
    # The state file, grain's bytes, alone.
    written = list(tmp_path.iterdir())
    assert [p.name for p in written] == ["process_0-of-1.json"]
    assert written[0].read_text() == json.dumps(saved, indent=4)

    restored = iter(ds)

    async def load():
        await (await restored.load(tmp_path))

    asyncio.run(load())
    assert restored.get_state() == saved
    expected = iter(ds)
    expected.set_state(saved)
    assert [[a.tolist() for a in b] for b in restored] == [[a.tolist() for a in b] for b in expected]
