"""The decoder against transformers layer by layer, masks and positions, numerics options, presets."""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

from agentjax.models.config import QwenConfig
from agentjax.models.hf import load_hf
from agentjax.models.logprobs import chunked_logprobs
from agentjax.models.qwen import QUERY_CHUNK, KVCache, Qwen, causal_attention, positions_from_segments
from tests.models.conftest import padded_batch

# Both architectures; Qwen3's run of the heavier equivalence checks is `make test-slow`'s, for CI time (README, "Tests")
BOTH = [QwenConfig.tiny_qwen2(), pytest.param(QwenConfig.tiny_qwen3(), marks=pytest.mark.slow)]


def assert_rel_close(ours, ref, tol=1e-5, where=None):
    """max |ours − ref| ≤ tol · max |ref| over the selected positions."""
    ours, ref = np.asarray(ours, np.float64), np.asarray(ref, np.float64)
    if where is not None:
        ours, ref = ours[where], ref[where]
    err, scale = np.abs(ours - ref).max(), np.abs(ref).max()
    assert err <= tol * scale, f"max abs error {err:.3g} > {tol} x {scale:.3g}"


def test_logits_and_every_layer_match_transformers(hf_checkpoint):
    family, hf_model, folder = hf_checkpoint
    model = load_hf(folder)
    assert model.config.family == family
    tokens, mask, positions = padded_batch()
    with torch.no_grad():
        ref = hf_model(torch.tensor(tokens), attention_mask=torch.tensor(mask), position_ids=torch.tensor(positions),
                       output_hidden_states=True)
    out = model.decode(jnp.asarray(tokens), jnp.asarray(mask), return_layers=True)
    real = mask.astype(bool)  # padded positions are undefined in both
    # transformers' hidden_states: embeddings, blocks 1..n-1, then the final block's output after the final norm
    assert len(ref.hidden_states) == model.config.num_layers + 1
    for i in range(model.config.num_layers - 1):
        assert_rel_close(out.layers[i], ref.hidden_states[i + 1].numpy(), where=real)
    assert_rel_close(out.hidden_bld, ref.hidden_states[-1].numpy(), where=real)
    assert_rel_close(model.logits(out.hidden_bld), ref.logits.numpy(), where=real)


def test_long_rows_take_the_query_chunked_path_and_still_match(hf_checkpoint):
    _, hf_model, folder = hf_checkpoint
    model = load_hf(folder)
    length = 2 * QUERY_CHUNK + 22
    tokens, mask, positions = padded_batch(seed=3, length=length)
    mask[1, : QUERY_CHUNK + 5] = 0  # padding across a whole query chunk
    positions = np.clip(mask.cumsum(1) - 1, 0, None)
    with torch.no_grad():
        ref = hf_model(torch.tensor(tokens), attention_mask=torch.tensor(mask),
                       position_ids=torch.tensor(positions)).logits.numpy()
    logits = jax.jit(lambda m, t, s: m(t, s))(model, jnp.asarray(tokens), jnp.asarray(mask))
    assert_rel_close(logits, ref, where=mask.astype(bool))


def test_default_positions_follow_the_padding():
    segment = jnp.array([[0, 0, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 2, 2, 2]])
    np.testing.assert_array_equal(positions_from_segments(segment),
                                  [[0, 0, 0, 1, 2], [0, 1, 2, 0, 0], [0, 1, 0, 1, 2]])


@pytest.mark.parametrize("config", BOTH, ids=lambda c: c.name)
def test_packed_rows_equal_separate_rows(config):
    model = Qwen(config, rngs=nnx.Rngs(1))
    rng = np.random.RandomState(0)
    a, b = rng.randint(0, config.vocab_size, 5), rng.randint(0, config.vocab_size, 7)
    packed = model(jnp.asarray(np.concatenate([a, b])[None]), jnp.asarray([[1] * 5 + [2] * 7]))
    alone_a, alone_b = model(jnp.asarray(a[None])), model(jnp.asarray(b[None]))
    np.testing.assert_allclose(packed[0, :5], alone_a[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(packed[0, 5:], alone_b[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("config", BOTH, ids=lambda c: c.name)
def test_left_and_right_padding_do_not_change_real_logits(config):
    model = Qwen(config, rngs=nnx.Rngs(2))
    seq = jnp.asarray(np.random.RandomState(1).randint(0, config.vocab_size, (1, 6)))
    alone = model(seq)
    left = model(jnp.pad(seq, ((0, 0), (3, 0))), jnp.pad(jnp.ones_like(seq), ((0, 0), (3, 0))))
    right = model(jnp.pad(seq, ((0, 0), (0, 3))), jnp.pad(jnp.ones_like(seq), ((0, 0), (0, 3))))
    np.testing.assert_allclose(left[:, 3:], alone, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(right[:, :6], alone, rtol=1e-5, atol=1e-5)
    chex.assert_tree_all_finite((left, right))  # padded queries attend to nothing and stay finite


@pytest.mark.parametrize("config", BOTH, ids=lambda c: c.name)
def test_kv_cache_decode_equals_full_forward(config):
    model = Qwen(config, rngs=nnx.Rngs(3))
    tokens = np.random.RandomState(4).randint(0, config.vocab_size, (2, 10))
    mask = np.ones((2, 10), np.int32)
    mask[1, :3] = 0  # left padding (the sampler's layout)
    positions = np.clip(mask.cumsum(1) - 1, 0, None)
    full = model(jnp.asarray(tokens), jnp.asarray(mask))
    # prefill 6 slots, then feed the remaining 4 tokens one at a time
    cache = KVCache.init(config, 2, 12)
    out = model.decode(jnp.asarray(tokens[:, :6]), jnp.asarray(mask[:, :6]), jnp.asarray(positions[:, :6]), cache)
    steps = [model.logits(out.hidden_bld)]
    cache = out.cache
    step = jax.jit(lambda m, t, s, p, c: m.decode(t, s, p, c))
    for i in range(6, 10):
        out = step(model, jnp.asarray(tokens[:, i:i + 1]), jnp.asarray(mask[:, i:i + 1]),
                   jnp.asarray(positions[:, i:i + 1]), cache)
        cache = out.cache
        steps.append(model.logits(out.hidden_bld))
    assert int(cache.end) == 10
    cached = jnp.concatenate(steps, axis=1)
    real = mask.astype(bool)
    assert_rel_close(cached, full, tol=1e-5, where=real)


@pytest.mark.parametrize("config", [QwenConfig.tiny_qwen2(), QwenConfig.tiny_qwen3()], ids=lambda c: c.name)
def test_chunked_logprobs_and_entropy_equal_the_full_softmax(config):
    model = Qwen(config, rngs=nnx.Rngs(4))
    tokens = jnp.asarray(np.random.RandomState(2).randint(0, config.vocab_size, (2, 13)))
    hidden = model.decode(tokens).hidden_bld
    targets = jnp.roll(tokens, -1, axis=1)
    logp, ent = chunked_logprobs(hidden, model.unembedding_vd, targets, chunk=4, temperature=0.7, with_entropy=True)
    full = jax.nn.log_softmax(model.logits(hidden) / 0.7, axis=-1)
    np.testing.assert_allclose(logp, jnp.take_along_axis(full, targets[:, :, None], -1)[:, :, 0], rtol=1e-5,
                               atol=1e-5)
    np.testing.assert_allclose(ent, -jnp.sum(jnp.exp(full) * full, -1), rtol=1e-5, atol=1e-5)
    # gradients agree too (the chunk body is rematerialised in the backward pass)
    e = model.unembedding_vd
    g_chunk = jax.grad(lambda h: chunked_logprobs(h, e, targets, chunk=4)[0].sum())(hidden)
    g_full = jax.grad(lambda h: jnp.take_along_axis(jax.nn.log_softmax(jnp.einsum("BLD,VD->BLV", h, e), -1),
                                                    targets[:, :, None], -1).sum())(hidden)
    np.testing.assert_allclose(g_chunk, g_full, rtol=1e-4, atol=1e-6)
    g_kept = jax.grad(lambda h: chunked_logprobs(h, e, targets, chunk=4, remat=False)[0].sum())(hidden)
    np.testing.assert_allclose(g_kept, g_chunk, rtol=1e-5, atol=1e-7)


@pytest.mark.slow  # for CI time: `make test-slow` (README, "Tests")
def test_remat_changes_nothing_but_memory():
    config = QwenConfig.tiny_qwen3()
    tokens = jnp.asarray(np.random.RandomState(3).randint(0, config.vocab_size, (2, 9)))

    def loss_and_grad(cfg):
        model = Qwen(cfg, rngs=nnx.Rngs(5))
        loss = lambda m: jnp.mean(jax.nn.log_softmax(m(tokens), -1)[:, :, 0])
        return nnx.value_and_grad(loss)(model)

    (l0, g0), (l1, g1) = loss_and_grad(config), loss_and_grad(config.replace(remat=True))
    np.testing.assert_allclose(l0, l1, rtol=1e-6)
    chex.assert_trees_all_close(jax.tree.leaves(g0), jax.tree.leaves(g1), rtol=1e-5, atol=1e-7)


def test_bfloat16_params_and_activations_keep_float32_logits():
    config = QwenConfig.tiny_qwen2(param_dtype="bfloat16", dtype="bfloat16")
    model = Qwen(config, rngs=nnx.Rngs(6))
    assert model.blocks[0].attn.q_dnh[...].dtype == jnp.bfloat16
    tokens = jnp.asarray(np.random.RandomState(4).randint(0, config.vocab_size, (2, 8)))
    out = model.decode(tokens)
    assert out.hidden_bld.dtype == jnp.bfloat16
    logits = model.logits(out.hidden_bld)
    assert logits.dtype == jnp.float32
    # close to the same weights run in float32
    f32 = Qwen(config.replace(param_dtype="float32", dtype="float32"), rngs=nnx.Rngs(6))
    nnx.update(f32, jax.tree.map(lambda x: x.astype(jnp.float32), nnx.state(model, nnx.Param)))
    np.testing.assert_allclose(logits, f32(tokens), atol=0.05 * float(jnp.abs(f32(tokens)).max()))


PUBLISHED = {  # parameter counts of the released checkpoints (model cards)
    "qwen2.5-0.5b": 494_032_768, "qwen2.5-1.5b": 1_543_714_304, "qwen2.5-3b": 3_085_938_688,
    "qwen2.5-7b": 7_615_616_512, "qwen3-4b": 4_022_468_096,
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_presets_have_the_published_parameter_counts(name):
    config = QwenConfig.preset(name)
    assert config.num_params() == PUBLISHED[name]
    # the preset survives a trip through config.json
    assert QwenConfig.from_hf(config.to_hf()).replace(name=config.name, max_positions=config.max_positions) == config


def test_config_errors_name_the_problem(tmp_path):
    with pytest.raises(ValueError, match="not a multiple of num_kv_heads"):
        QwenConfig.tiny_qwen2(num_heads=3)
    with pytest.raises(ValueError, match="unknown model preset"):
        QwenConfig.preset("qwen9")
    with pytest.raises(FileNotFoundError, match="config.json"):
        QwenConfig.from_hf(tmp_path)
    with pytest.raises(ValueError, match="model_type='llama'"):
        QwenConfig.from_hf({"model_type": "llama"})
    with pytest.raises(ValueError, match="num_layers: preset 24 vs checkpoint 2"):
        QwenConfig.qwen2p5_0p5b().check_against(QwenConfig.qwen2p5_0p5b(num_layers=2).to_hf())


def test_a_shared_prefix_decoded_once_equals_decoding_it_in_every_row():
    """decode(rows, prefix_p=p) is decode(p ++ row) on the row's real tokens: hidden states and gradients (Qwen3's
    block: the Qwen2 one less the q/k norms)."""
    config = QwenConfig.tiny_qwen3()
    model = Qwen(config, rngs=nnx.Rngs(6))
    rng = np.random.RandomState(5)
    p, length = QUERY_CHUNK + 6, QUERY_CHUNK + 30  # both cross a query chunk
    prefix = rng.randint(0, config.vocab_size, p)
    rows = rng.randint(0, config.vocab_size, (3, length))
    seg = np.ones((3, length), np.int32)
    seg[1, :40], seg[2, :QUERY_CHUNK + 10] = 0, 0  # left padding, the sampler's / collector's layout
    full_tokens, full_seg = np.zeros((3, p + length), np.int32), np.zeros((3, p + length), np.int32)
    for b in range(3):  # the prefix right before each row's real tokens, padding first
        n = seg[b].sum()
        full_tokens[b, length - n: length - n + p], full_tokens[b, p + length - n:] = prefix, rows[b, length - n:]
        full_seg[b, length - n:] = 1
    real = seg.astype(bool)

    def hidden_full(m):
        return m.decode(jnp.asarray(full_tokens), jnp.asarray(full_seg)).hidden_bld[:, p:]

    def hidden_prefixed(m):
        return m.decode(jnp.asarray(rows), jnp.asarray(seg), prefix_p=jnp.asarray(prefix)).hidden_bld

    assert_rel_close(nnx.jit(hidden_prefixed)(model), nnx.jit(hidden_full)(model), where=real)
    loss = lambda f: lambda m: jnp.sum(jnp.where(real[..., None], f(m), 0.0) ** 2)  # noqa: E731
    g_full, g_prefixed = (nnx.state(nnx.jit(nnx.grad(loss(f)))(model)) for f in (hidden_full, hidden_prefixed))
    for a, b in zip(jax.tree.leaves(g_full), jax.tree.leaves(g_prefixed), strict=True):
        assert_rel_close(b, a, tol=1e-4)


def test_row_by_row_attention_equals_the_batched_one():
    """causal_attention row by row (lax.map + checkpoint, the CPU path) and batched: outputs and gradients."""
    config = QwenConfig.tiny_qwen2()
    rng = np.random.RandomState(7)
    b, length, n, k, h = 3, QUERY_CHUNK + 20, config.num_heads, config.num_kv_heads, config.head_dim
    q = jnp.asarray(rng.randn(b, length, n, h), jnp.float32)
    kv = jnp.asarray(rng.randn(2, b, length, k, h), jnp.float32)
    prefix = tuple(jnp.asarray(rng.randn(1, 9, k, h), jnp.float32) for _ in range(2))
    seg = np.ones((b, length), np.int32)
    seg[0, :30] = 0
    seg[2, length - 5:] = 2  # a packed second segment
    for prefix_kv in (None, prefix):
        def attn(q, k_, v, by_rows, prefix_kv=prefix_kv):
            return causal_attention(config, q, k_, v, jnp.asarray(seg), by_rows=by_rows, prefix_kv=prefix_kv)

        real = jnp.asarray(seg != 0)[..., None, None]
        loss = lambda by_rows: lambda q, k_, v: jnp.sum(jnp.where(real, attn(q, k_, v, by_rows), 0.0) ** 2)  # noqa
        out = [jax.jit(attn, static_argnums=3)(q, kv[0], kv[1], by_rows) for by_rows in (True, False)]
        np.testing.assert_allclose(np.where(real, out[0], 0), np.where(real, out[1], 0), rtol=1e-5, atol=1e-6)
        for a_, b_ in zip(jax.jit(jax.grad(loss(True), (0, 1, 2)))(q, kv[0], kv[1]),
                          jax.jit(jax.grad(loss(False), (0, 1, 2)))(q, kv[0], kv[1]), strict=True):
            np.testing.assert_allclose(a_, b_, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("chunk", [17, pytest.param(QUERY_CHUNK, marks=pytest.mark.slow)])  # CI time
def test_scanned_attention_blocks_equal_the_unrolled_ones(chunk):
    """QwenConfig.attention_unroll: blocks in a lax.map over every key (masked) give the unrolled blocks' numbers —
    outputs and gradients, with padding, a packed segment and a shared prefix, batched and row by row."""
    unrolled = QwenConfig.tiny_qwen2(attention_chunk=chunk, attention_unroll=64)
    scanned = unrolled.replace(attention_unroll=1)
    rng = np.random.RandomState(3)
    b, length, n, k, h = 3, 2 * chunk + 11, unrolled.num_heads, unrolled.num_kv_heads, unrolled.head_dim
    q = jnp.asarray(rng.randn(b, length, n, h), jnp.float32)
    kv = jnp.asarray(rng.randn(2, b, length, k, h), jnp.float32)
    prefix = tuple(jnp.asarray(rng.randn(1, 5, k, h), jnp.float32) for _ in range(2))
    seg = np.ones((b, length), np.int32)
    seg[0, :chunk + 3] = 0
    seg[2, length - 7:] = 2
    real = jnp.asarray(seg != 0)[..., None, None]
    for prefix_kv, by_rows in ((None, False), (prefix, False), (prefix, True)):
        def loss(cfg, q, k_, v, prefix_kv=prefix_kv, by_rows=by_rows):
            out = causal_attention(cfg, q, k_, v, jnp.asarray(seg), by_rows=by_rows, prefix_kv=prefix_kv)
            return jnp.sum(jnp.where(real, out, 0.0) ** 2), out

        (la, oa), ga = jax.jit(jax.value_and_grad(functools.partial(loss, unrolled), (0, 1, 2), has_aux=True))(
            q, kv[0], kv[1])
        (lb, ob), gb = jax.jit(jax.value_and_grad(functools.partial(loss, scanned), (0, 1, 2), has_aux=True))(
            q, kv[0], kv[1])
        np.testing.assert_allclose(np.where(real, ob, 0), np.where(real, oa, 0), rtol=1e-5, atol=1e-6)
        for a_, b_ in zip(ga, gb, strict=True):
            np.testing.assert_allclose(b_, a_, rtol=1e-4, atol=1e-5)


def test_scanned_attention_program_does_not_grow_with_the_sequence():
    """With one unrolled block at most, a 4x longer sequence lowers to the same number of matmuls (the GPU compile
    of the unrolled path grew with the sequence); unrolled, it has more."""
    def dots(cfg, length):
        model = Qwen(cfg, rngs=nnx.Rngs(0))
        graphdef, params = nnx.split(model)

        def loss(params, tokens):
            return jnp.mean(nnx.merge(graphdef, params).decode(tokens).hidden_bld ** 2)

        text = jax.jit(jax.grad(loss)).lower(params, jnp.zeros((2, length), jnp.int32)).as_text()
        return text.count("dot_general")

    base = QwenConfig.tiny_qwen2(num_layers=1, attention_chunk=32)
    scanned, unrolled = base.replace(attention_unroll=1), base.replace(attention_unroll=64)
    assert dots(scanned, 64) == dots(scanned, 256)
    assert dots(unrolled, 256) > dots(unrolled, 64)
