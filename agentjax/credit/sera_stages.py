"""SERA / RAO credit of one update, one stage at a time: rewards → leave-one-out → zero-variance filter → depth.

METHODS.md "SERA" items 3–8. Each optimizer step trains one stage (:mod:`agentjax.train.schedule`) on its own
batch of ``G`` root tasks × ``K`` trees; these jitted functions turn that batch's tree arrays into per-sample
advantages, in the released order (GitHub ``OliverLeeXZ/SERA``): the stage's reward, its leave-one-out
baseline per root task (:mod:`agentjax.credit.sera_baselines`), the zero-variance filter per root task
(``keep_g``; a dropped task trains nothing), then depth weights over every kept sample of the update, multiplied
into the advantages. The trainer broadcasts a sample's ``advantage`` to its rows' trained tokens (execution: the
node's acting / finishing tokens; decomposition: the event reply's delegation span; rubric: the rubric
completion) and optimises CISPO (:mod:`agentjax.losses.cispo`).

Depth weighting (``depth_weighting``, static): ``"trajectory"`` (released: ``n_d`` trajectories, ``c_d`` data),
``"sample"`` (the paper summary's reading: each sample counted once), ``"none"`` (weights 1).
"""

from __future__ import annotations

import functools
from typing import Literal, NamedTuple

import chex
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

from agentjax.credit import sera
from agentjax.credit.sera_baselines import (
    ExecutionBaseline,
    TreeBaseline,
    depth_weights,
    execution_advantage,
    loo_advantage,
    nonconstant,
    tree_loo_advantage,
)

DepthWeighting = Literal["trajectory", "sample", "none"]


class StageCredit(NamedTuple):
    """Per-sample credit of one stage over ``G`` root tasks (``X``: nodes, events, delegations or fork groups)."""

    reward: Float[Array, "G ..."]  # the stage's raw reward
    advantage: Float[Array, "G ..."]  # leave-one-out advantage × depth weight; 0 off `sample`
    sample: Bool[Array, "G ..."]  # trained samples (real, valid, in a kept root task)
    weight: Float[Array, "G ..."]  # depth weight of each datum of the sample
    depth: Int[Array, "G ..."]  # depth the weight was taken at (−1 off the real samples)
    keep_g: Bool[Array, " G"]  # root tasks past the zero-variance filter


def _depth_weights(depth, data, sample, mode: DepthWeighting, max_depth: int):
    if mode == "none":
        return sample.astype(jnp.float32)
    if mode not in ("trajectory", "sample"):
        raise ValueError(f"unknown depth_weighting {mode!r}")
    data = data.astype(jnp.float32) if mode == "trajectory" else jnp.ones(sample.shape, jnp.float32)
    return depth_weights(depth.ravel(), data.ravel(), sample.ravel(), max_depth=max_depth).reshape(sample.shape)


def _keep(adv, sample, filter_zero_variance: bool):
    """Per root task: the zero-variance filter over the task's samples (all ``[G, ...]``)."""
    if not filter_zero_variance:
        return sample.reshape(sample.shape[0], -1).any(-1)
    flat = lambda x: x.reshape(x.shape[0], -1)  # noqa: E731
    return jax.vmap(nonconstant)(flat(adv), flat(sample))


def _finish(reward, adv, sample, depth, data, *, filter_zero_variance, depth_weighting, max_depth) -> StageCredit:
    keep_g = _keep(adv, sample, filter_zero_variance)
    sample = sample & keep_g.reshape((-1,) + (1,) * (sample.ndim - 1))
    weight = _depth_weights(depth, data, sample, depth_weighting, max_depth)
    return StageCredit(reward=reward, advantage=jnp.where(sample, adv * weight, 0.0), sample=sample, weight=weight,
                       depth=jnp.where(sample, depth, -1), keep_g=keep_g)


@functools.partial(jax.jit, static_argnames=("baseline", "filter_zero_variance", "depth_weighting", "max_depth"))
def execution_credit(
    parent_gkq: Int[Array, "G K Q"],
    node_mask_gkq: Bool[Array, "G K Q"],
    child_reward_gkq: Float[Array, "G K Q"],
    graded_gkq: Bool[Array, "G K Q"],
    root_outcome_gk: Float[Array, "G K"],
    rows_gkq: Int[Array, "G K Q"],
    *,
    baseline: ExecutionBaseline = "root",
    filter_zero_variance: bool = True,
    depth_weighting: DepthWeighting = "trajectory",
    max_depth: int = 3,
) -> StageCredit:
    """Execution-stage credit of every node (METHODS.md SERA 3, 6, 8): SERA's rubric scores or RAO's labels.

    ``r`` = :func:`~agentjax.credit.sera.execution_reward` (root: the outcome; children: ``child_reward``, the
    final rubric score for SERA, the binary label for RAO), ``A`` = :func:`execution_advantage` per root task
    over nodes that are real with at least one training row and, for children, graded (a failed grading drops
    the child, released ``drop_trajectory``); depth weights over nodes with ``rows`` data each. The released
    data are prefix-merged sequences (``merge_prefixes``: a node whose turns extend one another's prompts is one
    datum), so pass the number of sequences the trainer trains per node — 1 per node if it merges turns.

    Args:
      parent_gkq: [G, K, Q] parents. node_mask_gkq: [G, K, Q] real nodes. child_reward_gkq: [G, K, Q].
      graded_gkq: [G, K, Q] children whose grading / judging succeeded (ignored at roots).
      root_outcome_gk: [G, K] verified root outcomes. rows_gkq: [G, K, Q] training rows (turns) per node.
    Returns:
      :class:`StageCredit` over [G, K, Q].
    """
    chex.assert_rank([parent_gkq, root_outcome_gk], [3, 2])
    chex.assert_equal_shape([parent_gkq, node_mask_gkq, child_reward_gkq, graded_gkq, rows_gkq])
    over_trees = lambda f: jax.vmap(jax.vmap(f))  # noqa: E731
    reward = over_trees(sera.execution_reward)(parent_gkq, node_mask_gkq, child_reward_gkq, root_outcome_gk)
    depth = over_trees(functools.partial(sera.node_depth, max_depth=max_depth))(parent_gkq, node_mask_gkq)
    sample = node_mask_gkq & ((parent_gkq < 0) | graded_gkq) & (rows_gkq > 0)
    tree_mask = node_mask_gkq.any(-1)
    adv = jax.vmap(functools.partial(execution_advantage, baseline=baseline))(reward, sample, root_outcome_gk,
                                                                             tree_mask)
    return _finish(reward, adv, sample, depth, rows_gkq, filter_zero_variance=filter_zero_variance,
                   depth_weighting=depth_weighting, max_depth=max_depth)


@functools.partial(jax.jit, static_argnames=("unit", "baseline", "empty_as_zero", "filter_zero_variance",
                                             "depth_weighting", "max_depth"))
def decomposition_credit(
    parent_gkq: Int[Array, "G K Q"],
    node_mask_gkq: Bool[Array, "G K Q"],
    event_gkq: Int[Array, "G K Q"],
    event_node_gke: Int[Array, "G K E"],
    root_outcome_gk: Float[Array, "G K"],
    *,
    unit: Literal["event", "delegation"] = "event",
    baseline: TreeBaseline = "tree_mean",
    empty_as_zero: bool = True,
    filter_zero_variance: bool = True,
    depth_weighting: DepthWeighting = "trajectory",
    max_depth: int = 3,
) -> tuple[sera.LeafCoverage, StageCredit]:
    """Decomposition-stage (leaf-coverage) credit (METHODS.md SERA 4, 6; SERA §3.3).

    ``unit="event"`` (released): samples are launch events, ``r_e`` from :func:`~agentjax.credit.sera.leaf_coverage`,
    ``A_ke = r_ke − mean_{j≠k} m_j`` with ``m_j`` tree j's mean event reward (0 for a tree without events;
    ``empty_as_zero=False`` leaves such trees out, the paper's reading); each event trains its reply's delegation
    tokens, at the launching node's depth, and depth weights count launching nodes as trajectories and events as
    data. ``unit="delegation"`` (the paper summary's reading): samples are the delegations ``parent(q) → q``
    (``X = Q``), trained at the parent's depth, each delegation its own trajectory with one datum.

    Args:
      parent_gkq, node_mask_gkq: [G, K, Q] trees. event_gkq: [G, K, Q] the event that spawned each child.
      event_node_gke: [G, K, E] each event's launching node (−1 on padding). root_outcome_gk: [G, K].
    Returns:
      (:class:`~agentjax.credit.sera.LeafCoverage` over [G, K, ·], :class:`StageCredit` over [G, K, E] or
      [G, K, Q] by ``unit``).
    """
    chex.assert_rank([parent_gkq, event_node_gke, root_outcome_gk], [3, 3, 2])
    chex.assert_equal_shape([parent_gkq, node_mask_gkq, event_gkq])
    over_trees = lambda f: jax.vmap(jax.vmap(f))  # noqa: E731
    cov = over_trees(functools.partial(sera.leaf_coverage, max_depth=max_depth))(
        parent_gkq, node_mask_gkq, event_gkq, event_node_gke, root_outcome_gk)
    depth_q = over_trees(functools.partial(sera.node_depth, max_depth=max_depth))(parent_gkq, node_mask_gkq)
    tree_mask = node_mask_gkq.any(-1)
    take = jax.vmap(jax.vmap(lambda x, i: x[jnp.maximum(i, 0)]))
    loo = jax.vmap(functools.partial(tree_loo_advantage, baseline=baseline, empty_as_zero=empty_as_zero))
    if unit == "event":
        sample = (event_node_gke >= 0) & tree_mask[..., None]
        depth = jnp.where(sample, take(depth_q, event_node_gke), -1)
        adv = loo(cov.reward_e, sample, tree_mask)
        keep_g = _keep(adv, sample, filter_zero_variance)
        sample = sample & keep_g[:, None, None]
        if depth_weighting == "trajectory":  # trajectories: launching nodes; data: their events
            num_nodes = parent_gkq.shape[-1]
            slot = jnp.where(sample, event_node_gke, num_nodes)
            events_q = jax.vmap(jax.vmap(lambda s: jax.ops.segment_sum(
                jnp.ones(s.shape, jnp.float32), s, num_segments=num_nodes + 1)[:num_nodes]))(slot)
            w_q = _depth_weights(depth_q, events_q, events_q > 0, "trajectory", max_depth)
            weight = jnp.where(sample, take(w_q, event_node_gke), 0.0)
        else:
            weight = _depth_weights(depth, jnp.ones(sample.shape), sample, depth_weighting, max_depth)
        credit = StageCredit(reward=cov.reward_e, advantage=jnp.where(sample, adv * weight, 0.0), sample=sample,
                             weight=weight, depth=jnp.where(sample, depth, -1), keep_g=keep_g)
        return cov, credit
    if unit != "delegation":
        raise ValueError(f"decomposition_credit: unknown unit {unit!r}")
    sample = cov.delegation_q
    adv = loo(cov.reward_q, sample, tree_mask)
    depth = jnp.where(sample, depth_q - 1, -1)  # the parent's depth: its reply holds the delegation
    credit = _finish(cov.reward_q, adv, sample, depth, jnp.ones(sample.shape),
                     filter_zero_variance=filter_zero_variance, depth_weighting=depth_weighting, max_depth=max_depth)
    return cov, credit


@functools.partial(jax.jit, static_argnames=("margin", "filter_zero_variance", "depth_weighting", "max_depth"))
def rubric_credit(
    score_gfi: Float[Array, "G F I"],
    success_gfi: Bool[Array, "G F I"],
    valid_gfi: Bool[Array, "G F I"],
    child_depth_gf: Int[Array, "G F"],
    *,
    margin: float = sera.RANKING_MARGIN,
    filter_zero_variance: bool = True,
    depth_weighting: DepthWeighting = "trajectory",
    max_depth: int = 3,
) -> tuple[sera.RankingReward, StageCredit]:
    """Rubric-stage credit of the fork groups of ``G`` root tasks (METHODS.md SERA 5, 6; SERA §3.4).

    ``R_f`` = :func:`~agentjax.credit.sera.ranking_reward` of each fork group; ``A_f = R_f − mean_{f'≠f} R_f'``
    over the usable (mixed) groups of the same root task, over all its trees (0 with fewer than two, as released);
    one datum per group — its rubric completion — at the child's depth, so depth weights count groups.

    Args:
      score_gfi: [G, F, I] the policy's final scores of each group's branches. success_gfi: [G, F, I] labels.
      valid_gfi: [G, F, I] branches whose grading parsed (all False for padding groups and unparsed rubrics).
      child_depth_gf: [G, F] depth of the delegated child.
    Returns:
      (:class:`~agentjax.credit.sera.RankingReward` over [G, F], :class:`StageCredit` over [G, F]).
    """
    chex.assert_rank([score_gfi, child_depth_gf], [3, 2])
    chex.assert_equal_shape([score_gfi, success_gfi, valid_gfi])
    rank = jax.vmap(jax.vmap(functools.partial(sera.ranking_reward, margin=margin)))(score_gfi, success_gfi,
                                                                                    valid_gfi)
    adv = jax.vmap(loo_advantage)(rank.reward, rank.usable)
    return rank, _finish(rank.reward, adv, rank.usable, child_depth_gf, jnp.ones(rank.usable.shape),
                         filter_zero_variance=filter_zero_variance, depth_weighting=depth_weighting,
                         max_depth=max_depth)


@functools.partial(jax.jit, static_argnames=("max_depth",))
def batched_node_depth(
    parent_gkq: Int[Array, "G K Q"], node_mask_gkq: Bool[Array, "G K Q"], *, max_depth: int = 3
) -> Int[Array, "G K Q"]:
    """:func:`~agentjax.credit.sera.node_depth` of every tree of G root tasks × K trees (−1 on padding)."""
    return jax.vmap(jax.vmap(functools.partial(sera.node_depth, max_depth=max_depth)))(parent_gkq, node_mask_gkq)
