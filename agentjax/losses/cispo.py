"""CISPO: the clipped importance-sampling-weight policy gradient that SERA and RAO train with.

CISPO (MiniMax-M1, arXiv:2506.13585, eq. 4–5) keeps every token's gradient and clips only the importance weight,
as a constant::

    ℓ_t = −sg(clip(ρ_t, ρ_low, ρ_high)) · A_t · log π_θ(y_t),   ρ_t = π_θ(y_t) / π_old(y_t)
    L   = Σ_t m_t ℓ_t / Σ_t m_t                                   (token mean, no KL)

so ``∇L = −Σ_t m_t sg(clip(ρ_t)) A_t ∇log π_θ(y_t) / Σ m``. METHODS.md SERA 6 (the released code,
``Training/configs/textcraft.yaml`` / ``textworld.yaml``: ``loss_fn: cispo``, ``clip_low_threshold: 0.0``,
``clip_high_threshold: 5.0``, ``kl_ctl: 0``) clips the ratio itself to ``[0, 5]`` — the defaults here; a lower
bound of 0 never binds. MiniMax-M1's own form, ``clip(ρ, 1 − ε_low, 1 + ε_high)`` with no effective lower bound,
is ``clip_low=None, clip_high=1 + ε_high`` (the reading of SERA §B.1, which only names CISPO).

Arrays only (never a model; DESIGN.md "Data flow"). Masked positions are zeroed with ``where`` before any
arithmetic, so garbage in padding never reaches the loss or its gradient.
"""

from __future__ import annotations

import chex
import flax.struct
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float

from agentjax.losses.policy import LOG_RATIO_CLAMP, aggregation_weights, weighted_sum

CLIP_LOW, CLIP_HIGH = 0.0, 5.0  # the released CISPO bounds on ρ


@flax.struct.dataclass(frozen=True)
class CispoTerms:
    """Per-token CISPO terms (``[B, L]`` float32, 0 where masked)."""

    loss: Float[Array, "B L"]  # ℓ_t
    ratio: Float[Array, "B L"]  # ρ_t (1 where masked)
    clipped: Float[Array, "B L"]  # 1 where the clip binds (ρ_t outside [ρ_low, ρ_high])


def cispo_terms(
    logp_bl: Float[Array, "B L"],
    old_logp_bl: Float[Array, "B L"],
    adv_bl: Float[Array, "B L"],
    mask_bl: Bool[Array, "B L"],
    *,
    clip_low: float | None = CLIP_LOW,
    clip_high: float | None = CLIP_HIGH,
) -> CispoTerms:
    """Per-token CISPO (module docstring).

    Args:
      logp_bl: [B, L] log π_θ of the taken tokens. old_logp_bl: [B, L] behaviour log-probs.
      adv_bl: [B, L] the advantage each token sees (its sample's advantage × depth weight).
      mask_bl: [B, L] trained tokens (the stage's role tokens of real rows).
      clip_low, clip_high: the bounds ``ρ_low, ρ_high`` on the ratio itself (None: unbounded on that side).
    Returns:
      :class:`CispoTerms`.
    """
    chex.assert_rank(logp_bl, 2)
    chex.assert_equal_shape([logp_bl, old_logp_bl, adv_bl, mask_bl])
    if clip_low is not None and clip_high is not None and clip_low > clip_high:
        raise ValueError(f"cispo: clip_low {clip_low} > clip_high {clip_high}")
    logp = jnp.where(mask_bl, logp_bl, 0.0)
    log_ratio = jnp.where(mask_bl, logp - jnp.where(mask_bl, old_logp_bl, 0.0), 0.0)
    ratio = jnp.exp(jnp.clip(log_ratio, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    weight = jnp.clip(ratio, clip_low, clip_high)
    loss = -jax.lax.stop_gradient(weight) * jnp.where(mask_bl, adv_bl, 0.0) * logp
    f = lambda x: jnp.where(mask_bl, x, 0.0).astype(jnp.float32)  # noqa: E731
    return CispoTerms(loss=f(loss), ratio=jnp.where(mask_bl, ratio, 1.0), clipped=f(weight != ratio))


def cispo_token_loss(
    logp_bl: Float[Array, "B L"],
    old_logp_bl: Float[Array, "B L"],
    adv_bl: Float[Array, "B L"],
    mask_bl: Bool[Array, "B L"],
    *,
    clip_low: float | None = CLIP_LOW,
    clip_high: float | None = CLIP_HIGH,
) -> Float[Array, "B L"]:
    """Per-token CISPO loss ``ℓ_t`` (:func:`cispo_terms`), 0 off the mask."""
    return cispo_terms(logp_bl, old_logp_bl, adv_bl, mask_bl, clip_low=clip_low, clip_high=clip_high).loss


def cispo_loss(
    logp_bl: Float[Array, "B L"],
    old_logp_bl: Float[Array, "B L"],
    adv_bl: Float[Array, "B L"],
    mask_bl: Bool[Array, "B L"],
    *,
    clip_low: float | None = CLIP_LOW,
    clip_high: float | None = CLIP_HIGH,
) -> Float[Array, ""]:
    """CISPO token mean ``Σ m ℓ / Σ m`` (0 for an empty mask), the released aggregation; no KL term."""
    loss_bl = cispo_token_loss(logp_bl, old_logp_bl, adv_bl, mask_bl, clip_low=clip_low, clip_high=clip_high)
    return weighted_sum(loss_bl, aggregation_weights(mask_bl, "token-mean"))
