"""A real S3-compatible server (moto's) on a free localhost port, for the remote tests.

The server runs as a subprocess in its own session and is ended by its process
group; credentials are dummy values passed explicitly, never the user's ~/.aws.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import struct
import sys
import time
from typing import Iterator

from tests.helpers.server_process import ServerProcess

ACCESS_KEY = "testing-key"
SECRET_KEY = "testing-secret"


def _moto_command(port: int) -> list:
    exe = shutil.which("moto_server", path=os.path.dirname(sys.executable)) or shutil.which("moto_server")
    args = [exe] if exe else [sys.executable, "-m", "moto.server"]
    return [*args, "-H", "127.0.0.1", "-p", str(port)]


class LocalS3Server(ServerProcess):
    """``moto_server`` on ``127.0.0.1:port``; it keeps objects in memory: a restart loses them."""

    def __init__(self, port: int | None = None):
        super().__init__("moto_server", _moto_command, "/moto-api/", port)

    def storage_options(self, **extra) -> dict:
        """s3fs options for this server: its endpoint, dummy keys, few retries."""
        return {
            "endpoint_url": self.endpoint_url,
            "key": ACCESS_KEY,
            "secret": SECRET_KEY,
            "client_kwargs": {"region_name": "us-east-1"},
            # Fail fast when the server is gone: grainlike's own retries are under test.
            "config_kwargs": {"connect_timeout": 1, "read_timeout": 5, "retries": {"max_attempts": 1}},
            **extra,
        }

    def client(self):
        import boto3

        return boto3.client(
            "s3", endpoint_url=self.endpoint_url, aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY, region_name="us-east-1",
        )

    def upload(self, bucket: str, files: dict) -> None:
        """Creates ``bucket`` if needed and uploads ``{key: local path}``."""
        client = self.client()
        try:
            client.create_bucket(Bucket=bucket)
        except client.exceptions.BucketAlreadyOwnedByYou:
            pass
        for key, path in files.items():
            client.upload_file(path, bucket, key)


@contextlib.contextmanager
def serving(bucket: str, files: dict) -> Iterator["LocalS3Server"]:
    """A running ``LocalS3Server`` holding ``files`` in ``bucket``; stopped afterwards.

    No configuration or credentials of the machine's user reach the clients
    meanwhile (``AWS_*`` variables cleared, config files pointed at /dev/null).
    """
    saved = dict(os.environ)
    for name in [n for n in os.environ if n.startswith("AWS_")]:
        del os.environ[name]
    os.environ["AWS_CONFIG_FILE"] = os.devnull
    os.environ["AWS_SHARED_CREDENTIALS_FILE"] = os.devnull
    os.environ["AWS_EC2_METADATA_DISABLED"] = "true"
    server = LocalS3Server()
    server.start()
    try:
        server.upload(bucket, files)
        yield server
    finally:
        server.stop()
        os.environ.clear()
        os.environ.update(saved)


class TcpProxy:
    """Forwards ``127.0.0.1:port`` to a server; while ``down()``, connections are reset.

    A network outage without stopping the server (which would lose moto's objects).
    """

    def __init__(self, target_port: int):
        import struct
        import threading

        self.target_port = target_port
        self._lock = threading.Lock()
        self._conns: list = []
        self._down = False
        self._threading = threading
        self._linger_reset = struct.pack("ii", 1, 0)  # close() sends RST
        self._listener = socket.socket()
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def up(self) -> None:
        self._down = False

    def down(self) -> None:
        """Resets open connections and every new one until ``up()``."""
        with self._lock:
            self._down = True
            conns, self._conns = self._conns, []
        for c in conns:
            self._reset(c)

    def close(self) -> None:
        self.down()
        self._listener.close()

    def _reset(self, sock) -> None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, self._linger_reset)
        except OSError:
            pass
        sock.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self._down:
                self._reset(client)
                continue
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port))
            except OSError:
                self._reset(client)
                continue
            with self._lock:
                self._conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                self._threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src, dst) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


class FaultyHttpProxy:
    """An HTTP proxy to a storage server that can fail its GETs the ways stores fail.

    ``mode``: None forwards every request; ``"500"`` answers each GET with HTTP 500
    (S3's ``InternalError``); ``"slow"`` holds each GET ``delay_s`` before
    forwarding it; ``"reset"`` sends the answer's headers and half its body, then
    resets the connection. Other requests (HEAD: ``info``) are always forwarded.
    ``gets`` counts the GETs seen; ``faults`` how many more GETs fail (None: all).
    """

    def __init__(self, target_port: int):
        import http.client
        import http.server
        import threading

        proxy = self
        self.mode: str | None = None
        self.delay_s = 0.0
        self.faults: int | None = None
        self.gets = 0
        self._lock = threading.Lock()

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _forward(self, body_limit=None):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                upstream = http.client.HTTPConnection("127.0.0.1", target_port, timeout=30)
                headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
                headers["Host"] = f"127.0.0.1:{target_port}"
                upstream.request(self.command, self.path, body=body, headers=headers)
                answer = upstream.getresponse()
                data = answer.read()
                self.send_response(answer.status)
                head = self.command == "HEAD"  # its Content-Length is the object's size
                for k, v in answer.getheaders():
                    if k.lower() not in ("transfer-encoding", "connection") and (head or k.lower() != "content-length"):
                        self.send_header(k, v)
                if not head:
                    self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if body_limit is None:
                    self.wfile.write(data)
                else:
                    self.wfile.write(data[:body_limit])
                    self.wfile.flush()
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    self.close_connection = True
                upstream.close()

            def do_HEAD(self):
                self._forward()

            def do_PUT(self):
                self._forward()

            def do_POST(self):
                self._forward()

            def do_GET(self):
                with proxy._lock:
                    proxy.gets += 1
                    fault = proxy.mode is not None and (proxy.faults is None or proxy.faults > 0)
                    if fault and proxy.faults is not None:
                        proxy.faults -= 1
                    mode = proxy.mode if fault else None
                if mode == "500":
                    body = (b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>InternalError</Code>'
                            b"<Message>We encountered an internal error. Please try again.</Message></Error>")
                    self.send_response(500)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                if mode == "slow":
                    time.sleep(proxy.delay_s)
                if mode == "reset":
                    self._forward(body_limit=16)
                    return
                self._forward()

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
