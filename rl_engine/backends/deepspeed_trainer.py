"""DeepSpeed training backend: `TorchTrainer`'s update (same loss code, micro-batches as gradient
accumulation, one optimizer step per mini-batch, the LR schedule per RL step, PPO critic, reference
forward) run by DeepSpeed engines with ZeRO stage 0–3, optional optimizer offload, fp32 or bf16.

One process (rank 0 of a world of one), or one rank of a data-parallel world whose
RANK/WORLD_SIZE/MASTER_* the caller set (`rl_engine.distributed`'s trainer actors): DeepSpeed reduces
(ZeRO: reduce-scatters) the gradients in `step()`, the trainer's boundary. On the trainer's device:
DeepSpeed's CUDA accelerator and NCCL on a GPU, its CPU accelerator (DS_ACCELERATOR=cpu) and gloo on the
CPU; one process holds one accelerator.

JIT-compiled ops, compiled once per environment by the set-up step `python -m
rl_engine.backends.deepspeed_trainer build-ops` (`make install` runs it) into `TORCH_EXTENSIONS_DIR`
(default: `<venv>/torch_extensions`); a run never compiles. On CPU, DeepSpeed's communication layer loads
its shared-memory op (`deepspeed_shm_comm`) on every start, so a run whose op is missing stops with that
command (~100 s to build here). On CUDA hosts with nvcc the step also builds DeepSpeed's fused Adam
(`fused_adam`), which the trainer then uses on the GPU; without it (no nvcc, or a failed build) the
optimizer is torch's fused AdamW, and with optimizer offload a torch AdamW that DeepSpeed steps on the CPU
copy (its CPU Adam op is not built: 131 s to compile here).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import logging
import os
import socket
import sys
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rl_engine.config import RunConfig
from rl_engine.devices import policy_dtype
from rl_engine.trainer import TorchTrainer, ValueModel, refuse_rank_states

SETUP_COMMAND = "python -m rl_engine.backends.deepspeed_trainer build-ops"


# --- the process and its compiled ops ------------------------------------------------------------


def ops_dir() -> Path:
    return Path(os.environ.get("TORCH_EXTENSIONS_DIR") or Path(sys.prefix) / "torch_extensions")


def free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def single_process_env(device: torch.device | None = None) -> None:
    """Rank 0 of a world of one unless a launcher set the ranks (without them DeepSpeed looks for
    MPI), and DeepSpeed's CPU accelerator for a trainer on the CPU. Must run before `deepspeed` is
    imported: the accelerator is chosen at import."""
    if not torch.cuda.is_available() or (device is not None and device.type == "cpu"):
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(ops_dir()))
    if "RANK" not in os.environ:
        # A free port, not a fixed one: other runs on this machine have their own world of one.
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=free_port())


def _jit_op_builders() -> list[Any]:
    """The ops DeepSpeed compiles on first use in every run of this backend: only the shared-memory
    communication op, which `deepspeed.comm` loads on every start where it is compatible (CPU)."""
    import deepspeed
    from deepspeed.accelerator import get_accelerator
    from deepspeed.git_version_info import installed_ops

    builder = get_accelerator().create_op_builder("ShareMemCommBuilder")
    if builder is None or not deepspeed.ops.__compatible_ops__.get(builder.NAME, False):
        return []
    return [] if installed_ops.get(builder.NAME, False) else [builder]


def _fused_adam_builder() -> Any | None:
    """DeepSpeed's fused Adam op builder where it can build: a CUDA accelerator and nvcc."""
    from deepspeed.accelerator import get_accelerator

    if get_accelerator().device_name() != "cuda":
        return None
    builder = get_accelerator().create_op_builder("FusedAdamBuilder")
    try:
        return builder if builder is not None and builder.is_compatible(verbose=False) else None
    except Exception:
        return None


def _op_library(name: str) -> Path:
    return ops_dir() / name / f"{name}.so"


def _built(name: str) -> bool:
    return _op_library(name).exists()


def build_ops() -> dict[str, float | str]:
    """The set-up step: compiles the JIT ops into `ops_dir()` (or finds them cached there); returns
    seconds per op, or for the optional fused Adam the reason it did not build."""
    single_process_env()
    seconds: dict[str, float | str] = {}
    for builder in _jit_op_builders():
        started = time.perf_counter()
        with contextlib.redirect_stdout(sys.stderr):
            builder.load(verbose=False)
        seconds[builder.NAME] = time.perf_counter() - started
    fused = _fused_adam_builder()
    if fused is not None:
        started = time.perf_counter()
        try:
            with contextlib.redirect_stdout(sys.stderr):
                fused.load(verbose=False)
            seconds[fused.NAME] = time.perf_counter() - started
        except Exception as exc:
            seconds[fused.NAME] = f"not built: {type(exc).__name__}: {str(exc)[:300]}"
    return seconds


def missing_ops() -> list[str]:
    return [b.NAME for b in _jit_op_builders() if not _built(b.NAME)]


def fused_adam_problem() -> str | None:
    """Why DeepSpeed's fused Adam cannot be used here, or None when it can: it needs a CUDA accelerator with nvcc,
    the set-up step's build (a run never compiles it), and that build must load (a library built for another GPU
    architecture or CUDA, or against another torch, exists but does not)."""
    if _fused_adam_builder() is None:
        return "no CUDA accelerator with nvcc for DeepSpeed's op builder"
    library = _op_library("fused_adam")
    if not library.exists():
        return f"not built in {ops_dir()} (run `{SETUP_COMMAND}`)"
    return _load_problem(library)


@functools.cache
def _load_problem(library: Path) -> str | None:
    """Imports the op's extension module as torch's JIT loader does (importlib, from the build folder), so a later
    load by DeepSpeed finds it initialised; what went wrong, or None."""
    spec = importlib.util.spec_from_file_location(library.stem, library)
    if spec is None or spec.loader is None:
        return f"{library} is no loadable extension module"
    try:
        spec.loader.exec_module(importlib.util.module_from_spec(spec))
    except (ImportError, OSError) as exc:
        return f"{library} does not load: {type(exc).__name__}: {exc}"[:500]
    return None


def fused_adam_ready() -> bool:
    """Whether DeepSpeed's fused Adam was built here by the set-up step and loads (see `fused_adam_problem`)."""
    return fused_adam_problem() is None


def prepare(device: torch.device | None = None) -> None:
    """Process set-up before DeepSpeed's first distributed call; refuses to compile ops in a run, and a
    trainer device other than the accelerator DeepSpeed chose for this process."""
    single_process_env(device)
    missing = missing_ops()
    if missing:
        raise RuntimeError(
            f"DeepSpeed op(s) {', '.join(missing)} not built in {ops_dir()}: run `{SETUP_COMMAND}` "
            "once in this environment (make install does), or set TORCH_EXTENSIONS_DIR to where they are"
        )
    import deepspeed
    from deepspeed.accelerator import get_accelerator

    if device is not None and get_accelerator().device_name() != device.type:
        raise RuntimeError(
            f"DeepSpeed runs on {get_accelerator().device_name()} in this process (DS_ACCELERATOR="
            f"{os.environ.get('DS_ACCELERATOR', 'unset')}), the trainer on {device}: one process holds one "
            "DeepSpeed accelerator"
        )

    # DeepSpeed logs its warnings to stdout, where the CLI writes its JSON result. Only its own plain
    # StreamHandler moves (others, like pytest's capture handlers, subclass it).
    for handler in deepspeed.utils.logger.handlers:
        if type(handler) is logging.StreamHandler:
            handler.setStream(sys.stderr)


# --- configuration -------------------------------------------------------------------------------


def deepspeed_config(cfg: RunConfig, hidden_size: int | None = None) -> dict[str, Any]:
    be, train = cfg.backends, cfg.train
    zero: dict[str, Any] = {"stage": be.zero_stage}
    if be.offload:
        zero["offload_optimizer"] = {"device": "cpu"}
    if be.zero_stage == 3 and hidden_size:
        # transformers' "auto": norms and biases stay whole, saving a gather per layer for tiny tensors.
        zero["stage3_param_persistence_threshold"] = 10 * hidden_size
    return {
        "train_micro_batch_size_per_gpu": train.micro_batch_size,
        "gradient_accumulation_steps": 1,
        # The trainer owns accumulation: a mini-batch has as many micro-batches as it has (dynamic
        # sampling changes the count), each loss already weighted by its share; step() is the boundary.
        "managed_gradient_accumulation": False,
        # Without a wrapper DeepSpeed would clip without reporting the norm: the trainer clips then.
        "gradient_clipping": (train.grad_clip or 0.0) if _wraps_optimizer(cfg) else 0.0,
        "zero_optimization": zero,
        "bf16": {"enabled": policy_dtype(cfg) == "bfloat16"},
        # A torch AdamW: nothing to compile, and the same update as TorchTrainer's.
        "zero_allow_untested_optimizer": True,
        "zero_force_ds_cpu_optimizer": False,
    }


def _wraps_optimizer(cfg: RunConfig) -> bool:
    """Whether DeepSpeed wraps the optimizer (ZeRO, or bf16 with fp32 master weights); at stage 0 in
    fp32 it steps the client optimizer on the module's own gradients."""
    return cfg.backends.zero_stage > 0 or policy_dtype(cfg) != "float32"


@contextmanager
def model_construction(cfg: RunConfig, device: torch.device | None = None) -> Iterator[None]:
    """Models loaded inside are partitioned as they load under ZeRO-3 (`from_pretrained` reads the
    config through `HfDeepSpeedConfig` and builds under `zero.Init`, onto `device`, the current CUDA
    device on a GPU); a no-op for stages 0–2."""
    if cfg.backends.zero_stage != 3:
        yield
        return
    prepare(device)
    from transformers.integrations import HfDeepSpeedConfig
    from transformers.integrations.deepspeed import unset_hf_deepspeed_config

    active = HfDeepSpeedConfig(deepspeed_config(cfg))  # noqa: F841 -- transformers holds only a weakref
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        # Anything loaded later (a reward model) must stay a plain module.
        unset_hf_deepspeed_config()


# --- the trainer ---------------------------------------------------------------------------------


class DeepSpeedTrainer(TorchTrainer):
    """`TorchTrainer` whose policy (and critic) run as DeepSpeed engines around the very same AdamW
    and LambdaLR; under ZeRO-3 the reference model runs as an engine too (its weights are partitioned)."""

    def __init__(
        self,
        cfg: RunConfig,
        model: nn.Module,
        ref_model: nn.Module | None,
        critic: ValueModel | None,
        *,
        rank: int = 0,
        world: int = 1,
        device: torch.device | None = None,
    ):
        prepare(device)  # before the optimizer: DeepSpeed's fused Adam needs DeepSpeed imported
        super().__init__(cfg, model, ref_model, critic, rank=rank, world=world, device=device)
        import deepspeed

        self.stage = cfg.backends.zero_stage
        self.wrapped = _wraps_optimizer(cfg)
        config = deepspeed_config(cfg, getattr(model.config, "hidden_size", None))
        with contextlib.redirect_stdout(sys.stderr):
            self.engine = deepspeed.initialize(model=model, optimizer=self.optimizer, config=config)[0]
            self.critic_engine = None
            if critic is not None:
                self.critic_engine = deepspeed.initialize(model=critic, optimizer=self.critic_optimizer, config=config)[
                    0
                ]
            self.ref_engine = None
            if ref_model is not None and self.stage == 3:
                self.ref_engine = deepspeed.initialize(model=ref_model, config=config)[0]

    def _adamw(self, params: list[nn.Parameter], lr: float) -> torch.optim.Optimizer:
        """DeepSpeed's fused Adam (AdamW mode) on a GPU when the set-up step built it; with optimizer
        offload a plain torch AdamW, which DeepSpeed steps on the CPU copy; torch's otherwise."""
        train = self.cfg.train
        if self.cfg.backends.offload:
            return torch.optim.AdamW(params, lr=lr, betas=train.betas, weight_decay=train.weight_decay)
        if self.device.type == "cuda" and fused_adam_ready():
            from deepspeed.ops.adam import FusedAdam

            return FusedAdam(params, lr=lr, betas=train.betas, weight_decay=train.weight_decay, adam_w_mode=True)
        return super()._adamw(params, lr)

    # --- the hooks -------------------------------------------------------------------------------

    def _runner(self, which: str) -> nn.Module:
        if which == "policy":
            return self.engine
        if which == "critic":
            return self.critic_engine
        return self.ref_engine if self.ref_engine is not None else self.ref_model

    def _backward(self, loss: torch.Tensor, which: str) -> None:
        engine = self._engine_of(which)
        engine.backward(loss, scale_wrt_gas=False)  # each micro-batch's loss is already weighted by its share

    def _zero_grad(self) -> None:
        pass  # each engine zeroes its gradients when it steps; nothing accumulates between mini-batches

    def _clip_and_step(self, which: str) -> torch.Tensor | float:
        engine = self._engine_of(which)
        if not self.wrapped:
            # The gradients are the module's own: averaged over the ranks first (DeepSpeed's own
            # reduction in step() then averages equal tensors), clipped as TorchTrainer does.
            self._average_gradients(engine.module)
            clip = self.cfg.train.grad_clip
            norm = torch.nn.utils.clip_grad_norm_(engine.module.parameters(), clip if clip else float("inf"))
            engine.step()
            return norm.detach()
        engine.step()
        return engine.get_global_grad_norm()

    def _engine_of(self, which: str) -> Any:
        """The engine that trains `which` ("policy", "critic"; the critic's runs only with a critic, ppo)."""
        if which == "policy":
            return self.engine
        assert self.critic_engine is not None  # __init__ makes it with the critic
        return self.critic_engine

    # --- weights ---------------------------------------------------------------------------------

    def full_weights(self) -> AbstractContextManager[None]:
        return _gathered(self.model) if self.stage == 3 else nullcontext()

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        if self.stage != 3:
            return super().full_state_dict()
        with self.full_weights():
            return _copies(super().full_state_dict())  # the gathered weights are freed on leaving

    def adapter_state_dict(self) -> dict[str, torch.Tensor] | None:
        if self.stage != 3:
            return super().adapter_state_dict()
        with self.full_weights():
            adapter = super().adapter_state_dict()
            return None if adapter is None else _copies(adapter)

    # --- state -----------------------------------------------------------------------------------

    def _format(self) -> str:
        return f"deepspeed zero_stage={self.stage} dtype={policy_dtype(self.cfg)}"

    def state_dict(self) -> dict[str, Any]:
        # A wrapper's state holds the fp32 master weights besides AdamW's moments: a resumed bf16 run
        # continues from them, not from the rounded weights in the HF checkpoint.
        state = {
            "format": self._format(),
            "optimizer": self.engine.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "generator": self.generator.get_state(),
        }
        if self.critic is not None:
            with _gathered(self.critic) if self.stage == 3 else nullcontext():
                state["critic"] = _copies(self.critic.state_dict())
            state["critic_optimizer"] = self._engine_of("critic").optimizer.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        refuse_rank_states(state)
        if state.get("format") != self._format():
            raise ValueError(
                f"the checkpoint's trainer state is from {state.get('format') or 'the torch backend'}, "
                f"this run is {self._format()}: resume with the backend settings it was written with"
            )
        self._load_optimizer(self.engine, state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.generator.set_state(state["generator"])
        if self.critic is not None:
            with _gathered(self.critic, modifier_rank=0) if self.stage == 3 else nullcontext():
                self.critic.load_state_dict(state["critic"])
            self._load_optimizer(self._engine_of("critic"), state["critic_optimizer"])

    def _load_optimizer(self, engine: Any, state: dict[str, Any]) -> None:
        # As DeepSpeed's own load_checkpoint does. Any fp32 master weights come from the state (ZeRO-3
        # also rewrites the module's partitions from them); stage 0's optimizer is AdamW itself, or
        # the bf16 wrapper, which restores its masters too.
        if self.stage == 0:
            engine.optimizer.load_state_dict(state)
        else:
            engine.optimizer.load_state_dict(
                state_dict_list=[state], load_optimizer_states=True, load_from_fp32_weights=True
            )


def _gathered(module: nn.Module, modifier_rank: int | None = None) -> AbstractContextManager[None]:
    import deepspeed

    return deepspeed.zero.GatheredParameters(list(module.parameters()), modifier_rank=modifier_rank)


def _copies(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Copies of `state`'s tensors; entries that shared storage (tied embeddings) share their copy,
    so `save_pretrained` still recognises them as tied."""
    made: dict[tuple[int, tuple[int, ...]], torch.Tensor] = {}
    out = {}
    for name, tensor in state.items():
        key = (tensor.data_ptr(), tuple(tensor.shape))
        if key not in made:
            made[key] = tensor.detach().clone()
        out[name] = made[key]
    return out


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args != ["build-ops"]:
        print(f"usage: {SETUP_COMMAND}", file=sys.stderr)
        return 2
    built = build_ops()
    for name, seconds in built.items():
        print(
            f"{name}: ready in {ops_dir() / name} ({seconds:.1f} s)"
            if isinstance(seconds, float)
            else f"{name}: {seconds}"
        )
    if not built:
        print("no DeepSpeed JIT op needed here")
    return 0


if __name__ == "__main__":
    sys.exit(main())
