"""Credit-testbed MDPs: the exact solver (hand-checked case, Monte Carlo, brute force), the knobs, the text, the
environment protocol (invalid actions, snapshots, splits) and the oracle."""

from __future__ import annotations

import dataclasses
import itertools
import pickle

import numpy as np
import pytest

from envs.base import Task
from envs.mdp import (
    LABELS,
    MAX_ACTIONS,
    MDP,
    SPLITS,
    MDPConfig,
    MDPEnv,
    evaluate,
    generate_mdp,
    mdp_of,
    optimal,
    random_success,
    split_words,
    success_probability,
    uniform_policy,
    vocabulary,
)

# Every mechanism at once, with a cap that binds (loops): the setting the solver is checked on.
RICH = MDPConfig(depth=4, width=3, doomed=0.3, shortcut=2, slip=0.25, noise=0.1, dead_ends=0.1, loops=0.35, lock=1,
                 max_steps=7)
RICH_SEED = 7


def task(seed: int, **meta) -> Task:
    return Task(env="mdp", task_id=f"mdp-{seed}", split="train", seed=seed, meta=meta)


def skewed_policy(model: MDP, rng: np.random.Generator, concentration: float = 0.3) -> np.ndarray:
    """[S, A] a random policy far from uniform: Dirichlet(concentration) rows over the admissible actions."""
    pi = rng.dirichlet(np.full(MAX_ACTIONS, concentration), size=model.num_states) * model.mask_sa
    return np.where(model.mask_sa.any(1, keepdims=True), pi / np.maximum(pi.sum(1, keepdims=True), 1e-300), 0.0)


def monte_carlo(model: MDP, pi_hsa: np.ndarray, episodes: int, beta: float, rng: np.random.Generator):
    """Brute force: ``episodes`` sampled episodes of the capped MDP; per episode (won, β^(T−1)·won)."""
    state = np.full(episodes, model.start)
    alive, won, ret = np.ones(episodes, bool), np.zeros(episodes, bool), np.zeros(episodes)
    cum_pi, cum_p = np.cumsum(pi_hsa, -1), np.cumsum(model.p_sat, -1)
    for t in range(model.max_steps):
        idx = np.nonzero(alive)[0]
        s = state[idx]
        a = np.minimum((rng.random(len(idx))[:, None] >= cum_pi[model.max_steps - t, s]).sum(1),
                       model.num_actions_s[s] - 1)
        nxt = np.minimum((rng.random(len(idx))[:, None] >= cum_p[s, a]).sum(1), model.num_states - 1)
        state[idx] = nxt
        hit = model.goal_s[nxt]
        won[idx[hit]], ret[idx[hit]] = True, beta**t
        alive[idx[model.terminal_s[nxt]]] = False
    return won.astype(float), ret


def as_hsa(model: MDP, pi_sa: np.ndarray) -> np.ndarray:
    return np.broadcast_to(pi_sa, (model.max_steps + 1, *pi_sa.shape))


# -- the exact solver ------------------------------------------------------------------------------------------------
def hand_mdp(max_steps: int = 3) -> MDP:
    """start: "left" -> room (sure), "right" -> goal or pit (1/2 each); room: "on" -> goal 0.8, back to start 0.2."""
    p = np.zeros((4, MAX_ACTIONS, 4))
    p[0, 0, 1] = 1.0
    p[0, 1, 2] = p[0, 1, 3] = 0.5
    p[1, 0, 2], p[1, 0, 0] = 0.8, 0.2
    mask = np.zeros((4, MAX_ACTIONS), bool)
    mask[0, :2] = mask[1, 0] = True
    nxt = np.full((4, MAX_ACTIONS), -1)
    nxt[0, :2], nxt[1, 0] = (1, 2), 2
    return MDP(p_sat=p, mask_sa=mask, next_sa=nxt, goal_s=np.array([0, 0, 1, 0], bool),
               terminal_s=np.array([0, 0, 1, 1], bool), start=0, max_steps=max_steps,
               names=("room 1", "room 2", "goal", "pit"), labels=(("left", "right"), ("on",), (), ()))


def test_hand_built_mdp_values():
    model = hand_mdp()
    ev = evaluate(model, uniform_policy(model), beta=0.9)
    # By hand: V_1 = (.25, .8); Q_2(0) = (.9·.8, .5); V_2(1) = .8 + .2·.9·.25; Q_3(0, left) = .9·.845.
    np.testing.assert_allclose(ev.q_hsa[1, 0, :2], [0.0, 0.5])
    np.testing.assert_allclose(ev.v_hs[1, :2], [0.25, 0.8])
    np.testing.assert_allclose(ev.q_hsa[2, 0, :2], [0.72, 0.5])
    np.testing.assert_allclose(ev.v_hs[2, :2], [0.61, 0.845])
    np.testing.assert_allclose(ev.q_hsa[3, 0, :2], [0.7605, 0.5])
    assert ev.start_value == pytest.approx(0.63025)
    np.testing.assert_allclose(ev.success_hs[1:, 0], [0.25, 0.65, 0.675])
    np.testing.assert_allclose(ev.adv_hsa[3, 0, :2], [0.7605 - 0.63025, 0.5 - 0.63025])
    assert np.all(ev.v_hs[:, 2:] == 0) and np.all(ev.v_hs[0] == 0)


def test_hand_built_optimum_depends_on_steps_left():
    best = optimal(hand_mdp())
    np.testing.assert_allclose(best.success_hs[1:, 0], [0.5, 0.8, 0.9])
    np.testing.assert_allclose(best.success_hs[1:, 1], [0.8, 0.9, 0.96])
    assert best.action_hs[1, 0] == 1  # one step left: only the gamble can still win
    assert list(best.action_hs[2:, 0]) == [0, 0]


@pytest.mark.parametrize("policy", ["uniform", "skewed"])
def test_exact_values_match_monte_carlo(policy):
    model, rng = generate_mdp(RICH_SEED, RICH), np.random.default_rng(0)
    pi = uniform_policy(model) if policy == "uniform" else skewed_policy(model, rng)
    ev = evaluate(model, pi, beta=0.98)
    won, ret = monte_carlo(model, as_hsa(model, pi), 20_000, 0.98, rng)
    uncapped = success_probability(dataclasses.replace(model, max_steps=60), pi)
    assert uncapped - ev.start_success > 8 * won.std() / np.sqrt(len(won))  # the cap binds, and the test sees it
    for estimate, exact in ((won, ev.start_success), (ret, ev.start_value)):
        se = estimate.std() / np.sqrt(len(estimate))
        assert abs(estimate.mean() - exact) < 4 * se, (estimate.mean(), exact, se)


def test_env_episodes_match_the_exact_success_of_the_optimal_policy():
    """The environment samples the model: 3000 episodes of the (time-indexed) oracle against its exact success."""
    env = MDPEnv(RICH, sampling_seed=0)
    exact = optimal(mdp_of(task(RICH_SEED), RICH)).success_hs[RICH.step_cap, 0]
    wins = []
    for _ in range(3000):
        env.reset(task(RICH_SEED))
        done, info = False, {}
        while not done:
            _, reward, done, info = env.step(env.oracle())
        wins.append(float(info["won"]))
    se = np.std(wins) / np.sqrt(len(wins))
    assert 0.5 < exact < 1.0 and abs(np.mean(wins) - exact) < 4 * se


def test_q_and_advantage_are_consistent():
    model = generate_mdp(RICH_SEED, RICH)
    pi = skewed_policy(model, np.random.default_rng(1))
    ev = evaluate(model, pi)
    np.testing.assert_allclose((pi * ev.q_hsa).sum(-1), ev.v_hs, atol=1e-12)
    np.testing.assert_allclose((pi * ev.adv_hsa).sum(-1), 0.0, atol=1e-12)
    assert np.all(ev.q_hsa[:, ~model.mask_sa] == 0) and np.all(ev.adv_hsa[:, ~model.mask_sa] == 0)
    assert np.all((0 <= ev.v_hs) & (ev.v_hs <= ev.success_hs + 1e-12) & (ev.success_hs <= 1 + 1e-12))


def test_optimum_is_the_best_deterministic_policy_by_brute_force():
    """Acyclic model, cap that cannot bind: the optimum is the best of all deterministic stationary policies."""
    config = MDPConfig(depth=2, width=2, doomed=0.4, shortcut=1, slip=0.3, noise=0.2, dead_ends=0.2, lock=1,
                       max_actions=3)
    for seed in range(3):
        model = generate_mdp(seed, config)
        acting = np.nonzero(~model.terminal_s)[0]
        best = 0.0
        for choice in itertools.product(*(range(model.num_actions_s[s]) for s in acting)):
            pi = np.zeros(model.mask_sa.shape)
            pi[acting, choice] = 1.0
            best = max(best, success_probability(model, pi))
        assert optimal(model).success_hs[-1, model.start] == pytest.approx(best, abs=1e-12)


def test_oracle_policy_value_is_the_optimum_and_beats_random_policies():
    rng = np.random.default_rng(2)
    for seed in range(4):
        model = generate_mdp(seed, RICH)
        best = optimal(model)
        top = best.success_hs[-1, model.start]
        assert evaluate(model, best.pi_hsa).start_success == pytest.approx(top, abs=1e-12)
        assert evaluate(model, best.pi_hsa).start_value == pytest.approx(best.v_hs[-1, model.start], abs=1e-12)
        for _ in range(20):
            assert success_probability(model, skewed_policy(model, rng, 1.0)) <= top + 1e-12
        assert success_probability(model, uniform_policy(model)) < top


def test_bad_policies_raise():
    model = generate_mdp(0, RICH)
    with pytest.raises(ValueError, match="shape"):
        evaluate(model, np.ones((3, 4)))
    bad = uniform_policy(model).copy()
    bad[model.start] = [1.0, 0, 0, 0]
    bad[model.start, 0] = 0.5
    with pytest.raises(ValueError, match="distribution"):
        evaluate(model, bad)
    with pytest.raises(ValueError, match="beta"):
        evaluate(model, uniform_policy(model), beta=0.0)


# -- the knobs -------------------------------------------------------------------------------------------------------
def test_slip_lowers_the_shortest_path_and_not_the_safe_one():
    base = MDPConfig(depth=6, width=3, doomed=0.3, shortcut=2, lock=2)
    for seed in range(5):
        shortest = optimal(generate_mdp(seed, base))  # no slip: the oracle takes the ledge, the shortest path
        assert shortest.v_hs[-1, 0] == pytest.approx(0.98 ** (base.shortest_path - 1))
        previous = 1.0
        for slip in (0.1, 0.3, 0.5):
            model = generate_mdp(seed, dataclasses.replace(base, slip=slip))
            np.testing.assert_array_equal(model.next_sa, generate_mdp(seed, base).next_sa)  # same graph
            ledge = success_probability(model, shortest.pi_hsa)
            assert ledge == pytest.approx((1 - slip) ** base.shortcut) and ledge < previous
            assert optimal(model).success_hs[-1, 0] == pytest.approx(1.0)  # the longer safe route
            previous = ledge


def test_lock_divides_random_success_by_its_action_counts():
    for seed in range(5):
        open_ = random_success(MDPConfig(depth=4, dead_ends=0.2), [seed])[0]
        for k in (1, 3):
            model = generate_mdp(seed, MDPConfig(depth=4, dead_ends=0.2, lock=k))
            factor = np.prod(1.0 / model.num_actions_s[np.array(model.kind_s) == "lock"])
            assert random_success(model.config, [seed])[0] == pytest.approx(open_ * factor)
            assert factor <= 0.5**k


def test_dead_ends_make_the_pit():
    def pits(config):
        return [generate_mdp(seed, config).kind_s.count("pit") for seed in range(10)]

    assert pits(MDPConfig(depth=5, width=3)) == [0] * 10
    for seed in range(10):
        model = generate_mdp(seed, MDPConfig(depth=5, width=3, dead_ends=0.3))
        pit = model.kind_s.index("pit")
        assert model.terminal_s[pit] and not model.goal_s[pit] and not model.mask_sa[pit].any()
        rooms = np.array(model.kind_s) == "room"
        assert np.any(model.next_sa[rooms] == pit)


def test_loops_return_to_earlier_layers():
    def back_edges(config, seed):
        model = generate_mdp(seed, config)
        rooms = np.nonzero(np.array(model.kind_s) == "room")[0]
        return [(s, t) for s in rooms for t in model.next_sa[s] if t >= 0 and 0 <= model.layer_s[t] < model.layer_s[s]]

    assert all(not back_edges(MDPConfig(depth=5), seed) for seed in range(10))
    for seed in range(10):
        edges = back_edges(MDPConfig(depth=5, loops=0.3), seed)
        assert edges
        model = generate_mdp(seed, MDPConfig(depth=5, loops=0.3))
        assert all(model.kind_s[t] in ("start", "room") for _, t in edges)


def test_width_sets_how_paths_converge():
    for seed in range(5):
        narrow = generate_mdp(seed, MDPConfig(depth=4, width=2))
        rooms = np.array(narrow.kind_s) == "room"
        assert np.any(narrow.fan_in_s()[rooms] >= 2)
        assert np.all(np.bincount(narrow.layer_s[rooms])[1:] <= 2)
        tree = generate_mdp(seed, MDPConfig(depth=2, width=32, min_actions=2, max_actions=2))
        rooms = np.array(tree.kind_s) == "room"
        assert np.all(tree.fan_in_s()[rooms] == 1) and rooms.sum() == 2 + 4  # every path apart
        assert tree.fan_in_s()[tree.goal_s][0] == 4  # until they meet at the goal


def test_doomed_rooms_cannot_reach_the_goal_and_fail_late():
    config = MDPConfig(depth=6, width=4, doomed=0.25, loops=0.2)
    late = 0
    for seed in range(10):
        model = generate_mdp(seed, config)
        top = optimal(model).success_hs[-1]
        acting = ~model.terminal_s
        np.testing.assert_array_equal(model.doomed_s[acting], top[acting] == 0)
        assert model.doomed_s.sum() >= config.depth - 1
        assert np.all(top[acting & ~model.doomed_s] == pytest.approx(1.0))
        late += sum(model.doomed_s[t] for s in np.nonzero(model.doomed_s)[0] for t in model.next_sa[s] if t >= 0)
    assert late > 0  # a doomed room leads on to doomed rooms: the failure comes later
    assert not generate_mdp(0, MDPConfig(depth=6, width=4)).doomed_s.any()


def test_depth_is_the_length_of_the_safe_path():
    for depth in (3, 7):
        config = MDPConfig(depth=depth, width=3, dead_ends=0.2, loops=0.2, lock=2)
        env = MDPEnv(config)
        env.reset(task(0))
        done, steps = False, 0
        while not done:
            _, reward, done, info = env.step(env.oracle())
            steps += 1
        assert info["won"] and reward == 1.0 and steps == config.safe_path == depth + 3


def test_generation_is_deterministic_per_seed():
    a, b, c = generate_mdp(3, RICH), generate_mdp(3, RICH), generate_mdp(4, RICH)
    for field in ("p_sat", "mask_sa", "next_sa", "goal_s", "terminal_s", "layer_s", "doomed_s"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field))
    assert a.names == b.names and a.labels == b.labels and a.kind_s == b.kind_s
    assert a.labels != c.labels or a.p_sat.shape != c.p_sat.shape or not np.array_equal(a.p_sat, c.p_sat)


@pytest.mark.parametrize(("knobs", "message"), [
    (dict(depth=0), "depth must lie in 1..64"),
    (dict(width=0), "width"),
    (dict(depth=2.5), "depth must be an int"),
    (dict(shortcut=6), "shortcut must lie in 0..5"),
    (dict(slip=0.2), "slip .* ledge"),
    (dict(shortcut=2, slip=1.0), r"slip must lie in \[0, 1\)"),
    (dict(noise=-0.1), "noise"),
    (dict(dead_ends=0.6, loops=0.5), "dead_ends \\+ loops"),
    (dict(doomed=True), "doomed must be a number"),
    (dict(lock=-1), "lock"),
    (dict(min_actions=1), "min_actions"),
    (dict(min_actions=3, max_actions=2), "max_actions"),
    (dict(max_actions=5), "max_actions"),
    (dict(max_steps=5), "below the shortest path"),
])
def test_bad_knobs_raise_clear_errors(knobs, message):
    with pytest.raises(ValueError, match=message):
        MDPConfig(**knobs)


# -- text --------------------------------------------------------------------------------------------------------------
def test_observations_use_the_small_vocabulary():
    words = set(vocabulary())
    assert 30 <= len(words) <= 60 and {"room", "goal", "pit", "exits", ".", ",", ":", "7"} <= words
    env = MDPEnv(RICH)
    obs = env.reset(task(0))
    texts = [obs.instruction, *LABELS]
    for seed in range(5):
        model = generate_mdp(seed, RICH)
        texts += [model.text(s) for s in range(model.num_states)]
    for text in texts:
        assert set(split_words(text)) <= words, text
        assert "".join(split_words(text)) == text.replace(" ", ""), text  # nothing but spaces is dropped
    assert obs.text == obs.anchor == "{}. exits: {}".format(env.model.names[0], ", ".join(obs.admissible))


def test_labels_are_shuffled_per_state():
    orders, correct = [], []
    for seed in range(10):
        model = generate_mdp(seed, MDPConfig(depth=6, width=3, lock=3))
        orders += [model.labels[s] for s in range(model.num_states) if model.num_actions_s[s] == 3]
        locks = np.nonzero(np.array(model.kind_s) == "lock")[0]
        correct += [model.labels[s][int(np.argmax(model.next_sa[s] != model.kind_s.index("pit")))] for s in locks]
        assert all(len(set(labels)) == len(labels) for labels in model.labels)
    assert len(orders) > 30 and len(set(orders)) > 0.8 * len(orders)
    assert len(set(correct)) > 8  # the right lock action is a different label from lock to lock


# -- the environment ---------------------------------------------------------------------------------------------------
def test_reset_step_and_invalid_actions():
    env = MDPEnv(MDPConfig(depth=3, width=2, lock=1))
    obs = env.reset(task(5))
    model = env.model
    assert obs.admissible == model.labels[model.start] and env.max_steps == model.max_steps == 10
    for bad in ("jump", "", obs.admissible[0] + " now"):
        again, reward, done, info = env.step(bad)
        assert again == obs and reward == 0.0 and not done
        assert info == {"won": False, "truncated": False, "valid": False, "state_id": model.start, "slipped": False,
                        "dead_end": False}
    assert env.steps == 3 and env.state == model.start
    label = obs.admissible[1]
    _, _, _, info = env.step("  " + label.upper().replace(" ", "   ") + " ")
    assert info["valid"] and info["state_id"] == model.next_sa[model.start, 1] and not info["slipped"]


def test_the_step_cap_truncates():
    config = MDPConfig(depth=3, width=2, max_steps=4)
    env = MDPEnv(config)
    env.reset(task(0))
    results = [env.step("nowhere") for _ in range(4)]
    assert [r[2] for r in results] == [False, False, False, True]
    assert results[-1][3]["truncated"] and not results[-1][3]["won"]
    with pytest.raises(RuntimeError, match="ended"):
        env.step("nowhere")


def test_the_pit_ends_the_episode():
    env = MDPEnv(MDPConfig(depth=2, width=2, lock=2))
    obs = env.reset(task(1))
    while env.model.kind_s[env.state] != "lock":
        obs, *_ = env.step(env.oracle())
    wrong = next(a for a in range(len(obs.admissible)) if env.model.kind_s[env.model.next_sa[env.state, a]] == "pit")
    obs, reward, done, info = env.step(obs.admissible[wrong])
    assert done and reward == 0.0 and info["dead_end"] and not info["won"] and obs.text == "pit." and not obs.admissible
    with pytest.raises(RuntimeError, match="ended"):
        env.oracle()


def test_snapshot_restore_gives_identical_futures():
    config = dataclasses.replace(RICH, noise=0.5, max_steps=30)
    env = MDPEnv(config, sampling_seed=3)
    env.reset(task(2))
    for _ in range(2):
        env.step(env.oracle())
    snap = pickle.loads(pickle.dumps(env.snapshot()))
    picks = np.random.default_rng(0).integers(0, 12, size=12)

    def future(e: MDPEnv) -> list:
        out = []
        for pick in picks:
            if e.done:
                break
            labels = e.model.labels[e.state]
            out.append(e.step(labels[pick % len(labels)]))
        return out

    first = future(env)
    other = MDPEnv(config, sampling_seed=99)
    other.restore(snap)
    assert future(other) == first and len(first) >= 2
    env.restore(snap)
    assert future(env) == first
    with pytest.raises(ValueError, match="sokoban"):
        env.restore(snap._replace(task=Task(env="sokoban", task_id="x", split="train")))


def test_slips_are_independent_across_environments_and_reproducible_with_a_sample_seed():
    config = MDPConfig(depth=3, width=3, noise=0.5, max_steps=40, loops=0.5)

    def trajectory(env, t):
        env.reset(t)
        states = []
        while not env.done:
            states.append(env.step(env.model.labels[env.state][0])[3]["state_id"])
        return states

    a, b = MDPEnv(config, sampling_seed=1), MDPEnv(config, sampling_seed=2)
    runs = [trajectory(e, task(0)) for e in (a, b) for _ in range(3)]
    assert len({tuple(r) for r in runs}) > 1
    assert trajectory(a, task(0, sample_seed=7)) == trajectory(b, task(0, sample_seed=7))


def test_task_manifests():
    for split, seeds in SPLITS.items():
        tasks = MDPEnv.tasks(split)
        assert [t.seed for t in tasks] == list(seeds) and tasks[0].task_id == f"mdp-{seeds[0]}"
        assert all(t.env == "mdp" and t.split == split for t in tasks[:5])
    assert not set(SPLITS["train"]) & set(SPLITS["test"])
    with pytest.raises(ValueError, match="unknown mdp split"):
        MDPEnv.tasks("dev")
    with pytest.raises(ValueError, match="sokoban"):
        MDPEnv().reset(Task(env="sokoban", task_id="x", split="train"))


def test_random_success_helper_matches_evaluate():
    config = MDPConfig(depth=5, width=3, dead_ends=0.2, lock=2)
    values = random_success(config, range(4))
    for seed, value in enumerate(values):
        model = generate_mdp(seed, config)
        assert value == pytest.approx(evaluate(model, uniform_policy(model)).start_success)
    assert values.shape == (4,) and np.all((0 < values) & (values < 0.25))
