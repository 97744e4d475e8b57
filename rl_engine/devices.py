"""Where a role's models and batches live, and what the device can do.

A role (the one-process hybrid engine, a trainer rank, a rollout engine, the reference or reward worker)
runs on CUDA when the run's `placement.device` asks for it: `cuda`, or `auto` when placement reserves a GPU
for the role (`gpus_per_trainer`, `gpus_per_rollout_engine`). Ray gives an actor the GPUs its bundle
reserves and sets CUDA_VISIBLE_DEVICES to them, so a role's GPU is always `cuda:<current device>` of its
own process. The hybrid engine is the driver itself: the platform asks Ray for its GPU when it submits the
run (`rl_engine.distributed.placement.driver_gpus`). A role that is to run on CUDA in a process that sees
none is refused naming `placement.device`, before anything loads.

Dtype: `model.dtype: auto` (the default) becomes bf16 where the policy's device computes in it natively, else
float32 (`with_host_dtype`, once, in the driver, before anything loads).

Precision: with bf16 the torch trainer keeps fp32 master weights, which AdamW steps, and computes in bf16
under `torch.autocast` (the `Precision` below), on CUDA and on the CPU. DeepSpeed keeps its own fp32 masters
around bf16 weights. fp16 stays pure fp16.

Peak FLOP/s for MFU: the config's `placement.device_peak_tflops`, else the device's dense datasheet rate
for the compute dtype (`DATASHEET_TFLOPS`), else none (no MFU is logged).
"""

from __future__ import annotations

import os
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch

from rl_engine.config import ConfigError, RunConfig
from rl_engine.host_dtype import AUTO, host_dtype

GiB = 2**30
# The run's `model.dtype` as a torch dtype (the trainer, the LoRA base and the loaders all read it here).
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

# Dense (no sparsity) peak TFLOP/s from the vendors' datasheets: (bf16/fp16 tensor cores, plain fp32).
# Matched against torch.cuda.get_device_name() in this order, so the specific parts come first.
DATASHEET_TFLOPS: tuple[tuple[str, float, float], ...] = (
    ("H200 NVL", 835.5, 60.0),
    ("H200", 989.4, 66.9),
    ("H100 NVL", 835.5, 60.0),
    ("H100 PCIe", 756.5, 51.2),
    ("H100", 989.4, 66.9),  # SXM: "NVIDIA H100 80GB HBM3"
    ("A100", 312.0, 19.5),
    ("L40S", 362.05, 91.6),
    ("L4", 121.0, 30.3),
    ("RTX 4090", 165.2, 82.6),
)


def _refuse(msg: str, loc: str = "placement.device") -> ConfigError:
    return ConfigError([{"loc": loc, "msg": msg}])


def resolve_device(cfg: RunConfig, gpus: float, role: str = "engine") -> torch.device:
    """The device of a role whose placement reserves `gpus` GPUs: CUDA for `cuda`, and for `auto` when the
    role has a GPU; refused with an error naming `placement.device` when CUDA is wanted and this process
    sees none."""
    requested = cfg.placement.device
    if requested == "cpu" or (requested == "auto" and gpus <= 0):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        why = "device is 'cuda'" if requested == "cuda" else f"placement reserves {gpus:g} GPU for it"
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        raise _refuse(
            f"the {role} is to run on CUDA ({why}) but this process sees no CUDA device (torch "
            f"{torch.__version__}, built for CUDA {torch.version.cuda or 'none'}"
            + (f", CUDA_VISIBLE_DEVICES={visible!r}" if visible is not None else "")
            + "); use device: cpu, or run where a GPU is visible"
        )
    return torch.device("cuda", torch.cuda.current_device())


def policy_dtype(cfg: RunConfig) -> str:
    """The policy's dtype: the one the config names, or for `auto` the host's for where the policy runs
    (rl_engine/host_dtype.py: bf16 on CUDA devices that have it and on CPUs with native bf16, else float32)."""
    if cfg.model.dtype != AUTO:
        return cfg.model.dtype
    pl = cfg.placement
    return host_dtype(on_cuda=pl.device == "cuda" or (pl.device == "auto" and pl.gpus_per_trainer > 0))


def with_host_dtype(cfg: RunConfig) -> RunConfig:
    """The config with `model.dtype: auto` made concrete (`policy_dtype`), so the run folder's config.yaml and
    the Ray actors it is sent to read what the driver chose."""
    if cfg.model.dtype != AUTO:
        return cfg
    return cfg.model_copy(update={"model": cfg.model.model_copy(update={"dtype": policy_dtype(cfg)})})


def weight_transfer(cfg: RunConfig, rollout_device: torch.device) -> str:
    """How a weight sync reaches a vLLM engine on `rollout_device`: "file" (a safetensors file in /dev/shm;
    the CPU, and the transformers backend, which loads it itself), "ipc" from a trainer on the engine's GPU
    (the hybrid engine, or bundle i's rank and engine when colocated), "nccl" from trainer rank 0 to
    engines on GPUs of their own (`separate`)."""
    from rl_engine.distributed.placement import uses_actors

    pl = cfg.placement
    if cfg.backends.rollout != "vllm" or rollout_device.type != "cuda":
        return "file"
    if pl.mode == "separate":
        return "nccl" if pl.gpus_per_trainer > 0 else "file"
    if uses_actors(cfg) and pl.rollout_engines != pl.trainer_ranks:
        return "file"  # an engine without a trainer rank on its GPU has no CUDA IPC peer
    return "ipc"


def use_device(device: torch.device) -> None:
    """Makes `device` this process's current CUDA device (libraries that take "cuda" mean it)."""
    if device.type == "cuda":
        torch.cuda.set_device(device)


# --- precision -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Precision:
    """How a role's models hold and compute: `master` is the dtype of the weights that train (and that
    the optimizer steps), `compute` the dtype the matmuls run in. They differ only under autocast."""

    device: torch.device
    master: torch.dtype
    compute: torch.dtype

    @property
    def mixed(self) -> bool:
        return self.master != self.compute

    def autocast(self) -> AbstractContextManager[Any]:
        """Forward passes run inside: the compute dtype under mixed precision, else nothing changes."""
        if not self.mixed:
            return nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.compute)


def precision_for(cfg: RunConfig, device: torch.device) -> Precision:
    """fp32 masters with bf16 compute for the torch trainer, on CUDA and on a CPU alike (what HF Trainer's
    `bf16=True` and FSDP's mixed precision do: an AdamW step of lr 1e-6 on bf16 weights rounds away); the run's
    dtype as is everywhere else (DeepSpeed keeps its own masters; fp16 would need a loss scaler, so it stays pure
    fp16)."""
    dtype = DTYPES[policy_dtype(cfg)]
    if dtype == torch.bfloat16 and cfg.backends.training == "torch":
        return Precision(device, torch.float32, dtype)
    return Precision(device, dtype, dtype)


# --- what the device can do, what it used --------------------------------------------------------


def peak_flops(device: torch.device, compute: torch.dtype, override_tflops: float | None) -> float | None:
    """Peak FLOP/s of `device` for matmuls in `compute`: the config's override, else the datasheet rate
    of a known GPU; None (no MFU) otherwise, the CPU included."""
    if override_tflops:
        return override_tflops * 1e12
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for marker, tensor_tflops, fp32_tflops in DATASHEET_TFLOPS:
        if marker in name:
            return (fp32_tflops if compute == torch.float32 else tensor_tflops) * 1e12
    return None


def gpu_peak_gb(device: torch.device | None) -> float | None:
    """Peak GPU memory this process's tensors held on `device` since it started, in GiB; None (the metric
    is left out, not logged as 0) for a role on the CPU."""
    if device is None or device.type != "cuda":
        return None
    return torch.cuda.max_memory_allocated(device) / GiB


def gpu_memory_metrics(role: str, device: torch.device | None) -> dict[str, float]:
    peak = gpu_peak_gb(device)
    return {} if peak is None else {f"memory/{role}_gpu_peak_gb": peak}
