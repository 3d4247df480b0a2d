"""A small set of cases covering every pair of values of every two axes."""

from __future__ import annotations

import itertools
from typing import Any, Callable


def pairwise(axes: dict[str, list], valid: Callable[[dict], bool] = lambda case: True) -> list[dict[str, Any]]:
    """Cases (dicts axis -> value) in which every valid pair of values occurs.

    Greedy and deterministic: each case starts from the first pair not yet
    covered and fills the other axes with the values that cover the most new
    pairs. ``valid`` is called on partial cases too and must reject only the
    combinations that cannot run.

    Example:
      >>> len(pairwise({"a": [0, 1], "b": [0, 1], "c": [0, 1]}))
      4
    """
    names = list(axes)
    order = {n: i for i, n in enumerate(names)}

    def pair(m: str, mv: Any, n: str, nv: Any) -> tuple:
        return ((m, mv), (n, nv)) if order[m] < order[n] else ((n, nv), (m, mv))

    uncovered = {
        ((a, va), (b, vb))
        for a, b in itertools.combinations(names, 2)
        for va in axes[a]
        for vb in axes[b]
        if valid({a: va, b: vb})
    }
    cases = []
    while uncovered:
        (a, va), (b, vb) = min(uncovered, key=lambda p: (order[p[0][0]], order[p[1][0]], repr(p)))
        case = {a: va, b: vb}
        for n in names:
            if n in case:
                continue

            def gain(v: Any) -> int:
                if not valid({**case, n: v}):
                    return -1
                return sum(pair(m, mv, n, v) in uncovered for m, mv in case.items())

            case[n] = max(axes[n], key=gain)
        assert valid(case), f"no valid value completes {case}"
        for m, n in itertools.combinations(names, 2):
            uncovered.discard(pair(m, case[m], n, case[n]))
        cases.append({n: case[n] for n in names})
    return cases
