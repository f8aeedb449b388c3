"""The released TextWorld-Sync engine (envs/textworld_sync): hand-checked cases against the authors' engine as read
in GitHub ``OliverLeeXZ/SERA`` (``Runtime/environments/textworld/composite_cooking.py``: ``_valid_actions``,
``_step_locked``, ``_apply``, ``_set_preparation``, ``_consume_tool`` / ``_advance_tool_cooldowns``, ``_observation``,
``_infos``; ``composite_scorer.py``: ``score_task``; the runtime's inventory lookup in
``Training/runtime/textworld_continuous_policy/env.py``), the Env protocol (reset / step / lookups / budgets /
snapshot and restore), and the released files (splits, counts, the evaluator manifests, a missing data folder).
Agents, the planner on released tasks and the verifier: test_textworld_sync_agents.py. Needs $AGENTJAX_DATA (or
../shared/data) for the data tests."""

from __future__ import annotations

import collections
import json
import pickle

import pytest

from envs.base import Task
from envs.textworld_sync import ROOT, TextWorldSyncEnv, World, build, score_task, valid_actions
from envs.textworld_sync import tasks as tasks_module


def recipe(name, *prep, source="kitchen.fridge"):
    return {"name": name, "preparation": list(prep), "candidate_source_locations": [source]}


def hand_task(dishes, *, locations=5, doors=0, limit_inventory=0, capacity=None, cooldown=0, gated=(), budget=50):
    parallelism = {"mechanisms": {"tool_cooldown_steps": cooldown}, "resource_capacity": capacity,
                   "dependencies": [{"from": "gate_1", "to": d, "type": "door"} for d in gated],
                   "shared_environment_max_steps": budget}
    meta = {"dishes": [{"dish_id": d, "recipe": r} for d, r in dishes.items()], "parallelism": parallelism,
            "game_params": {"numLocations": locations, "includeDoors": doors, "limitInventorySize": limit_inventory,
                            "numDistractorItems": 2}, "budget": budget, "description": "Cook by hand."}
    return Task("textworld_sync", "hand", "test", 0, meta)


TWO_DISHES = {"dish_1": [recipe("carrot", "roasted", "sliced"), recipe("salt", "raw", "uncut", source="pantry.shelf")],
              "dish_2": [recipe("banana", "grilled", "uncut", source="garden")]}


def world(task, budget=None):
    w = World(build(task.meta, budget or task.meta["budget"]))
    w.add_agent(ROOT)
    return w


def steps(w, *commands, agent=ROOT):
    return [w.step(agent, c) for c in commands]


# -- the engine, hand-checked ------------------------------------------------------------------------------------------
def test_reset_observation_and_valid_actions():
    """``_valid_actions`` and ``_observation`` at reset: 5 locations (no dining room, so no ``move south``), the
    carrot in the kitchen (fridge), the salt in the pantry, the banana in the garden."""
    text, info = world(hand_task(TWO_DISHES)).observe(ROOT)
    assert info["validActions"] == ["look around", "inventory", "read cookbook", "go to pantry", "go to garden",
                                    "go to supermarket", "go to hallway", "move north", "move east", "move west",
                                    "take knife", "take carrot"]
    assert text == ("You are in the kitchen.\nVisible objects: carrot\nShared kitchen gate: open.\n"
                    "Shared tool cooldowns: none.\nShared prepared counter: (empty)\nDish progress:\n"
                    "- dish_1: 0/2 ingredients prepared, meal_prepared=False, meal_eaten=False\n"
                    "- dish_2: 0/1 ingredients prepared, meal_prepared=False, meal_eaten=False\n"
                    "Shared steps remaining: 50\nValid Actions are listed below.")
    assert {k: info[k] for k in ("inventory", "score", "tasksuccess", "taskfailure", "done", "steps",
                                 "remaining_shared_steps", "agent_location", "completed_dishes", "total_dishes")} == {
        "inventory": "(empty)", "score": 0.0, "tasksuccess": False, "taskfailure": False, "done": False, "steps": 0,
        "remaining_shared_steps": 50, "agent_location": "kitchen", "completed_dishes": 0, "total_dishes": 2}


def test_a_whole_episode_by_hand():
    """``_apply`` / ``_set_preparation`` / ``_mark_ready``: a taken item waits in the inventory until its preparation
    equals the recipe's, then moves to the counter; raw-uncut items go there at once; reward 1 on the last step."""
    w = world(hand_task(TWO_DISHES))
    r = steps(w, "take carrot")[0]
    assert r.infos["inventory"] == "carrot" and "Visible objects: (none)" in r.observation
    assert r.infos["validActions"][-3:] == ["take knife", "slice carrot", "cook carrot in oven"]
    r = steps(w, "cook carrot in oven")[0]
    assert w.read(lambda s: s.items["carrot"].actual) == {"roasted"} and r.infos["validActions"][-1] == "slice carrot"
    r = steps(w, "slice carrot")[0]
    assert r.infos["inventory"] == "(empty)" and "Shared prepared counter: carrot\n" in r.observation
    assert "- dish_1: 1/2 ingredients prepared" in r.observation
    r = steps(w, "move north", "take salt")[-1]
    assert r.infos["agent_location"] == "pantry" and r.infos["inventory"] == "(empty)"
    assert "Shared prepared counter: carrot, salt\n" in r.observation
    assert r.infos["validActions"][-1] == "prepare dish_1"
    r = steps(w, "prepare dish_1", "eat dish_1")[-1]
    assert "- dish_1: 2/2 ingredients prepared, meal_prepared=True, meal_eaten=True" in r.observation
    assert (r.infos["score"], r.infos["completed_dishes"], r.reward, r.done) == (0.0, 1, 0.0, False)  # binary score
    results = steps(w, "go to garden", "take banana", "cook banana on grill", "prepare dish_2", "eat dish_2")
    assert [x.reward for x in results] == [0, 0, 0, 0, 1.0] and results[-1].done
    assert results[-1].infos["tasksuccess"] and results[-1].infos["score"] == 1.0
    assert results[-1].infos["remaining_shared_steps"] == 50 - 12 and w.won


def test_acceptance_and_that_every_command_uses_a_step():
    """``_step_locked``: accepted = a valid action exactly (stripped), or a look / inventory command in any case;
    rejected commands change nothing but still use a shared step and are logged with the engine's error."""
    w = world(hand_task(TWO_DISHES, budget=10))
    before = w.snapshot().items["carrot"]
    results = steps(w, "jump", "TAKE CARROT", "take  carrot", "place carrot on counter", "Look Around",
                    "  take carrot ", "View   Inventory", "take knife", "read cookbook")
    assert [r.accepted for r in results] == [False, False, False, False, True, True, True, True, True]
    assert before.collected is False and w.read(lambda s: (s.inventory, s.steps)) == (["carrot"], 9)
    events = w.read(lambda s: s.events)
    assert events[0].error == "Action is not valid in the current composite world state." and events[4].error is None
    assert [e.sequence for e in events] == list(range(1, 10)) and events[5].action == "take carrot"


def test_tool_cooldown_is_shared_and_lasts_one_step():
    """``_consume_tool`` sets c + 1, ``_advance_tool_cooldowns`` takes one off after every step (any agent's)."""
    dishes = {"dish_1": [recipe("carrot", "raw", "sliced"), recipe("red apple", "raw", "diced"),
                         recipe("red potato", "fried", "uncut")]}
    w = world(hand_task(dishes, cooldown=1))
    w.add_agent("child")
    r = steps(w, "take carrot", "take red apple", "take red potato", "slice carrot")[-1]
    assert "Shared tool cooldowns: knife:1." in r.observation
    assert "dice red apple" not in r.infos["validActions"] and "cook red potato in stove" in r.infos["validActions"]
    r = w.step("child", "cook red potato in stove")  # another agent's step ends the knife's cooldown
    assert "Shared tool cooldowns: stove:1." in r.observation and "dice red apple" in r.infos["validActions"]
    assert "cook red potato in stove" not in r.infos["validActions"]
    assert w.read(lambda s: (s.counter, s.items["red potato"].actual)) == ({"carrot", "red potato"},
                                                                           {"fried", "uncut"})


def test_inventory_capacity():
    """``limitInventorySize`` is read as a capacity (the flag 1 holds one item); ``resource_capacity.inventory``
    replaces it; while full, no take at all is listed (raw items included)."""
    dishes = {"dish_1": [recipe("carrot", "raw", "sliced"), recipe("water", "raw", "uncut")]}
    w = world(hand_task(dishes, limit_inventory=1))
    r = steps(w, "take carrot")[0]
    assert not any(a.startswith("take ") and a != "take knife" for a in r.infos["validActions"])
    assert not steps(w, "take water")[0].accepted
    assert "take water" in steps(w, "slice carrot")[0].infos["validActions"]
    assert build(hand_task(dishes, limit_inventory=1, capacity={"inventory": 2}).meta, 9).capacity == 2
    assert build(hand_task(dishes, capacity={"knife": 1, "stove": 1}).meta, 9).capacity == 0  # only inventory counts


def test_the_gate_hides_the_gated_dishes():
    """``includeDoors`` closes the gate; ``gate_1`` edges name the dishes whose ingredients it hides."""
    w = world(hand_task(TWO_DISHES, doors=1, gated=("dish_2",)))
    r = steps(w, "go to garden")[0]
    assert "Visible objects: (none)" in r.observation and "Shared kitchen gate: closed." in r.observation
    assert "open door" in r.infos["validActions"] and "take banana" not in r.infos["validActions"]
    r = steps(w, "open door")[0]
    assert "Visible objects: banana" in r.observation and "take banana" in r.infos["validActions"]
    assert "open door" not in r.infos["validActions"]
    assert build(hand_task(TWO_DISHES, gated=("dish_2",)).meta, 9).gate_open  # no doors: open


def test_rooms_and_moves():
    assert world(hand_task(TWO_DISHES, locations=2)).read(lambda s: s.rooms) == (
        "kitchen", "pantry", "garden", "supermarket")  # at least 4
    w = world(hand_task(TWO_DISHES, locations=11))
    assert w.read(lambda s: len(s.rooms)) == 11
    r = steps(w, "move south", "go to attic", "go to nowhere")
    assert [x.infos["agent_location"] for x in r] == ["dining room", "attic", "attic"] and not r[2].accepted
    assert "move south" in r[1].infos["validActions"] and "take knife" not in r[1].infos["validActions"]


def test_scorer_cases():
    """``score_task``: complete = collected, not deleted, preparation equal; a preparation outside the recipe or a
    deleted ingredient is a failure; an empty recipe preparation never matches the engine's {raw, uncut}."""
    dishes = [{"dish_id": "d", "recipe": [recipe("x", "roasted", "sliced"), recipe("y", "raw", "uncut")]}]

    def tree(x, y, prepared=True, eaten=True):
        return {"dishes": {"d": {"ingredients": {"x": x, "y": y}, "meal_prepared": prepared, "meal_eaten": eaten}}}

    done = {"collected": True, "deleted": False, "preparation": ["roasted", "sliced"]}
    raw = {"collected": True, "deleted": False, "preparation": ["raw", "uncut"]}
    assert score_task(dishes, tree(done, raw))["task_success"]
    assert not score_task(dishes, tree(done, raw, eaten=False))["task_success"]
    half = score_task(dishes, tree({**done, "preparation": ["roasted"]}, raw))
    assert (half["task_success"], half["task_failure"], half["dish_results"][0]["completed_ingredients"]) == (
        False, False, 1)
    assert score_task(dishes, tree({**done, "preparation": ["fried", "sliced"]}, raw))["task_failure"]
    assert score_task(dishes, tree(done, {**raw, "deleted": True}))["task_failure"]
    assert score_task([], {})["score"] == 0.0
    w = world(hand_task({"dish_1": [recipe("flour")]}))  # preparation []: ready at once, never complete
    r = steps(w, "take flour", "prepare dish_1", "eat dish_1")[-1]
    assert r.accepted and r.infos["completed_dishes"] == 0 and not r.done


def test_the_shared_budget_ends_the_world():
    w = world(hand_task(TWO_DISHES, budget=3))
    r = steps(w, "jump", "take carrot", "look around")
    assert [x.done for x in r] == [False, False, True] and r[-1].infos["remaining_shared_steps"] == 0
    late = w.step(ROOT, "slice carrot")  # ignored once done (a deviation: the engine applies it past the budget)
    assert late.done and not late.accepted and w.read(lambda s: (s.steps, len(s.events), s.counter)) == (3, 3, set())


# -- the Env -----------------------------------------------------------------------------------------------------------
def test_env_reset_step_and_anchor():
    env = TextWorldSyncEnv()
    obs = env.reset(hand_task(TWO_DISHES))
    assert obs.text.startswith("You are in the kitchen.") and obs.instruction == "Cook by hand."
    assert obs.admissible[-1] == "take carrot" and "Shared steps remaining" not in obs.anchor
    assert obs.anchor.endswith("Valid Actions are listed below.\nInventory: (empty)")
    obs2, reward, done, info = env.step("take carrot")
    assert obs2.anchor.endswith("Inventory: carrot") and (reward, done) == (0.0, False)
    assert {k: info[k] for k in ("won", "valid", "truncated", "score", "completed_dishes", "total_dishes",
                                 "remaining_shared_steps", "lookup")} == {
        "won": False, "valid": True, "truncated": False, "score": 0.0, "completed_dishes": 0, "total_dishes": 2,
        "remaining_shared_steps": 49, "lookup": False}
    assert not env.step("jump")[3]["valid"] and env.world.budget_left == 48
    assert TextWorldSyncEnv(admissible=False).reset(hand_task(TWO_DISHES)).admissible is None
    with pytest.raises(ValueError, match="dishes"):
        env.reset(Task("textworld_sync", "bad", "test", 0, {}))


def test_inventory_lookups_take_no_world_step():
    """The runtime's lookup: no world step, the evaluator's text (or the training runtime's); the turn counts."""
    env = TextWorldSyncEnv()
    env.reset(hand_task(TWO_DISHES))
    env.step("take carrot")
    obs, _, _, info = env.step("Check Inventory")
    assert obs.text.startswith("[Inventory Lookup]\nCurrent shared inventory (visible to all Agents):\ncarrot\n\n"
                               "Current environment observation:\nYou are in the kitchen.\n")
    assert info["lookup"] and info["valid"] and env.world.budget_left == 49 and env.steps == 2
    assert env.world.read(lambda s: s.histories[ROOT][-1][0]) == "Check Inventory"
    training = TextWorldSyncEnv(protocol="training")
    training.reset(hand_task(TWO_DISHES))
    assert training.step("inventory")[0].text.startswith("[Inventory Lookup]\nCurrent shared inventory:\n(empty)\n")


def test_budgets_and_truncation():
    task = hand_task(TWO_DISHES, budget=77)
    assert [TextWorldSyncEnv(**kw).shared_budget(task) for kw in ({}, {"protocol": "training"}, {"budget": 5})] == [
        77, 100, 5]
    env = TextWorldSyncEnv(budget=2)
    env.reset(task)
    assert env.step("take carrot")[2] is False
    _, _, done, info = env.step("inventory")  # a lookup uses no world step
    assert not done and env.world.budget_left == 1
    _, _, done, info = env.step("look around")
    assert done and info["truncated"] and not info["won"] and env.done
    env = TextWorldSyncEnv(max_steps=2)  # the root's own turn cap
    env.reset(task)
    env.step("inventory")
    assert env.step("inventory")[3]["truncated"] and env.world.budget_left == 77
    with pytest.raises(ValueError, match="protocol"):
        TextWorldSyncEnv(protocol="paper")


def test_snapshot_restore_round_trip():
    env = TextWorldSyncEnv()
    env.reset(hand_task(TWO_DISHES, cooldown=1))
    for c in ("take carrot", "slice carrot", "inventory"):
        env.step(c)
    snap = env.snapshot()
    obs_a = [env.step(c) for c in ("cook carrot in oven", "move north", "take salt")]
    state_a = env.world.snapshot()
    assert snap.state.steps == 2 and snap.steps == 3  # the snapshot did not move with the env
    for copy_of in (snap, pickle.loads(pickle.dumps(snap))):
        obs = env.restore(copy_of)
        assert obs.text == snap.text and env.steps == 3 and env.world.read(lambda s: s.cooldowns) == {"knife": 1}
        assert [env.step(c) for c in ("cook carrot in oven", "move north", "take salt")] == obs_a
        assert env.world.snapshot() == state_a
    with pytest.raises(ValueError, match="SyncSnapshot"):
        env.restore("nope")


# -- the released files ------------------------------------------------------------------------------------------------
def test_splits_counts_and_order():
    counts = {s: collections.Counter((t.meta["family"], t.meta["difficulty"]) for t in TextWorldSyncEnv.tasks(s))
              for s in ("train", "validation", "test")}
    assert {s: sum(c.values()) for s, c in counts.items()} == {"train": 1500, "validation": 200, "test": 1400}
    assert set(counts["test"].values()) == {50} and len(counts["test"]) == 28
    assert counts["validation"][("multi_dish_fork_join", "easy")] == 8
    assert counts["validation"][("conflict", "hard")] == 7
    assert counts["train"][("critical_path", "medium")] == 129 and not any(d == "easy" for _, d in counts["train"])
    first = TextWorldSyncEnv.tasks("validation")[:28]
    assert len({(t.meta["family"], t.meta["difficulty"]) for t in first}) == 28  # interleaved cells
    task = next(t for t in TextWorldSyncEnv.tasks("validation") if t.task_id.endswith("fork_join_easy_0000"))
    assert (task.seed, task.split, task.meta["budget"], task.meta["view"]) == (860000, "validation", 123, "structured")
    assert task.meta["game_params"]["numLocations"] == 6 and task.meta["description"].startswith("Prepare and eat 2")
    with pytest.raises(ValueError, match="split"):
        TextWorldSyncEnv.tasks("valid")


@pytest.mark.parametrize("split", ["validation", "test"])
def test_the_evaluator_manifest_holds_the_same_tasks(split):
    """SERA's evaluator reads the manifest (game_params a JSON string, dishes and parallelism under
    generation_properties); every field the engine reads equals the JSONL row's."""
    rows = {r["task_id"]: r for r in tasks_module.rows(split)}
    manifest = tasks_module.manifest_tasks(split)
    assert [m["task_id"] for m in manifest] == list(rows)
    for m in manifest:
        row, props = rows[m["task_id"]], m["generation_properties"]
        assert json.loads(m["game_params"]) == row["game_params"] and m["seed"] == row["seed"]
        assert (m["task_description"], m["difficulty"]) == (row["task_description"], row["difficulty"])
        assert (props["dishes"], props["parallelism"], props["task_family"]) == (
            row["dishes"], row["parallelism"], row["task_family"])


@pytest.fixture
def fresh_cache():
    tasks_module.rows.cache_clear()
    tasks_module._tasks.cache_clear()
    yield
    tasks_module.rows.cache_clear()
    tasks_module._tasks.cache_clear()


def test_a_missing_data_folder_names_the_variable(monkeypatch, tmp_path, fresh_cache):
    import envs.base

    monkeypatch.delenv("AGENTJAX_DATA", raising=False)
    monkeypatch.setattr(envs.base, "default_data_dir", lambda: None)  # no ../shared/data either
    with pytest.raises(FileNotFoundError, match="AGENTJAX_DATA"):
        TextWorldSyncEnv.tasks("validation")
    monkeypatch.setenv("AGENTJAX_DATA", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="AGENTJAX_DATA=.*textworld_sync"):
        TextWorldSyncEnv.tasks("test")
    (tmp_path / "textworld_sync").mkdir()
    with pytest.raises(FileNotFoundError, match="textworld_test.jsonl.xz is missing"):
        TextWorldSyncEnv.tasks("test")


def test_every_released_task_builds(fresh_cache):
    for split in ("validation", "test"):
        for task in TextWorldSyncEnv.tasks(split):
            s = build(task.meta, task.meta["budget"])
            s.locations[ROOT] = "kitchen"
            assert valid_actions(s, ROOT)[:3] == ["look around", "inventory", "read cookbook"]
            assert set(s.items) == {r["name"] for d in task.meta["dishes"] for r in d["recipe"]}
