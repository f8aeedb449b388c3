"""Rollout data: the `StepBatch` pytree, anchor/action ids and group views.

The collectors are imported from their modules: the flat one (:mod:`agentjax.rollout.collect`, the env ⇄ policy
loop; :mod:`~agentjax.rollout.stats`), SERO's oracle branch (:mod:`~agentjax.rollout.oracle`) and the tree collector
(:mod:`~agentjax.rollout.tree_collect`), so that the credit kernels, which import this package, do not load the
environments and prompts. They call the policy through :mod:`agentjax.rollout.policy` (the protocol the model's
sampler implements) and :mod:`agentjax.rollout.calls` (the policy call they share), never :mod:`agentjax.models`
(DESIGN.md, data flow).
"""

from agentjax.rollout.batch import NO_ID, StepBatch
from agentjax.rollout.groups import GroupView, check_unique_positions, from_groups, to_groups
from agentjax.rollout.ids import group_local_ids, hash_text, hash_texts

__all__ = [
    "NO_ID",
    "GroupView",
    "StepBatch",
    "check_unique_positions",
    "from_groups",
    "group_local_ids",
    "hash_text",
    "hash_texts",
    "to_groups",
]
