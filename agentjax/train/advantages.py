"""Credit method → one advantage per `StepBatch` row, from the kernels of :mod:`agentjax.credit`.

``compute_advantages(config.credit, batch, config.rollout)`` scatters the rows into ``[G, R, T]`` group views
(:func:`agentjax.rollout.to_groups`), runs the method's ``batched_*`` kernel and gathers the per-step values
back to rows (:func:`agentjax.rollout.from_groups`); the loss broadcasts a row's advantage to each of its trained
response tokens. Nothing is rescaled on the way: the advantage a token sees is the one the kernel computed
(tests/train/test_update.py checks this end to end), except PPO's optional whitening below.

=========  ======================================================================================
method     advantage of row (i, t)
=========  ======================================================================================
grpo       :func:`~agentjax.credit.batched_grpo` — rollout i's group-normalised episode score
rloo       :func:`~agentjax.credit.batched_rloo` — leave-one-out baseline
gigpo      :func:`~agentjax.credit.batched_gigpo` — episode + anchor-state step advantage
hgpo       :func:`~agentjax.credit.batched_hgpo` — history-window anchor groups
graphgpo   :func:`~agentjax.credit.batched_graphgpo` — shortest-path step returns + episode term
crbc       :func:`~agentjax.credit.batched_crbc` — GRPO + w_S · normalised closure credit
ppo        :func:`~agentjax.credit.batched_gae` — turn-level GAE(γ, λ) from the value head
=========  ======================================================================================

PPO (choice: **turn-level**). One value per policy turn, ``V(s_t)`` read by a linear head at the turn's last
prompt token (the state the policy acted in), as verl-agent's multi-turn PPO; GAE runs over the turns of a
rollout, ``δ_t = r_t + γ V(s_{t+1}) − V(s_t)``. A terminated episode bootstraps 0; a truncated one bootstraps
``bootstrap[row]`` at its last row — the value of the final observation, which the `StepBatch` does not carry,
so it defaults to 0 (the time limit is then a terminal of the finite-horizon task, as METHODS.md scores it;
pass the collector's final-observation values to bootstrap properly). The value targets are ``A_t + V(s_t)``
before whitening; with ``whiten`` the advantages are normalised over the batch's trained tokens (a row counts
once per trained token; unbiased variance, as verl's ``masked_whiten``).
"""

from __future__ import annotations

import functools

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from agentjax.credit import (
    batched_crbc,
    batched_gae,
    batched_gigpo,
    batched_graphgpo,
    batched_grpo,
    batched_hgpo,
    batched_rloo,
)
from agentjax.rollout.batch import NO_ID, StepBatch
from agentjax.rollout.groups import GroupView, check_unique_positions, from_groups, to_groups
from agentjax.train.config import (
    CRBCCredit,
    CreditConfig,
    GiGPOCredit,
    GraphGPOCredit,
    GRPOCredit,
    HGPOCredit,
    PPOCredit,
    RAOCredit,
    RLOOCredit,
    RolloutConfig,
)

WHITEN_EPS = 1e-8


@flax.struct.dataclass(frozen=True)
class Advantages:
    """Per-row credit for one batch, as the update consumes it."""

    advantage: Float[Array, " B"]  # [B] f32, the advantage every trained token of the row sees (0 on padding)
    returns: Float[Array, " B"]  # [B] f32, PPO value targets (0 for the other methods)
    values: Float[Array, " B"]  # [B] f32, V_old of the row's state (PPO; 0 for the other methods)
    stats: dict[str, Float[Array, ""]]  # credit statistics (scalars) for the metrics


def _view(batch: StepBatch, rollout: RolloutConfig) -> GroupView:
    return to_groups(batch, num_groups=rollout.num_groups, num_rollouts=rollout.group_size,
                     max_steps=rollout.max_steps)


def _row_mean_std(x_b, w_b):
    n = jnp.maximum(w_b.sum(), 1.0)
    mean = jnp.sum(w_b * x_b) / n
    return mean, jnp.sqrt(jnp.sum(w_b * jnp.square(x_b - mean)) / n)


def _gae(credit: PPOCredit, batch, view, values_b, bootstrap_b):
    safe_row = jnp.maximum(view.row, 0)
    value_grt = jnp.where(view.row != NO_ID, values_b[safe_row], 0.0)
    last_t = jnp.maximum(view.length - 1, 0)[..., None]
    last_row_gr = jnp.take_along_axis(view.row, last_t, axis=-1)[..., 0]
    bootstrap_gr = jnp.where(last_row_gr != NO_ID, bootstrap_b[jnp.maximum(last_row_gr, 0)], 0.0)
    adv_grt, ret_grt = batched_gae(view, value_grt, bootstrap_gr, gamma=credit.gamma, lam=credit.lam)
    adv_b, ret_b = from_groups(adv_grt, batch), from_groups(ret_grt, batch)
    if credit.whiten:
        w_b = jnp.where(batch.row_mask, batch.response_mask.sum(-1), 0).astype(jnp.float32)
        n = w_b.sum()
        mean = jnp.sum(w_b * adv_b) / jnp.maximum(n, 1.0)
        var = jnp.sum(w_b * jnp.square(adv_b - mean)) / jnp.maximum(n - 1.0, 1.0)
        adv_b = jnp.where(batch.row_mask, (adv_b - mean) * jax.lax.rsqrt(var + WHITEN_EPS), 0.0)
    return adv_b, ret_b


@functools.partial(jax.jit, static_argnames=("credit", "rollout"))
def _compute(credit: CreditConfig, rollout: RolloutConfig, batch: StepBatch, values_b, bootstrap_b) -> Advantages:
    view = _view(batch, rollout)
    zeros_b = jnp.zeros(batch.reward.shape, jnp.float32)
    returns_b, old_values_b = zeros_b, zeros_b
    stats = {}
    match credit:
        case GRPOCredit():
            adv_b = from_groups(batched_grpo(view, score=credit.score, ddof=credit.ddof), batch)
        case RLOOCredit():
            adv_b = from_groups(batched_rloo(view, score=credit.score), batch)
        case GiGPOCredit():
            adv_b = from_groups(batched_gigpo(view, gamma=credit.gamma, mode=credit.mode,
                                              step_weight=credit.step_weight), batch)
        case HGPOCredit():
            adv_b = from_groups(batched_hgpo(view, gamma=credit.gamma, history=credit.history, alpha=credit.alpha,
                                             mode=credit.mode, trajectory_term=credit.trajectory_term), batch)
        case GraphGPOCredit():
            adv_b = from_groups(batched_graphgpo(
                view, gamma=credit.gamma, normalised=credit.normalised, mode=credit.mode,
                step_weight=credit.step_weight, episode_weight=credit.episode_weight,
                success_reward=credit.success_reward), batch)
        case CRBCCredit():
            out = batched_crbc(view, beta=credit.beta, depth=credit.depth, w_traj=credit.w_traj,
                               w_step=credit.w_step, sigma_min=credit.sigma_min, score=credit.score)
            adv_b = from_groups(out.advantage, batch)
            eligible = out.eligible & view.mask
            n_eligible = eligible.sum().astype(jnp.float32)
            stats["crbc_eligible_frac"] = n_eligible / jnp.maximum(view.mask.sum(), 1).astype(jnp.float32)
            stats["crbc_step_credit_abs_mean"] = (jnp.sum(jnp.where(eligible, jnp.abs(out.credit), 0.0))
                                                  / jnp.maximum(n_eligible, 1.0))
        case PPOCredit():
            adv_b, returns_b = _gae(credit, batch, view, values_b, bootstrap_b)
            old_values_b = jnp.where(batch.row_mask, values_b, 0.0)
            w_b = batch.row_mask.astype(jnp.float32)
            stats["value_mean"], _ = _row_mean_std(old_values_b, w_b)
            stats["return_mean"], ret_std = _row_mean_std(returns_b, w_b)
            _, resid_std = _row_mean_std(returns_b - old_values_b, w_b)
            stats["value_explained_var"] = 1.0 - jnp.square(resid_std) / jnp.maximum(jnp.square(ret_std), 1e-8)
        case RAOCredit():
            raise TypeError("compute_advantages: RAO's credit is per tree node, from a TreeBatch "
                            "(agentjax.train.tree_credit.row_credit); the flat trainer does not train it")
        case _:
            raise TypeError(f"compute_advantages: unknown credit config {type(credit).__name__}")
    adv_b = jnp.where(batch.row_mask, adv_b, 0.0)
    w_b = batch.row_mask.astype(jnp.float32)
    stats["adv_mean"], stats["adv_std"] = _row_mean_std(adv_b, w_b)
    stats["adv_abs_max"] = jnp.max(jnp.abs(adv_b))
    stats["adv_zero_frac"] = jnp.sum(w_b * (adv_b == 0.0)) / jnp.maximum(w_b.sum(), 1.0)
    return Advantages(advantage=adv_b, returns=returns_b, values=old_values_b, stats=stats)


def check_batch_fits(batch: StepBatch, rollout: RolloutConfig) -> None:
    """Host check that every real row has a place in the ``[G, R, T]`` views (else its credit would silently be
    0) and that no place is taken twice; raises ``ValueError`` naming the first offence and the fix."""
    m = np.asarray(batch.row_mask)
    for field, limit, knob in (("group", rollout.num_groups, "num_groups"), ("rollout", rollout.group_size,
                               "group_size"), ("step", rollout.max_steps, "max_steps")):
        idx = np.asarray(getattr(batch, field))[m]
        bad = (idx < 0) | (idx >= limit)
        if bad.any():
            raise ValueError(f"compute_advantages: a real row has {field}={int(idx[bad][0])} outside "
                             f"[0, {limit}); raise RolloutConfig.{knob} or fix the batch")
    check_unique_positions(batch)


def compute_advantages(
    credit: CreditConfig,
    batch: StepBatch,
    rollout: RolloutConfig,
    *,
    values: Float[Array, " B"] | None = None,
    bootstrap: Float[Array, " B"] | None = None,
    check: bool = True,
) -> Advantages:
    """The per-row advantages of ``batch`` under ``credit`` (module docstring).

    Args:
      credit: the method and its parameters (``config.credit``).
      batch: the rollouts, rows placed by ``(group, rollout, step)``.
      rollout: the static group-view sizes (``config.rollout``).
      values: [B] PPO only: ``V_old`` of each row's state, from :func:`agentjax.train.update.make_value_fn`.
      bootstrap: [B] PPO only: on an episode's last row, V of the final observation (used if truncated);
        default 0.
      check: run :func:`check_batch_fits` on the host first (skip it under an outer ``jit``).
    Returns:
      :class:`Advantages`.
    """
    if check:
        check_batch_fits(batch, rollout)
    zeros = jnp.zeros(batch.reward.shape, jnp.float32)
    if isinstance(credit, PPOCredit):
        if values is None:
            raise ValueError("compute_advantages: PPO needs the value head's values of the batch: "
                             "values = make_value_fn(config, model)(state, batch)")
    elif values is not None or bootstrap is not None:
        raise ValueError(f"compute_advantages: values/bootstrap are PPO inputs; {credit.method} takes none")
    values = zeros if values is None else jnp.asarray(values, jnp.float32)
    bootstrap = zeros if bootstrap is None else jnp.asarray(bootstrap, jnp.float32)
    return _compute(credit, rollout, batch, values, bootstrap)
