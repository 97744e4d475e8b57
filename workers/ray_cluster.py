"""The Ray cluster's resources as the scheduler sees them: each node's total and free CPUs and GPUs.

Read from the dashboard's REST API (`GET <RAY_ADDRESS>/api/cluster_status?format=0`, the report behind
`ray status`): plain HTTP on the address the Jobs API already uses, so the worker never becomes a Ray
driver (no `ray.init` in a Celery process, nothing to reconnect when the head restarts) and the web
process needs nothing of it. One HTTP session per address is kept for the worker's life; each request carries
the cluster's token (posttrain.core.ray_auth), read at the time.

Ray refreshes this report every few seconds, so a job admitted a moment ago may not show in it yet;
admission therefore also subtracts what the platform itself granted (posttrain.scheduling.services),
and Ray's own enforcement (entrypoint resources, placement groups) stays the last word.
"""

from __future__ import annotations

from functools import lru_cache

import requests
from django.conf import settings

from posttrain.core.errors import JobsUnavailable
from posttrain.core.ray_auth import ray_auth_headers, refused_reason
from posttrain.scheduling.rules import RESOURCE_KEYS, ClusterNode, ClusterView

TIMEOUT_S = 5.0


@lru_cache(maxsize=4)
def _session(address: str) -> requests.Session:
    return requests.Session()


def cluster_view(address: str | None = None) -> ClusterView:
    """Every alive node with its total and free CPUs/GPUs; JobsUnavailable when Ray does not answer."""
    address = (address or settings.RAY_ADDRESS).rstrip("/")
    try:
        response = _session(address).get(
            f"{address}/api/cluster_status", params={"format": "0"}, headers=ray_auth_headers(), timeout=TIMEOUT_S
        )
        refused = refused_reason(response.status_code)
        if refused:
            raise JobsUnavailable(f"cannot read the Ray cluster's resources: {refused}")
        response.raise_for_status()
        report = response.json()["data"]["clusterStatus"]["loadMetricsReport"]
    except (OSError, ValueError, KeyError, TypeError) as exc:  # requests' errors are OSErrors
        raise JobsUnavailable(f"cannot read the Ray cluster's resources at {address}: {exc}") from exc
    return parse_load_report(report)


def parse_load_report(report: dict) -> ClusterView:
    """`usageByNode`: node id -> resource -> [used, total]; a node's address is its `node:<ip>` resource."""
    nodes = []
    for node_id, usage in sorted((report.get("usageByNode") or {}).items()):
        total = {key: float(usage.get(key, [0.0, 0.0])[1]) for key in RESOURCE_KEYS}
        free = {key: float(usage.get(key, [0.0, 0.0])[1] - usage.get(key, [0.0, 0.0])[0]) for key in RESOURCE_KEYS}
        ips = [name.removeprefix("node:") for name in usage if name.startswith("node:") and name[5:7] != "__"]
        address = next((ip for ip in ips if ip != "InternalHead"), "")
        nodes.append(
            ClusterNode(node_id=node_id, address=address, total=total, free=free, head="node:InternalHead" in usage)
        )
    return ClusterView(nodes)
