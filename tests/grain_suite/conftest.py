"""Starts grain's own tests in the background once the suite is collected; they run last.

Under pytest-xdist, the controller starts them (``tests/conftest.py``, which it
loads; it collects nothing) and the worker that runs this module attaches.
"""

import pytest

from tests.grain_suite import test_grain_own_tests as grain_tests


# After -k / -m / --deselect have chosen the items.
@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session, config, items):
    ours = [i for i in items if i.module.__name__ == grain_tests.__name__ and hasattr(i, "callspec")]
    if not ours:
        return
    # Checked last: by then the background run has had the whole suite's time.
    items[:] = [i for i in items if i not in ours] + ours
    if not hasattr(config, "workerinput"):
        grain_tests.start(ours)
