"""The README's example runs as written."""

from __future__ import annotations

import os
import warnings

import numpy as np

from tests.test_docs import ROOT, python_blocks


def test_readme_example_runs():
    readme = open(os.path.join(ROOT, "README.md")).read()
    blocks = python_blocks(readme)
    assert blocks, "README.md has no python example"
    namespace = {"__name__": "readme"}
    # The examples deliver what they say without a warning (a warning there is
    # the first thing a newcomer sees).
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for i, code in enumerate(blocks):
            exec(compile(code, f"README.md block {i + 1}", "exec"), namespace)
    # What the README's comments promise.
    batch = namespace["batch"]
    assert batch["x"].shape == (32,) and (batch["x2"] == batch["x"] ** 2).all()
    assert namespace["state"].startswith(b"{")
    first = namespace["first"]
    assert first["x"].shape == (32,) and first["x"].dtype == np.int64 and (first["x2"] == first["x"] ** 2).all()
    assert namespace["checkpoint"]["next_index_in_datasets"] == 2  # mp_prefetch's state of two workers
