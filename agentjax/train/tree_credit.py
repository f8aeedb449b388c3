"""RAO's credit of one tree batch, per `StepBatch` row: the stage's per-node / per-event advantage on its rows.

METHODS.md "SERA" 6-8. :func:`row_credit` runs the stage's jitted kernel of :mod:`agentjax.credit.sera_stages` on
the batch's tree arrays (``[G, K, ·]``: root task, tree, node or event) and gathers each row's value:

- execution (RAO's stage): every node's reward — the root's environment outcome, a child's binary verifier / judge
  label — minus the leave-one-out baseline over the other trees of its root task (released: their root outcomes),
  root tasks whose advantages are all equal dropped (the zero-variance filter), times the inverse-frequency depth
  weight of the node's depth (trajectories = nodes, data = their turns, one row each). Every turn row of a sampled
  node carries its advantage; its trained tokens are the execution-role tokens (acting and finishing).
- decomposition (RAO + D): each launch event's leaf coverage ``R_root · leaves under its children / leaves of the
  tree`` minus the LOO baseline of the other trees' mean event rewards, filtered and depth-weighted the same way;
  the event's reply row carries it, on its delegation-role tokens only.

Rows of nodes that are not trained (a child without a label, a filtered root task, padding) have ``sample`` False:
the update leaves them out of the token mean, as the released code drops them from the batch.
"""

from __future__ import annotations

import functools

import flax.struct
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float

from agentjax.agents.grammar import Role
from agentjax.credit.sera_stages import StageCredit, decomposition_credit, execution_credit
from agentjax.rollout.tree_batch import TreeBatch
from agentjax.train.config import RAOCredit

STAGE_ROLES = {"execution": Role.EXECUTION, "decomposition": Role.DELEGATION}


@flax.struct.dataclass(frozen=True)
class RowCredit:
    """A stage's credit on the rows of a tree batch: the update trains ``UpdateBatch(steps, advantage,
    row_mask=sample, token_mask=token_mask)`` (:class:`~agentjax.train.update.UpdateBatch`)."""

    advantage: Float[Array, " B"]  # [B] f32, the advantage × depth weight every trained token of the row sees
    sample: Bool[Array, " B"]  # [B] rows that train (real, of a trained node / event, in a kept root task)
    token_mask: Bool[Array, "B L"]  # [B, Lr] the trained tokens: the stage's role tokens of the sampled rows
    stats: dict[str, Float[Array, ""]]  # credit statistics (scalars) for the metrics


def _stats(credit: StageCredit, adv_b, sample_b, token_mask, max_depth: int) -> dict[str, jax.Array]:
    s = credit.sample
    n = jnp.maximum(s.sum(), 1).astype(jnp.float32)
    mean = jnp.sum(jnp.where(s, credit.advantage, 0.0)) / n
    rows = jnp.maximum(sample_b.sum(), 1).astype(jnp.float32)
    out = {
        "samples": s.sum().astype(jnp.float32),
        "kept_tasks": credit.keep_g.mean(dtype=jnp.float32),
        "reward_mean": jnp.sum(jnp.where(s, credit.reward, 0.0)) / n,
        "adv_mean": mean,
        "adv_std": jnp.sqrt(jnp.sum(jnp.where(s, jnp.square(credit.advantage - mean), 0.0)) / n),
        "adv_abs_max": jnp.max(jnp.where(s, jnp.abs(credit.advantage), 0.0)),
        "row_adv_mean": jnp.sum(jnp.where(sample_b, adv_b, 0.0)) / rows,
        "trained_rows": sample_b.sum().astype(jnp.float32),
        "trained_tokens": token_mask.sum().astype(jnp.float32),
    }
    for d in range(max_depth + 1):  # the depth weight of each depth (0 where it has no sample)
        at = s & (credit.depth == d)
        out[f"weight_depth{d}"] = jnp.sum(jnp.where(at, credit.weight, 0.0)) / jnp.maximum(at.sum(), 1)
    return out


@functools.partial(jax.jit, static_argnames=("credit", "stage", "max_depth"))
def row_credit(batch: TreeBatch, credit: RAOCredit, stage: str, *, max_depth: int = 3) -> RowCredit:
    """The ``stage``'s credit (module docstring) on every row of ``batch`` (``G`` root tasks × ``K`` trees).

    Args:
      batch: the tree collector's :class:`~agentjax.rollout.tree_batch.TreeBatch`.
      credit: :class:`~agentjax.train.config.RAOCredit` (baselines, filter, depth weighting).
      stage: ``"execution"`` or ``"decomposition"`` (static).
      max_depth: the trees' depth bound (static).
    Returns:
      :class:`RowCredit`.
    """
    if stage not in STAGE_ROLES:
        raise ValueError(f"row_credit: RAO trains the stages {sorted(STAGE_ROLES)}, not {stage!r}")
    tr, steps = batch.trees, batch.steps
    gk = batch.by_task
    parent, node_mask, root = gk(tr.parent_tq), gk(tr.node_mask_tq), gk(tr.root_success_t).astype(jnp.float32)
    real = steps.row_mask
    g, k = jnp.where(real, steps.group, 0), jnp.where(real, steps.rollout, 0)
    q = jnp.where(real, steps.node, 0)
    if stage == "execution":
        c = execution_credit(parent, node_mask, gk(tr.label_tq), gk(tr.label_mask_tq), root, gk(tr.turns_tq),
                             baseline=credit.baseline, filter_zero_variance=credit.filter_zero_variance,
                             depth_weighting=credit.depth_weighting, max_depth=max_depth)
        adv_b = c.advantage[g, k, q]
        sample_b = real & c.sample[g, k, q]
    else:
        _, c = decomposition_credit(parent, node_mask, gk(tr.event_tq), gk(tr.event_node_te), root,
                                    baseline=credit.decomposition_baseline, empty_as_zero=credit.empty_as_zero,
                                    filter_zero_variance=credit.filter_zero_variance,
                                    depth_weighting=credit.depth_weighting, max_depth=max_depth)
        event_node, event_step = gk(tr.event_node_te)[g, k], gk(tr.event_step_te)[g, k]  # [B, E]
        hit = (event_node >= 0) & (event_node == q[:, None]) & (event_step == steps.step[:, None])
        e = jnp.argmax(hit, -1)
        has = hit.any(-1)
        adv_b = jnp.where(has, c.advantage[g, k, e], 0.0)
        sample_b = real & has & c.sample[g, k, e]
    adv_b = jnp.where(sample_b, adv_b, 0.0)
    token_mask = batch.role_mask(STAGE_ROLES[stage]) & sample_b[:, None]
    return RowCredit(advantage=adv_b, sample=sample_b, token_mask=token_mask,
                     stats=_stats(c, adv_b, sample_b, token_mask, max_depth))


__all__ = ["STAGE_ROLES", "RowCredit", "row_credit"]
