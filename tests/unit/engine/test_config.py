"""The run-config contract: defaults, YAML/JSON round trips, JSON schema, field-level errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from rl_engine.config import (
    REWARD_TYPES,
    ConfigError,
    RunConfig,
    check_runnable,
    config_json_schema,
    dump_config,
    load_config,
    validate_config,
)
from tests.unit.engine.helpers import DELETE, minimal, with_changes


def error_locs(data: dict[str, Any]) -> list[str]:
    with pytest.raises(ConfigError) as info:
        validate_config(data)
    return [e["loc"] for e in info.value.errors]


def full_config() -> RunConfig:
    """A config that sets (nearly) every field away from its default."""
    return validate_config(
        {
            "name": "full run 1.0",
            "seed": 7,
            "description": "everything set",
            "model": {
                "path": "models/tiny",
                "tokenizer_path": "models/tok",
                "dtype": "bfloat16",
                "trust_remote_code": True,
                "gradient_checkpointing": True,
            },
            "data": {
                "path": "data/train.parquet",
                "format": "parquet",
                "prompt_field": "question",
                "label_field": None,
                "eval_fraction": 0.1,
                "eval_size": 200,
                "apply_chat_template": True,
                "system_prompt": "Think step by step.",
                "max_prompt_tokens": 256,
                "shuffle": False,
            },
            "rewards": [
                {"type": "exact_match", "weight": 0.5, "normalize": False, "numeric": False},
                {"type": "boxed_math", "name": "math"},
                {"type": "regex", "pattern": r"^\d+$", "full_match": True, "score_match": 2.0, "score_miss": -1.0},
                {"type": "length_penalty", "max_chars": 400, "coef": 0.01},
                {
                    "type": "python",
                    "path": "r.py",
                    "function": "compute_score",
                    "timeout_s": 5,
                    "memory_mb": 256,
                    "batch": False,
                },
                {
                    "type": "http",
                    "url": "https://rm.example:8000/get_reward",
                    "retries": 0,
                    "backoff_s": 1.5,
                    "batch_size": 8,
                    "headers": {"Authorization": "Bearer x"},
                },
                {"type": "reward_model", "path": "models/rm", "batch_size": 4, "max_length": 512, "dtype": "float16"},
                {"type": "reasoning_gym", "answer": "whole", "timeout_s": 5},
                {"type": "verifiers", "files": ["my_env.py"], "timeout_s": 20},
            ],
            "algorithm": {
                "name": "ppo",
                "gamma": 0.99,
                "lam": 0.9,
                "clip_low": 0.2,
                "clip_high": 0.28,
                "dual_clip": 3.0,
                "entropy_coef": 0.001,
                "kl": {"coef": 0.05, "estimator": "k1", "placement": "reward"},
                "loss_agg": "seq_mean_token_sum_norm",
                "normalize_advantage_std": True,
                "value_clip": None,
                "value_coef": 1.0,
                "critic_lr": 5e-6,
                "dynamic_sampling": True,
                "overlong": {"enabled": True, "buffer_tokens": 16, "penalty": 0.5},
            },
            "rollout": {
                "prompts_per_step": 16,
                "samples_per_prompt": 4,
                "temperature": 0.7,
                "top_p": 0.95,
                "top_k": 50,
                "max_new_tokens": 128,
                "stop": ["</answer>", "\n\n"],
            },
            "train": {
                "steps": 3,
                "lr": 3e-6,
                "weight_decay": 0.01,
                "betas": [0.9, 0.95],
                "warmup_steps": 1,
                "lr_schedule": "cosine",
                "epochs_per_batch": 2,
                "mini_batch_size": 32,
                "micro_batch_size": 4,
                "grad_clip": None,
            },
            "backends": {
                "rollout": "vllm",
                "training": "deepspeed",
                "zero_stage": 3,
                "offload": True,
                "vllm_kv_cache_gb": 2.5,
                "async_rollout": True,
            },
            "placement": {
                "mode": "separate",
                "rollout_engines": 2,
                "trainer_ranks": 2,
                "cpus_per_rollout_engine": 0.5,
                "cpus_per_trainer": 2,
                "gpus_per_rollout_engine": 1,
                "gpus_per_trainer": 0.5,
            },
            "checkpoint": {"every_steps": 50, "keep_last": 3, "save_final": False},
            "logging": {
                "run_dir": "/tmp/runs/x",
                "eval_every": 0,
                "eval_size": 100,
                "eval_max_new_tokens": 256,
                "samples": "none",
                "heartbeat_s": 2.5,
            },
        }
    )


# --- valid configs -------------------------------------------------------------------------


def test_minimal_config_is_valid_and_fills_in_defaults():
    cfg = validate_config(minimal())

    assert cfg.schema_version == 1
    assert cfg.algorithm.name == "grpo"
    assert cfg.rollout.samples_per_prompt == 8
    assert cfg.train.micro_batch_size == 8
    assert cfg.data.eval_fraction == 0.0
    assert cfg.backends.training == "torch"
    assert cfg.samples_per_step == 32 * 8


def test_reward_name_defaults_to_its_type():
    cfg = validate_config(
        with_changes({"rewards": [{"type": "boxed_math"}, {"type": "regex", "pattern": "x", "name": "fmt"}]})
    )

    assert [r.name for r in cfg.rewards] == ["boxed_math", "fmt"]


def test_reward_spec_dump_without_weight_is_type_plus_constructor_kwargs():
    cfg = full_config()

    for spec in cfg.rewards:
        kwargs = spec.model_dump(exclude={"weight", "max_error_rate"})  # the run's, not the component's
        assert kwargs == spec.to_component_kwargs()
        assert kwargs["type"] == spec.type and kwargs["name"] == spec.name
        assert "weight" not in kwargs
    assert cfg.rewards[2].to_component_kwargs() == {
        "type": "regex",
        "name": "regex",
        "pattern": r"^\d+$",
        "full_match": True,
        "score_match": 2.0,
        "score_miss": -1.0,
    }
    assert {r.type for r in cfg.rewards} == set(REWARD_TYPES)


@pytest.mark.parametrize(
    "changes",
    [
        pytest.param({"algorithm.name": "ppo", "rollout.samples_per_prompt": 1}, id="ppo-with-one-sample"),
        pytest.param(
            {"algorithm.name": "reinforce_pp", "rollout.samples_per_prompt": 1}, id="reinforce_pp-with-one-sample"
        ),
        pytest.param(
            {"algorithm.name": "reinforce_pp", "algorithm.kl": {"coef": 0.1, "placement": "reward"}},
            id="kl-in-reward-for-reinforce_pp",
        ),
        pytest.param({"algorithm.name": "dr_grpo", "algorithm.loss_agg": "token_mean"}, id="dr_grpo-with-token-mean"),
        pytest.param({"algorithm.clip_low": 0.3, "algorithm.clip_high": 0.1}, id="clip-high-below-clip-low"),
        pytest.param({"backends.async_rollout": True}, id="async-rollout-with-transformers"),
        pytest.param({"logging.eval_every": 10}, id="eval-every-without-eval-data"),
        pytest.param({"data.eval_path": "data/test.jsonl"}, id="eval-path-alone"),
        pytest.param(
            {"backends.training": "deepspeed", "backends.zero_stage": 2, "backends.offload": True}, id="zero2-offload"
        ),
        pytest.param(
            {
                "rollout.prompts_per_step": 4,
                "rollout.samples_per_prompt": 4,
                "train.mini_batch_size": 8,
                "train.micro_batch_size": 2,
            },
            id="mini-batch-of-whole-groups",
        ),
        pytest.param(
            {"rollout.prompts_per_step": 3, "rollout.samples_per_prompt": 2, "train.micro_batch_size": 6},
            id="micro-equals-step",
        ),
        pytest.param({"algorithm.dual_clip": 3.0}, id="dual-clip"),
        pytest.param({"rollout.top_k": 20}, id="top-k"),
    ],
)
def test_valid_edge_configs_are_accepted(changes):
    validate_config(with_changes(changes))


def test_helper_properties():
    cfg = validate_config(
        with_changes({"rollout.prompts_per_step": 5, "rollout.samples_per_prompt": 4, "train.micro_batch_size": 4})
    )
    assert cfg.samples_per_step == 20
    assert cfg.algorithm.is_group_estimator and not cfg.algorithm.needs_critic

    ppo = validate_config(with_changes({"algorithm.name": "ppo"}))
    assert ppo.algorithm.needs_critic and not ppo.algorithm.is_group_estimator
    for name in ("grpo", "dr_grpo", "rloo", "reinforce_pp_baseline"):
        assert validate_config(with_changes({"algorithm.name": name})).algorithm.is_group_estimator
    assert not validate_config(with_changes({"algorithm.name": "reinforce_pp"})).algorithm.is_group_estimator


# --- YAML / JSON import and export ---------------------------------------------------------


def test_yaml_round_trip_is_lossless():
    cfg = full_config()

    assert load_config(dump_config(cfg)) == cfg
    assert load_config(dump_config(validate_config(minimal()))) == validate_config(minimal())


def test_yaml_round_trip_without_defaults_is_lossless_and_short():
    cfg = validate_config(
        with_changes({"rewards": [{"type": "regex", "pattern": "a", "weight": 2.0}], "train.lr": 1e-4})
    )

    text = dump_config(cfg, exclude_defaults=True)

    assert load_config(text) == cfg
    assert "rollout" not in text and "lr: 0.0001" in text


def test_yaml_dump_keeps_declaration_order():
    text = dump_config(full_config())
    top = [line.split(":")[0] for line in text.splitlines() if line and not line.startswith((" ", "-"))]

    assert top == list(RunConfig.model_fields)
    # reward items start with their type, the discriminator
    assert "rewards:\n- type: exact_match\n" in text


def test_json_text_and_files_load(tmp_path: Path):
    cfg = full_config()
    json_text = cfg.model_dump_json()
    yaml_file = tmp_path / "run.yaml"
    yaml_file.write_text(dump_config(cfg))
    json_file = tmp_path / "run.json"
    json_file.write_text(json_text)

    assert load_config(json_text) == cfg
    assert load_config(yaml_file) == cfg
    assert load_config(str(yaml_file)) == cfg
    assert load_config(json_file) == cfg


def test_missing_config_file_is_a_config_error(tmp_path: Path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(str(tmp_path / "nope.yaml"))
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "nope.yaml")


@pytest.mark.parametrize(
    ("text", "line"),
    [
        pytest.param("name: x\nmodel:\n  path: m\n   dtype: float32\n", 4, id="bad-indent"),
        pytest.param("name: x\nrewards: [\n  {type: exact_match}\n", 4, id="unclosed-bracket"),
        pytest.param("name: x\nmodel: {path: m}\ndata: {path: d}\nname: y\n", 4, id="duplicate-key"),
        pytest.param('{"name": "x",\n "model": {"path": "m"\n', 3, id="broken-json"),
    ],
)
def test_yaml_syntax_error_names_the_line(text, line):
    with pytest.raises(ConfigError) as info:
        load_config(text)

    assert f"line {line}" in str(info.value)
    assert info.value.errors[0]["loc"] == ""


@pytest.mark.parametrize("text", ["", "# only a comment\n", "- a\n- b\n", "just a string"])
def test_config_that_is_not_a_mapping_is_rejected(text):
    with pytest.raises(ConfigError):
        load_config(text)


# --- JSON schema -----------------------------------------------------------------------------


def test_json_schema_has_a_description_for_every_field():
    schema = config_json_schema()
    json.dumps(schema)  # serialisable as is
    models = {"RunConfig": schema, **schema["$defs"]}
    missing = [
        f"{model}.{field}"
        for model, definition in models.items()
        for field, prop in definition.get("properties", {}).items()
        if not prop.get("description")
    ]

    assert missing == []
    assert len(models) >= 18  # run, 11 sections/sub-sections, 7 reward kinds
    for section in ("model", "data", "algorithm", "rollout", "train", "backends", "placement", "checkpoint", "logging"):
        assert schema["properties"][section]["$ref"].startswith("#/$defs/")


def test_json_schema_describes_rewards_as_a_discriminated_union():
    items = config_json_schema()["properties"]["rewards"]["items"]

    assert items["discriminator"]["propertyName"] == "type"
    assert set(items["discriminator"]["mapping"]) == set(REWARD_TYPES)


# --- invalid configs -------------------------------------------------------------------------

INVALID = [
    # (id, changes, the one expected error loc)
    ("typo-top-level-key", {"algoritm": {"name": "ppo"}}, "algoritm"),
    ("typo-nested-key", {"rollout.sample_per_prompt": 4}, "rollout.sample_per_prompt"),
    ("typo-reward-key", {"rewards.0.normalise": False}, "rewards.0.normalise"),
    ("negative-lr", {"train.lr": -1e-5}, "train.lr"),
    ("nan-lr", {"train.lr": float("nan")}, "train.lr"),
    ("zero-steps", {"train.steps": 0}, "train.steps"),
    ("betas-out-of-range", {"train.betas": [0.9, 1.0]}, "train.betas"),
    ("grpo-with-one-sample", {"rollout.samples_per_prompt": 1}, "rollout.samples_per_prompt"),
    ("rloo-with-one-sample", {"algorithm.name": "rloo", "rollout.samples_per_prompt": 1}, "rollout.samples_per_prompt"),
    (
        "dynamic-sampling-with-one-sample",
        {"algorithm.name": "ppo", "algorithm.dynamic_sampling": True, "rollout.samples_per_prompt": 1},
        "algorithm.dynamic_sampling",
    ),
    ("bad-regex", {"rewards": [{"type": "regex", "pattern": "(unclosed"}]}, "rewards.0.pattern"),
    ("regex-without-pattern", {"rewards": [{"type": "regex"}]}, "rewards.0.pattern"),
    (
        "mini-batch-splits-groups",
        {
            "rollout.prompts_per_step": 4,
            "rollout.samples_per_prompt": 8,
            "train.mini_batch_size": 4,
            "train.micro_batch_size": 4,
        },
        "train.mini_batch_size",
    ),
    (
        "mini-batch-does-not-divide-step",
        {"rollout.prompts_per_step": 3, "rollout.samples_per_prompt": 8, "train.mini_batch_size": 16},
        "train.mini_batch_size",
    ),
    (
        "micro-does-not-divide-mini",
        {"train.mini_batch_size": 16, "train.micro_batch_size": 6},
        "train.micro_batch_size",
    ),
    (
        "micro-does-not-divide-step",
        {"rollout.prompts_per_step": 3, "rollout.samples_per_prompt": 2, "train.micro_batch_size": 4},
        "train.micro_batch_size",
    ),
    ("zero-stage-without-deepspeed", {"backends.zero_stage": 2}, "backends.zero_stage"),
    ("unknown-zero-stage", {"backends.training": "deepspeed", "backends.zero_stage": 4}, "backends.zero_stage"),
    ("offload-without-zero", {"backends.training": "deepspeed", "backends.offload": True}, "backends.offload"),
    ("unknown-algorithm", {"algorithm.name": "dpo"}, "algorithm.name"),
    ("unknown-reward-type", {"rewards": [{"type": "bleu"}]}, "rewards.0.type"),
    ("reward-without-type", {"rewards": [{"name": "a"}]}, "rewards.0.type"),
    ("no-rewards", {"rewards": []}, "rewards"),
    (
        "duplicate-reward-names",
        {"rewards": [{"type": "exact_match"}, {"type": "boxed_math", "name": "exact_match"}]},
        "rewards.1.name",
    ),
    ("reward-name-with-space", {"rewards.0.name": "my reward"}, "rewards.0.name"),
    ("http-reward-with-ftp-url", {"rewards": [{"type": "http", "url": "ftp://host/x"}]}, "rewards.0.url"),
    (
        "python-reward-zero-timeout",
        {"rewards": [{"type": "python", "path": "r.py", "timeout_s": 0}]},
        "rewards.0.timeout_s",
    ),
    (
        "python-reward-tiny-memory",
        {"rewards": [{"type": "python", "path": "r.py", "memory_mb": 32}]},
        "rewards.0.memory_mb",
    ),
    (
        "eval-path-and-eval-fraction",
        {"data.eval_path": "data/test.jsonl", "data.eval_fraction": 0.1},
        "data.eval_fraction",
    ),
    ("eval-fraction-too-large", {"data.eval_fraction": 0.6}, "data.eval_fraction"),
    (
        "kl-in-reward-with-group-estimator",
        {"algorithm.kl": {"coef": 0.1, "placement": "reward"}},
        "algorithm.kl.placement",
    ),
    ("negative-kl-coef", {"algorithm.kl": {"coef": -0.1}}, "algorithm.kl.coef"),
    ("ppo-without-value-loss", {"algorithm.name": "ppo", "algorithm.value_coef": 0.0}, "algorithm.value_coef"),
    ("dual-clip-not-above-one", {"algorithm.dual_clip": 1.0}, "algorithm.dual_clip"),
    (
        "overlong-buffer-covers-response",
        {"algorithm.overlong": {"enabled": True, "buffer_tokens": 16}},
        "algorithm.overlong.buffer_tokens",
    ),
    ("zero-temperature", {"rollout.temperature": 0}, "rollout.temperature"),
    ("top-p-above-one", {"rollout.top_p": 1.5}, "rollout.top_p"),
    ("top-k-zero", {"rollout.top_k": 0}, "rollout.top_k"),
    ("missing-model-path", {"model": {}}, "model.path"),
    ("unknown-dtype", {"model.dtype": "int8"}, "model.dtype"),
    ("missing-data", {"data": DELETE}, "data"),
    ("run-name-with-slash", {"name": "a/b"}, "name"),
    ("run-name-too-long", {"name": "x" * 101}, "name"),
    ("future-schema-version", {"schema_version": 2}, "schema_version"),
    ("keep-no-checkpoints", {"checkpoint.keep_last": 0}, "checkpoint.keep_last"),
    ("unknown-samples-mode", {"logging.samples": "some"}, "logging.samples"),
]


@pytest.mark.parametrize(("changes", "loc"), [pytest.param(c, loc, id=i) for i, c, loc in INVALID])
def test_invalid_config_is_a_config_error_naming_the_field(changes, loc):
    assert error_locs(with_changes(changes)) == [loc]


def test_config_error_reads_as_field_colon_message():
    with pytest.raises(ConfigError) as info:
        validate_config(with_changes({"rollout.samples_per_prompt": 1}))

    assert str(info.value) == "rollout.samples_per_prompt: group estimator 'grpo' needs more than one sample per prompt"
    assert info.value.errors == [
        {"loc": "rollout.samples_per_prompt", "msg": "group estimator 'grpo' needs more than one sample per prompt"}
    ]


def test_typo_suggests_the_nearest_field():
    with pytest.raises(ConfigError) as info:
        validate_config(
            with_changes(
                {"rollout.sample_per_prompt": 4, "rewards": [{"type": "regex", "pattern": "a", "ful_match": True}]}
            )
        )

    assert "did you mean 'samples_per_prompt'" in str(info.value)
    assert "did you mean 'full_match'" in str(info.value)


def test_all_cross_field_errors_are_reported_at_once():
    locs = error_locs(
        with_changes(
            {
                "rollout.samples_per_prompt": 1,
                "backends.zero_stage": 3,
                "rewards": [{"type": "exact_match"}, {"type": "exact_match"}],
            }
        )
    )

    assert sorted(locs) == ["backends.zero_stage", "rewards.1.name", "rollout.samples_per_prompt"]


def test_load_config_reports_field_errors_from_yaml():
    text = dump_config(validate_config(minimal())).replace("lr: 1.0e-05", "lr: -1.0")

    with pytest.raises(ConfigError) as info:
        load_config(text)

    assert [e["loc"] for e in info.value.errors] == ["train.lr"]


def test_validate_config_rejects_a_non_mapping():
    with pytest.raises(ConfigError):
        validate_config(["not", "a", "dict"])  # type: ignore[arg-type]


def test_constructing_the_model_directly_still_runs_cross_field_rules():
    with pytest.raises(ValidationError, match="rollout.samples_per_prompt"):
        RunConfig.model_validate(with_changes({"rollout.samples_per_prompt": 1}))


@pytest.mark.parametrize(
    ("changes", "loc", "message"),
    [
        pytest.param(
            {"backends.training": "deepspeed", "model.dtype": "float16"}, "model.dtype", "bfloat16", id="deepspeed-fp16"
        ),
        pytest.param(
            {"backends.async_rollout": True},
            "backends.async_rollout",
            "placement.mode 'separate'",
            id="async-colocated",
        ),
    ],
)
def test_combinations_the_engine_cannot_run_are_refused_naming_the_field(changes, loc, message):
    cfg = validate_config(with_changes(changes))  # the schema describes them ...
    with pytest.raises(ConfigError) as refused:  # ... the engine refuses to pretend it runs them
        check_runnable(cfg)
    assert [e["loc"] for e in refused.value.errors] == [loc]
    assert message in refused.value.errors[0]["msg"]


@pytest.mark.parametrize(
    "changes",
    [
        {"placement.mode": "separate", "backends.async_rollout": True},
        {"placement.rollout_engines": 2, "placement.trainer_ranks": 2},
        {"backends.training": "deepspeed", "backends.zero_stage": 3, "placement.trainer_ranks": 2},
    ],
)
def test_placement_and_async_options_are_runnable(changes):
    check_runnable(validate_config(with_changes(changes)))


def test_the_default_config_is_runnable():
    check_runnable(validate_config(minimal()))


def test_a_response_longer_than_the_models_context_is_refused_naming_both_numbers(tmp_path: Path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2", "max_position_embeddings": 128}))
    cfg = validate_config(with_changes({"model.path": str(tmp_path), "rollout.max_new_tokens": 100_000}))
    with pytest.raises(ConfigError) as refused:
        check_runnable(cfg)
    assert refused.value.errors == [
        {
            "loc": "rollout.max_new_tokens",
            "msg": "100000 tokens do not fit the model's context length of 128 tokens "
            "(the prompt needs room too): at most 127",
        }
    ]
    check_runnable(validate_config(with_changes({"model.path": str(tmp_path), "rollout.max_new_tokens": 127})))


def test_the_context_length_is_read_from_nested_text_configs_and_skipped_without_a_config(tmp_path: Path):
    (tmp_path / "config.json").write_text(json.dumps({"text_config": {"max_position_embeddings": 64}}))
    cfg = validate_config(with_changes({"model.path": str(tmp_path), "logging.eval_max_new_tokens": 64}))
    with pytest.raises(ConfigError) as refused:
        check_runnable(cfg)
    assert [e["loc"] for e in refused.value.errors] == ["logging.eval_max_new_tokens"]
    check_runnable(
        validate_config(with_changes({"model.path": str(tmp_path / "missing"), "rollout.max_new_tokens": 131_072}))
    )


def test_a_response_or_prompt_longer_than_a_rollout_file_holds_is_refused():
    from posttrain_sdk import rollout_files

    for loc, value in (
        ("rollout.max_new_tokens", rollout_files.MAX_NEW_TOKENS + 1),
        ("logging.eval_max_new_tokens", rollout_files.MAX_NEW_TOKENS + 1),
        ("data.max_prompt_tokens", rollout_files.MAX_PROMPT_TOKENS + 1),
    ):
        with pytest.raises(ConfigError) as refused:
            validate_config(with_changes({loc: value}))
        assert [e["loc"] for e in refused.value.errors] == [loc]


@pytest.mark.parametrize("name", ["mean", "std", "errors", "task_mean", "group_all_equal_rate"])
def test_a_reward_named_like_one_of_the_engines_own_curves_is_refused(name):
    from rl_engine.config import ConfigError

    with pytest.raises(ConfigError) as refused:
        validate_config(
            {
                "name": "x",
                "model": {"path": "m"},
                "data": {"path": "d.jsonl"},
                "rewards": [{"type": "exact_match", "name": name}],
            }
        )
    [error] = refused.value.errors
    assert error["loc"] == "rewards.0.name"
    assert error["msg"].startswith(f"{name!r} is reserved: reward/{name} is one of the engine's own curves")


def test_max_error_rate_is_a_share_of_the_steps_samples():
    from rl_engine.config import ConfigError

    base = {"name": "x", "model": {"path": "m"}, "data": {"path": "d.jsonl"}}
    config = validate_config({**base, "rewards": [{"type": "exact_match"}]})
    assert config.rewards[0].max_error_rate == 0.5
    with pytest.raises(ConfigError) as refused:
        validate_config({**base, "rewards": [{"type": "exact_match", "max_error_rate": 1.5}]})
    assert [e["loc"] for e in refused.value.errors] == ["rewards.0.max_error_rate"]
