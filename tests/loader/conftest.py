"""Fixtures of these tests."""

from tests.helpers.leaks import no_leaks  # noqa: F401  (a fixture)
