"""The policies the benchmarks sample from and train: the demo task (data, tokenizer, a Qwen2 policy) at one of
`rl_engine.demo.build.MODEL_SIZES`, built once into a folder and reused while its build parameters match."""

from __future__ import annotations

import json
from pathlib import Path

from rl_engine.demo.build import build_demo, existing_build

_STAMP = "bench-build.json"


def build_policy(
    folder: Path,
    size: str = "demo",
    *,
    sft_steps: int | None = None,
    max_positions: int | None = None,
    seed: int = 0,
    progress: bool = False,
) -> dict:
    """The demo task with a `size` policy in `folder` (model/, data/); returns its build manifest.

    `sft_steps` fixes the warm start's length (0 = the random initialisation; None = the size's default).
    `max_positions` widens the model's `max_position_embeddings` (the demo builds 128). Qwen2 has rotary
    positions, no learned table, so the weights do not change; it lets a prompt plus 128 new tokens fit the
    context that vLLM (which caps `max_model_len` at it) and the engine will use.
    """
    folder = Path(folder)
    wanted = {"size": size, "sft_steps": sft_steps, "max_positions": max_positions, "seed": seed}
    stamp = folder / _STAMP
    manifest = existing_build(folder)
    if manifest is not None and stamp.is_file() and json.loads(stamp.read_text()) == wanted:
        return manifest
    stamp.unlink(missing_ok=True)
    manifest = build_demo(folder, seed=seed, model_size=size, sft_steps=sft_steps, progress=progress)
    if max_positions is not None:
        config_path = folder / "model" / "config.json"
        config = json.loads(config_path.read_text())
        config["max_position_embeddings"] = max_positions
        config_path.write_text(json.dumps(config, indent=2) + "\n")
        tokenizer_path = folder / "model" / "tokenizer_config.json"
        tokenizer = json.loads(tokenizer_path.read_text())
        tokenizer["model_max_length"] = max_positions
        tokenizer_path.write_text(json.dumps(tokenizer, indent=2) + "\n")
    stamp.write_text(json.dumps(wanted) + "\n")
    return manifest
