"""Shared test set-up."""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

# Tests run JAX on the CPU, one device per process.
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from tests.helpers.leaks import no_leaks  # noqa: E402,F401  (a fixture for every test)
