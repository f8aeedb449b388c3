"""Token-level objectives on arrays (never a model): PPO-clip / GRPO with the dual clip, k3 KL, value loss, CISPO.

- :mod:`~agentjax.losses.policy` — per-token PPO-clip terms, the low-variance KL to a frozen reference, the
  clipped value loss, and the aggregation weights ("token-mean", "seq-mean-token-mean") that make a loss split
  into micro-batches sum to the loss of the whole batch.
- :mod:`~agentjax.losses.cispo` — CISPO (SERA / RAO): the clipped importance weight as a constant, token mean, no KL.
- :mod:`~agentjax.losses.rubric` — SERA's rubric-generation objective: CISPO on the rubric-role tokens only.
- :mod:`~agentjax.losses.sero` — SERO's oracle objective: the auxiliary loss ``L_O`` over branches or over rows (its
  per-step term, the command-token log-likelihood, is :func:`agentjax.credit.sero.mean_token_logp`).
"""

from agentjax.losses.cispo import CispoTerms, cispo_loss, cispo_terms, cispo_token_loss
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
from agentjax.losses.rubric import role_token_mask, rubric_loss
from agentjax.losses.sero import oracle_loss, oracle_row_loss, row_coefficients

__all__ = [
    "AGGREGATIONS",
    "Aggregation",
    "CispoTerms",
    "ClipTerms",
    "aggregation_weights",
    "broadcast_advantage",
    "check_aggregation",
    "cispo_loss",
    "cispo_terms",
    "cispo_token_loss",
    "clipped_value_loss",
    "low_var_kl",
    "oracle_loss",
    "oracle_row_loss",
    "ppo_clip_terms",
    "role_token_mask",
    "row_coefficients",
    "rubric_loss",
    "weighted_sum",
]
