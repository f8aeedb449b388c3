"""Token-level objectives on arrays (never a model): PPO-clip / GRPO with the dual clip, k3 KL, value loss.

- :mod:`~agentjax.losses.policy` — per-token PPO-clip terms, the low-variance KL to a frozen reference, the
  clipped value loss, and the aggregation weights ("token-mean", "seq-mean-token-mean") that make a loss split
  into micro-batches sum to the loss of the whole batch.
- :mod:`~agentjax.losses.sero` — SERO's oracle objective: the command-token log-likelihood of oracle steps and the
  auxiliary loss ``L_O`` over branches or over rows.
"""

from agentjax.losses.policy import (
    AGGREGATIONS,
    Aggregation,
    ClipTerms,
    aggregation_weights,
    broadcast_advantage,
    check_aggregation,
    clipped_value_loss,
    low_var_kl,
    ppo_clip_terms,
    weighted_sum,
)
from agentjax.losses.sero import mean_token_logp, oracle_loss, oracle_row_loss, row_coefficients

__all__ = [
    "AGGREGATIONS",
    "Aggregation",
    "ClipTerms",
    "aggregation_weights",
    "broadcast_advantage",
    "check_aggregation",
    "clipped_value_loss",
    "low_var_kl",
    "mean_token_logp",
    "oracle_loss",
    "oracle_row_loss",
    "ppo_clip_terms",
    "row_coefficients",
    "weighted_sum",
]
