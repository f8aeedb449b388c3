"""SERO kernels: a hand-checked branch, the NumPy reference, invariances, gradients and compilation."""

from __future__ import annotations

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentjax.credit import sero
from agentjax.credit.reference import sero as ref
from agentjax.losses import sero as sero_loss

DETERMINISTIC = ("sero", "root_only", "full_flat", "depth_decay", "short_bridge")


def hand_branch():
    """3 real steps + 1 padded, L = 2: c = (0.5, 0.4, 0.9) -> w = (1, 0.5, 0.2, 0)."""
    logp_jl = jnp.log(jnp.array([[0.5, 0.5], [0.2, 0.8], [0.9, 0.1], [0.3, 0.3]], jnp.float32))
    token_mask_jl = jnp.array([[True, True], [True, True], [True, False], [True, True]])
    step_mask_j = jnp.array([True, True, True, False])
    return logp_jl, token_mask_jl, step_mask_j


def random_branches(seed: int, num_branches: int = 5, num_steps: int = 7, num_tokens: int = 4):
    rng = np.random.default_rng(seed)
    logp = -rng.exponential(1.0, (num_branches, num_steps, num_tokens)).astype(np.float32)
    token_mask = rng.random((num_branches, num_steps, num_tokens)) < 0.8
    lengths = rng.integers(0, num_steps + 1, num_branches)
    lengths[0] = num_steps
    step_mask = np.arange(num_steps)[None, :] < lengths[:, None]
    valid = rng.random(num_branches) < 0.8
    oracle = rng.integers(0, 2, num_branches).astype(np.float32)
    suffix = rng.integers(0, 2, num_branches).astype(np.float32)
    return logp, token_mask, step_mask, valid, oracle, suffix


def credit(arrays, **kw):
    return sero.batched_sero_credit(*(jnp.asarray(a) for a in arrays), **kw)


@functools.partial(jax.jit, static_argnames=("gamma", "k"))
def _all_schemes(arrays, key, gamma, k):
    return {(scheme, match_mass): sero.batched_sero_credit(*arrays, scheme=scheme, gamma=gamma, k=k, key=key,
                                                           match_mass=match_mass)
            for scheme in sero.SCHEMES for match_mass in (False, True)}


def all_schemes(arrays, *, key=None, gamma=0.7, k=3):
    """Every (scheme, match_mass) in one compiled call (keeps the test file fast)."""
    key = jax.random.key(0) if key is None else key
    return _all_schemes(tuple(jnp.asarray(a) for a in arrays), key, gamma, k)


# ------------------------------------------------------------------------------------------- hand case


def test_hand_case_compat_and_weights():
    logp_jl, token_mask_jl, step_mask_j = hand_branch()
    c_j = sero.compatibility(logp_jl, token_mask_jl, step_mask_j)
    np.testing.assert_allclose(c_j, [0.5, 0.4, 0.9, 0.0], rtol=1e-6)
    log_c_j = sero.mean_token_logp(logp_jl, token_mask_jl, step_mask_j)
    expected = {
        "sero": [1.0, 0.5, 0.2, 0.0],
        "root_only": [1.0, 0.0, 0.0, 0.0],
        "full_flat": [1.0, 1.0, 1.0, 0.0],
        "depth_decay": [1.0, 0.5, 0.25, 0.0],  # gamma = 0.5
        "short_bridge": [1.0, 1.0, 0.0, 0.0],  # k = 2
    }
    for scheme, want in expected.items():
        w_j = sero.branch_weights(log_c_j, step_mask_j, scheme=scheme, gamma=0.5, k=2)
        np.testing.assert_allclose(w_j, want, rtol=1e-6, err_msg=scheme)
    flat = sero.branch_weights(log_c_j, step_mask_j, scheme="full_flat", match_mass=True)
    np.testing.assert_allclose(flat, [1.7 / 3] * 3 + [0.0], rtol=1e-6)  # SERO's mass 1 + 0.5 + 0.2
    root = sero.branch_weights(log_c_j, step_mask_j, scheme="root_only", match_mass=True)
    np.testing.assert_allclose(root, [1.7, 0.0, 0.0, 0.0], rtol=1e-6)


def test_hand_case_gate():
    valid = jnp.array([True, True, False, True, True])
    oracle = jnp.array([1.0, 0.0, 1.0, 1.0, 0.0])
    suffix = jnp.array([0.0, 0.0, 0.0, 1.0, 1.0])
    np.testing.assert_array_equal(sero.improvement_gate(valid, oracle, suffix), [1, 0, 0, 0, 0])
    # env rewards 10·R: scale 10; soft gate on a graded return difference (10 - 4) / 10.
    g = sero.improvement_gate(jnp.array([True, True]), jnp.array([10.0, 10.0]), jnp.array([4.0, -5.0]),
                              scale=10.0, soft=True)
    np.testing.assert_allclose(g, [0.6, 1.0], rtol=1e-6)


def test_hand_case_loss():
    mean_logp = jnp.array([[-1.0, -2.0, -3.0, -9.0], [-0.5, -0.5, 0.0, 0.0]])
    weight = jnp.array([[1.0, 0.5, 0.2, 0.7], [1.0, 1.0, 0.0, 0.0]])
    gate = jnp.array([1.0, 0.0])
    mask = jnp.array([[True, True, True, False], [True, True, False, False]])
    loss = sero_loss.oracle_loss(mean_logp, weight, gate, mask, 4)
    np.testing.assert_allclose(loss, -(-1.0 - 1.0 - 0.6) / 4, rtol=1e-6)  # = 0.65


# ------------------------------------------------------------------------------------------- reference


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matches_reference(seed):
    arrays = random_branches(seed)
    logp, token_mask, step_mask, valid, oracle, suffix = arrays
    outs = all_schemes(arrays)
    for scheme in DETERMINISTIC:
        for match_mass in (False, True):
            out = outs[scheme, match_mass]
            for b in range(logp.shape[0]):
                c = ref.compatibility(logp[b], token_mask[b], step_mask[b])
                w = ref.branch_weights(c, step_mask[b], scheme=scheme, gamma=0.7, k=3, match_mass=match_mass)
                np.testing.assert_allclose(out.compat_j[b], c, rtol=1e-5, atol=1e-6)
                np.testing.assert_allclose(out.weight_j[b], w, rtol=1e-5, atol=1e-6, err_msg=scheme)
                assert out.gate[b] == ref.improvement_gate(valid[b], oracle[b], suffix[b])
    mean_logp = np.asarray(sero.batched_mean_token_logp(jnp.asarray(logp), jnp.asarray(token_mask),
                                                        jnp.asarray(step_mask)))
    for b in range(logp.shape[0]):
        np.testing.assert_allclose(mean_logp[b], ref.mean_token_logp(logp[b], token_mask[b], step_mask[b]),
                                   rtol=1e-5, atol=1e-6)
    out = credit(arrays)
    loss = sero_loss.oracle_loss(jnp.asarray(mean_logp), out.weight_j, out.gate, jnp.asarray(step_mask), 7)
    want = ref.oracle_loss(mean_logp, np.asarray(out.weight_j), np.asarray(out.gate), step_mask, 7)
    np.testing.assert_allclose(loss, want, rtol=1e-5)


def test_soft_gate_matches_reference():
    rng = np.random.default_rng(3)
    valid = rng.random(16) < 0.7
    oracle, suffix = rng.normal(0, 5, 16).astype(np.float32), rng.normal(0, 5, 16).astype(np.float32)
    for soft in (False, True):
        g = sero.improvement_gate(jnp.asarray(valid), jnp.asarray(oracle), jnp.asarray(suffix), scale=4.0,
                                  soft=soft)
        want = [ref.improvement_gate(v, o, s, scale=4.0, soft=soft)
                for v, o, s in zip(valid, oracle, suffix, strict=True)]
        np.testing.assert_allclose(g, want, rtol=1e-5, atol=1e-6)


def test_shuffled_permutes_sero_weights_among_real_steps():
    arrays = random_branches(4)
    step_mask = arrays[2]
    key = jax.random.key(0)
    base = credit(arrays)
    shuf = credit(arrays, scheme="shuffled", key=key)
    np.testing.assert_array_equal(credit(arrays, scheme="shuffled", key=key).weight_j, shuf.weight_j)
    for b in range(step_mask.shape[0]):
        real = step_mask[b]
        got, sero_w = np.asarray(shuf.weight_j[b])[real], np.asarray(base.weight_j[b])[real]
        np.testing.assert_allclose(np.sort(got), np.sort(sero_w), rtol=1e-6)
        assert np.all(np.asarray(shuf.weight_j[b])[~real] == 0)
        # the reference with the same order reproduces it
        order = [int(np.flatnonzero(np.isclose(sero_w, x))[0]) for x in got]
        w = ref.branch_weights(np.asarray(base.compat_j[b]), real, scheme="shuffled", order=np.array(order))
        np.testing.assert_allclose(shuf.weight_j[b], w, rtol=1e-5)
    log_c = sero.batched_mean_token_logp(*(jnp.asarray(a) for a in arrays[:3]))
    weights_only = sero.batched_branch_weights(log_c, jnp.asarray(step_mask), scheme="shuffled", key=key)
    np.testing.assert_allclose(weights_only, shuf.weight_j, rtol=1e-6)
    other = credit(arrays, scheme="shuffled", key=jax.random.key(1))
    assert not np.allclose(other.weight_j, shuf.weight_j)
    with pytest.raises(ValueError):
        sero.branch_weights(jnp.zeros(3), jnp.ones(3, bool), scheme="shuffled")


# ------------------------------------------------------------------------------------------- properties


def test_weight_properties():
    logp, token_mask, step_mask, *_ = arrays = random_branches(5)
    out = credit(arrays)
    w = np.asarray(out.weight_j)
    c = np.asarray(out.compat_j)
    assert np.all(c <= 1.0) and np.all(w <= 1.0 + 1e-6) and np.all(w >= 0)
    for b in range(w.shape[0]):
        real = w[b][step_mask[b]]
        assert np.all(np.diff(real) <= 1e-7)  # non-increasing when c <= 1
        if real.size:
            assert real[0] == 1.0
    outs = all_schemes(arrays)
    root = outs["root_only", False].weight_j
    e0 = (np.arange(step_mask.shape[1])[None] == 0) & step_mask
    np.testing.assert_array_equal(root, e0.astype(np.float32))
    flat = outs["full_flat", False].weight_j
    for k in (step_mask.shape[1], step_mask.shape[1] + 5):
        np.testing.assert_array_equal(credit(arrays, scheme="short_bridge", k=k).weight_j, flat)
    total = w.sum(-1)
    for scheme in sero.SCHEMES:
        matched = outs[scheme, True].weight_j
        np.testing.assert_allclose(np.asarray(matched).sum(-1), total, rtol=1e-5, err_msg=scheme)


def test_branch_permutation_invariance():
    arrays = random_branches(6)
    perm = np.random.default_rng(0).permutation(arrays[0].shape[0])
    outs, permuted = all_schemes(arrays), all_schemes([a[perm] for a in arrays])
    for scheme in DETERMINISTIC:
        for match_mass in (False, True):
            chex.assert_trees_all_close(jax.tree.map(lambda x: x[perm], outs[scheme, match_mass]),
                                        permuted[scheme, match_mass], rtol=1e-6)


def test_padding_never_changes_results():
    arrays = random_branches(7)
    logp, token_mask, step_mask, valid, oracle, suffix = arrays
    more_j, more_l = 4, 3
    logp_p = np.pad(logp, ((0, 0), (0, more_j), (0, more_l)), constant_values=-50.0)
    token_mask_p = np.pad(token_mask, ((0, 0), (0, more_j), (0, more_l)))
    step_mask_p = np.pad(step_mask, ((0, 0), (0, more_j)))
    padded = (logp_p, token_mask_p, step_mask_p, valid, oracle, suffix)
    num_steps = step_mask.shape[1]
    outs, outs_padded = all_schemes(arrays, key=jax.random.key(2)), all_schemes(padded, key=jax.random.key(2))
    for scheme in sero.SCHEMES:
        for match_mass in (False, True):
            a, b = outs[scheme, match_mass], outs_padded[scheme, match_mass]
            np.testing.assert_allclose(b.weight_j[:, :num_steps], a.weight_j, rtol=1e-6, err_msg=scheme)
            np.testing.assert_array_equal(b.weight_j[:, num_steps:], 0.0)
            np.testing.assert_allclose(b.compat_j[:, :num_steps], a.compat_j, rtol=1e-6)
            np.testing.assert_array_equal(b.gate, a.gate)
    # extra padded branches (gate 0) leave the loss unchanged
    mean_logp = jnp.asarray(np.where(step_mask, -1.0, 0.0), jnp.float32)
    out = credit(arrays)
    loss = sero_loss.oracle_loss(mean_logp, out.weight_j, out.gate, jnp.asarray(step_mask), 5)
    pad_b = lambda x: jnp.concatenate([x, jnp.zeros((2,) + x.shape[1:], x.dtype)])
    loss_p = sero_loss.oracle_loss(pad_b(mean_logp), pad_b(out.weight_j), pad_b(out.gate),
                              pad_b(jnp.asarray(step_mask)), 5)
    np.testing.assert_allclose(loss_p, loss, rtol=1e-6)


def test_finite_on_extreme_inputs():
    logp, token_mask, step_mask, valid, oracle, suffix = random_branches(8)
    logp = np.where(np.random.default_rng(0).random(logp.shape) < 0.5, -1e4, logp).astype(np.float32)
    out = credit((logp, token_mask, step_mask, valid, oracle, suffix))
    chex.assert_tree_all_finite(out)
    for scheme in ("depth_decay", "full_flat"):
        arrays = (logp, token_mask, step_mask, valid, oracle, suffix)
        chex.assert_tree_all_finite(credit(arrays, scheme=scheme, match_mass=True))


# ------------------------------------------------------------------------------------------- jit and grads


def test_jit_equals_no_jit():
    arrays = [jnp.asarray(a) for a in random_branches(9, num_branches=2, num_steps=4, num_tokens=3)]
    jitted = credit(arrays, scheme="depth_decay", match_mass=True)
    fn = functools.partial(sero.sero_branch_credit, scheme="depth_decay", match_mass=True)
    with jax.disable_jit():
        eager = jax.vmap(fn)(*arrays)
        eager_b0 = fn(*(a[0] for a in arrays))
    chex.assert_trees_all_close(jitted, eager, rtol=1e-6)
    chex.assert_trees_all_close(jax.tree.map(lambda x: x[0], jitted), eager_b0, rtol=1e-6)


def test_compiles_once():
    @jax.jit
    @chex.assert_max_traces(n=1)
    def step(*arrays):
        out = sero.batched_sero_credit(*arrays)
        mean_logp = sero.batched_mean_token_logp(arrays[0], arrays[1], arrays[2])
        return sero_loss.oracle_loss(mean_logp, out.weight_j, out.gate, arrays[2], 3)

    for seed in (10, 11, 12):
        chex.assert_tree_all_finite(step(*(jnp.asarray(a) for a in random_branches(seed))))
    before = sero.batched_sero_credit._cache_size()
    for seed in (13, 14):
        credit(random_branches(seed, num_branches=3, num_steps=5, num_tokens=2))
    assert sero.batched_sero_credit._cache_size() == before + 1


def test_gradients_only_through_policy_logp():
    arrays = [jnp.asarray(a) for a in random_branches(15)]
    logp_old, token_mask, step_mask, valid, oracle, suffix = arrays
    mean_logp = sero.batched_mean_token_logp(logp_old, token_mask, step_mask) - 0.3
    out = credit(arrays)

    def loss(mean_logp, weight, gate):
        return sero_loss.oracle_loss(mean_logp, weight, gate, step_mask, 4)

    g_logp, g_w, g_g = jax.grad(loss, argnums=(0, 1, 2))(mean_logp, out.weight_j, out.gate)
    np.testing.assert_array_equal(g_w, 0.0)
    np.testing.assert_array_equal(g_g, 0.0)
    want = -np.asarray(out.gate)[:, None] * np.asarray(out.weight_j) * np.asarray(step_mask) / 4
    np.testing.assert_allclose(g_logp, want, rtol=1e-6)

    def through_compat(logp_old):  # weights built from π_old inside the loss: still no gradient
        w = sero.batched_sero_credit(logp_old, token_mask, step_mask, valid, oracle, suffix)
        return sero_loss.oracle_loss(mean_logp, w.weight_j, w.gate, step_mask, 4)

    np.testing.assert_array_equal(jax.grad(through_compat)(logp_old), 0.0)
