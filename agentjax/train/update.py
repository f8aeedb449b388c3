"""`make_update(config, model, tx) -> update(state, batch, key)`: one update of the policy on one batch, every method.

``batch`` is an :class:`UpdateBatch`: the rows (a :class:`~agentjax.rollout.batch.StepBatch`), each row's
advantage, and where the method has them PPO's value targets, SERO's oracle rows and the masks of the rows and
tokens a stage trains. One call of ``update`` is one AdamW step (:func:`agentjax.train.state.make_optimizer`) on
the gradient of the method's loss. The loss is a choice of the config, not a second update:

- PPO-clip (GRPO, RLOO, GiGPO, HGPO, GraphGPO, CRBC, PPO; :mod:`agentjax.losses.policy`)::

      L = Σ_{b,l} w_bl [ℓ^clip_bl + β_KL k3_bl − c_H H_bl]  +  c_V Σ_b u_b ℓ^V_b  (+ λ_O L_O)

  the value term for PPO only, ``λ_O L_O`` with SERO only: the oracle rows' command-token NLL
  (:func:`agentjax.losses.sero.oracle_row_loss`, METHODS.md "SERO" 6), added at every optimizer step.
- CISPO (RAO and SERA: ``config.credit`` a :class:`~agentjax.train.config.RAOCredit`;
  :mod:`agentjax.losses.cispo`, METHODS.md "SERA" 6)::

      L = −Σ_{b,l} w_bl sg(clip(ρ_bl, ρ_low, ρ_high)) A_b log π_θ(y_bl)          (no KL, no entropy term)

  over the stage's rows and tokens (:attr:`UpdateBatch.row_mask` / :attr:`UpdateBatch.token_mask`: the sampled
  rows and their execution or delegation tokens, :func:`agentjax.train.tree_credit.row_credit`). SERA's rubric
  stage is this objective on its rubric rows (one per fork group whose rubric parsed, every completion token a
  rubric token, each with its group's ranking advantage: :func:`agentjax.train.rubric_stage.rubric_credit_rows`),
  which is :func:`agentjax.losses.rubric.rubric_loss` summed over micro-batches.

``w`` are the aggregation weights of the *whole* batch ("token-mean" or "seq-mean-token-mean"; CISPO: token mean)
and ``u_b = 1/#real rows``.

One accumulation for every loss. The batch's rows, real rows first (in an order drawn from ``key``; batch order
without one), are cut into micro-batches of ``config.micro_batch_size`` consecutive rows and ``lax.scan`` adds
their gradients and metrics up in an :class:`Accumulator` (float32 gradient sums, metric sums, metric maxima);
because the weights are the whole batch's, the sum is the full-batch gradient (not a mean of micro-batch means).
Micro-batches without a trained row are skipped by ``lax.cond`` (a fixed-capacity batch is mostly padding early
in training) and padding rows contribute nothing. SERO's oracle rows go through the same loop in micro-batches of
``config.oracle_micro_batch_size`` rows.

Rows. A row is its left-padded prompt followed by its right-padded response; the decoder runs once over the
concatenation (one segment: positions count real tokens, so left padding does not shift them) and the
log-probs of response token ``j`` are read from the hidden state at ``Lp − 1 + j`` through
:func:`agentjax.models.logprobs.chunked_logprobs` (no ``[B, L, V]`` float32 logits). A response token is fed to
the decoder iff it is at or before the row's last trained token (``response_mask``); trained tokens are
``response_mask`` of real rows. ``π_old`` is ``batch.behaviour_logp``; the reference log-probs come from
``state.ref_params`` without gradient. PPO's value is a linear head on the hidden state of the last prompt
token (turn-level, :mod:`agentjax.train.advantages`).

Non-finite steps. If the loss or the gradient norm is NaN/Inf the parameters and optimizer state are left as
they were, ``state.nonfinite`` counts the skipped optimizer step and ``metrics["skipped"]`` counts it;
:func:`check_nonfinite` logs it on the host and stops the run after ``config.max_nonfinite_updates`` skips.

Stage schedule. A state with a :class:`~agentjax.train.schedule.ScheduleState` (SERA, RAO) advances it when the
update's step was applied (:func:`agentjax.train.schedule.advance`) and counts it skipped otherwise; the learning
rate is then the schedule's step's. A batch with nothing to train (no sampled row) is not given to ``update``:
:func:`skip_batch` counts it (METHODS.md "SERA" 7: a skipped batch does not advance the schedule).

``update`` is jit-compiled once per batch shape and donates ``state`` (the caller must use the returned one).
Configs that differ only outside :class:`UpdateSpec` (e.g. in a non-PPO credit method) share one compiled update.
With ``TrainConfig.compact_rows`` (auto: one CPU device) the rows are compacted on the host first
(:func:`~agentjax.train.compact.compact_rows`; tree batches in multiples of
:data:`~agentjax.train.compact.TREE_COMPACT_BUCKET` tokens: node prompts vary in length, so coarse widths keep
the compiled shapes few).

Choices and deviations from verl / verl-agent:

- By default one call is one optimizer step over the whole batch (verl's ``ppo_mini_batch_size`` = the batch,
  one epoch; RAO's released ``ppo_n_minibatches: 1``). ``TrainConfig.mini_batches = M`` and ``epochs = E`` make
  it ``E × M`` steps, as verl's ``ppo_mini_batch_size = batch / M`` and ``ppo_epochs = E``: each epoch deals the
  rows (real rows first, in a fresh random order) round-robin into M mini-batches, each weighted over its own
  rows ("token-mean" per mini-batch, as verl), with the advantages computed once for the whole batch. Metrics are
  means over the steps (``*_max``: maximum; ``skipped``: the number of skipped steps). ``state.step`` counts
  updates; the optimizer (and its schedule: ``warmup_steps``, ``decay_steps``) counts steps.
- ``π_old`` is the sampler's ``behaviour_logp``; verl recomputes it with the training engine because vLLM's
  numerics differ. :func:`make_logprob_fn` recomputes it here when needed.
- PPO's value head shares the policy's trunk (verl trains a separate critic), so ``PPOCredit.value_coef``
  scales its gradient into the language model.
- Gradients are accumulated in float32 and cast to the parameter dtype before the optimizer; with bfloat16
  parameters there is no float32 master copy (AdamW's moments are in the parameter dtype).
- A skipped update still advances ``state.step`` (the loop's update counter); the learning-rate schedule and
  AdamW's bias correction count applied steps only.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable
from typing import Any

import chex
import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jaxtyping import Array, Bool, Float, Int, PRNGKeyArray

from agentjax.losses.cispo import cispo_terms
from agentjax.losses.policy import (
    aggregation_weights,
    broadcast_advantage,
    clipped_value_loss,
    low_var_kl,
    ppo_clip_terms,
    weighted_sum,
)
from agentjax.losses.sero import oracle_row_loss
from agentjax.models.logprobs import chunked_logprobs
from agentjax.rollout.batch import StepBatch
from agentjax.train.advantages import Advantages
from agentjax.train.compact import COMPACT_BUCKET, TREE_COMPACT_BUCKET, compact_rows
from agentjax.train.config import LossConfig, OptimizerConfig, PPOCredit, TrainConfig
from agentjax.train.schedule import advance
from agentjax.train.state import Params, TrainState, make_schedule, policy_params

log = logging.getLogger(__name__)

Metrics = dict[str, jax.Array]


class NonFiniteUpdateError(RuntimeError):
    """Raised by :func:`check_nonfinite` once more optimizer steps than allowed were skipped for NaN/Inf."""


@dataclasses.dataclass(frozen=True)
class UpdateSpec:
    """The part of a :class:`TrainConfig` that the update depends on (configs that differ elsewhere, e.g. only in
    a non-PPO credit method, share one compiled update)."""

    loss: LossConfig
    optimizer: OptimizerConfig
    micro_batch_size: int
    ppo: PPOCredit | None  # the value head's loss parameters; None: no value head
    mini_batches: int = 1
    epochs: int = 1
    compact_rows: bool = False  # compact_rows before the jitted update (TrainConfig.compact_rows, resolved)
    compact_bucket: int = COMPACT_BUCKET  # compact_rows' bucket of the rows (tree batches: TREE_COMPACT_BUCKET)
    sero_coef: float = 0.0  # λ_O of SERO's oracle loss (0: no SERO)
    oracle_micro_batch_size: int = 1  # oracle rows per micro-batch
    cispo_clip: tuple[float | None, float | None] | None = None  # CISPO's (ρ_low, ρ_high); None: PPO-clip

    @classmethod
    def of(cls, config: TrainConfig, model: nnx.Module | None = None) -> UpdateSpec:
        compact = config.compact_rows
        if compact is None:  # auto: one CPU device's worth of unsharded rows
            compact = jax.default_backend() == "cpu" and getattr(model, "act_sharding", None) is None
        cispo = (config.credit.clip_low, config.credit.clip_high) if config.is_tree else None
        return cls(loss=config.loss, optimizer=config.optimizer, micro_batch_size=config.micro_batch_size,
                   ppo=config.credit if config.is_ppo else None, mini_batches=config.mini_batches,
                   epochs=config.epochs, compact_rows=bool(compact),
                   compact_bucket=TREE_COMPACT_BUCKET if config.is_tree else COMPACT_BUCKET,
                   sero_coef=config.sero.coef if config.sero is not None else 0.0,
                   oracle_micro_batch_size=config.oracle_micro_batch_size, cispo_clip=cispo)

    @property
    def steps(self) -> int:
        """Optimizer steps per update."""
        return self.mini_batches * self.epochs


@flax.struct.dataclass(frozen=True)
class OracleRows:
    """SERO's oracle steps as the update trains them (:mod:`agentjax.train.sero`): rows and their coefficients."""

    steps: StepBatch  # [N] oracle step rows; response_mask: the command tokens
    coef: Float[Array, " N"]  # g_b · w_bj / #roots of each row (0 on padding): L_O = −Σ_n coef_n · ℓ_n
    prefix_p: Int[Array, " P"] | None = None  # every row's prompt continues these tokens (set by compact_rows)


@flax.struct.dataclass(frozen=True)
class UpdateBatch:
    """What one update consumes (module docstring): the rows, their credit, and what some methods add.

    A flat method's batch is :meth:`of` its rows and :class:`~agentjax.train.advantages.Advantages`; a tree stage's
    is ``UpdateBatch(steps, advantage=c.advantage, row_mask=c.sample, token_mask=c.token_mask)`` of its
    :class:`~agentjax.train.tree_credit.RowCredit` ``c``.
    """

    steps: StepBatch  # [B] the rows: prompts, responses, behaviour log-probs, real rows (row_mask)
    advantage: Float[Array, " B"]  # [B] f32, the advantage every trained token of the row sees
    returns: Float[Array, " B"] | None = None  # [B] f32, PPO's value targets (None: no value head)
    values: Float[Array, " B"] | None = None  # [B] f32, PPO's V_old of the row's state (None: no value head)
    oracle: OracleRows | None = None  # SERO's oracle rows, trained with λ_O at every optimizer step (None: no SERO)
    row_mask: Bool[Array, " B"] | None = None  # [B] the rows to train, among the real ones (None: every real row)
    token_mask: Bool[Array, "B L"] | None = None  # [B, Lr] the response tokens to train (None: the response_mask)
    prefix_p: Int[Array, " P"] | None = None  # every row's prompt continues these tokens (set by compact_rows)

    @classmethod
    def of(cls, steps: StepBatch, adv: Advantages, oracle: OracleRows | None = None) -> UpdateBatch:
        """A flat method's batch: every real row's response, with ``compute_advantages``'s credit."""
        return cls(steps=steps, advantage=adv.advantage, returns=adv.returns, values=adv.values, oracle=oracle)

    def trained(self) -> UpdateBatch:
        """The same batch with ``row_mask`` and ``token_mask`` folded into ``steps`` (its ``row_mask`` the rows to
        train, its ``response_mask`` the tokens to train; the masks None): what the loss reads."""
        steps = self.steps
        if self.row_mask is not None:
            steps = steps.replace(row_mask=steps.row_mask & self.row_mask)
        if self.token_mask is not None:
            steps = steps.replace(response_mask=steps.response_mask & self.token_mask)
        return self.replace(steps=steps, row_mask=None, token_mask=None)


@flax.struct.dataclass(frozen=True)
class WeightedRows:
    """Rows (of a whole batch or of one micro-batch) with their loss weights."""

    batch: StepBatch  # the rows (row_mask / response_mask: the trained rows and tokens)
    advantage: Float[Array, " B"]  # [B] the row's advantage
    returns: Float[Array, " B"] | None  # [B] PPO value targets (None without a value head)
    values: Float[Array, " B"] | None  # [B] V_old (None without a value head)
    weight_bl: Float[Array, "B L"]  # [B, Lr] the objective's aggregation weights (whole-batch normalised)
    token_weight_bl: Float[Array, "B L"]  # [B, Lr] token-mean weights, for the metrics
    decision_weight_bl: Float[Array, "B L"]  # [B, Lr] token-mean weights over the decision tokens, for the metrics
    row_weight: Float[Array, " B"]  # [B] 1/#real rows on real rows (value loss, row metrics)


@flax.struct.dataclass(frozen=True)
class Accumulator:
    """The carry of the micro-batch scan (STYLE.md 4): what the micro-batches so far add up to.

    Every objective returns its micro-batch's share of the batch's loss (its rows' weights are the whole batch's),
    so the batch's gradient and weighted-mean metrics are sums over micro-batches; maxima are maxima of the
    micro-batches' maxima. A skipped micro-batch (no trained row) adds zeros.
    """

    grads: Any  # float32 gradients of the trainable tree {"policy", "value_head"}, summed (None: metrics only)
    sums: Any  # {name: [] f32} metrics that add up over micro-batches: weighted means with whole-batch weights
    maxes: Any  # {name: [] f32, name "*_max"} metrics whose batch value is the largest micro-batch value

    def add(self, part: Accumulator) -> Accumulator:
        """This sum with one more micro-batch's ``part``."""
        grads = None if self.grads is None else jax.tree.map(jnp.add, self.grads, part.grads)
        return Accumulator(grads=grads, sums=jax.tree.map(jnp.add, self.sums, part.sums),
                           maxes=jax.tree.map(jnp.maximum, self.maxes, part.maxes))

    @property
    def metrics(self) -> Metrics:
        return self.sums | self.maxes


@flax.struct.dataclass(frozen=True)
class OptimizerCarry:
    """The carry of the optimizer steps of one update (the scan over epochs × mini-batches)."""

    trainable: Any  # {"policy": params, "value_head": head}, the parameters the optimizer updates
    opt_state: Any  # optax state of ``trainable``
    nonfinite: Any  # [] int32, optimizer steps skipped for a NaN/Inf loss or gradient so far (state.nonfinite)


def trained_mask(batch: StepBatch) -> Bool[Array, "B L"]:
    """[B, Lr] the tokens the loss trains: the response mask of real rows."""
    return batch.response_mask & batch.row_mask[:, None]


def decision_mask(batch: StepBatch) -> Bool[Array, "B L"]:
    """[B, Lr] the trained tokens where the policy had a choice: more than one allowed token under constrained
    decoding (``batch.allowed_tokens``), every trained token without it. A forced token (one allowed) has
    probability 1 under the renormalised policy, so its KL, clip and entropy are 0 and dilute token means."""
    mask = trained_mask(batch)
    if batch.allowed_tokens is None:
        return mask
    return mask & (jnp.sum(batch.allowed_tokens >= 0, -1) > 1)


def response_inputs(batch: StepBatch) -> Bool[Array, "B L"]:
    """[B, Lr] response slots fed to the decoder: every slot up to the row's last ``response_mask`` token."""
    m = batch.response_mask & batch.row_mask[:, None]
    return jnp.flip(jnp.cumsum(jnp.flip(m, -1), -1) > 0, -1)


def forward_rows(
    graphdef: nnx.GraphDef,
    params: Params,
    batch: StepBatch,
    *,
    loss: LossConfig,
    with_entropy: bool,
    prefix_p: Int[Array, " P"] | None = None,
) -> tuple[Float[Array, "B L"], Float[Array, "B L"], Float[Array, "B D"]]:
    """Decoder pass over prompt + response rows (module docstring); ``prefix_p``: every row's prompt continues
    these tokens (:func:`compact_rows`), decoded once.

    Returns:
      (logp_bl, entropy_bl, hidden_bd): log π(response token) and the entropy of each response position
      ([B, Lr] float32; entropy zeros unless ``with_entropy``), and the final hidden state of the last prompt
      token ([B, D], the value head's input).
    """
    model = nnx.merge(graphdef, params)
    lp = batch.prompt_tokens.shape[1]
    tokens = jnp.concatenate([batch.prompt_tokens, batch.response_tokens], axis=1)
    segment = jnp.concatenate([batch.prompt_mask, response_inputs(batch)], axis=1).astype(jnp.int32)
    hidden = model.decode(tokens, segment, prefix_p=prefix_p).hidden_bld
    lr = batch.response_tokens.shape[1]
    if batch.allowed_tokens is not None:
        logp, ent = allowed_logprobs(hidden[:, lp - 1: lp - 1 + lr], model.unembedding_vd, batch.response_tokens,
                                     batch.allowed_tokens, temperature=loss.temperature)
        return logp, ent if with_entropy else jnp.zeros_like(ent), hidden[:, lp - 1]
    logp, ent = chunked_logprobs(hidden[:, lp - 1: lp - 1 + lr], model.unembedding_vd, batch.response_tokens,
                                 chunk=loss.logprob_chunk, temperature=loss.temperature, with_entropy=with_entropy,
                                 remat=loss.logprob_remat)
    return logp, ent, hidden[:, lp - 1]


def allowed_logprobs(
    hidden_bld: Float[Array, "B L D"],
    unembedding_vd: Float[Array, "V D"],
    targets_bl: Int[Array, "B L"],
    allowed_bla: Int[Array, "B L A"],
    *,
    temperature: float = 1.0,
) -> tuple[Float[Array, "B L"], Float[Array, "B L"]]:
    """log π(target) and the entropy of π renormalised over each position's allowed tokens (constrained decoding,
    ``StepBatch.allowed_tokens``): ``z_a = h · W[a] / τ`` for the A allowed ids only (no ``[B, L, V]`` logits),
    ``log π = z_target − logsumexp_a z_a``. A position without allowed tokens (padding) gets 0 and 0; a target
    outside its allowed set gets −inf (the batch is inconsistent). Float32 output."""
    ok_bla = allowed_bla >= 0
    w_blad = jnp.take(unembedding_vd, jnp.maximum(allowed_bla, 0), axis=0)
    z_bla = jnp.einsum("BLD,BLAD->BLA", hidden_bld, w_blad, preferred_element_type=jnp.float32) / temperature
    # a large finite stand-in for −inf: exp underflows to exactly 0 and no NaN reaches the gradient through `where`
    z_bla = jnp.where(ok_bla, z_bla, -1e30)
    logp_bla = jax.nn.log_softmax(z_bla, axis=-1)
    hit_bla = ok_bla & (allowed_bla == targets_bl[..., None])
    logp_bl = jnp.sum(jnp.where(hit_bla, logp_bla, 0.0), -1)
    ent_bl = -jnp.sum(jnp.where(ok_bla, jnp.exp(logp_bla) * logp_bla, 0.0), -1)
    any_bl = ok_bla.any(-1)
    logp_bl = jnp.where(any_bl & ~hit_bla.any(-1), -jnp.inf, logp_bl)
    return jnp.where(any_bl, logp_bl, 0.0), jnp.where(any_bl, ent_bl, 0.0)


def value_head_apply(head: dict[str, jax.Array], hidden_bd: Float[Array, "B D"]) -> Float[Array, " B"]:
    """``V = h · w + b`` in float32."""
    return jnp.einsum("BD,D->B", hidden_bd.astype(jnp.float32), head["w_d"]) + head["b"]


def _check_batch(config: TrainConfig | UpdateSpec, batch: StepBatch) -> None:
    b, lp = batch.prompt_tokens.shape
    if lp < 1:
        raise ValueError("update: the batch has no prompt slots (prompt_len 0); every row needs a prompt")
    if b % config.micro_batch_size:
        raise ValueError(f"update: the batch of {b} rows does not split into micro-batches of "
                         f"{config.micro_batch_size}; make TrainConfig.micro_batch_size divide the capacity")
    mini = getattr(config, "mini_batches", 1)
    if b % (mini * config.micro_batch_size):
        raise ValueError(f"update: the batch of {b} rows does not split into {mini} mini-batches of whole "
                         f"micro-batches of {config.micro_batch_size} rows; make mini_batches × micro_batch_size "
                         "divide the capacity")


def _check_update_batch(spec: UpdateSpec, batch: UpdateBatch) -> None:
    chex.assert_equal_shape([batch.advantage, batch.steps.reward])
    if spec.ppo is not None and (batch.returns is None or batch.values is None):
        raise ValueError("update: PPO's value loss needs the rows' returns and values; build the batch with "
                         "UpdateBatch.of(steps, compute_advantages(...))")
    oracle = batch.oracle
    if oracle is not None and not spec.sero_coef:
        raise ValueError("update: oracle rows were given but the config has no SERO (TrainConfig.sero)")
    if oracle is not None and oracle.steps.capacity % spec.oracle_micro_batch_size:
        raise ValueError(f"update: {oracle.steps.capacity} oracle rows do not split into micro-batches of "
                         f"{spec.oracle_micro_batch_size}; set sero.capacity / sero.micro_batch_size to fit")


def signal_counts(batch: StepBatch, advantage: Float[Array, " B"]) -> Metrics:
    """How much of the batch carries a learning signal: real rows with a non-zero advantage, decision tokens,
    and decision tokens of rows with a non-zero advantage (float32 counts)."""
    signal_b = batch.row_mask & (advantage != 0)
    decisions_bl = decision_mask(batch)
    return {"decision_tokens": decisions_bl.sum().astype(jnp.float32),
            "signal_rows": signal_b.sum().astype(jnp.float32),
            "signal_decision_tokens": (decisions_bl & signal_b[:, None]).sum().astype(jnp.float32)}


def _weighted(spec: UpdateSpec, batch: StepBatch, advantage, returns, values) -> WeightedRows:
    """The rows ``batch`` with their weights, normalised over its own rows."""
    mask_bl = trained_mask(batch)
    rows = batch.row_mask.astype(jnp.float32)
    return WeightedRows(
        batch=batch, advantage=advantage, returns=returns, values=values,
        weight_bl=aggregation_weights(mask_bl, spec.loss.aggregation),
        token_weight_bl=aggregation_weights(mask_bl, "token-mean"),
        decision_weight_bl=aggregation_weights(decision_mask(batch), "token-mean"),
        row_weight=rows / jnp.maximum(rows.sum(), 1.0),
    )


def _per_row(batch: UpdateBatch) -> tuple:
    """(rows, advantage, returns, values) of a trained batch: its row-indexed arrays."""
    return batch.steps, batch.advantage, batch.returns, batch.values


def _row_order(row_mask: Bool[Array, " B"], key: PRNGKeyArray | None) -> Int[Array, " B"]:
    """A permutation of the rows: real rows first, in an order drawn from ``key`` (batch order without one)."""
    tiebreak = jnp.zeros(row_mask.shape) if key is None else jax.random.uniform(key, row_mask.shape)
    return jnp.argsort(jnp.where(row_mask, 0.0, 2.0) + tiebreak, stable=True)


def _order(spec: UpdateSpec, batch: UpdateBatch, key: PRNGKeyArray | None) -> WeightedRows:
    """The whole (trained) batch with its whole-batch weights, real rows first (in an order drawn from ``key``, or
    in batch order without one), ready to be cut into micro-batches of consecutive rows."""
    _check_batch(spec, batch.steps)
    order = _row_order(batch.steps.row_mask, key)
    return jax.tree.map(lambda x: x[order], _weighted(spec, *_per_row(batch)))


def _mini_batch_rows(spec: UpdateSpec, row_mask: Bool[Array, " B"], key: PRNGKeyArray) -> jax.Array:
    """[mini_batches, B / mini_batches] row indices of one epoch: the rows in :func:`_row_order`'s order dealt
    round-robin, so every mini-batch gets an equal share of the real rows (first) and of the padding (last)."""
    order = _row_order(row_mask, key)
    return order.reshape(-1, spec.mini_batches).T


def _clip_objective(
    trainable: dict, mb: WeightedRows, *, ref_params, prefix_p, graphdef: nnx.GraphDef, spec: UpdateSpec
) -> tuple[Float[Array, ""], tuple[Metrics, Metrics]]:
    """PPO-clip: the micro-batch's share of ``L`` and its (summed, maximum) metrics (module docstring)."""
    cfg = spec.loss
    batch = mb.batch
    mask_bl = trained_mask(batch)
    logp, ent, hidden = forward_rows(graphdef, trainable["policy"], batch, loss=cfg, with_entropy=True,
                                     prefix_p=prefix_p)
    terms = ppo_clip_terms(logp, batch.behaviour_logp, broadcast_advantage(mb.advantage, mask_bl), mask_bl,
                           clip_low=cfg.clip_low, clip_high=cfg.clip_high, dual_clip=cfg.dual_clip)
    tw = mb.token_weight_bl
    pg = weighted_sum(terms.loss, mb.weight_bl)
    entropy = weighted_sum(ent, mb.weight_bl)
    loss = pg - cfg.entropy_coef * (entropy if cfg.entropy_coef > 0 else jax.lax.stop_gradient(entropy))
    log_ratio = jnp.where(mask_bl, logp - jnp.where(mask_bl, batch.behaviour_logp, 0.0), 0.0)
    sums = {
        "pg_loss": pg,
        "entropy": weighted_sum(ent, tw),
        "clip_frac": weighted_sum(terms.clipped, tw),
        "dual_clip_frac": weighted_sum(terms.dual_clipped, tw),
        "ratio_mean": weighted_sum(terms.ratio, tw),
        "behaviour_kl": weighted_sum(-log_ratio, tw),  # E[log π_old − log π_θ] (verl's ppo_kl)
        # the same over the decision tokens only (decision_mask): what the policy chose, not the forced format
        "decision_entropy": weighted_sum(ent, mb.decision_weight_bl),
        "decision_clip_frac": weighted_sum(terms.clipped, mb.decision_weight_bl),
        "decision_behaviour_kl": weighted_sum(-log_ratio, mb.decision_weight_bl),
    }
    maxes = {"ratio_max": jnp.max(jnp.where(mask_bl, terms.ratio, 0.0))}
    if cfg.kl_coef > 0:
        ref_logp, _, _ = forward_rows(graphdef, ref_params, batch, loss=cfg, with_entropy=False, prefix_p=prefix_p)
        kl_bl = low_var_kl(logp, jax.lax.stop_gradient(ref_logp), mask_bl)
        loss = loss + cfg.kl_coef * weighted_sum(kl_bl, mb.weight_bl)
        sums["kl"] = weighted_sum(kl_bl, tw)
        sums["decision_kl"] = weighted_sum(kl_bl, mb.decision_weight_bl)
    if spec.ppo is not None:
        value_b = value_head_apply(trainable["value_head"], hidden)
        v_loss_b, v_clip_b = clipped_value_loss(value_b, mb.values, mb.returns, batch.row_mask,
                                                clip=spec.ppo.value_clip)
        value_loss = weighted_sum(v_loss_b, mb.row_weight)
        loss = loss + spec.ppo.value_coef * value_loss
        sums |= {"value_loss": value_loss, "value_clip_frac": weighted_sum(v_clip_b, mb.row_weight),
                 "value_pred_mean": weighted_sum(value_b, mb.row_weight)}
    sums["loss"] = loss
    return loss, (sums, maxes)


def _cispo_objective(
    trainable: dict, mb: WeightedRows, *, ref_params, prefix_p, graphdef: nnx.GraphDef, spec: UpdateSpec
) -> tuple[Float[Array, ""], tuple[Metrics, Metrics]]:
    """CISPO: the micro-batch's share of ``L`` and its (summed, maximum) metrics (module docstring). The entropy,
    clip fraction, ratio and behaviour KL are token means over the trained tokens (``w``: the token mean)."""
    del ref_params  # no KL term
    batch = mb.batch
    mask_bl = trained_mask(batch)
    logp, ent, _ = forward_rows(graphdef, trainable["policy"], batch, loss=spec.loss, with_entropy=True,
                                prefix_p=prefix_p)
    clip_low, clip_high = spec.cispo_clip
    terms = cispo_terms(logp, batch.behaviour_logp, broadcast_advantage(mb.advantage, mask_bl), mask_bl,
                        clip_low=clip_low, clip_high=clip_high)
    log_ratio = jnp.where(mask_bl, logp - jnp.where(mask_bl, batch.behaviour_logp, 0.0), 0.0)
    w = mb.weight_bl
    loss = weighted_sum(terms.loss, w)
    sums = {"loss": loss, "entropy": weighted_sum(ent, w), "clip_frac": weighted_sum(terms.clipped, w),
            "ratio_mean": weighted_sum(terms.ratio, w), "behaviour_kl": weighted_sum(-log_ratio, w)}
    return loss, (sums, {"ratio_max": jnp.max(jnp.where(mask_bl, terms.ratio, 0.0))})


def _oracle_objective(
    trainable: dict, rows: OracleRows, *, prefix_p, graphdef: nnx.GraphDef, spec: UpdateSpec
) -> tuple[Float[Array, ""], tuple[Metrics, Metrics]]:
    """The oracle micro-batch's share of ``λ_O · L_O`` (:func:`agentjax.losses.sero.oracle_row_loss`) and its
    metric sum ``oracle_loss`` (L_O)."""
    logp, _, _ = forward_rows(graphdef, trainable["policy"], rows.steps, loss=spec.loss, with_entropy=False,
                              prefix_p=prefix_p)
    loss_o = oracle_row_loss(logp, trained_mask(rows.steps), rows.coef)
    return spec.sero_coef * loss_o, ({"oracle_loss": loss_o}, {})


def _accumulate(
    objective: Callable, trainable: dict, rows: Any, *, size: int, active: Callable[[Any], Bool[Array, ""]],
    with_grad: bool,
) -> Accumulator:
    """The one micro-batch loop: ``lax.scan`` over micro-batches of ``size`` consecutive rows of ``rows`` (a pytree
    of row-indexed arrays), adding each one's :class:`Accumulator` part; ``objective(trainable, mb) -> (loss,
    (sums, maxes))``, differentiated in ``trainable`` with ``with_grad``; micro-batches where ``active(mb)`` is
    False are skipped (zeros)."""
    capacity = jax.tree.leaves(rows)[0].shape[0]
    cut = lambda i: jax.tree.map(lambda x: jax.lax.dynamic_slice_in_dim(x, i * size, size), rows)  # noqa: E731

    def compute(mb) -> Accumulator:
        if not with_grad:
            _, (sums, maxes) = objective(trainable, mb)
            return Accumulator(grads=None, sums=sums, maxes=maxes)
        (_, (sums, maxes)), grads = jax.value_and_grad(objective, has_aux=True)(trainable, mb)
        return Accumulator(grads=jax.tree.map(lambda g: g.astype(jnp.float32), grads), sums=sums, maxes=maxes)

    zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), jax.eval_shape(compute, cut(0)))

    def body(total: Accumulator, i) -> tuple[Accumulator, None]:
        mb = cut(i)
        return total.add(jax.lax.cond(active(mb), compute, lambda _: zeros, mb)), None

    total, _ = jax.lax.scan(body, zeros, jnp.arange(capacity // size))
    return total


def _gradients(spec: UpdateSpec, graphdef: nnx.GraphDef, trainable: dict, ref_params, rows: WeightedRows,
               prefix_p, oracle: OracleRows | None, *, with_grad: bool) -> tuple[Any, Metrics]:
    """(float32 gradients of the loss in ``trainable`` or None, metrics) of ``rows`` (whole-batch weights) and,
    with SERO, every oracle row: the method's objective over its micro-batches, then λ_O · L_O over the oracle
    rows'. ``metrics["loss"]`` stays the base loss (``oracle_loss`` and ``total_loss`` beside it)."""
    objective = _cispo_objective if spec.cispo_clip is not None else _clip_objective
    base = _accumulate(functools.partial(objective, ref_params=ref_params, prefix_p=prefix_p, graphdef=graphdef,
                                         spec=spec),
                       trainable, rows, size=spec.micro_batch_size, active=lambda mb: mb.batch.row_mask.any(),
                       with_grad=with_grad)
    grads, metrics = base.grads, base.metrics
    if oracle is None:
        return grads, metrics
    extra = _accumulate(functools.partial(_oracle_objective, prefix_p=oracle.prefix_p, graphdef=graphdef, spec=spec),
                        trainable, oracle.replace(prefix_p=None), size=spec.oracle_micro_batch_size,
                        active=lambda mb: mb.steps.row_mask.any() & (mb.coef != 0).any(), with_grad=with_grad)
    if with_grad:
        grads = jax.tree.map(jnp.add, grads, extra.grads)
    oracle_loss = extra.metrics["oracle_loss"]
    return grads, metrics | extra.metrics | {"total_loss": metrics["loss"] + spec.sero_coef * oracle_loss}


def policy_graphdef(model: nnx.Module) -> nnx.GraphDef:
    """The model's graph definition, once its state is checked to be parameters only (what the update traces)."""
    policy_params(model)  # raises on non-Param state
    return nnx.graphdef(model)


Update = Callable[[TrainState, UpdateBatch, PRNGKeyArray | None], tuple[TrainState, Metrics]]


def make_update(config: TrainConfig, model: nnx.Module, tx: optax.GradientTransformation) -> Update:
    """The jitted, state-donating ``update(state, batch, key) -> (state, metrics)`` (module docstring).

    Args:
      config: the training config (loss and its choice by the credit method, micro-batch sizes, optimizer
        schedule for the metrics, SERO).
      model: the policy; only its structure is used (parameters come from the state).
      tx: the optimizer the state was initialised with (:func:`agentjax.train.state.make_optimizer`).
    Returns:
      ``update(state, batch, key)``: ``batch`` an :class:`UpdateBatch`; ``key`` orders the rows (and deals the
      mini-batches); ``None`` keeps the batch order (one step per update only). ``metrics`` is a dict of float32
      scalars: grad_norm (before clipping), lr, skipped, nonfinite_total, tokens (trained), rows (trained), and

      - PPO-clip: loss, pg_loss, entropy, kl (if ``kl_coef > 0``), clip_frac, dual_clip_frac, ratio_mean,
        ratio_max, behaviour_kl, for PPO value_loss, value_clip_frac, value_pred_mean, with SERO oracle_loss and
        total_loss; the decision-token means decision_entropy, decision_clip_frac, decision_behaviour_kl,
        decision_kl (with KL) over :func:`decision_mask`, and the counts decision_tokens, signal_rows (real rows
        with a non-zero advantage), signal_decision_tokens (their decision tokens);
      - CISPO: loss, entropy, clip_frac, ratio_mean, ratio_max, behaviour_kl (token means over the trained tokens).
    """
    return _build_update(UpdateSpec.of(config, model), policy_graphdef(model), tx)


@functools.lru_cache(maxsize=8)
def _build_update(spec: UpdateSpec, graphdef: nnx.GraphDef, tx: optax.GradientTransformation) -> Update:
    schedule = make_schedule(spec.optimizer)

    def optimizer_step(carry: OptimizerCarry, rows: WeightedRows, ref_params, prefix_p, oracle: OracleRows | None,
                       ) -> tuple[OptimizerCarry, Metrics]:
        trainable = carry.trainable
        grads, metrics = _gradients(spec, graphdef, trainable, ref_params, rows, prefix_p, oracle, with_grad=True)
        finite = jnp.isfinite(metrics["loss"])
        if oracle is not None:
            finite = finite & jnp.isfinite(metrics["oracle_loss"])
        grads = jax.tree.map(lambda g, p: g.astype(p.dtype), grads, trainable)
        grad_norm = optax.tree.norm(grads)
        finite = finite & jnp.isfinite(grad_norm)

        def apply(operand):
            params, opt_state = operand
            updates, opt_state = tx.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), opt_state

        trainable, opt_state = jax.lax.cond(finite, apply, lambda operand: operand, (trainable, carry.opt_state))
        skipped = (~finite).astype(jnp.int32)
        carry = OptimizerCarry(trainable=trainable, opt_state=opt_state, nonfinite=carry.nonfinite + skipped)
        return carry, metrics | {"grad_norm": grad_norm, "skipped": skipped.astype(jnp.float32)}

    def update(state: TrainState, batch: UpdateBatch, key: PRNGKeyArray | None):
        batch = batch.trained()
        _check_update_batch(spec, batch)
        steps = batch.steps
        carry = OptimizerCarry(trainable=state.trainable, opt_state=state.opt_state, nonfinite=state.nonfinite)
        if spec.steps == 1:  # one step over the whole batch
            carry, metrics = optimizer_step(carry, _order(spec, batch, key), state.ref_params, batch.prefix_p,
                                            batch.oracle)
        else:  # epochs × mini-batches, each mini-batch weighted over its own rows (verl's ppo_mini_batch_size)
            _check_batch(spec, steps)
            per_row = _per_row(batch)

            def mini(carry, idx):
                rows = _weighted(spec, *jax.tree.map(lambda x: x[idx], per_row))
                return optimizer_step(carry, rows, state.ref_params, batch.prefix_p, batch.oracle)

            def epoch(carry, epoch_key):
                return jax.lax.scan(mini, carry, _mini_batch_rows(spec, steps.row_mask, epoch_key))

            if key is None:
                raise ValueError("update: mini-batches are drawn with the key; pass one")
            carry, per_step = jax.lax.scan(epoch, carry, jax.random.split(key, spec.epochs))
            metrics = {k: v.max() if k.endswith("_max") else v.sum() if k == "skipped" else v.mean()
                       for k, v in per_step.items()}
        new_state = state.replace(step=state.step + 1, params=carry.trainable["policy"],
                                  value_head=carry.trainable["value_head"], opt_state=carry.opt_state,
                                  nonfinite=carry.nonfinite)
        if state.schedule is None:  # the optimizer's steps so far: every step of every update but the skipped
            applied = state.step * spec.steps - state.nonfinite
        else:  # a stage schedule counts the applied steps
            applied = state.schedule.step
            new_state = new_state.replace(schedule=advance(state.schedule, carry.nonfinite == state.nonfinite))
        metrics |= {
            "lr": jnp.asarray(schedule(applied), jnp.float32),
            "nonfinite_total": carry.nonfinite.astype(jnp.float32),
            "tokens": trained_mask(steps).sum().astype(jnp.float32),
            "rows": steps.row_mask.sum().astype(jnp.float32),
        }
        if spec.cispo_clip is None:
            metrics |= signal_counts(steps, batch.advantage)
        return new_state, metrics

    jitted = jax.jit(update, donate_argnums=0)
    if not spec.compact_rows:
        return jitted

    def compacted(state: TrainState, batch: UpdateBatch, key: PRNGKeyArray | None):
        return jitted(state, compact_batch(batch, spec.compact_bucket), key)

    compacted._cache_size = jitted._cache_size  # the compiled shapes, as on a jitted function
    compacted.jitted = jitted
    return compacted


def compact_batch(batch: UpdateBatch, bucket: int = COMPACT_BUCKET) -> UpdateBatch:
    """Host side: ``batch`` with its trained rows and its oracle rows compacted (:func:`compact_rows`; the rows in
    multiples of ``bucket`` tokens, the oracle rows of :data:`COMPACT_BUCKET`). A batch that carries a prefix
    already is returned as it is."""
    if batch.prefix_p is not None:
        return batch
    batch = batch.trained()  # the trained rows decide the widths and the shared prefix
    steps, prefix_p = compact_rows(batch.steps, bucket)
    oracle = batch.oracle
    if oracle is not None and oracle.prefix_p is None:
        oracle_steps, oracle_prefix_p = compact_rows(oracle.steps, COMPACT_BUCKET)
        oracle = oracle.replace(steps=oracle_steps, prefix_p=_device(oracle_prefix_p))
    return batch.replace(steps=steps, prefix_p=_device(prefix_p), oracle=oracle)


def _device(prefix_p: np.ndarray | None) -> Int[Array, " P"] | None:
    return None if prefix_p is None else jnp.asarray(prefix_p)


def skip_batch(state: TrainState) -> TrainState:
    """The state after a batch with nothing to train (no sampled row), which is not given to ``update``: one more
    batch (``state.step``), no optimizer step, and a stage schedule that counts it skipped and does not advance
    (METHODS.md "SERA" 7)."""
    schedule = None if state.schedule is None else advance(state.schedule, False)
    return state.replace(step=state.step + 1, schedule=schedule)


def _objective_fn(config: TrainConfig, model: nnx.Module, *, with_grad: bool) -> Callable:
    graphdef = policy_graphdef(model)
    spec = UpdateSpec.of(config)

    def objective(state: TrainState, batch: UpdateBatch):
        batch = batch.trained()
        _check_update_batch(spec, batch)
        return _gradients(spec, graphdef, state.trainable, state.ref_params, _order(spec, batch, None),
                          batch.prefix_p, batch.oracle, with_grad=with_grad)

    return objective


def make_loss_fn(config: TrainConfig, model: nnx.Module) -> Callable[..., tuple[jax.Array, Metrics]]:
    """The jitted ``loss_fn(state, batch) -> (loss, metrics)``: the objective ``update`` differentiates (its
    micro-batch metrics), evaluated without a step (rows in batch order, not compacted). Differentiable in its
    inputs (tests take its gradient with respect to ``batch.steps.behaviour_logp`` to read the advantage each token
    sees)."""
    objective = _objective_fn(config, model, with_grad=False)

    def loss_fn(state: TrainState, batch: UpdateBatch):
        _, metrics = objective(state, batch)
        return metrics["loss"], metrics

    return jax.jit(loss_fn)


def make_grad_fn(config: TrainConfig, model: nnx.Module) -> Callable[..., tuple[Any, Metrics]]:
    """The jitted ``grads(state, batch) -> (float32 gradients of the trainable tree, metrics)``: what ``update``
    casts to the parameters' dtype and hands the optimizer, without a step (rows in batch order, not compacted)."""
    return jax.jit(_objective_fn(config, model, with_grad=True))


def _map_micro(fn: Callable[[StepBatch], jax.Array], batch: StepBatch, size: int) -> jax.Array:
    """``fn`` over micro-batches of ``size`` consecutive rows (``lax.map``), outputs concatenated along rows."""
    cut = lambda i: jax.tree.map(lambda x: jax.lax.dynamic_slice_in_dim(x, i * size, size), batch)  # noqa: E731
    out = jax.lax.map(lambda i: fn(cut(i)), jnp.arange(batch.capacity // size))
    return out.reshape((batch.capacity,) + out.shape[2:])


def make_logprob_fn(config: TrainConfig, model: nnx.Module) -> Callable[[Params, StepBatch], jax.Array]:
    """The jitted ``logprobs(params, batch) -> [B, Lr]``: log π(response token) under ``params`` at the loss's
    temperature, exactly as the loss computes it (0 off the trained tokens). E.g. ``π_old`` for a batch collected
    elsewhere, or the reference policy's log-probs."""
    graphdef = policy_graphdef(model)

    def logprobs(params: Params, batch: StepBatch):
        _check_batch(config, batch)

        def one(mb):
            return forward_rows(graphdef, params, mb, loss=config.loss, with_entropy=False)[0]

        return jnp.where(trained_mask(batch), _map_micro(one, batch, config.micro_batch_size), 0.0)

    return jax.jit(logprobs)


def make_value_fn(config: TrainConfig, model: nnx.Module) -> Callable[[TrainState, StepBatch], jax.Array]:
    """The jitted ``values(state, batch) -> [B]`` of PPO's value head at each row's last prompt token (0 on
    padding rows), in micro-batches, for :func:`agentjax.train.advantages.compute_advantages`. Only the prompt is
    decoded (the value reads the last prompt token, which the causal decoder computes from the prompt alone)."""
    if not config.is_ppo:
        raise ValueError(f"make_value_fn: the credit method {config.credit.method!r} has no value head; use PPO")
    graphdef = policy_graphdef(model)

    def values(state: TrainState, batch: StepBatch):
        _check_batch(config, batch)

        def one(mb):
            hidden = nnx.merge(graphdef, state.params).decode(mb.prompt_tokens, mb.prompt_mask).hidden_bld
            return value_head_apply(state.value_head, hidden[:, -1])

        return jnp.where(batch.row_mask, _map_micro(one, batch, config.micro_batch_size), 0.0)

    return jax.jit(values)


def check_nonfinite(state: TrainState, metrics: Metrics, config: TrainConfig) -> None:
    """Host side, after each update: log a skipped update, and raise :class:`NonFiniteUpdateError` once more than
    ``config.max_nonfinite_updates`` optimizer steps have been skipped (an update takes ``mini_batches × epochs``
    of them; ``state.nonfinite`` counts them)."""
    steps = config.mini_batches * config.epochs
    if float(metrics["skipped"]):
        log.warning("update %d skipped %d of its %d optimizer steps: non-finite loss (%s) or gradient norm (%s); %d "
                    "optimizer steps skipped so far (limit %d)", int(state.step) - 1, int(metrics["skipped"]), steps,
                    float(metrics["loss"]), float(metrics["grad_norm"]), int(state.nonfinite),
                    config.max_nonfinite_updates)
    if int(state.nonfinite) > config.max_nonfinite_updates:
        raise NonFiniteUpdateError(
            f"{int(state.nonfinite)} optimizer steps ({steps} an update) had a NaN/Inf loss or gradient (limit "
            f"TrainConfig.max_nonfinite_updates={config.max_nonfinite_updates}); lower the learning rate, check "
            "the batch's behaviour_logp / advantages for NaN, or raise the limit")
