"""The policy protocol (:mod:`agentjax.rollout.policy`) and the policy call the collectors share
(:mod:`agentjax.rollout.calls`).

Checked: the sampler satisfies the protocol with the protocol's own types, and its stop ids are the tokenizer's; the
shared call pads with copies of the first row (prompt, constraint, one new token), keys each row by its stream id,
decodes sparse only when every row is constrained, and refuses a policy without texts; constrained decoding gives the
same samples whether the allowed replies come as strings or as token ids (a tiny random Qwen over a word-level
tokenizer); reply tokens are encoded once and must fit with their stop token; prompts are cut from the left or
refused; the padding rule by hand.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
from flax import nnx

from agentjax import models
from agentjax.agents.prompts import encode_prompt
from agentjax.models import Qwen, QwenConfig, Sampler
from agentjax.models.tokenizer import ENDOFTEXT_ID, IM_END_ID
from agentjax.models.word_tokenizer import STOP_IDS as WORD_STOPS
from agentjax.models.word_tokenizer import word_tokenizer
from agentjax.rollout import policy
from agentjax.rollout.calls import ReplyTokens, encode_messages, generate_batch, scripted_output
from agentjax.rollout.policy import Finish, SampleOutput, SamplingParams, batch_padding

REPLIES = ["<action>go north</action>", "<action>go south</action>", "<action>take lamp</action>"]


@pytest.fixture(scope="module")
def words():
    return word_tokenizer(REPLIES + ["You are in a hall. Pick an action."])


@pytest.fixture(scope="module")
def sampler(words):
    config = QwenConfig.tiny_qwen2(vocab_size=len(words), d_model=32, mlp_dim=64, num_layers=1, num_heads=2,
                                   num_kv_heads=1)
    return Sampler(Qwen(config, rngs=nnx.Rngs(0)), words)


class Recording:
    """A policy that records each call's arguments and answers with empty replies."""

    def __init__(self, tokenizer, texts: bool = True):
        self.tokenizer, self.texts, self.calls = tokenizer, texts, []

    def generate(self, prompts, params, key, **kw) -> SampleOutput:
        self.calls.append((list(prompts), kw))
        b = len(prompts)
        zeros = np.zeros((b, params.max_new_tokens))
        return SampleOutput(tokens_bt=zeros.astype(np.int32), logp_bt=zeros, logp_unmasked_bt=zeros,
                            length_b=np.zeros(b, np.int32), finish_b=np.full(b, Finish.LENGTH, np.int32),
                            texts=[""] * b if self.texts else None)


def test_the_sampler_satisfies_the_protocol_with_its_types(sampler):
    assert isinstance(sampler, policy.Policy) and isinstance(sampler, policy.Chooser)
    assert isinstance(sampler.tokenizer, policy.Tokenizer)
    assert (models.SamplingParams, models.SampleOutput, models.Finish) == (
        policy.SamplingParams, policy.SampleOutput, policy.Finish)
    assert policy.CHAT_STOP_IDS == (IM_END_ID, ENDOFTEXT_ID)


def test_the_shared_call_pads_with_the_first_row_and_keys_each_row(words):
    params = SamplingParams(max_new_tokens=5, stop_token_ids=WORD_STOPS)
    recording, key = Recording(words), jax.random.key(3)
    allowed = [[[4, 5]], [[6], [7, 8]], [[9]]]
    out, pad = generate_batch(recording, [[1, 2], [3], [4, 5, 6]], params, key, bucket=4, allowed=allowed,
                              max_trie_edges=64, sparse=True, dense_draws=True, row_ids=[10, 11, 12], pad_row_id=99)
    assert pad == 1 and len(out.texts) == 4
    prompts, kw = recording.calls[0]
    assert prompts == [[1, 2], [3], [4, 5, 6], [1, 2]]
    assert kw["allowed"] == allowed + [allowed[0]] and kw["max_trie_edges"] == 64
    np.testing.assert_array_equal(kw["max_new_tokens"], [5, 5, 5, 1])
    assert kw["sparse"] and kw["dense_draws"]
    want = [jax.random.key_data(jax.random.fold_in(key, i)) for i in (10, 11, 12, 99)]
    np.testing.assert_array_equal(jax.random.key_data(kw["row_keys"]), np.stack(want))

    generate_batch(recording, [[1], [2]], params, key, bucket=2, allowed=[[[4]], []], sparse=True)
    _, kw = recording.calls[1]  # a free row: dense decoding, one key for the batch
    assert "sparse" not in kw and "row_keys" not in kw and kw["allowed"] == [[[4]], []]
    generate_batch(recording, [[1]], params, key, bucket=1)
    assert set(recording.calls[2][1]) == {"max_new_tokens"}  # unconstrained: no constraint arguments
    with pytest.raises(ValueError, match="returned no texts"):
        generate_batch(Recording(words, texts=False), [[1]], params, key, bucket=1)


def test_constrained_replies_as_token_ids_or_strings_sample_the_same(sampler, words):
    params = SamplingParams(temperature=1.0, max_new_tokens=8, stop_token_ids=WORD_STOPS, prompt_bucket=16)
    prompt = encode_prompt(words, [dict(role="user", content="You are in a hall. Pick an action.")])
    rows = [REPLIES, REPLIES[:2], REPLIES[2:], REPLIES]
    ids = ReplyTokens(words).rows(rows, params.max_new_tokens)
    key = jax.random.key(0)
    by_ids = sampler.generate([prompt] * 4, params, key, allowed=ids)
    by_strings = sampler.generate([prompt] * 4, params, key, allowed=rows)
    np.testing.assert_array_equal(by_ids.tokens_bt, by_strings.tokens_bt)
    np.testing.assert_array_equal(by_ids.logp_bt, by_strings.logp_bt)
    assert by_ids.texts == by_strings.texts and all(t in row for t, row in zip(by_ids.texts, rows, strict=True))
    shared, _ = generate_batch(sampler, [prompt] * 3, params, key, bucket=4, allowed=ids[:3])
    assert all(t in row for t, row in zip(shared.texts[:3], rows[:3], strict=True))


def test_reply_tokens_are_encoded_once_and_must_fit(words):
    calls = []

    class Counting:
        """The word tokenizer, counting its encode calls."""

        def encode(self, text, add_special_tokens=True):
            calls.append(text)
            return words.encode(text, add_special_tokens=add_special_tokens)

        def decode(self, ids, **kw):
            return words.decode(ids, **kw)

        def apply_chat_template(self, conversation, **kw):
            return words.apply_chat_template(conversation, **kw)

    replies = ReplyTokens(Counting())
    rows = replies.rows([REPLIES, REPLIES[:1]], max_new_tokens=8)
    assert rows[1] == [words.encode(REPLIES[0], add_special_tokens=False)] and calls == REPLIES
    n = len(rows[0][0])
    with pytest.raises(ValueError, match=rf"needs {n} tokens and a stop token, more than sampling.max_new_tokens={n}"):
        replies.rows([REPLIES[:1]], max_new_tokens=n)


def test_prompts_are_cut_from_the_left_or_refused(words):
    messages = [dict(role="user", content="You are in a hall. Pick an action.")]
    full = encode_prompt(words, messages)
    assert encode_messages(words, messages, max_prompt_tokens=len(full), truncation="error", where="x") == (full,
                                                                                                          False)
    assert encode_messages(words, messages, max_prompt_tokens=5, truncation="left", where="x") == (full[-5:], True)
    with pytest.raises(ValueError, match=f"the prompt of row 7 has {len(full)} tokens"):
        encode_messages(words, messages, max_prompt_tokens=5, truncation="error", where="row 7")


def test_scripted_output_and_batch_padding_by_hand(words):
    out = scripted_output(words, REPLIES[:2], 12, IM_END_ID)
    first = words.encode(REPLIES[0], add_special_tokens=False) + [IM_END_ID]
    assert out.texts == REPLIES[:2] and int(out.length_b[0]) == len(first)
    assert out.tokens_bt[0, : len(first)].tolist() == first and not out.logp_bt.any()
    assert [batch_padding(n, 8) for n in (1, 8, 9, 128)] == [7, 0, 7, 0]
    assert [batch_padding(n, 8, pow2=True) for n in (1, 8, 9, 33, 100, 128)] == [7, 0, 7, 31, 28, 0]
