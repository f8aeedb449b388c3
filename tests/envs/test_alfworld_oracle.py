"""ALFWorld's oracles on the real engine: ``plan()`` equals ALFWorld's ``AlfredExpert(expert_type="planner")`` at
every step, the walkthrough and the planner oracle win every task type, the hand-coded expert wins the sample, the
planner wins from random states, and restore + oracle reproduces the uninterrupted episode.

Needs ``$ALFWORLD_DATA`` as test_alfworld.py does (a missing data folder fails, it does not skip)."""

from __future__ import annotations

import pickle
import random

import pytest

from envs.alfworld import TASK_TYPES, AlfWorldEnv, OracleError
from tests.envs.alfworld_common import link_games, play, random_prefix, slow_planner


@pytest.fixture(scope="module")
def env() -> AlfWorldEnv:
    return AlfWorldEnv()

@pytest.mark.slow  # end to end, minutes of CI time: `make test-slow` (README, "Tests")
def test_planner_matches_alfredexpert_planner(sample, tmp_path):
    """``plan()`` is what ALFWorld's ``AlfredExpert(expert_type="planner")`` wrapper reports at every step, and the
    text is the wrapper stack's (first three task types)."""
    import textworld
    from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredExpert, AlfredInfos

    rng = random.Random(4)
    ours = AlfWorldEnv()
    tasks = [sample[t][1] for t in TASK_TYPES[:3]]
    link_games(tmp_path, [t.task_id for t in tasks])
    for task in tasks:
        infos = textworld.EnvInfos(won=True, admissible_commands=True, extras=["gamefile", "expert_plan"])
        wrappers = [AlfredDemangler(shuffle=False), AlfredInfos, AlfredExpert(expert_type="planner")]
        official = textworld.start(str(tmp_path / task.task_id), request_infos=infos, wrappers=wrappers)
        state = official.reset()
        obs = ours.reset(task)
        for i in range(30):
            assert obs.text == state.feedback and ours.plan() == state["extra.expert_plan"], (task.task_id, i)
            command = rng.choice(obs.admissible) if i < 3 else ours.oracle()
            state, _, _ = official.step(command)
            obs, _, done, _ = ours.step(command)
            if done:
                break
        assert done and state["won"]


# -- walkthroughs and oracles ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("task_type", [  # two task types in make test, the other four in make test-slow (CI time)
    t if t in ("pick_and_place_simple", "look_at_obj_in_light") else pytest.param(t, marks=pytest.mark.slow)
    for t in TASK_TYPES])
def test_walkthrough_and_planner_oracle_win(task_type, sample, env):
    for task in sample[task_type]:
        obs = env.reset(task)
        assert obs.text.startswith("-= Welcome to TextWorld, ALFRED! =-\n\nYou are in the middle of a room.")
        assert obs.instruction.startswith("Your task is to: ") and obs.text.endswith("\n\n" + obs.instruction)
        assert obs.anchor == obs.text and "help" not in obs.admissible and {"look", "inventory"} <= {*obs.admissible}
        walkthrough = env.walkthrough()
        results = play(env, walkthrough)
        assert all(info["valid"] for *_, info in results)
        assert [done for _, _, done, _ in results] == [False] * (len(walkthrough) - 1) + [True]
        assert [r for _, r, _, _ in results][-1] == 10.0 and sum(r for _, r, _, _ in results) == 10.0
        assert results[-1][3] == {"won": True, "truncated": False, "valid": True}

        env.reset(task)
        while not env.done:
            _, reward, done, info = env.step(env.oracle())  # oracle() checks each command is admissible
        assert info["won"] and reward == 10.0 and env.steps <= len(walkthrough)
        with pytest.raises(RuntimeError, match="running episode"):
            env.oracle()


@pytest.mark.slow  # end to end, minutes of CI time: `make test-slow` (README, "Tests")
def test_handcoded_expert_wins_the_sample(sample):
    random.seed(0)  # ALFWorld's hand-coded expert picks a random command when stuck
    env = AlfWorldEnv(expert="handcoded")
    won = 0
    for task in [games[0] for games in sample.values()]:
        env.reset(task)
        assert env.oracle() == "look"  # AlfredExpert's first command
        try:
            while not env.done:
                _, _, _, info = env.step(env.oracle())
            won += info["won"]
        except OracleError as e:
            assert "not admissible" in str(e)
    assert won >= len(TASK_TYPES) - 1


@pytest.mark.slow  # end to end, minutes of CI time: `make test-slow` (README, "Tests")
def test_planner_oracle_wins_from_random_states(unseen, env):
    rng = random.Random(2)
    for task in rng.sample([t for t in unseen if not slow_planner(t)], 4):
        env.reset(task)
        random_prefix(env, rng, rng.randint(5, 20))
        while not env.done:
            _, _, _, info = env.step(env.oracle())
        assert info["won"] or info["truncated"]
        assert info["won"], f"{task.task_id}: the planner did not finish within {env.max_steps} steps"


@pytest.mark.slow  # end to end, minutes of CI time: `make test-slow` (README, "Tests")
def test_restore_then_oracle_reproduces_the_uninterrupted_episode(unseen, env):
    rng = random.Random(3)
    fresh = AlfWorldEnv()  # an isolated copy, as SERO restores roots
    for task in rng.sample([t for t in unseen if not slow_planner(t)], 3):
        obs = env.reset(task)
        root_step = rng.randint(0, 15)
        random_prefix(env, rng, root_step)
        snap = env.snapshot()
        assert snap.actions == env.actions and len(snap.actions) == env.steps == root_step
        uninterrupted = []
        while not env.done:
            obs, reward, done, info = env.step(env.oracle())
            uninterrupted.append((obs, reward, done, info))
        assert info["won"]

        restored = fresh.restore(pickle.loads(pickle.dumps(snap)))
        assert restored.text == snap.text and restored.admissible == snap.admissible
        assert (fresh.steps, fresh.done, fresh.task) == (root_step, False, task)
        replayed = []
        while not fresh.done:
            replayed.append(fresh.step(fresh.oracle()))
        assert replayed == uninterrupted
        assert fresh.steps == env.steps
