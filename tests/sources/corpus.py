"""The small corpus the remote-storage tests upload: ArrayRecord shards and Parquet files."""

from __future__ import annotations

import os
from typing import Callable

import numpy as np


def write_corpus(
    directory: os.PathLike,
    records: Callable[[int], list],
    shards: int,
    big_rows: int,
    array_record_name: Callable[[int], str],
) -> dict:
    """Writes the corpus; returns ``{object key: local path}``.

    Per shard: ``ar/<array_record_name(shard)>`` holding ``records(shard)``
    (bytes, ``group_size:1``) and ``pq/part-<shard>.parquet`` with columns ``id``
    (``100 * shard + i``) and ``text`` (the records decoded), in row groups of 4.
    Plus ``big/big.parquet``: ``big_rows`` ids in row groups of 50, large enough
    that a loader is still reading it when a test stops the server.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq
    from array_record.python import array_record_module

    files = {}
    for shard in range(shards):
        shard_records = records(shard)
        path = os.path.join(directory, array_record_name(shard))
        writer = array_record_module.ArrayRecordWriter(path, "group_size:1")
        for r in shard_records:
            writer.write(r)
        writer.close()
        files[f"ar/{os.path.basename(path)}"] = path
        table = pa.table({
            "id": np.arange(len(shard_records), dtype=np.int64) + 100 * shard,
            "text": [r.decode() for r in shard_records],
        })
        path = os.path.join(directory, f"part-{shard}.parquet")
        pq.write_table(table, path, row_group_size=4)
        files[f"pq/part-{shard}.parquet"] = path
    path = os.path.join(directory, "big.parquet")
    pq.write_table(pa.table({"id": np.arange(big_rows, dtype=np.int64)}), path, row_group_size=50)
    files["big/big.parquet"] = path
    return files
