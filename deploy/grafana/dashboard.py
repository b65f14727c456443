#!/usr/bin/env python3
"""Writes deploy/grafana/fusebox.json, the Grafana dashboard of fusebox.

Every query names families that fusebox's /metrics exports
(src/http/metrics/reference.md); deploy/tests/test_grafana.py checks each
name against a live scrape. Adding a panel is one call in PANELS:

    panel("Title", "PromQL", unit="reqps", legend="{{label}}"),

and a new row is row("Title"). Run it again and commit
both files:

    python3 deploy/grafana/dashboard.py          # writes fusebox.json
    python3 deploy/grafana/dashboard.py --check  # fails if fusebox.json is stale
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

OUT = Path(__file__).with_name("fusebox.json")

# Every query is narrowed to the chosen job and pod(s): $sel goes inside {...}.
SEL = 'job=~"$job", instance=~"$instance"'
RATE = "[$__rate_interval]"


@dataclass
class Panel:
    title: str
    exprs: list[tuple[str, str]]
    unit: str = "short"
    kind: str = "timeseries"
    description: str = ""


@dataclass
class Row:
    title: str
    panels: list[Panel] = field(default_factory=list)


def panel(
    title: str,
    *queries: str | tuple[str, str],
    unit: str = "short",
    legend: str = "",
    kind: str = "timeseries",
    description: str = "",
) -> Panel:
    """A panel of one or more queries; a query is PromQL, or (PromQL, legend)."""
    exprs = [q if isinstance(q, tuple) else (q, legend) for q in queries]
    return Panel(
        title, [(e.replace("$sel", SEL).replace("$rate", RATE), lg) for e, lg in exprs], unit, kind, description
    )


def row(title: str) -> Row:
    return Row(title)


# With --store, the store's figures (keys, tickets, waiters, phases,
# transitions) are the same on every server: max() them. Each server's own
# (decisions, denials, connections) add up: sum() them.
PANELS: list[Row | Panel] = [
    row("Decisions"),
    panel(
        "Decisions/s by decision",
        "sum by (decision) (rate(fusebox_decisions_total{$sel}$rate))",
        unit="reqps",
        legend="{{decision}}",
    ),
    panel(
        "Denials/s by reason",
        "sum by (reason) (rate(fusebox_denials_total{$sel}$rate))",
        unit="reqps",
        legend="{{reason}}",
    ),
    panel(
        "Shadow grants/s",
        'sum(rate(fusebox_decisions_total{$sel, decision="shadow"}$rate))',
        unit="reqps",
        legend="would have been blocked or denied",
        description="Requests a shadow policy (enforce = false) granted that it would have blocked or denied:"
        " what turning enforcement on would turn away.",
    ),
    panel(
        "Busiest keys: answers/s",
        "topk(10, sum by (key, decision) (rate(fusebox_key_requests_total{$sel}$rate)))",
        unit="reqps",
        legend="{{key}} {{decision}}",
        description="Per-key series: with [auth], only when Prometheus scrapes with a token (auth.metrics = token).",
    ),
    panel(
        "Outcomes/s",
        "sum by (outcome) (rate(fusebox_key_outcomes_total{$sel}$rate))",
        unit="reqps",
        legend="{{outcome}}",
    ),
    row("Breakers"),
    panel("Keys by phase", "max by (phase) (fusebox_keys_by_phase{$sel})", legend="{{phase}}"),
    panel("Phase changes/s", "max(rate(fusebox_transitions_total{$sel}$rate))", unit="ops", legend="transitions"),
    panel(
        "Open keys: break left",
        "max by (key) (fusebox_key_break_remaining_seconds{$sel}) > 0",
        unit="s",
        legend="{{key}}",
    ),
    panel("Failures in a row", "topk(10, max by (key) (fusebox_key_consecutive_failures{$sel}))", legend="{{key}}"),
    panel(
        "Half-open keys: probe slots held",
        ("max by (key) (fusebox_key_probes_held{$sel}) > 0", "{{key}} held"),
        (
            "max by (key) (fusebox_key_probe_slots{$sel})"
            " and on (key) (max by (key) (fusebox_key_probes_held{$sel}) > 0)",
            "{{key}} slots",
        ),
        ("max by (key) (fusebox_key_half_open_successes{$sel}) > 0", "{{key}} successes"),
        description="Probe slots a half-open key holds now, against the slots its policy allows at once"
        " (breaker.half_open.probes), and the probe successes counted toward closing it"
        " (breaker.half_open.successes close it). Per-key series.",
    ),
    panel(
        "Slow calls in flight",
        ("max by (key) (fusebox_key_live_slow{$sel}) > 0", "{{key}} live slow"),
        ("max by (key) (rate(fusebox_key_slow_calls_total{$sel}$rate)) > 0", "{{key}} became slow/s"),
        description="Live slow calls: current tickets older than the key's breaker.slow.duration, which count"
        " toward a trip before they return (S2, S3), and the rate at which calls become slow. Per-key series.",
    ),
    row("Tickets and waiters"),
    panel("Live tickets", ("max(fusebox_tickets{$sel})", "tickets"), ("max(fusebox_max_tickets{$sel})", "cap")),
    panel("Waiters", ("max(fusebox_waiters{$sel})", "waiters"), ("max(fusebox_max_waiters{$sel})", "cap")),
    panel("Queued permits by key", "topk(10, max by (key) (fusebox_key_queued_permits{$sel}))", legend="{{key}}"),
    panel("Free permits by key", "topk(10, max by (key) (fusebox_key_free_permits{$sel}))", legend="{{key}}"),
    panel(
        "Adaptive limits",
        ("max by (key) (fusebox_key_adaptive_limit{$sel})", "{{key}} limit"),
        (
            "max by (key) (fusebox_key_free_permits{$sel}) and on (key) fusebox_key_adaptive_limit{$sel}",
            "{{key}} free",
        ),
        description="The limit each adaptive key has learned from its calls' durations (between its policy's"
        " limiter.min and limiter.max), and its permits free now. Per-key series.",
    ),
    row("Connections and streams"),
    panel(
        "gRPC connections",
        ("sum(fusebox_connections{$sel})", "open"),
        ("sum(fusebox_strangers{$sel})", "no credential yet"),
        ("sum(fusebox_max_connections{$sel})", "cap"),
    ),
    panel(
        "Connections refused/s",
        ("sum(rate(fusebox_connections_refused_total{$sel}$rate))", "max_connections"),
        ("sum(rate(fusebox_strangers_closed_total{$sel}$rate))", "strangers closed"),
        ("sum(rate(fusebox_calls_unauthenticated_total{$sel}$rate))", "unauthenticated calls"),
        unit="ops",
    ),
    panel(
        "Calls in flight and streams",
        ("sum(fusebox_calls_in_flight{$sel})", "calls"),
        ("sum(fusebox_decide_streams{$sel})", "Decide streams"),
        ("sum(fusebox_watch_streams{$sel})", "Watch streams"),
    ),
    panel(
        "HTTP connections",
        ("sum(fusebox_http_connections{$sel})", "open"),
        ("sum(fusebox_max_http_connections{$sel})", "cap"),
    ),
    row("Caps"),
    panel("Cap refusals/s", "sum by (cap) (rate(fusebox_cap_refusals_total{$sel}$rate))", unit="ops", legend="{{cap}}"),
    panel(
        "Share refusals/s",
        "sum by (credential, limit) (rate(fusebox_share_refusals_total{$sel}$rate))",
        unit="ops",
        legend="{{credential}} {{limit}}",
    ),
    panel("Live keys", ("max(fusebox_keys{$sel})", "keys"), ("max(fusebox_max_keys{$sel})", "cap")),
    panel(
        "Unread stream bytes",
        ("sum(fusebox_unread_bytes{$sel})", "unread"),
        ("max(fusebox_max_unread_bytes{$sel})", "cap"),
        unit="bytes",
    ),
    row("Store (--store)"),
    panel(
        "Store commands/s",
        "sum by (instance) (rate(fusebox_store_commands_total{$sel}$rate))",
        unit="ops",
        legend="{{instance}}",
    ),
    panel(
        "Store failures/s",
        ("sum(rate(fusebox_store_unavailable_total{$sel}$rate))", "unavailable"),
        ("sum(rate(fusebox_store_moved_total{$sel}$rate))", "moved"),
        ("sum(rate(fusebox_store_unconfirmed_probes_total{$sel}$rate))", "unconfirmed probes"),
        unit="ops",
    ),
    panel(
        "Store resubscriptions and dropped notices",
        ("sum by (instance) (increase(fusebox_store_subscriptions_total{$sel}$rate))", "subscriptions {{instance}}"),
        ("sum by (channel) (increase(fusebox_store_notices_dropped_total{$sel}$rate))", "dropped {{channel}}"),
    ),
    row("TLS and the data dir"),
    panel(
        "Certificate expires in",
        "min by (instance) (fusebox_tls_certificate_expiry_seconds{$sel}) - time()",
        unit="s",
        legend="{{instance}}",
    ),
    panel(
        "TLS failures/s",
        ("sum(rate(fusebox_tls_handshake_failures_total{$sel}$rate))", "handshakes"),
        ("sum(rate(fusebox_tls_reload_failures_total{$sel}$rate))", "certificate reloads"),
        unit="ops",
    ),
    panel(
        "Data dir writes/s",
        ("sum(rate(fusebox_storage_commits_total{$sel}$rate))", "commits"),
        ("sum(rate(fusebox_storage_write_failures_total{$sel}$rate))", "failures"),
        unit="ops",
    ),
    row("Envoy rate limit and traces"),
    panel(
        "Rate-limit checks/s (ShouldRateLimit)",
        ("sum(rate(fusebox_rls_requests_total{$sel}$rate))", "checks"),
        ("sum(rate(fusebox_rls_over_limit_total{$sel}$rate))", "over limit"),
        ("sum(rate(fusebox_rls_shadow_over_limit_total{$sel}$rate))", "shadow over limit"),
        ("sum(rate(fusebox_rls_unmatched_total{$sel}$rate))", "descriptors unmatched"),
        unit="reqps",
    ),
    panel(
        "Trace spans/s ([telemetry])",
        ("sum(rate(fusebox_trace_spans_exported_total{$sel}$rate))", "sent"),
        ("sum(rate(fusebox_trace_spans_failed_total{$sel}$rate))", "dropped"),
        unit="ops",
        description="Only servers with [telemetry] export these.",
    ),
    row("Process"),
    panel("Resident memory", "process_resident_memory_bytes{$sel}", unit="bytes", legend="{{instance}}"),
    panel(
        "Config reloads",
        ("sum(increase(fusebox_config_reloads_total{$sel}$rate))", "applied"),
        ("sum(increase(fusebox_config_reload_failures_total{$sel}$rate))", "refused"),
        ("min(fusebox_config_last_reload_success{$sel})", "last succeeded"),
    ),
    panel("Rules in force", "max(fusebox_rules{$sel})", legend="rules", kind="stat"),
    panel("Shutting down", "max by (instance) (fusebox_shutting_down{$sel})", legend="{{instance}}", kind="stat"),
]

# Template variables; their queries name metrics too (checked like panels').
VARIABLES = [
    ("job", "label_values(fusebox_keys, job)"),
    ("instance", 'label_values(fusebox_keys{job=~"$job"}, instance)'),
]

DS = {"type": "prometheus", "uid": "${datasource}"}
WIDTH, HEIGHT, PER_ROW = 8, 8, 3


def build() -> dict:
    # Rows of panels, three to a line.
    panels, y, x = [], 0, 0
    for item in PANELS:
        if isinstance(item, Row):
            if x:
                y += HEIGHT
                x = 0
            panels.append(
                {
                    "type": "row",
                    "id": len(panels) + 1,
                    "title": item.title,
                    "collapsed": False,
                    "gridPos": {"h": 1, "w": 24, "x": 0, "y": y},
                    "panels": [],
                }
            )
            y += 1
            continue
        panels.append(render(item, len(panels) + 1, x, y))
        x += WIDTH
        if x >= WIDTH * PER_ROW:
            x = 0
            y += HEIGHT
    return {
        "title": "fusebox",
        "uid": "fusebox",
        "description": "Decisions, breakers, tickets, waiters, connections, caps and the store of fusebox "
        "servers, from their /metrics. Generated by deploy/grafana/dashboard.py.",
        "tags": ["fusebox"],
        "timezone": "browser",
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "refresh": "30s",
        "time": {"from": "now-1h", "to": "now"},
        "templating": {
            "list": [
                {"name": "datasource", "type": "datasource", "query": "prometheus", "label": "Data source"},
                *[
                    {
                        "name": name,
                        "type": "query",
                        "datasource": DS,
                        "query": q,
                        "definition": q,
                        "includeAll": True,
                        "multi": True,
                        "allValue": ".*",
                        "refresh": 2,
                    }
                    for name, q in VARIABLES
                ],
            ]
        },
        "panels": panels,
    }


def render(p: Panel, panel_id: int, x: int, y: int) -> dict:
    out = {
        "type": p.kind,
        "id": panel_id,
        "title": p.title,
        "datasource": DS,
        "gridPos": {"h": HEIGHT, "w": WIDTH, "x": x, "y": y},
        "fieldConfig": {"defaults": {"unit": p.unit}, "overrides": []},
        "targets": [
            {"refId": chr(ord("A") + i), "datasource": DS, "expr": e, "legendFormat": lg}
            for i, (e, lg) in enumerate(p.exprs)
        ],
    }
    if p.description:
        out["description"] = p.description
    return out


def text() -> str:
    return json.dumps(build(), indent=2) + "\n"


def main() -> int:
    if sys.argv[1:] == ["--check"]:
        if OUT.read_text() != text():
            print(f"{OUT} is stale: run python3 {Path(__file__).as_posix()} and commit it", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
