"""The dtype this host trains and generates in, when a run leaves `model.dtype: auto` (the default).

bfloat16 where the device computes in it natively: a CUDA GPU that supports it (Ampere and later), or a CPU
with AVX512-BF16, AMX-BF16 or Arm's BF16 instructions. float32 elsewhere: a CPU without those emulates bf16,
about six times slower than float32 on an AVX2 EPYC, and fp16 needs a loss scaler the CPU path does not have.
A run that names a dtype gets that dtype; `auto` is resolved once, by the engine's driver, before anything loads,
and the run folder's config.yaml records what it became. A host's admin may fix what `auto` becomes with
POSTTRAIN_AUTO_DTYPE (float32, bfloat16 or float16): the test suite does, so its numbers do not depend on which
CPU of the machine kind it lands on.

Standard library at import time; torch only inside the CUDA probe.
"""

from __future__ import annotations

import os
from pathlib import Path

AUTO = "auto"
OVERRIDE_ENV = "POSTTRAIN_AUTO_DTYPE"
CHOICES = ("float32", "bfloat16", "float16")
CPU_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})


def cpu_has_bf16(cpuinfo: str | None = None) -> bool:
    """Whether the CPU has bfloat16 instructions, by /proc/cpuinfo's `flags` (x86) or `Features` (Arm)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(errors="replace")
        except OSError:
            return False
    flags: set[str] = set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            flags.update(value.split())
    return bool(flags & CPU_BF16_FLAGS)


def cuda_has_bf16() -> bool | None:
    """Whether this process's CUDA device computes in bf16; None when it sees no CUDA device."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    return bool(torch.cuda.is_bf16_supported())


def host_dtype(on_cuda: bool) -> str:
    """The dtype for a policy on CUDA (`on_cuda`) or on this CPU. A driver that sees no GPU for roles that run on
    GPUs elsewhere (Ray actors) assumes bf16: every GPU the engine targets (DATASHEET_TFLOPS) has it."""
    fixed = os.environ.get(OVERRIDE_ENV, "").strip()
    if fixed:
        if fixed not in CHOICES:
            raise ValueError(f"{OVERRIDE_ENV}={fixed!r}: must be one of {', '.join(CHOICES)}")
        return fixed
    if on_cuda:
        return "float32" if cuda_has_bf16() is False else "bfloat16"
    return "bfloat16" if cpu_has_bf16() else "float32"


def training_dtype() -> str:
    """This machine's dtype for a model it both trains and serves: its CUDA device's, else its CPU's."""
    return host_dtype(on_cuda=cuda_has_bf16() is not None)
