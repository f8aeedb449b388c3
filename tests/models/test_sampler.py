"""The sampler: greedy parity with transformers' generate, log-probs, stopping, filters, constrained decoding."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentjax.models.config import QwenConfig
from agentjax.models.hf import load_hf
from agentjax.models.qwen import Qwen
from agentjax.models.sampler import Sampler, _gumbel_at, exact_draws_supported, filter_top_k_top_p
from agentjax.models.sampling import Finish, SamplingParams, left_pad
from agentjax.models.tokenizer import IM_END_ID, load_tokenizer
from agentjax.rollout.policy import constrained_choices

PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [20, 21, 22], [300, 301, 302, 303, 304]]


def test_greedy_generation_is_token_identical_to_transformers(hf_checkpoint):
    _, hf_model, folder = hf_checkpoint
    width = max(map(len, PROMPTS))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in PROMPTS])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in PROMPTS])
    with torch.no_grad():
        ref = hf_model.generate(ids, attention_mask=mask, max_new_tokens=32, do_sample=False, eos_token_id=None,
                                pad_token_id=0)[:, width:].numpy()
    out = Sampler(load_hf(folder)).generate(PROMPTS, SamplingParams(temperature=0, max_new_tokens=32),
                                            jax.random.key(0))
    np.testing.assert_array_equal(out.tokens_bt, ref)
    assert (out.finish_b == Finish.LENGTH).all() and (out.length_b == 32).all()


@pytest.fixture(scope="module")
def tiny():
    return Qwen(QwenConfig.tiny_qwen3(), rngs=nnx.Rngs(0))


def test_logprobs_are_those_of_a_teacher_forced_forward(tiny):
    params = SamplingParams(temperature=1.3, max_new_tokens=12)
    out = Sampler(tiny).generate(PROMPTS, params, jax.random.key(1))
    for row, prompt in enumerate(PROMPTS):
        seq = np.concatenate([prompt, out.tokens_bt[row]])
        logp = jax.nn.log_softmax(tiny(jnp.asarray(seq[None]))[0] / 1.3, axis=-1)
        ref = np.take_along_axis(np.asarray(logp[len(prompt) - 1:-1]), out.tokens_bt[row][:, None], -1)[:, 0]
        np.testing.assert_allclose(out.logp_bt[row], ref, rtol=1e-4, atol=1e-5)
        np.testing.assert_array_equal(out.logp_bt[row], out.logp_unmasked_bt[row])  # no constraint


def test_same_key_same_sample_and_keys_differ(tiny):
    sampler, params = Sampler(tiny), SamplingParams(temperature=1.0, max_new_tokens=16)
    a = sampler.generate(PROMPTS, params, jax.random.key(7))
    b = sampler.generate(PROMPTS, params, jax.random.key(7))
    c = sampler.generate(PROMPTS, params, jax.random.key(8))
    np.testing.assert_array_equal(a.tokens_bt, b.tokens_bt)
    assert not np.array_equal(a.tokens_bt, c.tokens_bt)


def test_stop_tokens_and_per_row_lengths(tiny):
    sampler = Sampler(tiny)
    greedy = sampler.generate(PROMPTS, SamplingParams(temperature=0, max_new_tokens=16), jax.random.key(0))
    stop = int(greedy.tokens_bt[0, 3])  # make row 0's 4th greedy token a stop token
    out = sampler.generate(PROMPTS, SamplingParams(temperature=0, max_new_tokens=16, stop_token_ids=(stop,)),
                           jax.random.key(0), max_new_tokens=[16, 5, 16])
    first = np.argmax(greedy.tokens_bt[0] == stop)
    assert out.finish_b[0] == Finish.STOP_TOKEN and out.length_b[0] == first + 1
    assert out.tokens_bt[0, first] == stop and (out.tokens_bt[0, first + 1:] == 0).all()
    assert out.length_b[1] <= 5 and (out.tokens_bt[1, out.length_b[1]:] == 0).all()
    if stop not in greedy.tokens_bt[1, :5]:
        assert out.finish_b[1] == Finish.LENGTH and out.length_b[1] == 5
    np.testing.assert_array_equal(out.tokens_bt[:, :3], greedy.tokens_bt[:, :3])


def test_top_k_and_top_p_filters_by_hand():
    z = jnp.log(jnp.array([[0.5, 0.2, 0.15, 0.1, 0.05]]))
    kept = lambda f: np.asarray(f > jnp.finfo(jnp.float32).min / 2)[0].tolist()
    assert kept(filter_top_k_top_p(z, 2, 1.0)) == [True, True, False, False, False]
    assert kept(filter_top_k_top_p(z, 0, 0.6)) == [True, True, False, False, False]  # 0.5 < 0.6, 0.7 ≥ 0.6
    assert kept(filter_top_k_top_p(z, 0, 0.8)) == [True, True, True, False, False]
    assert kept(filter_top_k_top_p(z, 0, 0.3)) == [True, False, False, False, False]  # the top token survives
    assert kept(filter_top_k_top_p(z, 4, 0.9)) == [True, True, True, True, False]


def test_left_pad_buckets_and_rejects_empty_prompts():
    tokens, segment = left_pad([[1, 2, 3], [4]], bucket=4)
    np.testing.assert_array_equal(tokens, [[0, 1, 2, 3], [0, 0, 0, 4]])
    np.testing.assert_array_equal(segment, [[0, 1, 1, 1], [0, 0, 0, 1]])
    with pytest.raises(ValueError, match="at least one token"):
        left_pad([[1], []], bucket=4)


# -- constrained decoding with the real tokenizer -------------------------------------------------------------------
@functools.lru_cache(maxsize=1)
def _qwen_vocab_sampler():
    """A tiny random model over Qwen's full vocabulary, with the real tokenizer."""
    config = QwenConfig.tiny_qwen2(vocab_size=151_936, d_model=32, mlp_dim=64, num_layers=1, head_dim=8)
    return Sampler(Qwen(config, rngs=nnx.Rngs(0)), load_tokenizer())


WORDS = ["go", "to", "desk", "1", "2", "open", "drawer", "take", "mug", "from", "put", "in/on", "cabinet", "10",
         "look", "inventory", "examine", "Nothing", "é", "ü", "🙂", "the", "sofa"]
action = st.lists(st.sampled_from(WORDS), min_size=1, max_size=5).map(" ".join)
row = st.lists(action, min_size=1, max_size=6, unique=True)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])  # 6: CI time
@given(rows=st.lists(row, min_size=4, max_size=4), seed=st.integers(0, 2**31 - 1))
def test_constrained_decoding_only_emits_allowed_strings(rows, seed):
    sampler = _qwen_vocab_sampler()
    tok = sampler.tokenizer
    prompts = [tok.encode(f"Choose an action {i}:") for i in range(4)]
    params = SamplingParams(temperature=1.5, max_new_tokens=40, stop_token_ids=(IM_END_ID,), prompt_bucket=16)
    out = sampler.generate(prompts, params, jax.random.key(seed), allowed=rows)
    for b in range(4):
        assert out.finish_b[b] == Finish.STOP_TOKEN
        assert out.texts[b] in rows[b], (out.texts[b], rows[b])
        n = out.length_b[b]
        assert out.tokens_bt[b, n - 1] == IM_END_ID
        # masked log-probs are renormalised over the allowed set: never below the unmasked ones
        assert (out.logp_bt[b, :n] >= out.logp_unmasked_bt[b, :n] - 1e-5).all()
        assert (out.logp_bt[b, :n] <= 1e-6).all()


SPARSE_ROWS = [["go to desk 1", "go to desk 2", "look"], ["take mug 1 from desk 2", "inventory"],
               ["open drawer 10", "open drawer 1", "examine the sofa", "🙂"], ["put mug 1 in/on cabinet 2"]]


@pytest.mark.parametrize("seed", [0, 1])
def test_sparse_constrained_decoding_samples_the_dense_distribution(seed):
    """Sparse decoding (the allowed tokens' logits only) samples the dense constrained sampler's distribution:
    greedy replies and log-probs equal the dense path's; sampled replies are allowed and their recorded log-probs
    are the constrained softmax of a teacher-forced forward at every position."""
    sampler = _qwen_vocab_sampler()
    tok = sampler.tokenizer
    rows = SPARSE_ROWS
    prompts = [tok.encode(f"Choose an action {i}:") for i in range(4)]
    stops = (IM_END_ID, 151643)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=16, stop_token_ids=stops, prompt_bucket=16)
    dense = sampler.generate(prompts, greedy, jax.random.key(seed), allowed=rows)
    sparse = sampler.generate(prompts, greedy, jax.random.key(seed), allowed=rows, sparse=True)
    assert sparse.texts == dense.texts
    np.testing.assert_allclose(sparse.logp_bt, dense.logp_bt, atol=2e-5)
    tau = 1.3
    params = SamplingParams(temperature=tau, max_new_tokens=16, stop_token_ids=stops, prompt_bucket=16)
    out = sampler.generate(prompts, params, jax.random.key(seed), allowed=rows, sparse=True)
    assert np.isnan(out.logp_unmasked_bt[:, 0]).all()
    width = 32
    tokens, segment = np.zeros((4, width), np.int32), np.zeros((4, width), np.int32)
    for b in range(4):
        seq = prompts[b] + [int(t) for t in out.tokens_bt[b, : out.length_b[b]]]
        tokens[b, width - len(seq):], segment[b, width - len(seq):] = seq, 1
    model = nnx.merge(sampler.graphdef, sampler.weights)
    logits = np.asarray(model.logits(model.decode(jnp.asarray(tokens), jnp.asarray(segment)).hidden_bld)) / tau
    for b in range(4):
        n = int(out.length_b[b])
        assert out.texts[b] in rows[b]
        ids = [int(t) for t in out.tokens_bt[b, :n]]
        choices = constrained_choices([tok.encode(r) for r in rows[b]], stops, ids)
        for j, allowed in enumerate(choices):
            z = logits[b, width - n - 1 + j, list(allowed)]
            ref = z - np.log(np.exp(z - z.max()).sum()) - z.max()
            np.testing.assert_allclose(out.logp_bt[b, j], ref[allowed.index(ids[j])], atol=2e-4)


def test_a_single_allowed_string_is_forced_with_log_prob_zero():
    sampler = _qwen_vocab_sampler()
    params = SamplingParams(temperature=1.0, max_new_tokens=40, stop_token_ids=(IM_END_ID,), prompt_bucket=16)
    out = sampler.generate([[1, 2, 3]], params, jax.random.key(0), allowed=[["take mug 1 from desk 2"]])
    assert out.texts == ["take mug 1 from desk 2"]
    np.testing.assert_allclose(out.logp_bt[0, : out.length_b[0]], 0.0, atol=1e-5)
    assert (out.logp_unmasked_bt[0, : out.length_b[0]] < 0).all()


def test_stop_strings_end_the_row_at_the_completing_token():
    sampler = _qwen_vocab_sampler()
    forced = "<think>x</think><action>go to desk 1</action> then more words here"
    params = SamplingParams(temperature=1.0, max_new_tokens=40, stop_token_ids=(IM_END_ID,),
                            stop_strings=("</action>",), check_every=4, prompt_bucket=16)
    out = sampler.generate([[1, 2, 3], [4, 5]], params, jax.random.key(0), allowed=[[forced], ["look"]])
    assert out.finish_b.tolist() == [Finish.STOP_STRING, Finish.STOP_TOKEN]
    assert out.texts[0] == "<think>x</think><action>go to desk 1</action>"
    assert out.texts[1] == "look"
    assert (out.tokens_bt[0, out.length_b[0]:] == 0).all()


def test_bad_requests_are_clear_errors(tiny):
    sampler = Sampler(tiny)
    with pytest.raises(ValueError, match="stop_strings need a tokenizer"):
        sampler.generate(PROMPTS, SamplingParams(stop_strings=("x",)), jax.random.key(0))
    with pytest.raises(ValueError, match="needs stop_token_ids"):
        sampler.generate(PROMPTS, SamplingParams(), jax.random.key(0), allowed=[["a"]] * 3)
    with pytest.raises(ValueError, match=r"max_new_tokens per row"):
        sampler.generate(PROMPTS, SamplingParams(max_new_tokens=8), jax.random.key(0), max_new_tokens=[9, 1, 1])
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0.0)


def test_a_remat_model_samples_like_the_plain_one():
    config = QwenConfig.tiny_qwen3()
    plain, remat = Qwen(config, rngs=nnx.Rngs(0)), Qwen(config.replace(remat=True), rngs=nnx.Rngs(0))
    params = SamplingParams(temperature=0, max_new_tokens=8)
    a = Sampler(plain).generate(PROMPTS, params, jax.random.key(0))
    b = Sampler(remat).generate(PROMPTS, params, jax.random.key(0))
    np.testing.assert_array_equal(a.tokens_bt, b.tokens_bt)


def test_batch_padding_to_multiples_or_powers_of_two():
    from agentjax.rollout.policy import batch_padding

    assert [batch_padding(n, 8) for n in (1, 8, 9, 128)] == [7, 0, 7, 0]
    assert [batch_padding(n, 8, pow2=True) for n in (1, 8, 9, 33, 100, 128)] == [7, 0, 7, 31, 28, 0]


def test_gumbel_at_is_jax_randoms_gumbel_at_those_indices():
    assert exact_draws_supported()
    for seed, shape in ((0, (5, 151_936)), (1, (3, 7)), (2, (64,))):
        key = jax.random.key(seed)
        full = np.asarray(jax.random.gumbel(key, shape, jnp.float32)).ravel()
        index = np.random.default_rng(seed).integers(0, full.size, 200)
        np.testing.assert_array_equal(np.asarray(_gumbel_at(jax.random.key_data(key), jnp.asarray(index))),
                                      full[index])


@pytest.mark.parametrize("row_keys, temperature", [  # the heaviest three are `make test-slow`'s, for CI time
    (False, 0.6), (False, 0.0), (True, 0.0), *(pytest.param(*p, marks=pytest.mark.slow)
                                               for p in ((False, 1.0), (True, 1.0), (True, 0.6)))])
def test_dense_constrained_draws_from_the_allowed_tokens_only_are_the_same(temperature, row_keys, monkeypatch):
    """With every row constrained the dense sampler draws from the allowed tokens only (the same Gumbel noise as the
    [B, V] draw): the same tokens, the same unmasked log-probs, the masked ones up to float rounding."""
    import agentjax.models.sampler as sampler_module

    sampler = _qwen_vocab_sampler()
    tok = sampler.tokenizer
    prompts = [tok.encode(f"Choose an action {i}:") for i in range(4)]
    params = SamplingParams(temperature=temperature, max_new_tokens=16, stop_token_ids=(IM_END_ID, 151643),
                            prompt_bucket=16)
    extra = {"row_keys": jax.random.split(jax.random.key(9), 4)} if row_keys else {}
    outs = []
    for exact in (True, False):
        monkeypatch.setattr(sampler_module, "exact_draws_supported", lambda exact=exact: exact)
        outs.append(sampler.generate(prompts, params, jax.random.key(4), allowed=SPARSE_ROWS, **extra))
    fast, dense = outs
    np.testing.assert_array_equal(fast.tokens_bt, dense.tokens_bt)
    np.testing.assert_array_equal(fast.length_b, dense.length_b)
    np.testing.assert_array_equal(fast.logp_unmasked_bt, dense.logp_unmasked_bt)
    np.testing.assert_allclose(fast.logp_bt, dense.logp_bt, rtol=1e-6, atol=1e-6)
    # sparse decoding with the dense draws: the same tokens from h · W[allowed] alone (no unmasked log-probs)
    monkeypatch.undo()
    sparse = sampler.generate(prompts, params, jax.random.key(4), allowed=SPARSE_ROWS, sparse=True, dense_draws=True,
                              **extra)
    np.testing.assert_array_equal(sparse.tokens_bt, dense.tokens_bt)
    np.testing.assert_array_equal(sparse.length_b, dense.length_b)
    np.testing.assert_allclose(sparse.logp_bt, dense.logp_bt, atol=2e-5)
    assert np.isnan(sparse.logp_unmasked_bt[:, 0]).all()
    if temperature:  # and its own draws are another sample of the same distribution
        own = sampler.generate(prompts, params, jax.random.key(4), allowed=SPARSE_ROWS, sparse=True, **extra)
        assert not np.array_equal(own.tokens_bt, dense.tokens_bt)


def test_dense_draws_need_sparse_decoding_without_top_k_or_top_p():
    sampler = _qwen_vocab_sampler()
    stops = (IM_END_ID,)
    rows = [["look", "go to desk 1"]]
    with pytest.raises(ValueError, match="dense_draws .* needs sparse=True"):
        sampler.generate([[1, 2]], SamplingParams(max_new_tokens=8, stop_token_ids=stops), jax.random.key(0),
                         allowed=rows, dense_draws=True)
    with pytest.raises(ValueError, match="top_k=0"):
        sampler.generate([[1, 2]], SamplingParams(max_new_tokens=8, stop_token_ids=stops, top_k=1),
                         jax.random.key(0), allowed=rows, sparse=True, dense_draws=True)
