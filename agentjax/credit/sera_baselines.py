"""SERA / RAO leave-one-out baselines over the K trees of a root task, depth weights, the zero-variance filter.

METHODS.md "SERA" item 6; papers/SERA.txt §3.5, §B.1. Each of the three rewards (:mod:`agentjax.credit.sera`)
gets its own leave-one-out baseline over the ``K`` = 8 trees of one root task (execution, decomposition) or over
the mixed fork groups of that root task (rubric); the advantages are then multiplied by inverse-frequency
depth weights computed over the whole update. Where the released code (GitHub ``OliverLeeXZ/SERA``) and the
paper summary differ, the released choice is the default and the paper's reading a parameter:

=================  ===============================================  ==========================================
quantity           released (default)                               paper summary's reading
=================  ===============================================  ==========================================
execution          ``r_kq − mean_{j≠k} R_root,j`` ("root")          the other trees' node rewards ("pooled"),
baseline                                                            or their tree means ("tree_mean")
decomposition      tree means, a tree without events counts as 0    trees without events left out
baseline           (``empty_as_zero=True``)                         (``empty_as_zero=False``)
depth weights      ``n_d`` trajectories, ``c_d`` data at depth d    every sample its own trajectory
                   (``data_b`` = data per trajectory)               (``data_b = 1``): ``w ∝ 1 / count(d)``
=================  ===============================================  ==========================================

Kernels take one root task (``[K, ·]``) or a flat set of samples; :mod:`agentjax.credit.sera_stages` vmaps and
jits them.
"""

from __future__ import annotations

from typing import Literal

import chex
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

from agentjax.credit.trajectory import rloo_advantages

ExecutionBaseline = Literal["root", "pooled", "tree_mean"]
TreeBaseline = Literal["tree_mean", "pooled"]


def loo_advantage(x_k: Float[Array, " K"], mask_k: Bool[Array, " K"]) -> Float[Array, " K"]:
    """Leave-one-out advantage ``A_k = x_k − mean_{j≠k, real} x_j``; 0 for missing entries and when none other.

    The estimator of the released rubric stage over fork groups and of ``step_wise.py``'s root baseline; the same
    as RLOO over rollouts (:func:`~agentjax.credit.trajectory.rloo_advantages`).
    """
    return rloo_advantages(x_k, mask_k)


def tree_loo_advantage(
    reward_kx: Float[Array, "K X"],
    mask_kx: Bool[Array, "K X"],
    tree_mask_k: Bool[Array, " K"],
    *,
    baseline: TreeBaseline = "tree_mean",
    empty_as_zero: bool = True,
) -> Float[Array, "K X"]:
    """Leave-one-out advantage of per-sample rewards over the K trees of one root task: ``A_kx = r_kx − b_k``.

    ``"tree_mean"``: each tree is reduced to its mean ``m_j = mean_x r_jx`` and ``b_k = mean_{j≠k} m_j`` over
    the other real trees, so a tree with many samples counts once (SERA §3.5, "trees averaged before the
    baseline"). A real tree without samples counts as ``m_j = 0`` with ``empty_as_zero`` (released:
    ``root_balanced_loo_advantages`` in ``Training/runtime/reward_first_launch/stage.py``) and is left out
    otherwise. ``"pooled"``: ``b_k = Σ_{j≠k} Σ_x r_jx / Σ_{j≠k} n_j`` (the released ``reward_first_flat``
    mode). ``A = 0`` off the mask and when no other tree enters the baseline.

    Args:
      reward_kx: [K, X] per-sample rewards. mask_kx: [K, X] samples. tree_mask_k: [K] real trees.
      baseline: static, "tree_mean" or "pooled". empty_as_zero: static, for "tree_mean".
    Returns:
      [K, X] advantages.
    """
    chex.assert_rank([reward_kx, mask_kx, tree_mask_k], [2, 2, 1])
    chex.assert_equal_shape([reward_kx, mask_kx])
    mask_kx = mask_kx & tree_mask_k[:, None]
    w_kx = mask_kx.astype(jnp.float32)
    n_k = w_kx.sum(-1)
    sum_k = (w_kx * reward_kx).sum(-1)
    if baseline == "tree_mean":
        counted_k = tree_mask_k & ((n_k > 0) | empty_as_zero)
        c_k = counted_k.astype(jnp.float32)
        mean_k = sum_k / jnp.maximum(n_k, 1.0)
        others_n = c_k.sum() - c_k
        base_k = (jnp.sum(c_k * mean_k) - c_k * mean_k) / jnp.maximum(others_n, 1.0)
    elif baseline == "pooled":
        others_n = n_k.sum() - n_k
        base_k = (sum_k.sum() - sum_k) / jnp.maximum(others_n, 1.0)
    else:
        raise ValueError(f"tree_loo_advantage: unknown baseline {baseline!r}")
    return jnp.where(mask_kx & (others_n > 0)[:, None], reward_kx - base_k[:, None], 0.0)


def execution_advantage(
    reward_kq: Float[Array, "K Q"],
    sample_kq: Bool[Array, "K Q"],
    root_outcome_k: Float[Array, " K"],
    tree_mask_k: Bool[Array, " K"],
    *,
    baseline: ExecutionBaseline = "root",
) -> Float[Array, "K Q"]:
    """Execution advantages of every trained node of one root task's K trees (METHODS.md SERA 6).

    ``"root"`` (released, ``Training/runtime/platoon/train/areal/workflows/step_wise.py`` with
    ``leave_one_out_baseline``): every node of tree k, root and children alike, is baselined by the other
    trees' root outcomes, ``A_kq = r_kq − mean_{j≠k} R_root,j``. ``"pooled"`` / ``"tree_mean"`` (the paper
    summary's reading, §3.5): the other trees' node rewards, pooled or tree-averaged
    (:func:`tree_loo_advantage`; trees whose nodes are all dropped are left out). ``A = 0`` off the samples and
    with no other tree.

    Args:
      reward_kq: [K, Q] node rewards (:func:`~agentjax.credit.sera.execution_reward`).
      sample_kq: [K, Q] trained nodes (real, and graded where a child's grading can fail).
      root_outcome_k: [K] root outcomes. tree_mask_k: [K] real trees. baseline: static.
    Returns:
      [K, Q] advantages.
    """
    chex.assert_rank([reward_kq, root_outcome_k], [2, 1])
    chex.assert_equal_shape([reward_kq, sample_kq])
    chex.assert_equal_shape([root_outcome_k, tree_mask_k])
    if baseline != "root":
        return tree_loo_advantage(reward_kq, sample_kq, tree_mask_k, baseline=baseline, empty_as_zero=False)
    t_k = tree_mask_k.astype(jnp.float32)
    others_n = t_k.sum() - t_k
    base_k = (jnp.sum(t_k * root_outcome_k) - t_k * root_outcome_k) / jnp.maximum(others_n, 1.0)
    ok_kq = sample_kq & tree_mask_k[:, None] & (others_n > 0)[:, None]
    return jnp.where(ok_kq, reward_kq - base_k[:, None], 0.0)


def depth_weights(
    depth_b: Int[Array, " B"], data_b: Float[Array, " B"], mask_b: Bool[Array, " B"], *, max_depth: int = 3
) -> Float[Array, " B"]:
    """Inverse-frequency depth weights over the trajectories of one update (METHODS.md SERA 6; SERA §3.5, §B.1).

    Entry ``b`` is one trajectory at depth ``d_b`` holding ``data_b`` data (training rows). With ``n_d`` the
    trajectories and ``c_d`` the data at depth d (released, ``Training/runtime/platoon/train/areal/rl.py``)::

        w_d = (Σ_d c_d / Σ_d (c_d / n_d)) / n_d

    every datum of a depth-d trajectory is weighted ``w_d``, so each depth gets the same weight per trajectory and
    the data's total weight is unchanged (``Σ_b data_b w_b = Σ_d c_d``). ``data_b = 1`` is the paper summary's
    per-sample reading, ``w_b = N / (D · count(d_b))``. Entries without data are not trajectories (weight 0);
    depths above ``max_depth`` count as ``max_depth``.

    Args:
      depth_b: [B] depths (root 0). data_b: [B] data per trajectory. mask_b: [B] real trajectories.
      max_depth: static.
    Returns:
      [B] weights (of each datum of trajectory b), 0 off the mask.
    """
    chex.assert_rank([depth_b, data_b, mask_b], 1)
    chex.assert_equal_shape([depth_b, data_b, mask_b])
    real_b = mask_b & (data_b > 0)
    d_b = jnp.where(real_b, jnp.clip(depth_b, 0, max_depth), max_depth + 1)
    n_d = jax.ops.segment_sum(real_b.astype(jnp.float32), d_b, num_segments=max_depth + 2)[: max_depth + 1]
    c_d = jax.ops.segment_sum(jnp.where(real_b, data_b, 0.0), d_b, num_segments=max_depth + 2)[: max_depth + 1]
    raw_d = jnp.where(n_d > 0, 1.0 / jnp.maximum(n_d, 1.0), 0.0)
    unnorm = jnp.sum(c_d * raw_d)
    w_d = raw_d * jnp.where(unnorm > 0, c_d.sum() / jnp.where(unnorm > 0, unnorm, 1.0), 0.0)
    w_d = jnp.concatenate([w_d, jnp.zeros((1,), jnp.float32)])
    return jnp.where(real_b, w_d[d_b], 0.0)


def nonconstant(x_b: Float[Array, "*B"], mask_b: Bool[Array, "*B"]) -> Bool[Array, ""]:
    """Whether the masked entries are not all equal (False for fewer than two distinct values or no entries).

    The released zero-variance filter (``filter_zero_variance_groups: true``; ``step_wise.py`` for execution,
    ``three_stage_train/workflow.py`` for the other stages): a root task whose advantages are all equal, exactly,
    is dropped from the update (its rubric datums kept but not trained).
    """
    chex.assert_equal_shape([x_b, mask_b])
    hi = jnp.max(jnp.where(mask_b, x_b, -jnp.inf))
    lo = jnp.min(jnp.where(mask_b, x_b, jnp.inf))
    return mask_b.any() & (hi != lo)
