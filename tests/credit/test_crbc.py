"""CRBC: hand case, NumPy reference, closure = Monte Carlo of the empirical process, Proposition 1, depth 0,
no repeated anchor, padding, permutation, jit, single compilation, capacity ladder, coverage."""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentjax.credit import crbc_process as cp
from agentjax.credit.crbc import batched_coverage, batched_crbc, crbc_advantages
from agentjax.credit.reference import crbc as ref
from agentjax.credit.reference import group_numpy
from agentjax.credit.trajectory import batched_grpo
from agentjax.rollout import StepBatch, to_groups
from agentjax.rollout.synthetic import synthetic_batch

BETA = 0.98


def view_of(seed, g=4, r=8, t=30, **kw):
    return to_groups(synthetic_batch(seed, g, r, t, **kw), num_groups=g, num_rollouts=r, max_steps=t)


def group(view, g):
    return jax.tree.map(lambda x: x[g], view)


def rows_view(rollouts, num_rollouts, max_steps):
    """A one-group view from [(anchors, actions, won)] rollouts."""
    fields = {k: [] for k in ("group", "rollout", "step", "anchor", "action", "won", "reward", "valid")}
    for r, (anchors, actions, won) in enumerate(rollouts):
        for t, (s, a) in enumerate(zip(anchors, actions, strict=True)):
            last = t == len(anchors) - 1
            for k, x in (("group", 0), ("rollout", r), ("step", t), ("anchor", s), ("action", a),
                         ("won", won and last), ("reward", 10.0 * (won and last)), ("valid", True)):
                fields[k].append(x)
    fields = {k: np.asarray(v) for k, v in fields.items()}
    batch = StepBatch.from_rows(len(fields["group"]) + 3, 2, 2, **fields)
    return group(to_groups(batch, num_groups=1, num_rollouts=num_rollouts, max_steps=max_steps), 0)


A, B, C = 1, 2, 3
X, Y, Z, W = 11, 12, 13, 14


def test_hand_case():
    # r0: A-x->B-y->success; r1: A-z->C-y->failure; r2: A-z->B-w->failure.
    # V(B) = 1/2, V(C) = 0, V(A) = β/3; Q(A,x) = β/2, Q(A,z) = β/4; σ(A) = β/√72 > σ_min;
    # ĉ(A,x) = √2, ĉ(A,z) = −1/√2; ĉ(B,y) = 1, ĉ(B,w) = −1; C has one action: no credit.
    # GRPO on returns [10, 0, 0]: mean 10/3, unbiased std √(100/3) -> [2/√3, −1/√3, −1/√3].
    view = rows_view([([A, B], [X, Y], True), ([A, C], [Z, Y], False), ([A, B], [Z, W], False)], 3, 3)
    out = crbc_advantages(view, beta=BETA)
    s2, g = np.sqrt(2.0), 1.0 / np.sqrt(3.0)
    expected = np.array([[2 * g + 5 * s2, 2 * g + 5, 0], [-g - 5 / s2, -g, 0], [-g - 5 / s2, -g - 5, 0]])
    np.testing.assert_allclose(out.advantage, expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out.q[:, 0], [BETA / 2, BETA / 4, BETA / 4], rtol=1e-6)
    np.testing.assert_allclose(out.v[:, 0], BETA / 3, rtol=1e-6)
    np.testing.assert_allclose(out.sigma[0, 0], BETA / np.sqrt(72), rtol=1e-5)
    np.testing.assert_array_equal(out.eligible, [[1, 1, 0], [1, 0, 0], [1, 1, 0]])


@pytest.mark.parametrize("depth", [None, 0, 1, 3])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matches_numpy_reference(seed, depth):
    view = view_of(seed, num_states=[18, 30, 45][seed])
    out = batched_crbc(view, beta=BETA, depth=depth)
    for g in range(view.mask.shape[0]):
        adv, diag = ref.crbc(group_numpy(view, g), beta=BETA, depth=depth)
        np.testing.assert_allclose(out.q[g], diag["q"], atol=2e-6)
        np.testing.assert_allclose(out.v[g], diag["v"], atol=2e-6)
        np.testing.assert_array_equal(out.eligible[g], diag["eligible"])
        np.testing.assert_allclose(out.advantage[g], adv, rtol=1e-4, atol=1e-4)


def test_hyperparameters_match_reference():
    view = view_of(5)
    kw = dict(beta=0.95, w_traj=0.5, w_step=2.0, sigma_min=0.3, score="success")
    out = batched_crbc(view, **kw)
    for g in range(4):
        adv, _ = ref.crbc(group_numpy(view, g), **kw)
        np.testing.assert_allclose(out.advantage[g], adv, rtol=1e-4, atol=1e-4)


def test_many_states_use_a_larger_solve():
    # Unique-ish anchors: up to R*T states, more than the smallest capacity (32) -> a larger ladder branch.
    view = view_of(3, g=3, r=4, t=40)
    pool = np.random.default_rng(3).integers(0, 150, size=view.anchor.shape)
    view = view.replace(anchor=jnp.where(view.mask, jnp.asarray(pool, jnp.int32), -1))
    proc = jax.vmap(functools.partial(cp.build_process, beta=BETA))(view)
    assert int(proc.num_states.max()) > 64
    out = batched_crbc(view)
    for g in range(3):
        adv, diag = ref.crbc(group_numpy(view, g))
        np.testing.assert_allclose(out.q[g], diag["q"], atol=2e-6)
        np.testing.assert_allclose(out.advantage[g], adv, rtol=1e-4, atol=1e-4)


def simulate_value(view, start_state, beta, episodes, rng):
    """Monte Carlo of the empirical process: from s pick a visit of s uniformly (a ~ π̂, s' ~ P̂) and follow
    its transition; the return is β^(k−1) on entering success at the k-th transition."""
    g = group_numpy(view)
    visits = ref.empirical_process(g)
    by_state = {}
    for _, _, s, _, nxt in visits:
        by_state.setdefault(s, []).append(nxt)
    returns = np.zeros(episodes)
    for e in range(episodes):
        s, disc = start_state, 1.0
        while True:
            nxt = by_state[s][rng.integers(len(by_state[s]))]
            if nxt == ref.SUCCESS:
                returns[e] = disc
                break
            if nxt == ref.FAILURE:
                break
            s, disc = nxt, disc * beta
    return returns


def test_closure_is_discounted_success_probability_of_empirical_process():
    view = group(view_of(7, g=1, r=8, t=20, num_states=18), 0)
    out = crbc_advantages(view, beta=0.9)
    rng = np.random.default_rng(0)
    for r, t in [(0, 0), (3, 4), (5, 10)]:
        if not view.mask[r, t]:
            continue
        state = ("anchor", int(view.anchor[r, t]))
        returns = simulate_value(view, state, 0.9, 4000, rng)
        se = returns.std() / np.sqrt(len(returns))
        assert abs(returns.mean() - float(out.v[r, t])) < 4 * se + 1e-3, (returns.mean(), out.v[r, t], se)


@pytest.mark.parametrize("beta", [0.9, 0.98, 1.0])
def test_proposition_1_finite_depth_error_bound(beta):
    view = group(view_of(11, g=1, r=8, t=40, num_states=18), 0)
    assert 0 < float(view.success.sum()) < 8
    proc = cp.build_process(view, beta=beta)
    v = cp.closure_values(proc, beta=beta)
    v0 = cp.visit_local_values(proc)
    real = np.arange(v.shape[0]) < int(proc.num_states)
    err0 = np.abs(np.asarray(v0 - v))[real].max()
    assert err0 > 1e-3
    for k in [1, 2, 5, 10, 40]:
        vk = cp.finite_depth_values(proc, beta=beta, depth=k)
        errk = np.abs(np.asarray(vk - v))[real].max()
        assert errk <= beta**k * err0 + 1e-5, (k, errk, beta**k * err0)
    # and the fixed point holds: V = r_π + β P_π V
    np.testing.assert_allclose(cp.bellman_backup(v, proc, beta)[real], v[real], atol=2e-6)


def test_depth_zero_is_visit_local_averaging():
    view = group(view_of(13, g=1), 0)
    out = crbc_advantages(view, depth=0, beta=BETA)
    g = group_numpy(view)
    sums, counts = {}, {}
    for r, t, s, a, _ in ref.empirical_process(g):
        ret = g["success"][r] * BETA ** (g["length"][r] - t - 1)
        for key in ((s,), (s, a)):
            sums[key] = sums.get(key, 0.0) + ret
            counts[key] = counts.get(key, 0) + 1
    for r, t, s, a, _ in ref.empirical_process(g):
        assert abs(out.q[r, t] - sums[(s, a)] / counts[(s, a)]) < 1e-6
        assert abs(out.v[r, t] - sums[(s,)] / counts[(s,)]) < 1e-6


def test_no_repeated_anchor_gives_trajectory_advantage_alone():
    view = view_of(17)
    r_len, t_len = view.mask.shape[1:]
    unique = jnp.arange(4 * r_len * t_len, dtype=jnp.int32).reshape(view.anchor.shape)
    view = view.replace(anchor=jnp.where(view.mask, unique, -1))
    out = batched_crbc(view)
    assert not bool(out.eligible.any())
    np.testing.assert_allclose(out.advantage, batched_grpo(view), atol=1e-6)


def test_credit_is_centred_under_the_behaviour_policy():
    out = batched_crbc(view_of(19))
    c = np.asarray(out.q - out.v)[np.asarray(view_of(19).mask)]
    # Σ_a π̂(a|s)(Q − V) = 0 per state: summed over visits of every state it vanishes; check globally per group
    assert abs(c.sum()) < 1e-3


def test_padding_never_changes_a_result():
    batch = synthetic_batch(23, 3, 6, 20)
    padded = synthetic_batch(23, 3, 6, 20, capacity=3 * 6 * 20 + 57)
    small = batched_crbc(to_groups(batch, num_groups=3, num_rollouts=6, max_steps=20))
    big = batched_crbc(to_groups(padded, num_groups=3, num_rollouts=8, max_steps=27))
    np.testing.assert_allclose(big.advantage[:, :6, :20], small.advantage, atol=1e-5)
    assert float(jnp.abs(big.advantage[:, 6:]).max()) == 0.0
    assert float(jnp.abs(big.advantage[:, :, 20:]).max()) == 0.0


def test_permuting_rollouts_permutes_advantages():
    view = view_of(29)
    perm = np.random.default_rng(0).permutation(view.mask.shape[1])
    permuted = jax.tree.map(lambda x: x[:, perm], view)
    a, b = batched_crbc(view), batched_crbc(permuted)
    np.testing.assert_allclose(b.advantage, a.advantage[:, perm], rtol=1e-5, atol=5e-5)


@pytest.mark.slow  # for CI time: `make test-slow` (README, "Tests")
def test_jit_equals_no_jit():
    view = view_of(31, g=2, t=15)
    jitted = batched_crbc(view)
    with jax.disable_jit():
        for g in range(2):
            eager = crbc_advantages(group(view, g))
            np.testing.assert_allclose(eager.advantage, jitted.advantage[g], atol=1e-5)


def test_compiles_once_and_is_finite():
    @jax.jit
    @chex.assert_max_traces(n=1)
    def kernel(v):
        return batched_crbc.__wrapped__(v)

    for seed in (37, 41, 43):
        out = kernel(view_of(seed, g=2, t=15))
        chex.assert_tree_all_finite(jax.tree.leaves(out))  # leaves: the dataclass rejects bools


def test_bad_hyperparameters_are_clear_errors():
    view = view_of(0, g=1, t=10)
    with pytest.raises(ValueError, match="depth"):
        batched_crbc(view, depth=-1)
    with pytest.raises(ValueError, match="beta"):
        batched_crbc(view, beta=1.5)
    with pytest.raises(ValueError, match="sigma_min"):
        batched_crbc(view, sigma_min=0.0)


@pytest.mark.parametrize("depth", [None, 0, 2])
def test_coverage_matches_reference_and_grows_with_depth(depth):
    view = view_of(47)
    cov, eligible = batched_coverage(view, depth=depth)
    for g in range(4):
        np.testing.assert_array_equal(cov[g], ref.coverage(group_numpy(view, g), depth))
    full, _ = batched_coverage(view, depth=None)
    assert bool(jnp.all(full >= cov))
    assert bool(jnp.all(cov[eligible] >= 1))
