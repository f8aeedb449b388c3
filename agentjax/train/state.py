"""`TrainState`: everything an update changes and a resumed run needs, as one immutable pytree.

The model's structure (``nnx.graphdef``) stays out of the state; its parameters are an ``nnx.State`` of plain
arrays, so the state can be donated to a jitted update, sharded, and saved by orbax as it is. The trainable
tree is ``{"policy": params, "value_head": head}`` (``head`` empty unless the method is PPO) and the optimizer
state belongs to that tree. Methods with a stage schedule (SERA, RAO) also carry its
:class:`~agentjax.train.schedule.ScheduleState` (``schedule``), so a resumed run lands on the same stage; for the
others the field is None and the state has the same arrays as before the field existed.

``init_state`` copies the model's parameters, so the model object keeps valid arrays after the state is donated;
:func:`sync_model` writes the state's parameters back into a model (e.g. before sampling with it).
"""

from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec, SingleDeviceSharding
from jaxtyping import Array, Float, PRNGKeyArray

from agentjax.train.config import OptimizerConfig, TrainConfig
from agentjax.train.schedule import init_schedule

Params = Any  # an ``nnx.State`` of arrays (nnx.State's own hint is too loose for runtime type checks)


@flax.struct.dataclass(frozen=True)
class TrainState:
    """The state of a training run (STYLE.md 4).

    Fields are typed ``Any``: tree utilities (orbax, ``jax.eval_shape``) rebuild the state with ``None`` or
    ``ShapeDtypeStruct`` leaves, which runtime type checks of array annotations would reject.
    """

    step: Any  # [] int32, calls of `update` so far (applied and skipped)
    params: Params  # nnx.State, the policy's nnx.Param arrays (param_dtype)
    value_head: Any  # PPO: {"w_d": [D] f32, "b": [] f32}; otherwise {}
    opt_state: Any  # optax state of the trainable tree {"policy": params, "value_head": value_head}
    ref_params: Params  # nnx.State or {}, the frozen reference policy for the KL term ({} when kl_coef == 0)
    rng: Any  # [2] uint32, raw key data of the run's PRNG stream (see `next_key`)
    data_position: Any  # [] int32, position in the task stream (batches drawn), advanced by the loop
    nonfinite: Any  # [] int32, optimizer steps skipped for a NaN/Inf loss or gradient
    schedule: Any = None  # ScheduleState (SERA / RAO stage schedule: [] int32 step, skipped) or None

    @property
    def trainable(self) -> dict[str, Any]:
        return {"policy": self.params, "value_head": self.value_head}


def make_schedule(config: OptimizerConfig) -> optax.Schedule:
    """Learning rate per applied optimizer step: linear warm-up from 0, then constant or cosine decay."""
    lr = config.learning_rate
    if config.schedule == "constant":
        after = optax.constant_schedule(lr)
    else:
        after = optax.cosine_decay_schedule(lr, config.decay_steps, alpha=config.min_lr_ratio)
    if config.warmup_steps == 0:
        return after
    warmup = optax.linear_schedule(0.0, lr, config.warmup_steps)
    return optax.join_schedules([warmup, after], [config.warmup_steps])


def make_optimizer(config: OptimizerConfig) -> optax.GradientTransformation:
    """``clip_by_global_norm(max_grad_norm)`` then AdamW with :func:`make_schedule` (decay on every parameter,
    as torch's AdamW in verl)."""
    adamw = optax.adamw(make_schedule(config), b1=config.b1, b2=config.b2, eps=config.eps,
                        weight_decay=config.weight_decay)
    if config.max_grad_norm is None:
        return adamw
    return optax.chain(optax.clip_by_global_norm(config.max_grad_norm), adamw)


def init_value_head(d_model: int) -> dict[str, Float[Array, "..."]]:
    """A zero linear head ``V(h) = h · w + b`` (float32): every value starts at 0."""
    return {"w_d": jnp.zeros((d_model,), jnp.float32), "b": jnp.zeros((), jnp.float32)}


def policy_params(model: nnx.Module) -> Params:
    """The model's ``nnx.Param`` state; raises if the model holds other state the update would lose."""
    _, params, rest = nnx.split(model, nnx.Param, ...)
    if jax.tree.leaves(rest):
        raise ValueError(f"the model holds non-Param state ({sorted(str(k) for k in rest.flat_state())[:3]}...); "
                         "the trainer updates nnx.Param only")
    return params


def _build(config: TrainConfig, params: Params, rng: jax.Array, tx: optax.GradientTransformation,
           schedule: bool = False) -> TrainState:
    params = jax.tree.map(jnp.copy, params)
    ref = jax.tree.map(jnp.copy, params) if config.loss.kl_coef > 0 else {}
    head = init_value_head(config.model.arch.d_model) if config.is_ppo else {}
    return TrainState(
        step=jnp.zeros((), jnp.int32), params=params, value_head=head,
        opt_state=tx.init({"policy": params, "value_head": head}), ref_params=ref, rng=rng,
        data_position=jnp.zeros((), jnp.int32), nonfinite=jnp.zeros((), jnp.int32),
        schedule=init_schedule() if schedule else None,
    )


def init_state(
    config: TrainConfig,
    model: nnx.Module,
    key: PRNGKeyArray,
    tx: optax.GradientTransformation | None = None,
    *,
    schedule: bool = False,
) -> TrainState:
    """A fresh state: copies of the model's parameters (policy and, if ``kl_coef > 0``, the frozen reference),
    a zero value head for PPO, the optimizer state of ``tx`` (default :func:`make_optimizer`) and ``key``; with
    ``schedule``, a fresh stage-schedule state (:func:`agentjax.train.schedule.init_schedule`).

    Pass the same ``tx`` to :func:`agentjax.train.update.make_update`.
    """
    tx = tx if tx is not None else make_optimizer(config.optimizer)
    return _onto_mesh(_build(config, policy_params(model), jax.random.key_data(key), tx, schedule))


def abstract_state(
    config: TrainConfig, model: nnx.Module, tx: optax.GradientTransformation | None = None, *, schedule: bool = False
) -> TrainState:
    """The structure, shapes, dtypes and shardings of :func:`init_state`'s state as ``jax.ShapeDtypeStruct``
    leaves, without allocating it: the restore target of a checkpoint (a real state would hold a second copy of
    parameters, optimizer state and reference during the restore).

    Parameters, the reference and the optimizer's copies of the parameters (AdamW's moments, found with
    ``optax.tree_map_params``) take the model's parameter shardings; everything else is replicated on the
    parameters' mesh (or on their device), as :func:`init_state` places it.
    """
    tx = tx if tx is not None else make_optimizer(config.optimizer)
    params = policy_params(model)
    shapes = jax.eval_shape(lambda p, r: _build(config, p, r, tx, schedule), params,
                            jax.random.key_data(jax.random.key(0)))
    param_sh = jax.tree.map(lambda x: x.sharding, params)
    meshes = {x.mesh for x in jax.tree.leaves(param_sh) if isinstance(x, NamedSharding)}
    if len(meshes) > 1:
        raise ValueError("the model's parameters live on more than one mesh; shard them on one")
    if meshes:
        other = NamedSharding(meshes.pop(), PartitionSpec())
    else:
        other = SingleDeviceSharding(next(iter(jax.tree.leaves(param_sh)[0].device_set)))
    head_sh = jax.tree.map(lambda _: other, shapes.value_head)
    opt_sh = optax.tree_map_params(tx, lambda _, sh: sh, shapes.opt_state, {"policy": param_sh, "value_head": head_sh},
                                   transform_non_params=lambda _: other)
    shardings = TrainState(step=other, params=param_sh, value_head=head_sh, opt_state=opt_sh,
                           ref_params=param_sh if config.loss.kl_coef > 0 else {}, rng=other, data_position=other,
                           nonfinite=other, schedule=jax.tree.map(lambda _: other, shapes.schedule))
    return jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), shapes, shardings)


def _onto_mesh(state: TrainState) -> TrainState:
    """If the parameters live on a mesh, put every array that is not on it (counters, the value head, the PRNG
    stream, optimizer counts) there, replicated: the update's outputs are, and a first call with other placements
    would compile the update twice."""
    meshes = {x.sharding.mesh for x in jax.tree.leaves(state.params) if isinstance(x.sharding, NamedSharding)}
    if not meshes:
        return state
    if len(meshes) > 1:
        raise ValueError("the model's parameters live on more than one mesh; shard them on one")
    replicated = NamedSharding(meshes.pop(), PartitionSpec())
    return jax.tree.map(lambda x: x if isinstance(x.sharding, NamedSharding) else jax.device_put(x, replicated),
                        state)


def next_key(state: TrainState) -> tuple[TrainState, PRNGKeyArray]:
    """Split the run's PRNG stream: ``(state with the advanced stream, a fresh key)``. Checkpointing the state
    checkpoints the stream, so a resumed run draws the same keys."""
    new, sub = jax.random.split(jax.random.wrap_key_data(state.rng))
    return state.replace(rng=jax.random.key_data(new)), sub


def sync_model(model: nnx.Module, state: TrainState, *, copy: bool = True) -> None:
    """Write the state's policy parameters into ``model`` in place (e.g. for the sampler).

    With ``copy=False`` the model shares the state's arrays (no extra memory) and they are invalid once the state
    is donated to the next update: sync again before using the model.
    """
    nnx.update(model, jax.tree.map(jnp.copy, state.params) if copy else state.params)
