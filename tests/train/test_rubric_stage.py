"""SERA's rubric stage (agentjax/train/rubric_stage.py): fork groups → [G, F, I] arrays → one row per rubric.

Checked on fork groups grown by the collector (planner children; odd branches idle and fail): the group slots and
arrays, one row per group whose rubric parsed holding exactly the rubric call's tokens and log-probs, the advantages
against a NumPy reference of the ranking reward and its leave-one-out baseline within each root task (no depth
weighting), a group without a rubric gives no row; one CISPO step on the rows moves the policy (a tiny Qwen) and
only the rubric rows' tokens count; the trainer runs a rubric-stage step and logs its fork statistics.
"""

from __future__ import annotations

import dataclasses
import types

import jax
import numpy as np
import pytest

from agentjax.agents.judge import ProgramJudge
from agentjax.agents.textcraft_tree import PlannerTeacher, TextCraftTreeWorld
from agentjax.models import SamplingParams, load_tokenizer
from agentjax.models.tokenizer import ENDOFTEXT_ID, IM_END_ID
from agentjax.rollout.tree_collect import TreeCollectConfig, run_trees
from agentjax.rollout.tree_rubrics import ForkConfig, RubricConfig
from agentjax.train.config import SERACredit
from agentjax.train.rubric_stage import group_slots, rubric_credit_rows, rubric_rows
from envs.textcraft import TextCraftSynthEnv

STOPS = (IM_END_ID, ENDOFTEXT_ID)
TEACH = TreeCollectConfig(trees_per_task=2, max_prompt_tokens=8192, sampling=SamplingParams(
    max_new_tokens=384, stop_token_ids=STOPS, prompt_bucket=256))
FORKS = ForkConfig(branches=3, budget=6)


def _no_sampling(*args, **kwargs):
    raise AssertionError("a teacher run samples nothing")


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer()


@pytest.fixture(scope="module")
def forked(tokenizer):
    tasks = [t for t in TextCraftSynthEnv.tasks("val") if t.meta["difficulty"] == "medium"][:2]
    planner = PlannerTeacher()

    def teach(tree, node):  # branch 1 idles (fails); tree 1's branch 2 idles too, so groups differ in their ranking
        if tree.fork is not None and (tree.fork[2] == 1 or (tree.index == 1 and tree.fork[2] == 2)):
            return "<python>\nview_inventory()\n</python>"
        return planner(tree, node)

    policy = types.SimpleNamespace(tokenizer=tokenizer, generate=_no_sampling)
    rollouts = run_trees(tasks, policy, TextCraftTreeWorld, ProgramJudge(), TEACH, jax.random.key(0), teacher=teach,
                         rubrics=RubricConfig(), forks=FORKS)
    for n, group in enumerate(rollouts.forks):  # the reference grades separate by >= 0.2: narrow some gaps
        child = group.child
        child.grade = dataclasses.replace(child.grade, final_score=[0.05, 0.1, 0.9, 1.0][n % 4])
    return rollouts


def _reference(score, success, valid, margin=0.2):
    """Ranking reward per group and the LOO advantage over the usable groups of each root task (NumPy loops)."""
    g_size, f_size, _ = score.shape
    reward, usable = np.zeros((g_size, f_size)), np.zeros((g_size, f_size), bool)
    for g in range(g_size):
        for f in range(f_size):
            v = valid[g, f]
            pos, neg = np.flatnonzero(v & success[g, f]), np.flatnonzero(v & ~success[g, f])
            if v.sum() >= 2 and len(pos) and len(neg):
                usable[g, f] = True
                reward[g, f] = -np.mean([max(0.0, margin - (score[g, f, i] - score[g, f, j])) for i in pos
                                         for j in neg])
    adv = np.zeros((g_size, f_size))
    for g in range(g_size):
        idx = np.flatnonzero(usable[g])
        for f in idx:
            others = [reward[g, h] for h in idx if h != f]
            adv[g, f] = reward[g, f] - np.mean(others) if others else 0.0
    return reward, usable, adv


def test_rubric_rows_and_credit_match_the_reference(forked, tokenizer):
    slots = group_slots(forked, FORKS)
    assert len(slots) == len(forked.forks) == 8 and len(set(slots)) == 8  # 2 tasks x 2 trees x 2 groups
    rows = rubric_rows(forked, FORKS, prompt_len=8192, response_len=384, capacity=16)
    assert rows.rows == 8 and rows.score_gfi.shape == (2, 4, 3)
    steps = rows.steps
    for r, group in enumerate(forked.forks):  # one row per group: the rubric call's tokens and log-probs
        call = group.child.rubric_call
        m = len(call.response_ids)
        np.testing.assert_array_equal(np.asarray(steps.response_tokens)[r, :m], call.response_ids)
        assert np.asarray(steps.response_mask)[r].sum() == m and tuple(rows.slot_gf[r]) == slots[r]
        assert int(steps.node[r]) == group.child.id and int(steps.depth[r]) == group.child.depth
    assert not np.asarray(steps.row_mask)[8:].any()
    credit = rubric_credit_rows(rows, SERACredit(filter_zero_variance=False, depth_weighting="none", branches=3,
                                                 fork_budget=6), max_depth=3)
    reward, usable, adv = _reference(rows.score_gfi, rows.success_gfi, rows.valid_gfi)
    assert usable.all() and np.ptp(adv) > 0  # every group mixed; different rankings, different advantages
    want = np.array([adv[g, f] for g, f in slots])
    np.testing.assert_allclose(np.asarray(credit.advantage)[:8], want, atol=1e-6)
    assert np.asarray(credit.sample)[:8].all() and float(credit.stats["usable_groups"]) == 8
    np.testing.assert_allclose(float(credit.stats["reward_mean"]), reward.mean(), atol=1e-6)


def test_a_group_without_a_rubric_gives_no_row(forked):
    group = forked.forks[0]
    saved = group.child.rubric
    try:
        group.child.rubric = None
        rows = rubric_rows(forked, FORKS, prompt_len=8192, response_len=384, capacity=16)
    finally:
        group.child.rubric = saved
    assert rows.rows == 7 and not rows.valid_gfi[slots := group_slots(forked, FORKS)[0]].any()
    assert slots not in [tuple(s) for s in rows.slot_gf[:7]]


@pytest.mark.slow  # end to end: `make test-slow` (README, "Tests")
def test_the_trainer_runs_a_rubric_stage_step(tmp_path):
    from agentjax.train.metrics import read_metrics
    from agentjax.train.trainer import train
    from agentjax.train.trees import NoSignalError
    from tests.train.test_trainer_trees import TREE, small_run

    tree = dataclasses.replace(TREE, rubric_tokens=320, grade_tokens=96, rubric_choices=True, max_skipped_batches=0)
    run = small_run(tmp_path, eval_every=0, checkpoint_every=0, tree=tree)
    credit = SERACredit(stages=(0, 0, 1), branches=2, fork_budget=4, filter_zero_variance=False)
    run = run.replace(train=run.train.replace(credit=credit))
    assert run.fork_collect.branches == 2
    try:
        train(run)
    except NoSignalError:
        pass  # the random policy's branches rarely differ in outcome: no mixed group, no step
    (line,) = read_metrics(tmp_path)[:1]
    assert line["schedule/stage"] == 2 and "rubric/requests" in line
    if line["tree/nodes"] > 1:
        assert line["fork/groups"] >= 1 and line["fork/branches"] == 2 * line["fork/groups"]


@pytest.mark.slow  # a compile of the update at rubric lengths: `make test-slow`
def test_one_cispo_step_on_the_rubric_rows(forked):
    from flax import nnx

    from agentjax.models import Qwen
    from agentjax.train.config import LossConfig, ModelConfig, OptimizerConfig, RolloutConfig, TrainConfig
    from agentjax.train.presets import tiny_tree_arch
    from agentjax.train.state import init_state, make_optimizer
    from agentjax.train.update import UpdateBatch, make_update
    from tests.train.conftest import leaves_equal

    longest = max(len(g.child.rubric_call.prompt_ids) for g in forked.forks)
    reply = max(len(g.child.rubric_call.response_ids) for g in forked.forks)
    rows = rubric_rows(forked, FORKS, prompt_len=longest + (-longest % 64), response_len=reply + (-reply % 32),
                       capacity=8)
    credit = SERACredit(filter_zero_variance=False, branches=3, fork_budget=6)
    row_credit = rubric_credit_rows(rows, credit)
    config = TrainConfig(model=ModelConfig(tiny_tree_arch(d_model=32, mlp_dim=64, num_layers=1, head_dim=8)),
                         rollout=RolloutConfig(num_groups=2, group_size=2, max_steps=2, prompt_len=rows.steps.
                                               prompt_tokens.shape[1], response_len=reply + (-reply % 32),
                                               capacity=8),
                         credit=credit, loss=LossConfig(kl_coef=0.0, entropy_coef=0.0, logprob_chunk=32,
                                                        logprob_remat=False),
                         optimizer=OptimizerConfig(learning_rate=1e-2), micro_batch_size=8, compact_rows=False)
    model = Qwen(config.model.arch, rngs=nnx.Rngs(0))
    tx = make_optimizer(config.optimizer)
    state = init_state(config, model, jax.random.key(0), tx, schedule=True)
    before = jax.tree.map(lambda x: x.copy(), state.params)
    batch = UpdateBatch(rows.steps, row_credit.advantage, row_mask=row_credit.sample,
                        token_mask=row_credit.token_mask)
    state, metrics = make_update(config, model, tx)(state, batch, None)
    assert float(metrics["tokens"]) == float(row_credit.stats["trained_tokens"]) > 0
    assert float(metrics["skipped"]) == 0 and not leaves_equal(before, state.params)
