"""What a traced JAX program holds: checks that data is fed in, not baked into the program."""

from __future__ import annotations

import numpy as np


def held_array_sizes(closed_jaxpr) -> list:
    """The sizes of the arrays ``closed_jaxpr`` holds: its consts and literals, in nested programs too."""
    sizes = [np.size(c) for c in closed_jaxpr.consts]

    def walk(jaxpr) -> None:
        for eqn in jaxpr.eqns:
            sizes.extend(np.size(v.val) for v in eqn.invars if hasattr(v, "val"))
            for param in eqn.params.values():
                for sub in (param if isinstance(param, (list, tuple)) else [param]):
                    if hasattr(sub, "jaxpr"):
                        # A ClosedJaxpr (with consts) or a bare Jaxpr.
                        walk(sub.jaxpr if hasattr(sub.jaxpr, "eqns") else sub.jaxpr.jaxpr)
                        sizes.extend(np.size(c) for c in getattr(sub, "consts", []))

    walk(closed_jaxpr.jaxpr)
    return sizes
