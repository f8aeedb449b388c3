"""experiments/crbc/credit_analysis.py: the scripted policy, the rollout batch, exact Q^π, the analyses.

Checked: the ε-oracle policy's probabilities; exact V^π/Q^π against a brute-force enumeration of every action
sequence on a hand-built room and against Monte Carlo episodes of the real `SokobanEnv` (both objectives); the
StepBatch rows against the host records (anchor ids ⇔ grid texts within a group, next_anchor chaining, rewards
in both reward modes, won/terminated/truncated, one reset state per group) and the true advantage of winning
moves; the ranks and correlations against scipy; coverage, eligibility and ``V⁽ᴷ⁾`` against an explicit-loop
NumPy process of each group, and Proposition 1; accuracy rows on a perfect and a constant credit; the
configuration from environment variables and its errors; strict JSON output.
"""

from __future__ import annotations

import itertools
import json
import types

import numpy as np
import pytest
from scipy import stats

from agentjax.credit import batched_crbc
from envs.base import Task
from envs.sokoban import ACTIONS, SokobanEnv, oracle_action, parse_room, render_room, solution_length
from envs.sokoban.room import is_solved, step_room
from experiments.crbc import credit_analysis as ca

pytestmark = pytest.mark.slow  # the notebook end to end: `make test-slow` (README, "Tests")

# A corridor room: the player must push the box two cells right onto the target (shortest solution: 2 moves).
ROOM = "######\n#____#\n#PX_O#\n#____#\n######"
TINY = ca.AnalysisConfig(epsilons=(0.3, 0.6), groups_per_epsilon=3, depths=(0, 1), value_depth=6,
                         truth_discounts=(0.98,), bootstrap=5)


def host(tree):
    """The fields of a StepBatch / GroupView as NumPy arrays (a namespace: the pytree classes are type-checked)."""
    return types.SimpleNamespace(**{k: np.asarray(getattr(tree, k)) for k in tree.__dataclass_fields__})


@pytest.fixture(scope="module")
def rollouts():
    return ca.collect_groups(TINY)


@pytest.fixture(scope="module")
def env_rollouts():
    return ca.collect_groups(ca.AnalysisConfig(epsilons=(0.5,), groups_per_epsilon=2, reward="env"))


def test_policy_probs():
    state = parse_room(ROOM)
    p = ca.policy_probs(state, 0.2)
    assert oracle_action(state) == "Right"
    np.testing.assert_allclose(p, [0.05, 0.05, 0.05, 0.85])
    np.testing.assert_allclose(ca.policy_probs(state, 0.0), [0, 0, 0, 1])
    np.testing.assert_allclose(ca.policy_probs(state, 1.0), 0.25)


def brute_force_value(state, epsilon, steps_left, discount, objective):
    """Σ over all action sequences of their probability times their discounted return (explicit paths)."""
    total = 0.0
    for seq in itertools.product(range(4), repeat=steps_left):
        s, prob, ret = state, 1.0, 0.0
        for k, a in enumerate(seq):
            prob *= ca.policy_probs(s, epsilon)[a]
            step = step_room(s, ACTIONS[a])
            ret += discount**k * (float(step.solved) if objective == "success" else step.reward)
            s = step.state
            if step.solved:
                break
        total += prob * ret / 4 ** (steps_left - 1 - k)  # the unused tail actions of a solved path sum to 1
    return total


@pytest.mark.parametrize("objective", ["success", "env"])
def test_exact_values_match_brute_force(objective):
    state = parse_room(ROOM)
    ex = ca.exact_values(state, 0.4, horizon=4, discount=0.9, objective=objective)
    i = ex.index[state]
    for h in range(1, 5):
        np.testing.assert_allclose(ex.v_hs[h, i], brute_force_value(state, 0.4, h, 0.9, objective), rtol=1e-10)
    np.testing.assert_allclose((ex.pi_sa * ex.q_hsa).sum(-1), ex.v_hs, atol=1e-12)  # V = Σ π Q at every h
    assert ex.v_hs[0].max() == 0.0 and ex.q_hsa[0].max() == 0.0


@pytest.mark.parametrize("objective", ["success", "env"])
def test_exact_values_match_monte_carlo_in_the_env(objective):
    """V^π_H(start) against 3000 episodes of the real SokobanEnv under the same policy (4 standard errors)."""
    env = SokobanEnv(max_steps=6)
    task = Task(env="sokoban", task_id="corridor", split="test", meta={"room": ROOM})
    rng = np.random.default_rng(0)
    returns = []
    for _ in range(3000):
        env.reset(task)
        done, ret, k = False, 0.0, 0
        while not done:
            a = rng.choice(4, p=ca.policy_probs(env.state, 0.7))
            _, r, done, info = env.step(ACTIONS[a])
            ret += 0.95**k * (float(info["won"]) if objective == "success" else r)
            k += 1
        returns.append(ret)
    ex = ca.exact_values(parse_room(ROOM), 0.7, horizon=6, discount=0.95, objective=objective)
    mc, stderr = np.mean(returns), np.std(returns) / np.sqrt(len(returns))
    assert abs(mc - ex.v_hs[6, 0]) < 4 * stderr, (mc, ex.v_hs[6, 0], stderr)


def test_exact_values_rejects_bad_input():
    with pytest.raises(ValueError, match="objective"):
        ca.exact_values(parse_room(ROOM), 0.1, horizon=3, discount=1.0, objective="shaped")
    with pytest.raises(ValueError, match="already solved"):
        ca.exact_values(parse_room("#####\n#P√_#\n#####"), 0.1, horizon=3, discount=1.0)


def test_batch_rows_match_the_episodes(rollouts):
    b = host(rollouts.batch)
    n = len(rollouts.state_n)
    assert b.row_mask.all() and len(b.row_mask) == n
    view = host(rollouts.view)
    assert view.mask.shape == (6, 8, 15) and view.mask.sum() == n
    np.testing.assert_array_equal(rollouts.epsilon_g, [0.3] * 3 + [0.6] * 3)
    np.testing.assert_array_equal(rollouts.task_g[:3], rollouts.task_g[3:])  # the same rooms for every ε
    texts = [render_room(s) for s in rollouts.state_n]
    for g in range(6):
        rows = np.flatnonzero(b.group == g)
        # anchor ids are equal exactly when the grid texts are (no collision, exact observation)
        same_text = np.array([[texts[i] == texts[j] for j in rows] for i in rows])
        np.testing.assert_array_equal(b.anchor[rows][:, None] == b.anchor[rows][None, :], same_text)
        assert all(rollouts.state_n[i] == rollouts.start_g[g] for i in rows[b.step[rows] == 0])
    for i in range(n):
        last = b.done[i]
        assert last == (i == n - 1 or b.step[i + 1] == 0)
        if not last:
            assert b.next_anchor[i] == b.anchor[i + 1]
            assert not (b.won[i] or b.terminated[i] or b.truncated[i])
        else:
            assert b.terminated[i] == b.won[i] == is_solved(step_room(rollouts.state_n[i],
                                                                      ACTIONS[rollouts.action_n[i]]).state)
            assert b.truncated[i] == (not b.won[i]) and (b.won[i] or b.step[i] == 14)
        assert b.reward[i] == 10.0 * b.won[i]
    assert b.valid.all() and (b.action >= 0).all()


def test_hash_collision_in_a_group_raises(monkeypatch):
    monkeypatch.setattr(ca, "hash_texts", lambda texts: np.zeros(len(texts), np.int32))
    with pytest.raises(ValueError, match="same id"):
        ca.collect_groups(ca.AnalysisConfig(epsilons=(0.5,), groups_per_epsilon=1))


def test_env_reward_rows_replay(env_rollouts):
    """reward="env": each row's reward is Sokoban's reward of replaying its action from its state."""
    b = host(env_rollouts.batch)
    for i, (s, a) in enumerate(zip(env_rollouts.state_n, env_rollouts.action_n, strict=True)):
        assert b.reward[i] == np.float32(step_room(s, ACTIONS[a]).reward)


def test_true_values_at_visits(rollouts):
    tv = ca.true_values(rollouts, horizon=15, discount=0.98)
    b = host(rollouts.batch)
    np.testing.assert_allclose(tv.q_n[b.won], 1.0)  # the solving move's Q is the success reward, undiscounted
    np.testing.assert_allclose(tv.adv_n, tv.q_n - tv.v_n)
    assert (tv.v_n >= 0).all() and (tv.v_n <= 1 + 1e-12).all()
    assert np.abs(tv.adv_n).max() > 0.05  # the policy's actions differ in value


def test_average_ranks_and_correlation_match_scipy():
    rng = np.random.default_rng(0)
    x = rng.integers(0, 5, 200).astype(float)  # many ties
    y = x + rng.normal(size=200)
    np.testing.assert_allclose(ca.average_ranks(x), stats.rankdata(x))
    p, s = ca.correlation(x, y)
    np.testing.assert_allclose(p, stats.pearsonr(x, y)[0], rtol=1e-10)
    np.testing.assert_allclose(s, stats.spearmanr(x, y)[0], rtol=1e-10)
    assert np.isnan(ca.correlation(np.full(5, 0.3), y[:5])).all()  # constant input: undefined, not 0
    with pytest.raises(ValueError, match="equal-length"):
        ca.correlation(x, y[:3])


class NumpyGroup:
    """One group's empirical process with explicit loops (states = anchor ids): the reference below."""

    def __init__(self, view, g, beta):
        v = host(view)
        self.length, self.success = v.length[g], v.success[g]
        self.visits = [(r, t) for r in range(v.mask.shape[1]) for t in range(self.length[r])]
        self.anchor = {(r, t): int(v.anchor[g, r, t]) for r, t in self.visits}
        self.action = {(r, t): int(v.action[g, r, t]) for r, t in self.visits}
        self.beta = beta

    def next(self, r, t):
        if t + 1 < self.length[r]:
            return self.anchor[(r, t + 1)]
        return "success" if self.success[r] else "failure"

    def of_state(self, s):
        return [m for m in self.visits if self.anchor[m] == s]

    def eligible(self, m):
        return len({self.action[x] for x in self.of_state(self.anchor[m])}) >= 2

    def values(self, depth):
        states = set(self.anchor.values())
        v = {s: np.mean([self.success[r] * self.beta ** (self.length[r] - t - 1) for r, t in self.of_state(s)])
             for s in states}
        for _ in range(depth):
            v = {s: np.mean([self.target(x, v) for x in self.of_state(s)]) for s in states}
        return v

    def target(self, m, v):
        """``1[s' = success] + β V(s')`` of one visit (V = 0 on the terminals)."""
        s_next = self.next(*m)
        return float(s_next == "success") + self.beta * v.get(s_next, 0.0)

    def coverage(self, m, depth):
        reached, frontier, k = {self.anchor[m]}, {self.anchor[m]}, 0
        while frontier and (depth is None or k < depth):
            frontier = {self.next(*x) for s in frontier for x in self.of_state(s)} - {"success", "failure"} - reached
            reached |= frontier
            k += 1
        return len({r for r, t in self.visits if self.anchor[(r, t)] in reached})


def test_coverage_matches_a_numpy_reference(rollouts):
    view = rollouts.view
    cov = ca.coverage_by_depth(view, [0, 1, None], rollouts.epsilon_g)
    r_len = view.mask.shape[1]
    eligible = np.asarray(batched_crbc(view).eligible)
    expected = {0: [], 1: [], None: []}
    for g in range(view.mask.shape[0]):
        ref = NumpyGroup(view, g, 0.98)
        for m in ref.visits:
            assert eligible[(g, *m)] == ref.eligible(m)
            if ref.eligible(m):
                for k in expected:
                    expected[k].append(ref.coverage(m, k))
    expected = {k: np.asarray(c) for k, c in expected.items()}
    for k, name in ((0, "0"), (1, "1"), (None, "inf")):
        c = cov["by_depth"][name]
        assert c["share_all"] == pytest.approx(np.mean(expected[k] == r_len))
        assert c["mean"] == pytest.approx(expected[k].mean())
        assert sum(c["hist"]) == pytest.approx(1.0)
    shares = [cov["by_depth"][k]["share_all"] for k in ("0", "1", "inf")]
    assert shares == sorted(shares) and cov["eligible_visits"] == eligible.sum()
    paired = np.asarray(cov["paired_k0_inf"])
    assert paired.sum() == pytest.approx(1.0) and np.allclose(np.tril(paired, -1), 0.0)  # coverage never shrinks
    assert cov["share_increased"] == pytest.approx(np.mean(expected[None] > expected[0]))


def test_depth_values_match_a_numpy_reference_and_proposition_1(rollouts):
    view = rollouts.view
    t_len = view.mask.shape[2]
    v_kgm = np.asarray(ca.depth_values(view, beta=0.98, max_depth=5))
    for g in (0, 4):
        ref = NumpyGroup(view, g, 0.98)
        for k in (0, 1, 5):
            v = ref.values(k)
            for r, t in ref.visits:
                np.testing.assert_allclose(v_kgm[k, g, r * t_len + t], v[ref.anchor[(r, t)]], atol=1e-6)
    tv = ca.true_values(rollouts, horizon=15, discount=0.98)
    out = ca.value_convergence(view, np.asarray(batched_crbc(view).v), tv.v_n, rollouts, beta=0.98, max_depth=40)
    assert out["bound_holds"]
    gaps = np.asarray(out["gap_mean"])
    assert np.all(np.diff(gaps) <= 1e-6)  # a β-contraction in the sup norm never grows the gap
    assert gaps[-1] < 0.5 * gaps[0] and gaps[-1] <= 0.98**40 * gaps[0] + 1e-6
    assert out["truth_error"][-1] == pytest.approx(out["truth_error_inf"], abs=0.02)


def test_accuracy_rows_perfect_and_constant_credit(rollouts):
    tv = ca.true_values(rollouts, horizon=15, discount=0.98)
    eligible_n = ca.to_rows(np.asarray(batched_crbc(rollouts.view).eligible), rollouts)
    credits = {"perfect": 3.0 * tv.adv_n + 1.0, "constant": np.zeros_like(tv.adv_n)}
    rows = ca.accuracy_rows(credits, tv.adv_n, rollouts, eligible_n, bootstrap=4)
    assert len(rows) == 2 * 2 * 3  # methods x visit subsets x (2 ε + pooled)
    for r in rows:
        if r["method"] == "perfect":
            assert r["pearson"] == pytest.approx(1.0) and r["spearman"] == pytest.approx(1.0)
            assert r["pearson_lo"] == pytest.approx(1.0)
        else:
            assert np.isnan(r["pearson"]) and np.isnan(r["spearman"])
    assert ca.ranking(rows, metric="pearson", methods=("constant", "perfect"))[0][0] == "perfect"
    n_all = {r["epsilon"]: r["n"] for r in rows if r["visits"] == "all" and r["method"] == "perfect"}
    assert n_all["all"] == n_all[0.3] + n_all[0.6] == len(tv.adv_n)


def test_method_credits_shapes_and_step_terms(rollouts):
    view = rollouts.view
    credits = ca.method_credits(view)
    assert set(ca.METHODS) <= set(credits) and not any(name.startswith("CRBC K=") for name in credits)
    mask = np.asarray(view.mask)
    for name, c in credits.items():
        assert c.shape == mask.shape and np.isfinite(c).all() and (c[~mask] == 0).all(), name
    crbc = batched_crbc(view)
    np.testing.assert_allclose(credits["CRBC"], np.asarray(crbc.trajectory)[..., None] * mask
                               + 5.0 * credits["CRBC step term"], atol=1e-5)


def test_config_from_env():
    assert ca.config_from_env({}) == ca.AnalysisConfig.full()
    small = ca.config_from_env({"AGENTJAX_NOTEBOOK_SMALL": "1"})
    assert small == ca.AnalysisConfig.small()
    env = {"AGENTJAX_NOTEBOOK_SMALL": "1", "CRBC_NB_EPSILONS": "0.1, 0.3", "CRBC_NB_GROUPS": "4",
           "CRBC_NB_REWARD": "env", "CRBC_NB_DEPTHS": "0,3", "CRBC_NB_OUT": "/tmp/x.json"}
    cfg = ca.config_from_env(env)
    assert (cfg.epsilons, cfg.groups_per_epsilon, cfg.reward, cfg.depths, cfg.out) == (
        (0.1, 0.3), 4, "env", (0, 3), "/tmp/x.json")
    assert cfg.bootstrap == small.bootstrap
    with pytest.raises(ValueError, match="CRBC_NB_GROUPS"):
        ca.config_from_env({"CRBC_NB_GROUPS": "many"})
    with pytest.raises(ValueError, match="CRBC_NB_EPSILONS"):
        ca.config_from_env({"CRBC_NB_EPSILONS": "0.1;0.2"})
    with pytest.raises(ValueError, match="AGENTJAX_NOTEBOOK_SMALL"):
        ca.config_from_env({"AGENTJAX_NOTEBOOK_SMALL": "yes"})
    with pytest.raises(ValueError, match=r"epsilons.*CRBC_NB_EPSILONS='1.5'"):
        ca.config_from_env({"CRBC_NB_EPSILONS": "1.5"})
    with pytest.raises(ValueError, match="reward"):
        ca.config_from_env({"CRBC_NB_REWARD": "shaped"})
    with pytest.raises(ValueError, match="depths"):
        ca.AnalysisConfig(depths=(-1,))


def test_choose_rooms_respects_the_minimum_solution_length():
    rooms = ca.choose_rooms(5, seed=3, min_solution_steps=6, horizon=15)
    assert len(set(rooms)) == 5
    tasks = SokobanEnv.tasks("train")
    env = SokobanEnv()
    for i in rooms:
        env.reset(tasks[i])
        assert 6 <= solution_length(env.state) <= 15
    with pytest.raises(ValueError, match="min_solution_steps"):
        ca.choose_rooms(1, seed=0, min_solution_steps=16, horizon=15)


def test_write_json_is_strict(tmp_path):
    path = tmp_path / "sub" / "r.json"
    ca.write_json(path, {"a": float("nan"), "b": [np.float32(1.5), np.int64(2)], "c": {1: (np.inf, 0.5)}})
    assert json.loads(path.read_text()) == {"a": None, "b": [1.5, 2], "c": {"1": [None, 0.5]}}
