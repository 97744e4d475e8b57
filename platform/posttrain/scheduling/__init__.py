"""Scheduling: which waiting run starts, where, and which running run makes room (docs/SCHEDULER.md).

`rules.py` (order, quotas, admission, preemption victims), `backfill.py` (placement on nodes over time),
`durations.py` (how long a run will hold), `fair_share.py` and `cluster_sim.py` are plain functions;
`services/` admits, preempts and records; `selectors.py`, `metrics.py` and `prometheus.py` read the queue.
"""
