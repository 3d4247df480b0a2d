import pytest

from tests.helpers.leaks import LeakCheck


@pytest.fixture
def no_leaks():
    check = LeakCheck()
    yield check
    check.assert_clean()
