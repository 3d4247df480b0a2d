"""The execution statistics of ``mp_prefetch``'s workers, in the consumer's summary.

With statistics on (debug mode, ``ExecutionTrackingMode.STAGE_TIMING``), the
consumer's iterator gives its workers a directory of its own (``ReportDir``,
made by ``mkdtemp``: mode 0700) and each worker's pipeline collects statistics
too. A worker writes its summary there (``Reporter``) every 5 s while it runs,
as grain's workers send theirs, and once more when its share ends, so that the
summary after the last element counts every element. Each write replaces the
worker's file atomically; the consumer reads the latest of each worker when a
summary is asked for and puts the workers' stages, added up, under its
``mp_prefetch`` node (``execution_stats``). The files are protobuf messages,
parsed, never unpickled; anything there that is not a regular file of this
user, or that does not parse, is left out.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import stat
import tempfile
import threading
import weakref
from typing import Any, Optional

_LOG = logging.getLogger(__name__)

# How often a running worker writes its summary (grain's workers send theirs as often).
REPORT_PERIOD_S = 5.0
# A summary larger than this is not read (a pipeline's summary is a few KiB).
_MAX_BYTES = 16 << 20
_NAME = re.compile(r"worker-(\d+)\.pb")


def _file(directory: str, worker_index: int) -> str:
    return os.path.join(directory, f"worker-{worker_index}.pb")


# The report directories of this process, removed at exit and on SIGTERM / SIGHUP
# (whose default action skips exit handlers; see ``server.install_exit_on_signals``).
_live_dirs: set = set()


def _remove_dir(path: str) -> None:
    _live_dirs.discard(path)
    shutil.rmtree(path, ignore_errors=True)


def _remove_live_dirs() -> None:
    for path in list(_live_dirs):
        _remove_dir(path)


class ReportDir:
    """The consumer's directory of its workers' summaries; removed with the iterator, at exit, or on SIGTERM."""

    def __init__(self) -> None:
        from grainlike.workers import server

        if _remove_live_dirs not in server.exit_cleanups:
            server.exit_cleanups.append(_remove_live_dirs)
        self.path = tempfile.mkdtemp(prefix="grainlike-stats-")
        _live_dirs.add(self.path)
        self._remove = weakref.finalize(self, _remove_dir, self.path)

    def summaries(self) -> list:
        """The latest ``ExecutionSummary`` of each worker that wrote one, by worker index."""
        from grainlike.proto import execution_summary_pb2

        found = []
        try:
            names = os.listdir(self.path)
        except OSError:
            return []
        for name in names:
            match = _NAME.fullmatch(name)
            if match is None:
                continue
            data = _read_own_file(os.path.join(self.path, name))
            if data is None:
                continue
            try:
                summary = execution_summary_pb2.ExecutionSummary.FromString(data)
            except Exception:  # noqa: BLE001 - a damaged file is left out, as a missing one
                _LOG.debug("grainlike: the execution summary in %s does not parse", name)
                continue
            found.append((int(match.group(1)), summary))
        return [summary for _, summary in sorted(found, key=lambda x: x[0])]

    def remove(self) -> None:
        self._remove()


def _read_own_file(path: str) -> Optional[bytes]:
    """The bytes of ``path`` if it is a regular file of this user (not followed if a link), else None."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_size > _MAX_BYTES:
            return None
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read(_MAX_BYTES + 1)
    finally:
        os.close(fd)


class Reporter:
    """In a worker: writes the summary of ``stats`` (its pipeline's output stage) into ``directory``.

    Every ``REPORT_PERIOD_S`` from a thread until ``stop()``, and by ``write()``
    (at the end of the worker's share). A write that fails (the consumer's
    directory is gone, or the worker runs on another host) is skipped.
    """

    def __init__(self, directory: str, worker_index: int, stats: Any):
        self._path = _file(directory, worker_index)
        self._stats = stats
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="grainlike-worker-stats")
        self._thread.start()

    def _run(self) -> None:
        while not self._stopped.wait(REPORT_PERIOD_S):
            self.write()

    def write(self) -> None:
        """Replaces the worker's file with its summary now."""
        with self._lock:
            data = self._stats._get_execution_summary().SerializeToString()
            tmp = f"{self._path}.{os.getpid()}.{threading.get_ident()}.tmp"
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                os.replace(tmp, self._path)
            except OSError as e:
                _LOG.debug("grainlike: could not write the worker's execution summary: %s", e)
                try:
                    os.unlink(tmp)
                except OSError:
                    pass

    def stop(self) -> None:
        self._stopped.set()
