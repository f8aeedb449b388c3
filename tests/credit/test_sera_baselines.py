"""SERA baselines: leave-one-out over trees (released and paper readings), depth weights, zero-variance filter.

Hand-checked cases, the NumPy reference on random inputs, permutation and padding invariances, jit == no-jit."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentjax.credit import sera_baselines as sb
from agentjax.credit.reference import sera as ref


def test_hand_loo_advantage():
    adv = sb.loo_advantage(jnp.array([1.0, 0.0, 1.0, 5.0]), jnp.array([True, True, True, False]))
    np.testing.assert_allclose(adv, [0.5, -1.0, 0.5, 0.0], rtol=1e-6)
    np.testing.assert_array_equal(sb.loo_advantage(jnp.array([0.7]), jnp.array([True])), [0.0])  # K = 1


def test_hand_execution_advantage_released_and_paper():
    # 3 trees: root outcomes 1, 0, 1; node rewards (root first); tree 2's child was not graded
    reward = jnp.array([[1.0, 0.5, 0.0], [0.0, 0.8, 0.2], [1.0, 0.4, 0.0]])
    sample = jnp.array([[True, True, False], [True, True, True], [True, False, False]])
    outcome, trees = jnp.array([1.0, 0.0, 1.0]), jnp.ones(3, bool)
    got = sb.execution_advantage(reward, sample, outcome, trees)  # released: the other trees' root outcomes
    want = [[1 - 0.5, 0.5 - 0.5, 0], [0 - 1, 0.8 - 1, 0.2 - 1], [1 - 0.5, 0, 0]]
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    pooled = sb.execution_advantage(reward, sample, outcome, trees, baseline="pooled")  # paper: other nodes
    np.testing.assert_allclose(pooled[0, :2], np.array([1.0, 0.5]) - np.mean([0.0, 0.8, 0.2, 1.0]), rtol=1e-6)
    tree_mean = sb.execution_advantage(reward, sample, outcome, trees, baseline="tree_mean")
    np.testing.assert_allclose(tree_mean[2, 0], 1.0 - np.mean([0.75, 1 / 3]), rtol=1e-6)
    missing = sb.execution_advantage(reward, sample, outcome, jnp.array([True, False, True]))
    np.testing.assert_allclose(missing[0, :2], [0.0, -0.5], atol=1e-7)  # tree 1 is not in the baseline
    np.testing.assert_array_equal(missing[1], 0.0)


def test_hand_decomposition_baseline():
    # tree means of event rewards: 0.75, 0.2, (no events), 0.3
    reward = jnp.array([[1.0, 0.5, 0.0], [0.2, 0.0, 0.0], [0.0, 0.0, 0.0], [0.4, 0.4, 0.1]])
    events = jnp.array([[True, True, False], [True, False, False], [False, False, False], [True, True, True]])
    trees = jnp.ones(4, bool)
    released = sb.tree_loo_advantage(reward, events, trees)  # the empty tree counts as 0
    b0, b1, b3 = (0.2 + 0 + 0.3) / 3, (0.75 + 0 + 0.3) / 3, (0.75 + 0.2 + 0) / 3
    want = [[1 - b0, 0.5 - b0, 0], [0.2 - b1, 0, 0], [0, 0, 0], [0.4 - b3, 0.4 - b3, 0.1 - b3]]
    np.testing.assert_allclose(released, want, rtol=1e-5, atol=1e-7)
    paper = sb.tree_loo_advantage(reward, events, trees, empty_as_zero=False)  # the empty tree is left out
    np.testing.assert_allclose(paper[0, :2], [1.0 - 0.25, 0.5 - 0.25], rtol=1e-5)
    pooled = sb.tree_loo_advantage(reward, events, trees, baseline="pooled")
    np.testing.assert_allclose(pooled[0, :2], [1.0 - 0.275, 0.5 - 0.275], rtol=1e-5)  # mean(.2, .4, .4, .1)
    not_real = sb.tree_loo_advantage(reward, events, jnp.array([True, True, False, True]))
    np.testing.assert_allclose(not_real[0, 0], 1.0 - 0.25, rtol=1e-5)  # a missing tree is never a zero


def test_hand_depth_weights():
    # trajectories at depths 0, 1, 1, 2, 2, 2 (one padding) with 1, 2, 2, 1, 1, 4 data
    depth = jnp.array([0, 1, 1, 2, 2, 2, 1])
    data = jnp.array([1.0, 2.0, 2.0, 1.0, 1.0, 4.0, 3.0])
    mask = jnp.array([True, True, True, True, True, True, False])
    w = sb.depth_weights(depth, data, mask)
    # n = (1, 2, 3), c = (1, 4, 6): w_d = (11 / (1 + 2 + 2)) / n_d = 2.2, 1.1, 0.7333
    np.testing.assert_allclose(w, [2.2, 1.1, 1.1, 2.2 / 3, 2.2 / 3, 2.2 / 3, 0.0], rtol=1e-5)
    np.testing.assert_allclose(float(jnp.sum(w * data)), 11.0, rtol=1e-5)  # the data's total weight is kept
    per_sample = sb.depth_weights(depth, jnp.ones(7), mask)  # the paper's reading: N / (D · count)
    np.testing.assert_allclose(per_sample, [2.0, 1.0, 1.0, 2 / 3, 2 / 3, 2 / 3, 0.0], rtol=1e-6)


def test_hand_nonconstant():
    assert not bool(sb.nonconstant(jnp.array([0.5, 0.5, 9.0]), jnp.array([True, True, False])))
    assert bool(sb.nonconstant(jnp.array([0.5, 0.25, 9.0]), jnp.array([True, True, False])))
    assert not bool(sb.nonconstant(jnp.zeros(3), jnp.zeros(3, bool)))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matches_reference(seed):
    rng = np.random.default_rng(seed)
    num_trees, num_x = 6, 5
    reward = rng.choice([0.0, 0.2, 0.5, 1.0], (num_trees, num_x)).astype(np.float32)
    mask = rng.random((num_trees, num_x)) < 0.5
    trees = rng.random(num_trees) < 0.8
    outcome = rng.choice([0.0, 1.0], num_trees).astype(np.float32)
    args = tuple(jnp.asarray(a) for a in (reward, mask, trees))
    for baseline in ("tree_mean", "pooled"):
        for empty_as_zero in (True, False):
            np.testing.assert_allclose(
                sb.tree_loo_advantage(*args, baseline=baseline, empty_as_zero=empty_as_zero),
                ref.tree_loo_advantage(reward, mask, trees, baseline=baseline, empty_as_zero=empty_as_zero),
                rtol=1e-5, atol=1e-6)
    for baseline in ("root", "pooled", "tree_mean"):
        got = sb.execution_advantage(args[0], args[1], jnp.asarray(outcome), args[2], baseline=baseline)
        want = ref.execution_advantage(reward, mask, outcome, trees, baseline=baseline)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    depth, data, m = rng.integers(0, 5, 40), rng.integers(0, 4, 40).astype(np.float32), rng.random(40) < 0.8
    np.testing.assert_allclose(sb.depth_weights(jnp.asarray(depth), jnp.asarray(data), jnp.asarray(m)),
                               ref.depth_weights(depth, data, m), rtol=1e-5)


def test_depth_weight_properties():
    rng = np.random.default_rng(3)
    depth, data, mask = rng.integers(0, 4, 40), rng.integers(1, 5, 40).astype(np.float32), rng.random(40) < 0.8
    w = np.asarray(sb.depth_weights(jnp.asarray(depth), jnp.asarray(data), jnp.asarray(mask)))
    np.testing.assert_allclose((w * data)[mask].sum(), data[mask].sum(), rtol=1e-5)
    per_trajectory = [w[mask & (depth == d)] for d in range(4) if (mask & (depth == d)).any()]
    for ws in per_trajectory:  # one weight per depth; n_d · w_d (the depth's weight per datum-trajectory) equal
        np.testing.assert_allclose(ws, ws[0], rtol=1e-6)
    norms = [len(ws) * ws[0] for ws in per_trajectory]
    np.testing.assert_allclose(norms, norms[0], rtol=1e-5)
    perm = rng.permutation(40)
    np.testing.assert_allclose(sb.depth_weights(*(jnp.asarray(a[perm]) for a in (depth, data, mask))), w[perm],
                               rtol=1e-6)
    padded = sb.depth_weights(*(jnp.asarray(np.pad(a, (0, 7))) for a in (depth, data, mask)))
    np.testing.assert_allclose(padded[:40], w, rtol=1e-6)


def test_permuting_trees_permutes_advantages():
    rng = np.random.default_rng(5)
    reward = jnp.asarray(rng.random((6, 4)), jnp.float32)
    mask, trees = jnp.asarray(rng.random((6, 4)) < 0.6), jnp.asarray(rng.random(6) < 0.9)
    outcome = jnp.asarray(rng.random(6) < 0.5, jnp.float32)
    perm = rng.permutation(6)
    for f in (lambda r, m, o, t: sb.tree_loo_advantage(r, m, t),
              lambda r, m, o, t: sb.tree_loo_advantage(r, m, t, baseline="pooled"),
              lambda r, m, o, t: sb.execution_advantage(r, m, o, t)):
        np.testing.assert_allclose(f(reward, mask, outcome, trees)[perm],
                                   f(reward[perm], mask[perm], outcome[perm], trees[perm]), rtol=1e-6, atol=1e-7)


def test_jit_equals_no_jit():
    rng = np.random.default_rng(6)
    reward, mask = jnp.asarray(rng.random((5, 3)), jnp.float32), jnp.asarray(rng.random((5, 3)) < 0.6)
    trees, outcome = jnp.ones(5, bool), jnp.asarray(rng.random(5), jnp.float32)
    depth, data = jnp.asarray(rng.integers(0, 4, 15)), jnp.asarray(rng.integers(0, 3, 15), jnp.float32)
    run = lambda: (sb.tree_loo_advantage(reward, mask, trees), sb.execution_advantage(reward, mask, outcome, trees),  # noqa: E731
                   sb.depth_weights(depth, data, mask.ravel()), sb.nonconstant(reward, mask))
    jitted = jax.jit(run)()
    with jax.disable_jit():
        eager = run()
    for a, b in zip(jitted, eager, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
