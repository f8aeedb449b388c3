"""The policy call and the prompt encoding that the flat collector, the tree collector and SERA's rubric calls share.

Every collector turn is one batched call of the policy (:mod:`agentjax.rollout.policy`) over chat-encoded prompts:

- :func:`encode_messages` — chat messages to prompt ids with the policy's chat template and the generation prompt
  (:func:`~agentjax.agents.prompts.encode_prompt`); a prompt longer than ``max_prompt_tokens`` is an error
  (``truncation="error"``, verl's default) or keeps its *last* ``max_prompt_tokens`` tokens (``"left"``).
- :class:`ReplyTokens` — the token ids of the replies a constrained row may emit, encoded once per string, each
  checked to fit the response capacity with its stop token.
- :func:`generate_batch` — one ``policy.generate`` call: the batch padded with dummy rows (a copy of the first
  prompt and of its constraint, one new token each; :func:`~agentjax.rollout.policy.batch_padding`) so that a run
  compiles a bounded number of programs; real rows may generate ``max_new_tokens``; with ``row_ids`` row ``i``
  samples from its own stream ``fold_in(key, row_ids[i])``; sparse decoding when every row is constrained.
- :func:`scripted_output` — given texts (a teacher's replies, reference rubrics and grades) in the form of a
  policy's output, for the turns where nothing is sampled.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import jax
import numpy as np

from agentjax.agents.prompts import encode_prompt
from agentjax.rollout.policy import Finish, Policy, SampleOutput, SamplingParams, Tokenizer, batch_padding

Truncation = Literal["error", "left"]


def tokenizer_of(policy: Any) -> Tokenizer:
    """The policy's tokenizer (prompts are chat-encoded and replies decoded with it); an error without one."""
    tokenizer = getattr(policy, "tokenizer", None)
    if tokenizer is None:
        raise ValueError("collect: the policy has no tokenizer; build it as Sampler(model, tokenizer) "
                         "(prompts are chat-encoded and replies decoded with it)")
    return tokenizer


def encode_messages(tokenizer: Tokenizer, messages: Sequence[Mapping[str, str]], *, max_prompt_tokens: int,
                    truncation: Truncation, where: str) -> tuple[list[int], bool]:
    """The prompt ids of ``messages`` (module docstring) and whether they were cut; ``where`` names the prompt in
    the error."""
    ids = encode_prompt(tokenizer, messages)
    if len(ids) <= max_prompt_tokens:
        return ids, False
    if truncation == "error":
        raise ValueError(f"collect: the prompt of {where} has {len(ids)} tokens, more than max_prompt_tokens="
                         f"{max_prompt_tokens}; raise max_prompt_tokens, lower history_length, or set "
                         "truncation='left' (keeps the last max_prompt_tokens tokens)")
    return ids[len(ids) - max_prompt_tokens:], True


class ReplyTokens:
    """The token ids of allowed replies, each string encoded once (``tokenizer.encode``, no special tokens)."""

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        self._ids: dict[str, list[int]] = {}

    def __call__(self, reply: str) -> list[int]:
        if reply not in self._ids:
            self._ids[reply] = list(self.tokenizer.encode(reply, add_special_tokens=False))
        return self._ids[reply]

    def rows(self, rows: Sequence[Sequence[str]], max_new_tokens: int) -> list[list[list[int]]]:
        """The ids of every row's replies; an error when a reply and its stop token do not fit ``max_new_tokens``."""
        out = []
        for strings in rows:
            row = []
            for s in strings:
                ids = self(s)
                if len(ids) + 1 > max_new_tokens:
                    raise ValueError(f"collect: the constrained reply {s!r} needs {len(ids)} tokens and a stop token, "
                                     f"more than sampling.max_new_tokens={max_new_tokens}; raise it")
                row.append(ids)
            out.append(row)
        return out


def generate_batch(
    policy: Policy,
    prompts: Sequence[Sequence[int]],
    params: SamplingParams,
    key: jax.Array,
    *,
    bucket: int,
    pow2: bool = False,
    allowed: Sequence[Sequence[Sequence[int]]] | None = None,
    max_trie_edges: int = 1024,
    sparse: bool = False,
    dense_draws: bool = False,
    row_ids: Sequence[int] | None = None,
    pad_row_id: int = 0,
) -> tuple[SampleOutput, int]:
    """One padded ``policy.generate`` call for ``prompts`` (module docstring); returns its output (real rows first,
    then the dummy rows) and the number of dummy rows.

    Args:
      bucket, pow2: the batch is padded to a multiple of ``bucket`` rows, or with ``pow2`` to a power of two.
      allowed: per row, the token ids of its allowed replies (:class:`ReplyTokens`); None: unconstrained.
      max_trie_edges: the least edge capacity of the policy's constraint trie.
      sparse: decode from the allowed tokens' logits only when every row has an allowed list (``dense_draws``: with
        the dense path's random numbers).
      row_ids: the stream of each real row (``row_keys = fold_in(key, row_ids[i])``); dummy rows take
        ``pad_row_id``. None: every row draws from ``key``.
    """
    rows = len(prompts)
    pad = batch_padding(rows, bucket, pow2=pow2)
    extra: dict[str, Any] = {}
    if allowed is not None:
        extra.update(allowed=list(allowed) + [allowed[0]] * pad, max_trie_edges=max_trie_edges)
        if sparse and all(allowed):
            extra.update(sparse=True, dense_draws=dense_draws)
    if row_ids is not None:
        ids = np.asarray(list(row_ids) + [pad_row_id] * pad, np.uint32)
        extra["row_keys"] = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(key, ids)
    limits = np.array([params.max_new_tokens] * rows + [1] * pad, np.int32)
    out = policy.generate(list(prompts) + [prompts[0]] * pad, params, key, max_new_tokens=limits, **extra)
    if out.texts is None:
        raise ValueError("collect: the policy returned no texts; give the Sampler a tokenizer")
    return out, pad


def scripted_output(tokenizer: Tokenizer, texts: Sequence[str], max_new_tokens: int,
                    stop_id: int | None) -> SampleOutput:
    """``texts`` as a :class:`SampleOutput` (each encoded, the stop token appended, log-probs 0): a teacher's replies
    in place of sampled ones."""
    tokens = np.zeros((len(texts), max_new_tokens), np.int32)
    length = np.zeros(len(texts), np.int32)
    for i, text in enumerate(texts):
        ids = list(tokenizer.encode(text, add_special_tokens=False)) + ([stop_id] if stop_id is not None else [])
        if len(ids) > max_new_tokens:
            raise ValueError(f"a scripted reply needs {len(ids)} tokens, more than max_new_tokens={max_new_tokens}; "
                             "raise it")
        tokens[i, : len(ids)], length[i] = ids, len(ids)
    zeros = np.zeros((len(texts), max_new_tokens), np.float32)
    return SampleOutput(tokens_bt=tokens, logp_bt=zeros, logp_unmasked_bt=zeros, length_b=length,
                        finish_b=np.full(len(texts), int(Finish.STOP_TOKEN), np.int32), texts=list(texts))


__all__ = ["ReplyTokens", "Truncation", "encode_messages", "generate_batch", "scripted_output", "tokenizer_of"]
