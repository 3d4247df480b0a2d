"""The order in which the suite's files go to pytest-xdist's workers (tests/helpers/scheduling.py)."""

from __future__ import annotations

import os
from collections import OrderedDict

from tests.helpers import scheduling

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_named_files_exist():
    # A file renamed or moved would silently lose its place.
    for path in [*scheduling.LONGEST, scheduling.LAST]:
        assert os.path.isfile(os.path.join(ROOT, path)), path
    assert os.path.isdir(os.path.join(ROOT, scheduling.RAY))


class _Node:
    def __init__(self):
        self.sent = []

    def send_runtest_some(self, indices):
        self.sent.append(indices)


def _handed_out(files: list) -> list:
    """The order in which the scheduler hands ``files`` (scopes of one test each) to one worker."""
    sched = scheduling.LongestFirst.__new__(scheduling.LongestFirst)
    node = _Node()
    sched.workqueue = OrderedDict((f, {f"{f}::t": False}) for f in files)
    sched.assigned_work = {}
    sched.registered_collections = {node: [f"{f}::t" for f in files]}
    order = []
    while sched.workqueue:
        sched._assign_work_unit(node)
        order.append(files[node.sent[-1][0]])
    return order


def test_longest_files_go_first_and_grains_own_tests_last():
    # As pytest-xdist queues them: most tests first.
    files = ["tests/a.py", scheduling.LAST, "tests/b.py", "tests/compat/test_mp_prefetch_compat.py",
             "tests/compat/test_jax_sgmc_compat.py"]
    order = _handed_out(files)
    assert order == ["tests/compat/test_jax_sgmc_compat.py", "tests/compat/test_mp_prefetch_compat.py",
                     "tests/a.py", "tests/b.py", scheduling.LAST]


def test_the_ray_files_are_one_unit_after_the_longest_files():
    sched = scheduling.LongestFirst.__new__(scheduling.LongestFirst)
    assert sched._split_scope("tests/ray/test_local.py::test_x") == "tests/ray"
    assert sched._split_scope("tests/ray/test_cluster.py::test_y[1]") == "tests/ray"
    assert sched._split_scope("tests/rays/test_z.py::t") == "tests/rays/test_z.py"
    assert sched._split_scope("tests/a.py::t") == "tests/a.py"
    files = ["tests/a.py", scheduling.LAST, scheduling.RAY, "tests/compat/test_jax_sgmc_compat.py"]
    order = _handed_out(files)
    assert order == ["tests/compat/test_jax_sgmc_compat.py", scheduling.RAY, "tests/a.py", scheduling.LAST]
