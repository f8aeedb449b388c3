"""CISPO: hand cases, an explicit-loop NumPy reference, gradients (the clipped ratio is a constant), masking,
token-mean aggregation, jit == no-jit."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentjax.losses import cispo_loss, cispo_terms, cispo_token_loss


def ref_cispo(logp, old, adv, mask, clip_low, clip_high):
    """Explicit loops, float64: −clip(ρ, low, high) · A · log π per trained token."""
    out = np.zeros(logp.shape)
    for b in range(logp.shape[0]):
        for t in range(logp.shape[1]):
            if not mask[b, t]:
                continue
            ratio = np.exp(float(logp[b, t]) - float(old[b, t]))
            if clip_high is not None:
                ratio = min(ratio, clip_high)
            if clip_low is not None:
                ratio = max(ratio, clip_low)
            out[b, t] = -ratio * float(adv[b, t]) * float(logp[b, t])
    return out


def random_inputs(seed, b=4, l=6):
    rng = np.random.default_rng(seed)
    logp = -rng.exponential(1.0, (b, l)).astype(np.float32)
    old = (logp + rng.normal(0, 1.5, (b, l))).astype(np.float32)  # ratios from ~0.01 to ~100: both clips bind
    adv = rng.normal(0, 1, (b, l)).astype(np.float32)
    mask = rng.random((b, l)) < 0.8
    return logp, old, adv, mask


def test_hand_cispo_released_bounds():
    logp = jnp.log(jnp.array([[0.5, 0.5, 0.5, 0.5]], jnp.float32))
    old = jnp.log(jnp.array([[0.05, 0.25, 1.0, 0.5]], jnp.float32))  # ratios 10, 2, 0.5, (masked)
    adv = jnp.array([[1.0, 1.0, -2.0, 3.0]])
    mask = jnp.array([[True, True, True, False]])
    loss = cispo_token_loss(logp, old, adv, mask)  # ρ ∈ [0, 5]: only the ratio 10 is clipped
    log_half = np.log(0.5)
    np.testing.assert_allclose(loss, [[-5.0 * log_half, -2.0 * log_half, -0.5 * -2.0 * log_half, 0.0]], rtol=1e-5)
    terms = cispo_terms(logp, old, adv, mask)
    np.testing.assert_array_equal(terms.clipped, [[1.0, 0.0, 0.0, 0.0]])
    np.testing.assert_allclose(terms.ratio, [[10.0, 2.0, 0.5, 1.0]], rtol=1e-5)
    np.testing.assert_allclose(cispo_loss(logp, old, adv, mask), (-5.0 - 2.0 + 1.0) * log_half / 3, rtol=1e-5)
    minimax = cispo_token_loss(logp, old, adv, mask, clip_low=None, clip_high=1.28)  # MiniMax-M1's form
    np.testing.assert_allclose(minimax[0, :3], [-1.28 * log_half, -1.28 * log_half, 1.0 * log_half], rtol=1e-5)


def test_gradient_treats_the_clipped_ratio_as_a_constant():
    logp = jnp.log(jnp.array([[0.5, 0.5, 0.5]], jnp.float32))
    old = jnp.log(jnp.array([[0.05, 0.25, 0.5]], jnp.float32))  # ratios 10 (clipped to 5), 2, 1
    adv = jnp.array([[1.0, -2.0, 3.0]])
    mask = jnp.array([[True, True, False]])
    grad = jax.grad(lambda lp: cispo_token_loss(lp, old, adv, mask).sum())(logp)
    np.testing.assert_allclose(grad, [[-5.0, 4.0, 0.0]], rtol=1e-5)  # −sg(clip ρ) · A; the clipped token keeps it
    grad_mean = jax.grad(lambda lp: cispo_loss(lp, old, adv, mask))(logp)
    np.testing.assert_allclose(grad_mean, [[-2.5, 2.0, 0.0]], rtol=1e-5)


@pytest.mark.parametrize("bounds", [(0.0, 5.0), (None, 1.28), (0.8, 1.2), (None, None)])
def test_matches_reference(bounds):
    logp, old, adv, mask = random_inputs(1)
    got = cispo_token_loss(*(jnp.asarray(a) for a in (logp, old, adv, mask)), clip_low=bounds[0],
                           clip_high=bounds[1])
    np.testing.assert_allclose(got, ref_cispo(logp, old, adv, mask, *bounds), rtol=1e-5, atol=1e-6)


def test_padding_garbage_never_reaches_the_loss():
    logp, old, adv, mask = random_inputs(2)
    base = cispo_loss(*(jnp.asarray(a) for a in (logp, old, adv, mask)))
    junk = lambda x: np.where(mask, x, np.nan).astype(np.float32)  # noqa: E731
    args = (jnp.asarray(junk(logp)), jnp.asarray(junk(old)), jnp.asarray(junk(adv)), jnp.asarray(mask))
    np.testing.assert_allclose(cispo_loss(*args), base, rtol=1e-6)
    grad = jax.grad(lambda lp: cispo_loss(lp, *args[1:]))(args[0])
    assert np.isfinite(np.asarray(grad)).all()
    np.testing.assert_array_equal(np.asarray(grad)[~mask], 0.0)
    assert float(cispo_loss(*args[:3], jnp.zeros_like(args[3]))) == 0.0  # an empty mask


def test_token_mean_invariances():
    logp, old, adv, mask = random_inputs(3)
    args = [jnp.asarray(a) for a in (logp, old, adv, mask)]
    perm = np.random.default_rng(0).permutation(logp.shape[0])
    # a permutation reorders float32 sums: a few ulps
    np.testing.assert_allclose(cispo_loss(*(a[perm] for a in args)), cispo_loss(*args), rtol=1e-5)
    split = [cispo_token_loss(*(a[i:i + 2] for a in args)).sum() for i in (0, 2)]  # micro-batches sum up
    np.testing.assert_allclose(sum(split) / mask.sum(), cispo_loss(*args), rtol=1e-5)
    with jax.disable_jit():
        eager = cispo_loss(*args)
    np.testing.assert_allclose(jax.jit(cispo_loss)(*args), eager, rtol=1e-6)
