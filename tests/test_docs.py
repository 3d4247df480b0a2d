"""The documentation site builds offline in strict mode, and its code runs."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(ROOT, "docs")

# Pages whose ```python blocks run in order, one namespace per page. A block
# right after a `<!-- no-test -->` line is skipped (for code that needs more
# than one machine, say).
EXECUTED_PAGES = [
    "index.md",
    "quickstart.md",
    "concepts.md",
    "migrating.md",
    "troubleshooting.md",
    "sources.md",
    "dataset.md",
]

_BLOCK = re.compile(r"(<!-- no-test -->\s*\n)?^```python[^\n]*\n(.*?)^```\s*$", re.M | re.S)


def python_blocks(markdown: str) -> list[str]:
    """The ```python blocks of a Markdown text, without those marked no-test."""
    return [m.group(2) for m in _BLOCK.finditer(markdown) if not m.group(1)]


def test_docs_build_strict(tmp_path):
    pytest.importorskip("mkdocs", reason="mkdocs is in the dev extra")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet",
         "-f", os.path.join(ROOT, "mkdocs.yml"), "-d", str(tmp_path / "site")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "site" / "index.html").exists()
    assert (tmp_path / "site" / "api" / "index.html").exists()


def test_every_page_is_in_the_nav():
    yml = open(os.path.join(ROOT, "mkdocs.yml")).read()
    pages = [f for f in os.listdir(DOCS) if f.endswith(".md")]
    missing = [p for p in pages if not re.search(rf":\s*{re.escape(p)}\s*$", yml, re.M)]
    assert not missing, f"pages not in mkdocs.yml's nav: {missing}"


@pytest.mark.parametrize("page", EXECUTED_PAGES)
def test_page_code_runs(page, tmp_path, monkeypatch):
    blocks = python_blocks(open(os.path.join(DOCS, page)).read())
    if page != "index.md":
        assert blocks, f"{page} has no python code"
    monkeypatch.chdir(tmp_path)
    # A fresh module-like namespace: classes defined here pickle by value, as
    # they would from a user's script.
    namespace = {"__name__": f"docs_{page[:-3]}"}
    for i, code in enumerate(blocks):
        try:
            exec(compile(code, f"docs/{page} block {i + 1}", "exec"), namespace)
        except Exception as e:
            raise AssertionError(f"docs/{page}: python block {i + 1} failed:\n{code}") from e
    for value in namespace.values():
        close = getattr(value, "close", None)
        if type(value).__name__ in ("DataLoaderIterator", "DeviceIterator") and close:
            close()
