"""Worker processes keep the memory a batch freed for the next one (glibc's malloc).

Each run is a fresh interpreter, so the allocator's settings are the ones its
environment gives, as in a user's job.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from grainlike.workers import main as worker_main

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc"),
]

# A transform that allocates 64 arrays of 48 KiB (a batch of decoded images)
# and frees them, returning the page faults its worker took for that record.
_SCRIPT = textwrap.dedent(
    """
    import json, resource, sys
    import numpy as np
    import grainlike

    class Churn(grainlike.MapTransform):
        def map(self, i):
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            parts = [np.ones(12288, np.float32) for _ in range(64)]
            total = sum(float(p[0]) for p in parts)
            del parts
            return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before + 0 * int(total)

    loader = grainlike.DataLoader(
        data_source=grainlike.RangeDataSource(0, 60, 1),
        sampler=grainlike.SequentialSampler(60, grainlike.NoSharding()),
        operations=[Churn()],
        worker_count=1,
    )
    faults = [int(x) for x in loader]
    print(json.dumps(faults[20:]))
    """
)


def _faults_per_record(env_extra: dict) -> list:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    env.update(env_extra, PYTHONPATH=ROOT)
    out = subprocess.run(
        [sys.executable, "-c", _SCRIPT], env=env, capture_output=True, text=True, timeout=100, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_worker_reuses_freed_memory_across_records():
    faults = sorted(_faults_per_record({}))
    # 3 MiB allocated per record would be 768 fresh pages if given back each time.
    assert faults[len(faults) // 2] < 50, faults


def test_users_own_malloc_settings_are_kept():
    # glibc's starting trim threshold, set explicitly: every record's 3 MiB is
    # given back and faulted in again.
    faults = sorted(_faults_per_record({"MALLOC_TRIM_THRESHOLD_": str(128 * 1024)}))
    assert faults[len(faults) // 2] > 500, faults


@pytest.mark.parametrize(
    "env",
    [
        {"MALLOC_MMAP_THRESHOLD_": "65536"},
        {"MALLOC_TOP_PAD_": "0"},
        {"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=1"},
        {"LD_PRELOAD": "/usr/lib/libjemalloc.so.2"},
    ],
)
def test_settings_of_the_user_turn_it_off(monkeypatch, env):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert worker_main.keep_freed_memory() is False
