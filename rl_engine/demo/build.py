"""Build the offline demo task: tokenizer, a small Qwen2 policy with a short SFT warm start,
and the RL/held-out prompt files.

Layout of ``out_dir`` (``manifest.json`` is written last and marks a complete build)::

    model/            HF checkpoint (config, safetensors, generation config, tokenizer)
    data/train.jsonl  RL prompts        {"prompt": "37+48=", "label": "85"}
    data/test.jsonl   held-out prompts  (disjoint from train and sft)
    data/sft.jsonl    warm-start pairs  (disjoint from both)
    data/sft_val.jsonl  decides when the warm start stops (disjoint from all the above)
    manifest.json     seed, sizes, parameter count, warm-start accuracy, timings, versions

Everything is a function of the seed: the pair split uses ``random.Random(seed)``, model
init and batch order use torch RNGs seeded from it, and deterministic algorithms are on
while building, so the same seed gives byte-identical data files and identical weights
(on the same machine and library versions).
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from rl_engine.demo import task
from rl_engine.demo.evaluate import evaluate_greedy, evaluate_greedy_detailed
from rl_engine.demo.tokenizer import train_tokenizer

__all__ = ["MODEL_SIZES", "ModelSize", "build_demo", "evaluate_greedy", "existing_build"]

MANIFEST = "manifest.json"
MANIFEST_FORMAT = 1
N_TRAIN = 5000
N_TEST = 1000
N_SFT_VAL = 500
N_SFT = task.N_PAIRS - N_TRAIN - N_TEST - N_SFT_VAL  # the remaining 1,600 pairs
MAX_NEW_TOKENS = 4  # at most three answer digits ("198") plus eos
_SPLITS = ("train", "test", "sft", "sft_val")


@dataclass(frozen=True)
class ModelSize:
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    sft_steps: int  # the step budget (the cap, when a target accuracy is set)
    sft_lr: float
    sft_batch_size: int
    # Stop the warm start at the first validation check (every sft_eval_every steps, greedy
    # on the sft_val slice) at or above this accuracy. Where the policy crosses from "format
    # only" to "some sums right" moves by tens of steps between seeds (a fixed 200 steps gave
    # 5%, 12% and 25% held-out for seeds 0-2), so a step budget alone cannot aim at ~15%.
    sft_target_accuracy: float | None = None
    sft_eval_every: int = 5


MODEL_SIZES: dict[str, ModelSize] = {
    # Unit tests: builds in seconds; learns the answer-then-eos format, not the sums.
    "tiny": ModelSize(32, 2, 2, 1, 64, sft_steps=60, sft_lr=3e-3, sft_batch_size=64),
    # The demo policy (~1M parameters): weak but not random after the warm start.
    "demo": ModelSize(
        128,
        4,
        4,
        2,
        512,
        sft_steps=1000,
        sft_lr=5e-4,
        sft_batch_size=64,
        sft_target_accuracy=0.15,
    ),
    # Throughput benchmarks only (~50M parameters); a few steps teach the format.
    "medium": ModelSize(512, 8, 8, 2, 3584, sft_steps=10, sft_lr=3e-4, sft_batch_size=32),
}


@dataclass
class _SftResult:
    steps: int
    final_loss: float | None
    reached_target: bool | None
    val_history: list[tuple[int, float]]


def build_demo(
    out_dir: Path,
    seed: int = 0,
    *,
    sft_steps: int | None = None,
    model_size: str = "demo",
    progress: bool = True,
) -> dict:
    """Build the demo task into ``out_dir`` (replacing a previous build) and return the
    manifest.

    ``sft_steps`` fixes the warm-start budget to exactly that many steps, switching off the
    size's target-accuracy stop (``None`` keeps the size's defaults).
    """
    if model_size not in MODEL_SIZES:
        raise ValueError(f"unknown model_size {model_size!r}; choose from {sorted(MODEL_SIZES)}")
    if sft_steps is not None and sft_steps < 0:
        raise ValueError("sft_steps must be >= 0")
    size = MODEL_SIZES[model_size]
    steps = size.sft_steps if sft_steps is None else sft_steps
    target = size.sft_target_accuracy if sft_steps is None else None
    out_dir = Path(out_dir)
    t_start = time.perf_counter()
    stage_seconds: dict[str, float] = {}

    def log(msg: str) -> None:
        if progress:
            print(f"[demo build] {msg}", file=sys.stderr, flush=True)

    _clear_previous_build(out_dir)

    with _deterministic(seed):
        t = time.perf_counter()
        split = task.split_pairs(seed, N_TRAIN, N_TEST, N_SFT, N_SFT_VAL)
        rows = {name: [task.to_row(p) for p in getattr(split, name)] for name in _SPLITS}
        for name, rs in rows.items():
            task.write_jsonl(out_dir / "data" / f"{name}.jsonl", rs)
        # The vocabulary comes from the task's text (all pairs, not one split's), so it is
        # the same for every seed.
        corpus = [r["prompt"] + r["label"] for r in map(task.to_row, task.all_pairs())]
        tokenizer = train_tokenizer(corpus)
        stage_seconds["data_and_tokenizer"] = time.perf_counter() - t
        log(f"data: {N_TRAIN} train / {N_TEST} test / {N_SFT} sft / {N_SFT_VAL} sft_val rows; vocab {len(tokenizer)}")

        t = time.perf_counter()
        model = _init_model(size, tokenizer)
        n_params = sum(p.numel() for p in model.parameters())
        stage_seconds["init"] = time.perf_counter() - t
        log(f"model: Qwen2ForCausalLM ({model_size}), {n_params:,} parameters")

        t = time.perf_counter()
        sft = _supervised_warm_start(
            model,
            tokenizer,
            rows["sft"],
            rows["sft_val"],
            size,
            steps,
            target,
            seed,
            progress=progress,
        )
        stage_seconds["sft"] = time.perf_counter() - t
        if target is not None and not sft.reached_target:
            log(f"warning: SFT stopped at its {steps}-step cap below the {target:.0%} target")

        t = time.perf_counter()
        result = evaluate_greedy_detailed(model, tokenizer, rows["test"], batch_size=256, max_new_tokens=MAX_NEW_TOKENS)
        stage_seconds["evaluate"] = time.perf_counter() - t
        log(
            f"warm start after {sft.steps} SFT steps: held-out greedy accuracy "
            f"{result.accuracy:.1%} (eos rate {result.eos_rate:.1%}, {N_TEST} prompts)"
        )

        t = time.perf_counter()
        model_dir = out_dir / "model"
        with _quiet_transformers_progress():
            model.save_pretrained(model_dir)
        tokenizer.save_pretrained(model_dir)
        stage_seconds["save"] = time.perf_counter() - t

    import tokenizers
    import transformers

    manifest = {
        "format": MANIFEST_FORMAT,
        "task": "two-digit addition",
        "prompt_format": "{a}+{b}=",
        "answer_format": "{a+b} then eos",
        "seed": seed,
        "model_size": model_size,
        "model": {
            "path": "model",
            "architecture": "Qwen2ForCausalLM",
            "parameters": n_params,
            **{k: v for k, v in asdict(size).items() if not k.startswith("sft_")},
        },
        "tokenizer": {
            "vocab_size": len(tokenizer),
            "pad_token": tokenizer.pad_token,
            "pad_token_id": tokenizer.pad_token_id,
            "eos_token": tokenizer.eos_token,
            "eos_token_id": tokenizer.eos_token_id,
            "bos_token": tokenizer.bos_token,
            "bos_token_id": tokenizer.bos_token_id,
            "adds_bos": False,
            "chat_template": True,
        },
        "data": {name: {"path": f"data/{name}.jsonl", "rows": len(rows[name])} for name in _SPLITS},
        "sft": {
            "steps": sft.steps,
            "max_steps": steps,
            "target_val_accuracy": target,
            "reached_target": sft.reached_target,
            # step -> greedy accuracy on sft_val (a mapping keeps the manifest readable)
            "val_history": {str(step): acc for step, acc in sft.val_history},
            "batch_size": size.sft_batch_size,
            "lr": size.sft_lr,
            "final_loss": sft.final_loss,
        },
        "warm_start": {
            "test_accuracy": result.accuracy,
            "test_eos_rate": result.eos_rate,
            "eval_rows": N_TEST,
            "decoding": "greedy",
            "max_new_tokens": MAX_NEW_TOKENS,
        },
        "build_seconds": round(time.perf_counter() - t_start, 2),
        "stage_seconds": {k: round(v, 2) for k, v in stage_seconds.items()},
        "versions": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "tokenizers": tokenizers.__version__,
            "python": platform.python_version(),
        },
    }
    _write_manifest(out_dir, manifest)
    log(f"done in {manifest['build_seconds']:.1f} s -> {out_dir}")
    return manifest


def _clear_previous_build(out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    # Drop the completion marker first: an interrupted rebuild must not look complete.
    (out_dir / MANIFEST).unlink(missing_ok=True)
    for sub in ("model", "data"):
        shutil.rmtree(out_dir / sub, ignore_errors=True)


def _write_manifest(out_dir: Path, manifest: dict) -> None:
    """Write the manifest atomically: it is the build's completion marker."""
    tmp = out_dir / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=2) + "\n")
    os.replace(tmp, out_dir / MANIFEST)


def existing_build(out_dir: Path) -> dict | None:
    """The manifest of a complete build in ``out_dir``, or None."""
    out_dir = Path(out_dir)
    path = out_dir / MANIFEST
    if not path.is_file():
        return None
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
        return None
    needed = [out_dir / "model" / "config.json", out_dir / "model" / "tokenizer.json"]
    needed += [out_dir / d["path"] for d in manifest.get("data", {}).values()]
    return manifest if all(p.is_file() for p in needed) else None


@contextmanager
def _deterministic(seed: int) -> Iterator[None]:
    """Seed torch and turn on deterministic algorithms, restoring the caller's settings."""
    was_deterministic = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    rng_state = torch.get_rng_state()
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(was_deterministic, warn_only=warn_only)
        torch.set_rng_state(rng_state)


@contextmanager
def _quiet_transformers_progress() -> Iterator[None]:
    # save_pretrained draws a one-shard "Writing model shards" bar; ours is the SFT bar.
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def _init_model(size: ModelSize, tokenizer):
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=size.hidden_size,
        intermediate_size=size.intermediate_size,
        num_hidden_layers=size.num_layers,
        num_attention_heads=size.num_heads,
        num_key_value_heads=size.num_kv_heads,
        max_position_embeddings=128,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = Qwen2ForCausalLM(config)  # random init from torch's global RNG (seeded)
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return model


def _sft_tensors(tokenizer, rows: list[dict]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ``prompt + label + eos`` ids; the loss sees only the label and eos.

    Prompt and answer are tokenized separately, the way an RL rollout appends sampled
    completion tokens to the tokenized prompt.
    """
    eos = tokenizer.eos_token_id
    seqs, masks = [], []
    for r in rows:
        p = tokenizer(r["prompt"], add_special_tokens=False)["input_ids"]
        a = tokenizer(r["label"], add_special_tokens=False)["input_ids"] + [eos]
        seqs.append(p + a)
        masks.append([False] * len(p) + [True] * len(a))
    width = max(map(len, seqs))
    ids = torch.full((len(seqs), width), tokenizer.pad_token_id, dtype=torch.long)
    attn = torch.zeros((len(seqs), width), dtype=torch.long)
    labels = torch.full((len(seqs), width), -100, dtype=torch.long)
    for i, (s, m) in enumerate(zip(seqs, masks)):
        ids[i, : len(s)] = torch.tensor(s)
        attn[i, : len(s)] = 1
        labels[i, : len(s)] = torch.where(torch.tensor(m), torch.tensor(s), -100)
    return ids, attn, labels


def _supervised_warm_start(
    model,
    tokenizer,
    rows: list[dict],
    val_rows: list[dict],
    size: ModelSize,
    steps: int,
    target: float | None,
    seed: int,
    *,
    progress: bool,
) -> _SftResult:
    """A plain AdamW loop over shuffled epochs of the SFT slice.

    Runs ``steps`` steps, or stops earlier at the first validation check whose greedy
    accuracy on ``val_rows`` reaches ``target``. The learning rate stays constant after a
    short warm-up so that the point where training stops does not change the schedule.
    """
    if steps == 0:
        return _SftResult(0, None, None if target is None else False, [])
    from tqdm.auto import tqdm

    ids, attn, labels = _sft_tensors(tokenizer, rows)
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=size.sft_lr, betas=(0.9, 0.95), weight_decay=0.01)
    warmup = max(1, min(20, steps // 5))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: min(1.0, (i + 1) / warmup))
    model.train()
    order = torch.randperm(len(rows), generator=gen)
    cursor = 0
    loss_value: float | None = None
    history: list[tuple[int, float]] = []
    reached = None if target is None else False
    done = 0
    bar = tqdm(total=steps, desc="SFT warm start", unit="step", disable=not progress)
    for step in range(1, steps + 1):
        if cursor + size.sft_batch_size > len(rows):
            order, cursor = torch.randperm(len(rows), generator=gen), 0
        idx = order[cursor : cursor + size.sft_batch_size]
        cursor += size.sft_batch_size
        out = model(input_ids=ids[idx], attention_mask=attn[idx], labels=labels[idx])
        opt.zero_grad(set_to_none=True)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        loss_value = out.loss.item()
        done = step
        postfix = {"loss": f"{loss_value:.3f}"}
        if target is not None and step % size.sft_eval_every == 0:
            # evaluate_greedy puts the model back in train mode afterwards.
            acc = evaluate_greedy(model, tokenizer, val_rows, max_new_tokens=MAX_NEW_TOKENS)
            history.append((step, acc))
            postfix["val_acc"] = f"{acc:.1%}"
            if acc >= target:
                reached = True
        bar.set_postfix(postfix, refresh=False)
        bar.update(1)
        if reached:
            bar.total = step  # stopped early: show the run as complete, not at 26%
            bar.refresh()
            break
    bar.close()
    model.eval()
    return _SftResult(done, loss_value, reached, history)
