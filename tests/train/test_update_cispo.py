"""The update of a tree method (RAO's config: CISPO, one optimizer step a batch) on the hand-built TreeBatch with a
tiny Qwen3: under RAO's execution stage only execution-role tokens are trained (its gradient is the execution-only
CISPO reference, and delegation tokens add nothing), the stage schedule advances on an applied step, a NaN step is
skipped (parameters and schedule step unchanged), a batch without signal is skipped without an update; the config
chooses the loss (CISPO for RAO, PPO-clip for a flat method), and the loss accumulated over micro-batches is the
whole batch's rubric_loss (the rubric stage's objective)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from agentjax.agents.grammar import Role
from agentjax.losses.rubric import rubric_loss
from agentjax.models import Qwen
from agentjax.train.config import (
    GRPOCredit,
    LossConfig,
    ModelConfig,
    OptimizerConfig,
    RAOCredit,
    RolloutConfig,
    TrainConfig,
)
from agentjax.train.presets import tiny_tree_arch
from agentjax.train.state import init_state, make_optimizer
from agentjax.train.tree_credit import row_credit
from agentjax.train.update import UpdateBatch, forward_rows, make_grad_fn, make_loss_fn, make_update, skip_batch
from tests.train.conftest import leaves_equal
from tests.train.tree_batches import hand_batch

ARCH = tiny_tree_arch(vocab_size=1024, d_model=32, mlp_dim=64, num_layers=1, head_dim=8)
CONFIG = TrainConfig(model=ModelConfig(ARCH),
                     rollout=RolloutConfig(num_groups=2, group_size=3, max_steps=8, prompt_len=8, response_len=6,
                                           capacity=32),
                     credit=RAOCredit(), loss=LossConfig(kl_coef=0.0, entropy_coef=0.0, logprob_chunk=16,
                                                        logprob_remat=False),
                     optimizer=OptimizerConfig(learning_rate=1e-2, b2=0.95, weight_decay=0.017), micro_batch_size=8,
                     compact_rows=False)


@pytest.fixture(scope="module")
def model():
    return Qwen(CONFIG.model.arch, rngs=nnx.Rngs(0))


@pytest.fixture(scope="module")
def trained(model):
    """The execution stage's rows of the hand batch, with the model's own log-probs jittered as π_old."""
    batch = hand_batch()
    credit = row_credit(batch, CONFIG.credit, "execution")
    steps = batch.steps
    graphdef, params = nnx.split(model, nnx.Param)
    logp, _, _ = jax.jit(lambda p, s: forward_rows(graphdef, p, s, loss=CONFIG.loss, with_entropy=False))(params, steps)
    noise = jax.random.normal(jax.random.key(3), logp.shape) * 0.3
    steps = steps.replace(behaviour_logp=jnp.where(steps.response_mask, logp + noise, 0.0))
    return batch, steps, credit


def reference_grads(model, steps, adv_b, mask_bl):
    """CISPO by hand over ``mask_bl``: −Σ m sg(clip(ρ, 0, 5)) A log π / Σ m."""
    graphdef, params = nnx.split(model, nnx.Param)

    def loss(p):
        logp, _, _ = forward_rows(graphdef, p, steps.replace(response_mask=steps.response_mask), loss=CONFIG.loss,
                                  with_entropy=False)
        ratio = jnp.exp(jnp.where(mask_bl, logp - steps.behaviour_logp, 0.0))
        w = jax.lax.stop_gradient(jnp.clip(ratio, 0.0, 5.0))
        return -jnp.sum(jnp.where(mask_bl, w * adv_b[:, None] * logp, 0.0)) / mask_bl.sum()

    return jax.jit(jax.grad(loss))(params)


def close(a, b, tol=1e-5):
    return all(np.allclose(np.asarray(x), np.asarray(y), atol=tol) for x, y in zip(jax.tree.leaves(a),
                                                                                    jax.tree.leaves(b), strict=True))


@pytest.fixture(scope="module")
def tx():
    return make_optimizer(CONFIG.optimizer)


@pytest.fixture(scope="module")
def grad_fn(model):
    return make_grad_fn(CONFIG, model)


def stage_batch(steps, credit, advantage=None):
    """The update's batch of a stage: the sampled rows and their role tokens, with the credit's advantages."""
    return UpdateBatch(steps, credit.advantage if advantage is None else advantage, row_mask=credit.sample,
                       token_mask=credit.token_mask)


@pytest.mark.slow  # for CI time: `make test-slow` (README, "Tests")
def test_execution_stage_trains_execution_tokens_only(model, trained, grad_fn):
    batch, steps, credit = trained
    delegation = np.asarray(batch.role_mask(Role.DELEGATION)) & np.asarray(credit.sample)[:, None]
    assert credit.token_mask.any() and delegation.any()  # sampled rows hold delegation tokens: they must not train
    state = init_state(CONFIG, model, jax.random.key(0), make_optimizer(CONFIG.optimizer), schedule=True)
    grads, metrics = grad_fn(state, stage_batch(steps, credit))
    grads = grads["policy"]
    execution = credit.token_mask
    want = reference_grads(model, steps, credit.advantage, execution)
    assert close(grads, want)
    # delegation tokens of the same rows, with the same advantages, would move the parameters: they are left out
    with_delegation = steps.response_mask & credit.sample[:, None]
    assert not close(grads, reference_grads(model, steps, credit.advantage, with_delegation), tol=1e-7)
    assert np.isfinite(float(metrics["loss"])) and 0 < float(metrics["ratio_max"]) and 0 <= float(
        metrics["clip_frac"]) <= 1


@pytest.mark.slow  # for CI time: `make test-slow` (README, "Tests")
def test_an_update_is_one_adam_step_advances_the_schedule_and_a_nan_step_is_skipped(model, trained, tx, grad_fn):
    _, steps, credit = trained
    state = init_state(CONFIG, model, jax.random.key(0), tx, schedule=True)
    grads, _ = grad_fn(state, stage_batch(steps, credit))
    updates, _ = tx.update(grads, state.opt_state, state.trainable)
    want = optax.apply_updates(state.trainable, updates)["policy"]
    update = make_update(CONFIG, model, tx)
    state, metrics = update(state, stage_batch(steps, credit), None)
    assert close(state.params, want)
    assert int(state.step) == 1 and int(state.schedule.step) == 1 and int(state.schedule.skipped) == 0
    assert float(metrics["skipped"]) == 0 and float(metrics["tokens"]) == float(credit.token_mask.sum())
    assert float(metrics["lr"]) == pytest.approx(1e-2)
    after = jax.tree.map(jnp.copy, state.params)
    state, metrics = update(state, stage_batch(steps, credit, jnp.where(credit.sample, jnp.nan, 0.0)), None)
    assert float(metrics["skipped"]) == 1 and leaves_equal(after, state.params)
    counters = (state.step, state.schedule.step, state.schedule.skipped, state.nonfinite)
    assert tuple(map(int, counters)) == (2, 1, 1, 1)
    state = skip_batch(state)  # a batch that samples nothing: no step, the schedule stays
    assert (int(state.step), int(state.schedule.step), int(state.schedule.skipped)) == (3, 1, 2)


def test_the_config_chooses_the_loss(model, trained):
    """RAO's config trains CISPO (no PPO-clip terms; a ratio clipped to [0, 5] only); the same rows under a flat
    method's loss are PPO-clip, whose loss differs."""
    _, steps, credit = trained
    flat = CONFIG.replace(credit=GRPOCredit())
    state = init_state(CONFIG, model, jax.random.key(0), make_optimizer(OptimizerConfig()))
    cispo_loss, cispo = make_loss_fn(CONFIG, model)(state, stage_batch(steps, credit))
    clip_loss, clip = make_loss_fn(flat, model)(state, stage_batch(steps, credit))
    assert "pg_loss" not in cispo and "dual_clip_frac" not in cispo and "pg_loss" in clip
    assert np.isfinite(float(cispo_loss)) and float(cispo_loss) != float(clip_loss)


def test_the_loss_is_the_rubric_objective_summed_over_micro_batches(model, trained):
    """The update's CISPO loss over a stage's rows and tokens, accumulated over micro-batches of 8 of the 32 rows,
    is :func:`agentjax.losses.rubric.rubric_loss` of the whole batch (token-mean CISPO over one role's tokens): the
    objective SERA's rubric stage trains on its rubric rows."""
    _, steps, credit = trained
    assert steps.capacity > CONFIG.micro_batch_size
    state = init_state(CONFIG, model, jax.random.key(0), make_optimizer(CONFIG.optimizer), schedule=True)
    loss, metrics = make_loss_fn(CONFIG, model)(state, stage_batch(steps, credit))
    graphdef, params = nnx.split(model, nnx.Param)
    rows = steps.replace(row_mask=credit.sample, response_mask=steps.response_mask & credit.token_mask)
    logp, _, _ = forward_rows(graphdef, params, rows, loss=CONFIG.loss, with_entropy=False)
    want, parts = rubric_loss(logp, steps.behaviour_logp, credit.advantage,
                              steps.response_mask & credit.sample[:, None], credit.token_mask)
    assert float(want) != 0.0
    np.testing.assert_allclose(float(loss), float(want), rtol=1e-5)
    for k in ("clip_frac", "ratio_mean"):
        np.testing.assert_allclose(float(metrics[k]), float(parts[k]), rtol=1e-5, err_msg=k)
