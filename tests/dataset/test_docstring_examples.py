"""The examples in grainlike's docstrings run and print what they show.

Every module whose source holds a ``>>>`` example is run here, so a new example
is tested without being listed.
"""

from __future__ import annotations

import doctest
import importlib
import multiprocessing.util
import pathlib
import tempfile

import pytest

import grainlike

PACKAGE = pathlib.Path(grainlike.__file__).parent


def modules_with_examples() -> list[str]:
    names = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if ">>>" not in path.read_text(encoding="utf-8"):
            continue
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names.append(".".join(parts))
    return names


MODULES = modules_with_examples()


def test_examples_are_found():
    assert {"grainlike.core.tree.stacking", "grainlike.dataset.sources.tfrecord", "grainlike.sources.keys"} <= set(MODULES)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name, tmp_path, monkeypatch, no_leaks):
    # Examples are copied by readers: one that writes files must clean them up.
    # multiprocessing's own folder for this process (its forkserver's socket,
    # removed at exit) is made before, wherever the first worker starts.
    multiprocessing.util.get_temp_dir()
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
    assert not list(scratch.iterdir()), f"{name}'s examples left temporary files"
