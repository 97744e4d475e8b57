"""Telemetry: what a run reports, from the engine's events to the browser (docs/ARCHITECTURE.md, "The event path").

`ingestion.py` stores a validated batch (`event_schema.py`) exactly once; `series/` keeps the metric series
(rows, blocks, overviews); `rollouts/` and `rollout_index.py` read the rollout files in place; `live_channel.py`
and `browser_stream.py` carry each stored event to open pages; `tokens.py` are the engine's ingest tokens;
`selectors.py` the reads the run pages make.
"""
