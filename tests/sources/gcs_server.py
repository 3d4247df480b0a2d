"""A real GCS-compatible server (gcp-storage-emulator) on a free localhost port, for the gs:// tests.

The emulator runs as a subprocess in its own session, keeps objects in memory,
and is ended by its process group. gcsfs reaches it anonymously through its
``endpoint_url``; no credentials of the machine's user are read.
"""

from __future__ import annotations

import os
import sys

from tests.helpers.server_process import ServerProcess

# gcsfs (2026.x) asks a bucket's storage layout over gRPC before each operation
# unless this is off; an emulator answers only HTTP, so each ask would wait a
# minute. The variable is read when gcsfs is imported: set here, at test
# collection, it reaches the worker processes (forked from a server that keeps
# the environment it started with); where this process imported gcsfs before,
# its plain filesystem is registered for gs:// instead.
os.environ["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] = "false"
if "gcsfs" in sys.modules:
    import fsspec
    import gcsfs.core

    for _protocol in ("gs", "gcs"):
        fsspec.register_implementation(_protocol, gcsfs.core.GCSFileSystem, clobber=True)


def _emulator_command(port: int) -> list:
    return [sys.executable, "-m", "gcp_storage_emulator", "start",
            "--host", "127.0.0.1", "--port", str(port), "--in-memory", "--quiet"]


class LocalGcsServer(ServerProcess):
    """``gcp-storage-emulator`` on ``127.0.0.1:port``; objects live in memory: a restart loses them."""

    def __init__(self, port: int | None = None):
        super().__init__("gcp-storage-emulator", _emulator_command, "/storage/v1/b", port)

    def storage_options(self, **extra) -> dict:
        """gcsfs options for this server: its endpoint, anonymous access, short request timeouts."""
        # A stopped server makes a request wait; a timeout fails it fast so that
        # grainlike's own retries are what the tests see.
        return {"endpoint_url": self.endpoint_url, "token": "anon", "requests_timeout": 2, **extra}

    def filesystem(self):
        """A gcsfs filesystem on this server, not shared with the code under test."""
        import gcsfs.core

        return gcsfs.core.GCSFileSystem(**self.storage_options(), skip_instance_cache=True)

    def upload(self, bucket: str, files: dict) -> None:
        """Creates ``bucket`` if needed and uploads ``{key: local path}``."""
        fs = self.filesystem()
        if not fs.exists(bucket):
            fs.mkdir(bucket)
        for key, path in files.items():
            fs.put_file(path, f"{bucket}/{key}")
