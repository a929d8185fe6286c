"""The Grafana dashboard's lint: every panel's PromQL names only metrics the exporter serves, and it is current."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tetriserve.observability.metrics import registry_of
from tetriserve.observability.metrics_stats import MetricsSnapshot
from tetriserve.observability.request_metrics import RequestMetrics

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "operations" / "grafana" / "tetriserve-dashboard.json"
SUFFIXES = {"counter": ("_total",), "gauge": ("",), "histogram": ("_bucket", "_sum", "_count")}
PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless",
                "offset", "inf", "nan"}  # fmt: skip


def exported_names() -> set[str]:
    """The sample names the exporter's registry serves (every family is described, even with no series)."""
    registry = registry_of(MetricsSnapshot(RequestMetrics().snapshot(), None))
    return {family.name + suffix for family in registry.collect() for suffix in SUFFIXES[family.type]}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: what is left once strings, label matchers, ranges, label
    lists of ``by`` / ``without`` / ``on`` / ``ignoring``, function calls, keywords and numbers are taken out."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    expr = re.sub(r"\{[^}]*\}", " ", expr)
    expr = re.sub(r"\[[^\]]*\]", " ", expr)
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", expr)
    names = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", expr):
        word, rest = m.group(0), expr[m.end() :].lstrip()
        if rest.startswith("(") or word.lower() in PROMQL_WORDS:
            continue  # a function or an aggregation, or a keyword
        if m.start() > 0 and (expr[m.start() - 1].isdigit() or expr[m.start() - 1] == "."):
            continue  # part of a number (1e3)
        names.add(word)
    return names


def _panels() -> list[dict[str, Any]]:
    return [p for p in json.loads(DASHBOARD.read_text())["panels"] if p["type"] != "row"]


def test_metric_names_parser() -> None:
    expr = 'histogram_quantile(0.99, sum by (le) (rate(tetriserve:ttft_bucket{worker=~"p.*"}[$__rate_interval])))'
    assert metric_names(expr) == {"tetriserve:ttft_bucket"}
    assert metric_names("max(a_total) / on (worker) group_left sum without (x) (b) * 1e3") == {"a_total", "b"}


@pytest.mark.parametrize("panel", _panels(), ids=lambda p: p["title"])
def test_every_query_names_exported_metrics(panel: dict[str, Any]) -> None:
    exported = exported_names()
    assert panel["targets"], "a panel without a query"
    for target in panel["targets"]:
        names = metric_names(target["expr"])
        assert names, f"no metric in {target['expr']!r}"
        unknown = names - exported
        assert not unknown, f"{panel['title']}: {sorted(unknown)} not exported (query {target['expr']!r})"


def test_dashboard_covers_the_rows_and_is_current() -> None:
    import importlib.util

    data = json.loads(DASHBOARD.read_text())
    rows = {p["title"].split(" (")[0] for p in data["panels"] if p["type"] == "row"}
    assert {"Latency", "Throughput", "Queues", "KV cache", "KV transfer", "Roles", "Failures"} <= rows
    ids = [p["id"] for p in data["panels"]]
    assert len(ids) == len(set(ids))
    spec = importlib.util.spec_from_file_location("build_dashboard", DASHBOARD.with_name("build_dashboard.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.dashboard() == data, "the JSON is stale: run python operations/grafana/build_dashboard.py"
