"""`TreeBatch`: the tree collector's output — a `StepBatch` of node turns, per-token roles, per-tree node arrays.

Rows of ``steps`` (:class:`~agentjax.rollout.batch.StepBatch`) are node turns, ordered by (group, tree, node, turn):
``group`` = the root task's position, ``rollout`` = the tree ``k`` in ``[0, K)``, ``node`` / ``parent`` / ``depth``
the tree node (``parent`` = NO_ID at the root), ``step`` the node's turn. ``role`` gives each response token's
:class:`~agentjax.agents.grammar.Role` (0 on padding), so that each of SERA's objectives trains only its tokens:
``batch.for_role(Role.DELEGATION)`` is ``steps`` with ``response_mask`` narrowed to the delegation spans.

``trees`` (:class:`TreeArrays`) holds, per tree ``t = group * K + k`` and node slot ``q < Q``, the arrays
:mod:`agentjax.credit.sera` reads: parent pointers, depths, the node mask, the per-node reward inputs (a child's
verifier / judge label, the root's environment outcome) and which labels exist.
"""

from __future__ import annotations

import flax.struct
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

from agentjax.rollout.batch import StepBatch


@flax.struct.dataclass(frozen=True)
class TreeArrays:
    """Fixed-shape node arrays of ``T`` trees with ``Q`` node slots each."""

    parent_tq: Int[Array, "T Q"]  # [T, Q] int32 parent slot, -1 at the root and on padding
    depth_tq: Int[Array, "T Q"]  # [T, Q] int32 depth (root 0)
    node_mask_tq: Bool[Array, "T Q"]  # [T, Q] bool real node
    finished_tq: Bool[Array, "T Q"]  # [T, Q] bool the node replied with a finish
    label_tq: Float[Array, "T Q"]  # [T, Q] float32 child: verifier / judge label; root: env outcome (0 if none)
    label_mask_tq: Bool[Array, "T Q"]  # [T, Q] bool a label / outcome exists (a failed judge call: False)
    launch_step_tq: Int[Array, "T Q"]  # [T, Q] int32 the parent's turn that launched the node (-1 at the root)
    turns_tq: Int[Array, "T Q"]  # [T, Q] int32 replies of the node
    delegated_tq: Bool[Array, "T Q"]  # [T, Q] bool the node launched children
    event_tq: Int[Array, "T Q"]  # [T, Q] int32 the launch event that spawned the node (-1 at the root, padding)
    event_node_te: Int[Array, "T E"]  # [T, E] int32 the node whose reply the event is (-1: padding)
    event_step_te: Int[Array, "T E"]  # [T, E] int32 that reply's turn (its StepBatch row: node, step)
    dropped_events_t: Int[Array, " T"]  # [T] int32 refused launch attempts past the E slots (left out)
    root_success_t: Bool[Array, " T"]  # [T] bool verified root outcome
    group_t: Int[Array, " T"]  # [T] int32 root task position (StepBatch.group)
    task_t: Int[Array, " T"]  # [T] int32 task id (StepBatch.task)
    tree_t: Int[Array, " T"]  # [T] int32 tree index k within its task (StepBatch.rollout)


@flax.struct.dataclass(frozen=True)
class TreeBatch:
    steps: StepBatch  # one row per node turn
    role: Int[Array, "B Lr"]  # [B, Lr] int32 Role of each response token (0: padding)
    trees: TreeArrays
    trees_per_task: int = flax.struct.field(pytree_node=False, default=1)  # K (static)

    def role_mask(self, role: int) -> Bool[Array, "B Lr"]:
        """[B, Lr] the real response tokens of ``role``."""
        return self.steps.response_mask & (self.role == int(role))

    def for_role(self, role: int) -> StepBatch:
        """``steps`` whose ``response_mask`` keeps only ``role``'s tokens (what one SERA objective trains)."""
        return self.steps.replace(response_mask=self.role_mask(role))

    def by_task(self, x: Array) -> Array:
        """``[T, ...]`` -> ``[G, K, ...]`` (the ``*_gk*`` layout of :mod:`agentjax.credit.sera_stages`)."""
        return x.reshape((-1, self.trees_per_task) + x.shape[1:])

    @property
    def num_trees(self) -> int:
        return self.trees.root_success_t.shape[0]

    def tree_of_row(self) -> Int[Array, " B"]:
        """[B] the tree index ``t = group * K + k`` of each row (padding rows: 0)."""
        return jnp.where(self.steps.row_mask, self.steps.group * self.trees_per_task + self.steps.rollout, 0)


__all__ = ["TreeArrays", "TreeBatch"]
