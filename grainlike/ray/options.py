"""How the workers run on Ray: where, with what resources, and how much each call carries."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Optional

from grainlike.core.errors import is_int

# Actor options grainlike sets itself: the pool restarts a worker from its last
# delivered output, which a restart by Ray (from the actor's start) would not.
_RESERVED = ("max_restarts", "max_task_retries", "max_concurrency", "name", "lifetime", "concurrency_groups")


@dataclasses.dataclass(frozen=True)
class RayOptions:
    """Where the workers run and what each call to a worker carries.

    Attributes:
      address: the cluster (``ray.init(address=...)``: ``"ray://head:10001"``,
        ``"head:6379"``, ``"auto"``); None: Ray as initialised in this process,
        else ``RAY_ADDRESS``, else a local instance on 127.0.0.1 (see
        ``grainlike.ray.local.connect``).
      actor_options: ``ActorClass.options(...)`` for each worker, e.g.
        ``{"num_cpus": 2}``, ``{"resources": {"loader": 1}}``,
        ``{"runtime_env": {...}}``, ``{"scheduling_strategy": "SPREAD"}``.
        Defaults: one CPU per worker, spread over the nodes.
      elements_per_call: most outputs one call returns (the first call of a
        worker returns one, then each call twice as many as the one before, up
        to this).
      bytes_per_call: a call returns once its outputs hold this many bytes
        (arrays, byte strings), with at least one output.
      seconds_per_call: a call returns once it has computed for this long, with
        at least one output.
      calls_in_flight: calls each worker has been sent and not yet returned (the
        worker computes ahead by that many calls; memory in flight per worker is
        at most that many calls).
    """

    address: Optional[str] = None
    actor_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    elements_per_call: int = 64
    bytes_per_call: int = 8 << 20
    seconds_per_call: float = 0.5
    calls_in_flight: int = 2

    def __post_init__(self):
        if self.address is not None and not isinstance(self.address, str):
            raise TypeError(f"address must be a str or None, got {self.address!r}")
        if not isinstance(self.actor_options, Mapping):
            raise TypeError(f"actor_options must be a dict of Ray actor options, got {self.actor_options!r}")
        reserved = sorted(set(self.actor_options) & set(_RESERVED))
        if reserved:
            raise ValueError(
                f"actor_options may not set {reserved}: grainlike names its actors and restarts "
                "a failed worker itself, from its last delivered output"
            )
        for name in ("elements_per_call", "bytes_per_call", "calls_in_flight"):
            value = getattr(self, name)
            if not is_int(value) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        seconds = self.seconds_per_call
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not seconds > 0:
            raise ValueError(f"seconds_per_call must be a number of seconds > 0, got {seconds!r}")

    def actor_kwargs(self) -> dict:
        """``actor_options`` over grainlike's defaults (one CPU each, spread over the nodes)."""
        return {"num_cpus": 1, "scheduling_strategy": "SPREAD", **dict(self.actor_options)}
