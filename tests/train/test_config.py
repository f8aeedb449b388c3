"""Config dataclasses: defaults from METHODS.md, validation with the fix in the message, hashable, JSON-ready."""

from __future__ import annotations

import json

import jax
import optax
import pytest

from agentjax.train import (
    CREDIT_METHODS,
    CRBCCredit,
    GiGPOCredit,
    GraphGPOCredit,
    HGPOCredit,
    LossConfig,
    OptimizerConfig,
    PPOCredit,
    RolloutConfig,
    TrainConfig,
    UpdateSpec,
    credit_for,
    make_schedule,
)
from agentjax.train.config import RAOCredit, SERACredit


def test_method_defaults_are_the_papers():
    assert sorted(CREDIT_METHODS) == ["crbc", "gigpo", "graphgpo", "grpo", "hgpo", "ppo", "rao", "rloo", "sera"]
    sera = SERACredit()  # the released settings: 16 : 2 : 2, fork-8 on 16 forked environments, margin 0.2
    assert (sera.stages, sera.branches, sera.fork_budget, sera.margin, sera.reading) == ((16, 2, 2), 8, 16, 0.2,
                                                                                         "final")
    assert (sera.baseline, sera.clip_low, sera.clip_high) == (RAOCredit().baseline, 0.0, 5.0)
    assert CRBCCredit() == CRBCCredit(beta=0.98, depth=None, w_traj=1.0, w_step=5.0, sigma_min=0.1)
    assert (GiGPOCredit().gamma, GiGPOCredit().step_weight, GiGPOCredit().mode) == (0.95, 1.0, "mean_std_norm")
    assert (HGPOCredit().history, HGPOCredit().alpha) == (2, 1.0)
    assert GraphGPOCredit().gamma == 0.1
    assert RolloutConfig().rows == 16 * 8 * 50


def test_configs_are_hashable_static_args_and_json_ready():
    config = TrainConfig.tiny(credit=credit_for("gigpo", mode="mean_norm"))
    assert hash(config) == hash(TrainConfig.tiny(credit=GiGPOCredit(mode="mean_norm")))
    as_dict = json.loads(json.dumps(config.to_dict()))
    assert as_dict["credit"] == {"method": "gigpo", "gamma": 0.95, "mode": "mean_norm", "step_weight": 1.0}
    assert as_dict["model"]["arch"]["vocab_size"] == 512
    # configs that differ only in a non-PPO credit method share one update; PPO does not
    assert UpdateSpec.of(config) == UpdateSpec.of(TrainConfig.tiny())
    assert UpdateSpec.of(TrainConfig.tiny(credit=PPOCredit())) != UpdateSpec.of(config)


@pytest.mark.parametrize("build,match", [
    (lambda: LossConfig(dual_clip=1.0), "dual_clip must be > 1"),
    (lambda: LossConfig(clip_low=1.0), "clip_low must be < 1"),
    (lambda: LossConfig(kl_coef=-1.0), "kl_coef must be >= 0"),
    (lambda: OptimizerConfig(b2=1.0), r"b2 must be in \[0, 1\)"),
    (lambda: CRBCCredit(beta=1.5), r"beta must be in \(0, 1\]"),
    (lambda: CRBCCredit(depth=-1), "depth must be >= 0"),
    (lambda: PPOCredit(lam=2.0), r"lam must be in \[0, 1\]"),
    (lambda: RolloutConfig(group_size=0), "group_size must be > 0"),
    (lambda: TrainConfig.tiny(micro_batch_size=7), "choose a micro_batch_size that divides it"),
    (lambda: credit_for("ppo2"), "unknown credit method 'ppo2'"),
])
def test_bad_values_name_the_field_and_the_fix(build, match):
    with pytest.raises(ValueError, match=match):
        build()


@pytest.mark.parametrize("build,field", [
    (lambda: LossConfig(aggregation="sum"), "aggregation"),
    (lambda: OptimizerConfig(schedule="linear"), "schedule"),
    (lambda: GiGPOCredit(mode="std"), "mode"),
    (lambda: TrainConfig.tiny(credit="grpo"), "credit"),
])
def test_values_outside_a_literal_are_rejected(build, field):
    """A ValueError naming the field and the choices; under the tests' runtime type checks (jaxtyping + beartype)
    the annotation rejects the value first, with a TypeError that names the field too."""
    with pytest.raises((ValueError, TypeError), match=field):
        build()


def test_schedule_warms_up_then_holds_or_decays():
    constant = make_schedule(OptimizerConfig(learning_rate=1e-3, warmup_steps=4))
    assert [float(constant(i)) for i in (0, 2, 4, 100)] == pytest.approx([0.0, 5e-4, 1e-3, 1e-3])
    cosine = make_schedule(OptimizerConfig(learning_rate=1e-3, warmup_steps=2, schedule="cosine", decay_steps=10,
                                           min_lr_ratio=0.1))
    assert float(cosine(2)) == pytest.approx(1e-3)
    assert float(cosine(7)) == pytest.approx(1e-4 + 0.9e-3 * 0.5, rel=1e-5)
    assert float(cosine(12)) == pytest.approx(1e-4)
    assert isinstance(jax.jit(constant)(3), jax.Array)
    assert isinstance(optax.adamw(constant), optax.GradientTransformation)


def test_a_run_sets_each_size_once():
    """``train.rollout`` holds the sizes; the collector's copies follow it; a collector with other sizes is refused."""
    from agentjax.rollout.collect import CollectConfig
    from agentjax.train.presets import tiny
    from agentjax.train.runconfig import RunConfig, run_from_dict

    run = tiny("grpo", "sokoban")
    small = run.with_sizes(num_groups=2, max_steps=5, prompt_len=96, response_len=12)
    co = small.collect
    assert (co.group_size, co.max_steps, co.max_prompt_tokens, co.max_response_tokens, co.capacity) == (8, 5, 96, 12,
                                                                                                       2 * 8 * 5)
    assert small.train.rollout.rows == 80 and small.collect.history_length == run.collect.history_length
    built = RunConfig(train=small.train, env="sokoban", collect=CollectConfig(history_length=0), eval_tasks=4)
    assert (built.collect.max_steps, built.collect.capacity, built.collect.history_length) == (5, 80, 0)
    with pytest.raises(ValueError, match="train.rollout.max_steps=15 but collect.max_steps=3"):
        run.replace(collect=run.collect.replace(max_steps=3))
    assert run.replace(collect=run.collect.replace(history_length=1)).collect.history_length == 1
    assert run_from_dict(small.to_dict()) == small
