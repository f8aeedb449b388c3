"""The rubric-generation objective: CISPO on the rubric tokens only, with each fork group's ranking advantage.

METHODS.md SERA 5–6; papers/SERA.txt §3.4. At a delegation call the policy writes one rubric for a fork group
of counterfactual children; its ranking reward ``R_g`` (:func:`agentjax.credit.sera.ranking_reward`) and
leave-one-out advantage ``A_g`` over the root task's mixed groups, times the group's depth weight
(:func:`agentjax.credit.sera_stages.rubric_credit`), is attached to that one rubric completion — never to the
grading calls, the children's execution, or the parent's other tokens (the released
``Training/runtime/rubric_generation_ranking/stage.py``)::

    L_rubric = Σ_{b,l} m^rub_bl ℓ^CISPO_bl(A_b) / Σ_{b,l} m^rub_bl,   m^rub = response mask ∧ rubric-role mask

The role mask comes from the tree collector's per-role token spans; a row without rubric tokens contributes
nothing, whatever its advantage.
"""

from __future__ import annotations

import chex
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float

from agentjax.losses.cispo import CLIP_HIGH, CLIP_LOW, cispo_terms
from agentjax.losses.policy import aggregation_weights, broadcast_advantage, weighted_sum


def role_token_mask(response_mask_bl: Bool[Array, "B L"], role_mask_bl: Bool[Array, "B L"]) -> Bool[Array, "B L"]:
    """The trained tokens of one role: real response tokens inside the role's spans."""
    chex.assert_equal_shape([response_mask_bl, role_mask_bl])
    return response_mask_bl & role_mask_bl


def rubric_loss(
    logp_bl: Float[Array, "B L"],
    old_logp_bl: Float[Array, "B L"],
    adv_b: Float[Array, " B"],
    response_mask_bl: Bool[Array, "B L"],
    rubric_mask_bl: Bool[Array, "B L"],
    *,
    clip_low: float | None = CLIP_LOW,
    clip_high: float | None = CLIP_HIGH,
) -> tuple[Float[Array, ""], dict[str, Float[Array, ""]]]:
    """The rubric-stage loss: token-mean CISPO over rubric tokens with each row's (group's) advantage.

    Args:
      logp_bl: [B, L] log π_θ. old_logp_bl: [B, L] behaviour log-probs.
      adv_b: [B] each row's advantage (the rubric completion of fork group g: ``A_g · w_g``; 0 elsewhere).
      response_mask_bl: [B, L] real response tokens. rubric_mask_bl: [B, L] the rubric role's tokens.
      clip_low, clip_high: CISPO's bounds on the ratio (:mod:`agentjax.losses.cispo`).
    Returns:
      (loss, metrics): the scalar loss and float32 scalars ``rubric_tokens``, ``clip_frac``, ``ratio_mean``.
    """
    chex.assert_rank([adv_b, logp_bl], [1, 2])
    mask_bl = role_token_mask(response_mask_bl, rubric_mask_bl)
    terms = cispo_terms(logp_bl, old_logp_bl, broadcast_advantage(adv_b, mask_bl), mask_bl, clip_low=clip_low,
                        clip_high=clip_high)
    w_bl = aggregation_weights(mask_bl, "token-mean")
    metrics = {
        "rubric_tokens": mask_bl.sum().astype(jnp.float32),
        "clip_frac": weighted_sum(terms.clipped, w_bl),
        "ratio_mean": weighted_sum(terms.ratio, w_bl),
    }
    return weighted_sum(terms.loss, w_bl), metrics
