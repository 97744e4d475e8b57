"""The engine's contract with the platform: everything the web process, its Celery workers and the SDK-side
tools may use of the engine, and nothing else (tests/unit/test_import_layers.py holds the platform and the
workers to it). Each module is importable, and usable, without torch, transformers, ray, vllm or
deepspeed (tests/unit/engine/test_spec_contract.py imports and calls it with those made unimportable), so
the web process never loads a deep-learning library to validate a config or start a run.

- `config`: the run config's schema, its rules and JSON schema, YAML in and out, `--set` overrides, the
  demo's config.
- `catalogues`: the metric catalogue (names, units, what each panel draws) and the response statistics
  both sides compute.
- `resources`: what a run needs of the cluster (placement), and the threads its driver gets.
- `checkpoints`: the checkpoint folder layout.
- `ledger`: the prompt ledger's file in a run folder and the reader of its summary.
- `jobs`: preemption's request file and exit codes, the user-output marker on a job's log lines.
- `user_code`: containment (the sandbox and the outbound policy) and what runs inside it for the platform:
  reward components, dataset rows, reward probes, installed environments.

The engine's own modules keep their code; this package names the part of it that is a promise.
"""
