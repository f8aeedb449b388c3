"""SERA / RAO rewards on recursive trees: tree structure, execution reward, leaf coverage, rubric ranking.

METHODS.md "SERA" items 3–5 and 8; papers/SERA.txt §3.2–3.4. METHODS.md follows the authors' released code
(GitHub ``OliverLeeXZ/SERA``) where the paper summary is vague; where the two differ the paper's reading stays
available (named below). The baselines, depth weights and the zero-variance filter are in
:mod:`agentjax.credit.sera_baselines`; the jitted per-stage credit over a whole update in
:mod:`agentjax.credit.sera_stages`.

Layout. A *tree* is one recursive rollout of a root task: ``Q`` node slots (padded; ``node_mask_q``) with parent
pointers ``parent_q`` (−1 at the root), depth ≤ ``max_depth`` (3). A *launch event* is one parent reply that
spawns one or more children at once (``<delegate>`` with several delegations, one ``launch_subagent`` call);
``E`` event slots per tree, ``event_node_e`` the node whose reply it is (−1 on padding) and ``event_q`` the
event that spawned node ``q`` (−1 at the root and padding). A reply that attempted a delegation but spawned
nothing is an event without children. A *fork group* is one delegation call's ``I`` = 8 counterfactual
branches (item 5). ``C`` indexes a rubric's criteria.
"""

from __future__ import annotations

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

RANKING_MARGIN = 0.2  # the released ranking margin (Training/runtime/rubric_generation_ranking/config.py)


class LeafCoverage(NamedTuple):
    """Leaf-coverage decomposition rewards of one tree (or ``[..., K, ·]`` batched)."""

    reward_e: Float[Array, "*K E"]  # launch event: R_root · leaves_e / |leaves|; 0 on padding
    leaves_e: Float[Array, "*K E"]  # leaves under the event's children (0: an attempt that spawned nothing)
    reward_q: Float[Array, "*K Q"]  # per-delegation reading: R_root · subtree_leaves_q / |leaves| for parent(q) → q
    leaf_q: Bool[Array, "*K Q"]  # real node without real children
    subtree_leaves_q: Float[Array, "*K Q"]  # leaves in q's subtree (q included)
    delegation_q: Bool[Array, "*K Q"]  # real non-root node: the delegation parent(q) → q


class RankingReward(NamedTuple):
    """Rubric-ranking reward of one fork group (or batched) and its diagnostics (0 when not usable)."""

    reward: Float[Array, "*F"]  # R_g = −mean_{i∈P, j∈N} max(0, m − (s_i − s_j))
    usable: Bool[Array, "*F"]  # ≥ 2 valid grades, both labels present
    pairs: Float[Array, "*F"]  # |P| · |N|
    accuracy: Float[Array, "*F"]  # fraction of pairs with s_i > s_j
    margin_rate: Float[Array, "*F"]  # fraction of pairs with s_i − s_j ≥ m
    mean_gap: Float[Array, "*F"]  # mean of s_i − s_j over the pairs


# ----------------------------------------------------------------------------------------- tree structure


def _parent_or_sentinel(parent_q: Array, node_mask_q: Array) -> Array:
    """Parent index for real non-root nodes, the sentinel ``Q`` for the root and padding."""
    (num_nodes,) = parent_q.shape
    return jnp.where(node_mask_q & (parent_q >= 0), parent_q, num_nodes).astype(jnp.int32)


def subtree_leaf_counts(
    parent_q: Int[Array, " Q"], node_mask_q: Bool[Array, " Q"], *, max_depth: int = 3
) -> tuple[Bool[Array, " Q"], Float[Array, " Q"]]:
    """Leaves of a tree and the number of leaves in each node's subtree, with fixed shapes.

    Leaves are real nodes with no real child (a root that never delegated is a leaf). Each leaf's indicator is
    pushed up its parent pointers ``max_depth + 1`` times, so ``count_q = Σ_{leaf ℓ} 1[q is ℓ or an ancestor
    of ℓ]`` exactly when every node has depth ≤ ``max_depth`` (deeper nodes lose their far ancestors).

    Args:
      parent_q: [Q] parent index, −1 at the root (padding: any value). node_mask_q: [Q] real nodes.
      max_depth: static bound on node depth.
    Returns:
      (leaf_q, count_q): [Q] bool leaves and [Q] float32 subtree leaf counts (0 on padding).
    """
    chex.assert_rank([parent_q, node_mask_q], 1)
    chex.assert_equal_shape([parent_q, node_mask_q])
    (num_nodes,) = parent_q.shape
    par_q = _parent_or_sentinel(parent_q, node_mask_q)
    num_children = jax.ops.segment_sum(node_mask_q.astype(jnp.float32), par_q, num_segments=num_nodes + 1)
    leaf_q = node_mask_q & (num_children[:num_nodes] == 0)
    par_ext = jnp.concatenate([par_q, jnp.full((1,), num_nodes, jnp.int32)])  # the sentinel is its own parent
    anc_q = jnp.where(node_mask_q, jnp.arange(num_nodes, dtype=jnp.int32), num_nodes)
    count = jnp.zeros((num_nodes + 1,), jnp.float32)
    for _ in range(max_depth + 1):
        count = count.at[anc_q].add(leaf_q.astype(jnp.float32))
        anc_q = par_ext[anc_q]
    return leaf_q, count[:num_nodes]


def node_depth(
    parent_q: Int[Array, " Q"], node_mask_q: Bool[Array, " Q"], *, max_depth: int = 3
) -> Int[Array, " Q"]:
    """Depth of each real node (root 0), counted up to ``max_depth + 1`` parent hops; −1 on padding."""
    chex.assert_rank([parent_q, node_mask_q], 1)
    (num_nodes,) = parent_q.shape
    par_q = _parent_or_sentinel(parent_q, node_mask_q)
    par_ext = jnp.concatenate([par_q, jnp.full((1,), num_nodes, jnp.int32)])
    anc_q = par_ext[:num_nodes]
    depth_q = jnp.zeros((num_nodes,), jnp.int32)
    for _ in range(max_depth + 1):
        depth_q = depth_q + (anc_q < num_nodes)
        anc_q = par_ext[anc_q]
    return jnp.where(node_mask_q, depth_q, -1)


# ----------------------------------------------------------------------------------------- execution


def execution_reward(
    parent_q: Int[Array, " Q"],
    node_mask_q: Bool[Array, " Q"],
    child_reward_q: Float[Array, " Q"],
    root_outcome: Float[Array, ""],
) -> Float[Array, " Q"]:
    """Execution reward of each node of one tree (METHODS.md SERA 3 and 8; SERA §3.2).

    ``r_root = R_root`` (the verified environment outcome); ``r_q = child_reward_q`` for every child. What the
    child reward is decides the method (released: ``Training/runtime/rubric_subagent_reward/processor.py``
    writes the policy's final rubric score as the child trajectory's reward; RAO keeps the binary label):

    - SERA, released (default): the grader's ``final_score ∈ [0, 1]`` (0 when not complete);
    - SERA, the paper's reading (§3.2): ``gate · Σ_c w_c s_c / Σ_c w_c`` — :func:`rubric_weighted_score`;
    - RAO: the verifier / judge's binary label ``∈ {0, 1}``.

    A child whose grading failed is not rewarded here but dropped from the gradient by the caller's sample mask.

    Args:
      parent_q: [Q] parent, −1 at the root. node_mask_q: [Q] real nodes.
      child_reward_q: [Q] the children's rewards (ignored at the root and on padding).
      root_outcome: [] the root task's verified outcome.
    Returns:
      [Q] rewards, 0 on padding.
    """
    chex.assert_rank([parent_q, root_outcome], [1, 0])
    chex.assert_equal_shape([parent_q, node_mask_q, child_reward_q])
    reward_q = jnp.where(parent_q < 0, root_outcome, child_reward_q.astype(jnp.float32))
    return jnp.where(node_mask_q, reward_q, 0.0)


def rubric_weighted_score(
    gate_b: Bool[Array, "*B"],
    weight_bc: Float[Array, "*B C"],
    score_bc: Float[Array, "*B C"],
    mask_bc: Bool[Array, "*B C"],
) -> Float[Array, "*B"]:
    """The paper's reading of the execution reward (SERA §3.2): ``gate · Σ_c w_c s_c / Σ_c w_c``.

    ``w`` are the frozen rubric's weights (renormalised here over the real criteria), ``s`` the no-gradient
    grading call's per-criterion scores, ``gate`` its completion flag; a rubric without positive weight gives 0.
    METHODS.md SERA 3 (the released code) uses the grader's own final score instead.
    """
    chex.assert_equal_shape([weight_bc, score_bc, mask_bc])
    chex.assert_equal_shape_prefix([gate_b, weight_bc], gate_b.ndim)
    w_bc = jnp.where(mask_bc, weight_bc, 0.0)
    w_sum = w_bc.sum(-1)
    rubric = jnp.where(w_sum > 0, (w_bc * score_bc).sum(-1) / jnp.where(w_sum > 0, w_sum, 1.0), 0.0)
    return jnp.where(gate_b, rubric, 0.0)


# ----------------------------------------------------------------------------------------- leaf coverage


def leaf_coverage(
    parent_q: Int[Array, " Q"],
    node_mask_q: Bool[Array, " Q"],
    event_q: Int[Array, " Q"],
    event_node_e: Int[Array, " E"],
    root_outcome: Float[Array, ""],
    *,
    max_depth: int = 3,
) -> LeafCoverage:
    """Leaf-coverage reward of each launch event of one tree (METHODS.md SERA 4; SERA §3.3).

    Released unit (``Training/runtime/two_stage_rao_leaf/leaf_credit.py``, the credit used by the
    root-balanced launch stage of ``reward_first_launch/stage.py``; no child success gate): a launch event ``e``
    earns ``r_e = R_root · |leaves under e's children| / |leaves of the tree|``; an attempt that spawned nothing
    has no leaves and earns 0 (the released ``invalid_delegation_reward``). The children of one event are disjoint
    subtrees, so their leaves add up. The paper summary's unit is the single delegation ``parent(q) → q`` with
    ``r_q = R_root · |leaves(subtree(q))| / |leaves|`` (``reward_q``); both are returned.

    Args:
      parent_q: [Q] parent index, −1 at the root. node_mask_q: [Q] real nodes.
      event_q: [Q] the launch event that spawned q (−1 at the root and padding); every real child names one.
      event_node_e: [E] the node whose reply the event is (−1 on padding).
      root_outcome: [] verified root outcome R_root (binary success).
      max_depth: static depth bound (:func:`subtree_leaf_counts`).
    Returns:
      :class:`LeafCoverage` with [E] and [Q] arrays.
    """
    chex.assert_rank([parent_q, event_node_e, root_outcome], [1, 1, 0])
    chex.assert_equal_shape([parent_q, node_mask_q, event_q])
    (num_events,) = event_node_e.shape
    leaf_q, count_q = subtree_leaf_counts(parent_q, node_mask_q, max_depth=max_depth)
    delegation_q = node_mask_q & (parent_q >= 0)
    total = jnp.maximum(leaf_q.sum().astype(jnp.float32), 1.0)
    slot_q = jnp.where(delegation_q & (event_q >= 0), event_q, num_events).astype(jnp.int32)
    leaves_e = jax.ops.segment_sum(jnp.where(delegation_q, count_q, 0.0), slot_q, num_segments=num_events + 1)
    event_mask_e = event_node_e >= 0
    leaves_e = jnp.where(event_mask_e, leaves_e[:num_events], 0.0)
    outcome = root_outcome.astype(jnp.float32)
    return LeafCoverage(
        reward_e=jnp.where(event_mask_e, outcome * leaves_e / total, 0.0),
        leaves_e=leaves_e,
        reward_q=jnp.where(delegation_q, outcome * count_q / total, 0.0),
        leaf_q=leaf_q,
        subtree_leaves_q=count_q,
        delegation_q=delegation_q,
    )


# ----------------------------------------------------------------------------------------- rubric ranking


def ranking_reward(
    score_i: Float[Array, " I"],
    success_i: Bool[Array, " I"],
    valid_i: Bool[Array, " I"],
    *,
    margin: float = RANKING_MARGIN,
) -> RankingReward:
    """Rubric-ranking reward of one fork group (METHODS.md SERA 5; SERA §3.4).

    The policy grades the group's ``I`` counterfactual branches with one rubric (scores ``s_i``); the verifier or
    judge labels them. With ``P`` the valid successes and ``N`` the valid failures::

        R_g = −(1 / |P||N|) Σ_{i∈P, j∈N} max(0, m − (s_i − s_j)),   m = 0.2

    (the released ``pairwise_margin_rewards``, ``Training/runtime/rubric_generation_ranking/stage.py``). A group is
    usable only with ≥ 2 valid grades and both labels; otherwise its reward is 0 and it is not trained. Labels
    enter only here: they never reward execution.

    Args:
      score_i: [I] the policy's final scores of the branches. success_i: [I] verified labels.
      valid_i: [I] branches whose grading parsed (a group whose rubric failed to parse has none).
      margin: the hinge margin m.
    Returns:
      :class:`RankingReward` of scalars.
    """
    chex.assert_rank(score_i, 1)
    chex.assert_equal_shape([score_i, success_i, valid_i])
    pos_i, neg_i = valid_i & success_i, valid_i & ~success_i
    pair_ij = pos_i[:, None] & neg_i[None, :]
    gap_ij = score_i[:, None] - score_i[None, :]
    pairs = pair_ij.sum().astype(jnp.float32)
    usable = (valid_i.sum() >= 2) & (pairs > 0)
    denom = jnp.maximum(pairs, 1.0)

    def pair_mean(x_ij: Array) -> Array:
        return jnp.where(usable, jnp.where(pair_ij, x_ij, 0.0).sum() / denom, 0.0)

    return RankingReward(
        reward=-pair_mean(jnp.maximum(0.0, margin - gap_ij)),
        usable=usable,
        pairs=pairs,
        accuracy=pair_mean((gap_ij > 0).astype(jnp.float32)),
        margin_rate=pair_mean((gap_ij >= margin).astype(jnp.float32)),
        mean_gap=pair_mean(gap_ij),
    )
