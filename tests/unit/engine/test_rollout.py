"""The transformers rollout backend samples from the policy's full distribution, prompt-major."""

from __future__ import annotations

import torch

from rl_engine.rollout import SamplingParams, TransformersRollout


def _random_policy(tokenizer):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=8,
        intermediate_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model


def test_sampling_without_top_k_is_not_truncated_to_the_50_most_likely_tokens(tiny_demo):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_demo / "model")
    rollout = TransformersRollout(_random_policy(tokenizer), tokenizer)
    torch.manual_seed(1)
    samples = rollout.generate([[5, 6, 7]] * 64, SamplingParams(n=8, max_new_tokens=1, top_k=-1))
    first_tokens = {s.response_ids[0] for s in samples}
    # A near-uniform random policy over 262 tokens: 512 draws hit far more than 50 distinct tokens.
    assert len(first_tokens) > 100


def test_samples_come_back_prompt_major_with_a_finish_reason(tiny_demo):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_demo / "model")
    rollout = TransformersRollout(_random_policy(tokenizer), tokenizer, batch_size=5)
    samples = rollout.generate([[5, 6], [7, 8, 9]], SamplingParams(n=3, max_new_tokens=4))
    assert [s.prompt_index for s in samples] == [0, 0, 0, 1, 1, 1]
    for sample in samples:
        ended = tokenizer.eos_token_id in sample.response_ids
        assert sample.finish_reason == ("stop" if ended else "length")
        assert len(sample.response_ids) <= 4


def _sampled_and_teacher_forced(tiny_demo, params: SamplingParams):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rl_engine.trainer import TokenBatch, batched_logprobs

    tokenizer = AutoTokenizer.from_pretrained(tiny_demo / "model")
    policy = AutoModelForCausalLM.from_pretrained(tiny_demo / "model").eval()
    prompts = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in ("37+48=", "5+60=", "91+9=")]
    torch.manual_seed(2)
    samples = TransformersRollout(policy, tokenizer, sampling_logprobs=True).generate(prompts, params)
    batch = TokenBatch.build([prompts[s.prompt_index] for s in samples], [s.response_ids for s in samples], 0)
    forced = batched_logprobs(policy, batch, 64, params.temperature)
    return samples, forced


def test_sampled_log_probs_are_those_of_the_distribution_each_token_was_drawn_from(tiny_demo):
    # Temperature only: that distribution is the teacher-forced forward's softmax at the same temperature.
    samples, forced = _sampled_and_teacher_forced(tiny_demo, SamplingParams(n=4, temperature=0.7, max_new_tokens=5))
    assert all(s.logprobs is not None and len(s.logprobs) == len(s.response_ids) for s in samples)
    for row, sample in enumerate(samples):
        assert torch.allclose(torch.tensor(sample.logprobs), forced[row, : len(sample.response_ids)], atol=1e-5)


def test_sampled_log_probs_under_top_k_are_those_of_the_truncated_distribution(tiny_demo):
    # Renormalised over the 3 most likely tokens: every drawn token is more likely than under the full softmax.
    samples, forced = _sampled_and_teacher_forced(tiny_demo, SamplingParams(n=4, top_k=3, max_new_tokens=5))
    for row, sample in enumerate(samples):
        assert all(s > f + 1e-3 for s, f in zip(sample.logprobs, forced[row].tolist()))
