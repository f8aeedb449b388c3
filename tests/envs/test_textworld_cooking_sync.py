"""TextWorld-Sync on tw-cooking (envs/textworld_cooking_sync): the single-dish cross-check against TextWorld, the
rules on a hand-built world, concurrency
(interleaved agents == the serialised order), the generator and manifest, the planner oracle (one agent and teams)
on a sample of every family and difficulty, the verifier, and the Env wrapper (snapshots, limits, agents)."""

from __future__ import annotations

import copy
import dataclasses
import pickle
import random
import sys
import threading

import pytest

from envs.base import Task
from envs.textworld_cooking_sync import (
    DIFFICULTIES,
    FAMILIES,
    LEVELS,
    SPLIT_SIZES,
    TeamOracle,
    TextWorldCookingSyncEnv,
    World,
    WorldState,
    admissible,
    assign,
    check,
    describe,
    generate,
    next_command,
    plan,
    replay,
    rules,
    subgoals,
    verify,
)
from envs.textworld_cooking_sync.state import Dish, Door, Furniture, Ingredient, Item, Room
from envs.textworld_cooking_sync.text import objective

SAMPLE = [(f, d, s) for f in FAMILIES for d in DIFFICULTIES for s in (0, 1)]  # 56 worlds: every family x difficulty
JUNK = [
    "",
    "   ",
    "jump",
    "go up",
    "take",
    "take the moon",
    "cook knife with stove",
    "eat knife",
    "open counter",
    "unlock fridge with knife",
    "prepare",
    "prepare meal",
    "slice carrot with cookbook",
    "\x00",
    "🙂" * 3,
    "put carrot on fridge",
    "insert carrot into counter",
    "go north north",
    "take fridge",
    "a" * 3000,
]


# -- a hand-built world ------------------------------------------------------------------------------------------------
def tiny(shared: bool = True) -> WorldState:
    """kitchen --(plain door, closed)-- pantry (east). Salad: carrot (sliced, roasted) + salt; stew: red potato
    (diced, fried). The salt is in the pantry's locked chest; its brass key is on the counter."""
    rooms = {
        "kitchen": Room("kitchen", {"east": "pantry"}, {"east": "plain door"}),
        "pantry": Room("pantry", {"west": "kitchen"}, {"west": "plain door"}),
    }
    doors = {"plain door": Door("plain door", ("kitchen", "pantry"), "closed")}
    furniture = {
        "fridge": Furniture("fridge", "kitchen", "container", "closed"),
        "counter": Furniture("counter", "kitchen", "supporter"),
        "stove": Furniture("stove", "kitchen", "supporter", heat="fried"),
        "oven": Furniture("oven", "kitchen", "container", "closed", heat="roasted"),
        "shelf": Furniture("shelf", "pantry", "supporter"),
        "chest": Furniture("chest", "pantry", "container", "locked", key="brass key"),
    }
    veg = dict(edible=True, cookable=True, cuttable=True)
    items = {
        "cookbook": Item("cookbook", "cookbook", ("on", "counter")),
        "knife": Item("knife", "knife", ("on", "counter")),
        "brass key": Item("brass key", "key", ("on", "counter"), opens="chest"),
        "carrot": Item("carrot", "food", ("in", "fridge"), **veg),
        "milk": Item("milk", "food", ("in", "fridge"), drinkable=True, some=True),
        "red potato": Item("red potato", "food", ("on", "shelf"), cookable=True, needs_cooking=True, cuttable=True),
        "salt": Item("salt", "food", ("in", "chest"), edible=True),
        "red apple": Item("red apple", "food", ("room", "pantry"), **veg),
    }
    dishes = [
        Dish("salad", (Ingredient("carrot", "roasted", "sliced"), Ingredient("salt", "raw", "uncut"))),
        Dish("stew", (Ingredient("red potato", "fried", "diced"),)),
    ]
    state = WorldState(rooms, doors, furniture, items, dishes, shared_inventory=shared, objective=objective(dishes))
    rules.init_points(state)
    return state


def tiny_world(shared: bool = True, agents=("a",)) -> World:
    world = World(tiny(shared))
    for agent in agents:
        world.add_agent(agent)
    return world


SOLUTION = [
    "examine cookbook",
    "take knife from counter",
    "take brass key from counter",
    "open fridge",
    "take carrot from fridge",
    "slice carrot with knife",
    "cook carrot with oven",
    "open plain door",
    "go east",
    "unlock chest with brass key",
    "open chest",
    "take salt from chest",
    "take red potato from shelf",
    "dice red potato with knife",
    "go west",
    "cook red potato with stove",
    "prepare salad",
    "eat salad",
    "prepare stew",
    "eat stew",
]


def physical(state: WorldState) -> WorldState:
    """The state without step counts, histories and the log (what an invalid command must not change)."""
    agents = {k: dataclasses.replace(a, steps=0, history=[]) for k, a in state.agents.items()}
    return dataclasses.replace(copy.deepcopy(state), agents=agents, log=[])


def test_rules_on_a_hand_built_world_scores_and_wins():
    world = tiny_world()
    assert world.score == (0, 11)  # 3 take + 2 cook + 2 cut + 2 prepare + 2 eat (the salt stays raw and uncut)
    texts, scores = [], []
    for command in SOLUTION:
        r = world.step("a", command)
        assert r.valid, (command, r.text)
        texts.append(r.text)
        scores.append(r.score)
    assert r.won and r.done and not r.lost and r.score == 11
    assert texts[5] == "You slice the carrot." and texts[6] == "You roasted the carrot."
    assert texts[3] == "You open the fridge, revealing a carrot and some milk."
    assert texts[9] == "You unlock the chest." and texts[7] == "You open plain door."
    assert texts[16] == "Adding the salad to your inventory." and texts[17] == "You eat the salad. Not bad."
    assert scores[:5] == [0, 0, 0, 0, 1] and scores[-1] == 11
    assert world.step("a", "look").text == "The game is over."


def test_rule_messages_failures_and_lost_games():
    world = tiny_world()
    say = lambda c: world.step("a", c)  # noqa: E731
    assert say("go east").text == "You have to open the plain door first."
    assert say("take carrot").text == "You can't see any such thing."  # in the closed fridge
    assert say("prepare salad").text == "You still miss something."
    assert say("prepare soup").text.startswith("The cookbook has no recipe called 'soup'")
    say("open fridge")
    say("take carrot from fridge")
    assert say("prepare salad").text == "Something still needs to be cooked."  # Inform 7's check: carrot first
    assert say("slice carrot with knife").text == "You need to take the knife first."
    say("take knife from counter")
    assert (
        say("slice carrot with knife").valid and say("dice carrot with knife").text == "The carrot is already sliced."
    )
    assert say("cook knife with stove").text == "Can only cook food."
    assert say("eat knife").text == "That's plainly inedible."
    assert say("take fridge").text == "That's fixed in place."
    say("open plain door")
    say("go east")
    assert say("open chest").text == "The chest is locked."
    assert say("unlock chest with knife").text == "That doesn't seem to fit the lock."
    assert say("prepare salad").text == "Can only prepare salad in the kitchen."
    say("take red potato from shelf")
    assert say("eat red potato").text == "You should cook the red potato first."
    assert say("take red apple").text == "You pick up the red apple from the ground."
    assert say("eat red apple").valid and not world.lost  # a distractor: eating it is harmless
    say("go west")
    assert say("cook carrot with oven").text == "You roasted the carrot."
    assert (
        say("inventory").text == "You are carrying: a raw red potato, a knife and a sliced roasted carrot."
    )  # latest first
    r = say("cook carrot with stove")
    assert r.text == "You burned the carrot!" and r.lost and r.done and not r.won
    assert world.read(lambda s: s.failed) == {"salad": "the carrot was burned"}


@pytest.mark.parametrize(
    "commands, reason",
    [
        (
            ["open fridge", "take carrot from fridge", "take knife from counter", "dice carrot with knife"],
            "the carrot was diced, the recipe needs it sliced",
        ),
        (
            ["open fridge", "take carrot from fridge", "cook carrot with stove"],
            "the carrot was fried, the recipe needs it roasted",
        ),
        (["open fridge", "take carrot from fridge", "eat carrot"], "the carrot was consumed"),
    ],
)
def test_wrong_processing_makes_the_dish_impossible(commands, reason):
    world = tiny_world()
    for c in commands:
        r = world.step("a", c)
    assert r.lost and r.done and world.read(lambda s: s.failed) == {"salad": reason}


def test_invalid_commands_change_nothing_and_never_raise():
    world = tiny_world()
    before = physical(world.snapshot())
    for i, command in enumerate(JUNK, 1):
        r = world.step("a", command)
        assert not r.valid and not r.done and r.reward == 0.0, command
        assert physical(world.snapshot()) == before, command
        assert world.read(lambda s: s.agents["a"].steps) == i
    with pytest.raises(TypeError):
        world.step("a", None)  # type: ignore[arg-type]
    with pytest.raises(KeyError, match="add_agent"):
        world.step("nobody", "look")


def test_admissible_commands_are_executable():
    """Every admissible command of a random walk is valid when issued (a generated world, two agents)."""
    rng = random.Random(0)
    world = World(generate("nested", "medium", 3))
    world.add_agent("a")
    world.add_agent("b")
    for step in range(150):
        agent = "ab"[step % 2]
        options = [c for c in world.admissible(agent) if not c.startswith(("eat", "drink"))]
        command = rng.choice(options)
        r = world.step(agent, command)
        assert r.valid, (command, r.text)
        if r.done:
            break


# -- concurrency -------------------------------------------------------------------------------------------------------
@pytest.fixture
def fast_switching():
    saved = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # make threads interleave as often as possible
    yield
    sys.setswitchinterval(saved)


def test_commands_are_serialised(monkeypatch, fast_switching):
    """No two commands ever execute at once, whatever the threads do."""
    active, overlaps = [0], []
    real = rules.execute

    def watched(state, agent, command):
        active[0] += 1
        overlaps.append(active[0])
        for _ in range(200):  # give other threads a chance to enter
            pass
        out = real(state, agent, command)
        active[0] -= 1
        return out

    monkeypatch.setattr(rules, "execute", watched)
    world = tiny_world(agents=("a", "b", "c", "d"))
    barrier = threading.Barrier(4)

    def worker(agent):
        barrier.wait()
        for _ in range(50):
            world.step(agent, "look")

    threads = [threading.Thread(target=worker, args=(a,)) for a in "abcd"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(overlaps) == 200 and max(overlaps) == 1


@pytest.mark.parametrize("shared", [True, False])
def test_interleaved_agents_equal_the_serialised_order(shared, fast_switching):
    """Three agents in three threads: random admissible commands, then each its oracle's commands, until the
    world is won. Replaying the world's commit log one command at a time gives exactly the same final state."""
    world = World(generate("dag", "hard", 4, shared_inventory=shared))
    agents = ["a", "b", "c"]
    for agent in agents:
        world.add_agent(agent, max_steps=400)
    initial = world.snapshot()
    team = TeamOracle(world, assign(initial, agents))
    barrier = threading.Barrier(3)

    def worker(agent, seed):
        rng = random.Random(seed)
        barrier.wait()
        for _ in range(15):
            safe = [c for c in world.admissible(agent) if c.split()[0] in ("go", "look", "open", "examine", "take")]
            world.step(agent, rng.choice(safe))
        while not (world.won or world.lost):
            if world.step(agent, team.next(agent)).done:
                break

    threads = [threading.Thread(target=worker, args=(a, k)) for k, a in enumerate(agents)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    final = world.snapshot()
    assert final.won
    owners = {a for a, _ in final.log}
    assert owners == set(agents) and len(final.log) > 45
    assert replay(initial, final.log) == final


# -- the planner oracle ------------------------------------------------------------------------------------------------
def test_oracle_solves_every_family_and_difficulty_within_the_step_limit():
    env = TextWorldCookingSyncEnv()
    for family, difficulty, seed in SAMPLE:
        task = Task(
            "textworld_cooking_sync",
            f"{family}.{difficulty}.{seed}",
            "test",
            seed,
            {"family": family, "difficulty": difficulty},
        )
        obs = env.reset(task)
        while not env.done:
            action = env.oracle()
            assert action in obs.admissible, (task.task_id, action)
            obs, reward, done, info = env.step(action)
            assert info["valid"], (task.task_id, action, obs.text)
        assert info["won"] and not info["truncated"] and info["score"] == info["max_score"], task.task_id
        assert env.steps <= LEVELS[difficulty].max_steps


def test_oracle_on_manifest_samples():
    env = TextWorldCookingSyncEnv()
    for split in SPLIT_SIZES:
        for task in TextWorldCookingSyncEnv.tasks(split)[::97]:
            env.reset(task)
            while not env.done:
                _, _, _, info = env.step(env.oracle())
            assert info["won"], task.task_id


def test_replanning_continues_the_plan_and_recovers_from_detours():
    rng = random.Random(3)
    for family in FAMILIES:
        world = World(generate(family, "medium", 5))
        world.add_agent("a")
        full = plan(world.snapshot(), "a")
        for command in full[:25]:  # re-planning from each state along the plan gives the plan's next command
            assert next_command(world.snapshot(), "a") == command
            world.step("a", command)
        for _ in range(12):  # a detour: random harmless commands
            safe = [
                c
                for c in world.admissible("a")
                if c.split()[0] in ("go", "open", "close", "take", "drop", "put", "insert", "look")
            ]
            world.step("a", rng.choice(safe))
        for command in plan(world.snapshot(), "a"):
            assert world.step("a", command).valid
        assert world.won, family


@pytest.mark.parametrize("shared", [True, False])
def test_team_oracle_solves_every_family(shared):
    for k, family in enumerate(FAMILIES):
        difficulty = DIFFICULTIES[1 + k % 3]
        world = World(generate(family, difficulty, 7, shared_inventory=shared))
        agents = ["a", "b"] if k % 2 else ["a", "b", "c"]
        for agent in agents:
            world.add_agent(agent)
        assignment = assign(world.snapshot(), agents)
        assert sorted(d for ds in assignment.values() for d in ds) == sorted(
            d.name for d in world.read(lambda s: s.dishes)
        )
        rounds = TeamOracle(world, assignment).run(max_rounds=300)
        assert world.won, (family, difficulty, shared)
        single = len(plan(_fresh(family, difficulty, 7), "a"))
        assert rounds <= single, (family, difficulty, rounds, single)  # the team is never slower than one agent


def _fresh(family, difficulty, seed) -> WorldState:
    world = World(generate(family, difficulty, seed))
    world.add_agent("a")
    return world.snapshot()


def test_planner_errors():
    state = _fresh("parallel", "easy", 0)
    with pytest.raises(KeyError, match="agents are"):
        plan(state, "ghost")
    with pytest.raises(ValueError, match="dishes"):
        plan(state, "a", ["nonexistent dish"])
    world = tiny_world()
    for c in ["open fridge", "take carrot from fridge", "eat carrot"]:
        world.step("a", c)
    assert next_command(world.snapshot(), "a") == "look"  # lost: nothing to do


# -- the verifier ------------------------------------------------------------------------------------------------------
def test_verifier_on_a_played_world():
    world = tiny_world()
    goals = subgoals(world)
    assert goals[-1] == {"kind": "all_dishes_eaten"} and len(goals) == 3 + 2 * 2 + 1
    assert not any(verify(world, g) for g in goals)
    sliced = {"kind": "ingredient_processed", "ingredient": "carrot", "how": "sliced"}
    roasted = {"kind": "ingredient_processed", "ingredient": "carrot", "how": "roast"}
    ready = {"kind": "ingredient_ready", "ingredient": "carrot", "agent": "a"}
    for command in SOLUTION[:6]:
        world.step("a", command)
    assert verify(world, sliced) and not verify(world, roasted) and not verify(world, ready)
    assert verify(world, {"kind": "has", "item": "knife", "agent": "a"})
    assert verify(world, {"kind": "all", "goals": [sliced, {"kind": "not", "goal": roasted}]})
    world.step("a", SOLUTION[6])
    assert (
        verify(world, roasted)
        and verify(world, ready)
        and verify(world, {"kind": "ingredient_processed", "ingredient": "carrot"})
    )
    assert verify(world, {"kind": "cookbook_read", "agent": "a"}) and verify(
        world, {"kind": "open", "target": "fridge"}
    )
    assert not verify(world, {"kind": "unlocked", "target": "chest"}) and verify(
        world, {"kind": "at", "agent": "a", "room": "kitchen"}
    )
    assert verify(world, {"kind": "located", "item": "cookbook", "room": "kitchen"})
    for command in SOLUTION[7:18]:
        world.step("a", command)
    assert verify(world, {"kind": "dish_eaten", "dish": "salad"}) and not verify(
        world, {"kind": "dish_prepared", "dish": "stew"}
    )
    assert verify(world, ready)  # its dish is made: the carrot stays processed as required
    assert check(world, {"kind": "all_dishes_eaten"}).reason == "not eaten yet: ['stew']"
    for command in SOLUTION[18:]:
        world.step("a", command)
    assert all(verify(world, g) for g in goals)
    assert (
        describe(sliced) == "Make the carrot sliced."
        and describe({"kind": "dish_eaten", "dish": "stew"}) == "Prepare and eat the stew."
    )


@pytest.mark.parametrize(
    "goal, match",
    [
        ({"kind": "teleport"}, "unknown goal kind"),
        ("dish_eaten", "a goal is a dict"),
        ({"kind": "dish_eaten"}, "needs the field 'dish'"),
        ({"kind": "dish_eaten", "dish": "pizza"}, "unknown dish 'pizza'"),
        ({"kind": "ingredient_processed", "ingredient": "knife"}, "not an ingredient"),
        ({"kind": "ingredient_processed", "ingredient": "carrot", "how": "boiled"}, "unknown processing"),
        ({"kind": "has", "item": "spoon"}, "unknown item 'spoon'"),
        ({"kind": "at", "agent": "z", "room": "kitchen"}, "unknown agent 'z'"),
        ({"kind": "open", "target": "counter"}, "unknown door or container"),
        ({"kind": "all", "goals": "x"}, "list of goals"),
    ],
)
def test_verifier_rejects_malformed_goals(goal, match):
    with pytest.raises(ValueError, match=match):
        verify(tiny_world(), goal)


# -- the Env wrapper ---------------------------------------------------------------------------------------------------
def manifest_task(i: int = 0) -> Task:
    return TextWorldCookingSyncEnv.tasks("valid")[i]


def test_reset_observation_and_instruction():
    env = TextWorldCookingSyncEnv()
    obs = env.reset(manifest_task(60))
    assert (
        obs.instruction.startswith("You are hungry! Let's cook ")
        and "Every dish must be prepared and eaten" in obs.instruction
    )
    assert obs.text.startswith(obs.instruction) and "-= " in obs.text
    assert obs.admissible == tuple(sorted(obs.admissible)) and {"look", "inventory"} <= set(obs.admissible)
    assert obs.anchor.startswith(obs.text) and "You are carrying nothing." in obs.anchor
    assert TextWorldCookingSyncEnv(admissible=False).reset(manifest_task(60)).admissible is None
    with pytest.raises(ValueError, match="family"):
        env.reset(Task("textworld_cooking_sync", "bad", "test", 0, {}))


def test_invalid_actions_and_the_step_limit():
    env = TextWorldCookingSyncEnv(max_steps=len(JUNK))
    env.reset(manifest_task(3))
    before = physical(env.world.snapshot())
    for i, command in enumerate(JUNK):
        obs, reward, done, info = env.step(command)
        assert not info["valid"] and reward == 0.0 and not info["won"], command
        assert done == (i == len(JUNK) - 1) and info["truncated"] == done
    assert physical(env.world.snapshot()) == before
    with pytest.raises(RuntimeError):
        env.step("look")
    env = TextWorldCookingSyncEnv()
    env.reset(manifest_task(0))
    with pytest.raises(TypeError):
        env.step(3)  # type: ignore[arg-type]
    env.reset(manifest_task(0))  # easy: 60 steps
    infos = [env.step("look")[3] for _ in range(60)]
    assert infos[-1]["truncated"] and env.done and not any(i["truncated"] for i in infos[:-1])


def test_snapshot_restore_is_exact_and_picklable():
    rng = random.Random(4)
    env, other = TextWorldCookingSyncEnv(), TextWorldCookingSyncEnv()
    for task in rng.sample(TextWorldCookingSyncEnv.tasks("valid"), 5):
        obs = env.reset(task)
        for _ in range(rng.randint(3, 12)):
            obs, *_ = env.step(env.oracle() if rng.random() < 0.6 else rng.choice(obs.admissible))
        snap = env.snapshot()
        assert pickle.loads(pickle.dumps(snap)) == snap
        future = [env.oracle()] + [rng.choice(obs.admissible) for _ in range(6)]
        first = [env.step(c) for c in future if not env.done]
        other.reset(manifest_task(0))
        for target in (env, other):
            assert target.restore(pickle.loads(pickle.dumps(snap))) == obs and target.steps == snap.steps
            assert [target.step(c) for c in future[: len(first)]] == first
    with pytest.raises(ValueError, match="SyncSnapshot"):
        env.restore("not a snapshot")


@pytest.mark.parametrize("shared", [True, False])
def test_children_share_the_world_with_their_own_budget(shared):
    env = TextWorldCookingSyncEnv(shared_inventory=shared)
    env.reset(Task("textworld_cooking_sync", "t", "test", 0, {"state": tiny()}))
    child = env.spawn("child", max_steps=3)
    assert "Also here: root." in child.observe().text  # starts in its parent's room
    _, reward, done, info = child.step("take knife from counter")
    assert reward == 0 and info["valid"] and not done and child.steps_left == 2
    root_inventory = env.step("inventory")[0].text
    assert root_inventory == ("You are carrying: a knife." if shared else "You are carrying nothing.")
    assert "Also here: child." in env.step("look")[0].text
    assert env.step("take knife from counter")[3]["valid"] is False  # not on the counter any more, for anyone
    child.step("look")
    _, _, done, info = child.step("look")
    assert done and info["truncated"] and child.steps_left == 0
    assert child.step("look")[0].text == "You have no steps left."
    assert [c for c, _ in child.history] == ["take knife from counter", "look", "look"]
    assert env.world.read(lambda s: s.agents["root"].steps) == 3  # the root's own count
    with pytest.raises(ValueError, match="already exists"):
        env.spawn("child")
    with pytest.raises(ValueError, match="parent"):
        env.spawn("orphan", parent="nobody")


def test_a_child_can_finish_the_task_for_the_root():
    env = TextWorldCookingSyncEnv()
    env.reset(Task("textworld_cooking_sync", "t", "test", 0, {"state": tiny()}))
    child = env.spawn("child", max_steps=40)
    while True:
        _, _, done, info = child.step(child.oracle())
        if done:
            break
    assert info["won"] and verify(env.world, {"kind": "all_dishes_eaten"})
    obs, _, done, info = env.step("look")
    assert done and info["won"] and obs.text == "The game is over."


def test_admissible_lists_match_the_rules_module():
    world = tiny_world()
    assert world.admissible("a") == admissible(world.snapshot(), "a")
    assert "prepare salad" not in world.admissible("a")
