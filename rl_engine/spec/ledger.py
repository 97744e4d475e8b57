"""The prompt ledger's file in a run folder (`ledger.parquet`, written by the engine after every step) and
the reader of its summary, for the platform's run page, API and CLI."""

from rl_engine.ledger import LEDGER_FILE, read_metadata

__all__ = ["LEDGER_FILE", "read_metadata"]
