"""SERO's oracle objective: the auxiliary loss on the length-normalised command log-likelihood of oracle steps.

METHODS.md "SERO" 5-6; papers/SERO.txt §4.4, §B.1. An oracle step is the prompt the policy would have seen at a
state of an oracle continuation and the oracle's action, serialised as the policy's reply; its *command tokens*
(``token_mask``) are the tokens of the action text, the same mask for the behaviour-policy score
(:func:`agentjax.credit.sero.compatibility`) and the loss (§B.1: no reasoning marginalised). Two views of the same
loss:

- branch view ``[Br, J]`` (one branch per root, J oracle steps): :func:`oracle_loss`, the kernel the credit tests and
  the NumPy reference (:mod:`agentjax.credit.reference.sero`) check;
- row view ``[N]`` (every real oracle step one row, as the trainer packs them into micro-batches):
  :func:`oracle_row_loss` with each row's coefficient ``g_b · w_bj / #roots`` (:func:`row_coefficients`) — the same
  sum, split over rows so that micro-batches of rows add up to it.

Gates and weights are stop-gradient constants here; the gradient flows only through ``log π_θ``.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, ScalarLike


def oracle_loss(
    mean_logp_bj: Float[Array, "Br J"],
    weight_bj: Float[Array, "Br J"],
    gate_b: Float[Array, " Br"],
    step_mask_bj: Bool[Array, "Br J"],
    num_roots: ScalarLike,
) -> Float[Array, ""]:
    """SERO's auxiliary loss ``L_O = −(1/#roots) Σ_b sg(g_b) Σ_j sg(w_bj) · ℓ_bj`` (METHODS.md SERO 6; §4.4).

    ``ℓ_bj`` is the mean command-token log π_θ of oracle step j (:func:`agentjax.credit.sero.mean_token_logp`
    under π_θ). Gates and
    weights are stop-gradient, so the gradient flows only through ``ℓ``:
    ``∂L_O/∂ℓ_bj = −g_b w_bj / #roots``. Normalised by the number of roots *attempted* (invalid or
    non-improving branches count in the denominator); the trainer adds ``λ_O · L_O`` (λ_O = 0.1) to the base
    loss. Padded branches need gate 0.

    Args:
      mean_logp_bj: [Br, J] ℓ under the current policy. weight_bj: [Br, J]. gate_b: [Br].
      step_mask_bj: [Br, J] real steps. num_roots: [] roots attempted (clamped to ≥ 1).
    Returns:
      [] loss.
    """
    chex.assert_rank([mean_logp_bj, weight_bj, gate_b, step_mask_bj], [2, 2, 1, 2])
    chex.assert_equal_shape([mean_logp_bj, weight_bj, step_mask_bj])
    w_bj = jax.lax.stop_gradient(weight_bj)
    g_b = jax.lax.stop_gradient(gate_b)
    per_branch_b = jnp.where(step_mask_bj, w_bj * mean_logp_bj, 0.0).sum(-1)
    denom = jnp.maximum(jnp.asarray(num_roots, mean_logp_bj.dtype), 1.0)
    return -jnp.sum(g_b * per_branch_b) / denom


def row_coefficients(
    weight_bj: Float[Array, "Br J"],
    gate_b: Float[Array, " Br"],
    branch_n: chex.Array,
    depth_n: chex.Array,
    row_mask_n: Bool[Array, " N"],
    num_roots: ScalarLike,
) -> Float[Array, " N"]:
    """The coefficient of each oracle row in :func:`oracle_row_loss`: ``g_b · w_bj / #roots`` of its branch ``b``
    and depth ``j`` (0 on padding rows), so ``oracle_row_loss(ℓ_n, coef_n) == oracle_loss(ℓ_bj, w, g, ...)``."""
    chex.assert_rank([weight_bj, gate_b, branch_n, depth_n, row_mask_n], [2, 1, 1, 1, 1])
    b = jnp.clip(branch_n, 0, weight_bj.shape[0] - 1)
    j = jnp.clip(depth_n, 0, weight_bj.shape[1] - 1)
    denom = jnp.maximum(jnp.asarray(num_roots, weight_bj.dtype), 1.0)
    return jnp.where(row_mask_n, gate_b[b] * weight_bj[b, j] / denom, 0.0)


def oracle_row_loss(
    logp_nl: Float[Array, "N L"], token_mask_nl: Bool[Array, "N L"], coef_n: Float[Array, " N"]
) -> Float[Array, ""]:
    """``L_O`` over rows: ``−Σ_n sg(coef_n) · mean_{l ∈ cmd} log π_θ(token_nl)`` (a row without command tokens adds
    0). Summing it over micro-batches of rows gives the loss of all rows."""
    chex.assert_rank([logp_nl, token_mask_nl, coef_n], [2, 2, 1])
    chex.assert_equal_shape([logp_nl, token_mask_nl])
    n_n = token_mask_nl.sum(-1).astype(logp_nl.dtype)
    mean_n = jnp.where(token_mask_nl, logp_nl, 0.0).sum(-1) / jnp.maximum(n_n, 1.0)
    return -jnp.sum(jax.lax.stop_gradient(coef_n) * mean_n)


__all__ = ["oracle_loss", "oracle_row_loss", "row_coefficients"]
