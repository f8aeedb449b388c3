"""TextWorld-Sync in the tree runtime (agentjax/agents/textworld_tree.py) through the tree collector.

Checked: one engine world per tree with an agent per node (a child's take is visible to its parent; own locations;
siblings of one delegation act one after the other, in node order, as the event log shows); the shared step budget
ends every agent's episode (replies of that turn not run, every node ENDED); malformed replies and refused
delegations use no world step while a rejected command uses one; planner trees succeed through the collector on a
validation task of every family x difficulty with every child verified; the verifier labels a child that did
nothing as a failure and counts goals it cannot read; the yes/no judging prompt with a stub policy; a tiny random
Qwen3 grows TextWorld-Sync trees with one policy call per turn; render_tree on a TextWorld-Sync tree.
"""

from __future__ import annotations

import json
import types

import jax
import numpy as np
import pytest
from flax import nnx

from agentjax.agents.grammar import Role, parse_textworld
from agentjax.agents.judge import SamplerJudge
from agentjax.agents.textworld_tree import (
    SyncPlannerTeacher,
    SyncVerifierJudge,
    TextWorldTreeConfig,
    TextWorldTreeWorld,
    dish_goal,
    parse_yes_no,
    sync_judge_messages,
)
from agentjax.agents.tree import Goal, Node, Status, Tree, TreeLimits, render_tree
from agentjax.models import Finish, Qwen, QwenConfig, SampleOutput, Sampler, SamplingParams, load_tokenizer
from agentjax.models.tokenizer import ENDOFTEXT_ID, IM_END_ID
from agentjax.rollout.tree_collect import TreeCollectConfig, run_trees, to_tree_batch, tree_stats
from envs.base import Task
from envs.textworld_sync import DIFFICULTIES, FAMILIES, ROOT, TextWorldSyncEnv

STOPS = (IM_END_ID, ENDOFTEXT_ID)
TEACH = TreeCollectConfig(trees_per_task=1, max_prompt_tokens=8192, sampling=SamplingParams(
    max_new_tokens=256, stop_token_ids=STOPS, prompt_bucket=256))


def recipe(name, *prep, source="kitchen.fridge"):
    return {"name": name, "preparation": list(prep), "candidate_source_locations": [source]}


def hand_task(budget=50):
    """dish_1 = carrot (roasted, sliced; kitchen) + salt (raw; pantry), dish_2 = banana (grilled; garden)."""
    dishes = {"dish_1": [recipe("carrot", "roasted", "sliced"), recipe("salt", "raw", "uncut", source="pantry.shelf")],
              "dish_2": [recipe("banana", "grilled", "uncut", source="garden")]}
    meta = {"dishes": [{"dish_id": d, "recipe": r} for d, r in dishes.items()], "budget": budget,
            "parallelism": {"mechanisms": {"tool_cooldown_steps": 0}, "shared_environment_max_steps": budget},
            "game_params": {"numLocations": 5, "includeDoors": 0, "limitInventorySize": 0},
            "description": "Prepare and eat dish_1 and dish_2."}
    return Task("textworld_sync", "hand", "test", 0, meta)


def script(replies):
    """A teacher serving ``replies[node id][turn]``."""
    return lambda tree, node: replies[node.id][len(node.turns)]


def run(tokenizer, replies, *, budget=50, limits=None, judge=None, policy=None):
    """Scripted replies (``{node id: [reply per turn]}``; or a ``policy`` samples them) on the hand task; the
    rollouts, the worlds, the judge."""
    worlds = []

    def factory(task):
        worlds.append(TextWorldTreeWorld(task, config=TextWorldTreeConfig(budget=budget)))
        return worlds[-1]

    judge = judge or SyncVerifierJudge()
    rollouts = run_trees([hand_task(budget)], policy or teacher_only(tokenizer), factory, judge,
                         TEACH.replace(limits=limits or TreeLimits()), jax.random.key(0),
                         teacher=None if policy else script(replies))
    return rollouts, worlds, judge


def events(world):
    return world.world.read(lambda s: [(e.agent, e.action, e.accepted) for e in s.events])


def teacher_only(tokenizer):
    """A policy for teacher runs: its tokenizer only."""

    def generate(*args, **kwargs):
        raise AssertionError("a teacher run samples nothing")

    return types.SimpleNamespace(tokenizer=tokenizer, generate=generate)


def delegate(*goals):
    return f"<delegate>{json.dumps({'delegations': [{'goal': g} for g in goals]})}</delegate>"


class Scripted:
    """A policy answering each prompt with ``answer(prompt text)``; records the prompts."""

    def __init__(self, tokenizer, answer):
        self.tokenizer, self.answer, self.prompts = tokenizer, answer, []

    def generate(self, prompts, params, key, **kw) -> SampleOutput:
        self.prompts += [self.tokenizer.decode(p) for p in prompts]
        texts = [self.answer(p) for p in self.prompts[-len(prompts):]]
        ids = [self.tokenizer.encode(a, add_special_tokens=False) + [IM_END_ID] for a in texts]
        b, t = len(ids), max(map(len, ids))
        tokens = np.zeros((b, t), np.int32)
        for i, x in enumerate(ids):
            tokens[i, : len(x)] = x
        zeros = np.zeros((b, t), np.float32)
        return SampleOutput(tokens_bt=tokens, logp_bt=zeros, logp_unmasked_bt=zeros,
                            length_b=np.array([len(x) for x in ids], np.int32),
                            finish_b=np.full(b, Finish.STOP_TOKEN, np.int32), texts=texts)


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer()


# ------------------------------------------------------------------------------------------------ the shared world


def test_children_share_one_world_with_their_own_locations_and_act_in_turn(tokenizer):
    replies = {
        0: [delegate("Take the carrot, roast it and slice it.", "Look around the garden."),
            "<action>inventory</action>", "<finish>stopping</finish>"],
        1: ["<action>take carrot</action>", "<action>cook carrot in oven</action>", "<action>slice carrot</action>",
            "<finish>carrot ready</finish>"],
        2: ["I take it. <action>take carrot</action>", "<action>go to garden</action>", "<finish>saw it</finish>"],
    }
    rollouts, (world,), judge = run(tokenizer, replies)
    (tree,) = rollouts.trees
    root, first, second = tree.nodes
    # serialised in node order within each turn: the second child's take comes after the first's and is rejected
    one, two = "root/subagent-1", "root/subagent-2"
    assert events(world) == [(one, "take carrot", True), (two, "take carrot", False),
                             (one, "cook carrot in oven", True), (two, "go to garden", True),
                             (one, "slice carrot", True)]
    assert not second.turns[0].valid and second.turns[0].reward == -TEACH.invalid_penalty
    assert "is not one of your valid actions (it still used a shared step)" in second.turns[0].feedback
    # own locations and histories on one world
    assert world.world.read(lambda s: dict(s.locations)) == {ROOT: "kitchen", "root/subagent-1": "kitchen",
                                                             "root/subagent-2": "garden"}
    # a child starts with its goal, its observation (the shared budget line) and its valid actions
    assert first.intro.startswith("# Goal\nTake the carrot, roast it and slice it.\n\n# Observation\nYou are in the "
                                  "kitchen.\nVisible objects: carrot") and "Shared steps remaining: 50" in first.intro
    assert "# Valid Actions\n- look around\n- inventory" in first.intro and "You have 20 turns." in first.intro
    # the parent sees its children's results, then its own view now; the child's take shows in its lookup (no step)
    back = root.turns[0].feedback
    assert "[1] Take the carrot, roast it and slice it. -> finished: carrot ready" in back
    assert "[2] Look around the garden. -> finished: saw it" in back and "Shared prepared counter: carrot" in back
    assert "[Inventory Lookup]" in root.turns[1].feedback and world.world.read(lambda s: s.steps) == 5
    assert tree.root_success is False and root.finished
    # the verifier: the first child's goal holds; the second's names nothing it can check (a counted failure)
    assert (first.label, second.label) == (1.0, 0.0) and "carrot is collected" in first.judge_reason
    assert judge.metrics.as_dict()["judge/unparsed_goals"] == 1.0 and judge.metrics.requests == 2


def test_the_shared_budget_ends_every_agents_episode(tokenizer):
    """A scripted *policy* (sampled replies): the root delegates two children that look around until the budget of 5
    shared steps is spent."""

    def reply(prompt):
        if "# Goal\nPrepare and eat dish_1 and dish_2." in prompt:  # the root
            return delegate("Prepare and eat dish_1.", "Prepare and eat dish_2.")
        return "<action>look around</action>"

    rollouts, (world,), _ = run(tokenizer, None, budget=5, policy=Scripted(tokenizer, reply))
    (tree,) = rollouts.trees
    assert world.world.read(lambda s: (s.steps, len(s.events), s.done)) == (5, 5, True)
    assert [n.status for n in tree.nodes] == [Status.ENDED] * 3 and tree.root_success is False
    root, first, second = tree.nodes
    assert (len(first.turns), len(second.turns)) == (3, 3)  # the fifth step was the first child's third
    assert first.turns[-1].executed and not second.turns[-1].executed and second.turns[-1].valid
    assert "Not run: the shared step budget (5 steps) is spent" in second.turns[-1].feedback
    assert "stopped without finishing (the shared world ended)" in root.turns[0].feedback
    assert (first.label, second.label) == (0.0, 0.0)  # judged although they did not finish (the released judge)
    stats = tree_stats(rollouts)
    assert stats["tree/ended"] == 1.0 and stats["tree/not_run"] == 1.0
    steps = to_tree_batch(rollouts, TEACH).steps
    last = np.asarray(steps.done) & np.asarray(steps.row_mask)
    assert last.sum() == 3 and np.asarray(steps.truncated)[last].all() and not np.asarray(steps.terminated).any()
    # the budget: 100 in the released training runtime, the task's own in the evaluator
    task = TextWorldSyncEnv.tasks("validation")[-1]
    assert TextWorldTreeWorld(task, config=TextWorldTreeConfig.training()).budget == 100
    assert TextWorldTreeWorld(task, config=TextWorldTreeConfig.evaluation()).budget == task.meta["budget"] != 100
    for bad in (dict(budget=0), dict(lookup_style="chatty")):
        with pytest.raises(ValueError, match="TextWorldTreeConfig"):
            TextWorldTreeConfig(**bad)


def test_malformed_replies_and_refusals_use_no_world_step(tokenizer):
    replies = {0: ["no block at all", "<action>look around</action><finish>both</finish>", "<delegate>{oops</delegate>",
                   delegate("Prepare and eat dish_1."), "<action>jump</action>", "<action>check inventory</action>",
                   "<finish>gave up</finish>"]}
    rollouts, (world,), _ = run(tokenizer, replies, limits=TreeLimits(max_depth=0))
    (root,) = rollouts.trees[0].nodes
    assert [u.valid for u in root.turns] == [False] * 5 + [True] * 2
    assert [u.reward for u in root.turns] == [-TEACH.invalid_penalty] * 5 + [0.0, 0.0]
    assert events(world) == [(ROOT, "jump", False)]  # only the engine's rejected command used a step
    assert "cannot delegate: a node at depth 0 cannot delegate" in root.turns[3].feedback
    for turn in root.turns[:4]:  # the error, then the world as it is now
        assert turn.feedback.startswith("Error: ") and "Valid Actions:\n- look around" in turn.feedback
    assert "<delegate>" not in world.system_prompt(False) and "<delegate>" in world.system_prompt(True)


def test_a_child_that_did_nothing_fails_the_verifier(tokenizer):
    replies = {0: [delegate(dish_goal(["dish_1"]), dish_goal(["dish_2"]))] + ["<finish>done</finish>"],
               1: ["<finish>done already</finish>"],
               2: ["<action>go to garden</action>", "<action>take banana</action>",
                   "<action>cook banana on grill</action>", "<action>prepare dish_2</action>",
                   "<action>eat dish_2</action>", "<finish>ate dish_2</finish>"]}
    rollouts, _, judge = run(tokenizer, replies)
    root, idle, worker = rollouts.trees[0].nodes
    assert idle.finished and idle.label == 0.0 and "dish_1 is not eaten" in idle.judge_reason
    assert worker.finished and worker.label == 1.0 and rollouts.trees[0].root_success is False
    assert judge.metrics.as_dict()["judge/unparsed_goals"] == 0.0


# ------------------------------------------------------------------------------------------------ planner trees


@pytest.fixture(scope="module")
def planned(tokenizer):
    tasks = TextWorldSyncEnv.tasks("validation")[:28]  # one task of every (difficulty, family) cell
    assert {(t.meta["difficulty"], t.meta["family"]) for t in tasks} == {(d, f) for d in DIFFICULTIES
                                                                         for f in FAMILIES}
    judge = SyncVerifierJudge()
    rollouts = run_trees(tasks, teacher_only(tokenizer),
                         lambda t: TextWorldTreeWorld(t, config=TextWorldTreeConfig.evaluation()), judge, TEACH,
                         jax.random.key(0), teacher=SyncPlannerTeacher())
    return rollouts, judge


def test_planner_trees_succeed_on_every_family_and_difficulty(planned, tokenizer):
    rollouts, judge = planned
    for tree in rollouts.trees:
        dishes = len(tree.task.meta["dishes"])
        root, children = tree.root, tree.nodes[1:]
        assert tree.root_success, tree.task.task_id
        assert len(children) == dishes and all(c.depth == 1 and c.label == 1.0 for c in children)
        assert root.turns[0].reply.kind == "delegate" and len(root.turns[0].children) == dishes
        assert all(u.valid for n in tree.nodes for u in n.turns)
        assert all(n.finished or n.status is Status.ENDED for n in tree.nodes)
    children = sum(len(t.nodes) - 1 for t in rollouts.trees)
    stats = tree_stats(rollouts)
    assert stats["tree/root_success"] == 1.0 and stats["tree/child_success"] == 1.0 and stats["tree/invalid"] == 0
    assert stats["judge/requests"] == children and stats["judge/unparsed_goals"] == 0 and stats["tree/cut"] == 0
    assert stats["tree/not_run"] == 0  # a teacher is not asked once the world ended
    batch = to_tree_batch(rollouts, TEACH)
    steps = types.SimpleNamespace(**{k: np.asarray(getattr(batch.steps, k)) for k in
                                     ("row_mask", "done", "terminated", "node", "won")})
    roots = steps.row_mask & steps.done & (steps.node == 0)
    assert roots.sum() == 28 and steps.terminated[roots].all() and steps.won[roots].all()  # ended by success
    delegation = np.asarray(batch.role_mask(Role.DELEGATION))
    first = rollouts.trees[0].root.turns[0]
    assert delegation[0].sum() > 0 and tokenizer.decode(np.asarray(batch.steps.response_tokens)[0][delegation[0]]) \
        .startswith("<delegate>")
    assert first.reply.delegations[0].goal == dish_goal(["dish_1"])
    # the teacher's first reply is one a constrained decoder may emit (a fresh tree of the same task)
    task = rollouts.trees[-1].task
    world, tree = TextWorldTreeWorld(task), Tree(task, 0, 0, 0, TreeLimits())
    root = tree.add_root(world.root_goal())
    root.intro = world.begin(root)
    assert SyncPlannerTeacher()(tree, root, world) in world.admissible(tree, root)


def test_render_a_textworld_sync_tree(planned):
    text = render_tree(planned[0].trees[0])
    assert text.startswith("tree 0 of task cookingworld_multidish_dev_") and "root success" in text
    assert "delegated by [0] at its turn 0: Prepare and eat dish_1" in text and "reward 1 (verifier)" in text
    assert "<delegate>" in text and "<action>take " in text and "ended after 1/20 turns, reward 1 (env outcome)" in text


# ------------------------------------------------------------------------------------------------ the judging prompt


@pytest.mark.parametrize("text, expected", [
    ("yes", (True, True)), ("No.", (False, True)), ("**Yes** - the dish was eaten.", (True, True)),
    ("Answer: NO", (False, True)), ("<think>yes? no?</think>\nyes", (True, True)),
    ("The carrot is ready, but...\nFinal answer: no", (False, True)), ("It did, so I say yes.", (True, True)),
    ("maybe", (False, False)), ("", (False, False)), ("It is not clear: yes and no.", (False, False)),
])
def test_parse_yes_no(text, expected):
    v = parse_yes_no(text)
    assert (v.success, v.ok) == expected


def test_the_judging_prompt_path_with_a_stub(tokenizer):
    answers = iter(["Yes.", "I cannot tell."])
    stub = Scripted(tokenizer, lambda prompt: next(answers))
    judge = SamplerJudge(stub, TEACH.sampling, messages=sync_judge_messages, parse=parse_yes_no,
                         require_finish=False)
    replies = {0: [delegate("Prepare and eat dish_2.", "Prepare and eat dish_1.")] + ["<finish>done</finish>"],
               1: ["<action>go to garden</action>", "<action>take banana</action>", "<finish>took it</finish>"],
               2: ["<action>inventory</action>"] * 2 + ["<finish>nothing</finish>"]}  # both stop in one turn
    rollouts, _, _ = run(tokenizer, replies, judge=judge)
    _, first, second = rollouts.trees[0].nodes
    assert (first.label, second.label) == (1.0, None)  # the stub's verdicts; a malformed answer gives no label
    assert judge.metrics.calls == 1 and judge.metrics.requests == 2 and judge.metrics.failures == 1
    assert tree_stats(rollouts)["tree/unlabelled_children"] == 1.0
    prompt = stub.prompts[0]
    assert "Goal: Prepare and eat dish_2." in prompt and "1. action: go to garden [ok]" in prompt
    assert "3. finish: took it [ok]" in prompt and "Its finish message: took it" in prompt
    assert "The world when it stopped:\nYou are in the garden." in prompt and "Shared inventory: banana" in prompt
    assert "Answer yes or no." in prompt and prompt.count("<|im_start|>") == 3


# ------------------------------------------------------------------------------------------------ a tiny Qwen


class Recording:
    """Forwards to a sampler; records every call's batch size."""

    def __init__(self, sampler: Sampler):
        self.sampler, self.tokenizer, self.config = sampler, sampler.tokenizer, sampler.config
        self.calls: list[int] = []

    def generate(self, prompts, params, key, **kw):
        self.calls.append(len(prompts))
        return self.sampler.generate(prompts, params, key, **kw)


@pytest.mark.slow  # end to end, minutes of CI time: `make test-slow` (README, "Tests")
def test_tiny_qwen_grows_textworld_sync_trees_with_one_policy_call_per_turn(tokenizer):
    model = Qwen(QwenConfig.tiny_qwen3(vocab_size=151_936, d_model=32, mlp_dim=64, num_layers=1, head_dim=8),
                 rngs=nnx.Rngs(0))
    policy = Recording(Sampler(model, tokenizer))
    config = TreeCollectConfig(
        trees_per_task=3, limits=TreeLimits(max_steps=3, max_depth=1, max_nodes=8), max_turns=6,
        sampling=SamplingParams(temperature=1.0, max_new_tokens=48, stop_token_ids=STOPS, prompt_bucket=1024),
        max_prompt_tokens=2048, constrained=True, masked_logp=True, max_allowed=16, batch_bucket=8)
    judge = SyncVerifierJudge()
    rollouts = run_trees([hand_task()], policy, lambda t: TextWorldTreeWorld(t, config=TextWorldTreeConfig(budget=30)),
                         judge, config, jax.random.key(3))
    turns = [u for t in rollouts.trees for n in t.nodes for u in n.turns]
    assert policy.calls == list(rollouts.padded_per_call) and rollouts.live_per_call[0] == 3
    assert sum(rollouts.live_per_call) == len(turns) and all(c % 8 == 0 for c in policy.calls)
    assert all(u.reply.valid for u in turns) and all(parse_textworld(u.reply.text).valid for u in turns)
    assert any(u.reply.kind == "delegate" for u in turns) and any(u.reply.kind == "act" for u in turns)
    batch = to_tree_batch(rollouts, config)
    mask = np.asarray(batch.steps.response_mask)
    allowed = np.asarray(batch.steps.allowed_tokens)
    assert (allowed == np.asarray(batch.steps.response_tokens)[..., None]).any(-1)[mask].all()
    for tree in rollouts.trees:
        assert all(n.depth <= 1 and n.label in (0.0, 1.0) for n in tree.nodes[1:])
    assert judge.metrics.requests == sum(len(t.nodes) - 1 for t in rollouts.trees)
    text = render_tree(rollouts.trees[0])
    assert text.startswith("tree 0 of task hand") and "turn 0" in text


def test_fork_branches_act_on_clones_of_the_shared_world(tokenizer):
    """SERA's fork groups on TextWorld-Sync: each branch of the delegated child is its engine agent (same place and
    history) on an isolated clone of the world as the child found it; the main world sees only branch 0."""
    from agentjax.rollout.tree_rubrics import ForkConfig, RubricConfig

    def reply(tree, node):
        if tree.fork is not None:  # branch 1 takes the carrot on its clone, then finishes
            return ["<action>take carrot</action>", "<finish>took it</finish>"][len(node.turns)]
        return {0: [delegate("Take the carrot."), "<finish>done</finish>"],
                1: ["<action>go to garden</action>", "<finish>went</finish>"]}[node.id][len(node.turns)]

    worlds = []

    def factory(task):
        worlds.append(TextWorldTreeWorld(task, config=TextWorldTreeConfig(budget=50)))
        return worlds[-1]

    rollouts = run_trees([hand_task()], teacher_only(tokenizer), factory, SyncVerifierJudge(), TEACH,
                         jax.random.key(0), teacher=reply, rubrics=RubricConfig(), forks=ForkConfig(2, 2))
    (group,) = rollouts.forks
    (fork_tree,) = group.fork_trees
    child, branch = group.branches
    assert child is rollouts.trees[0].nodes[1] and branch is fork_tree.root and branch.intro == child.intro
    (world,) = worlds  # the factory built the main world only; the branch acts on a clone
    assert [a for a, _, _ in events(world)] == ["root/subagent-1"] and events(world)[0][1] == "go to garden"
    assert [t.reply.text for t in branch.turns] == ["<action>take carrot</action>", "<finish>took it</finish>"]
    assert branch.turns[0].valid and "carrot" in branch.turns[0].feedback
    assert world.world.read(lambda s: "carrot" not in s.inventory)  # the main world never saw the take
    assert child.rubric is not None and branch.rubric == child.rubric
    # both are judged on their own world: the branch's clone holds the carrot it took (the goal's recipe wants it
    # roasted and sliced too, so both fail), the main world's child never took it
    assert "carrot is collected" in branch.judge_reason and "carrot is collected" not in child.judge_reason
    assert (child.label, branch.label) == (0.0, 0.0) and group.arrays()[2].all()


def test_a_child_cut_before_its_first_turn_is_judged(planned):
    """The turn cap cuts whatever still waits, children that never began included (rubric-guided search at
    evaluation met one: it never joined the world, so it has no agent of its own); its judge request is rendered
    from where its parent stands, with an empty trajectory."""
    task = planned[0].trees[0].task
    world, tree = TextWorldTreeWorld(task), Tree(task, 0, 0, 0, TreeLimits())
    root = tree.add_root(world.root_goal())
    root.intro = world.begin(root)
    child = Node(id=1, parent=root.id, depth=1, goal=Goal(dish_goal(["dish_1"])), budget=20)
    tree.nodes.append(child)
    request = world.judge_request(child)
    assert request.trajectory == "" and not request.finished
    assert request.final_state == world.judge_request(root).final_state  # the root's view
