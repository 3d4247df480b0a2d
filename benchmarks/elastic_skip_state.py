"""Size of a DataLoader state after a restore onto another number of processes.

1,000,000 shuffled records; 4 processes (2 workers each) delivered 48% of the
epoch; each of 3 new processes merges their states, then writes its own. Prints,
per new process, the records it skips, its state's size, and the time to merge
and to decode the state.

Run: .venv/bin/python -m benchmarks.elastic_skip_state
"""

import json
import time

import grainlike as grain
from grainlike.loader import elastic_restore as elastic
from grainlike.loader.legacy_state import Positions, dumps

RECORDS, OLD, NEW, WORKERS, DONE = 1_000_000, 4, 3, 2, 0.48


def _loader(index: int, count: int) -> grain.DataLoader:
    shard = grain.ShardOptions(index, count, drop_remainder=True)
    sampler = grain.IndexSampler(RECORDS, shard, shuffle=True, num_epochs=1, seed=1)
    return grain.DataLoader(data_source=grain.RangeDataSource(0, RECORDS, 1), sampler=sampler, worker_count=WORKERS)


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


if __name__ == "__main__":
    main()
