"""The recursive-agent tree as data (ids, parents, depths, budgets, status, arrays, rendering) and the planner tree.

Checked: spawning and waiting by hand; the depth, children and node limits; the ``[Q]`` arrays against a hand count
and against ``agentjax.credit.sera`` (depths from parent pointers, leaf coverage); ``render_tree`` shows who
delegated what, each reply and reward; ``planner_tree`` on TextCraft-Synth tasks: every reply parses, budgets and
depth hold, children own disjoint parts of the plan, and a too-small budget or an unsolvable task is refused.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from agentjax.agents.grammar import Delegation, Reply, parse_textcraft
from agentjax.agents.textcraft_tree import PlannedNode, TextCraftTreeConfig, TextCraftTreeWorld, node_path, planner_tree
from agentjax.agents.tree import NO_PARENT, Goal, NodeTurn, Status, Tree, TreeLimits, render_tree
from agentjax.credit import sera
from envs.base import Task
from envs.textcraft import TextCraftSynthEnv


def small_tree() -> Tree:
    """root -> [1, 2] at its turn 0; 1 -> [3] at its turn 1."""
    tree = Tree(Task("textcraft_synth", "t0", "test"), group=0, index=2, task_index=5, limits=TreeLimits())
    root = tree.add_root(Goal("craft 3x x", {"x": 3}))
    root.turns.append(NodeTurn(0, Reply("delegate", "<python>launch both</python>"), "Subagent results: ...", True))
    a, b = tree.spawn(root, [Goal("craft 2x y", {"y": 2}), Goal("craft 1x z", {"z": 1})], [20, 50],
                      tree.add_event(root))
    assert root.status is Status.WAITING and root.waiting_on == (1, 2) and tree.live() == [a, b]
    a.turns.append(NodeTurn(0, Reply("act", "<python>craft(...)</python>"), "Crafted 2 y", True))
    a.turns.append(NodeTurn(1, Reply("delegate", "<python>await launch_subagent({'w': 1})</python>"), "", True))
    (c,) = tree.spawn(a, [Goal("craft 1x w", {"w": 1})], [4], tree.add_event(a))
    tree.root.turns[0].children = (1, 2)
    a.turns[1].children = (3,)
    return tree


def test_spawn_sets_ids_parents_depths_budgets_and_waiting():
    tree = small_tree()
    root, a, b, c = tree.nodes
    assert [(n.id, n.parent, n.depth, n.budget, n.launch_step, n.rank) for n in tree.nodes] == [
        (0, NO_PARENT, 0, 20, -1, 0), (1, 0, 1, 20, 0, 0), (2, 0, 1, 20, 0, 1), (3, 1, 2, 4, 1, 0)]
    assert a.status is Status.WAITING and tree.live() == [b, c] and tree.ready_parents() == []
    tree.stop(c, Status.FINISHED)
    assert tree.ready_parents() == [a]
    tree.stop(b, Status.EXHAUSTED)
    a.status, a.waiting_on = Status.RUNNING, ()
    tree.stop(a, Status.FINISHED)
    assert tree.ready_parents() == [root] and not tree.done
    tree.stop(root, Status.FINISHED)
    assert tree.done and [n.id for n in tree.leaves()] == [2, 3]
    assert [node_path(tree, n) for n in tree.nodes] == [(), (0,), (1,), (0, 0)]
    with pytest.raises(ValueError, match="stopped"):
        tree.stop(root, Status.RUNNING)
    with pytest.raises(ValueError, match="root"):
        tree.add_root(Goal("again"))


def test_limits_depth_children_and_nodes():
    limits = TreeLimits(max_steps=20, max_depth=3, max_children=2, max_nodes=5)
    assert [limits.can_delegate(d) for d in range(5)] == [True, True, True, False, False]
    tree = Tree(Task("textcraft_synth", "t", "test"), 0, 0, 0, limits)
    node = tree.add_root(Goal("g"))
    goals = [Delegation("a"), Delegation("b")]
    assert tree.check_delegation(node, goals) == ""
    assert "at most 2" in tree.check_delegation(node, goals * 2)
    for depth in (1, 2, 3):
        node.turns.append(NodeTurn(0, Reply("delegate", ""), "", True))
        node = tree.spawn(node, [Goal(f"depth {depth}")], [99])[0]
        assert node.depth == depth and node.budget == 20  # budgets are capped at max_steps
    assert "depth 3" in tree.check_delegation(node, goals[:1])
    tree.nodes[2].status = Status.RUNNING
    assert "at most 5 agents" in tree.check_delegation(tree.nodes[2], goals)
    with pytest.raises(ValueError):
        TreeLimits(max_steps=0)


def test_arrays_match_the_tree_and_the_sera_kernels():
    tree = small_tree()
    root, a, b, c = tree.nodes
    for n, status in ((c, Status.FINISHED), (b, Status.EXHAUSTED), (a, Status.FINISHED), (root, Status.FINISHED)):
        tree.stop(n, status)
    a.label, b.label, c.label, tree.root_success = 1.0, 0.0, None, True  # c: the judge failed
    arr = tree.arrays(6)
    np.testing.assert_array_equal(arr["parent"], [-1, 0, 0, 1, -1, -1])
    np.testing.assert_array_equal(arr["depth"], [0, 1, 1, 2, 0, 0])
    np.testing.assert_array_equal(arr["node_mask"], [1, 1, 1, 1, 0, 0])
    np.testing.assert_array_equal(arr["finished"], [1, 1, 0, 1, 0, 0])
    np.testing.assert_array_equal(arr["label"], [1, 1, 0, 0, 0, 0])
    np.testing.assert_array_equal(arr["label_mask"], [1, 1, 1, 0, 0, 0])
    np.testing.assert_array_equal(arr["launch_step"], [-1, 0, 0, 1, -1, -1])
    np.testing.assert_array_equal(arr["turns"], [1, 2, 0, 0, 0, 0])
    np.testing.assert_array_equal(arr["delegated"], [1, 1, 0, 0, 0, 0])
    np.testing.assert_array_equal(arr["event"], [-1, 0, 0, 1, -1, -1])
    np.testing.assert_array_equal(arr["event_node"], [0, 1, -1, -1, -1, -1])
    np.testing.assert_array_equal(arr["event_step"], [0, 1, -1, -1, -1, -1])
    parent, mask = jnp.asarray(arr["parent"]), jnp.asarray(arr["node_mask"])
    np.testing.assert_array_equal(np.asarray(sera.node_depth(parent, mask))[:4], arr["depth"][:4])
    cover = sera.leaf_coverage(parent, mask, jnp.asarray(arr["event"]), jnp.asarray(arr["event_node"]),
                               jnp.asarray(1.0))
    np.testing.assert_allclose(np.asarray(cover.reward_e)[:2], [1.0, 0.5])  # leaves 2 and 3 of 2; leaf 3 of 2
    with pytest.raises(ValueError, match="slots"):
        tree.arrays(3)
    # a refused attempt (an event without children) past the event slots is left out and counted
    a.turns.append(NodeTurn(2, Reply("delegate", ""), "Error: cannot delegate", False))
    tree.add_event(a)
    assert a.turns[-1].event == 2
    full, short = tree.arrays(6, 3), tree.arrays(6, 2)
    np.testing.assert_array_equal(full["event_node"], [0, 1, 1]) and int(full["dropped_events"]) == 0
    np.testing.assert_array_equal(short["event_node"], [0, 1])
    assert int(short["dropped_events"]) == 1
    with pytest.raises(ValueError, match="children"):
        tree.arrays(6, 1)


def test_render_tree_shows_who_delegated_what_replies_and_rewards():
    tree = small_tree()
    root, a, b, c = tree.nodes
    c.finish_message, a.finish_message = "made w", "made y"
    for n, status in ((c, Status.FINISHED), (b, Status.EXHAUSTED), (a, Status.FINISHED), (root, Status.FINISHED)):
        tree.stop(n, status)
    a.label, b.label, c.label, tree.root_success = 1.0, 0.0, 1.0, True
    text = render_tree(tree)
    lines = text.splitlines()
    assert lines[0] == "tree 2 of task t0 (group 0): root success, 4 nodes, depth 2"
    assert "[0] depth 0, root: craft 3x x" in lines[1] and "reward 1 (env outcome)" in lines[2]
    # the launch event's leaf coverage: both leaves ([2], and [3] under [1]) are under its children, R_root = 1
    assert any("turn 0 (delegate -> [1], [2], leaf coverage 1): <python>launch both</python>" in x for x in lines)
    assert any(x.startswith("    [1] depth 1, delegated by [0] at its turn 0: craft 2x y") for x in lines)
    assert any(x.startswith("        [3] depth 2, delegated by [1] at its turn 1: craft 1x w") for x in lines)
    assert "exhausted after 0/20 turns, reward 0 (verifier)" in text
    assert "finish message: made w" in text and "=> Crafted 2 y" in text
    # the children appear under the turn that launched them, before the parent's later lines
    assert text.index("[1] depth 1") < text.index("[3] depth 2") < text.index("[2] depth 1")
    assert text.index("turn 0 (delegate -> [1], [2],") < text.index("[1] depth 1") < text.index("Subagent results")
    assert "reward 0.25" in render_tree(tree, rewards={0: 0.25, 1: 1.0, 2: 0.0, 3: 1.0})


# ------------------------------------------------------------------------------------------------ planner trees


@pytest.fixture(scope="module")
def synth():
    tasks = TextCraftSynthEnv.tasks("val")
    by = {d: [t for t in tasks if t.meta["difficulty"] == d] for d in ("easy", "medium", "hard", "extreme")}
    return TextCraftSynthEnv().book, by


def walk(node: PlannedNode, depth: int = 0):
    yield node, depth
    for c in node.children:
        yield from walk(c, depth + 1)


@pytest.mark.parametrize("difficulty", ["easy", "medium", "hard", "extreme"])
def test_planner_tree_replies_parse_and_respect_budgets_and_depth(synth, difficulty):
    book, by = synth
    limits = TreeLimits()
    for task in by[difficulty][::34]:
        root = planner_tree(task, book=book, limits=limits)
        crafted: list[str] = []
        for node, depth in walk(root):
            assert depth <= limits.max_depth and len(node.replies) <= limits.max_steps
            assert len(node.children) <= limits.max_children and (not node.children or depth < limits.max_depth)
            replies = [parse_textcraft(r) for r in node.replies]
            assert all(r.valid for r in replies), task.task_id
            assert replies[-1].kind == "finish" and [r.kind for r in replies].count("delegate") == bool(node.children)
            launched = [dict(d.targets) for r in replies for d in r.delegations]
            assert launched == [dict(c.targets) for c in node.children]
            crafted += [c.args["target"][0] for r in replies for c in r.calls]
        # every item of the recipe plan is crafted by exactly one node of the tree
        env = TextCraftSynthEnv()
        env.reset(task)
        planned = [cmd.split()[2] for cmd in env.plan()]
        assert sorted(crafted) == sorted(planned), task.task_id
        assert root.count() <= limits.max_nodes


def test_planner_tree_without_delegation_is_the_plan(synth):
    book, by = synth
    task = by["medium"][0]
    root = planner_tree(task, book=book, limits=TreeLimits(max_depth=0, max_steps=30))
    assert not root.children and len(root.replies) == len(TextCraftWorld_plan(task)) + 1
    packed = planner_tree(task, book=book, limits=TreeLimits(max_depth=0, max_steps=4))
    assert len(packed.replies) <= 4 and sum(len(parse_textcraft(r).calls) for r in packed.replies) == \
        len(TextCraftWorld_plan(task))
    with pytest.raises(ValueError, match="replies"):
        planner_tree(task, book=book, limits=TreeLimits(max_depth=0, max_steps=2), max_calls=2)
    starved = Task(task.env, "starved", "test", meta={**task.meta, "initial_inventory": {}})
    with pytest.raises(ValueError, match="base items"):
        planner_tree(starved, book=book)


def TextCraftWorld_plan(task: Task) -> list[str]:  # noqa: N802
    env = TextCraftSynthEnv()
    env.reset(task)
    return env.plan()


def test_world_prompts_and_admissible_replies(synth):
    book, by = synth
    task = by["medium"][0]
    world = TextCraftTreeWorld(task)
    tree = Tree(task, 0, 0, 0, TreeLimits())
    root = tree.add_root(world.root_goal())
    intro = world.begin(root)
    assert intro.startswith(f"Goal: {root.goal.text}") and "Recipes:" in intro and "You have 20 steps." in intro
    assert "launch_subagent" in world.system_prompt(True) and "launch_subagent" not in world.system_prompt(False)
    replies = world.admissible(tree, root)
    kinds = sorted({parse_textcraft(r).kind for r in replies})
    assert kinds == ["act", "delegate", "finish"] and all(parse_textcraft(r).valid for r in replies)
    root.depth = 3  # at the depth limit nothing is delegated
    assert "delegate" not in {parse_textcraft(r).kind for r in world.admissible(tree, root)}
    assert world.child_goal(root, parse_textcraft("<python>launch_subagent({'nope': 1})").delegations[0])[0] is None


def test_planner_replies_are_admissible_on_the_plan_only(synth):
    """``planner_replies``: the planner tree's reply at the node's path and turn is one of the admissible replies
    while the tree follows the plan (the warm start imitates it under the constraint); off the plan it is not."""
    book, by = synth
    task = by["medium"][0]
    plan = planner_tree(task, book=book, limits=TreeLimits())
    world = TextCraftTreeWorld(task, config=TextCraftTreeConfig(planner_replies=True))
    tree = Tree(task, 0, 0, 0, TreeLimits())
    root = tree.add_root(world.root_goal())
    root.intro = world.begin(root)
    assert plan.replies[0] in world.admissible(tree, root) and world.planned_reply(tree, root) == plan.replies[0]
    assert set(world.admissible(tree, root)) == set(TextCraftTreeWorld(task).admissible(tree, root)) | {
        plan.replies[0]}  # off by default: the rest is the same
    child = tree.spawn(root, [Goal("another goal", {"nope": 1})], [5])[0]  # not the planned child's targets
    assert world.planned_reply(tree, child) is None
    starved = Task(task.env, "starved", "test", meta={**task.meta, "initial_inventory": {}})
    starved_world = TextCraftTreeWorld(starved, config=TextCraftTreeConfig(planner_replies=True))
    assert starved_world.planned_reply(Tree(starved, 0, 0, 0, TreeLimits()), root) is None  # no plan


def test_a_tree_saved_as_json_renders_the_same():
    import json

    from agentjax.agents.tree_io import tree_from_dict, tree_to_dict

    tree = small_tree()
    tree.nodes[1].label, tree.nodes[2].label, tree.root_success = 1.0, 0.0, True
    tree.nodes[2].status, tree.nodes[2].finish_message = Status.FINISHED, "made z"
    back = tree_from_dict(json.loads(json.dumps(tree_to_dict(tree))))
    assert render_tree(back) == render_tree(tree) and tree_to_dict(back) == tree_to_dict(tree)
    np.testing.assert_array_equal(back.arrays(8)["parent"], tree.arrays(8)["parent"])
