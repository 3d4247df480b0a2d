"""Elastic restore tests use the reference grain for cross-library states."""

from tests.compat.conftest import grain_ref  # noqa: F401  (the fixture)
