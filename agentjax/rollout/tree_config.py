"""How the tree collector grows trees: :class:`TreeCollectConfig` (:mod:`agentjax.rollout.tree_collect`), read by
the loop and by the packing of its records (:mod:`agentjax.rollout.tree_records`)."""

from __future__ import annotations

import dataclasses
from typing import Any

from agentjax.agents.projection import INVALID_PENALTY
from agentjax.agents.tree import TreeLimits
from agentjax.rollout.calls import Truncation
from agentjax.rollout.policy import CHAT_STOP_IDS, SamplingParams


@dataclasses.dataclass(frozen=True)
class TreeCollectConfig:
    """How to grow trees (:mod:`agentjax.rollout.tree_collect`). Field names shared with
    :class:`~agentjax.rollout.collect.CollectConfig` mean the same."""

    trees_per_task: int = 8  # K trees per root task (SERA: 8 roots x 8 trees)
    limits: TreeLimits = TreeLimits()  # 20 turns per node, depth <= 3
    max_turns: int = 400  # the collector's cap on turns (trees still running are cut)
    history_length: int | None = None  # own turns shown in a node's prompt (None: all that fit)
    sampling: SamplingParams = SamplingParams(temperature=1.0, max_new_tokens=512, stop_token_ids=CHAT_STOP_IDS,
                                              prompt_bucket=256)  # max_new_tokens: capacity Lr
    max_prompt_tokens: int = 4096  # capacity Lp
    truncation: Truncation = "left"
    invalid_penalty: float = INVALID_PENALTY
    success_reward: float = 10.0  # on the root's last row when the root succeeded
    constrained: bool = False  # decode only the world's admissible replies
    masked_logp: bool = False  # constrained log-probs as behaviour_logp, and allowed_tokens
    sparse_logits: bool = False
    max_allowed: int = 16
    max_trie_edges: int = 4096
    batch_bucket: int = 8
    pow2_batches: bool = False
    row_bucket: int = 64
    capacity: int | None = None
    row_keys: bool = False
    node_slots: int | None = None  # Q of TreeArrays (default limits.max_nodes)
    event_slots: int | None = None  # E of TreeArrays (default 2 Q; refused attempts past it are dropped, counted)

    def __post_init__(self):
        if min(self.trees_per_task, self.max_turns, self.max_prompt_tokens, self.batch_bucket, self.row_bucket) < 1:
            raise ValueError("TreeCollectConfig: trees_per_task, max_turns, max_prompt_tokens, batch_bucket and "
                             "row_bucket must be >= 1")
        if self.masked_logp and not self.constrained:
            raise ValueError("TreeCollectConfig.masked_logp needs constrained=True")
        if self.sparse_logits and not self.masked_logp:
            raise ValueError("TreeCollectConfig.sparse_logits needs masked_logp=True")
        if self.constrained and not self.sampling.stop_token_ids:
            raise ValueError("TreeCollectConfig.constrained needs sampling.stop_token_ids")

    @property
    def max_response_tokens(self) -> int:
        return self.sampling.max_new_tokens

    @property
    def slots(self) -> int:
        return self.node_slots or self.limits.max_nodes

    @property
    def events(self) -> int:
        return self.event_slots or 2 * self.slots

    def replace(self, **changes: Any) -> TreeCollectConfig:
        return dataclasses.replace(self, **changes)


__all__ = ["TreeCollectConfig"]
