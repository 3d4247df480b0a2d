"""Orbax checkpoint tests compare with the reference grain where it has the feature."""

from tests.compat.conftest import grain_ref  # noqa: F401  (fixture)
