"""The policy model (with its LoRA adapters) and the prompt dataset sections."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from posttrain_sdk import rollout_files
from rl_engine.config.errors import FieldErrors
from rl_engine.config.schema.base import PolicyDtype, _Section


class LoraConfig(_Section):
    """LoRA adapters on the policy (peft): only the adapters train; the reference is the base model."""

    enabled: bool = Field(default=False, description="Train LoRA adapters instead of every weight.")
    rank: int = Field(default=16, ge=1, description="Adapter rank r.")
    alpha: float = Field(default=32.0, gt=0, description="Adapter scaling numerator (scale = alpha / rank).")
    dropout: float = Field(default=0.0, ge=0, lt=1, description="Dropout on the adapter input.")
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        min_length=1,
        description="Names of the linear layers that get adapters ('all-linear' alone = every one "
        "but the output head; tied embeddings cannot take one).",
    )
    quantize_base: Literal["none", "4bit"] = Field(
        default="none",
        description="QLoRA: keep the frozen base in 4-bit (bitsandbytes; CUDA GPUs only, refused elsewhere).",
    )


class ModelConfig(_Section):
    """The policy model: a local Hugging Face folder."""

    path: str = Field(min_length=1, description="Local Hugging Face model folder (weights, config and tokenizer).")
    tokenizer_path: str | None = Field(
        default=None, description="Tokenizer folder, if not the model folder. Empty = use the model path."
    )
    dtype: PolicyDtype = Field(
        default="auto",
        description="Weight and compute dtype of the policy; auto = bfloat16 where the device computes in it "
        "natively (CUDA GPUs since Ampere, CPUs with AVX512-BF16 or AMX), float32 elsewhere.",
    )
    trust_remote_code: bool = Field(
        default=False, description="Allow custom modelling code shipped inside the model folder."
    )
    gradient_checkpointing: bool = Field(
        default=False, description="Recompute activations in the backward pass: less memory, ~30% slower."
    )
    lora: LoraConfig = Field(default_factory=LoraConfig, description="LoRA / QLoRA adapters on the policy.")


class DataConfig(_Section):
    """The prompt dataset and how prompts are built from it."""

    path: str = Field(
        min_length=1, description="Prompt dataset: a JSONL, Parquet or CSV file, or a `save_to_disk` folder."
    )
    format: Literal["auto", "jsonl", "parquet", "csv", "hf_disk"] = Field(
        default="auto", description="Dataset format; auto = decide from the file extension or folder."
    )
    prompt_field: str = Field(default="prompt", min_length=1, description="Column holding the prompt text.")
    label_field: str | None = Field(
        default="label", description="Column holding the reference answer passed to rewards; empty = none."
    )
    eval_path: str | None = Field(
        default=None, description="Separate held-out dataset for evaluation (same format rules as path)."
    )
    eval_fraction: float = Field(
        default=0.0, ge=0.0, le=0.5, description="Fraction of the dataset held out for evaluation (0 = none)."
    )
    eval_size: int | None = Field(
        default=None, ge=1, description="Cap on the number of held-out prompts; empty = no cap."
    )
    apply_chat_template: bool = Field(
        default=False, description="Wrap each prompt in the tokenizer's chat template as a user message."
    )
    system_prompt: str | None = Field(
        default=None, description="System message prepended when the chat template is applied."
    )
    max_prompt_tokens: int = Field(
        default=512, ge=1, le=rollout_files.MAX_PROMPT_TOKENS, description="Maximum prompt length in tokens."
    )
    shuffle: bool = Field(default=True, description="Shuffle the prompt order (seeded by the run seed).")

    @model_validator(mode="after")
    def _one_eval_source(self) -> DataConfig:
        if self.eval_path is not None and self.eval_fraction > 0:
            raise FieldErrors([("eval_fraction", "set either eval_path or eval_fraction, not both")])
        return self
