"""Credit accuracy: how well a method's per-step advantage agrees with an exact advantage (METHODS.md, "Exact
credit on a known model").

Over rows ``n`` (one policy turn each) with non-negative weights ``w_n`` (1 for a decision row, 0 for a row
left out: each row counts once, so the measure is visit-weighted over states)::

    x̄ = Σ w x / Σ w,   cov = Σ w (x − x̄)(y − ȳ),   pearson = cov / sqrt(Σ w (x − x̄)² · Σ w (y − ȳ)²)
    sign_agreement = Σ_{|y| > atol} w · 1[sign x = sign y] / Σ_{|y| > atol} w

with ``x`` the method's advantage and ``y`` the exact ``A^π(s_t, a_t)``. Sign agreement counts only rows whose
exact advantage is non-zero (``|y| > atol``); an advantage of exactly 0 there carries no sign and counts as a
disagreement (a method that gives a row no credit does not get it right).

Edge cases: ``pearson`` is NaN when either input is constant over the rows of positive weight (zero weighted
variance) or the total weight is 0; ``sign_agreement`` is NaN when no row of positive weight has a non-zero
exact advantage. Means are taken after shifting each input by its first weighted value, so a constant input has
exactly zero variance (and gives NaN) rather than a rounding residue.

Pure ``jax.numpy`` on 1-D rows, jit-compiled (``atol`` is a traced argument, so it does not recompile) and
vmappable over a leading batch axis; the dtype follows the inputs (float32 unless x64 is enabled).
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float


@jax.jit
def credit_accuracy(
    advantage: Float[Array, " N"],
    exact: Float[Array, " N"],
    weight: Float[Array, " N"] | Bool[Array, " N"],
    atol: float | Float[Array, ""] = 0.0,
) -> dict[str, Float[Array, ""]]:
    """Weighted Pearson correlation and sign agreement of ``advantage`` with ``exact`` (module docstring).

    Args:
      advantage: [N] a method's per-step advantage x_n.
      exact: [N] the exact advantage y_n = A^π(s_n, a_n) at the same rows.
      weight: [N] non-negative row weights w_n (bool masks are accepted: 1 keeps a row, 0 drops it).
      atol: rows with ``|exact| <= atol`` are left out of the sign agreement.
    Returns:
      ``{"pearson": [], "sign_agreement": []}``, NaN where undefined.
    """
    chex.assert_rank([advantage, exact, weight], 1)
    chex.assert_equal_shape([advantage, exact, weight])
    dtype = jnp.result_type(advantage.dtype, exact.dtype, jnp.float32)
    x, y = advantage.astype(dtype), exact.astype(dtype)
    w = jnp.maximum(weight.astype(dtype), 0.0)
    total = w.sum()
    first = jnp.argmax(w > 0)  # shift by a weighted member: a constant input has exactly zero variance
    dx = x - x[first]
    dy = y - y[first]
    safe_total = jnp.where(total > 0, total, 1.0)
    dx = dx - (w * dx).sum() / safe_total
    dy = dy - (w * dy).sum() / safe_total
    var_x, var_y = (w * dx * dx).sum(), (w * dy * dy).sum()
    defined = (total > 0) & (var_x > 0) & (var_y > 0)
    denom = jnp.sqrt(jnp.where(defined, var_x * var_y, 1.0))
    pearson = jnp.where(defined, (w * dx * dy).sum() / denom, jnp.nan)
    signed = w * (jnp.abs(y) > atol)
    agree = (jnp.sign(x) == jnp.sign(y)) & (x != 0)
    signed_total = signed.sum()
    sign_agreement = jnp.where(signed_total > 0, (signed * agree).sum() / jnp.where(signed_total > 0,
                                                                                   signed_total, 1.0), jnp.nan)
    return {"pearson": jnp.clip(pearson, -1.0, 1.0), "sign_agreement": sign_agreement}
