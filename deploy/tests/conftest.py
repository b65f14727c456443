"""Shared by the chart and dashboard tests: where the tools are, and a real
fusebox server (and redis-server with the module) on free ports.

Tools, by environment variable (scripts/test sets them):
- HELM: the helm binary (default target/tools/helm);
- FUSEBOX_BIN: the server (default target/debug/fusebox);
- FUSEBOX_REDIS_MODULE: the module (default target/debug/libfusebox_redis.so).
A missing tool skips its tests, saying so, unless FUSEBOX_TEST_REQUIRE_TOOLS=1.
"""

from __future__ import annotations

import os
import shutil
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "fusebox"
BIN = Path(os.environ.get("FUSEBOX_BIN", ROOT / "target" / "debug" / "fusebox"))
MODULE = Path(os.environ.get("FUSEBOX_REDIS_MODULE", ROOT / "target" / "debug" / "libfusebox_redis.so"))
HELM = Path(os.environ.get("HELM", ROOT / "target" / "tools" / "helm"))
START = 60.0  # seconds a debug server on a busy machine may take to start


def need(path: Path | None, what: str) -> Path:
    """`path` when it exists; else skip (or fail under FUSEBOX_TEST_REQUIRE_TOOLS=1)."""
    if path is not None and path.exists():
        return path
    message = f"{what} is missing ({path}): see deploy/tests/conftest.py"
    if os.environ.get("FUSEBOX_TEST_REQUIRE_TOOLS") == "1":
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture(scope="session")
def helm() -> Path:
    return need(HELM, "helm")


def free_port() -> int:
    """A free loopback port, as the kernel hands one out (for redis-server,
    which cannot report a port 0 it picked)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    proc: subprocess.Popen
    grpc: str
    http: str
    cli_args: list[str] = field(default_factory=list)  # e.g. --tls-ca for a TLS server
    https_ca: Path | None = None  # the HTTP port speaks TLS, its certificate signed by this CA
    log: IO[str] | None = None

    def get(self, path: str, timeout: float = 10.0) -> tuple[int, str]:
        scheme, context = "http", None
        if self.https_ca is not None:
            scheme, context = "https", ssl.create_default_context(cafile=str(self.https_ca))
        try:
            with urllib.request.urlopen(f"{scheme}://{self.http}{path}", timeout=timeout, context=context) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def cli(self, *args: str) -> str:
        out = subprocess.run(
            [str(BIN), *args, "--server", self.grpc, *self.cli_args], capture_output=True, text=True, timeout=START
        )
        assert out.returncode == 0, f"fusebox {' '.join(args)} failed: {out.stderr}"
        return out.stdout

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=START)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.log is not None:
            self.log.close()


def start_server(args: list[str], env: dict[str, str] | None = None) -> Server:
    """`fusebox serve ARGS`, its addresses read from its first two lines."""
    # Its log, shown when it does not start; open as long as the server runs.
    log = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115
    proc = subprocess.Popen(
        [str(BIN), "serve", *args],
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
        env={**os.environ, **(env or {})},
    )
    assert proc.stdout is not None
    first = proc.stdout.readline().strip()
    second = proc.stdout.readline().strip()
    if not first.startswith("listening on ") or not second.startswith("http on "):
        proc.kill()
        proc.wait()
        log.seek(0)
        pytest.fail(f"fusebox serve {' '.join(args)} did not start: {first!r} {second!r}\n{log.read()[-2000:]}")
    return Server(proc, first.removeprefix("listening on "), second.removeprefix("http on "), log=log)


@pytest.fixture
def tmp_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="fusebox-deploy-") as d:
        yield Path(d)


def make_certs(directory: Path) -> tuple[Path, Path, Path]:
    """A CA and a server certificate it signed for 127.0.0.1 (openssl):
    (ca.crt, tls.crt, tls.key), as a kubernetes.io/tls Secret holds them."""
    directory.mkdir(parents=True, exist_ok=True)
    ca, ca_key = directory / "ca.crt", directory / "ca.key"
    cert, key, csr = directory / "tls.crt", directory / "tls.key", directory / "tls.csr"
    ext = directory / "leaf.ext"
    ext.write_text("basicConstraints=critical,CA:FALSE\nsubjectAltName=IP:127.0.0.1\n")
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
    for command in (
        ["req", "-x509", *ec, "-keyout", ca_key, "-out", ca, "-days", "2", "-subj", "/CN=fusebox test CA"],
        ["req", *ec, "-keyout", key, "-out", csr, "-subj", "/CN=fusebox"],
        ["x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial", "-out", cert,
         "-days", "2", "-extfile", ext],
    ):  # fmt: skip
        subprocess.run(["openssl", *map(str, command)], check=True, capture_output=True)
    return ca, cert, key


@dataclass
class Redis:
    proc: subprocess.Popen
    port: int


def start_redis(module: Path, workdir: Path, module_args: tuple[str, ...] = ()) -> Redis:
    """redis-server with the module on a free port; a new port when the
    one picked was taken meanwhile."""
    server = shutil.which("redis-server")
    cli = shutil.which("redis-cli")
    if server is None or cli is None:
        need(None, "redis-server and redis-cli")
    for _ in range(5):
        port = free_port()
        proc = subprocess.Popen(
            [
                server,
                "--port",
                str(port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(workdir),
                "--loadmodule",
                str(module),
                *module_args,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + START
        while time.monotonic() < deadline and proc.poll() is None:
            ping = subprocess.run([cli, "-p", str(port), "PING"], capture_output=True, text=True)
            if ping.stdout.strip() == "PONG":
                return Redis(proc, port)
            time.sleep(0.05)  # polling redis-cli until it answers, not a fixed wait
        proc.kill()
        proc.wait()
    pytest.fail("redis-server with the module did not start on any of 5 free ports")
