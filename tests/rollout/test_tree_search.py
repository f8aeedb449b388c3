"""Rubric-guided search at inference (agentjax/rollout/tree_search.py) on TextCraft-Synth with planner trees.

Checked: every delegated child runs as N candidate subtrees on clones; the candidate the rubric grades best is
committed (its replies become the child's, its world the tree's), so a tree whose first candidates idle still
succeeds; siblings are resolved one at a time (a child's candidates open only after the previous child committed);
the fork cap stops further candidates and the parent is told to do the subtask itself; a failed rubric falls back
to candidate 0; search and forks do not mix.
"""

from __future__ import annotations

import types

import jax
import pytest

from agentjax.agents.judge import ProgramJudge
from agentjax.agents.textcraft_tree import PlannerTeacher, TextCraftTreeWorld
from agentjax.agents.tree import Status
from agentjax.models import SamplingParams, load_tokenizer
from agentjax.models.tokenizer import ENDOFTEXT_ID, IM_END_ID
from agentjax.rollout.tree_collect import TreeCollectConfig, run_trees, tree_stats
from agentjax.rollout.tree_rubrics import ForkConfig, RubricConfig
from agentjax.rollout.tree_search import NOT_RUN, SearchConfig
from envs.textcraft import TextCraftSynthEnv

STOPS = (IM_END_ID, ENDOFTEXT_ID)
CONFIG = TreeCollectConfig(trees_per_task=1, max_prompt_tokens=8192, sampling=SamplingParams(
    max_new_tokens=384, stop_token_ids=STOPS, prompt_bucket=256))
IDLE = "<python>\nview_inventory()\n</python>"


def _no_sampling(*args, **kwargs):
    raise AssertionError("a teacher run samples nothing")


@pytest.fixture(scope="module")
def policy():
    return types.SimpleNamespace(tokenizer=load_tokenizer(), generate=_no_sampling)


@pytest.fixture(scope="module")
def task():
    return next(t for t in TextCraftSynthEnv.tasks("val") if t.meta["difficulty"] == "medium")


def teacher(idle_candidate: int):
    planner = PlannerTeacher()

    def reply(tree, node):  # candidate `idle_candidate` of every search idles; the rest follow the planner
        if tree.search and tree.fork[2] == idle_candidate:
            return IDLE
        return planner(tree, node)

    return reply


def test_the_best_graded_candidate_is_committed(policy, task):
    rollouts = run_trees([task], policy, TextCraftTreeWorld, ProgramJudge(), CONFIG, jax.random.key(0),
                         teacher=teacher(0), rubrics=RubricConfig(), search=SearchConfig(candidates=2))
    (tree,) = rollouts.trees
    assert tree.root_success  # every child's committed candidate crafted its targets
    assert rollouts.searches and all(g.chosen == 1 and not g.reason for g in rollouts.searches)
    main = [g for g in rollouts.searches if g.tree == 0]
    assert {g.child.id for g in main} == {n.id for n in tree.nodes[1:]}  # every child of the main tree searched
    for group in rollouts.searches:
        idle, good = group.roots
        assert group.scores[0] == 0.0 and group.scores[1] > 0  # the idler did not finish: 0 without a call
        assert idle.status is Status.EXHAUSTED and good.status is Status.FINISHED
        if group.tree == 0:
            child = group.child
            assert child.status is Status.FINISHED and child.turns == good.turns and child.label == 1.0
    stats = tree_stats(rollouts)
    assert stats["search/groups"] == len(rollouts.searches) and stats["search/later_won"] == 1.0
    assert stats["search/candidates"] == 2 * len(rollouts.searches) and stats["search/not_run"] == 0
    assert stats["search/chosen_verified"] == stats["search/any_verified"] == 1.0  # labels: diagnostics only


def test_siblings_are_resolved_one_at_a_time(policy, task):
    rollouts = run_trees([task], policy, TextCraftTreeWorld, ProgramJudge(), CONFIG, jax.random.key(0),
                         teacher=teacher(1), rubrics=RubricConfig(), search=SearchConfig(candidates=2))
    (tree,) = rollouts.trees
    siblings = [n for n in tree.nodes if len(n.children) > 1]
    assert siblings, "the planner tree has a node that delegates several children"
    order = {id(g.child): i for i, g in enumerate(rollouts.searches)}
    for parent in siblings:  # the groups of one parent's children open in order, each after the previous
        groups = sorted((order[id(tree.nodes[c])], c) for c in parent.children)
        assert [c for _, c in groups] == sorted(parent.children)
    assert tree.root_success and all(g.chosen == 0 for g in rollouts.searches)  # candidate 0 planned, 1 idled


def test_the_fork_cap_leaves_children_to_their_parent(policy, task):
    rollouts = run_trees([task], policy, TextCraftTreeWorld, ProgramJudge(), CONFIG, jax.random.key(0),
                         teacher=teacher(0), rubrics=RubricConfig(), search=SearchConfig(candidates=2, fork_cap=2))
    (tree,) = rollouts.trees
    assert len(rollouts.searches) == 1 and rollouts.searches_not_run >= 1
    skipped = [n for n in tree.nodes if n.finish_message == NOT_RUN]
    assert skipped and all(n.status is Status.CUT and not n.turns for n in skipped)
    parent = tree.nodes[skipped[0].parent]
    assert any(NOT_RUN in u.feedback for u in parent.turns)
    assert tree_stats(rollouts)["search/not_run"] == rollouts.searches_not_run


def test_a_failed_rubric_falls_back_to_the_first_candidate_and_bad_combinations_raise(policy, task):
    rubrics = RubricConfig(min_criteria=7)  # the reference rubric has 3 criteria: it never parses
    rollouts = run_trees([task], policy, TextCraftTreeWorld, ProgramJudge(), CONFIG, jax.random.key(0),
                         teacher=teacher(1), rubrics=rubrics, search=SearchConfig(candidates=2, fork_cap=2))
    (group,) = rollouts.searches
    assert group.chosen == 0 and group.reason == "the rubric did not parse"
    with pytest.raises(ValueError, match="do not mix"):
        run_trees([task], policy, TextCraftTreeWorld, ProgramJudge(), CONFIG, jax.random.key(0), teacher=teacher(1),
                  rubrics=RubricConfig(), search=SearchConfig(), forks=ForkConfig(2, 2))
    with pytest.raises(ValueError, match="graded with rubrics"):
        run_trees([task], policy, TextCraftTreeWorld, ProgramJudge(), CONFIG, jax.random.key(0), teacher=teacher(1),
                  search=SearchConfig())
