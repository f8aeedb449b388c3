"""make_update on a tiny policy: every method learns on its batch, the kernel's credit reaches each token
unchanged, micro-batching is exact, padding is inert, NaN updates are skipped and counted, one compilation."""

from __future__ import annotations

import dataclasses
import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from agentjax.credit.reference import crbc as ref_crbc
from agentjax.credit.reference import group_numpy
from agentjax.models import Qwen
from agentjax.rollout.groups import to_groups
from agentjax.train import (
    CRBCCredit,
    GiGPOCredit,
    GraphGPOCredit,
    GRPOCredit,
    HGPOCredit,
    NonFiniteUpdateError,
    PPOCredit,
    RLOOCredit,
    TrainConfig,
    check_nonfinite,
    compute_advantages,
    init_state,
    make_loss_fn,
    make_update,
    make_value_fn,
    next_key,
)
from agentjax.train.update import UpdateBatch, compact_rows
from tests.train.conftest import leaves_equal, token_batch

METHODS = [GRPOCredit(), RLOOCredit(), PPOCredit(), GiGPOCredit(), HGPOCredit(), GraphGPOCredit(), CRBCCredit()]


def advantages_for(config, state, model, batch):
    values = make_value_fn(config, model)(state, batch) if config.is_ppo else None
    return compute_advantages(config.credit, batch, config.rollout, values=values)


@pytest.mark.parametrize("credit", METHODS, ids=lambda c: c.method)
def test_one_update_of_every_method_changes_params_and_lowers_the_loss(credit, tiny_model, tiny_tx, tiny_batch):
    config = TrainConfig.tiny(credit=credit)
    state = init_state(config, tiny_model, jax.random.key(0), tiny_tx)
    adv = advantages_for(config, state, tiny_model, tiny_batch)
    assert float(jnp.abs(adv.advantage).max()) > 0.0, "the batch must carry credit"
    before = jax.tree.map(jnp.copy, state.trainable)
    update = make_update(config, tiny_model, tiny_tx)
    state, first = update(state, UpdateBatch.of(tiny_batch, adv), jax.random.key(1))
    state, second = update(state, UpdateBatch.of(tiny_batch, adv), jax.random.key(2))  # "loss": the updated params
    assert float(first["skipped"]) == 0.0 and float(second["skipped"]) == 0.0
    assert float(second["loss"]) < float(first["loss"])
    assert not leaves_equal(before["policy"], state.params)
    assert float(first["grad_norm"]) > 0.0
    assert 0.0 <= float(first["clip_frac"]) <= 1.0
    if config.is_ppo:
        assert not leaves_equal(before["value_head"], state.value_head)
        assert float(second["value_loss"]) < float(first["value_loss"])
    assert int(state.step) == 2 and int(state.nonfinite) == 0


def test_the_advantage_a_token_sees_is_the_kernels(tiny_model, tiny_tx, tiny_batch):
    """∂L/∂log π_old(y_t) = w_t A_t ρ_t (unclipped, ρ ≈ 1 on-policy; KL and entropy do not depend on π_old):
    with token-mean weights w = 1/#tokens, the gradient times #tokens is the advantage the token sees. It must be
    the advantage of the token's row from compute_advantages, and that CRBC's credit for the row's
    (group, rollout, step) — checked against the NumPy reference of CRBC."""
    config = TrainConfig.tiny(credit=CRBCCredit())
    ro = config.rollout
    state = init_state(config, tiny_model, jax.random.key(0), tiny_tx)
    adv = compute_advantages(config.credit, tiny_batch, ro)
    view = to_groups(tiny_batch, num_groups=ro.num_groups, num_rollouts=ro.group_size, max_steps=ro.max_steps)
    ref_grt = np.stack([ref_crbc.crbc(group_numpy(view, g))[0] for g in range(ro.num_groups)])
    real = np.asarray(tiny_batch.row_mask)
    g, r, t = (np.asarray(getattr(tiny_batch, k)) for k in ("group", "rollout", "step"))
    ref_b = np.where(real, ref_grt[np.where(real, g, 0), r, t], 0.0)
    np.testing.assert_allclose(adv.advantage, ref_b, rtol=1e-4, atol=1e-5)
    loss_fn = make_loss_fn(config, tiny_model)
    grad = jax.grad(lambda old: loss_fn(state, UpdateBatch.of(tiny_batch.replace(behaviour_logp=old), adv))[0])(
        tiny_batch.behaviour_logp)
    trained = np.asarray(tiny_batch.response_mask & tiny_batch.row_mask[:, None])
    seen = np.asarray(grad) * trained.sum()
    np.testing.assert_allclose(seen, np.where(trained, np.asarray(adv.advantage)[:, None], 0.0), rtol=2e-5,
                               atol=1e-6)
    assert np.all(np.asarray(grad)[~trained] == 0.0)
    assert len(np.unique(np.round(ref_b[real], 4))) > 2  # step-level credit varies within rollouts


def test_micro_batches_accumulate_to_the_whole_batch_gradient(tiny_model, tiny_tx, tiny_batch):
    """One update with 8-row micro-batches (5 of them, one all padding) equals one with the whole 40-row batch:
    the same loss and gradient norm, and the same parameters after the step."""
    results = []
    for micro in (8, 40):
        config = TrainConfig.tiny(micro_batch_size=micro)
        state = init_state(config, tiny_model, jax.random.key(0), tiny_tx)
        adv = compute_advantages(config.credit, tiny_batch, config.rollout)
        results.append(make_update(config, tiny_model, tiny_tx)(state, UpdateBatch.of(tiny_batch, adv),
                                                                  jax.random.key(1)))
    (s8, m8), (s40, m40) = results
    np.testing.assert_allclose(m8["loss"], m40["loss"], rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(m8["grad_norm"], m40["grad_norm"], rtol=1e-5)
    for k in ("pg_loss", "entropy", "kl", "clip_frac", "ratio_mean", "tokens"):
        np.testing.assert_allclose(m8[k], m40[k], rtol=1e-5, atol=1e-7)
    # Adam's first step is ±lr where |g| >> eps: a gradient sign error would move a parameter by 2·lr = 2e-3
    for a, b in zip(jax.tree.leaves(s8.params), jax.tree.leaves(s40.params), strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=5e-5)


def test_padding_rows_contribute_nothing(tiny_config, tiny_model, tiny_tx, tiny_batch):
    """Garbage in padding rows (tokens, masks, NaN log-probs, huge advantages) leaves the update unchanged."""
    pad = ~np.asarray(tiny_batch.row_mask)
    assert pad.sum() >= tiny_config.micro_batch_size  # at least one all-padding micro-batch is skipped
    adv = compute_advantages(tiny_config.credit, tiny_batch, tiny_config.rollout)
    rng = np.random.default_rng(5)
    b, lr = tiny_batch.response_tokens.shape
    garbage = tiny_batch.replace(
        response_tokens=jnp.where(pad[:, None], jnp.asarray(rng.integers(0, 512, (b, lr)), jnp.int32),
                                  tiny_batch.response_tokens),
        response_mask=tiny_batch.response_mask | pad[:, None],
        prompt_mask=tiny_batch.prompt_mask | pad[:, None],
        behaviour_logp=jnp.where(pad[:, None], jnp.nan, tiny_batch.behaviour_logp),
    )
    garbage_adv = adv.replace(advantage=jnp.where(pad, 1e6, adv.advantage))
    update = make_update(tiny_config, tiny_model, tiny_tx)
    clean, m_clean = update(init_state(tiny_config, tiny_model, jax.random.key(0), tiny_tx),
                            UpdateBatch.of(tiny_batch, adv), jax.random.key(3))
    compiled = update._cache_size()
    dirty, m_dirty = update(init_state(tiny_config, tiny_model, jax.random.key(0), tiny_tx),
                            UpdateBatch.of(garbage, garbage_adv), jax.random.key(3))
    assert float(m_dirty["skipped"]) == 0.0
    for a, b_ in zip(jax.tree.leaves(clean.params), jax.tree.leaves(dirty.params), strict=True):
        np.testing.assert_allclose(a, b_, rtol=1e-6, atol=1e-9)
    for k in ("loss", "pg_loss", "entropy", "tokens", "rows"):
        np.testing.assert_allclose(m_clean[k], m_dirty[k], rtol=1e-6)
    assert update._cache_size() == compiled  # other contents, same shapes: no new compilation


def test_nonfinite_updates_are_skipped_counted_logged_and_stop_the_run(tiny_model, tiny_tx, tiny_batch, caplog):
    config = TrainConfig.tiny(max_nonfinite_updates=1)
    trained = np.asarray(tiny_batch.response_mask & tiny_batch.row_mask[:, None])
    r, t = np.argwhere(trained)[0]
    poisoned = tiny_batch.replace(behaviour_logp=tiny_batch.behaviour_logp.at[r, t].set(jnp.nan))
    adv = compute_advantages(config.credit, poisoned, config.rollout)
    state = init_state(config, tiny_model, jax.random.key(0), tiny_tx)
    before = jax.tree.map(jnp.copy, (state.params, state.opt_state))
    update = make_update(config, tiny_model, tiny_tx)
    state, metrics = update(state, UpdateBatch.of(poisoned, adv), jax.random.key(1))
    assert float(metrics["skipped"]) == 1.0 and int(state.nonfinite) == 1 and int(state.step) == 1
    assert not np.isfinite(float(metrics["loss"]))
    assert leaves_equal(before, (state.params, state.opt_state))  # nothing applied
    with caplog.at_level(logging.WARNING, logger="agentjax.train.update"):
        check_nonfinite(state, metrics, config)  # 1 skip is within the limit
    assert "skipped" in caplog.text and "non-finite" in caplog.text
    # a clean update after the skip is applied, and its lr is the first step's (skips do not advance schedules)
    state, metrics = update(state, UpdateBatch.of(tiny_batch, adv.replace(advantage=jnp.nan_to_num(adv.advantage))),
                            jax.random.key(2))
    assert float(metrics["skipped"]) == 0.0 and not leaves_equal(before[0], state.params)
    check_nonfinite(state, metrics, config)
    state, metrics = update(state, UpdateBatch.of(poisoned, adv), jax.random.key(3))
    with pytest.raises(NonFiniteUpdateError, match="max_nonfinite_updates=1"):
        check_nonfinite(state, metrics, config)


def test_keys_come_from_the_state_stream(tiny_config, tiny_model, tiny_tx):
    state = init_state(tiny_config, tiny_model, jax.random.key(7), tiny_tx)
    s1, k1 = next_key(state)
    s2, k2 = next_key(s1)
    _, k1_again = next_key(state)
    assert jnp.array_equal(jax.random.key_data(k1), jax.random.key_data(k1_again))
    assert not jnp.array_equal(jax.random.key_data(k1), jax.random.key_data(k2))
    assert not jnp.array_equal(s1.rng, state.rng)


def test_bad_batches_are_rejected_with_a_fix(tiny_model, tiny_tx, tiny_batch):
    config = TrainConfig.tiny(micro_batch_size=8)
    from agentjax.rollout.batch import StepBatch

    odd = StepBatch.from_rows(36, 16, 16, group=np.zeros(3, np.int32), rollout=np.arange(3, dtype=np.int32))
    with pytest.raises(ValueError, match="micro_batch_size"):
        make_loss_fn(config, tiny_model)(init_state(config, tiny_model, jax.random.key(0), tiny_tx),
                                         UpdateBatch.of(odd, compute_advantages(config.credit, odd, config.rollout)))
    with pytest.raises(ValueError, match="no value head"):
        make_value_fn(config, tiny_model)


def test_allowed_logprobs_renormalise_the_softmax_over_the_allowed_tokens():
    """``allowed_logprobs`` equals the full-vocabulary softmax restricted to each position's allowed tokens and
    renormalised (NumPy), with its entropy; padding positions give 0; only allowed rows of W get a gradient."""
    from agentjax.train.update import allowed_logprobs

    rng = np.random.default_rng(0)
    b, l, d, v, a, tau = 3, 5, 8, 50, 4, 0.7
    h = rng.normal(size=(b, l, d)).astype(np.float32)
    w = rng.normal(size=(v, d)).astype(np.float32)
    allowed = np.full((b, l, a), -1, np.int32)
    targets = np.zeros((b, l), np.int32)
    for i in range(b):
        for j in range(l):
            k = 0 if (i, j) == (0, 0) else rng.integers(1, a + 1)
            ids = rng.choice(v // 2, size=k, replace=False)  # tokens v//2.. are never allowed
            allowed[i, j, :k] = ids
            targets[i, j] = ids[rng.integers(k)] if k else 0
    logp, ent = allowed_logprobs(jnp.asarray(h), jnp.asarray(w), jnp.asarray(targets), jnp.asarray(allowed),
                                 temperature=tau)
    z = h @ w.T / tau
    for i in range(b):
        for j in range(l):
            ids = allowed[i, j][allowed[i, j] >= 0]
            if not len(ids):
                assert float(logp[i, j]) == 0.0 and float(ent[i, j]) == 0.0
                continue
            zs = z[i, j, ids].astype(np.float64)
            lp = zs - np.log(np.exp(zs - zs.max()).sum()) - zs.max()
            np.testing.assert_allclose(float(logp[i, j]), lp[list(ids).index(targets[i, j])], atol=1e-5)
            np.testing.assert_allclose(float(ent[i, j]), -(np.exp(lp) * lp).sum(), atol=1e-5)
    outside = targets.copy()
    outside[1, 1] = v - 1  # not among the allowed: the batch is inconsistent
    assert float(allowed_logprobs(*map(jnp.asarray, (h, w, outside, allowed)))[0][1, 1]) == -np.inf

    def objective(w):
        lp, e = allowed_logprobs(jnp.asarray(h), w, jnp.asarray(targets), jnp.asarray(allowed))
        return lp.sum() + e.sum()

    grad = np.asarray(jax.grad(objective)(jnp.asarray(w)))
    assert np.isfinite(grad).all()
    assert (grad[v // 2:] == 0).all() and np.abs(grad[: v // 2]).sum() > 0


def test_an_update_on_allowed_tokens_lowers_the_loss(tiny_config, tiny_model, tiny_tx, tiny_batch):
    """A batch with ``allowed_tokens`` (each trained token plus 3 others) trains the renormalised distribution."""
    rng = np.random.default_rng(1)
    b, lr = tiny_batch.response_tokens.shape
    allowed = rng.integers(0, tiny_config.model.arch.vocab_size, (b, lr, 4)).astype(np.int32)
    allowed[..., 0] = np.asarray(tiny_batch.response_tokens)
    batch = tiny_batch.replace(allowed_tokens=jnp.asarray(allowed))
    from tests.train.conftest import on_policy

    batch = on_policy(tiny_config, tiny_model, batch)
    assert float(jnp.max(jnp.where(batch.response_mask & batch.row_mask[:, None], batch.behaviour_logp, -9))) <= 0
    config = TrainConfig.tiny(credit=GRPOCredit())
    state = init_state(config, tiny_model, jax.random.key(0), tiny_tx)
    adv = advantages_for(config, state, tiny_model, batch)
    update = make_update(config, tiny_model, tiny_tx)
    state, first = update(state, UpdateBatch.of(batch, adv), jax.random.key(1))
    state, second = update(state, UpdateBatch.of(batch, adv), jax.random.key(2))
    assert float(first["skipped"]) == 0.0 and float(second["loss"]) < float(first["loss"])
    assert float(first["ratio_mean"]) == pytest.approx(1.0, abs=1e-4)  # on-policy under the same renormalisation
    assert 0.0 < float(first["entropy"]) <= np.log(4) + 1e-5


@pytest.mark.slow  # for CI time: `make test-slow` (README, "Tests")
def test_mini_batches_and_epochs_are_that_many_optimizer_steps(tiny_config, tiny_model, tiny_tx, tiny_batch):
    """``mini_batches = 2, epochs = 2`` is 4 AdamW steps in one update: the optimizer's count advances by 4, the
    loop's update counter by 1, and the result equals 4 single-step updates on the mini-batches it dealt."""
    config = TrainConfig.tiny(credit=GRPOCredit(), mini_batches=2, epochs=2, micro_batch_size=4)
    single = TrainConfig.tiny(credit=GRPOCredit(), micro_batch_size=4)
    state = init_state(config, tiny_model, jax.random.key(0), tiny_tx)
    reference = init_state(single, tiny_model, jax.random.key(0), tiny_tx)
    adv = advantages_for(config, state, tiny_model, tiny_batch)
    state, metrics = make_update(config, tiny_model, tiny_tx)(state, UpdateBatch.of(tiny_batch, adv), jax.random.key(7))
    assert int(state.step) == 1 and float(metrics["skipped"]) == 0.0
    counts = [int(x) for x in jax.tree.leaves(state.opt_state) if getattr(x, "dtype", None) == jnp.int32]
    assert counts and all(c == 4 for c in counts)
    # the same four steps by hand: the rows each epoch dealt, one single-step update each
    from agentjax.train.update import UpdateSpec, _mini_batch_rows

    spec = UpdateSpec.of(config)
    step = make_update(single, tiny_model, tiny_tx)
    whole = UpdateBatch.of(tiny_batch, adv)
    for epoch_key in jax.random.split(jax.random.key(7), 2):
        for idx in _mini_batch_rows(spec, tiny_batch.row_mask, epoch_key):
            mb = jax.tree.map(lambda x, idx=idx: x[idx], whole)
            assert int(mb.steps.row_mask.sum()) in (int(tiny_batch.row_mask.sum()) // 2,
                                                    -(-int(tiny_batch.row_mask.sum()) // 2))  # real rows split evenly
            big = jax.tree.map(lambda x: jnp.concatenate([x, jnp.zeros_like(x)]), mb)  # full capacity, padded
            reference, _ = step(reference, big, None)
    for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(reference.params), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-6)
    with pytest.raises(ValueError, match="mini-batches of whole micro-batches"):
        TrainConfig.tiny(mini_batches=3)


def test_a_remat_model_with_kl_updates_like_the_plain_one(tiny_config, tiny_model, tiny_tx, tiny_batch):
    """The paper presets remat every block and train with a KL term: the reference forward runs inside the
    update's gradient trace, where ``nnx.remat`` failed ("Cannot mutate Param from a different trace level").
    Remat changes memory, not numbers."""
    assert tiny_config.loss.kl_coef > 0
    remat_config = tiny_config.replace(model=dataclasses.replace(tiny_config.model,
                                                              arch=tiny_config.model.arch.replace(remat=True)))
    remat_model = Qwen(remat_config.model.arch, rngs=nnx.Rngs(0))
    out = []
    for config, model in ((tiny_config, tiny_model), (remat_config, remat_model)):
        state = init_state(config, model, jax.random.key(0), tiny_tx)
        adv = advantages_for(config, state, model, tiny_batch)
        state, metrics = make_update(config, model, tiny_tx)(state, UpdateBatch.of(tiny_batch, adv), jax.random.key(1))
        out.append((state.params, metrics))
    (p0, m0), (p1, m1) = out
    assert float(m1["skipped"]) == 0.0
    np.testing.assert_allclose(float(m1["loss"]), float(m0["loss"]), rtol=1e-5)
    for a, b in zip(jax.tree.leaves(p0), jax.tree.leaves(p1), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)


def _prefixed_batch(config, prefix_len: int, seed: int = 0):
    """A batch whose real rows' left-padded prompts open with the same ``prefix_len`` tokens (a system prompt)."""
    batch = token_batch(config, seed)
    rng = np.random.default_rng(seed)
    b, lp = batch.prompt_tokens.shape
    real = np.asarray(batch.row_mask)
    lens = np.where(real, rng.integers(prefix_len + 1, lp + 1, b), 0)
    prefix = rng.integers(0, config.model.arch.vocab_size, prefix_len)
    tokens = np.asarray(batch.prompt_tokens).copy()
    for i in np.flatnonzero(real):
        tokens[i, lp - lens[i]: lp - lens[i] + prefix_len] = prefix
    mask = np.arange(lp)[None, :] >= (lp - lens)[:, None]
    return batch.replace(prompt_tokens=jnp.asarray(tokens), prompt_mask=jnp.asarray(mask)), prefix, lens


def test_compact_rows_keeps_every_real_token_after_the_shared_prefix():
    config = TrainConfig.tiny(rollout=dataclasses.replace(TrainConfig.tiny().rollout, prompt_len=32))
    batch, prefix, lens = _prefixed_batch(config, prefix_len=11)
    small, prefix_p = compact_rows(batch, bucket=4)
    np.testing.assert_array_equal(prefix_p, prefix[:8])  # the common prefix cut to a multiple of the bucket
    real = np.asarray(batch.row_mask)
    width = small.prompt_tokens.shape[1]
    assert width == -(-(lens[real].max() - 8) // 4) * 4 < batch.prompt_tokens.shape[1]
    for i in np.flatnonzero(real):
        before = np.asarray(batch.prompt_tokens[i])[np.asarray(batch.prompt_mask[i])]
        after = np.asarray(small.prompt_tokens[i])[np.asarray(small.prompt_mask[i])]
        np.testing.assert_array_equal(np.concatenate([prefix_p, after]), before)
    # prompts that are not the collector's left-padded block are left alone
    holey = batch.replace(prompt_mask=batch.prompt_mask.at[np.flatnonzero(real)[0], -1].set(False))
    assert compact_rows(holey, bucket=4) == (holey, None)


@pytest.mark.slow  # for CI time: `make test-slow` (README, "Tests")
def test_a_compacted_update_changes_no_number(tiny_model, tiny_tx, monkeypatch):
    """Cutting the prompt padding and decoding the shared prefix once (TrainConfig.compact_rows) gives the same
    loss, metrics and parameters as the full batch, up to float rounding, with the KL term (reference forward)."""
    import agentjax.train.update as update_module

    monkeypatch.setattr(update_module, "COMPACT_BUCKET", 4)
    base = TrainConfig.tiny(rollout=dataclasses.replace(TrainConfig.tiny().rollout, prompt_len=32))
    assert base.loss.kl_coef > 0
    batch, _, _ = _prefixed_batch(base, prefix_len=10, seed=1)
    assert compact_rows(batch, bucket=4)[1] is not None
    out = []
    for compact in (False, True):
        config = base.replace(compact_rows=compact)
        state = init_state(config, tiny_model, jax.random.key(0), tiny_tx)
        adv = advantages_for(config, state, tiny_model, batch)
        state, metrics = make_update(config, tiny_model, tiny_tx)(state, UpdateBatch.of(batch, adv), jax.random.key(1))
        out.append((state.params, metrics))
    (p0, m0), (p1, m1) = out
    for k in ("loss", "pg_loss", "kl", "entropy", "grad_norm", "ratio_mean", "tokens", "rows"):
        np.testing.assert_allclose(float(m1[k]), float(m0[k]), rtol=1e-5, atol=1e-9, err_msg=k)
    # AdamW's step is ~lr · sign(g) where |g| is tiny, so rounding-level gradient differences show at ~1e-6 there
    for a, b in zip(jax.tree.leaves(p0), jax.tree.leaves(p1), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)
