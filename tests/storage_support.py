"""A real S3-compatible server on loopback for the storage tests: moto's standalone server (``moto[server]``),
behind a small HTTP proxy that logs every request (method, path, Range header) and injects faults."""

from __future__ import annotations

import http.client
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

#: fault(method, path, headers) -> None (forward), "error" (answer 503), "denied" (answer 403: a persistent error),
#: "drop" (cut the body half way) or "hold" (wait until ``FaultProxy.release`` is set, then forward)
Fault = Callable[[str, str, object], "str | None"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class MotoServer:
    """``python -m moto.server`` on a free loopback port; its request log goes to ``log_path``."""

    def __init__(self, log_path: Path) -> None:
        self.port = _free_port()
        self.log_path = log_path
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=self._log, stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return
            except OSError:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"moto server exited: {log_path.read_text()}") from None
                time.sleep(0.1)
        raise RuntimeError("moto server did not start in 60 s")

    def log(self) -> str:
        """The server's request log (werkzeug's: ``"GET /bucket/key HTTP/1.1" 206 -``), colours removed."""
        self._log.flush()
        return re.sub(r"\x1b\[[0-9;]*m", "", self.log_path.read_text(errors="replace"))

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)
        self._log.close()


class FaultProxy:
    """Forwards every request to ``upstream_port``; logs it; ``fault`` decides, per request, to fail it."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream = upstream_port
        self.requests: list[tuple[str, str, str | None]] = []
        self.fault: Fault | None = None
        self.injected: list[tuple[str, str, str]] = []
        self.holding = threading.Event()  # set when a request is held ("hold")
        self.release = threading.Event()  # set to let held requests go on
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _any(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                proxy.requests.append((self.command, self.path, self.headers.get("Range")))
                action = proxy.fault(self.command, self.path, self.headers) if proxy.fault else None
                if action:
                    proxy.injected.append((action, self.command, self.path))
                if action == "hold":  # the client is killed meanwhile: the request never reaches the store
                    proxy.holding.set()
                    proxy.release.wait(120)
                    self.close_connection = True
                    return
                if action in ("error", "denied"):
                    code, status = ("ServiceUnavailable", 503) if action == "error" else ("AccessDenied", 403)
                    data = f"<Error><Code>{code}</Code><Message>injected</Message></Error>".encode()
                    self.send_response(status)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                conn = http.client.HTTPConnection("127.0.0.1", proxy.upstream, timeout=60)
                headers = {k: v for k, v in self.headers.items() if k.lower() != "connection"}
                conn.request(self.command, self.path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                conn.close()
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in ("transfer-encoding", "connection", "content-length", "date", "server"):
                        self.send_header(k, v)
                size = resp.getheader("Content-Length") if self.command == "HEAD" else str(len(data))
                self.send_header("Content-Length", size or "0")
                self.end_headers()
                if self.command == "HEAD":
                    return
                if action == "drop":  # the connection breaks half way through the body
                    self.wfile.write(data[: len(data) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _any

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class RangeServer:
    """A plain HTTP server on loopback that serves ``files`` (path -> bytes) with HEAD and Range requests, as a web
    server or a presigned-URL endpoint does, and only to a request whose basic auth is ``auth`` (user, password):
    the credentials of an ``http://user:password@host/...`` URL must reach it."""

    def __init__(self, files: dict[str, bytes], auth: tuple[str, str]) -> None:
        import base64

        expected = "Basic " + base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
        self.requests: list[tuple[str, str]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _any(self) -> None:
                server.requests.append((self.command, self.path))
                data = files.get(self.path.split("?", 1)[0])
                status, headers = 200, {}
                if self.headers.get("Authorization") != expected:
                    status, data = 401, b"unauthorized"
                elif data is None:
                    status, data = 404, b"not found"
                elif rng := self.headers.get("Range"):
                    start, _, end = rng.removeprefix("bytes=").partition("-")
                    first, last = int(start), min(int(end) if end else len(data) - 1, len(data) - 1)
                    headers["Content-Range"] = f"bytes {first}-{last}/{len(data)}"
                    status, data = 206, data[first : last + 1]
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Accept-Ranges", "bytes")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_HEAD = _any

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def serve_s3(tmp_path_factory, bucket: str, objects: dict[str, bytes]):
    """A generator for a module's fixture: moto's server behind a ``FaultProxy``, the process's storage options
    pointing at the proxy, ``bucket`` made and ``objects`` (URL -> bytes) uploaded; yields (proxy, server), then
    stops both."""
    import boto3

    from weightprep import storage

    server = MotoServer(tmp_path_factory.mktemp("moto") / "requests.log")
    proxy = FaultProxy(server.port)
    storage.configure(s3_options(proxy.url))
    boto3.client(
        "s3", endpoint_url=proxy.url, aws_access_key_id="testing", aws_secret_access_key="testing", region_name="us-east-1"
    ).create_bucket(Bucket=bucket)
    for url, data in objects.items():
        storage.write_bytes(url, data)
    yield proxy, server
    storage.configure(None)
    proxy.stop()
    server.stop()


def load_rows(url: str) -> list[list[int]]:
    """The ``input_ids`` of every row ``datasets.load_from_disk`` gives for the build at ``url``, loaded from a
    fresh copy (``datasets`` copies a URL to one directory per path and process, where an earlier load's files
    would linger: ``weightprep.train.data._local_copy``)."""
    import tempfile

    import datasets

    from weightprep import storage

    with tempfile.TemporaryDirectory() as local:
        storage.download_tree(url, Path(local))
        return [r["input_ids"] for r in datasets.load_from_disk(local, keep_in_memory=True)]


def s3_options(endpoint: str) -> dict[str, object]:
    """Storage options for the loopback server; botocore's own retries off, so weightprep's are what is tested."""
    return {
        "endpoint_url": endpoint, "key": "testing", "secret": "testing",
        "client_kwargs": {"region_name": "us-east-1"},
        "config_kwargs": {"retries": {"total_max_attempts": 1, "mode": "standard"}},
    }


os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")  # botocore must not probe for instance credentials
