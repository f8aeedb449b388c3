"""SERA's rubric writing and grading in the tree collector (agentjax/rollout/tree_rubrics.py) on TextCraft-Synth.

Checked: with planner trees and reference rubrics every child gets a frozen rubric before its first turn, a grade
consistent with its verifier label and a score that becomes its reward in the tree arrays (``child_reward="score"``),
with counters and a printed rubric line; with a scripted policy writing the rubrics and grades, all rubrics of a turn
are one batched generate call and all grades of a turn another, a rubric that does not parse leaves its child
ungraded and out of the gradient (label_mask False), an inconsistent grade is a counted failure, the weighted reading
gives gate · Σ w s, and an unfinished child scores 0 without a grading call.
"""

from __future__ import annotations

import json
import types

import jax
import numpy as np
import pytest

from agentjax.agents.grammar import format_call
from agentjax.agents.judge import ProgramJudge
from agentjax.agents.rubric import reference_rubric
from agentjax.agents.textcraft_tree import PlannerTeacher, TextCraftTreeWorld
from agentjax.agents.tree import TreeLimits, render_tree
from agentjax.models import SamplingParams, load_tokenizer
from agentjax.models.tokenizer import ENDOFTEXT_ID, IM_END_ID
from agentjax.rollout.calls import scripted_output
from agentjax.rollout.tree_collect import TreeCollectConfig, run_trees, to_tree_batch, tree_stats
from agentjax.rollout.tree_rubrics import RubricConfig
from envs.textcraft import TextCraftSynthEnv

STOPS = (IM_END_ID, ENDOFTEXT_ID)
TEACH = TreeCollectConfig(trees_per_task=2, max_prompt_tokens=8192, sampling=SamplingParams(
    max_new_tokens=384, stop_token_ids=STOPS, prompt_bucket=256))


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer()


@pytest.fixture(scope="module")
def tasks():
    return [t for t in TextCraftSynthEnv.tasks("val") if t.meta["difficulty"] == "medium"][:2]


class ScriptedPolicy:
    """Writes rubrics and grades from canned texts (node turns come from the planner teacher); records its calls."""

    def __init__(self, tokenizer, grade: str):
        self.tokenizer, self.grade, self.calls = tokenizer, grade, []

    def generate(self, prompts, params, key, **kwargs):
        texts = [self.tokenizer.decode(p) for p in prompts]
        kind = "rubric" if "Write its rubric" in texts[0] else "grade"
        assert all(("Write its rubric" in t) == (kind == "rubric") for t in texts)  # one kind per call
        self.calls.append((kind, len(prompts), params.temperature))
        if kind == "rubric":  # every second child's rubric does not parse
            n = sum(c[1] for c in self.calls if c[0] == "rubric") - len(prompts)
            answers = [reference_rubric("x").to_json() if (n + i) % 2 == 0 else "a rubric: {criteria: none}"
                       for i in range(len(prompts))]
        else:
            answers = [self.grade] * len(prompts)
        return scripted_output(self.tokenizer, answers, params.max_new_tokens, params.stop_token_ids[0])


def test_reference_rubrics_grade_every_child_and_become_its_reward(tokenizer, tasks):
    def generate(*args, **kwargs):
        raise AssertionError("reference rubrics and grades sample nothing")

    policy = types.SimpleNamespace(tokenizer=tokenizer, generate=generate)
    rollouts = run_trees(tasks, policy, TextCraftTreeWorld, ProgramJudge(), TEACH, jax.random.key(0),
                         teacher=PlannerTeacher(), rubrics=RubricConfig())
    children = [n for t in rollouts.trees for n in t.nodes[1:]]
    assert children and all(t.child_reward == "score" for t in rollouts.trees)
    for child in children:
        assert child.rubric is not None and child.rubric_call.error == "" and child.label == 1.0
        assert child.grade.success and 0 < child.score <= 1 and child.score == child.grade.final_score
        assert len(child.rubric_call.response_ids) > 10 and child.rubric_call.response_ids[-1] == IM_END_ID
    stats = tree_stats(rollouts)
    assert stats["rubric/requests"] == len(children) == stats["grade/requests"]
    assert stats["rubric/calls"] == 0 and stats["rubric/failures"] == 0 and stats["grade/agreement"] == 1.0
    tree = rollouts.trees[0]
    arrays = tree.arrays(64)
    for node in tree.nodes[1:]:  # the tree arrays carry the score as the child's reward
        assert arrays["label"][node.id] == pytest.approx(node.score) and arrays["label_mask"][node.id]
    text = render_tree(tree)
    assert "rubric: completion 0.60=1.00" in text and "(rubric score)" in text and "verifier label 1" in text
    batch = to_tree_batch(rollouts, TEACH)  # rubric calls are not rows of the node-turn batch
    assert int(batch.steps.row_mask.sum()) == sum(len(n.turns) for t in rollouts.trees for n in t.nodes)


def test_policy_rubrics_and_grades_are_batched_and_failures_leave_children_untrained(tokenizer, tasks):
    grade = json.dumps({"success": True, "criterion_scores": [{"name": "completion", "score": 1.0},
                                                              {"name": "report", "score": 0.5}],
                        "final_score": 0.9})
    policy = ScriptedPolicy(tokenizer, grade)
    config = RubricConfig(scripted=False, reading="weighted")
    rollouts = run_trees(tasks, policy, TextCraftTreeWorld, ProgramJudge(), TEACH, jax.random.key(0),
                         teacher=PlannerTeacher(), rubrics=config)
    children = [n for t in rollouts.trees for n in t.nodes[1:]]
    rubric_calls = [c for c in policy.calls if c[0] == "rubric"]
    grade_calls = [c for c in policy.calls if c[0] == "grade"]
    launches = sum(bool(u.children) for t in rollouts.trees for n in t.nodes for u in n.turns)
    # one rubric call per turn that launched children (in any tree), padded to the batch bucket: fewer calls than
    # launches when trees launch in the same turn
    assert all(c[1] % config.batch_bucket == 0 for c in policy.calls) and len(rubric_calls) < launches
    assert len(children) <= sum(c[1] for c in rubric_calls) < len(children) + config.batch_bucket * len(rubric_calls)
    assert all(c[2] == 1.0 for c in rubric_calls) and all(c[2] == 0.0 for c in grade_calls)
    failed = [c for c in children if c.rubric is None]
    graded = [c for c in children if c.rubric is not None]
    assert failed and graded and all("criteria" in c.rubric_call.error for c in failed)
    assert all(c.score is None and c.grade is None for c in failed)
    for c in graded:  # weighted reading: completion 0.6 * 1 + report 0.2 * 0.5 (efficiency left out: 0)
        assert c.score == pytest.approx(0.6 + 0.1)
    stats = tree_stats(rollouts)
    assert stats["rubric/failures"] == len(failed) and stats["grade/ungraded"] == len(failed)
    assert stats["grade/requests"] == len(graded) and stats["rubric/calls"] == len(rubric_calls)
    tree = next(t for t in rollouts.trees if any(n.rubric is None for n in t.nodes[1:]))
    arrays = tree.arrays(64)
    for node in tree.nodes[1:]:
        assert arrays["label_mask"][node.id] == (node.rubric is not None)


def test_inconsistent_grades_are_failures_and_unfinished_children_score_zero(tokenizer, tasks):
    bad = json.dumps({"success": False, "final_score": 0.4})
    policy = ScriptedPolicy(tokenizer, bad)
    rollouts = run_trees(tasks[:1], policy, TextCraftTreeWorld, ProgramJudge(), TEACH.replace(trees_per_task=1),
                         jax.random.key(0), teacher=PlannerTeacher(), rubrics=RubricConfig(scripted=False))
    graded = [n for n in rollouts.trees[0].nodes[1:] if n.rubric is not None]
    assert graded and all(n.score is None and "exactly 0" in n.grade_call.error for n in graded)
    assert tree_stats(rollouts)["grade/failures"] == len(graded)

    item = next(iter(tasks[0].meta["target_items"]))

    def idle(tree, node):  # the root delegates, the children look at the inventory until their budget is spent
        call = f"await {format_call('launch_subagent', {item: 1})}" if node.depth == 0 else "view_inventory()"
        return f"<python>\n{call}\n</python>"

    policy = ScriptedPolicy(tokenizer, bad)
    cut = TEACH.replace(trees_per_task=1, limits=TreeLimits(max_steps=2, max_depth=1))
    rollouts = run_trees(tasks[:1], policy, TextCraftTreeWorld, ProgramJudge(), cut, jax.random.key(0),
                         teacher=idle, rubrics=RubricConfig(scripted=False))
    unfinished = [n for n in rollouts.trees[0].nodes[1:] if n.rubric is not None and not n.finished]
    assert unfinished and all(n.score == 0.0 and n.grade_call is None for n in unfinished)
    assert not any(c[0] == "grade" for c in policy.calls)
    assert np.isclose(tree_stats(rollouts)["grade/unfinished"], len(unfinished))


def test_saved_trees_keep_rubrics_grades_and_scores(tokenizer, tasks):
    from agentjax.agents.tree_io import tree_from_dict, tree_to_dict

    grade = json.dumps({"success": True, "final_score": 0.9})
    rollouts = run_trees(tasks[:1], ScriptedPolicy(tokenizer, grade), TextCraftTreeWorld, ProgramJudge(),
                         TEACH.replace(trees_per_task=1), jax.random.key(0), teacher=PlannerTeacher(),
                         rubrics=RubricConfig(scripted=False))
    (tree,) = rollouts.trees
    back = tree_from_dict(json.loads(json.dumps(tree_to_dict(tree))))
    assert back.child_reward == "score"
    for a, b in zip(tree.nodes, back.nodes, strict=True):
        assert (a.rubric, a.grade, a.score) == (b.rubric, b.grade, b.score)
        assert (a.rubric_call is None) == (b.rubric_call is None)
        if a.rubric_call is not None:
            assert (a.rubric_call.text, a.rubric_call.error) == (b.rubric_call.text, b.rubric_call.error)
    assert render_tree(back) == render_tree(tree)


@pytest.mark.slow  # a sampler compile at rubric lengths; the tree loop's SERA test covers the same path
def test_a_tiny_qwen_writes_and_grades_constrained_rubrics(tokenizer, tasks):
    from flax import nnx

    from agentjax.agents.rubric import grade_choices, rubric_choices
    from agentjax.agents.textcraft_tree import TextCraftTreeConfig
    from agentjax.models import Qwen, QwenConfig, Sampler

    model = Qwen(QwenConfig.tiny_qwen3(vocab_size=151_936, d_model=32, mlp_dim=64, num_layers=1, head_dim=8),
                 rngs=nnx.Rngs(0))
    sampler = Sampler(model, tokenizer)
    calls = []

    class Recording:
        tokenizer = sampler.tokenizer

        def generate(self, prompts, params, key, **kwargs):
            calls.append((len(prompts), params.temperature, "allowed" in kwargs))
            return sampler.generate(prompts, params, key, **kwargs)

    config = TreeCollectConfig(
        trees_per_task=2, limits=TreeLimits(max_steps=3, max_depth=1, max_nodes=8), max_turns=6,
        sampling=SamplingParams(temperature=1.0, max_new_tokens=48, stop_token_ids=STOPS, prompt_bucket=1024),
        max_prompt_tokens=2048, constrained=True, masked_logp=True, max_allowed=16, batch_bucket=8)
    rubrics = RubricConfig(constrained=True, max_prompt_tokens=2048, writing=SamplingParams(
        temperature=1.0, max_new_tokens=256, stop_token_ids=STOPS, prompt_bucket=1024), grading=SamplingParams(
        temperature=0.0, max_new_tokens=96, stop_token_ids=STOPS, prompt_bucket=1024))
    rollouts = run_trees(tasks[1:2], Recording(), lambda t: TextCraftTreeWorld(t, config=TextCraftTreeConfig(
        show_recipes=False)), ProgramJudge(), config, jax.random.key(3), rubrics=rubrics)
    children = [n for t in rollouts.trees for n in t.nodes[1:]]
    assert children, "the random policy delegated nothing; pick another key"
    for child in children:  # a random policy under the constraint writes and grades only well-formed answers
        assert child.rubric is not None and child.rubric_call.text in rubric_choices(child.goal.text, child.budget)
        assert child.rubric_call.choices == tuple(rubric_choices(child.goal.text, child.budget))
        if child.grade_call is not None:
            assert child.grade_call.text in grade_choices(child.rubric) and child.score is not None
    stats = tree_stats(rollouts)
    assert stats["rubric/failures"] == 0 and stats["grade/failures"] == 0 and stats["rubric/calls"] >= 1
    assert any(c[2] for c in calls) and all(c[0] % 8 == 0 for c in calls)


def test_fork_groups_branch_on_clones_and_leave_the_main_trees_untouched(tokenizer, tasks):
    from agentjax.rollout.tree_rubrics import ForkConfig

    planner = PlannerTeacher()

    def teach(tree, node):  # odd branches idle (they fail), the rest follow the planner
        if tree.fork is not None and tree.fork[2] % 2 == 1:
            return "<python>\nview_inventory()\n</python>"
        return planner(tree, node)

    config = TEACH.replace(trees_per_task=1)
    no_model = ScriptedPolicy(tokenizer, "")  # a teacher plays the nodes, reference rubrics and grades: no calls
    plain = run_trees(tasks, no_model, TextCraftTreeWorld,
                      ProgramJudge(), config, jax.random.key(0), teacher=teach, rubrics=RubricConfig())
    forked = run_trees(tasks, no_model, TextCraftTreeWorld,
                       ProgramJudge(), config, jax.random.key(0), teacher=teach, rubrics=RubricConfig(),
                       forks=ForkConfig(branches=3, budget=6))
    assert len(forked.trees) == len(plain.trees) == 2 and all(t.fork is None for t in forked.trees)
    for a, b in zip(plain.trees, forked.trees, strict=True):  # branches ran on clones: the trees are the same
        assert [[u.reply.text for u in n.turns] for n in a.nodes] == [[u.reply.text for u in n.turns] for n in b.nodes]
        assert a.root_success == b.root_success
    assert len(forked.forks) == 4  # budget 6 / 3 branches = 2 groups in each tree, for its first two children
    for group in forked.forks:
        tree = forked.trees[group.tree]
        assert group.child in tree.nodes and group.child.id in (1, 2) and len(group.branches) == 3
        assert group.child.rubric is not None and all(b.rubric == group.child.rubric for b in group.branches)
        for branch, fork_tree in zip(group.branches[1:], group.fork_trees, strict=True):
            assert fork_tree.root is branch and fork_tree.fork[:2] == (group.tree, group.child.id)
            assert (branch.depth, branch.goal, branch.intro) == (group.child.depth, group.child.goal,
                                                                 group.child.intro)
        score, label, valid = group.arrays()
        assert label.tolist() == [True, False, True] and valid.all()  # graded, or 0 for the idle branch
        assert score[0] > 0 and score[1] == 0 and score[2] > 0
    others = [n for t in forked.trees for n in t.nodes[1:] if all(n is not g.child for g in forked.forks)]
    assert others and all(n.rubric is None and n.score is None for n in others)  # rubric stage: fork groups only
    stats = tree_stats(forked)
    assert stats["fork/groups"] == 4 and stats["fork/mixed"] == 1.0 and stats["fork/graded"] == 1.0
    assert stats["rubric/requests"] == 4 and no_model.calls == []


def test_capped_worlds_fork_and_adopt_capped(tokenizer, tasks):
    from agentjax.agents.tree import Tree
    from agentjax.train.tree_worlds import CappedReplies, world_factory

    factory = world_factory("textcraft_synth", {"show_recipes": False}, tokenizer=tokenizer, max_reply_tokens=24)
    world = factory(tasks[0])
    tree = Tree(tasks[0], 0, 0, 0, TEACH.limits)
    root = tree.add_root(world.root_goal())
    root.intro = world.begin(root)
    twin = world.fork(root)
    assert isinstance(twin, CappedReplies) and twin.inner is not world.inner
    assert twin.admissible(tree, root) == world.admissible(tree, root)  # capped like the original
    assert all(len(tokenizer.encode(r, add_special_tokens=False)) < 24 for r in twin.admissible(tree, root))
    item = next(iter(twin.inner.world.inventory()))
    twin.inner.world._env.inventory[item] = 99  # the clone changes; the original does not until it adopts it
    assert world.inner.world.inventory()[item] != 99
    world.adopt(twin)
    assert world.inner.world.inventory()[item] == 99


@pytest.mark.slow  # for CI time: `make test-slow` (README, "Tests")
def test_sparse_and_one_pass_rubric_calls_choose_and_score_like_dense_ones(tokenizer):
    """``RubricConfig.sparse_logits`` (constrained rubric and grade calls from the allowed tokens' logits only) and
    ``one_pass`` (the tiny presets: the whole answers scored in one pass, Sampler.choose) pick the same greedy answer
    with the same constrained log-probs as the dense decode loop."""
    from flax import nnx

    from agentjax.agents.rubric import grade_choices, rubric_choices
    from agentjax.models import Qwen, QwenConfig, Sampler
    from agentjax.rollout.tree_rubrics import _calls

    model = Qwen(QwenConfig.tiny_qwen3(vocab_size=151_936, d_model=32, mlp_dim=64, num_layers=1, head_dim=8),
                 rngs=nnx.Rngs(1))
    sampler = Sampler(model, tokenizer)
    goals = ["craft 2 oak planks", "craft 1 stick", "get 3 cobblestone"]
    messages = [[{"role": "user", "content": f"Write the rubric for: {g}"}] for g in goals]
    greedy = SamplingParams(temperature=0.0, max_new_tokens=256, stop_token_ids=STOPS, prompt_bucket=64)
    for choices in ([rubric_choices(g, 8) for g in goals],
                    [grade_choices(reference_rubric(g, 8)) for g in goals]):
        dense, sparse, one = (_calls(sampler, tokenizer, messages, None, choices, greedy, RubricConfig(
            constrained=True, **kw), jax.random.key(0)) for kw in ({}, {"sparse_logits": True}, {"one_pass": True}))
        for d, s, o, allowed in zip(dense, sparse, one, choices, strict=True):
            assert d.text == s.text == o.text and d.text in allowed
            np.testing.assert_array_equal(d.response_ids, s.response_ids)
            np.testing.assert_array_equal(d.response_ids, o.response_ids)
            np.testing.assert_allclose(d.logp, s.logp, atol=2e-5)
            np.testing.assert_allclose(d.logp, o.logp, atol=2e-5)
            assert (d.logp <= 0).all() and d.logp.sum() < 0  # a real choice among several answers
