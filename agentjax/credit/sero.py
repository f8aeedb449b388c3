"""SERO credit: compatibility, policy-reachability weights and the improvement gate.

METHODS.md "SERO"; papers/SERO.txt §4.3–4.4, §B, §F. One *branch* is the oracle continuation executed from
one restored root: ``J`` oracle steps (padded; ``step_mask_j``), each with the prompt the policy would have
seen and the oracle's command tokens (``L`` positions, ``token_mask_jl``). The kernels take one branch and are
pure; the ``batched_*`` wrappers vmap them over branches (shape letter ``Br``, ``b`` in array names: one
branch per root, at most one root per group) and are jitted. Real steps need not be a prefix: a step's depth
is its rank among the branch's real steps, so padding anywhere never changes the values on real steps.

Gates and weights are constants of the auxiliary loss (:mod:`agentjax.losses.sero`); the length-normalised
log-likelihood :func:`mean_token_logp` is used here under π_old and is that loss's per-step term under π_θ. Oracle
data never enters the base method's statistics (that is the trainer's job, :mod:`agentjax.train.sero`).
"""

from __future__ import annotations

import functools
from typing import Literal, NamedTuple

import chex
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, PRNGKeyArray

Scheme = Literal["sero", "root_only", "full_flat", "depth_decay", "shuffled", "short_bridge"]
SCHEMES: tuple[str, ...] = ("sero", "root_only", "full_flat", "depth_decay", "shuffled", "short_bridge")


class SeroCredit(NamedTuple):
    """SERO's stop-gradient constants for one branch (or ``[Br, ...]`` batched)."""

    compat_j: Float[Array, "*Br J"]  # c_j = exp(mean command-token log π_old); 0 on padding
    weight_j: Float[Array, "*Br J"]  # supervision weight of step j under the scheme; 0 on padding
    gate: Float[Array, "*Br"]  # branch improvement gate g (0/1, or in [0, 1] when soft)


def mean_token_logp(
    logp_jl: Float[Array, "J L"], token_mask_jl: Bool[Array, "J L"], step_mask_j: Bool[Array, " J"]
) -> Float[Array, " J"]:
    """Length-normalised command log-likelihood of each oracle step (SERO §B.1).

    ``ℓ_j = (1/n_j) Σ_l m_jl · log π(token_jl | prompt_j)``, ``n_j = Σ_l m_jl``. With ``π = π_old``
    (the frozen behaviour policy) ``ℓ_j = log c_j``; with ``π = π_θ`` it is the per-step term of
    :func:`agentjax.losses.sero.oracle_loss`. A real step without command tokens gets ``ℓ_j = 0`` (``c_j = 1``: no
    evidence, no down-weighting).

    Args:
      logp_jl: [J, L] token log-probs. token_mask_jl: [J, L] command tokens. step_mask_j: [J] real steps.
    Returns:
      [J] mean token log-prob, 0 on padding.
    """
    chex.assert_rank([logp_jl, token_mask_jl, step_mask_j], [2, 2, 1])
    chex.assert_equal_shape([logp_jl, token_mask_jl])
    chex.assert_equal_shape_prefix([logp_jl, step_mask_j], 1)
    m_jl = token_mask_jl & step_mask_j[:, None]
    n_j = m_jl.sum(-1).astype(logp_jl.dtype)
    total_j = jnp.where(m_jl, logp_jl, 0.0).sum(-1)
    return jnp.where(step_mask_j, total_j / jnp.maximum(n_j, 1.0), 0.0)


batched_mean_token_logp = jax.jit(jax.vmap(mean_token_logp))
"""[Br, J, L] log-probs, [Br, J, L] command mask, [Br, J] step mask -> [Br, J] mean token log-prob."""


def compatibility(
    logp_old_jl: Float[Array, "J L"], token_mask_jl: Bool[Array, "J L"], step_mask_j: Bool[Array, " J"]
) -> Float[Array, " J"]:
    """Per-step compatibility ``c_j = exp(mean_{l ∈ cmd(a_j)} log π_old(token_l | prompt_j))`` (SERO §4.3).

    A length-normalised compatibility proxy, not the probability of the whole command (SERO §B.1).

    Returns:
      [J] ``c_j`` in (0, 1] for real steps, 0 on padding.
    """
    log_c_j = mean_token_logp(logp_old_jl, token_mask_jl, step_mask_j)
    return jnp.where(step_mask_j, jnp.exp(log_c_j), 0.0)


def _step_rank(step_mask_j: Bool[Array, " J"]) -> Array:
    """Rank of each step among the branch's real steps (its oracle depth 0, 1, ...)."""
    m_j = step_mask_j.astype(jnp.int32)
    return jnp.cumsum(m_j) - m_j


def reachability_weights(
    log_compat_j: Float[Array, " J"], step_mask_j: Bool[Array, " J"]
) -> Float[Array, " J"]:
    """Exclusive-prefix policy-reachability weights ``w_0 = 1, w_j = Π_{i<j} c_i`` (SERO §4.3, §B.2).

    Computed in log space, ``w_j = exp(Σ_{i<j, real} log c_i)`` (an exclusive cumsum), so the root step has
    unit weight and a low compatibility at step i down-weights only the later steps.

    Args:
      log_compat_j: [J] ``log c_j`` (:func:`mean_token_logp` under π_old). step_mask_j: [J] real steps.
    Returns:
      [J] weights, 0 on padding; ``≤ 1`` and non-increasing along the real steps when every ``c_i ≤ 1``.
    """
    chex.assert_rank([log_compat_j, step_mask_j], 1)
    chex.assert_equal_shape([log_compat_j, step_mask_j])
    log_c_j = jnp.where(step_mask_j, log_compat_j, 0.0)
    prefix_j = jnp.concatenate([jnp.zeros((1,), log_c_j.dtype), jnp.cumsum(log_c_j)[:-1]])
    return jnp.where(step_mask_j, jnp.exp(prefix_j), 0.0)


def _shuffle_real(w_j: Array, step_mask_j: Array, key: PRNGKeyArray) -> Array:
    """Permute ``w_j`` uniformly among the real steps; padding keeps its 0.

    Each step draws its sort key from ``fold_in(key, j)``, so the permutation of the real steps does not
    depend on how much padding follows them.
    """
    (num_steps,) = w_j.shape
    u_j = jax.vmap(lambda j: jax.random.uniform(jax.random.fold_in(key, j)))(jnp.arange(num_steps))
    source = jnp.argsort(jnp.where(step_mask_j, u_j, jnp.inf), stable=True)  # real steps in random order
    slots = jnp.argsort(~step_mask_j, stable=True)  # real positions in order, then padding
    return jnp.zeros_like(w_j).at[slots].set(w_j[source])


def branch_weights(
    log_compat_j: Float[Array, " J"],
    step_mask_j: Bool[Array, " J"],
    *,
    scheme: Scheme = "sero",
    gamma: float = 0.9,
    k: int = 1,
    key: PRNGKeyArray | None = None,
    match_mass: bool = False,
) -> Float[Array, " J"]:
    """Supervision weight of each oracle step under SERO or one of its ablations (SERO §5.3, §A.1, §A.7, §F).

    With ``d_j`` the step's rank among the real steps and ``w^S_j = Π_{i<j} c_i``
    (:func:`reachability_weights`):

    - ``"sero"``:        ``w_j = w^S_j``.
    - ``"root_only"``:   ``w_j = 1[d_j = 0]`` (``e_0``: the first oracle action only).
    - ``"full_flat"``:   ``w_j = 1`` on every real step (one shared branch weight, 1; with ``match_mass`` it
      is SERO's mean weight ``Σ_i w^S_i / n``, the fixed-bank "Flat" control).
    - ``"depth_decay"``: ``w_j = γ^{d_j}`` (γ is not given in the paper; default 0.9).
    - ``"shuffled"``:    ``w^S`` permuted uniformly among the real steps (``key`` required).
    - ``"short_bridge"``: ``w_j = 1[d_j < k]`` (the first k oracle steps at weight 1; ``k = 1`` is Root-only, ``k ≥ J``
      is Full-Flat).

    ``match_mass=True`` rescales any scheme to SERO's total supervision mass per branch,
    ``w_j ← w_j · Σ_i w^S_i / Σ_i w_i`` (the paper's fixed-bank control, §F.2); a scheme with zero mass
    stays 0.

    Args:
      log_compat_j: [J] ``log c_j``. step_mask_j: [J] real steps.
      scheme: static; one of :data:`SCHEMES`. gamma: depth-decay factor. k: static short-bridge length.
      key: PRNG key of the shuffled control. match_mass: static; rescale to SERO's mass.
    Returns:
      [J] weights, 0 on padding.
    """
    chex.assert_rank([log_compat_j, step_mask_j], 1)
    chex.assert_equal_shape([log_compat_j, step_mask_j])
    w_sero = reachability_weights(log_compat_j, step_mask_j)
    d_j = _step_rank(step_mask_j)
    real = step_mask_j.astype(w_sero.dtype)
    if scheme == "sero":
        w_j = w_sero
    elif scheme == "root_only":
        w_j = real * (d_j == 0)
    elif scheme == "full_flat":
        w_j = real
    elif scheme == "depth_decay":
        w_j = real * jnp.power(jnp.asarray(gamma, w_sero.dtype), d_j.astype(w_sero.dtype))
    elif scheme == "shuffled":
        if key is None:
            raise ValueError("branch_weights: scheme='shuffled' needs a PRNG key")
        w_j = _shuffle_real(w_sero, step_mask_j, key)
    elif scheme == "short_bridge":
        w_j = real * (d_j < k)
    else:
        raise ValueError(f"branch_weights: unknown scheme {scheme!r}; use one of {SCHEMES}")
    if match_mass:
        mass = w_j.sum()
        w_j = jnp.where(mass > 0, w_j * (w_sero.sum() / jnp.where(mass > 0, mass, 1.0)), 0.0)
    return w_j


def improvement_gate(
    valid: Bool[Array, "*Br"],
    oracle_return: Float[Array, "*Br"],
    suffix_return: Float[Array, "*Br"],
    *,
    scale: float = 1.0,
    soft: bool = False,
) -> Float[Array, "*Br"]:
    """Branch improvement gate (METHODS.md SERO 4; SERO §4.4): elementwise over branches.

    The returns are compared in normalised units, ``Δ = (R_oracle − R_suffix) / scale``, where ``scale`` is
    the reward-normalisation scale (binary success: 1; ``10·R`` env rewards: 10). Hard gate (default, the
    paper's): ``g = valid · 1[Δ > 0]``. Soft gate (``soft=True``, an option for graded returns such as the
    WebShop score): ``g = valid · clip(Δ, 0, 1)``. For binary success and ``scale = 1`` both are
    ``valid ∧ (R_oracle > R_suffix)``: the on-policy suffix failed and the oracle succeeded.

    Args:
      valid: [*Br] the branch restored and validated. oracle_return, suffix_return: [*Br] returns over the
        same remaining horizon H − t. scale: reward scale (> 0). soft: static; graded gate.
    Returns:
      [*Br] float gate.
    """
    chex.assert_equal_shape([valid, oracle_return, suffix_return])
    delta = (oracle_return - suffix_return) / scale
    g = jnp.clip(delta, 0.0, 1.0) if soft else (delta > 0).astype(delta.dtype)
    return jnp.where(valid, g, 0.0)


def sero_branch_credit(
    logp_old_jl: Float[Array, "J L"],
    token_mask_jl: Bool[Array, "J L"],
    step_mask_j: Bool[Array, " J"],
    valid: Bool[Array, ""],
    oracle_return: Float[Array, ""],
    suffix_return: Float[Array, ""],
    *,
    scheme: Scheme = "sero",
    gamma: float = 0.9,
    k: int = 1,
    key: PRNGKeyArray | None = None,
    match_mass: bool = False,
    scale: float = 1.0,
    soft_gate: bool = False,
) -> SeroCredit:
    """Compatibilities, weights and gate of one branch (:func:`compatibility`, :func:`branch_weights`,
    :func:`improvement_gate`) from the behaviour policy's command-token log-probs."""
    log_c_j = mean_token_logp(logp_old_jl, token_mask_jl, step_mask_j)
    compat_j = jnp.where(step_mask_j, jnp.exp(log_c_j), 0.0)
    w_j = branch_weights(log_c_j, step_mask_j, scheme=scheme, gamma=gamma, k=k, key=key,
                         match_mass=match_mass)
    gate = improvement_gate(valid, oracle_return, suffix_return, scale=scale, soft=soft_gate)
    return SeroCredit(compat_j=compat_j, weight_j=w_j, gate=gate)


def _branch_keys(key: PRNGKeyArray, num_branches: int) -> Array:
    """``fold_in(key, b)`` per branch: a branch's key does not depend on how many branches follow it."""
    return jax.vmap(lambda b: jax.random.fold_in(key, b))(jnp.arange(num_branches))


@functools.partial(jax.jit, static_argnames=("scheme", "gamma", "k", "match_mass", "scale", "soft_gate"))
def batched_sero_credit(
    logp_old_bjl: Float[Array, "Br J L"],
    token_mask_bjl: Bool[Array, "Br J L"],
    step_mask_bj: Bool[Array, "Br J"],
    valid_b: Bool[Array, " Br"],
    oracle_return_b: Float[Array, " Br"],
    suffix_return_b: Float[Array, " Br"],
    *,
    scheme: Scheme = "sero",
    gamma: float = 0.9,
    k: int = 1,
    key: PRNGKeyArray | None = None,
    match_mass: bool = False,
    scale: float = 1.0,
    soft_gate: bool = False,
) -> SeroCredit:
    """:func:`sero_branch_credit` vmapped over branches; the shuffled control uses ``fold_in(key, b)``."""
    chex.assert_rank([logp_old_bjl, step_mask_bj, valid_b], [3, 2, 1])
    keys = None if key is None else _branch_keys(key, valid_b.shape[0])
    fn = functools.partial(sero_branch_credit, scheme=scheme, gamma=gamma, k=k, match_mass=match_mass,
                           scale=scale, soft_gate=soft_gate)
    return jax.vmap(lambda *a: fn(*a[:6], key=a[6]))(
        logp_old_bjl, token_mask_bjl, step_mask_bj, valid_b, oracle_return_b, suffix_return_b, keys)


@functools.partial(jax.jit, static_argnames=("scheme", "gamma", "k", "match_mass"))
def batched_branch_weights(
    log_compat_bj: Float[Array, "Br J"],
    step_mask_bj: Bool[Array, "Br J"],
    *,
    scheme: Scheme = "sero",
    gamma: float = 0.9,
    k: int = 1,
    key: PRNGKeyArray | None = None,
    match_mass: bool = False,
) -> Float[Array, "Br J"]:
    """:func:`branch_weights` vmapped over branches; the shuffled control uses ``fold_in(key, b)``."""
    chex.assert_rank([log_compat_bj, step_mask_bj], 2)
    keys = None if key is None else _branch_keys(key, log_compat_bj.shape[0])
    fn = functools.partial(branch_weights, scheme=scheme, gamma=gamma, k=k, match_mass=match_mass)
    return jax.vmap(lambda lc, m, kk: fn(lc, m, key=kk))(log_compat_bj, step_mask_bj, keys)


__all__ = ["SCHEMES", "Scheme", "SeroCredit", "batched_branch_weights", "batched_mean_token_logp",
           "batched_sero_credit", "branch_weights", "compatibility", "improvement_gate", "mean_token_logp",
           "reachability_weights", "sero_branch_credit"]
