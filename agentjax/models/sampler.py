"""The sampler: a jitted prefill and a jitted decode loop over a static KV cache.

``generate`` takes token-id prompts of any lengths, left-pads them into a bucket of ``Lp`` slots, runs one prefill
that writes the cache and yields each row's next-token logits, then a ``lax.while_loop`` that per step

    z = logits / τ  →  (constraint) mask to the row's trie  →  top-k, top-p  →  sample (argmax when greedy)
    record the token and its log-probs  →  stop token / per-row length?  →  feed the token, next logits

until every row has finished or ``max_new_tokens`` steps have run. Rows that finish drop out of the bookkeeping;
the batch keeps its shape (fixed capacity, masks; STYLE.md 5).

Log-probs. ``logp`` is ``log softmax(z)`` at the sampled token, renormalised over the allowed tokens when a
constraint is given (the distribution the token was drawn from before top-k / top-p truncation, as vLLM and
verl report it); ``logp_unmasked`` is the same without the constraint mask. With τ = 1 and no truncation, ``logp``
is exactly the behaviour log-prob a policy-gradient update needs.

Stop strings cannot be matched inside ``jit`` (a string can end in the middle of a token). With stop strings the
loop runs in chunks of ``check_every`` steps; between chunks the host decodes each live row and finishes the
rows whose text contains a stop string, at the token that completed it. Without stop strings one loop runs to
the end.

Shapes are bucketed (prompt slots to a multiple of ``prompt_bucket``) so that a training run compiles a handful of
programs, not one per batch.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx, struct
from jax.extend.random import threefry2x32_p
from jaxtyping import Array, Float

from agentjax.models import constrain
from agentjax.models.choose import choose
from agentjax.models.qwen import KVCache, Qwen
from agentjax.models.sampling import Finish, SampleOutput, SamplingParams, left_pad


@struct.dataclass(frozen=True)
class DecodeState:
    """The decode loop's carry (STYLE.md 4)."""

    cache: KVCache
    logits_bv: jax.Array | None  # [B, V] float32: next-token logits of every row (None: sparse, hidden_bd)
    position_b: jax.Array  # [B] int32: RoPE position of the next token
    node_b: jax.Array  # [B] int32: trie node (constrained decoding)
    tokens_bt: jax.Array  # [B, T] int32
    logp_bt: jax.Array  # [B, T] float32
    logp_unmasked_bt: jax.Array  # [B, T] float32
    length_b: jax.Array  # [B] int32
    finish_b: jax.Array  # [B] int32 (Finish)
    step: jax.Array  # [] int32
    key: jax.Array  # PRNG key
    row_keys: jax.Array | None = None  # [B] PRNG keys: row b samples token s with fold_in(row_keys[b], s)
    hidden_bd: jax.Array | None = None  # [B, D] final hidden state of the last token (sparse constrained decoding)


def filter_top_k_top_p(z_bv: Float[Array, "B V"], top_k: int, top_p: float) -> Float[Array, "B V"]:
    """Sets logits outside the top-k and outside the smallest nucleus of mass ≥ top_p to a large negative value.

    The nucleus keeps every token whose preceding cumulative mass (in descending order) is < top_p, so the most
    likely token always survives.
    """
    neg = jnp.finfo(z_bv.dtype).min
    if top_k > 0 and top_k < z_bv.shape[-1]:
        kth_b1 = jax.lax.top_k(z_bv, top_k)[0][:, -1:]
        z_bv = jnp.where(z_bv < kth_b1, neg, z_bv)
    if top_p < 1.0:
        order_bv = jnp.argsort(-z_bv, axis=-1)
        sorted_bv = jnp.take_along_axis(z_bv, order_bv, axis=-1)
        p_bv = jax.nn.softmax(sorted_bv, axis=-1)
        before_bv = jnp.cumsum(p_bv, axis=-1) - p_bv
        keep_sorted = before_bv < top_p
        keep_bv = jnp.zeros_like(keep_sorted).at[jnp.arange(z_bv.shape[0])[:, None], order_bv].set(keep_sorted)
        z_bv = jnp.where(keep_bv, z_bv, neg)
    return z_bv


def _sparse_choice(state: DecodeState, trie, stop_ids, params: SamplingParams, model, width: int, sub,
                   dense_draws: bool = False):
    """Sparse constrained decoding: logits of the allowed tokens only (``h · W[a]`` for the ``width`` slots of
    :func:`~agentjax.models.constrain.allowed_ids`), sampled among them. Returns ``(token_b, logp_b)``: the
    token and its log-probability under the constrained distribution (the masked softmax restricted to the
    allowed set: the same distribution as the dense path's ``mask_logits``). Drawn with its own random numbers, or
    with ``dense_draws`` the dense path's (:func:`_draw_as_dense`: the same token as dense decoding, up to the float
    rounding of ``h · W[a]`` against the full logits; needs :func:`exact_draws_supported` and no top-k / top-p)."""
    tau = 1.0 if params.greedy else params.temperature
    ids_ba, ok_ba = constrain.allowed_ids(trie, state.node_b, stop_ids, width)
    if dense_draws:
        ok_ba = _count_stop_ids_once(ids_ba, ok_ba, stop_ids.shape[0])
    w_bad = jnp.take(model.unembedding_vd, ids_ba, axis=0)
    z_ba = jnp.einsum("BD,BAD->BA", state.hidden_bd, w_bad.astype(state.hidden_bd.dtype),
                      preferred_element_type=jnp.float32) / tau
    z_ba = constrain.mask_logits(z_ba, ok_ba)
    logp_ba = jax.nn.log_softmax(z_ba, axis=-1)
    if dense_draws:
        choice_b = _draw_as_dense(state, params, sub, z_ba, ids_ba, ok_ba, model.unembedding_vd.shape[0])
    elif params.greedy:
        choice_b = jnp.argmax(z_ba, axis=-1)
    else:
        z_ba = filter_top_k_top_p(z_ba, params.top_k, params.top_p)
        if state.row_keys is None:
            choice_b = jax.random.categorical(sub, z_ba, axis=-1)
        else:
            keys_b = jax.vmap(jax.random.fold_in, in_axes=(0, None))(state.row_keys, state.step)
            choice_b = jax.vmap(jax.random.categorical)(keys_b, z_ba)
    take = lambda m: jnp.take_along_axis(m, choice_b[:, None], axis=-1)[:, 0]  # noqa: E731
    return take(ids_ba).astype(jnp.int32), take(logp_ba)


def exact_draws_supported() -> bool:
    """Whether :func:`_gumbel_at` reproduces ``jax.random.categorical``'s draws: threefry keys in JAX's
    partitionable layout (bits of flat index ``i`` from the counter ``i``) and the default ("low") Gumbel mode."""
    return bool(jax.config.jax_threefry_partitionable) and not bool(
        getattr(jax.config, "jax_high_dynamic_range_gumbel", False)) and \
        jax.config.jax_default_prng_impl == "threefry2x32"


def _gumbel_at(key_data: jax.Array, index: jax.Array) -> jax.Array:
    """``jax.random.gumbel(key, shape, float32).ravel()[index]`` without the rest of the array: the threefry bits of
    counter ``index`` (hi word 0: the array has < 2³² entries), made uniform on [tiny, 1) and ``−log(−log u)``,
    step for step as ``jax.random.gumbel`` (threefry_partitionable, mode "low"; :func:`exact_draws_supported`).
    ``key_data``: ``[..., 2]`` uint32 (``jax.random.key_data``), broadcast against ``index``."""
    lo = index.astype(jnp.uint32)
    k1, k2 = (jnp.broadcast_to(key_data[..., i], lo.shape) for i in (0, 1))
    bits1, bits2 = threefry2x32_p.bind(k1, k2, jnp.zeros_like(lo), lo)
    bits = bits1 ^ bits2
    floats = jax.lax.bitcast_convert_type((bits >> jnp.uint32(9)) | jnp.uint32(0x3F800000), jnp.float32) \
        - jnp.float32(1.0)
    tiny = jnp.float32(jnp.finfo(jnp.float32).tiny)
    u = jax.lax.max(tiny, floats * (jnp.float32(1.0) - tiny) + tiny)
    return -jnp.log(-jnp.log(u))


def _count_stop_ids_once(ids_ba: jax.Array, ok_ba: jax.Array, n_stop: int) -> jax.Array:
    """``ok_ba`` without a stop id's slot where the same id is also a child token: the dense mask's set has it once."""
    if not n_stop:
        return ok_ba
    dup = (ids_ba[:, -n_stop:, None] == ids_ba[:, None, :-n_stop]) & ok_ba[:, None, :-n_stop]
    return ok_ba.at[:, -n_stop:].set(ok_ba[:, -n_stop:] & ~dup.any(-1))


def _draw_as_dense(state: DecodeState, params: SamplingParams, sub, z_ba, ids_ba, ok_ba, vocab: int) -> jax.Array:
    """The slot of the token the dense sampler draws, from the allowed tokens' (tempered, masked) logits ``z_ba``.

    The dense path samples ``argmax_v (z_v + g_v)`` over the masked logits (a disallowed ``z`` is ``finfo.min``,
    which no Gumbel noise ``g`` lifts above an allowed one), so its token is the argmax over the allowed ids with
    the Gumbel noise of those ids (:func:`_gumbel_at`: the same numbers as the ``[B, V]`` draw, no ``[B, V]``
    threefry, logs and mask); greedy is the argmax of ``z``. Ties (equal ``z + g``) go to the smaller vocabulary
    id, as the dense argmax."""
    if params.greedy:
        score_ba = z_ba
    elif state.row_keys is None:  # jax.random.categorical(sub, z_bv): Gumbel noise of flat index b·V + v
        score_ba = z_ba + _gumbel_at(jax.random.key_data(sub), jnp.arange(z_ba.shape[0])[:, None] * vocab + ids_ba)
    else:  # vmap(categorical)(keys_b, z_bv): row b's noise of index v under its own key
        keys_b = jax.vmap(jax.random.fold_in, in_axes=(0, None))(state.row_keys, state.step)
        score_ba = z_ba + _gumbel_at(jax.random.key_data(keys_b)[:, None, :], ids_ba)
    best_b = jnp.max(jnp.where(ok_ba, score_ba, -jnp.inf), axis=-1, keepdims=True)
    return jnp.argmin(jnp.where(ok_ba & (score_ba == best_b), ids_ba, vocab), axis=-1)


def _exact_choice(state: DecodeState, trie, stop_ids, params: SamplingParams, width: int, sub, z_bv):
    """Dense constrained decoding's token and log-probs from the allowed tokens only, with the same draws
    (:func:`_draw_as_dense`). Returns ``(token_b, logp_b, logp_unmasked_b)``: the constrained log-prob (softmax over
    the allowed ids: the dense masked softmax's value up to float rounding) and the unmasked one (the dense path's
    ``log_softmax(z)``, unchanged). Needs every row active (constrained)."""
    v = z_bv.shape[1]
    ids_ba, ok_ba = constrain.allowed_ids(trie, state.node_b, stop_ids, width)
    ok_ba = _count_stop_ids_once(ids_ba, ok_ba, stop_ids.shape[0])
    z_ba = constrain.mask_logits(jnp.take_along_axis(z_bv, ids_ba, axis=-1), ok_ba)
    logp_ba = jax.nn.log_softmax(z_ba, axis=-1)
    choice_b = _draw_as_dense(state, params, sub, z_ba, ids_ba, ok_ba, v)
    take = lambda m: jnp.take_along_axis(m, choice_b[:, None], axis=-1)[:, 0]  # noqa: E731
    token_b = take(ids_ba).astype(jnp.int32)
    logp_full = jax.nn.log_softmax(z_bv.astype(jnp.float32), axis=-1)
    return token_b, take(logp_ba), jnp.take_along_axis(logp_full, token_b[:, None], axis=-1)[:, 0]


def _sample_step(state: DecodeState, trie, stop_ids, max_new_b, params: SamplingParams, graphdef, weights,
                 sparse_width: int = 0, exact_width: int = 0, dense_draws: bool = False):
    """One token for every live row, then one decode step of the model on it (``sparse_width > 0``: sparse
    constrained decoding, :func:`_sparse_choice`: no ``[B, V]`` logits, and no unmasked log-probs, NaN;
    ``exact_width > 0``: the dense path's draws from the allowed tokens, :func:`_exact_choice`; ``dense_draws``:
    sparse decoding with the dense path's draws)."""
    model = nnx.merge(graphdef, weights)
    key, sub = jax.random.split(state.key)
    if sparse_width:
        b = state.hidden_bd.shape[0]
        token_b, logp_b = _sparse_choice(state, trie, stop_ids, params, model, sparse_width, sub, dense_draws)
        logp_un_b = jnp.full_like(logp_b, jnp.nan)
    else:
        b, v = state.logits_bv.shape
        tau = 1.0 if params.greedy else params.temperature
        z = state.logits_bv / tau
        if exact_width:
            token_b, logp_b, logp_un_b = _exact_choice(state, trie, stop_ids, params, exact_width, sub, z)
        elif trie is not None:
            allowed = constrain.allowed_tokens(trie, state.node_b, stop_ids, v)
            logp_masked_bv, logp_full_bv = constrain.masked_log_softmax(z, allowed)
            z = constrain.mask_logits(z, allowed)
        else:
            logp_full_bv = jax.nn.log_softmax(z, axis=-1)
            logp_masked_bv = logp_full_bv
        if exact_width:
            pass
        elif params.greedy:
            token_b = jnp.argmax(z, axis=-1).astype(jnp.int32)
        else:
            z = filter_top_k_top_p(z, params.top_k, params.top_p)
            if state.row_keys is None:
                token_b = jax.random.categorical(sub, z, axis=-1).astype(jnp.int32)
            else:  # per-row streams: a row's draws do not depend on which other rows share the batch
                keys_b = jax.vmap(jax.random.fold_in, in_axes=(0, None))(state.row_keys, state.step)
                token_b = jax.vmap(jax.random.categorical)(keys_b, z).astype(jnp.int32)
        if not exact_width:
            take = lambda m: jnp.take_along_axis(m, token_b[:, None], axis=-1)[:, 0]  # noqa: E731
            logp_b, logp_un_b = take(logp_masked_bv), take(logp_full_bv)

    live_b = state.finish_b == Finish.RUNNING
    rows = jnp.arange(b)
    col = jnp.minimum(state.step, state.tokens_bt.shape[1] - 1)
    tokens_bt = state.tokens_bt.at[rows, col].set(jnp.where(live_b, token_b, state.tokens_bt[:, col]))
    logp_bt = state.logp_bt.at[rows, col].set(jnp.where(live_b, logp_b, 0.0))
    logp_un_bt = state.logp_unmasked_bt.at[rows, col].set(jnp.where(live_b, logp_un_b, 0.0))
    length_b = state.length_b + live_b.astype(jnp.int32)
    stopped_b = jnp.any(token_b[:, None] == stop_ids[None, :], axis=-1) if stop_ids.shape[0] else jnp.zeros_like(
        live_b)
    finish_b = jnp.where(live_b & stopped_b, Finish.STOP_TOKEN,
                         jnp.where(live_b & (length_b >= max_new_b), Finish.LENGTH, state.finish_b))
    node_b = constrain.advance(trie, state.node_b, token_b) if trie is not None else state.node_b

    # feed the token (finished rows too: fixed shapes; their slots are never read for them again)
    out = model.decode(token_b[:, None], live_b[:, None].astype(jnp.int32), state.position_b[:, None],
                       state.cache)
    hidden_bd = out.hidden_bld[:, 0, :] if sparse_width else None
    logits_bv = None if sparse_width else model.logits(out.hidden_bld)[:, 0, :]
    return DecodeState(cache=out.cache, logits_bv=logits_bv, position_b=state.position_b + 1, node_b=node_b,
                       tokens_bt=tokens_bt, logp_bt=logp_bt, logp_unmasked_bt=logp_un_bt, length_b=length_b,
                       finish_b=finish_b.astype(jnp.int32), step=state.step + 1, key=key, row_keys=state.row_keys,
                       hidden_bd=hidden_bd)


@functools.partial(jax.jit, static_argnames=("graphdef", "slots", "max_new", "sparse"))
def _prefill(graphdef, weights, tokens_bl, segment_bl, key, row_keys, *, slots: int, max_new: int,
             sparse: bool = False) -> DecodeState:
    model = nnx.merge(graphdef, weights)
    b, lp = tokens_bl.shape
    cache = KVCache.init(model.config, b, slots)
    positions_bl = jnp.maximum(jnp.cumsum(segment_bl, axis=1) - 1, 0).astype(jnp.int32)
    out = model.decode(tokens_bl, segment_bl, positions_bl, cache, prefill=True)
    hidden_bd = out.hidden_bld[:, -1, :] if sparse else None
    logits_bv = None if sparse else model.logits(out.hidden_bld[:, -1:, :])[:, 0, :]
    zeros_bt = jnp.zeros((b, max_new), jnp.float32)
    return DecodeState(cache=out.cache, logits_bv=logits_bv, position_b=jnp.sum(segment_bl, axis=1).astype(jnp.int32),
                       node_b=jnp.zeros((b,), jnp.int32), tokens_bt=jnp.zeros((b, max_new), jnp.int32),
                       logp_bt=zeros_bt, logp_unmasked_bt=zeros_bt, length_b=jnp.zeros((b,), jnp.int32),
                       finish_b=jnp.zeros((b,), jnp.int32), step=jnp.zeros((), jnp.int32), key=key,
                       row_keys=row_keys, hidden_bd=hidden_bd)


@functools.partial(jax.jit, static_argnames=("graphdef", "params", "sparse_width", "exact_width", "dense_draws"),
                   donate_argnames=("state",))
def _decode(graphdef, weights, state: DecodeState, trie, stop_ids, max_new_b, until, *, params: SamplingParams,
            sparse_width: int = 0, exact_width: int = 0, dense_draws: bool = False):
    def cond(s):
        return (s.step < until) & jnp.any(s.finish_b == Finish.RUNNING)

    def body(s):
        return _sample_step(s, trie, stop_ids, max_new_b, params, graphdef, weights, sparse_width, exact_width,
                            dense_draws)

    return jax.lax.while_loop(cond, body, state)


class Sampler:
    """Generates from a :class:`Qwen` with a KV cache. Build once per model; ``generate`` per batch.

    Example::

        sampler = Sampler(model, tokenizer)
        out = sampler.generate(prompt_ids, SamplingParams(temperature=1.0, max_new_tokens=128,
                               stop_token_ids=(151645,)), key, allowed=admissible_actions_per_row)
    """

    def __init__(self, model: Qwen, tokenizer=None):
        self.graphdef, self.weights = nnx.split(model)
        self.config = model.config
        self.tokenizer = tokenizer

    def update_weights(self, model: Qwen) -> None:
        """Points the sampler at new parameters (after an update); no recompilation."""
        self.weights = nnx.state(model)

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        key: jax.Array,
        *,
        max_new_tokens: Sequence[int] | np.ndarray | None = None,
        allowed: Sequence[Sequence[str | Sequence[int]]] | constrain.TokenTrie | None = None,
        max_trie_edges: int = 1024,
        row_keys: jax.Array | None = None,
        sparse: bool = False,
        dense_draws: bool = False,
    ) -> SampleOutput:
        """Samples a response for every prompt.

        Args:
          prompts: token ids per row (different lengths are fine).
          params: :class:`SamplingParams` (static: each distinct value compiles once).
          key: PRNG key.
          max_new_tokens: per-row limits (≤ ``params.max_new_tokens``); default the global one.
          allowed: constrained decoding: per row, the strings it may emit or their token ids (an empty list leaves
            the row free; :mod:`agentjax.rollout.policy`), or a prebuilt :class:`~agentjax.models.constrain.TokenTrie`.
            A row then emits exactly one allowed string followed by a stop token, which ``params.stop_token_ids``
            must provide.
          max_trie_edges: edge capacity of the trie built from strings (rounded up to a power of two).
          row_keys: [B] PRNG keys, one stream per row (row b draws its s-th token with ``fold_in(row_keys[b], s)``
            instead of ``key``): a row's sample then depends on its prompt and its key only, not on the other rows
            of the batch — common random numbers across policies and batch compositions (evaluation).
          sparse: constrained decoding from the allowed tokens' logits only (``h · W[a]`` for at most
            ``max_branching + #stop ids`` tokens a step instead of the ``[B, V]`` logits, mask and softmax; for a
            small model with a large vocabulary the unembedding is nearly all of a decode step). The same
            constrained distribution, drawn with other random numbers than the dense path; ``logp_bt`` is the
            constrained log-prob and ``logp_unmasked_bt`` is NaN (not computed). Needs every row constrained.
          dense_draws: with ``sparse``, draw with the dense path's random numbers (the Gumbel noise of the allowed
            ids in the ``[B, V]`` draw): the same tokens as dense decoding up to the float rounding of the
            allowed logits — speed without changing a run's samples. Needs no top-k / top-p and JAX's
            partitionable threefry (:func:`exact_draws_supported`); otherwise a ``ValueError``.
        """
        b = len(prompts)
        max_new = params.max_new_tokens
        if params.stop_strings and self.tokenizer is None:
            raise ValueError("stop_strings need a tokenizer: Sampler(model, tokenizer)")
        limit_b = np.full((b,), max_new, np.int32) if max_new_tokens is None else np.asarray(max_new_tokens, np.int32)
        if limit_b.shape != (b,) or (limit_b <= 0).any() or (limit_b > max_new).any():
            raise ValueError(f"max_new_tokens per row must be {b} values in [1, {max_new}]")
        trie = None
        if allowed is not None:
            if not params.stop_token_ids:
                raise ValueError("constrained decoding needs stop_token_ids: a row ends with a stop token after its "
                                 "allowed string")
            if isinstance(allowed, constrain.TokenTrie):
                trie = allowed
            else:
                if self.tokenizer is None and any(isinstance(s, str) for row in allowed for s in row):
                    raise ValueError("allowed strings need a tokenizer: Sampler(model, tokenizer)")
                if len(allowed) != b:
                    raise ValueError(f"allowed has {len(allowed)} rows for {b} prompts")
                seqs = [[self.tokenizer.encode(s, add_special_tokens=False) if isinstance(s, str) else list(s)
                         for s in row] for row in allowed]
                needed = max((sum(len(q) for q in row) for row in seqs), default=1)
                trie = constrain.build_trie(seqs, max_edges=max(max_trie_edges, needed),
                                            vocab_size=self.config.vocab_size)
        width = 0
        if sparse:
            if trie is None or not bool(np.all(np.asarray(trie.active_b))):
                raise ValueError("sparse decoding samples among the allowed tokens: give every row an allowed list")
            width = constrain.max_branching(trie) + len(params.stop_token_ids)
            width = 1 << (width - 1).bit_length()  # a power of two: few compiled variants
        if dense_draws and not (sparse and params.top_k == 0 and params.top_p == 1.0 and exact_draws_supported()):
            raise ValueError("dense_draws reproduces the dense sampler's draws in sparse decoding: it needs "
                             "sparse=True, top_k=0, top_p=1.0 and JAX's partitionable threefry PRNG "
                             "(jax_threefry_partitionable=True, the default)")
        exact = 0  # dense decoding of constrained rows: the same draws from the allowed tokens only
        if (not sparse and trie is not None and params.top_k == 0 and params.top_p == 1.0 and exact_draws_supported()
                and bool(np.all(np.asarray(trie.active_b)))):
            exact = constrain.max_branching(trie) + len(params.stop_token_ids)
            exact = 1 << (exact - 1).bit_length()
        tokens, segment = left_pad(prompts, params.prompt_bucket)
        slots = tokens.shape[1] + max_new
        if row_keys is not None and row_keys.shape != (b,):
            raise ValueError(f"row_keys must hold one key per prompt ({b}), got shape {row_keys.shape}")
        state = _prefill(self.graphdef, self.weights, jnp.asarray(tokens), jnp.asarray(segment), key, row_keys,
                         slots=slots, max_new=max_new, sparse=sparse)
        stop_ids = jnp.asarray(params.stop_token_ids, jnp.int32).reshape(-1)
        limit = jnp.asarray(limit_b)
        chunk = params.check_every if params.stop_strings else max_new
        done_text: dict[int, int] = {}
        until = 0
        while True:
            until = min(until + chunk, max_new)
            state = _decode(self.graphdef, self.weights, state, trie, stop_ids, limit, jnp.int32(until),
                            params=params, sparse_width=width, exact_width=exact, dense_draws=dense_draws)
            if params.stop_strings:
                state = self._apply_stop_strings(state, params.stop_strings, done_text)
            if until >= max_new or not bool(jnp.any(state.finish_b == Finish.RUNNING)):
                break
        return self._finalise(state, params)

    def choose(self, prompts: Sequence[Sequence[int]], allowed: Sequence[Sequence[str]], params: SamplingParams,
               key: jax.Array) -> SampleOutput:
        """Constrained decoding among a few whole answers per row in one teacher-forced pass: the same
        distribution as ``generate(..., allowed=allowed)``, other random numbers, ``logp_unmasked`` NaN
        (:mod:`agentjax.models.choose`). Top-k / top-p: ``generate``'s decode loop."""
        if params.top_k or params.top_p < 1:
            return self.generate(prompts, params, key, allowed=allowed)
        return choose(self, prompts, allowed, params, key)

    def _apply_stop_strings(self, state: DecodeState, stops: tuple[str, ...], done: dict[int, int]) -> DecodeState:
        tokens = np.asarray(state.tokens_bt)
        length = np.asarray(state.length_b).copy()
        finish = np.asarray(state.finish_b).copy()
        changed = False
        for row in range(tokens.shape[0]):
            if row in done or finish[row] == Finish.STOP_TOKEN:
                continue
            cut = _stop_string_cut(self.tokenizer, tokens[row, : length[row]], stops)
            if cut is not None:
                done[row] = cut
                length[row], finish[row] = cut, Finish.STOP_STRING
                changed = True
        if not changed:
            return state
        return state.replace(length_b=jnp.asarray(length), finish_b=jnp.asarray(finish))

    def _finalise(self, state: DecodeState, params: SamplingParams) -> SampleOutput:
        length = np.asarray(state.length_b)
        finish = np.asarray(state.finish_b).copy()
        finish[finish == Finish.RUNNING] = Finish.LENGTH  # ran out of the static budget
        keep = np.arange(state.tokens_bt.shape[1])[None, :] < length[:, None]
        tokens = np.where(keep, np.asarray(state.tokens_bt), 0).astype(np.int32)
        logp = np.where(keep, np.asarray(state.logp_bt), 0.0).astype(np.float32)
        logp_un = np.where(keep, np.asarray(state.logp_unmasked_bt), 0.0).astype(np.float32)
        texts = None
        if self.tokenizer is not None:
            stop = set(params.stop_token_ids)
            texts = [self.tokenizer.decode([t for t in tokens[i, : length[i]] if t not in stop])
                     for i in range(len(length))]
        return SampleOutput(tokens_bt=tokens, logp_bt=logp, logp_unmasked_bt=logp_un, length_b=length.astype(np.int32),
                            finish_b=finish.astype(np.int32), texts=texts)


def _stop_string_cut(tokenizer, tokens: np.ndarray, stops: tuple[str, ...]) -> int | None:
    """The number of tokens up to and including the one that completes the first stop string, or None."""
    text = tokenizer.decode(tokens.tolist())
    if not any(s in text for s in stops):
        return None
    lo, hi = 1, len(tokens)  # the shortest prefix whose text contains a stop string (monotone in the prefix)
    while lo < hi:
        mid = (lo + hi) // 2
        if any(s in tokenizer.decode(tokens[:mid].tolist()) for s in stops):
            hi = mid
        else:
            lo = mid + 1
    return lo
