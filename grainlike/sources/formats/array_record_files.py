"""ArrayRecord files: opening a reader on a local or remote file, counting a remote file's records.

A remote file is read from its copy in the local cache (the ArrayRecord reader opens
local files only); counting its records fetches only its tail.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
from typing import Any, Iterator, Optional

from grainlike.core.errors import SourceFileNotFoundError
from grainlike.sources.formats import remote_files as remote
from grainlike.sources.formats.remote_options import local_path
from grainlike.sources.formats.file_cache import cache_for

__all__ = ["BASE_READER_OPTIONS", "count_remote_records", "local_copy", "missing_file_error", "open_reader"]

_log = logging.getLogger("grainlike.sources.array_record")

# array_record's native library (riegeli) is not fork-safe: the first reader
# starts its threads, a process forked while they run can inherit one of their
# locks held (riegeli's background cleaner, mid-update), and its first read then
# blocks forever or crashes inside the library. Nothing in the child can repair
# that; it is told why.
_opened_here = False  # A reader was opened in this process.
_opened_before_fork = False  # ... or in a process this one was forked from.
_fork_warned = False


def _after_fork_in_child() -> None:
    global _opened_here, _opened_before_fork, _fork_warned
    _opened_before_fork = _opened_before_fork or _opened_here
    _opened_here = _fork_warned = False


os.register_at_fork(after_in_child=_after_fork_in_child)


def _new_reader(path: str, url: str, **kwargs: Any):
    """``ArrayRecordReader(path, **kwargs)``, with a warning in a process forked at risk."""
    from array_record.python import array_record_module  # pylint: disable=g-import-not-at-top

    global _opened_here, _fork_warned
    if _opened_before_fork and not _fork_warned:
        _fork_warned = True
        _log.warning(
            "ArrayRecordDataSource: process %d, opening %r, was forked from a process that "
            "had opened ArrayRecord files, which starts array_record's native threads. "
            "array_record (riegeli) is not fork-safe: a lock one of those threads held at the "
            "fork stays held here, and a read may then block forever or crash. Start the "
            "processes that read with 'spawn' or 'forkserver' (e.g. "
            "multiprocessing.get_context('spawn')), or fork them before the parent opens "
            "ArrayRecord files.",
            os.getpid(), url,
        )
    _opened_here = True
    return array_record_module.ArrayRecordReader(path, **kwargs)


# No readahead (it only helps sequential scans, and costs a 16 MiB buffer per
# reader), as grain; a file buffer of 8 KiB (grain: 32 KiB): a random read of a
# record smaller than the buffer copies the whole buffer from the page cache,
# and for 7 KiB JPEG records that copy was a fifth of the read's CPU (larger
# records need reads of their own size either way).
BASE_READER_OPTIONS = "readahead_buffer_size:0"
_FILE_READER_BUFFER_SIZE = 8192


def missing_file_error(path: str) -> SourceFileNotFoundError:
    """The error for an ArrayRecord file that does not exist."""
    return SourceFileNotFoundError(f"ArrayRecordDataSource: file not found: {path!r}")


@contextlib.contextmanager
def local_copy(
    path: str, remote_options: Optional[remote.RemoteOptions], info: Optional[dict] = None
) -> Iterator[str]:
    """A local path with the contents of ``path``: itself, or its cached copy if remote.

    A cached copy is kept from eviction until the block ends: open it inside.
    """
    if not remote.is_remote(path):
        yield local_path(path)
        return
    cache = cache_for(remote_options or remote.RemoteOptions())
    with contextlib.ExitStack() as stack:
        try:
            local = stack.enter_context(cache.pinned(path, info))
        except FileNotFoundError as e:
            raise SourceFileNotFoundError(f"ArrayRecordDataSource: file not found: {path!r} ({e})") from e
        yield local


def open_reader(
    path: str,
    options: str,
    remote_options: Optional[remote.RemoteOptions] = None,
    info: Optional[dict] = None,
):
    """An ``ArrayRecordReader`` on ``path`` (a remote file through the local cache) with ``options``.

    Raises:
      SourceFileNotFoundError: there is no file at ``path``.
      ValueError: the file is not a readable ArrayRecord file.
    """
    url = path
    with local_copy(url, remote_options, info) as path:
        reader = _new_reader(path, url, options=options, file_reader_buffer_size=_FILE_READER_BUFFER_SIZE)
        # A missing or unreadable file still constructs a reader; it reports not-ok
        # and 0 records, which would silently make an empty source.
        if not reader.ok():
            try:
                reader.close()  # Raises the reader's status, the only account of why.
                detail = ""
            except Exception as e:  # pylint: disable=broad-except
                detail = f" ({e})"
            if not os.path.exists(path):
                raise missing_file_error(url)
            if detail in ("", " ()"):
                # The reader gives no reason for a file cut at a block boundary or empty.
                try:
                    detail = (
                        f" (its footer could not be read; the file is {os.path.getsize(path)} "
                        "bytes: truncated, empty, or not an ArrayRecord file)"
                    )
                except OSError as e:
                    detail = f" ({e})"
            raise ValueError(f"ArrayRecordDataSource: {url!r} is not a readable ArrayRecord file{detail}.")
        return reader


# The first tail of a remote file fetched to count its records; grown 8x until the
# footer fits (a file written with group_size:1 has a footer entry per record).
_FIRST_TAIL_BYTES = 1 << 20


def count_remote_records(url: str, remote_options: Optional[remote.RemoteOptions]) -> int:
    """The number of records of a remote ArrayRecord file, from its tail only.

    The reader opens local files and reads only the footer to count: it is given a
    sparse local file of the object's size holding the object's last bytes. A
    footer that starts before them reads as zeros, which fail the chunks' hashes,
    and a longer tail is fetched (in the end the whole file).
    """
    options = remote_options or remote.RemoteOptions()
    try:
        # The version counted here is the one the cached copy is fetched at later
        # (the source keeps this info): a file changed in between is an error.
        info = remote.object_info(url, options)
        size = info["size"]
    except FileNotFoundError as e:
        raise SourceFileNotFoundError(f"ArrayRecordDataSource: file not found: {url!r} ({e})") from e
    tail = min(size, _FIRST_TAIL_BYTES)
    with tempfile.TemporaryDirectory(prefix="grainlike-footer-") as directory:
        path = os.path.join(directory, "tail.array_record")
        while True:
            with open(path, "wb") as f:
                f.truncate(size)
                f.seek(size - tail)
                f.write(remote.read_range(url, size - tail, size, options, info))
            with contextlib.suppress(Exception):  # A footer read as zeros fails: fetch a longer tail.
                reader = _new_reader(path, url, options=BASE_READER_OPTIONS)
                try:
                    if reader.ok():
                        return reader.num_records()
                finally:
                    with contextlib.suppress(Exception):
                        reader.close()  # A reader that read zeros reports it again here.
            if tail == size:
                raise ValueError(f"ArrayRecordDataSource: {url!r} is not a readable ArrayRecord file.")
            tail = min(size, tail * 8)
