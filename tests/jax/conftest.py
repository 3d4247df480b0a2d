"""Every test here fails if a grainlike host callback raises (see tests/helpers/callbacks.py)."""

import pytest


@pytest.fixture(autouse=True)
def _no_grainlike_callback_raises(callbacks_never_raise):
    yield callbacks_never_raise
