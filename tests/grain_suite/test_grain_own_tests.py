"""grain 0.2.18's own unit tests, run against grainlike.

The ``*_test.py`` files shipped in grain's wheel (Dataset API, experimental,
legacy DataLoader, core) are copied from the installed wheel at test time, never
committed, and run by pytest in the background (from the end of collection, at
low priority, see ``_Run``) in separate processes where ``import grain...``
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
import tempfile
import time
import xml.etree.ElementTree as ET

import pytest

from tests.grain_suite.exclusions import EXCLUDED, NOT_RUN

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
# The whole run, bounded: a hang shows as a failure of this file, not of CI.
RUN_TIMEOUT_S = 1200
# One test's bound. The run is niced to 19 beside the busy main suite, so a test that takes
# 45 s on an idle 2-core machine (prefetch_test's 1000-iterator leak test) can take several
# times that; a hang is still caught, by this and by RUN_TIMEOUT_S.
TEST_TIMEOUT_S = 600
# Failed tests run once more, alone, when the run has ended (at most this many, in this long).
MAX_RETRIED = 10
RERUN_TIMEOUT_S = 300
# Most of grain's slow tests wait (sleeps, worker starts): 12 processes overlap them.
WORKERS = 12
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


class _Run:
    """grain's tests running in the background, niced, while the rest of the suite runs.

    Started when the suite's collection is done (``conftest.py``), so its many
    sleeps (30 s in several tests, by design) and process starts overlap
    grainlike's own tests; at priority 19 it takes only the CPU they leave idle.
    Its processes are not this process's children (the launching shell exits at
    once), so the suite's per-test process checks do not see them; they run in a
    session of their own, which ``stop`` ends.
    """

    def __init__(self, files: list[str], work: str | None = None, launch: bool = True):
        """Starts the run in ``work`` (a new folder by default); ``launch=False`` attaches to it.

        Under pytest-xdist the controller launches the run and the worker that
        runs this module's tests attaches to it: both name the same files, so
        they build the same command.
        """
        self.work = work or tempfile.mkdtemp(prefix="grain-suite-")
        self.launched = launch
        root = os.path.join(self.work, "tests")
        self.report = os.path.join(self.work, "report.xml")
        self.log = os.path.join(self.work, "log.txt")
        self.rc = os.path.join(self.work, "rc")
        env = dict(os.environ)
        env.update(
            GRAIN_SUITE_ROOT=root,
            TEST_SRCDIR=os.path.join(root, "_src", "python"),
            # What grain's Bazel build sets: py_version_test.py and tf_import_smoke_test.py read them.
            PYTHON_VERSION=f"{sys.version_info.major}.{sys.version_info.minor}",
            PYTHON_MINOR_VERSION=str(sys.version_info.minor),
            JAX_PLATFORMS="cpu",
            PYTHONPATH=os.pathsep.join([HERE, REPO, env.get("PYTHONPATH", "")]),
            LOG=self.log,
            RC=self.rc,
        )
        cmd = [
            sys.executable, "-m", "pytest", "-q", "-p", "grain_alias", "-p", "no:cacheprovider",
            "--import-mode=importlib", "--continue-on-collection-errors", f"--timeout={TEST_TIMEOUT_S}",
            "-n", str(WORKERS), "--dist", "worksteal", f"--junitxml={self.report}", "-o", "junit_family=xunit1",
            "--rootdir", root,
            *[arg for test in NOT_RUN for arg in ("--deselect", os.path.join(root, test))],
            *[os.path.join(root, f) for f in files],
        ]
        self.cmd, self.env, self.root = cmd, env, root
        self.started_file = os.path.join(self.work, "started")
        if not launch:
            self._attach()
            return
        for rel in _wheel_files():
            dest = os.path.join(root, rel)
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            shutil.copyfile(os.path.join(_wheel_root(), rel), dest)
        # Data files the tests read from absl's --test_srcdir (Bazel sets it; here, the copy).
        shutil.copytree(
            os.path.join(_wheel_root(), "_src", "python", "testdata"), os.path.join(root, "_src", "python", "testdata")
        )
        with open(os.path.join(root, "pytest.ini"), "w") as f:
            f.write("[pytest]\n")
        launcher = subprocess.Popen(
            ["/bin/sh", "-c", '(nice -n 19 "$@"; echo $? > "$RC") > "$LOG" 2>&1 < /dev/null &', "sh", *cmd],
            cwd=root, env=env, start_new_session=True,
        )
        launcher.wait()
        self.session = launcher.pid  # the session (and process group) the run is in
        self.started = time.monotonic()
        self.started_wall = time.time()
        with open(self.started_file + ".tmp", "w") as f:
            f.write(f"{self.session} {self.started_wall}")
        os.replace(self.started_file + ".tmp", self.started_file)

    def _attach(self) -> None:
        deadline = time.monotonic() + 120
        while not os.path.exists(self.started_file):
            if time.monotonic() > deadline:
                pytest.fail(f"grain's tests were not started in {self.work} (by the pytest-xdist controller)")
            time.sleep(0.5)
        with open(self.started_file) as f:
            session, started_wall = f.read().split()
        self.session, self.started_wall = int(session), float(started_wall)
        self.started = time.monotonic() - (time.time() - self.started_wall)

    def wait(self) -> dict[str, str]:
        """``{test id: "passed" | "failed" | "skipped"}`` once the run has ended.

        A test that failed in the background run (niced, beside the busy main
        suite) is run once more, alone, when the run has ended; one that passes
        then counts as passed and is named in the summary (``self.retried``), so a
        test that fails only under that load is seen without failing CI.
        """
        waited_from = time.monotonic()
        while not os.path.exists(self.rc):
            if time.monotonic() - self.started > RUN_TIMEOUT_S:
                self.stop()
                pytest.fail(f"grain's tests did not finish in {RUN_TIMEOUT_S} s:\n{self._tail()}")
            time.sleep(0.5)
        self.timing = (os.stat(self.rc).st_mtime - self.started_wall, time.monotonic() - waited_from)
        assert os.path.exists(self.report), self._tail()
        result, self.messages = self._parse(self.report)
        self.retried: list[str] = []
        failing = sorted(t for t, o in result.items() if o == "failed" and not _excluded(t) and "::" in t)
        if failing and len(failing) <= MAX_RETRIED:
            again, messages = self._rerun(failing)
            for test in failing:
                if again.get(test) == "passed":
                    result[test] = "passed"
                    # Named in the summary with its first failure's error (its "E" lines).
                    first = [line for line in self.messages.pop(test, "").splitlines() if line.strip()]
                    errors = " ".join(line[1:].strip() for line in first if line.startswith("E "))
                    self.retried.append(f"{test} (first run: {(errors or (first[-1] if first else '?'))[:600]})")
                elif test in messages:
                    self.messages[test] += "\n--- and when run again alone:\n" + messages[test]
        self.outcomes = result
        return result

    @staticmethod
    def _parse(report: str) -> tuple[dict[str, str], dict[str, str]]:
        """The outcomes in a junit report, and the end of each failure's text."""
        result, messages = {}, {}
        for case in ET.parse(report).getroot().iter("testcase"):
            kinds = {child.tag for child in case}
            outcome = "failed" if kinds & {"failure", "error"} else "skipped" if "skipped" in kinds else "passed"
            result[_test_id(case)] = outcome
            if outcome == "failed":
                # The end of the failure's text (the error, below the traceback), to show in the report.
                text = "\n".join((c.get("message", "") + "\n" + (c.text or "")) for c in case if c.tag in ("failure", "error"))
                messages[_test_id(case)] = text[-3000:]
        return result, messages

    def _rerun(self, tests: list[str]) -> tuple[dict[str, str], dict[str, str]]:
        report = os.path.join(self.work, "rerun.xml")
        cmd = [*self.cmd[: self.cmd.index("-n")], f"--junitxml={report}", "-o", "junit_family=xunit1",
               "--rootdir", self.root, *[os.path.join(self.root, t) for t in tests]]
        with open(self.log, "a") as log:
            subprocess.run(cmd, cwd=self.root, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                           stdin=subprocess.DEVNULL, timeout=RERUN_TIMEOUT_S, start_new_session=True)
        return self._parse(report) if os.path.exists(report) else ({}, {})

    def summary(self) -> str | None:
        """One line of counts for the terminal summary, once the run has ended."""
        outcomes = getattr(self, "outcomes", None)
        if outcomes is None:
            return None
        passed = sum(o == "passed" for o in outcomes.values())
        skipped = sum(o == "skipped" for o in outcomes.values())
        excluded = sum(o == "failed" and _excluded(t) is not None for o, t in zip(outcomes.values(), outcomes))
        failing = sum(o == "failed" for o in outcomes.values()) - excluded
        return (
            f"grain 0.2.18's own tests on grainlike: {passed} passed, {excluded} excluded failing "
            f"(+{len(NOT_RUN)} not run), {skipped} skipped by grain's own conditions, {failing} failing; "
            f"{len(outcomes)} results"
            + (f" ({len(self.retried)} passed only when run again alone: {', '.join(self.retried)})" if self.retried else "")
            + f"; the run took {self.timing[0]:.0f} s in the background "
            f"and the suite waited {self.timing[1]:.0f} s for its end"
        )

    def _tail(self) -> str:
        with open(self.log, errors="replace") as f:
            return f.read()[-5000:]

    def stop(self) -> None:
        try:
            os.killpg(self.session, signal.SIGKILL)
        except ProcessLookupError:
            pass


_run: _Run | None = None
# Under pytest-xdist: the folder the controller runs grain's tests in (``share_with_workers``).
_shared_work: str | None = None
_SUMMARY = "summary.txt"


def start(items: list) -> None:
    """Starts grain's tests of the selected ``items`` (this module's), in the background."""
    start_files(sorted({item.callspec.params["test_file"] for item in items}))


def start_files(files: list[str], work: str | None = None) -> None:
    global _run
    if files and _run is None:
        _run = _Run(files, work)


def share_with_workers() -> str:
    """The folder an xdist controller will run grain's tests in, for its workers to attach to."""
    global _shared_work
    if _shared_work is None:
        _shared_work = tempfile.mkdtemp(prefix="grain-suite-")
    return _shared_work


def files_of(node_ids: list[str]) -> list[str]:
    """The grain test files that ``node_ids`` (an xdist worker's collection) select."""
    prefix = f"{os.path.relpath(__file__, REPO)}::test_grains_own_test_file_passes_on_grainlike["
    return sorted({i[len(prefix):-1] for i in node_ids if i.startswith(prefix) and i.endswith("]")})


def summary() -> str | None:
    if _run is not None and getattr(_run, "outcomes", None) is not None:
        return _run.summary()
    # Under xdist the worker that ran this module wrote it for the controller.
    work = _run.work if _run is not None else _shared_work
    path = os.path.join(work, _SUMMARY) if work else None
    if path and os.path.exists(path):
        with open(path) as f:
            return f.read()
    return None


def stop() -> None:
    if _run is not None and _run.launched:
        _run.stop()
        shutil.rmtree(_run.work, ignore_errors=True)
    elif _run is None and _shared_work is not None:
        shutil.rmtree(_shared_work, ignore_errors=True)


@pytest.fixture(scope="module")
def outcomes(request) -> dict[str, str]:
    """The outcomes of the selected test files' tests."""
    global _run
    mine = [i for i in request.session.items if i.module.__name__ == __name__ and hasattr(i, "callspec")]
    work = getattr(request.config, "workerinput", {}).get("grain_suite_work")
    if _run is None and work:  # an xdist worker: the controller started the run
        _run = _Run(sorted({i.callspec.params["test_file"] for i in mine}), work, launch=False)
    elif _run is None:  # collected without the conftest hook (e.g. run by file path alone)
        start(mine)
    result = _run.wait()
    if not _run.launched:
        with open(os.path.join(_run.work, _SUMMARY + ".tmp"), "w") as f:
            f.write(_run.summary())
        os.replace(os.path.join(_run.work, _SUMMARY + ".tmp"), os.path.join(_run.work, _SUMMARY))
    return result


def _excluded(test_id: str) -> str | None:
    for pattern, reason in {**EXCLUDED, **NOT_RUN}.items():
        if fnmatch.fnmatchcase(test_id, pattern):
            return reason
    return None


@pytest.mark.parametrize("test_file", TEST_FILES)
def test_grains_own_test_file_passes_on_grainlike(outcomes, test_file):
    ids = {t: o for t, o in outcomes.items() if t == test_file or t.startswith(test_file + "::")}
    failing = sorted(t for t, o in ids.items() if o == "failed" and not _excluded(t))
    stale = sorted(t for t, o in ids.items() if o == "passed" and _excluded(t))
    messages = getattr(_run, "messages", {})
    assert not failing, f"{len(failing)} of grain's tests fail on grainlike:\n" + "\n\n".join(
        f"{t}\n{messages.get(t, '')}" for t in failing
    )
    assert not stale, "excluded in exclusions.py but passing now (remove them there):\n" + "\n".join(stale)
