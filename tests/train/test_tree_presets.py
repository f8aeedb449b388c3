"""The tree methods' presets: the paper's setting (SERA's released configs: Qwen3-4B-Instruct-2507, 8 roots × 8 trees,
20 turns a node, depth ≤ 3, CISPO, Adam 3e-6 (0.9, 0.95), decay 0.017) and the tiny CPU preset; one RAO update of the
whole tree trainer on the paper preset, sharded on 8 fake CPU devices (tests/conftest.py) with a shrunken model.

The sharded run is the file's cost: ~1-2 min of CPU on the shared 2-core machine (the sampler, the credit and the
sharded update compile once each), so it is marked ``slow``."""

from __future__ import annotations

import dataclasses
import json
import math

import jax
import jax.numpy as jnp
import pytest

from agentjax.train import trees
from agentjax.train.config import ModelConfig, RAOCredit
from agentjax.train.presets import paper_tree, tiny_tree, tiny_tree_arch
from agentjax.train.trainer import train

SHRUNK = tiny_tree_arch(d_model=32, mlp_dim=64, num_layers=1, head_dim=8)  # 4 heads, 2 kv heads


@pytest.mark.parametrize("env, steps, lens, filtered", [("textcraft_synth", 250, (9600, 512), True),
                                                        ("textworld_sync", 400, (10240, 3072), False)])
def test_paper_preset_mirrors_the_released_configs(env, steps, lens, filtered):
    run = paper_tree("rao", env)
    ro, cfg, opt = run.train.rollout, run.train, run.train.optimizer
    assert (ro.num_groups, ro.group_size, ro.max_steps) == (8, 8, 20) and run.updates == steps
    assert (run.tree.max_depth, run.tree.max_children, run.tree.history_length) == (3, 8, None)
    assert (ro.prompt_len, ro.response_len) == lens and ro.rows == 8 * 8 * 64 * 20
    assert cfg.model.arch.name == "qwen3-4b" and cfg.model.arch.qk_norm and run.require_pretrained
    assert cfg.credit == RAOCredit(filter_zero_variance=filtered) and cfg.credit.stages == (1, 0, 0)
    assert (cfg.credit.clip_low, cfg.credit.clip_high, cfg.loss.kl_coef, cfg.loss.entropy_coef) == (0.0, 5.0, 0, 0)
    assert (opt.learning_rate, opt.b1, opt.b2, opt.eps, opt.weight_decay, opt.max_grad_norm, opt.warmup_steps) == (
        3e-6, 0.9, 0.95, 1e-8, 0.017, 1.0, 0)
    assert cfg.mini_batches == cfg.epochs == 1 and run.collect.sampling.temperature == 1.0
    assert not run.collect.constrained and run.mesh == (1, 8) and run.workers == 0
    assert paper_tree("rao", env, stages=(12, 4, 0)).train.credit.stages == (12, 4, 0)  # RAO + D
    if env == "textworld_sync":
        assert run.env_kwargs["budget"] == 100 and run.eval_kwargs["budget"] is None


def test_tiny_preset_fits_the_cpu():
    run = tiny_tree()
    ro = run.train.rollout
    assert run.train.model.arch.family == "qwen3" and run.train.model.arch.vocab_size == 151_936
    assert (ro.num_groups, ro.group_size, ro.max_steps, run.tree.max_depth) == (2, 4, 8, 2)
    assert run.collect.constrained and run.collect.masked_logp and run.env_kwargs["planner_replies"]
    assert run.warm_start is not None and run.tree.history_length == 2
    run.check()


@pytest.mark.slow
def test_paper_preset_runs_one_rao_update_on_8_fake_devices(tmp_path, monkeypatch):
    """One batch of the whole tree trainer on the paper preset's (1, 8) mesh: 1 root task × 2 trees of 3 turns a
    node. The random policy's replies are invalid, so every advantage would be 0: the test gives the sampled rows
    advantage 1 to run the sharded CISPO step on a real gradient."""
    assert jax.device_count() == 8, "tests/conftest.py fakes 8 CPU devices"
    run = paper_tree("rao", "textcraft_synth")
    run = run.replace(train=run.train.replace(model=ModelConfig(SHRUNK), credit=RAOCredit(filter_zero_variance=False)),
                      require_pretrained=False)
    run = run.with_sizes(num_groups=1, group_size=2, max_steps=3, prompt_len=1024, response_len=32, capacity=64)
    sampling = dataclasses.replace(run.collect.sampling, prompt_bucket=1024)  # one prompt shape: one compile
    run = run.replace(updates=1, eval_every=0, checkpoint_every=1, progress=False, out_dir=str(tmp_path),
                      collect=run.collect.replace(batch_bucket=8, sampling=sampling))
    row_credit = trees.row_credit

    def credited(*args, **kwargs):
        c = row_credit(*args, **kwargs)
        return c.replace(advantage=jnp.where(c.sample, 1.0, 0.0))

    monkeypatch.setattr(trees, "row_credit", credited)
    summary = train(run)
    last = summary["last"]
    assert summary["optimizer_steps"] == 1 and last["train/skipped"] == 0 and last["tree/rows"] == 6
    assert all(map(math.isfinite, (last["train/loss"], last["train/grad_norm"]))) and last["train/grad_norm"] > 0
    assert {len(x.sharding.device_set) for x in jax.tree.leaves(summary["params"])} == {8}
    config = json.load(open(tmp_path / "run_config.json"))
    assert config["mesh"] == [1, 8] and config["train"]["credit"]["method"] == "rao"


def test_paper_sera_preset_mirrors_the_released_configs():
    from agentjax.train.config import SERACredit

    run = paper_tree("sera", "textcraft_synth")
    credit = run.train.credit
    assert isinstance(credit, SERACredit) and credit.stages == (16, 2, 2) and run.updates == 250
    assert (credit.branches, credit.fork_budget, credit.margin, credit.reading) == (8, 16, 0.2, "final")
    assert run.rubric_collect.writing.temperature == 1.0 and run.rubric_collect.grading.temperature == 0.0
    assert not run.rubric_collect.constrained and run.fork_collect.branches == 8
    assert paper_tree("sera", "textworld_sync", stages=(16, 0, 2)).train.credit.stages == (16, 0, 2)  # w/o D


@pytest.mark.slow
def test_paper_sera_preset_runs_one_step_of_each_stage_on_8_fake_devices(tmp_path, monkeypatch):
    """Three optimizer steps of the SERA trainer on the paper preset's (1, 8) mesh, one per stage (1 : 1 : 1):
    execution, decomposition and rubric. The shrunken random policy decodes under the world's constraint (so it
    delegates, and its children get rubrics and fork groups) and writes constrained rubrics; its branches all fail,
    so no fork group is mixed: the test gives every sampled row advantage 1 to run each stage's sharded CISPO step."""
    from agentjax.train.config import SERACredit
    from agentjax.train.tree_credit import STAGE_ROLES

    assert jax.device_count() == 8, "tests/conftest.py fakes 8 CPU devices"
    run = paper_tree("sera", "textcraft_synth")
    credit = SERACredit(stages=(1, 1, 1), filter_zero_variance=False, branches=2, fork_budget=2)
    run = run.replace(train=run.train.replace(model=ModelConfig(SHRUNK), credit=credit), require_pretrained=False,
                      env_kwargs={"show_recipes": False},
                      tree=dataclasses.replace(run.tree, max_depth=1, max_nodes=4, rubric_tokens=320,
                                               grade_tokens=96, rubric_choices=True, max_skipped_batches=8))
    run = run.with_sizes(num_groups=1, group_size=2, max_steps=3, prompt_len=1024, response_len=48, capacity=64)
    sampling = dataclasses.replace(run.collect.sampling, prompt_bucket=1024)
    run = run.replace(updates=3, eval_every=0, checkpoint_every=3, progress=False, out_dir=str(tmp_path),
                      collect=run.collect.replace(batch_bucket=8, sampling=sampling, constrained=True))
    row_credit, rubric_credit = trees.row_credit, trees.rubric_credit_rows

    def every_row(batch, credit, stage, **kwargs):  # the stage's role tokens of every real row, advantage 1
        c, real = row_credit(batch, credit, stage, **kwargs), batch.steps.row_mask
        return c.replace(advantage=jnp.where(real, 1.0, 0.0), sample=real,
                         token_mask=batch.role_mask(STAGE_ROLES[stage]) & real[:, None])

    def every_rubric(rows, credit, **kwargs):  # every rubric row, advantage 1
        c, real = rubric_credit(rows, credit, **kwargs), rows.steps.row_mask
        return c.replace(advantage=jnp.where(real, 1.0, 0.0), sample=real,
                         token_mask=rows.steps.response_mask & real[:, None])

    monkeypatch.setattr(trees, "row_credit", every_row)
    monkeypatch.setattr(trees, "rubric_credit_rows", every_rubric)
    summary = train(run)
    from agentjax.train.metrics import read_metrics

    lines = read_metrics(tmp_path)
    trained = [x for x in lines if not x["schedule/no_signal"]]
    assert summary["optimizer_steps"] == 3 and [x["schedule/stage"] for x in trained] == [0, 1, 2]
    assert all(math.isfinite(x["train/loss"]) and x["train/skipped"] == 0 for x in trained)
    assert trained[2]["fork/groups"] >= 1 and trained[2]["rubric/failures"] == 0
    assert {len(x.sharding.device_set) for x in jax.tree.leaves(summary["params"])} == {8}
