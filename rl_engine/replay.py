"""Replay: rebuild one step's update from its rollout file and the checkpoint before it, without
generating, and report its loss, KL and gradient norm beside what the run logged.

    python -m rl_engine replay RUN_DIR --step N        (or: posttrain runs replay RUN_DIR --step N)

The step's file holds what the update read (`rl_engine.rollout_store`): prompt and response token ids,
the action mask, the old (trainer) and reference log-probs, per-token advantages, the rollout
correction's weights, values and returns. The trainer starts from `checkpoints/step_<N-1>` (weights,
optimizer, scheduler, the mini-batch shuffle's generator; step 1 from the config's model), so the same
update runs on the same numbers: the result equals the logged one to float precision. Replay runs in one
process (placement and async settings are set aside: data-parallel ranks train exactly what one
process would). A step needs its per-token columns (`logging.token_view_every`) and that checkpoint.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from posttrain_sdk import rollout_files
from posttrain_sdk.event_log import EVENTS_FILE, read_events

# What replay compares: the update's own metrics (`kl/mean` is the KL term of the loss, or, with the KL in
# the reward, the estimate the advantages stage logged from the same log-probs).
COMPARED = ("policy/loss", "kl/mean", "policy/grad_norm")


class ReplayError(Exception):
    """Why a step cannot be replayed (a missing file, checkpoint or column), for a person."""


@dataclass
class Replayed:
    step: int
    replayed: dict[str, float]
    logged: dict[str, float]

    def relative_differences(self) -> dict[str, float]:
        out = {}
        for name, value in self.replayed.items():
            logged = self.logged.get(name)
            if logged is None or not isinstance(logged, (int, float)):
                continue
            out[name] = abs(value - logged) / max(abs(logged), 1e-12)
        return out


def _one_process(cfg: Any) -> Any:
    """The run's config with every role in this process (what the update computes does not change)."""
    from rl_engine.config import validate_config

    data = cfg.model_dump(mode="json")
    data["placement"] = {**data.get("placement", {}), "mode": "colocate", "rollout_engines": 1, "trainer_ranks": 1}
    data["backends"] = {**data.get("backends", {}), "async_rollout": False, "partial_rollout": False}
    data["backends"]["rollout"] = "transformers"
    data["logging"] = {**data.get("logging", {}), "samples": "none"}
    return validate_config(data)


def _padded(rows: list[list[float]], width: int) -> torch.Tensor:
    out = torch.zeros((len(rows), width), dtype=torch.float32)
    for i, values in enumerate(rows):
        out[i, : len(values)] = torch.tensor(values, dtype=torch.float32)
    return out


def _column(kept: list[dict[str, Any]], name: str, width: int) -> torch.Tensor | None:
    values = [row[name] for row in kept]
    if any(v is None for v in values):
        return None
    return _padded(values, width)


def replay_step(run_dir: str | Path, step: int) -> Replayed:
    from rl_engine.algorithms import CorrectionResult, kl_estimate, masked_mean
    from rl_engine.checkpoint import load_engine_state, restore_rng
    from rl_engine.config import load_config
    from rl_engine.loop import TrainingBatch, build_engine, experience_for
    from rl_engine.trainer import TokenBatch

    run_dir = Path(run_dir)
    config_path = run_dir / "config.yaml"
    if not config_path.is_file():
        raise ReplayError(f"{run_dir} is not a run folder: it has no config.yaml")
    cfg = load_config(config_path)
    kept, before, pad = _step_inputs(cfg, run_dir, step)

    engine = build_engine(_one_process(cfg), weights_from=before)
    try:
        if before is not None:
            state = load_engine_state(before)
            engine.trainer.load_state_dict(state.trainer)
            restore_rng(state.rng)
        masks = [tuple(row["action_mask"]) if row["action_mask"] is not None else None for row in kept]
        tokens = TokenBatch.build(
            [row["prompt_token_ids"] for row in kept], [row["token_ids"] for row in kept], int(pad), masks
        )
        width = tokens.response_mask.shape[1]
        rows = torch.tensor([row["index"] for row in kept])
        scores = torch.tensor([row["reward"] or 0.0 for row in kept], dtype=torch.float32)
        batch = TrainingBatch(rows, tokens, scores, _column(kept, "rollout_logprob", width))
        batch.old_logprobs = _column(kept, "trainer_logprob", width)
        batch.ref_logprobs = _column(kept, "ref_logprob", width)
        batch.values = _column(kept, "value", width)
        advantages = _column(kept, "token_advantage", width)
        returns = _column(kept, "return", width)
        correction = CorrectionResult(_column(kept, "is_weight", width), {})
        metrics = engine.trainer.update(experience_for(engine.cfg, batch, advantages, returns, correction))
    finally:
        engine.close()
    kl = cfg.algorithm.kl
    if kl.coef > 0 and kl.placement == "reward" and batch.old_logprobs is not None and batch.ref_logprobs is not None:
        estimate = kl_estimate(batch.old_logprobs, batch.ref_logprobs, kl.estimator, batch.mask)
        metrics["kl/mean"] = float(masked_mean(estimate, batch.mask))
    replayed = {name: float(metrics[name]) for name in COMPARED if name in metrics}
    logged = _logged_metrics(run_dir, step)
    return Replayed(step, replayed, {name: logged[name] for name in COMPARED if name in logged})


def _step_inputs(cfg: Any, run_dir: Path, step: int) -> tuple[list[dict[str, Any]], Path | None, bytes]:
    """What the step's replay reads, checked before any model is built: the rows its update trained on, the
    checkpoint before it (None for step 1) and the rollout file's padding token id."""
    from rl_engine.spec.checkpoints import checkpoint_dir

    folder = cfg.logging.rollouts_dir or str(run_dir / rollout_files.FOLDER)
    name = rollout_files.file_name(step)
    try:
        table = rollout_files.read_table(f"{folder.rstrip('/')}/{name}")
    except FileNotFoundError:
        raise ReplayError(f"step {step} has no rollout file ({name} is not in {folder})") from None
    kept = [row for row in table.to_pylist() if row["kept"]]
    if not kept:
        raise ReplayError(f"step {step} trained on nothing (dynamic sampling kept no group): nothing to replay")
    if any(row["token_ids"] is None or row["token_advantage"] is None for row in kept):
        raise ReplayError(
            f"step {step}'s rollout file has no per-token columns (logging.token_view_every skipped it): "
            "replay needs the token ids and advantages"
        )
    before = checkpoint_dir(run_dir, step - 1) if step > 1 else None
    if before is not None and not before.is_dir():
        raise ReplayError(
            f"replaying step {step} needs the checkpoint of step {step - 1} ({before} is missing; "
            "checkpoint.every_steps and keep_last decide which are kept)"
        )
    pad = table.schema.metadata.get(b"posttrain.pad_token_id") if table.schema.metadata else None
    if pad is None:
        raise ReplayError(f"{name} does not say the padding token (written by an older engine)")
    return kept, before, pad


def _logged_metrics(run_dir: Path, step: int) -> dict[str, Any]:
    """The metrics the run logged for `step` (the last such event), or {} when it logged none."""
    logged_events = [e for e in read_events(run_dir / EVENTS_FILE) if e["type"] == "metrics" and e.get("step") == step]
    return logged_events[-1]["data"] if logged_events else {}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rl_engine replay", description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir")
    parser.add_argument("--step", type=int, required=True)
    args = parser.parse_args(argv)
    try:
        result = replay_step(args.run_dir, args.step)
    except ReplayError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    differences = result.relative_differences()
    print(f"step {result.step}: the update replayed from its rollout file")
    print(f"{'metric':<20} {'replayed':>16} {'logged':>16} {'relative diff':>14}")
    for name, value in result.replayed.items():
        logged = result.logged.get(name)
        shown = f"{logged:>16.9g}" if isinstance(logged, (int, float)) else f"{'—':>16}"
        diff = differences.get(name)
        print(f"{name:<20} {value:>16.9g} {shown} {(f'{diff:.2e}' if diff is not None else '—'):>14}")
    if any(not math.isfinite(v) for v in result.replayed.values()):
        return 1
    return 0
