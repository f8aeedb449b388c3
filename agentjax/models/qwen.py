"""The Qwen2/2.5 and Qwen3 decoder in Flax NNX: one module, batch-first, with a static KV cache.

Block ``i`` (pre-norm, as ``transformers``' ``Qwen2DecoderLayer`` / ``Qwen3DecoderLayer``)::

    a = x + Attn(RMSNorm(x))          Attn: GQA with RoPE(θ) on q, k; Qwen3 RMS-normalises q, k per head first
    y = a + W_down (silu(W_gate n) ⊙ W_up n),   n = RMSNorm(a)

and ``logits = RMSNorm(x_L) E^T`` (``E`` the embedding when tied, the LM head otherwise).

Rows and masks. A row is a sequence of slots; ``segment_bl`` labels each slot with its sequence (0 = padding).
A query attends to key slot ``j`` when the key is not padding, belongs to the same segment and ``j ≤ i``. Plain
padded batches use ``segment = 1`` on real tokens (left or right padding alike); packed rows number their
sequences 1, 2, ...; ``positions_bl`` restart per sequence (:func:`positions_from_segments`).

The cache (:class:`KVCache`) holds ``S`` slots per row and one write index shared by the batch. Prefill writes the
(left-padded) prompts at slots ``[0, Lp)``, each decode step writes one slot; ``valid_bs`` records which slots hold
real tokens. With a cache a query at slot ``s`` sees the valid slots ``≤ s``.

Numerics: parameters in ``param_dtype``, matmuls in ``dtype``; RMSNorm, the attention softmax and logits are float32
(as transformers' eager path: norms upcast, softmax with ``dtype=float32``).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import chex
import jax
import jax.numpy as jnp
from flax import nnx, struct
from jaxtyping import Array, Bool, Float, Int

from agentjax.models.config import QwenConfig

_MASKED = -0.7 * float(jnp.finfo(jnp.float32).max)  # finite: a fully masked (padding) query stays NaN-free


@struct.dataclass(frozen=True)
class KVCache:
    """Static key/value cache of every layer (STYLE.md 4)."""

    # Typed Any so that abstract values (eval_shape) and shardings can fill the same structure.
    k_lbskh: Any  # [layers, B, S, K, H], dtype
    v_lbskh: Any  # [layers, B, S, K, H], dtype
    valid_bs: Any  # [B, S], bool: the slot holds a real token
    end: Any  # [], int32: the next slot to write

    @classmethod
    def init(cls, config: QwenConfig, batch: int, slots: int) -> KVCache:
        shape = (config.num_layers, batch, slots, config.num_kv_heads, config.head_dim)
        return cls(k_lbskh=jnp.zeros(shape, config.jnp_dtype), v_lbskh=jnp.zeros(shape, config.jnp_dtype),
                   valid_bs=jnp.zeros((batch, slots), bool), end=jnp.zeros((), jnp.int32))

    @property
    def slots(self) -> int:
        return self.valid_bs.shape[1]


@dataclasses.dataclass(frozen=True)
class ActivationSharding:
    """Where activations are constrained (STYLE.md 10): the residual stream at every block boundary."""

    residual_bld: jax.sharding.Sharding | None = None
    logits_blv: jax.sharding.Sharding | None = None


def positions_from_segments(segment_bl: Int[Array, "B L"]) -> Int[Array, "B L"]:
    """RoPE positions that restart at 0 at the start of every segment; padding slots get 0.

    Left padding: ``[0, 0, 1, 1, 1] -> [0, 0, 0, 1, 2]``; packing: ``[1, 1, 2, 2, 2] -> [0, 1, 0, 1, 2]``.
    """
    chex.assert_rank(segment_bl, 2)
    idx_bl = jnp.broadcast_to(jnp.arange(segment_bl.shape[1], dtype=jnp.int32)[None, :], segment_bl.shape)
    prev_bl = jnp.pad(segment_bl[:, :-1], ((0, 0), (1, 0)), constant_values=-1)
    start_bl = jax.lax.cummax(jnp.where(segment_bl != prev_bl, idx_bl, 0), axis=1)
    return jnp.where(segment_bl != 0, idx_bl - start_bl, 0).astype(jnp.int32)


def dense(x: Array, w: Array, contract: int = 1) -> Array:
    """``x · w`` over the last ``contract`` axes of ``x`` and the first ``contract`` of ``w``, as one 2-D matmul
    over the flattened leading axes: ``[B, L, *in] · [*in, *out] -> [B, L, *out]`` (e.g. ``BLD,DNH->BLNH``).

    The same products as the einsum; written this way because XLA:CPU differentiates a ``[B, L, D]`` einsum into
    weight gradients that contract two axes and lays them out with transposing loop fusions, 3–4× slower than the
    2-D form (measured on the tiny preset's MLP). Sharding is unaffected: the
    merged row axis keeps the batch axis's sharding and the merged weight axis the heads' one.
    """
    k = math.prod(w.shape[:contract])
    out = x.reshape(-1, k) @ w.reshape(k, -1)
    return out.reshape(*x.shape[:x.ndim - contract], *w.shape[contract:])


def rms_norm(x: Float[Array, "*b D"], scale_d: Float[Array, " D"], eps: float) -> Float[Array, "*b D"]:
    """``scale ⊙ x / sqrt(mean(x²) + ε)`` with the statistics in float32, cast back before the scale (as HF)."""
    x32 = x.astype(jnp.float32)
    var = jnp.mean(jnp.square(x32), axis=-1, keepdims=True)
    y = (x32 * jax.lax.rsqrt(var + eps)).astype(x.dtype)
    return scale_d.astype(x.dtype).reshape((1,) * (x.ndim - 1) + scale_d.shape) * y


def rope(x_blnh: Float[Array, "B L N H"], positions_bl: Int[Array, "B L"], theta: float) -> Float[Array, "B L N H"]:
    """Rotary embedding in the rotate-half convention of transformers (dimensions i and i + H/2 pair up)."""
    h = x_blnh.shape[-1]
    inv_freq_h = 1.0 / (theta ** (jnp.arange(0, h, 2, dtype=jnp.float32) / h))  # [H/2]
    freqs_blh = positions_bl.astype(jnp.float32)[:, :, None] * inv_freq_h[None, None, :]
    angles_blh = jnp.concatenate([freqs_blh, freqs_blh], axis=-1)[:, :, None, :]  # [B, L, 1, H]
    cos, sin = jnp.cos(angles_blh).astype(x_blnh.dtype), jnp.sin(angles_blh).astype(x_blnh.dtype)
    x1, x2 = jnp.split(x_blnh, 2, axis=-1)
    rotated = jnp.concatenate([-x2, x1], axis=-1)
    return x_blnh * cos + rotated * sin


def _param(rngs: nnx.Rngs, shape: tuple[int, ...], config: QwenConfig, std: float = 0.02) -> nnx.Param:
    return nnx.Param((std * jax.random.normal(rngs.params(), shape, jnp.float32)).astype(config.jnp_param_dtype))


def _ones(shape: tuple[int, ...], config: QwenConfig) -> nnx.Param:
    return nnx.Param(jnp.ones(shape, config.jnp_param_dtype))


def _zeros(shape: tuple[int, ...], config: QwenConfig) -> nnx.Param:
    return nnx.Param(jnp.zeros(shape, config.jnp_param_dtype))


class Attention(nnx.Module):
    """Grouped-query self-attention with RoPE; Qwen2 q/k/v biases or Qwen3 per-head q/k RMSNorm."""

    def __init__(self, config: QwenConfig, *, rngs: nnx.Rngs):
        d, n, k, h = config.d_model, config.num_heads, config.num_kv_heads, config.head_dim
        self.config = config
        self.q_dnh = _param(rngs, (d, n, h), config)
        self.k_dkh = _param(rngs, (d, k, h), config)
        self.v_dkh = _param(rngs, (d, k, h), config)
        self.o_nhd = _param(rngs, (n, h, d), config)
        if config.qkv_bias:
            self.q_bias_nh, self.k_bias_kh, self.v_bias_kh = _zeros((n, h), config), _zeros((k, h), config),\
                _zeros((k, h), config)
        if config.qk_norm:
            self.q_norm_h, self.k_norm_h = _ones((h,), config), _ones((h,), config)

    def __call__(self, x_bld, positions_bl, segment_bl, cache_layer, *, by_rows: bool = False, prefix_kv=None,
                 prefill: bool = False):
        cfg = self.config
        dt = cfg.jnp_dtype
        q = dense(x_bld, self.q_dnh[...].astype(dt))  # BLD,DNH->BLNH
        k = dense(x_bld, self.k_dkh[...].astype(dt))  # BLD,DKH->BLKH
        v = dense(x_bld, self.v_dkh[...].astype(dt))  # BLD,DKH->BLKH
        if cfg.qkv_bias:
            q = q + self.q_bias_nh[...].astype(dt)[None, None]
            k = k + self.k_bias_kh[...].astype(dt)[None, None]
            v = v + self.v_bias_kh[...].astype(dt)[None, None]
        if cfg.qk_norm:
            q = rms_norm(q, self.q_norm_h[...], cfg.rms_eps)
            k = rms_norm(k, self.k_norm_h[...], cfg.rms_eps)
        q, k = rope(q, positions_bl, cfg.rope_theta), rope(k, positions_bl, cfg.rope_theta)

        if cache_layer is None:  # keys are this call's tokens (after a shared prefix's, with prefix_kv)
            out_blnh = causal_attention(cfg, q, k, v, segment_bl, by_rows=by_rows, prefix_kv=prefix_kv)
            new_cache = (k, v)  # post-RoPE keys and values (a shared prefix's, for the rows that follow it)
        elif prefill:  # an empty cache: the keys are this call's tokens, as without a cache (chunked, causal)
            k_cache, v_cache = cache_layer[:2]
            new_cache = (k.astype(k_cache.dtype), v.astype(v_cache.dtype))
            out_blnh = causal_attention(cfg, q, new_cache[0], new_cache[1], segment_bl, by_rows=by_rows)
        else:  # write the new keys at [end, end + L) and attend over every slot
            b, l = segment_bl.shape
            k_cache, v_cache, valid_bs, end = cache_layer
            new_cache = (k.astype(k_cache.dtype), v.astype(v_cache.dtype))  # the caller writes them into the cache
            k = jax.lax.dynamic_update_slice_in_dim(k_cache, new_cache[0], end, axis=1)
            v = jax.lax.dynamic_update_slice_in_dim(v_cache, new_cache[1], end, axis=1)
            q_slot_l = end + jnp.arange(l)
            k_slot_s = jnp.arange(valid_bs.shape[1])
            allowed_bls = valid_bs[:, None, :] & (k_slot_s[None, None, :] <= q_slot_l[None, :, None])
            out_blnh = attend(cfg, q, k, v, allowed_bls)
        return dense(out_blnh, self.o_nhd[...].astype(dt), contract=2), new_cache  # BLNH,NHD->BLD


QUERY_CHUNK = 64  # queries per block of the no-cache path on the CPU; keys past an unrolled block's end are skipped
ACCELERATOR_CHUNK = 256  # the same on accelerators, where blocks are scanned (QwenConfig.attention_unroll)


def attention_blocks(cfg: QwenConfig, length: int) -> tuple[int, bool]:
    """``(queries per block, unrolled?)`` of the no-cache attention over ``length`` queries (QwenConfig's
    ``attention_chunk`` and ``attention_unroll``; 0 picks by backend)."""
    cpu = jax.default_backend() == "cpu"
    chunk = cfg.attention_chunk or (QUERY_CHUNK if cpu else ACCELERATOR_CHUNK)
    unroll = cfg.attention_unroll or (128 if cpu else 1)
    return chunk, -(-length // chunk) <= unroll


def causal_attention(cfg: QwenConfig, q_blnh, k_blkh, v_blkh, segment_bl, *, by_rows: bool = False,
                     prefix_kv=None):
    """The no-cache (prefill-free) path: query ``i`` attends to key ``j ≤ i`` of its own segment (``segment_bl``,
    0 = padding), in query blocks (:func:`attention_blocks`). Up to ``attention_unroll`` blocks are unrolled and
    block ``c`` only scores keys ``[0, c_end)``; past that the blocks run in a ``lax.map`` of one shape (the
    sequence padded to whole blocks), each scoring every key under the mask — twice the score FLOPs of the
    triangle, a compiled program that does not grow with the sequence, and ``[B, N, chunk, S]`` scores at a time.
    Both give the same numbers: a masked key's weight is exactly 0 (:func:`attend`).
    ``prefix_kv``: ``(k [1, P, K, H], v [1, P, K, H])`` of a prefix every row continues (:meth:`Qwen.decode`'s
    ``prefix_p``): every query also attends to all ``P`` prefix keys, which come first.

    ``by_rows``: ``lax.map`` over the rows, each row's attention under ``jax.checkpoint`` (recomputed in the
    backward pass from q, k, v). The same products row by row; on XLA:CPU a row's ``[N, C, S]`` scores stay in
    the core's cache through the softmax and its gradient, where the whole batch's (``[B, N, C, S]``, tens of MB
    per chunk on the tiny preset) stream through memory at every step: forward 2.5×, forward + backward 2× faster
    on the tiny preset's micro-batch (40 rows of 522 tokens). Accelerators and
    sharded batches take the whole batch at once.
    """
    chunk, unrolled = attention_blocks(cfg, q_blnh.shape[1])

    def rows(q_blnh, k_blkh, v_blkh, segment_bl):
        b, l = segment_bl.shape
        if prefix_kv is not None:  # the prefix's keys first, seen by every query
            p = prefix_kv[0].shape[1]
            k_blkh, v_blkh = (jnp.concatenate([jnp.broadcast_to(x, (b, *x.shape[1:])), y], axis=1)
                              for x, y in zip(prefix_kv, (k_blkh, v_blkh), strict=True))
        else:
            p = 0

        def allowed_for(seg_q, q_pos, key_end):  # [B, C, P + key_end]
            seg_k = segment_bl[:, None, :key_end]
            causal = jnp.arange(key_end)[None, None, :] <= q_pos[None, :, None]
            allowed = (seg_q[:, :, None] == seg_k) & (seg_k != 0) & causal
            if p:
                allowed = jnp.concatenate([jnp.ones((b, q_pos.shape[0], p), bool), allowed], axis=2)
            return allowed

        if unrolled:
            outs = []
            for s in range(0, l, chunk):
                e = min(l, s + chunk)
                allowed = allowed_for(segment_bl[:, s:e], jnp.arange(s, e), e)
                outs.append(attend(cfg, q_blnh[:, s:e], k_blkh[:, :p + e], v_blkh[:, :p + e], allowed))
            return outs[0] if len(outs) == 1 else jnp.concatenate(outs, axis=1)
        n = -(-l // chunk)
        pad = n * chunk - l  # padded queries are segment 0: fully masked, finite, sliced off
        q_cblnh = jnp.pad(q_blnh, ((0, 0), (0, pad), (0, 0), (0, 0))).reshape(b, n, chunk, *q_blnh.shape[2:])
        seg_cbl = jnp.pad(segment_bl, ((0, 0), (0, pad))).reshape(b, n, chunk)

        @jax.checkpoint  # the backward pass recomputes one block's scores at a time
        def block(xs):
            q, seg_q, start = xs
            return attend(cfg, q, k_blkh, v_blkh, allowed_for(seg_q, start + jnp.arange(chunk), l))

        out = jax.lax.map(block, (q_cblnh.swapaxes(0, 1), seg_cbl.swapaxes(0, 1), jnp.arange(n) * chunk))
        return out.swapaxes(0, 1).reshape(b, n * chunk, *q_blnh.shape[2:])[:, :l]

    if not by_rows:
        return rows(q_blnh, k_blkh, v_blkh, segment_bl)
    one = jax.checkpoint(lambda xs: rows(*xs))  # the prefix's cotangent accumulates over the rows
    out = jax.lax.map(one, tuple(x[:, None] for x in (q_blnh, k_blkh, v_blkh, segment_bl)))
    return out[:, 0]


def attend(cfg: QwenConfig, q_blnh, k_bskh, v_bskh, allowed_bls):
    """``softmax(q kᵀ / √H, masked) v`` for GQA, float32 scores and softmax statistics.

    Queries are laid out ``[B, K, G, L, H]`` so the score matmul writes ``[B, K, G·L, S]`` directly, and the
    normalisation is applied to the ``[.., L, H]`` output instead of the ``[.., L, S]`` probabilities (the same
    value: ``Σ_s e_s v_s / Σ_s e_s`` with ``e = exp(score − max)``). Measured on the CPU benchmark
    (experiments/bench/model.py) against the plain softmax-then-matmul form. The mask is added as a bias (0 or
    the large negative ``_MASKED``, which absorbs any finite score exactly: the same numbers as a ``where``), which
    XLA:CPU applies faster than a select broadcast over the heads (the tiny preset's update: ×1.2 on attention).
    """
    dt = cfg.jnp_dtype
    b, l = q_blnh.shape[:2]
    groups = cfg.num_heads // cfg.num_kv_heads
    q_bkglh = q_blnh.reshape(b, l, cfg.num_kv_heads, groups, cfg.head_dim).transpose(0, 2, 3, 1, 4)
    scores = jnp.einsum("BKGLH,BSKH->BKGLS", q_bkglh, k_bskh.astype(dt), preferred_element_type=jnp.float32)
    bias_bls = jnp.where(allowed_bls, 0.0, _MASKED).astype(jnp.float32)
    scores = scores * (cfg.head_dim ** -0.5) + bias_bls[:, None, None, :, :]
    e = jnp.exp(scores - jax.lax.stop_gradient(jnp.max(scores, axis=-1, keepdims=True)))
    denominator = jnp.sum(e, axis=-1, keepdims=True).astype(dt)
    out = jnp.einsum("BKGLS,BSKH->BKGLH", e.astype(dt), v_bskh.astype(dt)) / denominator
    return out.transpose(0, 3, 1, 2, 4).reshape(b, l, cfg.num_heads, cfg.head_dim)


class MLP(nnx.Module):
    """SwiGLU: ``W_down (silu(W_gate x) ⊙ W_up x)``."""

    def __init__(self, config: QwenConfig, *, rngs: nnx.Rngs):
        self.config = config
        self.gate_df = _param(rngs, (config.d_model, config.mlp_dim), config)
        self.up_df = _param(rngs, (config.d_model, config.mlp_dim), config)
        self.down_fd = _param(rngs, (config.mlp_dim, config.d_model), config)

    def __call__(self, x_bld):
        dt = self.config.jnp_dtype
        gate = dense(x_bld, self.gate_df[...].astype(dt))  # BLD,DF->BLF
        up = dense(x_bld, self.up_df[...].astype(dt))  # BLD,DF->BLF
        return dense(jax.nn.silu(gate) * up, self.down_fd[...].astype(dt))  # BLF,FD->BLD


class Block(nnx.Module):
    def __init__(self, config: QwenConfig, *, rngs: nnx.Rngs):
        self.config = config
        self.attn_norm_d = _ones((config.d_model,), config)
        self.attn = Attention(config, rngs=rngs)
        self.mlp_norm_d = _ones((config.d_model,), config)
        self.mlp = MLP(config, rngs=rngs)

    def __call__(self, x_bld, positions_bl, segment_bl, cache_layer, *, by_rows: bool = False, prefix_kv=None,
                 prefill: bool = False):
        eps = self.config.rms_eps
        a, new_cache = self.attn(rms_norm(x_bld, self.attn_norm_d[...], eps), positions_bl, segment_bl, cache_layer,
                                 by_rows=by_rows, prefix_kv=prefix_kv, prefill=prefill)
        x_bld = x_bld + a
        return x_bld + self.mlp(rms_norm(x_bld, self.mlp_norm_d[...], eps)), new_cache


def _block_call(block, x_bld, positions_bl, segment_bl, cache_layer, by_rows=False, prefix_kv=None, prefill=False):
    return block(x_bld, positions_bl, segment_bl, cache_layer, by_rows=by_rows, prefix_kv=prefix_kv, prefill=prefill)


def _remat_block_call(block, x_bld, positions_bl, segment_bl, cache_layer, by_rows=False, prefix_kv=None,
                      prefill=False):
    """The block under ``jax.checkpoint`` (activations recomputed in the backward pass), as a pure function of its
    split state: ``nnx.remat`` writes the block's state back after the call, which fails when the block was
    merged inside another transformation's trace (the reference policy's forward inside the update's
    ``value_and_grad``: "Cannot mutate Param from a different trace level")."""
    if cache_layer is not None:
        raise ValueError("remat is for the no-cache (training) path")
    graphdef, state = nnx.split(block)

    def pure(state, x_bld, positions_bl, segment_bl, prefix_kv):
        return nnx.merge(graphdef, state)(x_bld, positions_bl, segment_bl, None, by_rows=by_rows, prefix_kv=prefix_kv)

    return jax.checkpoint(pure)(state, x_bld, positions_bl, segment_bl, prefix_kv)


@struct.dataclass(frozen=True)
class DecoderOutput:
    hidden_bld: jax.Array  # [B, L, D], dtype: after the final RMSNorm
    cache: KVCache | None  # the updated cache (None without one)
    layers: tuple[jax.Array, ...] | None  # each block's output [B, L, D] (before the final norm), when asked


class Qwen(nnx.Module):
    """The decoder: embedding, ``num_layers`` blocks, final RMSNorm, LM head (tied or not).

    ``decode(...)`` returns the final hidden states; ``logits(hidden)`` applies the head in float32. Log-probs of
    chosen tokens without a full ``[B, L, V]`` float32 tensor: :func:`agentjax.models.logprobs.token_logprobs`.
    """

    def __init__(self, config: QwenConfig, *, rngs: nnx.Rngs, act_sharding: ActivationSharding | None = None):
        self.config = config
        self.act_sharding = act_sharding
        self.embed_vd = _param(rngs, (config.vocab_size, config.d_model), config)
        self.blocks = nnx.List([Block(config, rngs=rngs) for _ in range(config.num_layers)])
        self.final_norm_d = _ones((config.d_model,), config)
        if not config.tie_embeddings:
            self.unembed_vd = _param(rngs, (config.vocab_size, config.d_model), config)

    @property
    def unembedding_vd(self) -> jax.Array:
        return (self.embed_vd if self.config.tie_embeddings else self.unembed_vd)[...]

    def _constrain(self, x, sharding):
        return x if sharding is None else jax.lax.with_sharding_constraint(x, sharding)

    def decode(
        self,
        tokens_bl: Int[Array, "B L"],
        segment_bl: Int[Array, "B L"] | Bool[Array, "B L"] | None = None,
        positions_bl: Int[Array, "B L"] | None = None,
        cache: KVCache | None = None,
        *,
        prefix_p: Int[Array, " P"] | None = None,
        prefill: bool = False,
        return_layers: bool = False,
    ) -> DecoderOutput:
        """Runs the decoder over ``tokens_bl``.

        Args:
          tokens_bl: token ids [B, L].
          segment_bl: sequence label of every slot (0 = padding); a bool mask works too. Default: all ones.
          positions_bl: RoPE positions; default :func:`positions_from_segments` (without a cache). With a cache
            the caller passes them (the sampler continues each row's count).
          cache: a :class:`KVCache`; the tokens are written at ``cache.end`` and the cache comes back advanced.
          prefix_p: ``P`` tokens that come before every row (a prompt prefix the rows share): decoded once, at
            positions ``0 .. P-1``, and attended by every query of every row, whose positions then start at ``P``
            (default positions). The rows' output is what decoding ``prefix_p`` followed by each row's own tokens
            gives, up to float rounding (the prefix's hidden states are not returned). Rows must be one segment
            (``segment_bl`` 0/1) and there is no cache.
          prefill: the cache is empty (``cache.end`` is 0, the sampler's prefill): the tokens attend among
            themselves with the no-cache path's chunked causal attention (:func:`causal_attention`) instead of over
            every cache slot; the same numbers up to float rounding, about half the scores.
          return_layers: also return every block's output (for the layer-by-layer parity tests).
        """
        chex.assert_rank(tokens_bl, 2)
        cfg = self.config
        if segment_bl is None:
            segment_bl = jnp.ones(tokens_bl.shape, jnp.int32)
        segment_bl = segment_bl.astype(jnp.int32)
        if positions_bl is None:
            if cache is not None:
                raise ValueError("decode with a cache needs explicit positions_bl (each row's next position)")
            positions_bl = positions_from_segments(segment_bl)
            if prefix_p is not None:
                positions_bl = positions_bl + prefix_p.shape[0]
        if prefix_p is not None:
            if cache is not None:
                raise ValueError("decode: a shared prefix is for the no-cache path")
            chex.assert_rank(prefix_p, 1)
            x_p = jnp.take(self.embed_vd[...], prefix_p[None], axis=0).astype(cfg.jnp_dtype)  # [1, P, D]
            positions_p = jnp.arange(prefix_p.shape[0], dtype=jnp.int32)[None]
            segment_p = jnp.ones_like(positions_p)
        x = jnp.take(self.embed_vd[...], tokens_bl, axis=0).astype(cfg.jnp_dtype)
        x = self._constrain(x, self.act_sharding and self.act_sharding.residual_bld)
        layers = []
        call = _remat_block_call if cfg.remat and cache is None else _block_call  # no backward pass with a cache
        # row by row on one CPU device's worth of unsharded rows (causal_attention); batched on accelerators / meshes
        by_rows = (cache is None or prefill) and self.act_sharding is None and jax.default_backend() == "cpu"
        if cache is not None:
            k_all, v_all = cache.k_lbskh, cache.v_lbskh
            valid_bs = jax.lax.dynamic_update_slice_in_dim(cache.valid_bs, segment_bl != 0, cache.end, axis=1)
        for i, block in enumerate(self.blocks):
            cache_layer = None if cache is None else (k_all[i], v_all[i], valid_bs, cache.end)
            prefix_kv = None
            if prefix_p is not None:  # the prefix through block i once; its keys and values serve every row
                x_p, prefix_kv = call(block, x_p, positions_p, segment_p, None, False)
            x, new_kv = call(block, x, positions_bl, segment_bl, cache_layer, by_rows, prefix_kv, prefill)
            x = self._constrain(x, self.act_sharding and self.act_sharding.residual_bld)
            if return_layers:
                layers.append(x)
            if cache is not None:  # write only the new slots of layer i (in place inside a jitted loop)
                at = (jnp.int32(i), jnp.int32(0), cache.end, jnp.int32(0), jnp.int32(0))
                k_all = jax.lax.dynamic_update_slice(k_all, new_kv[0][None], at)
                v_all = jax.lax.dynamic_update_slice(v_all, new_kv[1][None], at)
        hidden = rms_norm(x, self.final_norm_d[...], cfg.rms_eps)
        new_cache = None
        if cache is not None:
            new_cache = KVCache(k_lbskh=k_all, v_lbskh=v_all, valid_bs=valid_bs,
                                end=cache.end + jnp.int32(tokens_bl.shape[1]))
        return DecoderOutput(hidden_bld=hidden, cache=new_cache, layers=tuple(layers) if return_layers else None)

    def logits(self, hidden_bld: Float[Array, "B L D"]) -> Float[Array, "B L V"]:
        """``hidden E^T`` in the activation dtype, returned as float32. Only call it on the positions you need."""
        dt = self.config.jnp_dtype
        out = jnp.einsum("BLD,VD->BLV", hidden_bld.astype(dt), self.unembedding_vd.astype(dt),
                         preferred_element_type=jnp.float32)
        return self._constrain(out, self.act_sharding and self.act_sharding.logits_blv)

    def __call__(self, tokens_bl, segment_bl=None, positions_bl=None) -> Float[Array, "B L V"]:
        """Full logits (float32) of a batch without a cache: tests and small vocabularies only."""
        return self.logits(self.decode(tokens_bl, segment_bl, positions_bl).hidden_bld)
