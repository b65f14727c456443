"""The Helm chart (deploy/helm/fusebox): `helm lint`, and `helm template`
in embedded and store modes with TLS and auth on and off. Every rendered
object is validated against the Kubernetes schemas (kubernetes-validate),
and its meaning is checked: the probes ask routes the server has, on the
port its --http listens on; the Service and ServiceMonitor reach named
container ports; the config's files are where Secrets are mounted; the PDB
and Service select the pods. Last, the rendered config and arguments start
the real server, whose /readyz answers on the probe's scheme."""

from __future__ import annotations

import base64
import json
import re
import shutil
import ssl
import subprocess
import tomllib
import urllib.error
import urllib.request
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from conftest import BIN, CHART, MODULE, ROOT, make_certs, need, start_redis, start_server

K8S_VERSION = "1.30"
ROUTES = ROOT / "src" / "http" / "routes.rs"
RELEASE = "fb"
NAMESPACE = "limits"
CLUSTER = ["redis-0.redis:6379", "redis-1.redis:6379", "redis-2.redis:6379"]


ADMIN_TOKEN = "admin-" + "a" * 58
METRICS_TOKEN = "metrics-" + "m" * 56


def with_tokens(values: dict) -> dict:
    """`values` with the tokens the chart requires (auth is on by default),
    unless they name their own Secret or tokens."""
    auth = dict(values.get("auth", {}))
    if auth.get("enabled", True) and not auth.get("existingSecret"):
        auth.setdefault("token", ADMIN_TOKEN)
        if auth.get("metrics") == "token":
            auth.setdefault("metricsToken", METRICS_TOKEN)
    return {**values, "auth": auth}


def render(helm: Path, values: dict, *, ok: bool = True, tokens: bool = True) -> list[dict] | str:
    """The chart's objects with `values` (or, with ok=False, helm's error);
    with `tokens`, the required tokens are filled in."""
    if tokens:
        values = with_tokens(values)
    out = subprocess.run(
        [str(helm), "template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--values", "-"],
        input=json.dumps(values),
        capture_output=True,
        text=True,
    )
    if not ok:
        assert out.returncode != 0, f"helm template should have refused {values}"
        return out.stderr
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def case(store: bool, tls: bool, auth: bool) -> dict:
    values: dict = {"auth": {"enabled": auth}, "serviceMonitor": {"enabled": True}}
    if store:
        values["store"] = {
            "enabled": True,
            "clusterNodes": CLUSTER,
            "noticesSecret": {"name": "fusebox-notices"},
            "passwordSecret": {"name": "fusebox-redis"},
            "user": "fusebox",
        }
        values["replicaCount"] = 3
    if tls:
        values["tls"] = {
            "enabled": True,
            "secretName": "fusebox-tls",
            "clientCa": True,
            "clientAuth": "optional",
            "http": True,
        }
    return values


CASES = [
    pytest.param(store, tls, auth, id=f"{'store' if store else 'embedded'}-tls_{tls}-auth_{auth}")
    for store in (False, True)
    for tls in (False, True)
    for auth in (False, True)
]


def one(objects: list[dict], kind: str) -> dict:
    found = [o for o in objects if o["kind"] == kind]
    assert len(found) == 1, f"{len(found)} {kind}s rendered"
    return found[0]


def server_routes() -> set[str]:
    return set(re.findall(r'\.route\(\s*"([^"]+)"', ROUTES.read_text()))


def arg(args: list[str], flag: str) -> str | None:
    return args[args.index(flag) + 1] if flag in args else None


def port_of(address: str) -> int:
    return int(address.rsplit(":", 1)[1])


def test_helm_lint(helm: Path):
    for values in ({}, case(True, True, True)):
        out = subprocess.run(
            [str(helm), "lint", "--strict", str(CHART), "--values", "-"],
            input=json.dumps(with_tokens(values)),
            capture_output=True,
            text=True,
        )
        assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize("store,tls,auth", CASES)
def test_renders_valid_and_consistent(helm: Path, store: bool, tls: bool, auth: bool):
    objects = render(helm, case(store, tls, auth))
    kinds = sorted(o["kind"] for o in objects)
    expected = ["ConfigMap", "Deployment", "NetworkPolicy", "PodDisruptionBudget", "Service", "ServiceMonitor"]
    assert kinds == sorted(expected + (["Secret"] if auth else []))

    # The Kubernetes schemas, strictly (no unknown fields). The
    # ServiceMonitor is a CRD's: its fields are checked below.
    for o in objects:
        if o["apiVersion"] != "monitoring.coreos.com/v1":
            kubernetes_validate.validate(o, K8S_VERSION, strict=True)

    deploy = one(objects, "Deployment")
    pod = deploy["spec"]["template"]
    spec = pod["spec"]
    (container,) = spec["containers"]
    args = container["args"]
    env = {e["name"]: e for e in container.get("env", [])}
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}

    # The arguments: the server's real flags, listening where the ports say.
    assert args[0] == "serve"
    assert port_of(arg(args, "--listen")) == ports["grpc"]
    assert port_of(arg(args, "--http")) == ports["http"]
    help_text = (
        subprocess.run([str(BIN), "serve", "--help"], capture_output=True, text=True).stdout if BIN.exists() else ""
    )
    for flag in (a for a in args if a.startswith("--")):
        if help_text:
            assert flag in help_text, f"{flag} is not a flag of fusebox serve"

    # Probes: real routes, on the HTTP port, HTTPS when the HTTP port speaks TLS.
    routes = server_routes()
    scheme = "HTTPS" if tls else "HTTP"
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        get = container[probe]["httpGet"]
        assert get["path"] == path and path in routes, f"{probe} asks {get['path']}; routes: {sorted(routes)}"
        assert ports[get["port"]] == ports["http"]
        assert get["scheme"] == scheme

    # The config: where the ConfigMap is mounted, valid TOML, its files mounted.
    config_path = Path(arg(args, "--config"))
    assert (
        volumes[mounts[str(config_path.parent)]]["configMap"]["name"] == one(objects, "ConfigMap")["metadata"]["name"]
    )
    config = tomllib.loads(one(objects, "ConfigMap")["data"][config_path.name])
    assert "default" in config
    # Numbers stay whole (Helm reads them as floats; the server wants integers).
    service_name = one(objects, "Service")["metadata"]["name"]
    assert config["server"] == {
        "max_connections": 10000,
        "idle_after": "10m",
        "http_hosts": [
            service_name,
            f"{service_name}.{NAMESPACE}",
            f"{service_name}.{NAMESPACE}.svc",
            f"{service_name}.{NAMESPACE}.svc.cluster.local",
        ],
        "memory_limit": "512Mi",
    }
    assert type(config["server"]["max_connections"]) is int

    def secret_file(path: str) -> tuple[str, str]:
        """The Secret and key that `path` is in, through the pod's mounts."""
        p = Path(path)
        volume = volumes[mounts[str(p.parent)]]
        return volume["secret"]["secretName"], p.name

    if tls:
        assert secret_file(config["tls"]["cert"]) == ("fusebox-tls", "tls.crt")
        assert secret_file(config["tls"]["key"]) == ("fusebox-tls", "tls.key")
        assert secret_file(config["tls"]["client_ca"]) == ("fusebox-tls", "ca.crt")
        assert config["tls"]["http"] is True
        assert config["tls"]["client_auth"] == "optional"
    else:
        assert "tls" not in config

    if auth:
        assert "--insecure-no-auth" not in args
        admin = [t for t in config["auth"]["token"] if t["name"] == "admin"]
        assert admin and admin[0]["env"] == "FUSEBOX_TOKEN"
        ref = env["FUSEBOX_TOKEN"]["valueFrom"]["secretKeyRef"]
        secret = one(objects, "Secret")
        assert ref["name"] == secret["metadata"]["name"] and ref["key"] in secret["data"]
    else:
        assert "auth" not in config
        assert "--insecure-no-auth" in args
        assert "FUSEBOX_TOKEN" not in env

    if store:
        assert deploy["spec"]["replicas"] == 3
        assert arg(args, "--store") == "redis-cluster://" + ",".join(CLUSTER)
        assert secret_file(arg(args, "--store-secret-file")) == ("fusebox-notices", "notices.key")
        assert env["FUSEBOX_STORE_PASSWORD"]["valueFrom"]["secretKeyRef"]["name"] == "fusebox-redis"
        assert env["FUSEBOX_STORE_USER"]["value"] == "fusebox"
    else:
        assert deploy["spec"]["replicas"] == 1
        assert deploy["spec"]["strategy"]["type"] == "Recreate"
        assert "--store" not in args

    # Non-root, read-only root filesystem.
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["resources"]["requests"]["cpu"] and container["resources"]["requests"]["memory"]

    # Selectors: the Service, the PDB and the ServiceMonitor find the pods.
    labels = pod["metadata"]["labels"]
    service = one(objects, "Service")
    pdb = one(objects, "PodDisruptionBudget")
    monitor = one(objects, "ServiceMonitor")
    for selector in (service["spec"]["selector"], pdb["spec"]["selector"]["matchLabels"]):
        assert selector and all(labels.get(k) == v for k, v in selector.items())
    assert all(service["metadata"]["labels"].get(k) == v for k, v in monitor["spec"]["selector"]["matchLabels"].items())
    service_ports = {p["name"]: p for p in service["spec"]["ports"]}
    for p in service_ports.values():
        assert p["targetPort"] in ports
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] in service_ports and service_ports[endpoint["port"]]["targetPort"] == "http"
    assert endpoint["path"] == "/metrics" and "/metrics" in routes
    assert endpoint["scheme"] == scheme.lower()
    if tls:
        assert endpoint["tlsConfig"]["serverName"] == f"{service['metadata']['name']}.{NAMESPACE}.svc"


def test_existing_secret_and_metrics_token(helm: Path):
    values = {
        "auth": {"existingSecret": "ops-tokens", "existingSecretKey": "admin", "metrics": "token"},
        "serviceMonitor": {"enabled": True},
    }
    objects = render(helm, values)
    assert not [o for o in objects if o["kind"] == "Secret"], "an existing Secret is not made again"
    (container,) = one(objects, "Deployment")["spec"]["template"]["spec"]["containers"]
    ref = {e["name"]: e for e in container["env"]}["FUSEBOX_TOKEN"]["valueFrom"]["secretKeyRef"]
    assert ref == {"name": "ops-tokens", "key": "admin"}
    metrics = {e["name"]: e for e in container["env"]}["FUSEBOX_METRICS_TOKEN"]["valueFrom"]["secretKeyRef"]
    assert metrics == {"name": "ops-tokens", "key": "metrics-token"}
    (endpoint,) = one(objects, "ServiceMonitor")["spec"]["endpoints"]
    # Prometheus shows the scrapers' token, never the admin's.
    assert endpoint["authorization"]["credentials"] == {"name": "ops-tokens", "key": "metrics-token"}
    config = tomllib.loads(one(objects, "ConfigMap")["data"]["fusebox.toml"])
    assert config["auth"]["metrics"] == "token"
    assert {"name": "metrics", "role": "metrics", "env": "FUSEBOX_METRICS_TOKEN"} in config["auth"]["token"]


def test_extra_tokens_and_single_redis(helm: Path):
    sha = "ab" * 32
    values = {
        "auth": {"tokens": [{"name": "checkout", "role": "caller", "prefixes": ["checkout/*"], "sha256": sha}]},
        "store": {"enabled": True, "redisUrl": "redis://redis:6379"},
        "replicaCount": 2,
    }
    objects = render(helm, values)
    config = tomllib.loads(one(objects, "ConfigMap")["data"]["fusebox.toml"])
    assert {"name": "checkout", "role": "caller", "prefixes": ["checkout/*"], "sha256": sha} in config["auth"]["token"]
    (container,) = one(objects, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert arg(container["args"], "--store") == "redis://redis:6379"


def test_the_caps_fit_the_pods_memory_limit(helm: Path):
    """The pod's memory limit is the server's memory_limit, so that it
    lowers its default caps to fit; a value in server wins."""
    for values, want in [
        ({}, "512Mi"),
        ({"resources": {"limits": {"memory": "1Gi"}}}, "1Gi"),
        ({"server": {"memory_limit": "300Mi"}}, "300Mi"),
    ]:
        objects = render(helm, values)
        config = tomllib.loads(one(objects, "ConfigMap")["data"]["fusebox.toml"])
        assert config["server"]["memory_limit"] == want, values


def test_persistence_mounts_the_data_dir(helm: Path):
    objects = render(helm, {"persistence": {"enabled": True, "storageClass": "fast"}})
    for o in objects:
        if o["apiVersion"] != "monitoring.coreos.com/v1":
            kubernetes_validate.validate(o, K8S_VERSION, strict=True)
    claim = one(objects, "PersistentVolumeClaim")
    assert claim["spec"]["storageClassName"] == "fast"
    spec = one(objects, "Deployment")["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    data_dir = arg(container["args"], "--data-dir")
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == data_dir]
    assert not mount.get("readOnly")
    (volume,) = [v for v in spec["volumes"] if v["name"] == mount["name"]]
    assert volume["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
    # The volume is writable by the server's user.
    assert spec["securityContext"]["fsGroup"] == spec["securityContext"]["runAsUser"]
    # A claim of one's own is used, not made.
    objects = render(helm, {"persistence": {"enabled": True, "existingClaim": "mine"}})
    assert not [o for o in objects if o["kind"] == "PersistentVolumeClaim"]
    spec = one(objects, "Deployment")["spec"]["template"]["spec"]
    assert {"name": "data", "persistentVolumeClaim": {"claimName": "mine"}} in spec["volumes"]


@pytest.mark.parametrize(
    "values,says",
    [
        ({"replicaCount": 2}, "replicaCount > 1 needs store.enabled"),
        ({"store": {"enabled": True}}, "store.enabled needs store.redisUrl"),
        ({"tls": {"enabled": True}}, "tls.enabled needs tls.secretName"),
        (
            {"tls": {"enabled": True, "secretName": "t", "clientCa": True, "http": True}},
            "set tls.clientAuth=optional or tls.http=false",
        ),
        (
            {"persistence": {"enabled": True}, "store": {"enabled": True, "redisUrl": "redis://r:6379"}},
            "persistence.enabled is for embedded mode",
        ),
        ({"auth": {"tokens": [{"name": "x", "role": "caller"}]}}, "auth.tokens[].sha256 is required"),
        ({"auth": {"token": "short"}}, "auth.token must be at least 32 characters"),
        (
            {"auth": {"metrics": "token", "metricsToken": "admin-" + "a" * 58}},
            "auth.metricsToken must differ from auth.token",
        ),
        (
            {"store": {"enabled": True, "redisUrl": "redis://fusebox:s3cret@redis:6379"}},
            "store.redisUrl must not hold a user or password",
        ),
    ],
)
def test_refuses_bad_values_naming_the_field(helm: Path, values: dict, says: str):
    assert says in render(helm, values, ok=False)


@pytest.mark.parametrize("tls,auth,persist", [(False, False, True), (True, True, False)])
def test_rendered_config_and_args_start_the_server(helm: Path, tmp_path: Path, tls: bool, auth: bool, persist: bool):
    """The pod's files laid out under a temporary directory: the rendered
    config and arguments start the real server, and /readyz (the probe)
    answers 200 on the probe's scheme."""
    need(BIN, "the fusebox server (cargo build)")
    objects = render(helm, {**case(False, tls, auth), "persistence": {"enabled": persist}})
    (container,) = one(objects, "Deployment")["spec"]["template"]["spec"]["containers"]
    root = tmp_path / "pod"

    def here(path: str) -> str:
        return str(root / path.lstrip("/"))

    config_path = Path(here(arg(container["args"], "--config")))
    config_path.parent.mkdir(parents=True)
    text = one(objects, "ConfigMap")["data"][config_path.name].replace('"/etc/fusebox/', f'"{root}/etc/fusebox/')
    config_path.write_text(text)
    if tls:
        make_certs(Path(here("/etc/fusebox/tls")))
    args = list(container["args"][1:])
    args[args.index("--config") + 1] = str(config_path)
    args[args.index("--listen") + 1] = "127.0.0.1:0"
    args[args.index("--http") + 1] = "127.0.0.1:0"
    if persist:
        args[args.index("--data-dir") + 1] = here(arg(args, "--data-dir"))
    env = {"FUSEBOX_TOKEN": "t" * 64} if auth else {}
    server = start_server(args, env)
    try:
        scheme = container["readinessProbe"]["httpGet"]["scheme"].lower()
        context = None
        if scheme == "https":
            context = ssl.create_default_context(cafile=here("/etc/fusebox/tls/ca.crt"))
        for probe in ("readinessProbe", "livenessProbe"):
            url = f"{scheme}://{server.http}{container[probe]['httpGet']['path']}"
            with urllib.request.urlopen(url, timeout=30, context=context) as r:
                assert r.status == 200
        # The HTTP side answers to the Service's DNS name, and not to another.
        service = one(objects, "Service")["metadata"]["name"]
        for host, status in ((f"{service}.{NAMESPACE}.svc:9090", 200), ("elsewhere.example", 403)):
            request = urllib.request.Request(f"{scheme}://{server.http}/readyz", headers={"Host": host})
            try:
                with urllib.request.urlopen(request, timeout=30, context=context) as r:
                    got = r.status
            except urllib.error.HTTPError as e:
                got = e.code
            assert got == status, f"Host {host}: {got}"
    finally:
        server.stop()
    if persist:
        assert (Path(here(arg(container["args"], "--data-dir"))) / "fusebox.redb").exists()


def test_resources_cite_benchmarks():
    values = (CHART / "values.yaml").read_text()
    benchmarks = (ROOT / "BENCHMARKS.md").read_text()
    for figure in ("19,992 pairs/s", "17.1 MiB", "246.4 B", "+149 MiB"):
        assert figure in values and figure in benchmarks, figure


def test_rendered_store_args_start_the_server_on_redis(helm: Path, tmp_path: Path):
    """Store mode: the rendered arguments and the notices Secret's file
    start the real server on a real redis-server whose module signs with
    the same secret; a call through it is decided in Redis."""
    need(BIN, "the fusebox server (cargo build)")
    need(MODULE, "the Redis module (cargo build -p fusebox-redis)")
    values = {
        "auth": {"enabled": False},
        "store": {"enabled": True, "redisUrl": "redis://redis:6379", "noticesSecret": {"name": "notices"}},
        "replicaCount": 2,
    }
    objects = render(helm, values)
    (container,) = one(objects, "Deployment")["spec"]["template"]["spec"]["containers"]
    root = tmp_path / "pod"

    def here(path: str) -> Path:
        return root / path.lstrip("/")

    config_path = here(arg(container["args"], "--config"))
    config_path.parent.mkdir(parents=True)
    config_path.write_text(one(objects, "ConfigMap")["data"][config_path.name])
    notices = here(arg(container["args"], "--store-secret-file"))
    notices.parent.mkdir(parents=True)
    notices.write_text("n" * 32)
    redis = start_redis(MODULE, tmp_path, ("secret-file", str(notices)))
    args = list(container["args"][1:])
    args[args.index("--config") + 1] = str(config_path)
    args[args.index("--listen") + 1] = "127.0.0.1:0"
    args[args.index("--http") + 1] = "127.0.0.1:0"
    args[args.index("--store-secret-file") + 1] = str(notices)
    assert arg(args, "--store") == "redis://redis:6379"
    args[args.index("--store") + 1] = f"redis://127.0.0.1:{redis.port}"
    try:
        server = start_server(args)
        try:
            assert server.get("/readyz")[0] == 200
            assert "GRANTED" in server.cli("acquire", "k8s/check")
            status, text = server.get("/metrics")
            assert status == 200 and "fusebox_store_commands_total" in text
        finally:
            server.stop()
    finally:
        redis.proc.terminate()
        redis.proc.wait()


def test_the_token_is_required_and_the_same_at_every_render(helm: Path):
    """No lookup and no random token: without one the chart says what to
    set; with one, every `helm template` renders the same Secret."""
    says = render(helm, {}, ok=False, tokens=False)
    assert "auth.token is required" in says
    says = render(helm, {"auth": {"token": ADMIN_TOKEN, "metrics": "token"}}, ok=False, tokens=False)
    assert "auth.metricsToken is required" in says
    first, second = (one(render(helm, {}), "Secret") for _ in range(2))
    assert first == second
    assert first["data"]["token"] == base64.b64encode(ADMIN_TOKEN.encode()).decode()
    template = (CHART / "templates" / "secret.yaml").read_text()
    assert "lookup" not in template.replace("No lookup", "") and "randAlpha" not in template


def test_metrics_token_is_the_scrapers_own(helm: Path):
    objects = render(helm, {"auth": {"metrics": "token"}, "serviceMonitor": {"enabled": True}})
    secret = one(objects, "Secret")
    name = secret["metadata"]["name"]
    assert base64.b64decode(secret["data"]["metrics-token"]).decode() == METRICS_TOKEN
    (endpoint,) = one(objects, "ServiceMonitor")["spec"]["endpoints"]
    assert endpoint["authorization"]["credentials"] == {"name": name, "key": "metrics-token"}
    (container,) = one(objects, "Deployment")["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in container["env"] if "valueFrom" in e}
    assert env["FUSEBOX_METRICS_TOKEN"] == {"name": name, "key": "metrics-token"}
    assert env["FUSEBOX_TOKEN"] == {"name": name, "key": "token"}
    config = tomllib.loads(one(objects, "ConfigMap")["data"]["fusebox.toml"])
    roles = {t["name"]: t["role"] for t in config["auth"]["token"]}
    assert roles == {"admin": "admin", "metrics": "metrics"}
    # With /metrics open, no metrics token is asked for or made.
    objects = render(helm, {})
    assert "metrics-token" not in one(objects, "Secret")["data"]


def rendered_notes(helm: Path, values: dict, tmp_path: Path) -> str:
    """NOTES.txt as `helm install` would print it, rendered without a
    cluster: a copy of the chart whose extra ConfigMap holds the notes."""
    chart = tmp_path / "chart"
    shutil.copytree(CHART, chart)
    shutil.copy(chart / "templates" / "NOTES.txt", chart / "notes.txt")
    (chart / "templates" / "zz-notes.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: notes\n"
        'data:\n  notes: {{ tpl (.Files.Get "notes.txt") . | quote }}\n'
    )
    out = subprocess.run(
        [str(helm), "template", RELEASE, str(chart), "--namespace", NAMESPACE, "--values", "-"],
        input=json.dumps(values),
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    (notes,) = [d for d in yaml.safe_load_all(out.stdout) if d and d["metadata"]["name"] == "notes"]
    return notes["data"]["notes"]


def test_no_secret_in_arguments_or_notes(helm: Path, tmp_path: Path):
    """The tokens reach the pod from the Secret (env); neither they nor
    their base64 appear in the container's arguments, its plain env values
    or NOTES.txt."""
    values = with_tokens({**case(True, True, True), "auth": {"metrics": "token"}})
    notes = rendered_notes(helm, values, tmp_path)
    assert "kubectl get secret" in notes
    objects = render(helm, values)
    (container,) = one(objects, "Deployment")["spec"]["template"]["spec"]["containers"]
    plain = json.dumps(container.get("args", [])) + json.dumps([e for e in container["env"] if "value" in e]) + notes
    for token in (ADMIN_TOKEN, METRICS_TOKEN):
        assert token not in plain
        assert base64.b64encode(token.encode()).decode() not in plain
        assert token not in json.dumps([o for o in objects if o["kind"] != "Secret"])


def test_network_policy_lets_in_the_namespace_to_the_two_ports(helm: Path):
    values = {"networkPolicy": {"from": [{"namespaceSelector": {"matchLabels": {"team": "monitoring"}}}]}}
    objects = render(helm, values)
    policy = one(objects, "NetworkPolicy")
    kubernetes_validate.validate(policy, K8S_VERSION, strict=True)
    spec = policy["spec"]
    pods = one(objects, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert spec["podSelector"]["matchLabels"].items() <= pods.items()
    assert spec["policyTypes"] == ["Ingress"]
    (rule,) = spec["ingress"]
    (container,) = one(objects, "Deployment")["spec"]["template"]["spec"]["containers"]
    named = {p["name"] for p in container["ports"]}
    assert {p["port"] for p in rule["ports"]} == {"grpc", "http"} <= named | {"grpc", "http"}
    assert {"grpc", "http"} <= named
    assert {"podSelector": {}} in rule["from"]
    assert {"namespaceSelector": {"matchLabels": {"team": "monitoring"}}} in rule["from"]
    # Opt out.
    objects = render(helm, {"networkPolicy": {"enabled": False}})
    assert not [o for o in objects if o["kind"] == "NetworkPolicy"]
