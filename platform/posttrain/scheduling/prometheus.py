"""The scheduler's metrics in Prometheus's text format (`GET /api/queue/metrics`), written by the
prometheus_client library from posttrain.scheduling.metrics: gauges for the window's figures (waits and
time to first step as quantiles, utilisation, shares) and counters for what only grows (preemptions and
their lost steps)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from posttrain.scheduling.rules import RESOURCE_KEYS

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class _QueueCollector:
    def __init__(self, figures: dict[str, Any]):
        self.figures = figures

    def collect(self) -> Iterator[Metric]:
        f = self.figures
        window = f"{f['window_s']:g}"
        yield self._queue_waits(window)
        yield self._admission_to_first_step(window)
        waiting = GaugeMetricFamily("posttrain_queue_waiting_runs", "Runs waiting in the queue now")
        waiting.add_metric([], f["waiting"])
        yield waiting
        yield self._utilisation(window)
        preemptions = CounterMetricFamily(
            "posttrain_preemptions", "Preemptions asked, and those stopped at the deadline", labels=["forced"]
        )
        preemptions.add_metric(["false"], f["totals"]["preemptions"] - f["totals"]["forced_preemptions"])
        preemptions.add_metric(["true"], f["totals"]["forced_preemptions"])
        yield preemptions
        lost = CounterMetricFamily("posttrain_preemption_lost_steps", "Training steps lost to preemption deadlines")
        lost.add_metric([], f["totals"]["lost_steps"])
        yield lost
        yield self._fair_shares()

    def _queue_waits(self, window: str) -> GaugeMetricFamily:
        waits = GaugeMetricFamily(
            "posttrain_queue_wait_seconds",
            "Time from entering the queue to admission, over the window, by priority",
            labels=["priority", "quantile", "window_s"],
        )
        for priority, q in self.figures["queue_wait"].items():
            for name, quantile in (("p50_s", "0.5"), ("p95_s", "0.95")):
                if q[name] is not None:
                    waits.add_metric([priority, quantile, window], q[name])
        return waits

    def _admission_to_first_step(self, window: str) -> GaugeMetricFamily:
        f = self.figures
        first = GaugeMetricFamily(
            "posttrain_admission_to_first_step_seconds",
            "Time from a run's admission to its first training step, over the window",
            labels=["quantile", "window_s"],
        )
        for name, quantile in (("p50_s", "0.5"), ("p95_s", "0.95")):
            if f["admission_to_first_step"][name] is not None:
                first.add_metric([quantile, window], f["admission_to_first_step"][name])
        return first

    def _utilisation(self, window: str) -> GaugeMetricFamily:
        use = GaugeMetricFamily(
            "posttrain_cluster_utilisation_ratio",
            "Share of the cluster's capacity granted by the platform or used as Ray reported, over the window",
            labels=["resource", "kind", "window_s"],
        )
        for key in RESOURCE_KEYS:
            for kind in ("granted", "used"):
                value = self.figures["utilisation"][f"{kind}_{key}"]
                if value is not None:
                    use.add_metric([key, kind, window], value)
        return use

    def _fair_shares(self) -> GaugeMetricFamily:
        f = self.figures
        share = GaugeMetricFamily(
            "posttrain_fair_share_ratio",
            "Each user's, team's and project's share of the decayed usage, and its share of the weights",
            labels=["kind", "name", "of"],
        )
        kinds = (("user", "users"), ("team", "teams"), ("project", "projects"))
        for kind, rows in ((kind, f["shares"][key]) for kind, key in kinds):
            for row in rows:
                share.add_metric([kind, row["name"], "usage"], row["share"])
                share.add_metric([kind, row["name"], "weight"], row["weight_share"])
        return share


def exposition(figures: dict[str, Any]) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_QueueCollector(figures))
    return generate_latest(registry)
