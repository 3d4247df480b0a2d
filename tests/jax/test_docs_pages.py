"""docs/jax_loops.md and docs/training.md run, and print what the page shows.

A ```python block right after a ```text block's predecessor... precisely: when a
```python block is followed directly by a ```text block, the block's stdout must
equal that text.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import re

import pytest

from tests.test_docs import DOCS

pytestmark = pytest.mark.timeout(300)

_FENCE = re.compile(r"^```(\w+)[^\n]*\n(.*?)^```\s*$", re.M | re.S)


def blocks(markdown: str) -> list:
    """``[(code, expected_output or None), ...]`` of a page's python blocks."""
    fences = [(m.group(1), m.group(2)) for m in _FENCE.finditer(markdown)]
    out = []
    for i, (lang, body) in enumerate(fences):
        if lang != "python":
            continue
        follows = fences[i + 1] if i + 1 < len(fences) else None
        out.append((body, follows[1] if follows and follows[0] == "text" else None))
    return out


def _needs_missing_module(code: str) -> bool:
    return any(
        importlib.util.find_spec(name) is None
        for name in re.findall(r"^import (tensorflow)\b", code, re.M)
    )


@pytest.mark.parametrize("page", ["jax_loops.md", "training.md"])
def test_page_runs_and_prints_what_it_shows(page, tmp_path, monkeypatch):
    code_blocks = blocks(open(os.path.join(DOCS, page)).read())
    assert code_blocks
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": f"docs_{page[:-3]}"}
    for i, (code, expected) in enumerate(code_blocks):
        if _needs_missing_module(code):
            # An optional framework's block (tensorflow is in the dev extra, so
            # the suite runs it; a GPU host without it runs the rest).
            continue
        out = io.StringIO()
        try:
            with contextlib.redirect_stdout(out):
                exec(compile(code, f"docs/{page} block {i + 1}", "exec"), namespace)
        except Exception as e:
            raise AssertionError(f"docs/{page}: python block {i + 1} failed:\n{code}") from e
        if expected is not None:
            assert out.getvalue() == expected, f"docs/{page} block {i + 1} printed:\n{out.getvalue()}"
    for value in namespace.values():
        close = getattr(value, "close", None)
        if type(value).__name__ in ("DataLoaderIterator", "DeviceIterator", "InJitIterator") and close:
            close()
