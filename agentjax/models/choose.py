"""Constrained decoding among a few whole answers in one forward pass instead of a decode loop.

When every row may emit only one of a few fixed strings (SERA's tiny rubric writer and grader choose among fixed
well-formed rubrics and grades, :mod:`agentjax.agents.rubric`), token-by-token constrained decoding
(:meth:`~agentjax.models.sampler.Sampler.generate` with ``allowed``) spends one sequential decode step per token of
the answer — hundreds of steps for a JSON rubric — although almost every step is forced (one allowed token). The
same distribution comes from one teacher-forced pass:

- row ``b``'s answers ``c_1 … c_K`` (token ids) each followed by one of the stop ids are the outcomes; the trie of
  the answers allows, after a prefix ``u``, the next tokens of the answers that extend ``u`` and, if an answer
  equals ``u``, the stop ids (the sampler's :func:`~agentjax.models.constrain.allowed_tokens`);
- one pass: every prompt is decoded once into a KV cache (the sampler's prefill), and each answer ``c_k``
  continues its prompt's cache in one multi-token step, which gives the hidden state before each answer token and
  before its stop; at each position the logits of the allowed tokens only (``h · W[a] / τ``), masked and
  log-softmaxed, give the sampler's constrained log-prob of each token (0 where a single token is allowed);
- the probability of an outcome under the sampler's step-by-step draw is the product of those conditionals, so an
  outcome drawn with probability ``exp(Σ_t logp)`` is distributed exactly as the decode loop's (other random
  numbers); greedy decoding walks the trie taking the allowed token with the largest logit at each step (ties: the
  smaller token id, as the sampler's argmax).

The output is a :class:`~agentjax.models.sampling.SampleOutput` like the sparse decode path's: the chosen answer and
its stop token, the constrained log-probs, ``logp_unmasked`` NaN (not computed). Top-k / top-p truncation is not
supported (it acts on the full vocabulary); :meth:`Sampler.choose` falls back to ``generate`` for it.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from agentjax.models import constrain
from agentjax.models.qwen import KVCache
from agentjax.models.sampling import Finish, SampleOutput, SamplingParams, left_pad


def _bucket(n: int, step: int) -> int:
    return max(step, -(-n // step) * step)


def _pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


@functools.partial(jax.jit, static_argnames=("graphdef", "answers"))
def _choice_logp(graphdef, weights, tokens_bl, segment_bl, answer_rc, ids_rta, ok_rta, tau, *, answers: int):
    """Constrained log-probs ``[R, T, A]`` of the allowed ids ``ids_rta`` before each answer token and its stop.

    The prompts ``tokens_bl`` (left-padded) are decoded once into a KV cache; row ``r = b·answers + k`` continues
    prompt ``b``'s cache with answer ``k`` (``answer_rc``, right-padded with segment 0). The hidden state before
    answer token ``t`` is the prompt's last for ``t = 0``, else the continuation's at ``t − 1``."""
    model = nnx.merge(graphdef, weights)
    b, lp = tokens_bl.shape
    r, c = answer_rc.shape
    cache = KVCache.init(model.config, b, lp + c)
    positions_bl = jnp.maximum(jnp.cumsum(segment_bl, axis=1) - 1, 0).astype(jnp.int32)
    first = model.decode(tokens_bl, segment_bl, positions_bl, cache, prefill=True)
    cache = first.cache
    cache = KVCache(k_lbskh=jnp.repeat(cache.k_lbskh, answers, axis=1),
                    v_lbskh=jnp.repeat(cache.v_lbskh, answers, axis=1),
                    valid_bs=jnp.repeat(cache.valid_bs, answers, axis=0), end=cache.end)
    start_r = jnp.repeat(jnp.sum(segment_bl, axis=1), answers).astype(jnp.int32)
    segment_rc = (answer_rc >= 0).astype(jnp.int32)
    positions_rc = start_r[:, None] + jnp.arange(c, dtype=jnp.int32)[None]
    rest = model.decode(jnp.maximum(answer_rc, 0), segment_rc, positions_rc, cache).hidden_bld
    h_rtd = jnp.concatenate([jnp.repeat(first.hidden_bld[:, -1:], answers, axis=0), rest], axis=1)
    h_rtd = h_rtd[:, : ids_rta.shape[1]]
    w_rtad = jnp.take(model.unembedding_vd, ids_rta, axis=0).astype(h_rtd.dtype)
    z_rta = jnp.einsum("RTD,RTAD->RTA", h_rtd, w_rtad, preferred_element_type=jnp.float32) / tau
    rows, t, a = z_rta.shape
    masked = constrain.mask_logits(z_rta.reshape(rows * t, a), ok_rta.reshape(rows * t, a)).reshape(rows, t, a)
    return jax.nn.log_softmax(masked, axis=-1)


def _steps(answers: list[list[int]], k: int, stops: Sequence[int]) -> list[tuple[int, ...]]:
    """The allowed ids (sorted) before each token of answer ``k`` and before its stop (the trie's)."""
    out, mine = [], answers[k]
    for t in range(len(mine) + 1):
        live = [a for a in answers if a[:t] == mine[:t]]
        allowed = {a[t] for a in live if len(a) > t}
        if any(len(a) == t for a in live):
            allowed |= set(stops)
        out.append(tuple(sorted(allowed)))
    return out


Outcome = tuple[list[int], list[float]]  # an answer's tokens and its stop token, the constrained log-prob of each


def outcomes(sampler, prompts: Sequence[Sequence[int]], allowed: Sequence[Sequence[str]], params: SamplingParams,
             *, row_bucket: int = 8) -> list[list[Outcome]]:
    """Every row's outcomes (each allowed string with each stop id the trie allows after it) with their tokens'
    constrained log-probs at ``params.temperature`` (1 when greedy), from one decoder pass (module docstring)."""
    if sampler.tokenizer is None:
        raise ValueError("choose needs a tokenizer: Sampler(model, tokenizer)")
    if not params.stop_token_ids:
        raise ValueError("choose needs stop_token_ids: a row ends with a stop token after its answer")
    if len(allowed) != len(prompts) or any(not row for row in allowed):
        raise ValueError(f"choose: one non-empty list of answers per prompt, got {len(allowed)} for {len(prompts)}")
    stops = tuple(int(s) for s in params.stop_token_ids)
    answers = [list(dict.fromkeys(tuple(sampler.tokenizer.encode(s, add_special_tokens=False)) for s in row))
               for row in allowed]
    longest = max(len(a) for row in answers for a in row) + 1
    if longest > params.max_new_tokens:
        raise ValueError(f"choose: an answer needs {longest} tokens with its stop, more than max_new_tokens="
                         f"{params.max_new_tokens}; raise it")
    per_row = _pow2(max(len(row) for row in answers))  # answers per prompt, padded: few compiled shapes
    rows = [(b, k) for b, row in enumerate(answers) for k in range(len(row))]
    steps = [_steps([list(a) for a in answers[b]], k, stops) for b, k in rows]
    padded = _bucket(len(prompts), row_bucket)
    tokens, segment = left_pad([list(p) for p in prompts] + [list(prompts[0])] * (padded - len(prompts)),
                               params.prompt_bucket)
    width_t = _bucket(longest, 16)  # positions: each answer token and the stop after it
    width_a = _pow2(max(len(a) for s in steps for a in s))
    answer = np.full((padded * per_row, width_t), -1, np.int32)  # -1: padding
    ids = np.zeros((padded * per_row, width_t, width_a), np.int32)
    ok = np.zeros((padded * per_row, width_t, width_a), bool)
    ok[:, :, 0] = True  # unused positions: one allowed id, no NaN
    index = {}
    for (b, k), choices_t in zip(rows, steps, strict=True):
        i = index[(b, k)] = b * per_row + k
        answer[i, : len(answers[b][k])] = answers[b][k]
        for t, choices in enumerate(choices_t):
            ids[i, t, : len(choices)], ok[i, t, : len(choices)] = choices, True
    tau = 1.0 if params.greedy else float(params.temperature)
    logp = np.asarray(_choice_logp(sampler.graphdef, sampler.weights, jnp.asarray(tokens), jnp.asarray(segment),
                                   jnp.asarray(answer[:, : width_t - 1]), jnp.asarray(ids), jnp.asarray(ok),
                                   jnp.float32(tau), answers=per_row))
    out: list[list[Outcome]] = [[] for _ in prompts]
    for (b, k), steps_t in zip(rows, steps, strict=True):
        i, answer = index[(b, k)], list(answers[b][k])
        lp = [float(logp[i, t, steps_t[t].index(tok)]) for t, tok in enumerate(answer)]
        last = steps_t[len(answer)]
        out[b].extend((answer + [s], lp + [float(logp[i, len(answer), last.index(s)])]) for s in stops if s in last)
    return out


def choose(sampler, prompts: Sequence[Sequence[int]], allowed: Sequence[Sequence[str]], params: SamplingParams,
           key: jax.Array, *, row_bucket: int = 8) -> SampleOutput:
    """Each row emits one of its ``allowed`` strings and a stop token, drawn as constrained decoding would
    (module docstring). ``sampler``: a :class:`~agentjax.models.sampler.Sampler` with a tokenizer."""
    if params.top_k or params.top_p < 1:
        raise ValueError("choose draws from the whole constrained distribution: no top_k / top_p")
    found = outcomes(sampler, prompts, allowed, params, row_bucket=row_bucket)
    out_tokens = np.zeros((len(prompts), params.max_new_tokens), np.int32)
    out_logp = np.zeros((len(prompts), params.max_new_tokens), np.float32)
    length = np.zeros(len(prompts), np.int32)
    if not params.greedy:
        scores = np.full((len(prompts), max(len(o) for o in found)), -np.inf, np.float32)
        for b, row in enumerate(found):
            scores[b, : len(row)] = [sum(lp) for _, lp in row]
        picks = np.asarray(jax.random.categorical(key, jnp.asarray(scores), axis=-1))
    for b, row in enumerate(found):
        seq, lp = row[_greedy(row) if params.greedy else int(picks[b])]
        out_tokens[b, : len(seq)], out_logp[b, : len(seq)], length[b] = seq, lp, len(seq)
    stop = set(int(s) for s in params.stop_token_ids)
    texts = [sampler.tokenizer.decode([t for t in out_tokens[b, : length[b]] if t not in stop])
             for b in range(len(prompts))]
    unmasked = np.where(np.arange(params.max_new_tokens)[None] < length[:, None], np.nan, 0.0).astype(np.float32)
    return SampleOutput(tokens_bt=out_tokens, logp_bt=out_logp, logp_unmasked_bt=unmasked, length_b=length,
                        finish_b=np.full(len(prompts), int(Finish.STOP_TOKEN), np.int32), texts=texts)


def _greedy(outcomes: list[tuple[list[int], list[float]]]) -> int:
    """The outcome the sampler's greedy walk reaches: at each step the allowed token of largest log-prob (the same
    order as its logit), ties to the smaller id."""
    live = list(range(len(outcomes)))
    t = 0
    while len(live) > 1 or len(outcomes[live[0]][0]) > t:
        best = {}
        for j in live:
            tok = outcomes[j][0][t]
            best.setdefault(tok, outcomes[j][1][t])
        top = max(best.values())
        token = min(tok for tok, v in best.items() if v == top)
        live = [j for j in live if outcomes[j][0][t] == token]
        t += 1
        if all(len(outcomes[j][0]) == t for j in live):
            return live[0]
    return live[0]


__all__ = ["Outcome", "choose", "outcomes"]
