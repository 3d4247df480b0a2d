"""The order in which pytest-xdist hands test files to its workers (``--dist loadfile``).

pytest-xdist hands out files with the most tests first, so the files of a few
long tests (grain's spawned workers, subprocesses, tf.data) came last, where
one of them kept one worker busy while the other had nothing left to run.
Here the files known to take longest go first, longest first; the others follow
in pytest-xdist's order; grain's own tests (tests/grain_suite), whose first test
waits for their background run to end, go last.

The Ray files are one unit, on one worker one after the other, after the other
long files: a Ray instance slows down far more than the CPU it loses (a module
that takes 24 s alone took 311 s beside four busy processes on 2 cores), so it
does not start beside another Ray instance, nor at the start of the run, when
grain's own tests run in the background beside both workers.
"""

from __future__ import annotations

from collections import OrderedDict

from xdist.scheduler import LoadFileScheduling

# About how many seconds each takes in a whole run on two workers (a 2-core
# machine), measured file by file; only the order matters. The files not named
# here follow, in pytest-xdist's order (most tests first).
LONGEST = {
    "tests/compat/test_jax_sgmc_compat.py": 100,
    "tests/compat/test_leaf_types_compat.py": 85,
    "tests/compat/test_workers_compat.py": 80,
    "tests/sources/test_gcs.py": 70,
    "tests/sources/test_remote.py": 70,
    "tests/checkpoint/test_kill_anywhere.py": 70,
    "tests/compat/test_mp_prefetch_compat.py": 60,
    "tests/elastic/test_process_count.py": 55,
    "tests/compat/test_shard_remainder_compat.py": 50,
    "tests/compat/test_worker_share_warning_compat.py": 45,
    "tests/jax/test_docs_pages.py": 40,
    "tests/compat/test_loadax_compat.py": 40,
    "tests/test_notebooks.py": 40,
    "tests/test_platforms.py": 40,
    "tests/compat/test_checkpoint_compat.py": 35,
    "tests/compat/test_checkpoint_tree_compat.py": 35,
    "tests/dataset/test_tf_data.py": 35,
    "tests/dataset/test_dropped_iterators.py": 35,
    "tests/jax/test_io.py": 30,
    "tests/loader/test_conformance.py": 30,
    "tests/test_docs.py": 30,
    "tests/test_crash_resume.py": 20,
    "tests/compat/test_operations_compat.py": 20,
    "tests/reliability/test_suspended_job.py": 20,
    "tests/compat/test_attribute_tree_compat.py": 20,
    "tests/reliability/test_dropped_mid_transform.py": 15,
    "tests/dataset/test_worker_preload.py": 15,
    "tests/test_multihost.py": 15,
}

# The files under this folder form one unit, which goes after the LONGEST files.
RAY = "tests/ray"

# Its first test waits for grain's tests, which run in the background from the start.
LAST = "tests/grain_suite/test_grain_own_tests.py"


def _rank(scope: str, position: int) -> tuple:
    if scope == LAST:
        return (3, 0)
    if scope in LONGEST:
        return (0, -LONGEST[scope])
    if scope == RAY:
        return (1, 0)
    return (2, position)


class LongestFirst(LoadFileScheduling):
    """``--dist loadfile`` with the files in the order above."""

    _ordered = False

    def _split_scope(self, nodeid: str) -> str:
        path = super()._split_scope(nodeid)
        return RAY if path.startswith(RAY + "/") else path

    def _assign_work_unit(self, node) -> None:
        # The queue is complete when the first unit is assigned (``schedule``).
        if not self._ordered:
            self._ordered = True
            scopes = list(self.workqueue.items())
            order = sorted(range(len(scopes)), key=lambda i: _rank(scopes[i][0], i))
            self.workqueue = OrderedDict(scopes[i] for i in order)
        super()._assign_work_unit(node)
