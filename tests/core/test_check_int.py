"""grainlike.core.errors.check_int: the one check of an int argument."""

import numpy as np
import pytest

from grainlike.core.errors import check_int, is_int


@pytest.mark.parametrize("value", [True, False, np.bool_(True)])
def test_a_bool_is_rejected_as_not_an_int(value):
    assert not is_int(value)
    with pytest.raises(ValueError, match=r"^workers must be an int >= 0, got "):
        check_int("workers", value)


@pytest.mark.parametrize("value", [np.int64(3), np.int32(3), np.uint8(3), 3])
def test_a_numpy_integer_is_accepted_and_returned_as_a_python_int(value):
    out = check_int("batch_size", value, 1)
    assert out == 3 and type(out) is int


def test_none_is_accepted_only_when_allowed():
    assert check_int("epochs", None, 1, none_ok=True) is None
    with pytest.raises(ValueError, match=r"^epochs must be a positive int, got None$"):
        check_int("epochs", None, 1)


@pytest.mark.parametrize(
    "low, value, message",
    [
        (0, -1, "prefetch must be an int >= 0, got -1"),
        (1, 0, "prefetch must be a positive int, got 0"),
        (2, 1, "prefetch must be an int >= 2, got 1"),
    ],
)
def test_a_value_under_the_bound_raises_value_error_naming_the_argument(low, value, message):
    assert check_int("prefetch", low, low) == low
    with pytest.raises(ValueError) as info:
        check_int("prefetch", value, low)
    assert str(info.value) == message


def test_the_upper_bound_is_exclusive_and_a_power_of_two_is_written_as_one():
    assert check_int("seed", 2**32 - 1, 0, 2**32) == 2**32 - 1
    with pytest.raises(ValueError) as info:
        check_int("seed", 2**32, 0, 2**32)
    assert str(info.value) == "seed must be an int in [0, 2**32), got 4294967296"
    with pytest.raises(ValueError, match=r"^n must be an int in \[0, 10\), got 10$"):
        check_int("n", 10, 0, 10)


@pytest.mark.parametrize("value", [1.0, "3", [3]])
def test_a_value_that_is_not_an_int_raises_type_error_where_asked(value):
    with pytest.raises(TypeError, match=r"^seed must be an int in \[0, 2\*\*32\), got "):
        check_int("seed", value, 0, 2**32, type_error=TypeError)
    # Out of range stays a ValueError even then.
    with pytest.raises(ValueError):
        check_int("seed", -1, 0, 2**32, type_error=TypeError)


def test_none_allowed_is_said_in_the_message():
    with pytest.raises(ValueError, match=r"^batch_size must be a positive int or None, got 0$"):
        check_int("batch_size", 0, 1, none_ok=True)
