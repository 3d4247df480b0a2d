"""Opening Parquet files (local or remote) and converting their columns to numpy."""

from __future__ import annotations

import os
from typing import Any, Optional

from grainlike.sources.formats import remote_files as remote

__all__ = ["columns_to_numpy", "open_parquet"]


def columns_to_numpy(table: Any) -> dict:
    """``{column name: numpy array}`` of an Arrow table, as grain's Parquet reader makes them (``to_numpy()``)."""
    return {table.field(i).name: table.column(i).to_numpy() for i in range(table.num_columns)}


def open_parquet(path: Any, options: remote.RemoteOptions, read_kwargs: dict, pin: Optional[dict] = None) -> Any:
    """A ``pyarrow.parquet.ParquetFile``; a remote one at the version ``pin`` names (by default its current one).

    Raises:
      FileNotFoundError: there is no file at ``path``.
      ValueError: the file is not a readable Parquet file.
    """
    try:
        import pyarrow.parquet as pq  # pylint: disable=g-import-not-at-top
    except ImportError as e:
        raise ImportError('reading Parquet files needs pyarrow: pip install "grainlike[parquet]"') from e
    url = remote.to_url(path)
    with remote.pinned_input(url, options, pin) as source:
        if isinstance(source, str) and not os.path.exists(source):
            raise FileNotFoundError(f"ParquetDataSource: file not found: {url!r}")
        try:
            return pq.ParquetFile(source, **read_kwargs)
        except (FileNotFoundError, PermissionError, remote.RemoteReadError):
            raise
        except Exception as e:
            raise ValueError(f"{url!r} is not a readable Parquet file: {type(e).__name__}: {e}") from e
