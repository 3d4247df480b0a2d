"""Size of a DataLoader state after a restore onto another number of processes.

1,000,000 shuffled records; 4 processes (2 workers each) delivered 48% of the
epoch; each of 3 new processes merges their states, then writes its own. Prints,
per new process, the records it skips, its state's size, and the time to merge
and to decode the state; then, for process 0 read in process (Batch(128)), the
records per second over the rest of the epoch, whose skipped records are
scattered all over it.

Run: .venv/bin/python -m benchmarks.elastic_skip_state
"""

import json
import time

import grainlike as grain
from grainlike.loader import elastic_restore as elastic
from grainlike.loader.legacy_state import Positions, dumps

RECORDS, OLD, NEW, WORKERS, DONE = 1_000_000, 4, 3, 2, 0.48


def _loader(index: int, count: int, workers: int = WORKERS) -> grain.DataLoader:
    shard = grain.ShardOptions(index, count, drop_remainder=True)
    sampler = grain.IndexSampler(RECORDS, shard, shuffle=True, num_epochs=1, seed=1)
    return grain.DataLoader(
        data_source=grain.RangeDataSource(0, RECORDS, 1),
        sampler=sampler,
        operations=[grain.Batch(128)],
        worker_count=workers,
    )


def main() -> None:
    per_worker = int(DONE * RECORDS / OLD) // WORKERS
    states = {i: dumps(_loader(i, OLD)._codec.encode(Positions([per_worker] * WORKERS, 0))) for i in range(OLD)}
    for j in range(NEW):
        loader = _loader(j, NEW)
        t0 = time.perf_counter()
        positions = elastic.process_states(loader, states, OLD)
        t1 = time.perf_counter()
        state = dumps(loader._codec.encode(positions))
        t2 = time.perf_counter()
        loader._codec.decode(json.loads(state))
        t3 = time.perf_counter()
        print(
            f"process {j}: skips {len(positions.skip)}, state {len(state)} bytes, "
            f"merge {t1 - t0:.2f} s, decode {t3 - t2:.3f} s"
        )
        if j == 0:
            reading = _loader(j, NEW, workers=0)
            it = iter(reading)
            it.set_state(dumps(reading._codec.encode(elastic.process_states(reading, states, OLD))))
            t0 = time.perf_counter()
            records = sum(len(batch) for batch in it)
            elapsed = time.perf_counter() - t0
            it.close()
            first = f"process {j} read in process: {records:,} records after the restore at"
            print(f"{first} {records / elapsed:,.0f} records/s")


if __name__ == "__main__":
    main()
