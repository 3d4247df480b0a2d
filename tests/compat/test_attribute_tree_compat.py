"""Every attribute path of grain 0.2.18 resolves on grainlike, as the same kind of object.

grain's tree is walked in a fresh process after a bare ``import grain`` (and
after ``import grain.python as g``): modules, classes and functions (any
callable), three attributes deep, by their public names and, on modules, by the
names of their submodules (``grain._src``...). Each path is then looked up on
grainlike in another fresh process that has run ``import grainlike`` (or
``import grainlike.python``) and nothing else, so the lazily loaded top level is
what is tested: where grain has a module grainlike must have a module, a class
for a class, and something callable for a callable.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

from tests.compat.test_private_paths_compat import NO_ALIAS

ROOT = pathlib.Path(__file__).resolve().parents[2]
DEPTH = 3

# grain paths grainlike has nothing at, with the reason; a path under one of
# them is not looked up. docs/migrating.md lists them ("Names grainlike does not have").
EXCLUDED = {
    # grain's modules that grainlike has no module for, each with its reason.
    **NO_ALIAS,
}

# Walks the attribute tree of sys.argv[1] (imported with nothing else first) and
# prints {path: kind} as JSON.
_WALK = r"""
import importlib, inspect, json, sys, types

def kind(value):
    if isinstance(value, types.ModuleType):
        return "module"
    if inspect.isclass(value):
        return "class"
    return "callable" if callable(value) else None

def walk(obj, path, depth, out):
    is_module = isinstance(obj, types.ModuleType)
    for name in dir(obj):
        try:
            value = getattr(obj, name)
        except Exception:
            continue
        submodule = is_module and isinstance(value, types.ModuleType) and value.__name__ == f"{obj.__name__}.{name}"
        if name.startswith("_") and not submodule:
            continue
        k = kind(value)
        if k is None:
            continue
        out[f"{path}.{name}"] = k
        if k in ("module", "class") and depth > 1:
            walk(value, f"{path}.{name}", depth - 1, out)

root = sys.argv[1]
if root.split(".")[0] == "grain":
    import absl.flags
    absl.flags.FLAGS.mark_as_parsed()  # grain reads absl flags; outside an absl app they must be parsed
module = importlib.import_module(root)
out = {}
walk(module, root, int(sys.argv[2]), out)
print(json.dumps(out))
"""

# Imports sys.argv[1] and nothing else, then looks up each path read from stdin;
# prints {path: kind, or "missing: <error>"} and the module's dir() as JSON.
_RESOLVE = r"""
import importlib, inspect, json, sys, types

root = sys.argv[1]
module = importlib.import_module(root)
out = {}
for path in json.load(sys.stdin):
    obj = module
    try:
        for name in path.split(".")[len(root.split(".")):]:
            obj = getattr(obj, name)
    except Exception as e:
        out[path] = f"missing: {type(e).__name__}: {e}"
        continue
    if isinstance(obj, types.ModuleType):
        out[path] = "module"
    elif inspect.isclass(obj):
        out[path] = "class"
    else:
        out[path] = "callable" if callable(obj) else f"missing: not callable: {obj!r}"
print(json.dumps({"paths": out, "dir": dir(module)}))
"""


def _start(code: str, *args: str) -> subprocess.Popen:
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    return subprocess.Popen(
        [sys.executable, "-c", code, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, cwd=ROOT, env=env,
    )


def _result(proc: subprocess.Popen, stdin: str = "") -> dict:
    try:
        out, err = proc.communicate(stdin, timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


def _excluded(path: str) -> bool:
    return any(path == p or path.startswith(p + ".") for p in EXCLUDED)


def _ours(path: str) -> str:
    return "grainlike" + path[len("grain"):]


ROOTS = ("grain", "grain.python")


@pytest.fixture(scope="module")
def all_trees() -> dict:
    """``trees`` for each root, from four processes started together (each imports grain or grainlike)."""
    # A lookup imports grainlike's root, then waits for the paths on stdin.
    walks = {root: _start(_WALK, root, str(DEPTH)) for root in ROOTS}
    lookups = {root: _start(_RESOLVE, _ours(root)) for root in ROOTS}
    try:
        out = {}
        for root in ROOTS:
            theirs = _result(walks[root])
            wanted = [_ours(p) for p in theirs if not _excluded(p)]
            resolved = _result(lookups[root], json.dumps(wanted))
            out[root] = (root, theirs, resolved["paths"], resolved["dir"])
        return out
    finally:
        for proc in [*walks.values(), *lookups.values()]:
            if proc.poll() is None:
                proc.kill()
            proc.wait()


@pytest.fixture(scope="module", params=ROOTS)
def trees(request, all_trees):
    """(grain's tree, grainlike's lookup of each of its paths, dir() of grainlike's root)."""
    return all_trees[request.param]


def test_every_grain_path_resolves_on_grainlike(trees):
    _, theirs, ours, _ = trees
    missing = sorted(f"{p}: {ours[_ours(p)]}" for p in theirs if not _excluded(p) and ours[_ours(p)].startswith("missing"))
    assert not missing, f"{len(missing)} of grain's attribute paths are not on grainlike:\n" + "\n".join(missing)


def test_each_path_is_the_same_kind_of_object(trees):
    _, theirs, ours, _ = trees
    wrong = []
    for path, kind in theirs.items():
        got = None if _excluded(path) else ours[_ours(path)]
        if got is None or got.startswith("missing"):
            continue
        # A class is callable: where grain has a function, a class will do.
        if not (got == kind or (kind == "callable" and got == "class")):
            wrong.append(f"{path}: grain has a {kind}, grainlike a {got}")
    assert not wrong, "\n".join(wrong)


def test_the_walk_covers_grains_tree(trees):
    # The counts docs/migrating.md gives (paths walked, before exclusions).
    root, theirs, _, _ = trees
    expected = {"grain": 473, "grain.python": 398}[root]
    assert len(theirs) == expected
    text = " ".join((ROOT / "docs" / "migrating.md").read_text().split())
    assert f"{expected} paths after `import {root}`" in text or f"{expected} paths after `import {root} as g`" in text


def test_submodules_are_listed_by_dir_before_they_are_loaded(trees):
    # dir(grainlike) names grain's submodules (sources, samplers, ..., _src) without importing them.
    root, theirs, _, listed = trees
    submodules = [p.rsplit(".", 1)[1] for p, k in theirs.items() if k == "module" and p.count(".") == root.count(".") + 1]
    assert submodules
    assert [s for s in submodules if s not in listed and not _excluded(f"{root}.{s}")] == []


def test_excluded_paths_are_grains_and_absent_from_grainlike(trees):
    root, theirs, _, listed = trees
    if root != "grain":
        return
    for prefix in EXCLUDED:
        assert prefix in theirs or prefix in NO_ALIAS, f"{prefix} is not a path of grain's tree"
    # grain.proto (execution-summary protobufs) is grainlike.proto, listed before it is loaded.
    assert "proto" in listed
    # grain.monitoring (telemetry) is grainlike.monitoring, listed before it is loaded.
    assert "monitoring" in listed


def test_migrating_lists_the_excluded_paths():
    text = (ROOT / "docs" / "migrating.md").read_text()
    section = text.split("## Names grainlike does not have", 1)[1].split("\n## ", 1)[0]
    for prefix, reason in EXCLUDED.items():
        if prefix not in NO_ALIAS:  # those have their own table (test_private_paths_compat)
            assert f"| `{prefix}` | {reason} |" in section, prefix
