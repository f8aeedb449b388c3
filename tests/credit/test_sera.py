"""SERA rewards: tree structure, execution reward, leaf coverage (launch events and delegations), rubric ranking.

Hand-checked trees, the NumPy reference on random trees, relabelling invariances, jit == no-jit."""

from __future__ import annotations

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentjax.credit import sera
from agentjax.credit.reference import sera as ref
from tests.credit.sera_trees import MAX_DEPTH, random_forest, random_tree


def hand_tree():
    """Root 0 launches {1, 2} in one event (e0) and later attempts a delegation that spawns nothing (e2);
    1 launches 3 (e1) then 4 (e3). Slot 5 padding. Leaves 2, 3, 4; subtree leaves (3, 2, 1, 1, 1)."""
    parent_q = jnp.array([-1, 0, 0, 1, 1, 7], jnp.int32)
    node_mask_q = jnp.array([True, True, True, True, True, False])
    event_q = jnp.array([-1, 0, 0, 1, 3, -1], jnp.int32)
    event_node_e = jnp.array([0, 1, 0, 1, -1], jnp.int32)
    return parent_q, node_mask_q, event_q, event_node_e


# ------------------------------------------------------------------------------------------- hand cases


def test_hand_leaf_coverage_and_depth():
    parent_q, node_mask_q, event_q, event_node_e = hand_tree()
    cov = sera.leaf_coverage(parent_q, node_mask_q, event_q, event_node_e, jnp.float32(1.0), max_depth=MAX_DEPTH)
    np.testing.assert_array_equal(cov.leaf_q, [False, False, True, True, True, False])
    np.testing.assert_array_equal(cov.subtree_leaves_q, [3, 2, 1, 1, 1, 0])
    np.testing.assert_array_equal(cov.delegation_q, [False, True, True, True, True, False])
    # events: {1, 2} cover all 3 leaves; {3}: 1; the empty attempt: 0; {4}: 1; padding
    np.testing.assert_array_equal(cov.leaves_e, [3, 1, 0, 1, 0])
    np.testing.assert_allclose(cov.reward_e, [1.0, 1 / 3, 0.0, 1 / 3, 0.0], rtol=1e-6)
    np.testing.assert_allclose(cov.reward_q, [0, 2 / 3, 1 / 3, 1 / 3, 1 / 3, 0], rtol=1e-6)  # the paper's unit
    failed = sera.leaf_coverage(parent_q, node_mask_q, event_q, event_node_e, jnp.float32(0.0))
    np.testing.assert_array_equal(failed.reward_e, 0.0)
    np.testing.assert_array_equal(failed.reward_q, 0.0)
    np.testing.assert_array_equal(sera.node_depth(parent_q, node_mask_q), [0, 1, 1, 2, 2, -1])
    lone = sera.leaf_coverage(jnp.array([-1, 0], jnp.int32), jnp.array([True, False]), jnp.array([-1, -1]),
                              jnp.array([0, -1]), jnp.float32(1.0))  # a root that only attempted
    np.testing.assert_array_equal(lone.leaf_q, [True, False])
    np.testing.assert_array_equal(lone.reward_e, 0.0)


def test_hand_execution_reward():
    parent = jnp.array([-1, 0, 0, 1, 3], jnp.int32)
    mask = jnp.array([True, True, True, True, False])
    score = jnp.array([0.9, 0.8, 0.0, 0.35, 1.0])  # the root's entry is ignored; slot 4 is padding
    np.testing.assert_allclose(sera.execution_reward(parent, mask, score, jnp.float32(1.0)),
                               [1.0, 0.8, 0.0, 0.35, 0.0], rtol=1e-6)
    label = jnp.array([1.0, 1.0, 0.0, 1.0, 1.0])  # RAO: binary labels, the same kernel
    np.testing.assert_allclose(sera.execution_reward(parent, mask, label, jnp.float32(0.0)), [0, 1, 0, 1, 0])


def test_hand_rubric_weighted_score():
    gate = jnp.array([True, False, True, True])
    weight = jnp.array([[2, 1, 0], [1, 1, 1], [1, 1, 1], [1, 1, 5]], jnp.float32)
    score = jnp.array([[1, 0.4, 0], [1, 1, 1], [1, 1, 1], [0.5, 1, 9]], jnp.float32)
    crit = jnp.array([[1, 1, 0], [1, 1, 1], [0, 0, 0], [1, 1, 0]], bool)
    # (2·1 + 1·0.4)/3; gate off; no criteria; (0.5 + 1)/2 (the masked criterion is left out)
    np.testing.assert_allclose(sera.rubric_weighted_score(gate, weight, score, crit), [0.8, 0.0, 0.0, 0.75],
                               rtol=1e-6)


def test_hand_ranking_reward():
    score = jnp.array([0.9, 0.5, 0.6, 0.1, 0.7])
    success = jnp.array([True, True, False, False, True])
    valid = jnp.array([True, True, True, True, False])
    r = sera.ranking_reward(score, success, valid)
    # P = {0.9, 0.5}, N = {0.6, 0.1}: gaps 0.3, 0.8, −0.1, 0.4 → hinges 0, 0, 0.3, 0
    np.testing.assert_allclose(r.reward, -0.3 / 4, rtol=1e-5)
    assert bool(r.usable) and float(r.pairs) == 4
    np.testing.assert_allclose([r.accuracy, r.margin_rate, r.mean_gap], [0.75, 0.75, 1.4 / 4], rtol=1e-5)
    homogeneous = sera.ranking_reward(score, jnp.ones(5, bool), valid)
    assert not bool(homogeneous.usable) and float(homogeneous.reward) == 0.0
    one_valid = sera.ranking_reward(score, success, jnp.array([True, False, False, False, False]))
    assert not bool(one_valid.usable)
    np.testing.assert_allclose(sera.ranking_reward(score, success, valid, margin=1.0).reward,
                               -(0.7 + 0.2 + 1.1 + 0.6) / 4, rtol=1e-5)


# ------------------------------------------------------------------------------------------- reference


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matches_reference(seed):
    f = random_forest(seed)
    num_tasks, num_trees, _ = f["parent"].shape
    cover = jax.jit(jax.vmap(jax.vmap(functools.partial(sera.leaf_coverage, max_depth=MAX_DEPTH))))
    cov = cover(*(jnp.asarray(f[k]) for k in ("parent", "mask", "event_q", "event_node", "outcome")))
    reward = jax.vmap(jax.vmap(sera.execution_reward))(
        *(jnp.asarray(f[k]) for k in ("parent", "mask", "child_reward", "outcome")))
    weighted = sera.rubric_weighted_score(*(jnp.asarray(f[k]) for k in ("gate", "weight", "score", "crit_mask")))
    for g in range(num_tasks):
        for k in range(num_trees):
            p, m = f["parent"][g, k], f["mask"][g, k]
            np.testing.assert_array_equal(cov.leaf_q[g, k], ref.leaves(p, m))
            np.testing.assert_allclose(cov.subtree_leaves_q[g, k], ref.subtree_leaf_counts(p, m))
            np.testing.assert_array_equal(sera.node_depth(jnp.asarray(p), jnp.asarray(m)), ref.node_depth(p, m))
            want_e, want_q = ref.leaf_coverage(p, m, f["event_q"][g, k], f["event_node"][g, k], f["outcome"][g, k])
            np.testing.assert_allclose(cov.reward_e[g, k], want_e, rtol=1e-5, atol=1e-7)
            np.testing.assert_allclose(cov.reward_q[g, k], want_q, rtol=1e-5, atol=1e-7)
            np.testing.assert_allclose(reward[g, k], ref.execution_reward(p, m, f["child_reward"][g, k],
                                                                          f["outcome"][g, k]), rtol=1e-6)
            for q in range(p.shape[0]):
                want = ref.rubric_weighted_score(f["gate"][g, k, q], f["weight"][g, k, q], f["score"][g, k, q],
                                                 f["crit_mask"][g, k, q])
                np.testing.assert_allclose(weighted[g, k, q], want, rtol=1e-5, atol=1e-7)


def test_ranking_matches_reference():
    rng = np.random.default_rng(3)
    shape = (60, 8)
    score = rng.choice(np.linspace(0, 1, 6), shape).astype(np.float32)  # ties happen
    success = rng.random(shape) < rng.random((60, 1))
    valid = rng.random(shape) < rng.uniform(0.1, 1.0, (60, 1))  # from no valid grade to all
    got = jax.jit(jax.vmap(sera.ranking_reward))(jnp.asarray(score), jnp.asarray(success), jnp.asarray(valid))
    for f in range(shape[0]):
        want, usable = ref.ranking_reward(score[f], success[f], valid[f])
        assert bool(got.usable[f]) == usable
        np.testing.assert_allclose(got.reward[f], want, rtol=1e-5, atol=1e-7)
    assert 0 < int(got.usable.sum()) < shape[0]


# ------------------------------------------------------------------------------------------- invariances


def test_relabelling_nodes_and_events_permutes_coverage():
    rng = np.random.default_rng(4)
    parent, mask, event_q, event_node = random_tree(rng, 9, 6)
    perm, perm_e = rng.permutation(9), rng.permutation(6)  # new slot i holds old node perm[i]
    inv, inv_e = np.argsort(perm), np.argsort(perm_e)
    relabel = lambda x, inverse: np.where(x >= 0, inverse[np.maximum(x, 0)], x)  # noqa: E731
    args = (parent, mask, event_q, event_node, np.float32(1.0))
    moved = (relabel(parent[perm], inv), mask[perm], relabel(event_q[perm], inv_e), relabel(event_node[perm_e], inv),
             np.float32(1.0))
    cov, cov2 = (sera.leaf_coverage(*(jnp.asarray(a) for a in x)) for x in (args, moved))
    np.testing.assert_allclose(cov.reward_e[perm_e], cov2.reward_e, rtol=1e-6)
    np.testing.assert_allclose(cov.reward_q[perm], cov2.reward_q, rtol=1e-6)
    np.testing.assert_array_equal(cov.leaf_q[perm], cov2.leaf_q)


def test_event_rewards_sum_over_the_tree():
    """A tree's root-level events together cover every leaf below the root exactly once."""
    parent_q, node_mask_q, event_q, event_node_e = hand_tree()
    cov = sera.leaf_coverage(parent_q, node_mask_q, event_q, event_node_e, jnp.float32(1.0))
    root_events = np.asarray(event_node_e) == 0
    np.testing.assert_allclose(np.asarray(cov.reward_e)[root_events].sum(), 1.0, rtol=1e-6)


def test_jit_equals_no_jit_and_max_depth():
    f = random_forest(5, num_tasks=1, num_trees=2)
    args = [jnp.asarray(f[k][0, 1]) for k in ("parent", "mask", "event_q", "event_node", "outcome")]
    jitted = jax.jit(sera.leaf_coverage)(*args)
    with jax.disable_jit():
        eager = sera.leaf_coverage(*args)
    chex.assert_trees_all_close(jitted, eager, rtol=1e-6)
    chain = jnp.array([-1, 0, 1, 2, 3, 4], jnp.int32)  # a path of depth 5: one leaf, every node covers it
    mask, ev = jnp.ones(6, bool), jnp.array([-1, 0, 1, 2, 3, 4], jnp.int32)
    full = sera.leaf_coverage(chain, mask, ev, jnp.arange(5, dtype=jnp.int32), jnp.float32(1.0), max_depth=5)
    np.testing.assert_allclose(full.reward_e, 1.0)
    cut = sera.subtree_leaf_counts(chain, mask, max_depth=3)[1]
    np.testing.assert_allclose(cut, [0, 0, 1, 1, 1, 1])  # documented truncation beyond max_depth
