"""RAO's per-row credit on a hand-built TreeBatch (tests/train/tree_batches.py) against a NumPy reference with explicit
loops: execution (binary child labels, root outcomes, LOO over the K trees, the zero-variance filter, depth weights)
and decomposition (leaf coverage of launch events), hand-checked numbers, the trained tokens of each stage."""

from __future__ import annotations

import numpy as np
import pytest

from agentjax.agents.grammar import Role
from agentjax.train.config import RAOCredit
from agentjax.train.tree_credit import row_credit
from tests.train.tree_batches import hand_batch, hand_trees, reference_rows


def rows_of(batch):
    s = batch.steps
    real = np.asarray(s.row_mask)
    keys = zip(*(np.asarray(x)[real].tolist() for x in (s.group, s.rollout, s.node, s.step)), strict=True)
    return list(keys), real


@pytest.mark.parametrize("stage", ["execution", "decomposition"])
@pytest.mark.parametrize("filter_zero_variance", [True, False])
@pytest.mark.parametrize("depth_weighting", ["trajectory", "sample", "none"])
def test_row_credit_matches_the_numpy_reference(stage, filter_zero_variance, depth_weighting):
    trees, batch = hand_trees(), hand_batch()
    credit = RAOCredit(filter_zero_variance=filter_zero_variance, depth_weighting=depth_weighting)
    got = row_credit(batch, credit, stage)
    want = reference_rows(trees, stage, filter_zero_variance=filter_zero_variance, depth_weighting=depth_weighting)
    keys, real = rows_of(batch)
    adv, sample = np.asarray(got.advantage)[real], np.asarray(got.sample)[real]
    assert {k for k, s in zip(keys, sample, strict=True) if s} == set(want)
    for k, a, s in zip(keys, adv, sample, strict=True):
        assert a == pytest.approx(want.get(k, 0.0), abs=1e-6), k
        assert s or a == 0.0
    assert not np.asarray(got.sample)[~np.asarray(batch.steps.row_mask)].any()  # padding never trains


def test_hand_checked_execution_numbers():
    """Task 0: outcomes (1, 0, 1), baselines (0.5, 1, 0.5); the unlabelled child of tree 2 is dropped. Depth
    weights: n = (3, 2, 1) nodes and c = (8, 4, 2) turns at depths 0, 1, 2 -> w = (0.7, 1.05, 2.1). Task 1 (all 0)
    is filtered."""
    batch = hand_batch()
    got = row_credit(batch, RAOCredit(), "execution")
    keys, real = rows_of(batch)
    adv = dict(zip(keys, np.asarray(got.advantage)[real].tolist(), strict=True))
    expect = {(0, 0, 0): 0.5 * 0.7, (0, 0, 1): 0.5 * 1.05, (0, 0, 2): -0.5 * 1.05, (0, 0, 3): 0.5 * 2.1,
              (0, 1, 0): -1.0 * 0.7, (0, 2, 0): 0.5 * 0.7, (0, 2, 1): 0.0}
    for (g, k, q), value in expect.items():
        for key in [x for x in keys if x[:3] == (g, k, q)]:
            assert adv[key] == pytest.approx(value, abs=1e-6), key
    assert float(got.stats["kept_tasks"]) == 0.5 and float(got.stats["samples"]) == 6  # 6 nodes of task 0
    assert not any(adv[k] for k in keys if k[0] == 1)


def test_hand_checked_leaf_coverage():
    """Tree 0 of task 0: leaves {2, 3}; the root's event (children 1, 2) covers both (1.0), node 1's (child 3) one
    (0.5): tree mean 0.75. Tree 1: a refused delegation (0). Tree 2: its one child is its only leaf (1.0)."""
    batch = hand_batch()
    got = row_credit(batch, RAOCredit(depth_weighting="none"), "decomposition")
    keys, real = rows_of(batch)
    adv = dict(zip(keys, np.asarray(got.advantage)[real].tolist(), strict=True))
    assert adv[(0, 0, 0, 0)] == pytest.approx(1.0 - (0.0 + 1.0) / 2)
    assert adv[(0, 0, 1, 0)] == pytest.approx(0.5 - 0.5)
    assert adv[(0, 1, 0, 1)] == pytest.approx(0.0 - (0.75 + 1.0) / 2)
    assert adv[(0, 2, 0, 0)] == pytest.approx(1.0 - (0.75 + 0.0) / 2)
    sampled = {k for k, s in zip(keys, np.asarray(got.sample)[real], strict=True) if s}
    assert sampled == {(0, 0, 0, 0), (0, 0, 1, 0), (0, 1, 0, 1), (0, 2, 0, 0)}  # event rows of task 0 only


@pytest.mark.parametrize("stage, role", [("execution", Role.EXECUTION), ("decomposition", Role.DELEGATION)])
def test_each_stage_trains_its_role_tokens_of_sampled_rows_only(stage, role):
    batch = hand_batch()
    got = row_credit(batch, RAOCredit(), stage)
    mask, sample = np.asarray(got.token_mask), np.asarray(got.sample)
    roles = np.asarray(batch.role)
    np.testing.assert_array_equal(mask, np.asarray(batch.steps.response_mask) & (roles == role) & sample[:, None])
    assert mask.any() and not (mask & (roles != role)).any()
    assert float(got.stats["trained_tokens"]) == mask.sum()


def test_a_batch_without_signal_samples_nothing():
    trees = [t for t in hand_trees() if t.group == 1]
    for t in trees:
        t.group = 0
    for t in hand_trees()[3:]:  # a second all-failing task
        trees.append(t)
    batch = hand_batch(trees)
    for stage in ("execution", "decomposition"):
        got = row_credit(batch, RAOCredit(), stage)
        assert not np.asarray(got.sample).any() and not np.asarray(got.advantage).any()
        assert float(got.stats["kept_tasks"]) == 0.0


def test_unknown_stage_is_an_error():
    with pytest.raises(ValueError, match="RAO trains the stages"):
        row_credit(hand_batch(), RAOCredit(), "rubric")
