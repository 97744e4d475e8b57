"""The Tinker service's state: sessions, training models, sampling sessions, checkpoints and futures.

Every call that computes (``create_model``, ``forward_backward``, ``optim_step``, ``save_weights*``,
``load_weights``, ``asample``) is queued and answered by a future the SDK polls. One worker thread runs
the queue in arrival order: the SDK submits one training client's requests one at a time (the server's
client config turns its parallel chunk submission off), so arrival order is its ``seq_id`` order, and the
model is never touched by two calls at once. A call's error is its future's ("user" for what the caller
sent, "server" otherwise) and the service goes on serving every other session.

Checkpoints live under ``root/<model_id>/{weights,sampler_weights}/<name>/`` as peft adapter folders
(with Adam's state for ``weights``), named to the client as ``tinker://<model_id>/<kind>/<name>``.
"""

from __future__ import annotations

import logging
import queue
import re
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from torch import Tensor

from rl_engine.tinker.losses import LossRefused
from rl_engine.tinker.model import AdamSettings, LoraSettings, SampleSettings, TinkerModel
from rl_engine.tinker.wire import FwdBwdCall, encode_forward_backward_output, encode_sample_response

__all__ = ["CallRecord", "Future", "TinkerService"]

log = logging.getLogger(__name__)

_CHECKPOINT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_KINDS = {"weights": "training", "sampler_weights": "sampler"}
DEFAULT_MAX_TOKENS = 256


@dataclass
class Future:
    """A queued call's outcome: ``json`` or ``proto`` once done, or ``error`` with its category."""

    request_id: str
    key: str = ""  # whose call it is: only that key retrieves it
    done: threading.Event = field(default_factory=threading.Event)
    json: dict[str, Any] | None = None
    proto: bytes | None = None
    error: str | None = None
    category: str = "server"


@dataclass(frozen=True)
class CallRecord:
    """What a call did, for whoever watches the service (the platform's run page)."""

    kind: str
    model_id: str
    seconds: float
    metrics: dict[str, float]
    detail: dict[str, Any] = field(default_factory=dict)


class RunRecorder(Protocol):
    """Where training clients are recorded as runs (:class:`rl_engine.tinker.tracking.PosttrainRuns`)."""

    def authenticate(self, key: str) -> str: ...
    def open(self, model_id: str, key: str, base_model: str, rank: int, project: str | None) -> str: ...
    def record(self, record: CallRecord) -> None: ...
    def check_open(self, model_id: str, key: str) -> None: ...
    def finish(self, model_id: str, reason: str, state: str = "succeeded") -> None: ...


@dataclass
class _Session:
    key: str
    project: str | None
    heard: float = field(default_factory=time.monotonic)


@dataclass
class _Trained:
    model: TinkerModel
    base_model: str
    session_id: str
    lora: LoraSettings
    created: datetime = field(default_factory=lambda: datetime.now(UTC))


@dataclass(frozen=True)
class _SamplingTarget:
    base_model: str
    model_path: str | None
    key: str


class TinkerService:
    """``base_models`` maps the names clients ask for to local model folders; ``root`` keeps checkpoints."""

    def __init__(
        self,
        base_models: dict[str, Path],
        root: Path,
        on_call: Callable[[CallRecord], None] | None = None,
        context_length: int | None = None,
        runs: RunRecorder | None = None,
        idle_s: float = 120.0,
    ) -> None:
        self.base_models = dict(base_models)
        self.root = root
        self.on_call = on_call or (lambda record: None)
        self.context_length = context_length
        self.runs = runs
        self.idle_s = idle_s
        self._lock = threading.Lock()
        self.sessions: dict[str, _Session] = {}
        self.trained: dict[str, _Trained] = {}
        self.sampling: dict[str, _SamplingTarget] = {}
        self.futures: dict[str, Future] = {}
        self._base_samplers: dict[str, TinkerModel] = {}
        self._adapters: dict[str, dict[str, Tensor]] = {}
        self._queue: queue.Queue[tuple[Future, Callable[[], None]]] = queue.Queue()
        self._worker = threading.Thread(target=self._work, name="tinker-worker", daemon=True)
        self._worker.start()
        threading.Thread(target=self._end_idle_sessions, name="tinker-idle", daemon=True).start()

    # --- sessions ------------------------------------------------------------------------------------

    def create_session(self, key: str, project: str | None = None) -> str:
        session_id = uuid.uuid4().hex
        with self._lock:
            self.sessions[session_id] = _Session(key, project)
        return session_id

    def heartbeat(self, session_id: str, key: str) -> _Session:
        with self._lock:
            session = self.sessions.get(session_id)
        if session is None:
            raise LossRefused(f"session {session_id!r} is not open here (it ended, or it never was)")
        if session.key != key:
            raise PermissionError(f"session {session_id!r} belongs to another key")
        session.heard = time.monotonic()
        return session

    def _end_idle_sessions(self) -> None:
        while True:
            time.sleep(min(5.0, self.idle_s / 4))
            now = time.monotonic()
            with self._lock:
                idle = [sid for sid, s in self.sessions.items() if now - s.heard > self.idle_s]
            for session_id in idle:
                self.end_session(session_id, f"the session ended: no heartbeat for {self.idle_s:.0f} s")

    def finish_session(self, session_id: str, key: str, status: str, detail: str | None) -> None:
        """The client closed its session (the SDK's ``ServiceClient.close``): its runs end as it says."""
        self.heartbeat(session_id, key)
        reason = f"the client closed the session ({status})" + (f": {detail}" if detail else "")
        self.end_session(session_id, reason, "succeeded" if status == "success" else "failed")

    def end_session(self, session_id: str, reason: str, state: str = "succeeded") -> None:
        """Its training clients' runs finished and their models freed (queued so no call is mid-way on them)."""
        with self._lock:
            self.sessions.pop(session_id, None)
            ended = [mid for mid, t in self.trained.items() if t.session_id == session_id]

        def run(future: Future) -> None:
            for model_id in ended:
                with self._lock:
                    self.trained.pop(model_id, None)
                if self.runs is not None:
                    self.runs.finish(model_id, reason, state)
            future.json = {"ended": ended}

        self.submit(run)

    def capabilities(self) -> list[dict[str, Any]]:
        return [
            {"model_name": name, "trainable": True, "sampleable": True, "max_context_length": self.context_length}
            for name in self.base_models
        ]

    # --- the queue -----------------------------------------------------------------------------------

    def submit(self, run: Callable[[Future], None], key: str = "") -> Future:
        future = Future(request_id=uuid.uuid4().hex, key=key)
        with self._lock:
            self.futures[future.request_id] = future
        self._queue.put((future, lambda: run(future)))
        return future

    def _record(self, record: CallRecord) -> None:
        self.on_call(record)
        if self.runs is not None:
            self.runs.record(record)

    def _work(self) -> None:
        while True:
            future, run = self._queue.get()
            try:
                run()
            except LossRefused as exc:
                future.error, future.category = str(exc), "user"
            except Exception as exc:  # one call's failure is that call's; the service serves the others
                log.exception("tinker call %s failed", future.request_id)
                future.error, future.category = f"{type(exc).__name__}: {exc}", "server"
            finally:
                future.done.set()

    def future(self, request_id: str, key: str) -> Future:
        with self._lock:
            found = self.futures.get(request_id)
        if found is None or found.key != key:
            raise LossRefused(f"request {request_id!r} is not known here for this key")
        return found

    # --- training ------------------------------------------------------------------------------------

    def create_model(self, session_id: str, key: str, base_model: str, lora: LoraSettings) -> Future:
        session = self.heartbeat(session_id, key)
        folder = self._base_folder(base_model)
        model_id = uuid.uuid4().hex

        def run(future: Future) -> None:
            model = TinkerModel(folder, lora)
            if self.runs is not None:
                self.runs.open(model_id, key, base_model, lora.rank, session.project)
            with self._lock:
                self.trained[model_id] = _Trained(model, base_model, session_id, lora)
            future.json = {"type": "create_model", "model_id": model_id}

        return self.submit(run, key)

    def _base_folder(self, base_model: str) -> Path:
        folder = self.base_models.get(base_model)
        if folder is None:
            served = ", ".join(sorted(self.base_models)) or "none"
            raise LossRefused(f"base_model {base_model!r} is not served here; served: {served}")
        return folder

    def model(self, model_id: str, key: str) -> _Trained:
        """The training client, for its own key only, while its session and its run are open."""
        with self._lock:
            found = self.trained.get(model_id)
            session = None if found is None else self.sessions.get(found.session_id)
        if found is None or session is None:
            raise LossRefused(
                f"model_id {model_id!r} is not a training client here (its session ended, or it never was)"
            )
        if session.key != key:
            raise PermissionError(f"model_id {model_id!r} belongs to another key")
        if self.runs is not None:
            self.runs.check_open(model_id, key)
        return found

    def info(self, model_id: str, key: str) -> dict[str, Any]:
        trained = self.model(model_id, key)
        return {
            "type": "get_info",
            "model_id": model_id,
            "model_data": {
                "arch": trained.model.model.config.model_type,
                "model_name": trained.base_model,
                # A local folder: AutoTokenizer loads it offline (the SDK's get_tokenizer loads this id).
                "tokenizer_id": str(trained.model.path),
            },
            "is_lora": True,
            "lora_rank": trained.lora.rank,
        }

    def forward_backward(self, call: FwdBwdCall, key: str) -> Future:
        trained = self.model(call.model_id, key)
        trained.model.check(call.data, call.loss_fn)

        def run(future: Future) -> None:
            started = time.perf_counter()
            result = trained.model.forward_backward(
                call.data, call.loss_fn, call.config, backward=not call.forward_only
            )
            seconds = time.perf_counter() - started
            metrics = {"loss:sum": result.loss}
            future.proto = encode_forward_backward_output(result, metrics)
            kind = "forward" if call.forward_only else "forward_backward"
            details = {"loss_fn": call.loss_fn, "data": len(call.data)}
            self._record(CallRecord(kind, call.model_id, seconds, {**metrics, "tokens": result.tokens}, details))

        return self.submit(run, key)

    def optim_step(self, model_id: str, key: str, adam: AdamSettings) -> Future:
        trained = self.model(model_id, key)

        def run(future: Future) -> None:
            started = time.perf_counter()
            metrics = trained.model.optim_step(adam)
            future.json = {"type": "optim_step", "metrics": metrics}
            self._record(CallRecord("optim_step", model_id, time.perf_counter() - started, metrics))

        return self.submit(run, key)

    # --- checkpoints ---------------------------------------------------------------------------------

    def save(self, model_id: str, key: str, name: str | None, for_sampler: bool) -> Future:
        trained = self.model(model_id, key)
        kind = "sampler_weights" if for_sampler else "weights"
        name = name or f"{trained.model.steps:06d}-{uuid.uuid4().hex[:6]}"
        if not _CHECKPOINT_NAME.match(name):
            raise LossRefused(f"path {name!r}: letters, digits, '.', '_' and '-' only, at most 128")
        folder = self.root / model_id / kind / name

        def run(future: Future) -> None:
            started = time.perf_counter()
            trained.model.save(folder, with_optimizer=not for_sampler)
            path = f"tinker://{model_id}/{kind}/{name}"
            future.json = {"type": "save_weights_for_sampler" if for_sampler else "save_weights", "path": path}
            if for_sampler:  # the SDK's save_weights_and_get_sampling_client samples from it at once
                target = _SamplingTarget(trained.base_model, path, key)
                future.json["sampling_session_id"] = self._open_sampling(target)
            self._record(CallRecord(kind, model_id, time.perf_counter() - started, {}, {"path": path}))

        return self.submit(run, key)

    def load(self, model_id: str, key: str, path: str, with_optimizer: bool) -> Future:
        trained = self.model(model_id, key)
        folder = self._checkpoint_folder(path, key)

        def run(future: Future) -> None:
            trained.model.load(folder, with_optimizer)
            future.json = {"type": "load_weights", "path": path, "model_id": model_id}

        return self.submit(run, key)

    def _checkpoint_folder(self, path: str, key: str) -> Path:
        parts = path.removeprefix("tinker://").split("/") if path.startswith("tinker://") else []
        if len(parts) != 3 or parts[1] not in _KINDS or not _CHECKPOINT_NAME.match(parts[2]):
            raise LossRefused(f"path {path!r} is not a checkpoint path (tinker://<model_id>/weights/<name>)")
        self.model(parts[0], key)  # the checkpoint's training client must be one of this key's
        folder = self.root / parts[0] / parts[1] / parts[2]
        if not folder.is_dir():
            raise LossRefused(f"checkpoint {path!r} does not exist")
        return folder

    def checkpoints(self, model_id: str, key: str) -> list[dict[str, Any]]:
        self.model(model_id, key)
        found = []
        for kind, checkpoint_type in _KINDS.items():
            for folder in sorted((self.root / model_id / kind).glob("*")):
                stat = folder.stat()
                found.append(
                    {
                        "checkpoint_id": f"{kind}/{folder.name}",
                        "checkpoint_type": checkpoint_type,
                        "time": datetime.fromtimestamp(stat.st_mtime, UTC).isoformat(),
                        "tinker_path": f"tinker://{model_id}/{kind}/{folder.name}",
                        "size_bytes": sum(f.stat().st_size for f in folder.iterdir() if f.is_file()),
                    }
                )
        return found

    # --- sampling ------------------------------------------------------------------------------------

    def create_sampling_session(self, session_id: str, key: str, base_model: str | None, model_path: str | None) -> str:
        self.heartbeat(session_id, key)
        return self._open_sampling(self._sampling_target(base_model, model_path, key))

    def _open_sampling(self, target: _SamplingTarget) -> str:
        sampling_id = uuid.uuid4().hex
        with self._lock:
            self.sampling[sampling_id] = target
        return sampling_id

    def _sampling_target(self, base_model: str | None, model_path: str | None, key: str) -> _SamplingTarget:
        if model_path is not None:
            folder = self._checkpoint_folder(model_path, key)
            return _SamplingTarget(self.model(folder.parent.parent.name, key).base_model, model_path, key)
        if base_model is None:
            raise LossRefused("base_model or model_path is required")
        self._base_folder(base_model)
        return _SamplingTarget(base_model, None, key)

    def sample(self, request: dict[str, Any], key: str) -> Future:
        target = self._request_target(request, key)
        params = request.get("sampling_params") or {}
        prompt = _prompt_tokens(request.get("prompt") or {})
        num_samples = int(request.get("num_samples", 1))
        if not 1 <= num_samples <= 64:
            raise LossRefused(f"num_samples must be 1..64, got {num_samples}")
        want_prompt_logprobs = bool(request.get("prompt_logprobs"))

        def run(future: Future) -> None:
            started = time.perf_counter()
            model, adapter = self._sampler(target)
            settings = _sample_settings(params, model)
            samples = model.sample(prompt, settings, num_samples, adapter)
            prompt_scores = model.prompt_logprobs(prompt, adapter) if want_prompt_logprobs else None
            future.proto = encode_sample_response(samples, prompt_scores)
            detail = {"rows": _rollout_rows(model.tokenizer, prompt, samples), "model_path": target.model_path}
            tokens = float(sum(len(s.tokens) for s in samples))
            self._record(
                CallRecord("sample", _owner(target), time.perf_counter() - started, {"tokens": tokens}, detail)
            )

        return self.submit(run, key)

    def _request_target(self, request: dict[str, Any], key: str) -> _SamplingTarget:
        sampling_id = request.get("sampling_session_id")
        if sampling_id is None:
            return self._sampling_target(request.get("base_model"), request.get("model_path"), key)
        with self._lock:
            target = self.sampling.get(sampling_id)
        if target is None or target.key != key:
            raise LossRefused(f"sampling_session_id {sampling_id!r} is not open here for this key")
        if target.model_path is not None:
            self._checkpoint_folder(target.model_path, key)  # its training client still open (not cancelled)
        return target

    def _sampler(self, target: _SamplingTarget) -> tuple[TinkerModel, dict[str, Tensor] | None]:
        """The model that samples for ``target`` (runs on the worker thread): the checkpoint's training client
        with the saved adapter swapped in, or a copy of the base model without one."""
        if target.model_path is None:
            if target.base_model not in self._base_samplers:
                self._base_samplers[target.base_model] = TinkerModel(
                    self._base_folder(target.base_model), LoraSettings(1)
                )
            return self._base_samplers[target.base_model], None
        folder = self._checkpoint_folder(target.model_path, target.key)
        owner = self.model(folder.parent.parent.name, target.key).model
        if target.model_path not in self._adapters:
            self._adapters[target.model_path] = _saved_adapter(folder, owner)
        return owner, self._adapters[target.model_path]


def _owner(target: _SamplingTarget) -> str:
    return target.model_path.removeprefix("tinker://").split("/")[0] if target.model_path else ""


def _rollout_rows(tokenizer: Any, prompt: list[int], samples: list[Any]) -> list[dict[str, Any]]:
    """A sample call's sequences as rollouts (one group: they share the prompt), text decoded for the run page."""
    text = tokenizer.decode(prompt)
    return [
        {
            "prompt": text,
            "response": tokenizer.decode(s.tokens),
            "length": len(s.tokens),
            "finish_reason": s.stop_reason,
            "group": 0,
        }
        for s in samples
    ]


def _saved_adapter(folder: Path, model: TinkerModel) -> dict[str, Tensor]:
    """The saved adapter's tensors under the live model's parameter names (peft drops the adapter name on save)."""
    from safetensors.torch import load_file

    saved = load_file(str(folder / "adapter_model.safetensors"))
    live = {name for name, p in model.model.named_parameters() if p.requires_grad}
    mapped: dict[str, Tensor] = {}
    for name, tensor in saved.items():
        candidate = name.replace(".lora_A.weight", ".lora_A.default.weight").replace(
            ".lora_B.weight", ".lora_B.default.weight"
        )
        if candidate not in live:
            raise LossRefused(f"{folder.name}: the saved adapter does not fit its model ({name})")
        mapped[candidate] = tensor
    return mapped


def _prompt_tokens(prompt: dict[str, Any]) -> list[int]:
    tokens: list[int] = []
    for index, chunk in enumerate(prompt.get("chunks") or []):
        if chunk.get("type", "encoded_text") != "encoded_text":
            raise LossRefused(f"prompt.chunks[{index}]: only token chunks are served (no images or audio)")
        tokens.extend(int(t) for t in chunk.get("tokens") or [])
    if not tokens:
        raise LossRefused("prompt: no tokens")
    return tokens


def _sample_settings(params: dict[str, Any], model: TinkerModel) -> SampleSettings:
    stop = params.get("stop")
    stop_ids: tuple[int, ...]
    stop_strings: tuple[str, ...] = ()
    if stop is None:
        eos = model.tokenizer.eos_token_id
        stop_ids = () if eos is None else (int(eos),)
    elif isinstance(stop, str):
        stop_ids, stop_strings = (), (stop,)
    elif all(isinstance(s, int) for s in stop):
        stop_ids = tuple(int(s) for s in stop)
    else:
        stop_ids, stop_strings = (), tuple(str(s) for s in stop)
    max_tokens = int(params.get("max_tokens") or DEFAULT_MAX_TOKENS)
    if max_tokens < 1:
        raise LossRefused(f"sampling_params.max_tokens must be >= 1, got {max_tokens}")
    temperature = float(params.get("temperature", 1.0))
    if temperature < 0:
        raise LossRefused(f"sampling_params.temperature must be >= 0, got {temperature}")
    seed = params.get("seed")
    return SampleSettings(
        max_tokens=max_tokens,
        temperature=temperature,
        top_k=int(params.get("top_k", -1)),
        top_p=float(params.get("top_p", 1.0)),
        seed=None if seed is None else int(seed),
        stop_token_ids=stop_ids,
        stop_strings=stop_strings,
    )
