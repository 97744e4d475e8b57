"""The transformers rollout backend samples from the policy's full distribution, prompt-major."""

from __future__ import annotations

import torch

from rl_engine.rollout import SamplingParams, TransformersRollout
from tests.unit.engine.helpers import random_policy


def test_sampling_without_top_k_is_not_truncated_to_the_50_most_likely_tokens(tiny_demo):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_demo / "model")
    rollout = TransformersRollout(random_policy(tokenizer), tokenizer)
    torch.manual_seed(1)
    samples = rollout.generate([[5, 6, 7]] * 64, SamplingParams(n=8, max_new_tokens=1, top_k=-1))
    first_tokens = {s.response_ids[0] for s in samples}
    # A near-uniform random policy over 262 tokens: 512 draws hit far more than 50 distinct tokens.
    assert len(first_tokens) > 100


def test_samples_come_back_prompt_major_with_a_finish_reason(tiny_demo):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_demo / "model")
    rollout = TransformersRollout(random_policy(tokenizer), tokenizer, batch_size=5)
    samples = rollout.generate([[5, 6], [7, 8, 9]], SamplingParams(n=3, max_new_tokens=4))
    assert [s.prompt_index for s in samples] == [0, 0, 0, 1, 1, 1]
    for sample in samples:
        ended = tokenizer.eos_token_id in sample.response_ids
        assert sample.finish_reason == ("stop" if ended else "length")
        assert len(sample.response_ids) <= 4


def _teacher_forced(model, prompts, samples, temperature, top_k=0):
    """Each sampled token's log-prob under the sampling distribution, from one full forward pass."""
    from rl_engine.trainer import TokenBatch, response_logits

    batch = TokenBatch.build([prompts[s.prompt_index] for s in samples], [s.response_ids for s in samples], 0)
    with torch.no_grad():
        logits = response_logits(model.eval(), batch, temperature)
    if top_k > 0:
        kth = logits.topk(top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    tokens = batch.sequences[:, batch.prompt_width :]
    return torch.log_softmax(logits, dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def test_sampled_tokens_come_with_their_logprobs_under_the_distribution_they_were_drawn_from(tiny_demo):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_demo / "model")
    model = random_policy(tokenizer)
    rollout = TransformersRollout(model, tokenizer, batch_size=4)
    prompts = [[5, 6, 7], [8, 9]]
    for params in (
        SamplingParams(n=3, max_new_tokens=5, temperature=0.7),
        SamplingParams(n=3, max_new_tokens=5, top_k=5),  # renormalised over the 5 most likely tokens, as vLLM does
    ):
        torch.manual_seed(2)
        samples = rollout.generate(prompts, params)
        expected = _teacher_forced(model, prompts, samples, params.temperature, max(params.top_k, 0))
        for row, sample in enumerate(samples):
            assert sample.logprobs is not None and len(sample.logprobs) == len(sample.response_ids)
            torch.testing.assert_close(
                torch.tensor(sample.logprobs), expected[row, : len(sample.response_ids)], atol=1e-5, rtol=0
            )


def test_greedy_decoding_reports_no_logprobs(tiny_demo):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_demo / "model")
    rollout = TransformersRollout(random_policy(tokenizer), tokenizer)
    samples = rollout.generate([[5, 6]], SamplingParams(n=1, max_new_tokens=3, greedy=True))
    assert samples[0].logprobs is None
