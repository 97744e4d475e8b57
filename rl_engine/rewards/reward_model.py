"""A learned reward model: a sequence-classification model with one output, from a local folder.

The model reads each sample's ``query`` (prompt+response text) and its single logit at the
last non-padding token is the score. torch/transformers are imported when the model is first
needed (they must not load in the python sandbox child, which imports this package).

Choices worth knowing:
- Loaded lazily, once, on the first ``score`` (or :meth:`load`), then kept for the whole run.
- Texts longer than ``max_length`` tokens are cut from the *left*: the score is read at the
  end of the sequence, so the response end matters more than the start of the prompt. The
  ``truncated`` curve shows how often that happened.
- Special tokens are added by the tokenizer unless the text already starts with the BOS token
  (chat templates usually write it), to avoid a doubled BOS.
- Each micro-batch is sorted by length to reduce padding; scores come back in input order and
  do not depend on ``batch_size`` (padding is masked).
- Runs on ``device`` ("auto": the first CUDA device when there is one, else CPU).
- A model that cannot be loaded raises from ``load``/``score`` (a configuration problem, not a
  per-sample one); ``CompositeReward`` records it against every sample of the batch. Call
  :meth:`load` at start-up to fail before the first step.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from rl_engine.rewards.base import ComponentResult, RewardBatch

DTYPES = ("auto", "float32", "bfloat16", "float16")
_DTYPE_ALIASES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16"}


class RewardModelReward:
    def __init__(
        self,
        path: str,
        name: str = "reward_model",
        batch_size: int = 8,
        max_length: int = 2048,
        dtype: str = "float32",
        device: str = "auto",
    ):
        folder = Path(path)
        if not (folder / "config.json").is_file():
            raise ValueError(f"path: {path!r} is not a Hugging Face model folder (no config.json)")
        dtype = _DTYPE_ALIASES.get(dtype, dtype)
        if dtype not in DTYPES:
            raise ValueError(f"dtype: expected one of {', '.join(DTYPES)}, got {dtype!r}")
        if batch_size < 1:
            raise ValueError("batch_size: must be >= 1")
        if max_length < 2:
            raise ValueError("max_length: must be >= 2")
        self.name = name
        self.path = str(folder)
        self.batch_size = int(batch_size)
        self.max_length = int(max_length)
        self.dtype = dtype
        self.device_name = device
        self._model: Any = None
        self._tokenizer: Any = None
        self._device: Any = None
        self._lock = threading.Lock()

    def load(self) -> None:
        """Load tokenizer and model now (idempotent)."""
        with self._lock:
            if self._model is not None:
                return
            import torch
            from transformers import AutoModelForSequenceClassification, AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(self.path)
            if tokenizer.pad_token_id is None:
                # Llama/Qwen-style tokenizers often have no pad token; any id works because
                # padding is masked and the score is read at the last real token.
                tokenizer.pad_token = tokenizer.eos_token or tokenizer.unk_token
            tokenizer.padding_side = "right"
            dtype = "auto" if self.dtype == "auto" else getattr(torch, self.dtype)
            model = AutoModelForSequenceClassification.from_pretrained(self.path, num_labels=1, dtype=dtype)
            if model.config.pad_token_id is None:
                model.config.pad_token_id = tokenizer.pad_token_id
            device = self.device_name
            if device == "auto":
                device = "cuda" if torch.cuda.is_available() else "cpu"
            self._device = torch.device(device)
            self._model = model.to(self._device).eval()
            self._tokenizer = tokenizer

    def score(self, batch: RewardBatch) -> ComponentResult:
        n = len(batch)
        if n == 0:
            return ComponentResult.ok([])
        self.load()
        import torch

        ids, truncated = self._encode(batch.queries)
        pad_id = self._tokenizer.pad_token_id
        scores = [0.0] * n
        order = sorted(range(n), key=lambda i: len(ids[i]))
        with torch.inference_mode():
            for start in range(0, n, self.batch_size):
                chunk = order[start : start + self.batch_size]
                width = max(len(ids[i]) for i in chunk)
                input_ids = torch.full((len(chunk), width), pad_id, dtype=torch.long)
                attention = torch.zeros((len(chunk), width), dtype=torch.long)
                for row, i in enumerate(chunk):
                    input_ids[row, : len(ids[i])] = torch.tensor(ids[i], dtype=torch.long)
                    attention[row, : len(ids[i])] = 1
                logits = self._forward(input_ids, attention)
                for row, i in enumerate(chunk):
                    scores[i] = float(logits[row])
        return ComponentResult.ok(scores, {"truncated": truncated})

    def _encode(self, texts: list[str]) -> tuple[list[list[int]], list[float]]:
        tokenizer = self._tokenizer
        bos = tokenizer.bos_token
        ids: list[list[int]] = []
        truncated: list[float] = []
        for text in texts:
            add_special = not (bos and text.startswith(bos))
            tokens = tokenizer(text, add_special_tokens=add_special, truncation=False, verbose=False)["input_ids"]
            if not tokens:
                tokens = [tokenizer.pad_token_id]  # an empty text still needs one position
            truncated.append(1.0 if len(tokens) > self.max_length else 0.0)
            ids.append(tokens[-self.max_length :])
        return ids, truncated

    def _forward(self, input_ids: Any, attention: Any) -> Any:
        """The score of each row: the single logit at the row's last real token.

        For the usual decoder layout (a backbone plus a ``score`` head: Llama, Qwen, Mistral...)
        the head is applied at the last position of the attention mask, like OpenRLHF's reward
        models. Transformers' own pooling picks the rightmost token that is not the pad id,
        which is the wrong position when pad = eos and the text ends with eos. Other
        architectures use the model's logits as they are.
        """
        import torch

        model = self._model
        input_ids = input_ids.to(self._device)
        attention = attention.to(self._device)
        head = getattr(model, "score", None)
        backbone = model.base_model
        if isinstance(head, torch.nn.Module) and backbone is not model:
            hidden = backbone(input_ids=input_ids, attention_mask=attention).last_hidden_state
            last = attention.sum(dim=1) - 1  # right padding
            logits = head(hidden[torch.arange(hidden.shape[0], device=hidden.device), last])
        else:
            logits = model(input_ids=input_ids, attention_mask=attention).logits
        if logits.shape[-1] != 1:
            raise ValueError(f"the reward model has {logits.shape[-1]} outputs; expected num_labels=1")
        return logits[:, 0].float().cpu()

    def close(self) -> None:
        with self._lock:
            self._model = None
            self._tokenizer = None
