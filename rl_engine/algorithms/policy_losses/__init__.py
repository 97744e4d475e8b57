"""The policy losses, one file each, chosen by `algorithm.policy_loss`.

A file registers one function of `(LossInputs, ClipRange)` that returns the per-token `LossTerms`, under
the name its `PolicyLossSpec` has in the catalogue (`rl_engine/algorithms/catalogue.py`: level, default
clip range and aggregation, help, paper); `rl_engine.algorithms.losses.policy_loss` does the rest
(padding, correction weights, aggregation, statistics). To add a loss: its spec in the catalogue, a copy
of `gspo.py` as `<name>.py` with its function, and its test; the schema, the launch form and the trainer
pick it up.

Importing this package registers every loss in it.
"""

from importlib import import_module
from pkgutil import iter_modules

for _module in iter_modules(__path__):
    if not _module.name.startswith("_"):
        import_module(f"{__name__}.{_module.name}")
