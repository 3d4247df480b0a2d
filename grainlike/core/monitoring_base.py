"""What a metric of ``grainlike.monitoring`` is described with: units, metadata, bucketing.

grain's ``monitoring_base`` (``grain.monitoring.monitoring_base``): the same
classes, fields and protocols, so code that declares grain metrics runs unchanged.
"""

from __future__ import annotations

import enum
from typing import Any, Optional, Protocol


@enum.unique
class Units(enum.Enum):
    """The unit of a metric's values (it sets the buckets of a ``PowersOf`` histogram)."""

    SECONDS = enum.auto()
    MILLISECONDS = enum.auto()
    MICROSECONDS = enum.auto()
    NANOSECONDS = enum.auto()
    BITS = enum.auto()
    BYTES = enum.auto()


class Metadata:
    """A metric's description; any keyword (``units=Units.NANOSECONDS``) becomes an attribute.

    Example:
      >>> Metadata(description="read time", units=Units.NANOSECONDS).units
      <Units.NANOSECONDS: 4>
    """

    def __init__(self, description: str = "", **kwargs: Any):
        self.description = description
        for name, value in kwargs.items():
            setattr(self, name, value)
        self._kwargs = kwargs


class Bucketer:
    """How a histogram (``EventMetric``) splits its values into buckets.

    Args:
      *args: the bucketer's parameters (``PowersOf``: the base).
      bucketer_type: the kind of bucketing, ``"PowersOf"`` or None.
      **kwargs: further parameters, kept as given.
    """

    def __init__(self, *args: Any, bucketer_type: Optional[str] = None, **kwargs: Any):
        self.args = args
        self.kwargs = kwargs
        self.type = bucketer_type

    @staticmethod
    def PowersOf(base: float) -> "Bucketer":  # noqa: N802 (grain's name)
        """Buckets at ``start * base**k`` up to an hour in the metric's units (see ``EventMetric``)."""
        return Bucketer(base, bucketer_type="PowersOf")


class CounterProtocol(Protocol):
    """A counter: ``Increment``, ``IncrementBy``, ``Get``, ``ClearAll``."""

    def Increment(self, *args: Any, **kwargs: Any) -> None: ...  # noqa: N802

    def IncrementBy(self, value: float | int, *args: Any, **kwargs: Any) -> None: ...  # noqa: N802

    def Get(self, *args: Any, **kwargs: Any) -> float | int: ...  # noqa: N802

    def ClearAll(self) -> None: ...  # noqa: N802


class MetricProtocol(Protocol):
    """A gauge: ``Set``, ``Get``, ``ClearAll``."""

    def Set(self, value: float | int, *args: Any, **kwargs: Any) -> None: ...  # noqa: N802

    def Get(self, *args: Any, **kwargs: Any) -> float | int: ...  # noqa: N802

    def ClearAll(self) -> None: ...  # noqa: N802


class EventMetricProtocol(Protocol):
    """A histogram: ``Record``, ``Get``, ``ClearAll``."""

    def Record(self, value: float | int, *args: Any, **kwargs: Any) -> None: ...  # noqa: N802

    def Get(self, *args: Any, **kwargs: Any) -> float | int: ...  # noqa: N802

    def ClearAll(self) -> None: ...  # noqa: N802
