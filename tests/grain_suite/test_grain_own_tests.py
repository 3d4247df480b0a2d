"""grain 0.2.18's own unit tests, run against grainlike.

The ``*_test.py`` files shipped in grain's wheel (Dataset API, experimental,
legacy DataLoader, core) are copied from the installed wheel at test time, never
committed, and run by pytest in a separate process where ``import grain...``
resolves to grainlike (``grain_alias.py``). Each test that passes on grain must
pass here; the ones that cannot (they need a grain-internal object with no
user-facing meaning, or fail on grain itself on this machine) are listed in
``exclusions.py`` with the reason, and docs/migrating.md names the groups. An
excluded test that starts passing fails here, so the list stays true.
"""

from __future__ import annotations

import fnmatch
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

from tests.grain_suite.exclusions import EXCLUDED

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
# The whole run, bounded: a hang shows as a failure of this file, not of CI.
RUN_TIMEOUT_S = 600
WORKERS = 8
# The first test waits for the whole run (the module fixture).
pytestmark = pytest.mark.timeout(RUN_TIMEOUT_S + 60)


# Test infrastructure in grain's wheel that the test files import.
_HELPERS = {"testing_util.py", "pytest.py"}


def _wheel_root() -> str:
    spec = importlib.util.find_spec("grain")  # locates the wheel without importing grain
    assert spec is not None and spec.submodule_search_locations, "grain==0.2.18 (test dependency) is not installed"
    return list(spec.submodule_search_locations)[0]


def _wheel_files() -> list[str]:
    """Test files and the helpers they import, relative to the wheel's ``grain/``."""
    root = _wheel_root()
    out = []
    for folder, _, names in os.walk(root):
        for name in names:
            if name.endswith("_test.py") or name in _HELPERS:
                out.append(os.path.relpath(os.path.join(folder, name), root))
    return sorted(out)


TEST_FILES = [f for f in _wheel_files() if f.endswith("_test.py")]


def _test_id(case: ET.Element) -> str:
    classname = case.get("classname", "")
    if not classname:  # a file that failed to import: its dotted module name
        return case.get("name", "").replace(".", "/") + ".py"
    # junit classnames are dotted module paths plus the class: back to a file id.
    parts = classname.split(".")
    for cut in range(len(parts), 0, -1):
        path = "/".join(parts[:cut]) + ".py"
        if path in TEST_FILES:
            rest = parts[cut:]
            return "::".join([path, *rest, case.get("name", "")])
    return f"{classname}::{case.get('name', '')}"


def _selected_files(session: pytest.Session) -> list[str]:
    """The test files this run selected (all, or those ``-k`` kept)."""
    chosen = set()
    for item in session.items:
        callspec = getattr(item, "callspec", None)
        if item.module.__name__ == __name__ and callspec is not None:
            chosen.add(callspec.params["test_file"])
    return sorted(chosen)


@pytest.fixture(scope="module")
def outcomes(request, tmp_path_factory) -> dict[str, str]:
    """Runs the selected test files once; ``{test id: "passed" | "failed" | "skipped"}``."""
    work = tmp_path_factory.mktemp("grain_suite")
    root = work / "tests"
    for rel in _wheel_files():
        dest = root / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(os.path.join(_wheel_root(), rel), dest)
    # Data files the tests read from absl's --test_srcdir (Bazel sets it; here, the copy).
    shutil.copytree(os.path.join(_wheel_root(), "_src", "python", "testdata"), root / "_src" / "python" / "testdata")
    (root / "pytest.ini").write_text("[pytest]\n")
    report = work / "report.xml"
    env = dict(os.environ)
    env.update(
        GRAIN_SUITE_ROOT=str(root),
        TEST_SRCDIR=str(root / "_src" / "python"),
        JAX_PLATFORMS="cpu",
        PYTHONPATH=os.pathsep.join([HERE, REPO, env.get("PYTHONPATH", "")]),
    )
    cmd = [
        sys.executable, "-m", "pytest", "-q", "-p", "grain_alias", "-p", "no:cacheprovider",
        "--import-mode=importlib", "--continue-on-collection-errors", "--timeout=180",
        # grain's tests sleep (30 s in one, by design): they overlap in 8 processes (most of them wait).
        "-n", str(WORKERS), "--dist", "worksteal", f"--junitxml={report}", "-o", "junit_family=xunit1", "--rootdir", str(root),
        *[str(root / f) for f in _selected_files(request.session)],
    ]
    proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        pytest.fail(f"grain's tests did not finish in {RUN_TIMEOUT_S} s:\n{output.decode()[-5000:]}")
    assert report.exists(), output.decode()[-5000:]
    result = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        kinds = {child.tag for child in case}
        outcome = "failed" if kinds & {"failure", "error"} else "skipped" if "skipped" in kinds else "passed"
        result[_test_id(case)] = outcome
    return result


def _excluded(test_id: str) -> str | None:
    for pattern, reason in EXCLUDED.items():
        if fnmatch.fnmatchcase(test_id, pattern):
            return reason
    return None


@pytest.mark.parametrize("test_file", TEST_FILES)
def test_grains_own_test_file_passes_on_grainlike(outcomes, test_file):
    ids = {t: o for t, o in outcomes.items() if t == test_file or t.startswith(test_file + "::")}
    failing = sorted(t for t, o in ids.items() if o == "failed" and not _excluded(t))
    stale = sorted(t for t, o in ids.items() if o == "passed" and _excluded(t))
    assert not failing, f"{len(failing)} of grain's tests fail on grainlike:\n" + "\n".join(failing)
    assert not stale, "excluded in exclusions.py but passing now (remove them there):\n" + "\n".join(stale)
