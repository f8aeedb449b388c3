"""Constrained choice among whole answers in one pass (agentjax/models/choose.py) against the decode loop: greedy
answers and log-probs equal ``Sampler.generate(allowed=...)``'s; every answer the loop samples has the log-probs
the one pass gives it; the outcomes' probabilities sum to one; sampled answers are allowed."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from agentjax.models import SamplingParams
from agentjax.models.choose import choose, outcomes
from agentjax.models.tokenizer import ENDOFTEXT_ID, IM_END_ID
from tests.models.test_sampler import SPARSE_ROWS, _qwen_vocab_sampler

STOPS = (IM_END_ID, ENDOFTEXT_ID)
ROWS = SPARSE_ROWS + [["open drawer 1", "open drawer 10", "open drawer 1 0"], ['{"a": 1}', '{"a": 2}', '{"b": 1}']]


def _prompts(tok):
    return [tok.encode(f"Choose an action {i}:" + " and" * (3 * i)) for i in range(len(ROWS))]


def test_greedy_choice_is_the_decode_loops():
    sampler = _qwen_vocab_sampler()
    prompts = _prompts(sampler.tokenizer)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=16, stop_token_ids=STOPS, prompt_bucket=16)
    loop = sampler.generate(prompts, greedy, jax.random.key(0), allowed=ROWS)
    one = sampler.choose(prompts, ROWS, greedy, jax.random.key(0))
    assert one.texts == loop.texts
    np.testing.assert_array_equal(one.tokens_bt, loop.tokens_bt)
    np.testing.assert_array_equal(one.length_b, loop.length_b)
    np.testing.assert_allclose(one.logp_bt, loop.logp_bt, atol=2e-5)
    assert np.isnan(one.logp_unmasked_bt[0, 0]) and one.logp_unmasked_bt[0, one.length_b[0]] == 0


@pytest.mark.parametrize("tau", [1.0, 0.7])
def test_sampled_answers_have_the_loops_log_probs(tau):
    sampler = _qwen_vocab_sampler()
    prompts = _prompts(sampler.tokenizer)
    params = SamplingParams(temperature=tau, max_new_tokens=16, stop_token_ids=STOPS, prompt_bucket=16)
    found = outcomes(sampler, prompts, ROWS, params)
    for b, row in enumerate(found):
        assert np.isclose(sum(np.exp(sum(lp)) for _, lp in row), 1.0, atol=1e-4), b
        assert len(row) == 2 * len(ROWS[b])  # every answer, then either stop id
    seen = 0
    for seed in range(4):
        loop = sampler.generate(prompts, params, jax.random.key(seed), allowed=ROWS)
        for b, row in enumerate(found):
            n = int(loop.length_b[b])
            match = [lp for seq, lp in row if seq == loop.tokens_bt[b, :n].tolist()]
            assert len(match) == 1
            np.testing.assert_allclose(match[0], loop.logp_bt[b, :n], atol=2e-4)
            seen += 1
        one = choose(sampler, prompts, ROWS, params, jax.random.key(seed))
        for b, row in enumerate(found):
            n = int(one.length_b[b])
            assert one.texts[b] in ROWS[b] and one.tokens_bt[b, n - 1] in STOPS
            [lp] = [lp for seq, lp in row if seq == one.tokens_bt[b, :n].tolist()]
            np.testing.assert_allclose(one.logp_bt[b, :n], lp)
    assert seen == 4 * len(ROWS)


def test_bad_requests_are_clear_errors():
    sampler = _qwen_vocab_sampler()
    params = SamplingParams(temperature=1.0, max_new_tokens=3, stop_token_ids=STOPS, prompt_bucket=16)
    with pytest.raises(ValueError, match="raise it"):
        choose(sampler, [[1, 2]], [["take mug 1 from desk 2"]], params, jax.random.key(0))
    with pytest.raises(ValueError, match="non-empty"):
        choose(sampler, [[1, 2]], [[]], params, jax.random.key(0))
    with pytest.raises(ValueError, match="stop_token_ids"):
        choose(sampler, [[1, 2]], [["a"]], SamplingParams(max_new_tokens=4), jax.random.key(0))
