"""A run's life: start (the sandbox gate, the engine, the rollout writer), resume, the steps with their eval
cadence and checkpoints, preemption at a step boundary, the time limit, and the final status."""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path

from posttrain_sdk.event_log import EventLog, Heartbeat
from posttrain_sdk.event_sender import sender_from_env
from rl_engine.checkpoint import EngineState, capture_rng, load_engine_state, restore_rng
from rl_engine.components import (
    configure_threads,
)
from rl_engine.config import RunConfig, dump_config
from rl_engine.devices import with_host_dtype
from rl_engine.ledger import LEDGER_FILE, LedgerFile, PromptLedger, Resume, read_parquet, redone_since
from rl_engine.loop.engine import Engine, build_engine
from rl_engine.loop.evaluation import evaluate
from rl_engine.loop.prefetch import resume_pending, saved_pending
from rl_engine.loop.stages import run_step
from rl_engine.preemption import Preempted, TimeLimitReached, clear_request, preemption_requested, time_limit_reason
from rl_engine.rollout_store import RolloutWriter, StepRollouts
from rl_engine.sandbox import require_sandbox


def train(
    cfg: RunConfig, run_dir: Path, *, resume: Path | None = None, run_id: str | None = None, progress: bool = False
) -> dict[str, float]:
    """Runs (or resumes) a whole run into `run_dir`; returns the last metrics (eval ones included)."""
    process_started = time.perf_counter()
    configure_threads()
    cfg = with_host_dtype(cfg)  # the run folder's config.yaml records the dtype `auto` became
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(dump_config(cfg))
    sink = EventLog(run_dir, run_id or os.environ.get("POSTTRAIN_RUN_ID") or run_dir.name)
    sender = sender_from_env(sink)  # the platform's run: POSTTRAIN_EVENTS_URL set, events POSTed in batches
    engine: Engine | None = None
    writer: RolloutWriter | None = None
    try:
        with Heartbeat(sink, cfg.logging.heartbeat_s) as heartbeat:
            sink.emit("status", {"state": "running", "resumed_from": str(resume) if resume else None})
            require_sandbox(cfg, sink)
            engine = build_engine(cfg, weights_from=resume)
            writer = rollout_writer(engine, run_dir, sink)
            try:
                return _run(engine, run_dir, sink, heartbeat, resume, progress, writer, process_started)
            finally:
                if writer is not None:
                    writer.close()  # every step's file written and announced before the final status
    except Preempted:
        raise  # its `preempted` status event is out: not a failure
    except BaseException as exc:
        sink.emit("status", {"state": "failed", "reason": failure_reason(exc, run_dir)[:2000]})
        raise
    finally:
        try:
            if engine is not None:
                engine.close()
        finally:
            sink.close()
            if sender is not None:
                sender.finish()  # bounded wait until the platform acknowledged every event


def failure_reason(exc: BaseException, run_dir: Path) -> str:
    """The failed status's reason: the exception, with a full disk named first (whichever write hit it: the
    event log, a checkpoint, the ledger, a rollout file; some libraries give no errno, only the text)."""
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted"
    text = f"{type(exc).__name__}: {exc}"
    if getattr(exc, "errno", None) == errno.ENOSPC or "No space left on device" in str(exc):
        return f"no space left on device: the disk of the run folder {run_dir} is full ({text})"
    return text


def rollout_writer(engine: Engine, run_dir: Path, sink: EventLog) -> RolloutWriter | None:
    """The writer of the run's rollout files (`logging.rollouts_dir`, default `<run dir>/rollouts`), or
    None when the run records no rollouts (`logging.samples: none`)."""
    logging_cfg = engine.cfg.logging
    if logging_cfg.samples != "all":
        return None
    return RolloutWriter(
        sink,
        logging_cfg.rollouts_dir or str(run_dir / "rollouts"),
        logging_cfg.rollouts_keep,
        tokenizer=engine.tokenizer,
        metadata={"run": sink.run_id, "pad_token_id": str(engine.rollout.pad_id)},
    )


def _run(
    engine: Engine,
    run_dir: Path,
    sink: EventLog,
    heartbeat: Heartbeat,
    resume: Path | None,
    progress: bool,
    writer: RolloutWriter | None = None,
    process_started: float = 0.0,
) -> dict[str, float]:
    cfg = engine.cfg
    counters = {"progress/samples": 0.0, "progress/tokens": 0.0, "progress/train_time_s": 0.0}
    ledger_file = LedgerFile(run_dir / LEDGER_FILE)
    first_step = 1
    if resume is not None:
        seconds = time.perf_counter() - process_started
        first_step = _restore(engine, resume, sink, counters, ledger_file, seconds) + 1
    else:
        sink.emit("log", {"level": "info", "message": _describe(engine)}, step=0)

    eval_tokens = cfg.logging.eval_max_new_tokens or cfg.rollout.max_new_tokens
    eval_prompts = engine.data.eval[: cfg.logging.eval_size]
    if first_step == 1 and eval_prompts and cfg.logging.eval_every > 0:
        sink.emit("metrics", {**evaluate(engine, eval_prompts, eval_tokens), **counters}, step=0)

    last: dict[str, float] = {}
    steps = range(first_step, cfg.train.steps + 1)
    bar = _progress_bar(steps, progress, cfg.train.steps, first_step)
    for step in bar:
        heartbeat.step = step
        metrics, rollouts = run_step(engine, step)
        _count_progress(engine, counters, metrics, rollouts)
        metrics.update(engine.peak_memory())
        due_eval = cfg.logging.eval_every > 0 and (step % cfg.logging.eval_every == 0 or step == cfg.train.steps)
        if due_eval and eval_prompts:
            started = time.perf_counter()
            metrics.update(evaluate(engine, eval_prompts, eval_tokens))
            metrics["timing/eval"] = time.perf_counter() - started
        sink.emit("metrics", metrics, step=step)
        ledger_file.save(engine.ledger)
        if writer is not None:
            writer.submit(rollouts)
        _show_rewards(bar, metrics)
        due_ckpt = (cfg.checkpoint.every_steps and step % cfg.checkpoint.every_steps == 0) or (
            step == cfg.train.steps and cfg.checkpoint.save_final
        )
        path = _checkpoint(engine, run_dir, sink, step, counters, ledger_file, writer) if due_ckpt else None
        last = metrics
        preempt = preemption_requested(run_dir) if step < cfg.train.steps else None
        if preempt is not None:
            # The scheduler needs the room: stop at this boundary with a checkpoint to resume from exactly.
            path = path or _checkpoint(engine, run_dir, sink, step, counters, ledger_file, writer)
            clear_request(run_dir)
            sink.emit(
                "status",
                {
                    "state": "preempted",
                    "reason": f"checkpointed after step {step} ({preempt})",
                    "checkpoint": str(path),
                },
                step=step,
            )
            raise Preempted(step, path)
        over = time_limit_reason(counters["progress/train_time_s"], cfg.train.max_wall_s, step)
        if over is not None and step < cfg.train.steps:
            path = path or _checkpoint(engine, run_dir, sink, step, counters, ledger_file, writer)
            sink.emit("status", {"state": "failed", "reason": over, "checkpoint": str(path)}, step=step)
            raise TimeLimitReached(step, path)
    ledger_file.save(engine.ledger, force=True)
    if writer is not None:
        writer.flush()  # the last steps' files are announced before the final status, never after it
    sink.emit("status", {"state": "succeeded"}, step=cfg.train.steps)
    return last


def _count_progress(
    engine: Engine, counters: dict[str, float], metrics: dict[str, float], rollouts: StepRollouts
) -> None:
    """The run's running totals advanced by this step, and copied (with the epoch) into its metrics."""
    counters["progress/samples"] += len(rollouts.records)
    counters["progress/tokens"] += sum(r["length"] for r in rollouts.records)
    counters["progress/train_time_s"] += metrics["timing/step"]
    metrics.update(counters)
    metrics["progress/epoch"] = counters["progress/samples"] / (
        engine.cfg.rollout.samples_per_prompt * len(engine.data.train)
    )


def _show_rewards(bar: object, metrics: dict[str, float]) -> None:
    """The step's reward (and eval reward, when it has one) on the progress bar, where there is one."""
    if hasattr(bar, "set_postfix"):
        bar.set_postfix(
            reward=f"{metrics['reward/mean']:.3f}",
            **({"eval": f"{metrics['eval/reward/mean']:.3f}"} if "eval/reward/mean" in metrics else {}),
        )


def _restore(
    engine: Engine, resume: Path, sink: EventLog, counters: dict[str, float], ledger_file: LedgerFile, seconds: float
) -> int:
    """The checkpoint's state back in the engine (weights came with it), its ledger with this resume recorded;
    returns the checkpoint's step."""
    state = load_engine_state(resume)
    engine.trainer.load_state_dict(state.trainer)
    engine.sampler.load_state_dict(state.sampler)
    restore_rng(state.rng)
    counters.update(state.metrics_so_far)
    if engine.cfg.backends.async_rollout:
        resume_pending(engine, state)
    record = resume_ledger(engine, state, resume, seconds)
    ledger_file.save(engine.ledger, force=True)
    sink.emit("log", {"level": "info", "message": describe_resume(record)}, step=state.step)
    return state.step


def _checkpoint(
    engine: Engine,
    run_dir: Path,
    sink: EventLog,
    step: int,
    counters: dict[str, float],
    ledger_file: LedgerFile,
    writer: RolloutWriter | None = None,
) -> Path:
    state = EngineState(
        step=step,
        trainer=engine.trainer.state_dict(),
        sampler=engine.sampler.state_dict(),
        rng=capture_rng(),
        metrics_so_far=dict(counters),
        pending=saved_pending(engine),
        ledger=engine.ledger.state_dict(),
    )
    path = engine.save_checkpoint(run_dir, step, state)
    ledger_file.save(engine.ledger, force=True)  # the run folder's file is never behind its latest checkpoint
    if writer is not None:
        # The rollout files of every step up to here are announced before the checkpoint: a run resumed
        # from it leaves no step without its file (the writer ran while the checkpoint was saved).
        writer.flush()
    sink.emit("checkpoint", {"path": str(path), "format": "hf"}, step=step)
    return path


def resume_ledger(engine: Engine, state: EngineState, checkpoint: Path, seconds: float) -> Resume:
    """The checkpoint's ledger back, its in-flight rows matched with the batches restored with it, and the
    resume recorded with what it re-does: the steps the interrupted run finished past the checkpoint, read
    from the ledger file in that run's folder (the checkpoint's grandparent)."""
    if state.ledger is not None:
        engine.ledger = PromptLedger.from_state_dict(state.ledger)
    else:  # a checkpoint from before the ledger: what came before it is unknown
        engine.ledger.sampler_epoch = engine.sampler.epoch
    restored, lost = engine.ledger.restore_in_flight({p.step for p in engine.pending})
    previous_file = Path(checkpoint).parent.parent / LEDGER_FILE
    previous = read_parquet(previous_file) if previous_file.is_file() else None
    steps, rows = redone_since(previous, state.step)
    if previous is not None:
        # The interrupted run's file holds every resume of its lineage, the ones after this checkpoint too
        # (an attempt killed before it saved a checkpoint of its own): the history keeps them all.
        engine.ledger.resumes = previous.resumes
    record = Resume(state.step, restored, lost, steps, rows, round(seconds, 3))
    engine.ledger.resumes.append(record)
    return record


def describe_resume(record: Resume) -> str:
    text = f"resumed from the checkpoint of step {record.checkpoint_step} in {record.seconds:.1f}s"
    if record.restored_in_flight:
        text += f"; {record.restored_in_flight} rows generated ahead restored with their rollouts"
    if record.lost_in_flight:
        text += f"; {record.lost_in_flight} rows in flight lost (their rollouts were not in the checkpoint)"
    if record.redone_steps:
        text += (
            f"; re-doing steps {record.redone_steps[0]}-{record.redone_steps[-1]} "
            f"({record.redone_rows} rows) lost after it"
        )
    return text


def _describe(engine: Engine) -> str:
    data = engine.data
    policy = type(engine.model).__name__ if engine.model is not None else "policy"
    text = (
        f"policy {policy} with {engine.parameter_count():,} parameters; {len(data.train)} training prompts, "
        f"{len(data.eval)} held-out"
    )
    if engine.roles is not None:
        text += f"; {engine.roles.describe()}"
    if hasattr(engine.executor, "describe"):
        text += f"; {engine.executor.describe()}"
    if data.dropped_too_long:
        text += f"; dropped {data.dropped_too_long} prompts longer than data.max_prompt_tokens"
    return text


def _progress_bar(steps: range, enabled: bool, total: int, first: int):
    if not enabled:
        return steps
    from tqdm import tqdm

    return tqdm(steps, total=total, initial=first - 1, desc="train", unit="step")
