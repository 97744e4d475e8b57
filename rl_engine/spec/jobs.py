"""A run's Ray job as the scheduler sees it: the preemption request file, the exit codes of a preemption
and of a time limit, and the marker on the log lines that are the user's own output."""

from rl_engine.preemption import EXIT_PREEMPTED, EXIT_TIME_LIMIT, clear_request, request_preemption
from rl_engine.user_output import is_user_output

__all__ = ["EXIT_PREEMPTED", "EXIT_TIME_LIMIT", "clear_request", "is_user_output", "request_preemption"]
