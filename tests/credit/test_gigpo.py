"""GiGPO kernel: hand-computed cases, NumPy reference, invariances, compilation."""

from __future__ import annotations

import chex
import jax
import numpy as np
import pytest

from agentjax.credit import gigpo
from agentjax.credit.reference import gigpo as gigpo_ref
from agentjax.credit.reference import group_numpy
from agentjax.rollout.batch import NO_ID
from agentjax.rollout.groups import GroupView
from tests.credit.groups import (
    EPS,
    MODES,
    SMALL,
    assert_close_to_reference,
    batch_of,
    permute_rollouts,
    random_group,
    synthetic_view,
    view_from_episodes,
)


def run(view: GroupView, **kwargs) -> np.ndarray:
    """The jitted batched kernel on one group: [R, T]."""
    return np.asarray(gigpo.batched_gigpo(batch_of(view), **kwargs)[0])


# ----------------------------------------------------------------------------------------------- hand cases
def hand_view():
    # r0: 1 -> 2 -> success (rewards 0, 10); r1: 1 -> 3, failed, an invalid action first; r2: 1 -> success.
    return view_from_episodes(anchors=[[1, 2], [1, 3], [1]], rewards=[[0.0, 10.0], [-0.1, 0.0], [10.0]],
                              success=[True, False, True], **SMALL)


@pytest.mark.parametrize("mode", MODES)
def test_hand_case(mode):
    view = hand_view()
    # Episode scores 10, -0.1, 10 over the step rows [10, 10, -0.1, -0.1, 10].
    rows = [10.0, 10.0, -0.1, -0.1, 10.0]
    mean_e = (10 + 10 - 0.1 - 0.1 + 10) / 5
    std_e = np.sqrt(sum((x - mean_e) ** 2 for x in rows) / 4)
    # Step returns with gamma = 0.5: r0 [0 + 0.5 * 10, 10], r1 [-0.1, 0], r2 [10].
    # Anchor 1 groups (0,0), (1,0), (2,0) with returns 5, -0.1, 10; anchors 2 and 3 are singletons -> 0.
    mean_s = (5 - 0.1 + 10) / 3
    std_s = np.sqrt(((5 - mean_s) ** 2 + (-0.1 - mean_s) ** 2 + (10 - mean_s) ** 2) / 2)
    if mode == "mean_std_norm":
        ep = lambda s: (s - mean_e) / (std_e + EPS)  # noqa: E731
        st = lambda x: (x - mean_s) / (std_s + EPS)  # noqa: E731
    else:
        ep = lambda s: s - mean_e  # noqa: E731
        st = lambda x: x - mean_s  # noqa: E731
    expected = np.array([[ep(10) + st(5), ep(10)],
                         [ep(-0.1) + st(-0.1), ep(-0.1)],
                         [ep(10) + st(10), 0.0]])
    expected = np.pad(expected, ((0, 1), (0, 1)))  # the padded rollout and step
    np.testing.assert_allclose(run(view, gamma=0.5, mode=mode), expected, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(gigpo_ref.gigpo(group_numpy(view), gamma=0.5, mode=mode), expected, atol=1e-9)


def test_discounted_returns():
    view = hand_view()
    np.testing.assert_allclose(np.asarray(gigpo.discounted_returns(view.reward, view.mask, 0.5)),
                               [[5.0, 10.0, 0.0], [-0.1, 0.0, 0.0], [10.0, 0.0, 0.0], [0.0, 0.0, 0.0]],
                               atol=1e-6)


def test_single_row_group_has_mean_zero_std_one():
    # One rollout of one step: mean 0, std 1 -> A^E = S / (1 + eps); one rollout of two steps: A^E = 0.
    one = view_from_episodes([[4]], [[10.0]], [True], **SMALL)
    np.testing.assert_allclose(run(one)[0, 0], 10.0 / (1 + EPS), rtol=1e-6)
    np.testing.assert_allclose(run(one, mode="mean_norm")[0, 0], 10.0, rtol=1e-6)
    two = view_from_episodes([[4, 5]], [[-0.1, 10.0]], [True], **SMALL)
    np.testing.assert_allclose(run(two)[0, :2], [0.0, 0.0], atol=1e-7)


def test_no_id_anchors_never_group():
    # Both first steps lack an anchor: they would form a group of returns (0, 10) if NO_ID were an anchor.
    view = view_from_episodes([[NO_ID], [NO_ID]], [[0.0], [10.0]], [False, True], **SMALL)
    ep = np.array([0.0 - 5.0, 10.0 - 5.0]) / (np.sqrt(50.0) + EPS)  # episode term only
    np.testing.assert_allclose(run(view)[:2, 0], ep, rtol=1e-6)


# ----------------------------------------------------------------------------------------------- reference
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("mode", MODES)
def test_matches_reference_on_synthetic_groups(seed, mode):
    view = synthetic_view(seed)
    ref = gigpo_ref.gigpo_all([group_numpy(view, g) for g in range(4)], mode=mode)
    assert_close_to_reference(gigpo.batched_gigpo(view, mode=mode), ref)


@pytest.mark.parametrize("mode", MODES)
def test_matches_reference_on_heavy_repeats(mode):
    view = batch_of(*[random_group(seed) for seed in range(8)])
    ref = gigpo_ref.gigpo_all([group_numpy(view, g) for g in range(8)], mode=mode, step_weight=0.5)
    assert_close_to_reference(gigpo.batched_gigpo(view, mode=mode, step_weight=0.5), ref)


# ----------------------------------------------------------------------------------------------- jit, traces
@pytest.mark.slow  # for CI time: `make test-slow` (README, "Tests")
def test_jit_matches_no_jit():
    view = random_group(3)
    jitted = jax.jit(gigpo.gigpo)(view)
    with jax.disable_jit():
        eager = gigpo.gigpo(view)
    np.testing.assert_allclose(np.asarray(jitted), np.asarray(eager), rtol=1e-6, atol=1e-6)


def test_compiles_once_and_is_finite():
    chex.clear_trace_counter()

    @jax.jit
    @chex.assert_max_traces(n=1)
    def kernel(view):
        return gigpo.gigpo(view, mode="mean_norm")

    for seed in range(3):
        out = kernel(random_group(seed))
        chex.assert_tree_all_finite(out)


def test_finite_on_degenerate_groups():
    empty = view_from_episodes([[1], []], [[0.0], []], [False, False], **SMALL)
    same = view_from_episodes([[1, 2], [1, 2]], [[0.0, 10.0], [0.0, 10.0]], [True, True], **SMALL)
    for view in (empty, same):
        for mode in MODES:
            out = run(view, mode=mode)
            chex.assert_tree_all_finite(out)
    np.testing.assert_array_equal(run(same), np.zeros((4, 3)))  # identical rollouts: exactly 0


# ----------------------------------------------------------------------------------------------- invariances
@pytest.mark.parametrize("mode", MODES)
def test_permuting_rollouts_permutes_advantages(mode):
    view = synthetic_view(5)
    perm = np.random.default_rng(0).permutation(8)
    permuted = gigpo.batched_gigpo(permute_rollouts(view, perm), mode=mode)
    np.testing.assert_allclose(permuted, np.asarray(gigpo.batched_gigpo(view, mode=mode))[:, perm],
                               rtol=1e-5, atol=1e-5)


def test_padding_never_changes_the_result():
    base = gigpo.batched_gigpo(synthetic_view(7))
    padded_view = synthetic_view(7, extra_rows=50, pad_rollouts=2, pad_steps=6)
    padded = np.asarray(gigpo.batched_gigpo(padded_view))
    np.testing.assert_allclose(padded[:, :8, :20], np.asarray(base), rtol=1e-5, atol=1e-5)
    assert not padded[:, 8:].any() and not padded[:, :, 20:].any()
    assert not padded[~np.asarray(padded_view.mask)].any()
