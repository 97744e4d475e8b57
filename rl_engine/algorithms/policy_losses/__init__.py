"""The policy losses, one file each, chosen by `algorithm.policy_loss`.

A file declares `SPEC = PolicyLossSpec(...)` (literal values: the catalogue reads them from the source,
so the config schema never imports torch) and registers one function of `(LossInputs, ClipRange)` that
returns the per-token `LossTerms`; `rl_engine.algorithms.losses.policy_loss` does the rest (padding,
correction weights, aggregation, statistics). To add a loss: copy `gspo.py` to `<name>.py`, change its
SPEC and its function, and add its test; the schema, the launch form and the trainer pick it up.

Importing this package registers every loss in it.
"""

from importlib import import_module
from pkgutil import iter_modules

for _module in iter_modules(__path__):
    if not _module.name.startswith("_"):
        import_module(f"{__name__}.{_module.name}")
