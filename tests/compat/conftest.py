"""The reference implementation, loaded for differential tests."""

import pytest


@pytest.fixture(scope="session")
def grain_ref():
    """``grain.python`` from PyPI ``grain==0.2.18`` (a test-only dependency)."""
    import absl.flags

    # grain reads absl flags; outside an absl app they must be marked parsed first.
    absl.flags.FLAGS.mark_as_parsed()
    import grain.python as grain

    return grain
