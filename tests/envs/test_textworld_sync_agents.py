"""The released TextWorld-Sync engine with several agents, its planner and its verifier (envs/textworld_sync).

Agents follow the authors' coordinator (GitHub ``OliverLeeXZ/SERA``, ``composite_cooking.py``): a child starts where
the root stands (``fork_shared``), a counterfactual fork where the forking agent stands on a copy of the world
(``fork_counterfactual`` in ``textworld_continuous_policy/env.py``), every agent's step uses the one shared budget,
and steps are serialised (``asyncio.Lock`` there, a thread lock here: concurrent threads == the replay of the event
log). The planner solves released validation tasks of every family x difficulty within their own budget, alone, per
subtask, and as a team. The engine's single-agent rules are in test_textworld_sync.py."""

from __future__ import annotations

import random
import threading

import pytest

from envs.textworld_sync import (
    ROOT,
    TextWorldSyncEnv,
    Unknown,
    check,
    describe,
    goal_from_text,
    plan,
    replay,
    subgoals,
    verify,
    verify_goal,
)
from tests.envs.test_textworld_sync import TWO_DISHES, hand_task, recipe


@pytest.fixture(scope="module")
def sample():
    """Two validation tasks of every (difficulty, family) cell: the first 56 of the interleaved split."""
    tasks = TextWorldSyncEnv.tasks("validation")[:56]
    assert len({(t.meta["difficulty"], t.meta["family"]) for t in tasks}) == 28
    return tasks


def test_the_oracle_solves_every_family_and_difficulty(sample):
    for task in sample:
        env = TextWorldSyncEnv()
        obs, done, info = env.reset(task), False, {}
        while not done:
            command = env.oracle()
            assert command in obs.admissible, (task.task_id, command)
            obs, reward, done, info = env.step(command)
        assert info["won"] and reward == 1.0 and not info["truncated"], task.task_id
        assert env.world.read(lambda s: s.steps) <= task.meta["budget"]
        assert verify(env.world, {"kind": "task_success"})
        assert all(verify(env.world, g) for g in subgoals(env.world))


def test_the_oracle_within_the_training_budget():
    for task in TextWorldSyncEnv.tasks("train")[:21]:  # medium, hard and extreme of every family
        env = TextWorldSyncEnv(protocol="training")
        env.reset(task)
        commands = plan(env.world.snapshot(), ROOT)
        for command in commands:
            info = env.step(command)[3]
        assert info["won"] and len(commands) <= 100


def test_children_start_where_the_root_stands_and_keep_their_own_location():
    env = TextWorldSyncEnv()
    env.reset(hand_task(TWO_DISHES))
    env.step("move north")
    child = env.spawn("c1", "Fetch the salt.")
    assert child.location == "pantry" and child.observe().instruction == "Fetch the salt."
    child.step("go to garden")
    grandchild = child.spawn("c2")
    assert (child.location, grandchild.location, env.handle().location) == ("garden", "pantry", "pantry")
    assert child.observe().text.startswith("You are in the garden.\nVisible objects: banana")
    assert env.handle().observe().text.startswith("You are in the pantry.\nVisible objects: salt")
    assert [c for c, _ in child.history] == ["go to garden"] and [c for c, _ in env.handle().history] == ["move north"]
    with pytest.raises(ValueError, match="already exists"):
        env.spawn("c1")
    with pytest.raises(KeyError, match="no agent"):
        env.handle("c9")


def test_one_budget_for_every_agent():
    env = TextWorldSyncEnv(budget=4)
    env.reset(hand_task(TWO_DISHES))
    child = env.spawn("c1")
    assert child.step("take carrot")[3]["remaining_shared_steps"] == 3
    assert env.step("jump")[3]["remaining_shared_steps"] == 2
    child.step("inventory")  # a lookup: free
    assert child.step("slice carrot")[3]["remaining_shared_steps"] == 1
    obs, _, done, info = env.step("look around")
    assert done and info["truncated"] and child.step("look around")[2]
    assert env.world.read(lambda s: [(e.agent, e.action) for e in s.events]) == [
        ("c1", "take carrot"), (ROOT, "jump"), ("c1", "slice carrot"), (ROOT, "look around")]


def test_a_fork_is_an_independent_copy():
    env = TextWorldSyncEnv()
    env.reset(hand_task(TWO_DISHES))
    env.step("go to garden")
    fork = env.handle().fork("cf", "Grill the banana.")
    assert fork.location == "garden" and fork.world is not env.world
    fork.step("take banana")
    assert env.world.read(lambda s: (s.inventory, s.steps)) == ([], 1)
    assert fork.world.read(lambda s: (s.inventory, s.steps, sorted(s.locations))) == (["banana"], 2, ["cf", ROOT])


def test_concurrent_agents_are_serialised():
    """Threads stepping random commands: the world equals the serial replay of its event log, the budget is never
    exceeded, and every agent is told the world is done once it is spent."""
    task = hand_task(TWO_DISHES, cooldown=1, limit_inventory=1, budget=60)
    env = TextWorldSyncEnv()
    env.reset(task)
    initial = env.world.snapshot()
    handles = [env.handle()] + [env.spawn(f"c{i}") for i in range(3)]
    for h in handles[1:]:
        initial.locations[h.agent], initial.histories[h.agent] = "kitchen", []
    finished = []

    def run(handle, seed):
        rng, done = random.Random(seed), False
        while not done:
            obs = handle.observe()
            command = rng.choice([*obs.admissible, "jump", "inventory"])
            done = handle.step(command)[2] or handle.world.done
        finished.append(handle.agent)

    threads = [threading.Thread(target=run, args=(h, i)) for i, h in enumerate(handles)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    state = env.world.snapshot()
    assert sorted(finished) == sorted(h.agent for h in handles)
    assert state.steps == len(state.events) <= 60 and (state.steps == 60 or env.world.won)
    replayed = replay(initial, [(e.agent, e.action) for e in state.events])
    assert (replayed.items, replayed.inventory, replayed.counter, replayed.prepared, replayed.eaten,
            replayed.locations, replayed.cooldowns, replayed.events) == (
        state.items, state.inventory, state.counter, state.prepared, state.eaten, state.locations, state.cooldowns,
        state.events)


def test_a_team_of_subtask_oracles_solves_released_tasks(sample):
    """One child per dish, each following the planner for its own dish, taking turns (deterministic; threads are
    tested above); the root waits. The team shares one inventory, so a child may process another's item."""
    for task in sample:
        env = TextWorldSyncEnv()
        env.reset(task)
        team = [(env.spawn(f"c-{d}", f"Prepare and eat {d}."), d) for d in env.world.read(lambda s: s.dish_ids)]
        while not env.world.done:
            for child, dish in team:
                if not env.world.done and not verify(env.world, {"kind": "dish_complete", "dish": dish}):
                    command = child.oracle(dishes=[dish])
                    assert command in child.observe().admissible
                    child.step(command)
        assert env.world.won, task.task_id


def test_a_subtask_oracle_stays_on_its_subtask():
    env = TextWorldSyncEnv()
    env.reset(hand_task(TWO_DISHES))
    child = env.spawn("c1")
    goal = {"kind": "ingredient_ready", "ingredient": "banana"}
    while not verify(env.world, goal):
        child.step(child.oracle(ingredients=["banana"]))
    assert [c for c, _ in child.history] == ["go to garden", "take banana", "cook banana on grill"]
    assert env.world.read(lambda s: (s.counter, s.prepared)) == ({"banana"}, set())
    assert child.oracle(ingredients=["banana"]) == "look around"  # nothing left to do
    with pytest.raises(Unknown, match="dish_9"):
        child.oracle(dishes=["dish_9"])


def test_verifier_goals():
    env = TextWorldSyncEnv()
    env.reset(hand_task(TWO_DISHES))
    w = env.world
    ready = {"kind": "ingredient_ready", "ingredient": "carrot"}
    assert not verify(w, ready) and "not collected" in check(w, ready).reason
    env.step("take carrot")
    env.step("cook carrot in oven")
    assert verify(w, {"kind": "ingredient_collected", "ingredient": "carrot"})
    assert verify(w, {"kind": "ingredient_processed", "ingredient": "carrot", "how": "roast"})
    assert not verify(w, ready) and not verify(w, {"kind": "ingredient_processed", "ingredient": "carrot",
                                                       "how": "sliced"})
    env.step("slice carrot")
    for c in ("move north", "take salt", "prepare dish_1"):
        env.step(c)
    assert verify(w, ready) and verify(w, {"kind": "dish_prepared", "dish": "dish_1"})
    assert not verify(w, {"kind": "dish_complete", "dish": "dish_1"})
    env.step("eat dish_1")
    assert verify(w, {"kind": "all", "goals": [{"kind": "dish_eaten", "dish": "dish_1"},
                                               {"kind": "dish_complete", "dish": "dish_1"},
                                               {"kind": "not", "goal": {"kind": "task_success"}},
                                               {"kind": "at", "agent": ROOT, "room": "pantry"}, {"kind": "gate_open"}]})
    for bad, message in (({"kind": "dish_eaten", "dish": "dish_9"}, "unknown dish"),
                         ({"kind": "ingredient_ready"}, "needs the field 'ingredient'"),
                         ({"kind": "fly"}, "unknown goal kind"),
                         ({"kind": "ingredient_processed", "ingredient": "carrot", "how": "burnt"}, "preparation")):
        with pytest.raises(ValueError, match=message):
            check(w, bad)
    for goal in subgoals(w) + [{"kind": "gate_open"}, {"kind": "at", "agent": ROOT, "room": "garden"}]:
        assert describe(goal)


def test_goals_from_text():
    env = TextWorldSyncEnv()
    env.reset(hand_task(TWO_DISHES))
    s = env.world.snapshot()
    assert goal_from_text(s, "Take the carrot, roast and slice it.") == {"kind": "ingredient_ready",
                                                                         "ingredient": "carrot"}
    assert goal_from_text(s, "Prepare and eat dish_2.") == {"kind": "dish_eaten", "dish": "dish_2"}
    assert goal_from_text(s, "Prepare dish 1 once its ingredients are ready.") == {"kind": "dish_prepared",
                                                                                  "dish": "dish_1"}
    assert goal_from_text(s, "Collect the ingredients for dish_1.") == {"kind": "all", "goals": [
        {"kind": "ingredient_ready", "ingredient": "carrot"}, {"kind": "ingredient_ready", "ingredient": "salt"}]}
    assert goal_from_text(s, "Finish all dishes.") == {"kind": "task_success"}
    assert goal_from_text(s, "Explore the house.") is None
    assert not verify_goal("Explore the house.", env.world) and not verify_goal("Grill the banana.", env.world)
    env.step("go to garden")
    env.step("take banana")
    env.step("cook banana on grill")
    assert verify_goal("Grill the banana.", env.world) and verify_goal({"kind": "gate_open"}, s)


def test_hand_built_single_dish_plan():
    env = TextWorldSyncEnv()
    env.reset(hand_task({"dish_1": [recipe("red apple", "fried", "diced"), recipe("water", "raw", "uncut")]},
                        cooldown=1))
    assert plan(env.world.snapshot(), ROOT) == ["take red apple", "dice red apple", "cook red apple in stove",
                                                "take water", "prepare dish_1", "eat dish_1"]
