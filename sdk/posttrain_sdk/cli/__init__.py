"""`posttrain`: the platform from the terminal. Tables for people, `--json` for scripts.

Exit codes: 0 done; 1 the server refused (the error names the field) or the followed run did not
succeed; 2 bad usage or a bad local file; 3 not logged in, or the token was refused; 4 the server
cannot be reached.

The project: `--project` (or POSTTRAIN_PROJECT), else the server's default (`posttrain projects use`).
With one, lists show that project only and creates go into it; without, lists show every project you
read, with a project column.
"""

from __future__ import annotations

# The command modules register their commands on `main` when imported.
from posttrain_sdk.cli import (  # noqa: F401
    auth,
    datasets,
    experiments,
    models,
    projects,
    queue,
    review,
    rewards,
    runs,
    track,
)
from posttrain_sdk.cli.root import main

__all__ = ["main"]
