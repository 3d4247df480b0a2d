"""grainlike's layers: the import-linter contracts in pyproject.toml hold.

Imports point downward only (core < sources < dataset < loader < integrations <
edge < faces), imports inside functions included, and the integrations and the
sources of different stores do not import each other. No class name is
defined twice.
"""

from __future__ import annotations

import ast
import collections
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# import-linter has no ``python -m`` entry; its console script is this function.
# The check runs in this interpreter's environment, without a cache in the tree.
_LINT = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"


def _lint(root: str) -> subprocess.CompletedProcess:
    """Runs the contracts of ``root``/pyproject.toml on the package ``root``/grainlike."""
    return subprocess.run(
        [sys.executable, "-c", _LINT, "--no-cache"],
        cwd=root, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": root},
    )


def test_import_linter_contracts_are_kept():
    result = _lint(ROOT)
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"
    assert " 0 broken." in result.stdout and "BROKEN" not in result.stdout, result.stdout


def test_an_upward_import_breaks_the_layers_contract(tmp_path):
    # The contract is checked against a copy of the package with one upward import
    # inside a function (core -> loader): it must be reported, naming both modules.
    shutil.copytree(
        os.path.join(ROOT, "grainlike"), tmp_path / "grainlike",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    shutil.copy(os.path.join(ROOT, "pyproject.toml"), tmp_path / "pyproject.toml")
    with open(tmp_path / "grainlike" / "core" / "record.py", "a") as f:
        f.write("\n\ndef _upward():\n    from grainlike.loader import data_loader  # noqa\n")
    result = _lint(str(tmp_path))
    assert result.returncode == 1, f"{result.stdout}\n{result.stderr}"
    assert "grainlike.core is not allowed to import grainlike.loader" in result.stdout, result.stdout
    assert "grainlike.core.record -> grainlike.loader.data_loader" in result.stdout, result.stdout


def test_a_file_format_importing_a_source_breaks_the_formats_contract(tmp_path):
    # grainlike.sources.formats sits below the sources that read through it: a format
    # module that imports a source (inside a function) must be reported.
    shutil.copytree(
        os.path.join(ROOT, "grainlike"), tmp_path / "grainlike",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    shutil.copy(os.path.join(ROOT, "pyproject.toml"), tmp_path / "pyproject.toml")
    with open(tmp_path / "grainlike" / "sources" / "formats" / "tfrecord_files.py", "a") as f:
        f.write("\n\ndef _upward():\n    from grainlike.sources import keys  # noqa\n")
    result = _lint(str(tmp_path))
    assert result.returncode == 1, f"{result.stdout}\n{result.stderr}"
    assert "Sources stand on their file formats, which use core only BROKEN" in result.stdout, result.stdout
    assert "grainlike.sources.formats.tfrecord_files -> grainlike.sources.keys" in result.stdout, result.stdout


@pytest.mark.parametrize(
    "module, line, contract, chain",
    [
        # The base naming a stage instead of building it through nodes/stage_registry.py.
        (
            "dataset/nodes/map_dataset.py",
            "from grainlike.dataset.transformations import batch",
            "The Dataset API: parallel stages over sources over transformations over the base protocol BROKEN",
            "grainlike.dataset.nodes.map_dataset -> grainlike.dataset.transformations.batch",
        ),
        # The pipeline node importing one of its two kinds of dataset.
        (
            "dataset/nodes/dataset_node.py",
            "from grainlike.dataset.nodes import map_dataset",
            "The pipeline node imports neither kind of dataset; the datasets import no stage BROKEN",
            "grainlike.dataset.nodes.dataset_node -> grainlike.dataset.nodes.map_dataset",
        ),
        # The wire importing the pool.
        (
            "workers/messages.py",
            "from grainlike.workers import pool",
            "Workers: the pool over process start over the worker's loop over the wire BROKEN",
            "grainlike.workers.messages -> grainlike.workers.pool",
        ),
    ],
)
def test_an_upward_import_inside_a_package_breaks_its_contract(tmp_path, module, line, contract, chain):
    shutil.copytree(
        os.path.join(ROOT, "grainlike"), tmp_path / "grainlike",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    shutil.copy(os.path.join(ROOT, "pyproject.toml"), tmp_path / "pyproject.toml")
    with open(tmp_path / "grainlike" / module, "a") as f:
        f.write(f"\n\ndef _upward():\n    {line}  # noqa\n")
    result = _lint(str(tmp_path))
    assert result.returncode == 1, f"{result.stdout}\n{result.stderr}"
    report = " ".join(result.stdout.split())  # the report wraps long lines
    assert contract in report and chain in report, result.stdout


# Issue 28: a module does one thing and stays readable as a whole; past this many
# lines it is split by role into modules whose names say what each holds.
MAX_MODULE_LINES = 600


def test_no_module_of_grainlike_is_longer_than_600_lines():
    offenders = {}
    for dirpath, _, filenames in os.walk(os.path.join(ROOT, "grainlike")):
        for name in filenames:
            if name.endswith(".py"):
                path = os.path.join(dirpath, name)
                with open(path, encoding="utf-8") as f:
                    lines = sum(1 for _ in f)
                if lines > MAX_MODULE_LINES:
                    offenders[os.path.relpath(path, ROOT)] = lines
    assert offenders == {}, f"modules over {MAX_MODULE_LINES} lines (split them by role): {offenders}"


def test_no_class_name_is_defined_twice():
    # One name, one class: tracebacks, reprs and readers name a class by its name.
    # The compat faces aside: their public classes bear another library's names
    # (JaxSGMC's DataLoader, Loadax's DatasetIterator) beside grainlike's own.
    where: dict = collections.defaultdict(list)
    for dirpath, _, filenames in os.walk(os.path.join(ROOT, "grainlike")):
        for name in filenames:
            if not name.endswith(".py"):
                continue
            path = os.path.join(dirpath, name)
            module = os.path.relpath(path, ROOT)
            with open(path, encoding="utf-8") as f:
                tree = ast.parse(f.read(), path)
            for node in ast.walk(tree):
                if isinstance(node, ast.ClassDef):
                    if module.startswith(os.path.join("grainlike", "compat", "")) and not node.name.startswith("_"):
                        continue
                    where[node.name].append(f"{module}:{node.lineno}")
    twice = {name: found for name, found in where.items() if len(found) > 1}
    assert twice == {}, f"class names defined more than once (rename one): {twice}"
