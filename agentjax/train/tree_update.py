"""`make_tree_update(config, model, tx) -> update(state, batch, adv_b)`: one CISPO optimizer step of a RAO stage.

The objective (METHODS.md "SERA" 6; :mod:`agentjax.losses.cispo`), over the stage's trained tokens ``m`` of the
whole batch (:func:`agentjax.train.tree_credit.row_credit`: execution or delegation tokens of the sampled rows)::

    L = −Σ_{b,l} m_bl sg(clip(ρ_bl, ρ_low, ρ_high)) A_b log π_θ(y_bl) / Σ m        (token mean, no KL, no entropy)

with ``ρ = π_θ / π_old`` (``π_old`` the sampler's ``behaviour_logp``), ``A_b`` the row's advantage × depth weight,
and the released bounds ``[0, 5]`` (``RAOCredit.clip_low`` / ``clip_high``). One call is one AdamW step on the
whole batch (released ``ppo_n_minibatches: 1``): the gradient is summed over micro-batches of
``micro_batch_size`` rows with ``lax.scan`` (rows that train first; micro-batches without one are skipped), each
row's log-probs from the flat update's decoder pass (:func:`agentjax.train.update.forward_rows`, constrained
log-probs where the batch carries ``allowed_tokens``).

The stage schedule advances here (:func:`agentjax.train.schedule.advance`): an applied step moves
``state.schedule.step``; a NaN/Inf loss or gradient leaves the parameters as they were, counts in
``state.nonfinite`` and ``state.schedule.skipped``. ``state.step`` counts batches. ``update`` is jitted per batch
shape and donates ``state``; on one CPU device the rows are compacted first (``TrainConfig.compact_rows``; prompt widths
and shared prefixes in multiples of :data:`TREE_COMPACT_BUCKET` tokens, so a run compiles a few shapes).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import chex
import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jaxtyping import Array, Float

from agentjax.losses.cispo import cispo_terms
from agentjax.losses.policy import aggregation_weights, broadcast_advantage, weighted_sum
from agentjax.rollout.batch import StepBatch
from agentjax.train.compact import compact_rows
from agentjax.train.config import LossConfig, OptimizerConfig, RAOCredit, TrainConfig
from agentjax.train.schedule import advance
from agentjax.train.state import TrainState, make_schedule, policy_params
from agentjax.train.update import _row_order, forward_rows, trained_mask

Metrics = dict[str, jax.Array]
TREE_COMPACT_BUCKET = 256  # compact_rows' bucket: node prompts vary in length, so coarse widths (fewer compiles)


@dataclasses.dataclass(frozen=True)
class TreeUpdateSpec:
    """What the tree update depends on (configs that differ elsewhere share one compiled update)."""

    loss: LossConfig
    optimizer: OptimizerConfig
    micro_batch_size: int
    clip_low: float | None
    clip_high: float | None
    compact_rows: bool

    @classmethod
    def of(cls, config: TrainConfig, model: nnx.Module | None = None) -> TreeUpdateSpec:
        if not isinstance(config.credit, RAOCredit):
            raise ValueError(f"make_tree_update: the tree update trains RAO, not {config.credit.method!r}")
        compact = config.compact_rows
        if compact is None:  # auto: one CPU device's worth of unsharded rows
            compact = jax.default_backend() == "cpu" and getattr(model, "act_sharding", None) is None
        return cls(loss=config.loss, optimizer=config.optimizer, micro_batch_size=config.micro_batch_size,
                   clip_low=config.credit.clip_low, clip_high=config.credit.clip_high, compact_rows=bool(compact))


def _micro_objective(params, batch: StepBatch, adv_b, weight_bl, prefix_p=None, *, graphdef, spec: TreeUpdateSpec):
    """The micro-batch's share of ``L`` and its metric sums (whole-batch token weights add up)."""
    mask_bl = trained_mask(batch)
    logp, ent, _ = forward_rows(graphdef, params, batch, loss=spec.loss, with_entropy=True, prefix_p=prefix_p)
    terms = cispo_terms(logp, batch.behaviour_logp, broadcast_advantage(adv_b, mask_bl), mask_bl,
                        clip_low=spec.clip_low, clip_high=spec.clip_high)
    log_ratio = jnp.where(mask_bl, logp - jnp.where(mask_bl, batch.behaviour_logp, 0.0), 0.0)
    loss = weighted_sum(terms.loss, weight_bl)
    return loss, {"loss": loss, "entropy": weighted_sum(ent, weight_bl),
                  "clip_frac": weighted_sum(terms.clipped, weight_bl),
                  "ratio_mean": weighted_sum(terms.ratio, weight_bl),
                  "ratio_max": jnp.max(jnp.where(mask_bl, terms.ratio, 0.0)),
                  "behaviour_kl": weighted_sum(-log_ratio, weight_bl)}


def _combine(total: Metrics, part: Metrics) -> Metrics:
    return {k: jnp.maximum(total[k], part[k]) if k.endswith("_max") else total[k] + part[k] for k in total}


def make_tree_update(config: TrainConfig, model: nnx.Module, tx: optax.GradientTransformation,
                     ) -> Callable[..., tuple[TrainState, Metrics]]:
    """The jitted, state-donating ``update(state, batch, adv_b) -> (state, metrics)`` (module docstring).

    Args:
      config: the training config (RAO credit: CISPO bounds; loss: temperature, log-prob chunking; micro-batch).
      model: the policy; only its structure is used.
      tx: the optimizer the state was initialised with.
    Returns:
      ``update(state, batch, adv_b)``: ``batch`` a :class:`StepBatch` whose ``row_mask`` / ``response_mask`` are
      the rows and tokens to train (:class:`~agentjax.train.tree_credit.RowCredit`'s ``sample`` / ``token_mask``),
      ``adv_b`` [B] their advantages. Metrics (float32 scalars): loss, entropy, clip_frac, ratio_mean, ratio_max,
      behaviour_kl (token means over the trained tokens), grad_norm, lr, skipped, nonfinite_total, tokens, rows.
    """
    policy_params(model)  # raises on non-Param state
    return _build(TreeUpdateSpec.of(config, model), nnx.graphdef(model), tx)


def _gradients(spec: TreeUpdateSpec, graphdef: nnx.GraphDef, params, batch: StepBatch, adv_b, prefix_p=None):
    """(float32 gradients of ``L`` in the parameters, metric sums), over micro-batches of the rows (module
    docstring): rows that train first, micro-batches without one skipped."""
    objective = functools.partial(_micro_objective, graphdef=graphdef, spec=spec)
    size = spec.micro_batch_size
    chex.assert_equal_shape([adv_b, batch.reward])
    if batch.capacity % size:
        raise ValueError(f"tree update: {batch.capacity} rows do not split into micro-batches of {size}")
    order = _row_order(batch.row_mask, None)
    batch, adv_b = jax.tree.map(lambda x: x[order], batch), adv_b[order]
    weight_bl = aggregation_weights(trained_mask(batch), "token-mean")
    cut = lambda i, x: jax.lax.dynamic_slice_in_dim(x, i * size, size)  # noqa: E731

    def compute(i):
        mb, a, w = jax.tree.map(functools.partial(cut, i), (batch, adv_b, weight_bl))
        (_, metrics), grads = jax.value_and_grad(objective, has_aux=True)(params, mb, a, w, prefix_p)
        return jax.tree.map(lambda g: g.astype(jnp.float32), grads), metrics

    zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), jax.eval_shape(compute, 0))

    def body(total, i):
        part = jax.lax.cond(cut(i, batch.row_mask).any(), compute, lambda _: zeros, i)
        return (jax.tree.map(jnp.add, total[0], part[0]), _combine(total[1], part[1])), None

    (grads, metrics), _ = jax.lax.scan(body, zeros, jnp.arange(batch.capacity // size))
    return grads, metrics


def make_tree_grad_fn(config: TrainConfig, model: nnx.Module) -> Callable[..., tuple[Any, Metrics]]:
    """The jitted ``grads(params, batch, adv_b) -> (float32 gradients, metrics)`` of the tree update's objective,
    without a step (rows uncompacted): what ``update`` applies."""
    policy_params(model)
    spec = dataclasses.replace(TreeUpdateSpec.of(config, model), compact_rows=False)
    return jax.jit(functools.partial(_gradients, spec, nnx.graphdef(model)))


@functools.lru_cache(maxsize=8)
def _build(spec: TreeUpdateSpec, graphdef: nnx.GraphDef, tx: optax.GradientTransformation):
    schedule = make_schedule(spec.optimizer)

    def update(state: TrainState, batch: StepBatch, adv_b: Float[Array, " B"], prefix_p=None):
        grads, metrics = _gradients(spec, graphdef, state.params, batch, adv_b, prefix_p)
        grads = jax.tree.map(lambda g, p: g.astype(p.dtype), grads, state.params)
        grad_norm = optax.tree.norm(grads)
        finite = jnp.isfinite(metrics["loss"]) & jnp.isfinite(grad_norm)
        trainable = state.trainable

        def apply(operand):
            params, opt_state = operand
            updates, opt_state = tx.update({"policy": grads, "value_head": {}}, opt_state, params)
            return optax.apply_updates(params, updates), opt_state

        trainable, opt_state = jax.lax.cond(finite, apply, lambda operand: operand, (trainable, state.opt_state))
        skipped = (~finite).astype(jnp.int32)
        new_state = state.replace(step=state.step + 1, params=trainable["policy"], opt_state=opt_state,
                                  nonfinite=state.nonfinite + skipped, schedule=advance(state.schedule, finite))
        metrics |= {"grad_norm": grad_norm, "skipped": skipped.astype(jnp.float32),
                    "lr": jnp.asarray(schedule(state.schedule.step), jnp.float32),
                    "nonfinite_total": new_state.nonfinite.astype(jnp.float32),
                    "tokens": trained_mask(batch).sum().astype(jnp.float32),
                    "rows": batch.row_mask.sum().astype(jnp.float32)}
        return new_state, metrics

    jitted = jax.jit(update, donate_argnums=0)
    if not spec.compact_rows:
        return jitted

    def compacted(state: TrainState, batch: StepBatch, adv_b: Any):
        batch, prefix_p = compact_rows(batch, TREE_COMPACT_BUCKET)
        return jitted(state, batch, adv_b, prefix_p)

    compacted.jitted = jitted
    return compacted


def skip_batch(state: TrainState) -> TrainState:
    """The state after a batch with nothing to train (no sampled row): one more batch, the schedule not advanced
    (METHODS.md "SERA" 7: a skipped batch does not advance the schedule)."""
    return state.replace(step=state.step + 1, schedule=advance(state.schedule, False))


__all__ = ["TREE_COMPACT_BUCKET", "TreeUpdateSpec", "make_tree_grad_fn", "make_tree_update", "skip_batch"]
