"""GraphGPO kernel: hand-computed graph, NumPy reference, invariances, compilation."""

from __future__ import annotations

import functools

import chex
import jax
import numpy as np
import pytest

from agentjax.credit import graphgpo
from agentjax.credit.reference import graphgpo as graphgpo_ref
from agentjax.credit.reference import group_numpy
from agentjax.rollout.batch import NO_ID
from tests.credit.groups import (
    EPS,
    SMALL,
    assert_close_to_reference,
    batch_of,
    permute_rollouts,
    random_group,
    synthetic_view,
    view_from_episodes,
)

VARIANTS = (
    dict(),  # 10·γ^d(next), mean_std_norm
    dict(normalised=True),
    dict(normalised=True, mode="mean_norm", step_weight=2.0, episode_weight=0.5),
)

distances = jax.jit(graphgpo.success_distances)


def graph_returns(view, **kwargs) -> np.ndarray:
    return np.asarray(jax.jit(functools.partial(graphgpo.graph_returns, **kwargs))(view))


def run(view, **kwargs) -> np.ndarray:
    return np.asarray(graphgpo.batched_graphgpo(batch_of(view), **kwargs)[0])


def hand_view():
    # r0: 1 -> 2 -> 3 -> success; r1: 1 -> 4 -> (failed); r2: 2 -> 1 -> (failed).
    return view_from_episodes(anchors=[[1, 2, 3], [1, 4], [2, 1]],
                              rewards=[[0.0, 0.0, 10.0], [0.0, 0.0], [0.0, 0.0]],
                              success=[True, False, False], **SMALL)


def test_hand_distances():
    # d(success) = 0, d(3) = 1, d(2) = 2, d(1) = 3; anchor 4 and the dead end are unreachable: 3 + 1 = 4.
    d_cur, d_next = (np.asarray(d) for d in distances(hand_view()))
    np.testing.assert_array_equal(d_cur[0], [3, 2, 1])
    np.testing.assert_array_equal(d_next[0], [2, 1, 0])
    np.testing.assert_array_equal(d_cur[1, :2], [3, 4])
    np.testing.assert_array_equal(d_next[1, :2], [4, 4])
    np.testing.assert_array_equal(d_cur[2, :2], [2, 3])
    np.testing.assert_array_equal(d_next[2, :2], [3, 4])


def expected_hand_advantages(ret) -> np.ndarray:
    """[4, 3] advantages of :func:`hand_view`'s rollouts from hand-computed step returns ``ret[(r, t)]``."""

    def group_norm(steps):
        x = np.array([ret[s] for s in steps])
        return dict(zip(steps, (x - x.mean()) / (x.std(ddof=1) + EPS), strict=True))

    step = {(0, 2): 0.0, (1, 1): 0.0}  # anchors 3 and 4 are alone
    step |= group_norm([(0, 0), (1, 0), (2, 1)])  # anchor 1
    step |= group_norm([(0, 1), (2, 0)])  # anchor 2
    # Episode scores 10, 0, 0 over 3 + 2 + 2 step rows.
    rows = [10.0] * 3 + [0.0] * 4
    mean_e, std_e = 30 / 7, np.sqrt(sum((x - 30 / 7) ** 2 for x in rows) / 6)
    score = {0: 10.0, 1: 0.0, 2: 0.0}
    expected = np.zeros((4, 3))
    for (r, t), a in step.items():
        expected[r, t] = (score[r] - mean_e) / (std_e + EPS) + a
    return expected


@pytest.mark.parametrize("normalised", [False, True])
def test_hand_case(normalised):
    if normalised:  # 10·0.1^(d(next) − d(cur) + 1)
        ret = {(0, 0): 10.0, (0, 1): 10.0, (0, 2): 10.0, (1, 0): 0.1, (1, 1): 1.0, (2, 0): 0.1, (2, 1): 0.1}
    else:  # 10·0.1^d(next)
        ret = {(0, 0): 0.1, (0, 1): 1.0, (0, 2): 10.0, (1, 0): 0.001, (1, 1): 0.001, (2, 0): 0.01,
               (2, 1): 0.001}
    expected = expected_hand_advantages(ret)
    view = hand_view()
    np.testing.assert_allclose(run(view, normalised=normalised), expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(graphgpo_ref.graphgpo(group_numpy(view), normalised=normalised), expected,
                               atol=1e-9)


def with_final_next(view, rollout: int, anchor: int):
    """A one-group view whose rollout ``rollout`` ends with next anchor ``anchor`` (its last real step)."""
    last = int(view.length[rollout]) - 1
    return view.replace(next_anchor=view.next_anchor.at[rollout, last].set(anchor))


def test_failed_rollout_ending_on_a_successful_path():
    # r1: 1 -> 4 -> (failed, final observation = anchor 3, on r0's path): edge 4 -> 3, so d(4) = 2 and the
    # final step of r1 is one step from success instead of at the dead end; d(1) stays 3, unreachable 4.
    view = with_final_next(hand_view(), 1, 3)
    d_cur, d_next = (np.asarray(d) for d in distances(view))
    np.testing.assert_array_equal(d_cur[0], [3, 2, 1])
    np.testing.assert_array_equal(d_next[0], [2, 1, 0])
    np.testing.assert_array_equal(d_cur[1, :2], [3, 2])
    np.testing.assert_array_equal(d_next[1, :2], [2, 1])
    np.testing.assert_array_equal(d_cur[2, :2], [2, 3])
    np.testing.assert_array_equal(d_next[2, :2], [3, 4])
    # Its last step's return: 10·0.1^1 = 1 instead of 10·0.1^4 (normalised: 10·0.1^0 = 10 instead of 1).
    np.testing.assert_allclose(graph_returns(view, normalised=True)[1, 1], 10.0, rtol=1e-5)
    np.testing.assert_allclose(graph_returns(hand_view(), normalised=True)[1, 1], 1.0, rtol=1e-5)
    for group, ret_11 in ((group_numpy(view), 1.0), (group_numpy(hand_view()), 0.001)):
        np.testing.assert_allclose(graphgpo_ref.graph_returns(group)[1, 1], ret_11, rtol=1e-9)
    ret = {(0, 0): 0.1, (0, 1): 1.0, (0, 2): 10.0, (1, 0): 0.1, (1, 1): 1.0, (2, 0): 0.01, (2, 1): 0.001}
    expected = expected_hand_advantages(ret)
    np.testing.assert_allclose(run(view), expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(graphgpo_ref.graphgpo(group_numpy(view)), expected, atol=1e-9)
    assert not np.allclose(run(view), run(hand_view()), atol=1e-3)


@pytest.mark.parametrize("rollout, anchor", [(1, 99), (2, 99), (0, 4), (0, 99)])
def test_final_next_anchor_off_the_graph_or_after_success_is_a_dead_end(rollout, anchor):
    # A fresh id is a node without outgoing edges (unreachable, as the dead end); a successful rollout's final
    # next anchor is ignored (its last step leads to success).
    view = with_final_next(hand_view(), rollout, anchor)
    for got, want in zip(distances(view), distances(hand_view()), strict=True):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    np.testing.assert_allclose(run(view), run(hand_view()), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(graphgpo_ref.graphgpo(group_numpy(view)),
                               graphgpo_ref.graphgpo(group_numpy(hand_view())), atol=1e-12)


def test_group_without_success_has_distance_one_everywhere():
    view = view_from_episodes([[1, 2], [1, 3]], [[0.0, -0.1], [0.0, 0.0]], [False, False], **SMALL)
    d_cur, d_next = (np.asarray(d) for d in distances(view))
    np.testing.assert_array_equal(d_cur[:2, :2], np.ones((2, 2)))
    np.testing.assert_array_equal(d_next[:2, :2], np.ones((2, 2)))
    out = run(view)  # equal graph returns: the step term vanishes, only the episode term is left
    np.testing.assert_allclose(out[:, 0], out[:, 1] * np.array([1, 1, 0, 0]), atol=1e-6)


def test_long_chain_distances():
    # One successful rollout through 40 distinct anchors, a second one that joins it at anchor 130, a third
    # that succeeds from a step without anchor (no node: unreachable = 41 would give 10·0.1^(0 − 41 + 1)).
    chain = list(range(100, 140))
    view = view_from_episodes([chain, [7, 130], [NO_ID]], [[0.0] * 40, [0.0, 0.0], [10.0]],
                              [True, False, True])
    d_cur, d_next = (np.asarray(d) for d in distances(view))
    np.testing.assert_array_equal(d_cur[0], np.arange(40, 0, -1))
    np.testing.assert_array_equal(d_next[0], np.arange(39, -1, -1))
    np.testing.assert_array_equal(d_cur[1, :2], [11, 10])
    returns = graph_returns(view, normalised=True)
    np.testing.assert_allclose(returns[0], 10.0, rtol=1e-6)  # every chain step is a shortest-path step
    np.testing.assert_array_equal(returns[2], 0.0)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("variant", range(len(VARIANTS)))
def test_matches_reference_on_synthetic_groups(seed, variant):
    kwargs = VARIANTS[variant]
    view = synthetic_view(seed)
    ref = graphgpo_ref.graphgpo_all([group_numpy(view, g) for g in range(4)], **kwargs)
    assert_close_to_reference(graphgpo.batched_graphgpo(view, **kwargs), ref)


@pytest.mark.parametrize("variant", range(len(VARIANTS)))
def test_matches_reference_on_heavy_repeats(variant):
    kwargs = VARIANTS[variant]
    view = batch_of(*[random_group(seed, num_anchors=5) for seed in range(8)])
    ref = graphgpo_ref.graphgpo_all([group_numpy(view, g) for g in range(8)], **kwargs)
    assert_close_to_reference(graphgpo.batched_graphgpo(view, **kwargs), ref)


def set_final_next_anchors(view, seed):
    """A batched view whose rollouts end with random next anchors: ``NO_ID``, an anchor of the group or a
    fresh id, each with probability 1/3 (successful rollouts included: the kernel must ignore theirs)."""
    rng = np.random.default_rng(seed)
    next_anchor = np.array(view.next_anchor)
    anchor, mask, length = (np.asarray(x) for x in (view.anchor, view.mask, view.length))
    for g in range(next_anchor.shape[0]):
        pool = np.unique(anchor[g][mask[g] & (anchor[g] != NO_ID)])
        for r in np.flatnonzero(length[g] > 0):
            kind, choice = rng.integers(3), NO_ID
            if kind == 1 and pool.size:
                choice = int(rng.choice(pool))
            elif kind == 2:
                choice = 10_000 + int(rng.integers(3))  # fresh ids, which may repeat across rollouts
            next_anchor[g, r, length[g, r] - 1] = choice
    return view.replace(next_anchor=jax.numpy.asarray(next_anchor))


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("variant", range(len(VARIANTS)))
def test_matches_reference_with_final_next_anchors(seed, variant):
    kwargs = VARIANTS[variant]
    base = synthetic_view(seed)
    views = {"synthetic": (set_final_next_anchors(base, seed), base)}
    heavy = batch_of(*[random_group(seed * 8 + k, num_anchors=5) for k in range(8)])
    views["heavy"] = (set_final_next_anchors(heavy, seed), heavy)
    for name, (view, dead_view) in views.items():
        num_groups = view.mask.shape[0]
        ref = graphgpo_ref.graphgpo_all([group_numpy(view, g) for g in range(num_groups)], **kwargs)
        out = graphgpo.batched_graphgpo(view, **kwargs)
        assert_close_to_reference(out, ref)
        # The final next anchors matter: some advantage differs from the dead-end graph's.
        assert not np.allclose(np.asarray(out), np.asarray(graphgpo.batched_graphgpo(dead_view, **kwargs)),
                               atol=1e-3), name


@pytest.mark.slow  # for CI time: `make test-slow` (README, "Tests")
def test_jit_matches_no_jit():
    view = random_group(3, num_anchors=5)
    jitted = np.asarray(graphgpo.batched_graphgpo(batch_of(view), normalised=True)[0])
    with jax.disable_jit():
        eager = graphgpo.graphgpo(view, normalised=True)
    np.testing.assert_allclose(jitted, np.asarray(eager), rtol=1e-6, atol=1e-6)


def test_compiles_once_and_is_finite():
    chex.clear_trace_counter()

    @jax.jit
    @chex.assert_max_traces(n=1)
    def kernel(view):
        return graphgpo.graphgpo(view, normalised=True)

    for seed in range(3):
        chex.assert_tree_all_finite(kernel(random_group(seed)))
    empty = view_from_episodes([[1], []], [[0.0], []], [False, False], **SMALL)
    chex.assert_tree_all_finite(run(empty))


def test_permuting_rollouts_permutes_advantages():
    view = synthetic_view(5)
    perm = np.random.default_rng(0).permutation(8)
    permuted = graphgpo.batched_graphgpo(permute_rollouts(view, perm), normalised=True)
    expected = np.asarray(graphgpo.batched_graphgpo(view, normalised=True))[:, perm]
    np.testing.assert_allclose(permuted, expected, rtol=1e-5, atol=1e-5)


def test_padding_never_changes_the_result():
    base = graphgpo.batched_graphgpo(synthetic_view(7))
    padded_view = synthetic_view(7, extra_rows=50, pad_rollouts=2, pad_steps=6)
    padded = np.asarray(graphgpo.batched_graphgpo(padded_view))
    np.testing.assert_allclose(padded[:, :8, :20], np.asarray(base), rtol=1e-5, atol=1e-5)
    assert not padded[:, 8:].any() and not padded[:, :, 20:].any()
