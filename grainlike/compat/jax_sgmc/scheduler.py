"""``jax_sgmc.scheduler``: the types ``io`` uses (JaxSGMC 0.1.5's names).

Only ``static_information`` is used by the data and saving functions (the number
of samples ``io.save`` makes room for); the state types are here for the
signatures that name them. JaxSGMC's step-size, temperature, burn-in and
thinning schedules belong to its samplers and are not part of grainlike.
"""

from __future__ import annotations

from collections import namedtuple

__all__ = ["schedule", "scheduler_state", "specific_scheduler", "static_information"]

specific_scheduler = namedtuple("specific_scheduler", ["init", "update", "get"])
"""A schedule's ``init``, ``update`` and ``get`` functions."""

schedule = namedtuple("schedule", ["step_size", "temperature", "burn_in", "accept"])
"""The scheduled values of one step."""

scheduler_state = namedtuple("scheduler_state", ["state", "step_size_state", "temperature_state", "burn_in_state",
                                                 "thinning_state", "progress_bar_state"])
"""The states of the schedules."""

static_information = namedtuple("static_information", ["samples_collected"])
"""What is fixed during a run: ``samples_collected``, the number of samples saved."""
