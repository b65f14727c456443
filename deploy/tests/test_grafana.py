"""The Grafana dashboard (deploy/grafana/fusebox.json) names only metrics
that a live /metrics has: a real fusebox server, embedded and on a real
redis-server with the module (--store), is given a little traffic with the
CLI and scraped; every metric name of every panel query and template
variable must be a series name of one of the scrapes, exactly (a
histogram's _bucket/_sum/_count, a counter's _total)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator

import pytest
from conftest import BIN, MODULE, ROOT, Server, make_certs, need, start_redis, start_server
from prometheus_client.parser import text_string_to_metric_families

DASHBOARD = ROOT / "deploy" / "grafana" / "fusebox.json"
GENERATOR = ROOT / "deploy" / "grafana" / "dashboard.py"

# [telemetry] toward a port where nothing listens (its spans are dropped
# and counted), so that its families are in the scrape too.
CONFIG = """
[telemetry]
otlp_endpoint = "http://127.0.0.1:9"

[[rls.domain]]
name = "edge"
[[rls.domain.descriptor]]
key = "user"
rate_limit = { unit = "minute", requests_per_unit = 100, algorithm = "sliding_window" }

[[rule]]
match = "shop/*"
breaker = { mode = "consecutive", failures = 2, break = "1m" }
limiter = { kind = "concurrency", permits = 4, queue_limit = 8 }

[[rule]]
match = "adaptive/*"
limiter = { kind = "adaptive", min = 1, max = 20, initial = 4 }
"""

# PromQL words that are not metric names.
KEYWORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "bool",
    "and", "or", "unless", "offset", "inf", "nan",
}  # fmt: skip
# Aggregations may put their grouping before their "(": `sum by (x) (...)`.
AGGREGATIONS = {
    "sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values",
    "bottomk", "topk", "quantile", "limitk", "limit_ratio",
}  # fmt: skip
GROUPING = {"by", "without", "on", "ignoring", "group_left", "group_right"}
TOKEN = re.compile(
    r"""(?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)
      |(?P<braces>\{[^}]*\})
      |(?P<range>\[[^\]]*\])
      |(?P<ident>[A-Za-z_:][A-Za-z0-9_:]*)
      |(?P<number>[0-9][0-9.eE+-]*)
      |(?P<punct>[(),])
      |(?P<op>[-+*/%^=!<>~]+)
      |(?P<var>\$[A-Za-z0-9_]+)
      |(?P<space>\s+)""",
    re.VERBOSE,
)


def tokens(expr: str) -> list[tuple[str, str]]:
    out = []
    pos = 0
    while pos < len(expr):
        m = TOKEN.match(expr, pos)
        if m is None:
            raise ValueError(f"cannot read PromQL at {expr[pos:]!r} in {expr!r}")
        pos = m.end()
        if m.lastgroup != "space":
            out.append((m.lastgroup, m.group()))
    return out


def metric_names(expr: str) -> set[str]:
    """The metric names `expr` selects: identifiers that are not functions
    (followed by "("), keywords, or label names in a grouping's (...)."""
    toks = tokens(expr)
    names = set()
    i = 0
    while i < len(toks):
        kind, text = toks[i]
        nxt = toks[i + 1] if i + 1 < len(toks) else ("", "")
        if kind == "ident" and text in GROUPING and nxt == ("punct", "("):
            while toks[i] != ("punct", ")"):  # skip the label list
                i += 1
        elif kind == "ident" and text == "label_values" and nxt == ("punct", "("):
            # label_values(metric{...}, label) names a metric; label_values(label) none.
            close = toks.index(("punct", ")"), i)
            args = toks[i + 2 : close]
            if ("punct", ",") in args and args[0][0] == "ident":
                names.add(args[0][1])
            i = close
        elif kind == "ident" and nxt != ("punct", "(") and text.lower() not in KEYWORDS | AGGREGATIONS:
            names.add(text)
        i += 1
    return names


def test_tokenizer_reads_names_exactly():
    assert metric_names('sum by (decision) (rate(fusebox_decisions_total{job=~"a|b"}[$__rate_interval]))') == {
        "fusebox_decisions_total"
    }
    assert metric_names("histogram_quantile(0.99, sum by (le) (rate(x_seconds_bucket[5m])))") == {"x_seconds_bucket"}
    assert metric_names("a_total / on (key) group_left (phase) b > 0") == {"a_total", "b"}
    assert metric_names('label_values(fusebox_keys{job=~"$job"}, instance)') == {"fusebox_keys"}
    assert metric_names("label_values(job)") == set()
    assert metric_names("max(x) or vector(0)") == {"x"}


def queries() -> list[tuple[str, str]]:
    """(where, PromQL) of every panel target and template variable."""
    board = json.loads(DASHBOARD.read_text())
    found = []
    for panel in board["panels"]:
        for target in panel.get("targets", []):
            found.append((f"panel {panel['title']!r} {target['refId']}", target["expr"]))
    for var in board["templating"]["list"]:
        if var["type"] == "query":
            query = var["query"]
            found.append((f"variable ${var['name']}", query["query"] if isinstance(query, dict) else query))
    return found


def test_dashboard_is_generated_from_its_script():
    out = subprocess.run([sys.executable, str(GENERATOR), "--check"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


def test_every_query_names_at_least_one_metric():
    for where, expr in queries():
        assert metric_names(expr), f"{where}: {expr!r} names no metric"


def series_names(text: str) -> set[str]:
    """Every series name a scrape has; a family without samples (a labelled
    family with no label values yet) by the names its type gives it."""
    names = set()
    for family in text_string_to_metric_families(text):
        if family.samples:
            names.update(s.name for s in family.samples)
        elif family.type == "counter":
            names.add(family.name + "_total")
        elif family.type == "histogram":
            names.update(family.name + suffix for suffix in ("_bucket", "_sum", "_count"))
        elif family.type == "summary":
            names.update({family.name, family.name + "_sum", family.name + "_count"})
        else:
            names.add(family.name)
    return names


def traffic(server: Server) -> None:
    """Grants, completions, a trip and a denial, so per-key and labelled families have samples."""
    for outcome in ("success", "failure", "failure"):
        ticket = json.loads(server.cli("acquire", "shop/cart", "--json"))["ticket"]
        server.cli("complete", ticket, outcome)
    blocked = json.loads(server.cli("acquire", "shop/cart", "--json"))
    assert blocked["decision"] == "BLOCKED", blocked
    server.cli("acquire", "other/key")
    server.cli("acquire", "adaptive/key")


def scrape(server: Server) -> set[str]:
    status, text = server.get("/metrics")
    assert status == 200, text
    return series_names(text)


@pytest.fixture(scope="module")
def scrapes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, set[str]]]:
    need(BIN, "the fusebox server (cargo build)")
    need(MODULE, "the Redis module (cargo build -p fusebox-redis)")
    work = tmp_path_factory.mktemp("grafana")
    config = work / "fusebox.toml"
    config.write_text(CONFIG)
    found: dict[str, set[str]] = {}
    # Embedded with TLS on the gRPC port and a data dir, for their families.
    ca, cert, key = make_certs(work / "tls")
    embedded = start_server(
        [
            "--config", str(config), "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0",
            "--tls-cert", str(cert), "--tls-key", str(key), "--data-dir", str(work / "data"),
        ]
    )  # fmt: skip
    embedded.cli_args = ["--tls-ca", str(ca)]
    embedded.https_ca = ca  # --tls-cert serves the HTTP port over TLS too
    try:
        traffic(embedded)
        found["embedded"] = scrape(embedded)
    finally:
        embedded.stop()
    redis = start_redis(MODULE, work)
    try:
        store = start_server(
            [
                "--config", str(config), "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0",
                "--store", f"redis://127.0.0.1:{redis.port}",
            ]
        )  # fmt: skip
        try:
            traffic(store)
            found["store"] = scrape(store)
        finally:
            store.stop()
    finally:
        redis.proc.terminate()
        redis.proc.wait()
    yield found


def test_every_query_names_live_metrics(scrapes: dict[str, set[str]]):
    live = set().union(*scrapes.values())
    # The scrapes are real: each mode has its own families.
    assert "fusebox_keys_forgotten_total" in scrapes["embedded"]
    assert "fusebox_store_commands_total" in scrapes["store"]
    assert "fusebox_tls_certificate_expiry_seconds" in scrapes["embedded"]
    assert "fusebox_storage_commits_total" in scrapes["embedded"]
    assert "fusebox_key_requests_total" in live
    missing = [
        f"{where}: {name} (in {expr!r})"
        for where, expr in queries()
        for name in sorted(metric_names(expr))
        if name not in live
    ]
    assert not missing, "dashboard queries name metrics that /metrics does not have:\n" + "\n".join(missing)


def test_dashboard_covers_the_asked_for_figures():
    named = set().union(*(metric_names(e) for _, e in queries()))
    for family in (
        "fusebox_decisions_total",
        "fusebox_denials_total",
        "fusebox_keys_by_phase",
        "fusebox_key_probes_held",
        "fusebox_key_live_slow",
        "fusebox_key_adaptive_limit",
        "fusebox_tickets",
        "fusebox_waiters",
        "fusebox_connections",
        "fusebox_cap_refusals_total",
        "fusebox_store_unavailable_total",
        "fusebox_rls_requests_total",
        "fusebox_trace_spans_failed_total",
    ):
        assert family in named, f"no panel shows {family}"
