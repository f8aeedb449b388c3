"""SERA / RAO credit per stage over a whole update: the NumPy reference on random forests (released and paper
readings), a hand-checked update, permutation and padding invariances, jit == no-jit, one compilation."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentjax.credit import sera_stages as st
from agentjax.credit.reference import sera as ref
from tests.credit.sera_trees import random_forest, random_fork_groups

EXEC_KEYS = ("parent", "mask", "child_reward", "graded", "outcome", "rows")
DEC_KEYS = ("parent", "mask", "event_q", "event_node", "outcome")


def run_execution(f, **kw):
    return st.execution_credit(*(jnp.asarray(f[k]) for k in EXEC_KEYS), **kw)


def run_decomposition(f, **kw):
    return st.decomposition_credit(*(jnp.asarray(f[k]) for k in DEC_KEYS), **kw)[1]


def run_rubric(groups, **kw):
    return st.rubric_credit(*(jnp.asarray(a) for a in groups), **kw)[1]


def assert_matches(got: st.StageCredit, want: dict):
    np.testing.assert_array_equal(got.keep_g, want["keep_g"])
    np.testing.assert_array_equal(got.sample, want["sample"])
    for k in ("reward", "weight", "advantage"):
        np.testing.assert_allclose(getattr(got, k), want[k], rtol=1e-5, atol=1e-6, err_msg=k)


def test_hand_execution_update():
    """One root task, two trees (root 0 → child 1), RAO labels: A = r − the other tree's root outcome; the
    depth weights give each depth the same weight per trajectory (depth 0: 2 roots with 1 row; depth 1: 2 children
    with 3 rows: w_d = (8 / (2/2 + 6/2)) / 2 = 1)."""
    parent = jnp.array([[[-1, 0], [-1, 0]]], jnp.int32)
    mask = jnp.ones((1, 2, 2), bool)
    label = jnp.array([[[0.0, 1.0], [0.0, 0.0]]])
    outcome = jnp.array([[1.0, 0.0]])
    rows = jnp.array([[[1, 3], [1, 3]]], jnp.int32)
    c = st.execution_credit(parent, mask, label, jnp.ones((1, 2, 2), bool), outcome, rows)
    np.testing.assert_allclose(c.reward, [[[1.0, 1.0], [0.0, 0.0]]])
    np.testing.assert_allclose(c.weight, 1.0)
    np.testing.assert_allclose(c.advantage, [[[1.0, 1.0], [-1.0, -1.0]]])
    flat = st.execution_credit(parent, mask, jnp.zeros((1, 2, 2)), jnp.ones((1, 2, 2), bool), jnp.zeros((1, 2)),
                               rows)  # every advantage 0: the zero-variance filter drops the task
    assert not bool(flat.keep_g[0]) and not bool(flat.sample.any())
    kept = st.execution_credit(parent, mask, jnp.zeros((1, 2, 2)), jnp.ones((1, 2, 2), bool), jnp.zeros((1, 2)),
                               rows, filter_zero_variance=False)
    assert bool(kept.sample.all())


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("baseline,depth_weighting", [("root", "trajectory"), ("pooled", "sample"),
                                                      ("tree_mean", "none")])
def test_execution_matches_reference(seed, baseline, depth_weighting):
    f = random_forest(seed)
    for filt in (True, False):
        kw = dict(baseline=baseline, filter_zero_variance=filt, depth_weighting=depth_weighting)
        assert_matches(run_execution(f, **kw), ref.execution_credit(*(f[k] for k in EXEC_KEYS), **kw))


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("unit,empty_as_zero,depth_weighting", [("event", True, "trajectory"),
                                                                ("event", False, "sample"),
                                                                ("delegation", False, "trajectory")])
def test_decomposition_matches_reference(seed, unit, empty_as_zero, depth_weighting):
    f = random_forest(seed)
    kw = dict(unit=unit, empty_as_zero=empty_as_zero, depth_weighting=depth_weighting)
    assert_matches(run_decomposition(f, **kw), ref.decomposition_credit(*(f[k] for k in DEC_KEYS), **kw))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_rubric_matches_reference(seed):
    groups = random_fork_groups(seed)
    for filt in (True, False):
        assert_matches(run_rubric(groups, filter_zero_variance=filt),
                       ref.rubric_credit(*groups, filter_zero_variance=filt))


def test_hand_rubric_update():
    """Two mixed groups (rewards −0.05, 0) and one homogeneous group: A = ±0.05 on the mixed groups only."""
    score = jnp.array([[[0.6, 0.5, 0.4, 0.0], [0.9, 0.1, 0.5, 0.5], [1.0, 1.0, 1.0, 1.0]]])
    success = jnp.array([[[True, False, False, False], [True, False, False, False], [True, True, True, True]]])
    valid = jnp.ones((1, 3, 4), bool)
    rank, c = st.rubric_credit(score, success, valid, jnp.array([[1, 1, 2]], jnp.int32))
    # group 0: hinges 0.1, 0, 0 → −0.1/3; group 1: gaps 0.8, 0.4, 0.4 → 0
    np.testing.assert_allclose(rank.reward[0, :2], [-0.1 / 3, 0.0], atol=1e-6)
    np.testing.assert_array_equal(c.sample, [[True, True, False]])
    np.testing.assert_allclose(c.advantage, [[-0.1 / 3, 0.1 / 3, 0.0]], atol=1e-6)


# ------------------------------------------------------------------------------------------- invariances


def permute_trees(f, perm):
    return {k: v[:, perm] for k, v in f.items()}


def test_permuting_trees_permutes_credit():
    f = random_forest(5, num_tasks=2, num_trees=6)
    perm = np.random.default_rng(1).permutation(6)
    take = lambda c: jax.tree.map(lambda x: x if x.ndim == 1 else x[:, perm], c)  # noqa: E731
    for run in (run_execution, run_decomposition, lambda f: run_decomposition(f, unit="delegation")):
        chex.assert_trees_all_close(take(run(f)), run(permute_trees(f, perm)), rtol=1e-5, atol=1e-6)


def test_permuting_tasks_and_groups():
    groups = random_fork_groups(4, num_tasks=4, num_groups=6)
    rng = np.random.default_rng(2)
    perm_g, perm_f = rng.permutation(4), rng.permutation(6)
    moved = tuple(a[perm_g][:, perm_f] for a in groups)
    take = lambda c: jax.tree.map(lambda x: x[perm_g] if x.ndim == 1 else x[perm_g][:, perm_f], c)  # noqa: E731
    chex.assert_trees_all_close(take(run_rubric(groups)), run_rubric(moved), rtol=1e-5, atol=1e-6)


def test_padding_never_changes_results():
    f = random_forest(6)
    num_tasks, num_trees, num_slots = f["mask"].shape
    num_events = f["event_node"].shape[-1]

    def pad(key, x, fill=0):  # 2 more trees, 4 more node slots or 3 more event slots, no more criteria
        widths = [(0, 0), (0, 2), (0, 3 if key == "event_node" else 4), (0, 0)][: x.ndim]
        return np.pad(x, widths, constant_values=fill)

    fills = {"parent": -9, "event_q": -1, "event_node": -1}
    padded = {k: pad(k, v, fills.get(k, 0)) for k, v in f.items()}
    real_q = (slice(None), slice(0, num_trees), slice(0, num_slots))
    real_e = (slice(None), slice(0, num_trees), slice(0, num_events))
    for run, real in ((run_execution, real_q), (run_decomposition, real_e)):
        got, want = run(padded), run(f)
        chex.assert_trees_all_close(jax.tree.map(lambda x, real=real: x if x.ndim == 1 else x[real], got), want,
                                    rtol=1e-6, atol=1e-7)
        np.testing.assert_array_equal(got.sample[:, num_trees:], False)


def test_finite_outputs():
    f = random_forest(7)
    f["mask"] = np.zeros_like(f["mask"])  # an empty update
    f["event_node"] = np.full_like(f["event_node"], -1)
    empty = (run_execution(f), run_decomposition(f), run_rubric(random_fork_groups(7)))
    chex.assert_tree_all_finite(empty)
    assert not any(bool(c.sample.any()) for c in empty[:2])


# ------------------------------------------------------------------------------------------- jit


@pytest.mark.slow  # for CI time: `make test-slow` (README, "Tests")
def test_jit_equals_no_jit():
    """The stage with the most logic (the kernels' own jit checks are in test_sera*.py); eager runs are slow."""
    f = random_forest(8, num_tasks=2, num_trees=3, num_slots=5, num_events=3)
    jitted = run_decomposition(f)
    with jax.disable_jit():
        eager = run_decomposition(f)
    chex.assert_trees_all_close(jitted, eager, rtol=1e-6, atol=1e-7)


def test_compiles_once():
    @jax.jit
    @chex.assert_max_traces(n=1)
    def update(parent, mask, child_reward, graded, outcome, rows, event_q, event_node, score, success, valid, depth):
        ex = st.execution_credit(parent, mask, child_reward, graded, outcome, rows)
        _, dec = st.decomposition_credit(parent, mask, event_q, event_node, outcome)
        _, rub = st.rubric_credit(score, success, valid, depth)
        return ex.advantage, dec.advantage, rub.advantage

    for seed in (9, 10, 11):
        f, groups = random_forest(seed), random_fork_groups(seed)
        args = [jnp.asarray(f[k]) for k in EXEC_KEYS + ("event_q", "event_node")] + [jnp.asarray(a) for a in groups]
        chex.assert_tree_all_finite(update(*args))
    before = st.execution_credit._cache_size()
    for seed in (12, 13):
        run_execution(random_forest(seed, num_tasks=1, num_trees=2, num_slots=4))
    assert st.execution_credit._cache_size() == before + 1
