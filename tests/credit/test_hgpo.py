"""HGPO kernel: hand-computed cases, NumPy reference, invariances, compilation."""

from __future__ import annotations

import functools

import chex
import jax
import numpy as np
import pytest

from agentjax.credit import hgpo
from agentjax.credit.reference import group_numpy
from agentjax.credit.reference import hgpo as hgpo_ref
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
    dict(),  # K = 2, alpha = 1, mean_std_norm
    dict(mode="mean_norm", trajectory_term=True),
    dict(history=3, alpha=0.5, trajectory_term=True),
)


def run(view, **kwargs) -> np.ndarray:
    return np.asarray(hgpo.batched_hgpo(batch_of(view), **kwargs)[0])


def hand_view():
    # Returns with gamma = 0.5: r0 [5, 10] (1 -> 2 -> success), r1 [0, 0] (1 -> 2, failed),
    # r2 [5, 10] (3 -> 2 -> success).
    return view_from_episodes(anchors=[[1, 2], [1, 2], [3, 2]],
                              rewards=[[0.0, 10.0], [0.0, 0.0], [0.0, 10.0]], success=[True, False, True],
                              **SMALL)


def hand_levels():
    """a_1, a_2 of the hand view (K = 1), population std."""
    # Level 1: anchor 1 -> {(0,0): 5, (1,0): 0}; anchor 2 -> {(0,1): 10, (1,1): 0, (2,1): 10}; anchor 3 alone.
    a1_anchor1 = 2.5 / (2.5 + EPS)  # mean 2.5, std 2.5
    std2 = np.sqrt(((10 - 20 / 3) ** 2 * 2 + (0 - 20 / 3) ** 2) / 3)
    a1_hi, a1_lo = (10 - 20 / 3) / (std2 + EPS), (0 - 20 / 3) / (std2 + EPS)
    # Level 2 (t >= 1 only): window (1, 2) -> {(0,1): 10, (1,1): 0}; window (3, 2) alone.
    a2 = 5.0 / (5.0 + EPS)
    return a1_anchor1, a1_hi, a1_lo, a2


def test_hand_case():
    a1_anchor1, a1_hi, a1_lo, a2 = hand_levels()
    w1, w2 = 2.0, 3.0  # (k + 1)^alpha, alpha = 1
    expected = np.zeros((4, 3))
    expected[0, 0] = w1 * a1_anchor1 / (w1 + EPS)
    expected[1, 0] = -w1 * a1_anchor1 / (w1 + EPS)
    expected[2, 0] = 0.0  # anchor 3 is alone at level 1 and t = 0 has no level 2
    expected[0, 1] = (w1 * a1_hi + w2 * a2) / (w1 + w2 + EPS)
    expected[1, 1] = (w1 * a1_lo - w2 * a2) / (w1 + w2 + EPS)
    expected[2, 1] = w1 * a1_hi / (w1 + EPS)  # its window (3, 2) is alone
    view = hand_view()
    np.testing.assert_allclose(run(view, gamma=0.5, history=1), expected, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(hgpo_ref.hgpo(group_numpy(view), gamma=0.5, history=1), expected, atol=1e-9)


def test_hand_case_mean_norm_with_trajectory_term():
    # Level values without std: anchor 1 -> +-2.5; anchor 2 -> 10 - 20/3, 0 - 20/3; window (1, 2) -> +-5.
    # Episode scores 10, 0, 10 over rows [10, 10, 0, 0, 10, 10]: mean 20/3, a_0 = score - 20/3.
    hi, lo = 10 - 20 / 3, 0 - 20 / 3
    w0, w1, w2 = 1.0, 2.0, 3.0
    expected = np.zeros((4, 3))
    expected[0, 0] = (w0 * hi + w1 * 2.5) / (w0 + w1 + EPS)
    expected[1, 0] = (w0 * lo - w1 * 2.5) / (w0 + w1 + EPS)
    expected[2, 0] = w0 * hi / (w0 + EPS)
    expected[0, 1] = (w0 * hi + w1 * hi + w2 * 5.0) / (w0 + w1 + w2 + EPS)
    expected[1, 1] = (w0 * lo + w1 * lo - w2 * 5.0) / (w0 + w1 + w2 + EPS)
    expected[2, 1] = (w0 * hi + w1 * hi) / (w0 + w1 + EPS)
    kwargs = dict(gamma=0.5, history=1, mode="mean_norm", trajectory_term=True)
    np.testing.assert_allclose(run(hand_view(), **kwargs), expected, rtol=1e-6, atol=1e-6)


def test_windows_with_missing_anchors_never_match():
    # Both rollouts read NO_ID, then anchor 5: level 1 groups the second steps (returns 10 and 0, a_1 = +-1);
    # their level-2 windows (NO_ID, 5) must not form a group, so the advantage is a_1 alone.
    view = view_from_episodes([[NO_ID, 5], [NO_ID, 5]], [[0.0, 10.0], [0.0, 0.0]], [True, False], **SMALL)
    out = run(view, history=1)
    np.testing.assert_allclose(out[:2, 1], [1.0, -1.0], rtol=1e-5)
    np.testing.assert_array_equal(out[:2, 0], [0.0, 0.0])


def test_history_segments_of_a_loop():
    # One rollout looping 1, 2, 1, 2, 1: level-2 windows (2,1) at t=2 and t=4 match; level 3 (1,2,1) too.
    view = view_from_episodes([[1, 2, 1, 2, 1]], [[0.0] * 5], [False])
    segments_of = jax.jit(functools.partial(hgpo.history_segments, history=2))
    seg_krt, valid_krt = segments_of(view.anchor, view.mask)
    np.testing.assert_array_equal(seg_krt[0, 0], [0, 1, 0, 1, 0])
    np.testing.assert_array_equal(valid_krt[1, 0], [False, True, True, True, True])
    np.testing.assert_array_equal(seg_krt[1, 0, 1:], [1, 2, 1, 2])
    np.testing.assert_array_equal(seg_krt[2, 0, 2:], [2, 3, 2])


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("variant", range(len(VARIANTS)))
def test_matches_reference_on_synthetic_groups(seed, variant):
    kwargs = VARIANTS[variant]
    view = synthetic_view(seed)
    ref = hgpo_ref.hgpo_all([group_numpy(view, g) for g in range(4)], **kwargs)
    assert_close_to_reference(hgpo.batched_hgpo(view, **kwargs), ref)


@pytest.mark.parametrize("variant", range(len(VARIANTS)))
def test_matches_reference_on_heavy_repeats(variant):
    kwargs = VARIANTS[variant]
    view = batch_of(*[random_group(seed) for seed in range(8)])
    ref = hgpo_ref.hgpo_all([group_numpy(view, g) for g in range(8)], **kwargs)
    assert_close_to_reference(hgpo.batched_hgpo(view, **kwargs), ref)


@pytest.mark.slow  # for CI time: `make test-slow` (README, "Tests")
def test_jit_matches_no_jit():
    view = random_group(3)
    jitted = np.asarray(hgpo.batched_hgpo(batch_of(view), trajectory_term=True)[0])
    with jax.disable_jit():
        eager = hgpo.hgpo(view, trajectory_term=True)
    np.testing.assert_allclose(jitted, np.asarray(eager), rtol=1e-6, atol=1e-6)


def test_compiles_once_and_is_finite():
    chex.clear_trace_counter()

    @jax.jit
    @chex.assert_max_traces(n=1)
    def kernel(view):
        return hgpo.hgpo(view)

    for seed in range(3):
        chex.assert_tree_all_finite(kernel(random_group(seed)))
    empty = view_from_episodes([[1], []], [[0.0], []], [False, False], **SMALL)
    chex.assert_tree_all_finite(run(empty, trajectory_term=True))


def test_permuting_rollouts_permutes_advantages():
    view = synthetic_view(5)
    perm = np.random.default_rng(0).permutation(8)
    permuted = hgpo.batched_hgpo(permute_rollouts(view, perm), **VARIANTS[1])
    np.testing.assert_allclose(permuted, np.asarray(hgpo.batched_hgpo(view, **VARIANTS[1]))[:, perm],
                               rtol=1e-5, atol=1e-5)


def test_padding_never_changes_the_result():
    base = hgpo.batched_hgpo(synthetic_view(7))
    padded_view = synthetic_view(7, extra_rows=50, pad_rollouts=2, pad_steps=6)
    padded = np.asarray(hgpo.batched_hgpo(padded_view))
    np.testing.assert_allclose(padded[:, :8, :20], np.asarray(base), rtol=1e-5, atol=1e-5)
    assert not padded[:, 8:].any() and not padded[:, :, 20:].any()
