"""What a run needs of the cluster (its placement's pieces, node by node) and the threads its driver gets:
admission plans with these, the worker submits the Ray job with them."""

from rl_engine.distributed.placement import resource_needs, threads_for

__all__ = ["resource_needs", "threads_for"]
