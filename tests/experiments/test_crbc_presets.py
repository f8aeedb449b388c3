"""The CRBC experiment presets: the paper's setting, sharded on 8 fake CPU devices with a shrunken model (the
whole trainer loop for one Sokoban update; one sharded update on a batch of the ALFWorld / WebShop presets'
shape, whose envs need the benchmark data), the ablation grid, and the report from runs' metrics."""

from __future__ import annotations

import json

import jax
import pytest
from flax import nnx

from agentjax.models import Qwen
from agentjax.parallel import create_sharded, fsdp_tp, make_mesh
from agentjax.train import compute_advantages, init_state, make_update
from agentjax.train.config import CRBCCredit, ModelConfig
from agentjax.train.loop import optimizer, train
from agentjax.train.metrics import MetricsWriter
from agentjax.train.presets import paper, tiny_arch
from experiments.crbc import ablations
from experiments.crbc.presets import ablation_runs, smoke_run, tiny_run
from experiments.crbc.run import report
from tests.train.conftest import token_batch

SHRUNK = tiny_arch(d_model=32, mlp_dim=64, num_layers=1, head_dim=8)  # 4 heads, 2 kv heads: tp = 2 divides both


@pytest.mark.parametrize("env, cap, prompt", [("alfworld", 50, 2048), ("webshop", 15, 4096), ("sokoban", 15, 1024)])
@pytest.mark.parametrize("size", ["1.5b", "7b"])
def test_paper_presets_mirror_the_paper(env, cap, prompt, size):
    run = paper("crbc", env, size)
    ro, co, credit = run.train.rollout, run.collect, run.train.credit
    assert (ro.num_groups, ro.group_size, ro.max_steps, run.updates) == (16, 8, cap, 150)
    assert (co.group_size, co.max_steps, co.history_length) == (8, cap, 2)
    assert (co.success_reward, co.invalid_penalty, co.reward) == (10.0, 0.1, "success")
    assert credit == CRBCCredit(beta=0.98, depth=None, w_traj=1.0, w_step=5.0, sigma_min=0.1)
    assert ro.prompt_len == co.max_prompt_tokens == prompt and ro.response_len == 512 and ro.rows == 16 * 8 * cap
    assert run.train.model.arch.name == f"qwen2.5-{size}" and run.require_pretrained
    assert run.mesh == ((8, 1) if size == "1.5b" else (4, 2))  # one node of 8 x 80 GB GPUs
    assert paper("gigpo", "webshop", size).train.credit.mode == "mean_norm"


def shrunk(run, **sizes):
    """The preset with the tiny policy and small sizes (its mesh, method and collector settings kept)."""
    run = run.replace(train=run.train.replace(model=ModelConfig(SHRUNK)), require_pretrained=False)
    return run.with_sizes(**sizes)


def test_paper_preset_runs_one_update_of_the_loop_on_8_fake_devices(tmp_path):
    assert jax.device_count() == 8, "tests/conftest.py fakes 8 CPU devices"
    run = shrunk(paper("crbc", "sokoban", "7b"), num_groups=1, group_size=4, max_steps=2, response_len=16,
                 capacity=16, micro_batch_size=8)
    run = run.replace(updates=1, eval_every=0, workers=0, progress=False, out_dir=str(tmp_path),
                      collect=run.collect.replace(batch_bucket=8))
    summary = train(run)
    assert summary["step"] == 1 and summary["last"]["train/skipped"] == 0
    assert summary["last"]["rollout/num_episodes"] == 4 and summary["last"]["train/tokens"] > 0
    shardings = {len(x.sharding.device_set) for x in jax.tree.leaves(summary["params"])}
    assert shardings == {8}  # every parameter lives on the (4, 2) mesh
    assert json.load(open(tmp_path / "run_config.json"))["mesh"] == [4, 2]


@pytest.mark.parametrize("env, size", [("alfworld", "7b"), ("webshop", "1.5b")])
def test_paper_presets_shard_and_update_on_8_fake_devices(env, size):
    run = shrunk(paper("crbc", env, size), num_groups=2, group_size=4, max_steps=2, prompt_len=32, response_len=16)
    cfg = run.train
    mesh = make_mesh(*run.mesh)
    model = create_sharded(cfg.model.arch, fsdp_tp(), mesh, seed=0)
    tx = optimizer(cfg.optimizer)
    state = init_state(cfg, model, jax.random.key(0), tx)
    batch = token_batch(cfg, 0)
    adv = compute_advantages(cfg.credit, batch, cfg.rollout)
    state, metrics = make_update(cfg, model, tx)(state, batch, adv, jax.random.key(1))
    assert int(state.step) == 1 and float(metrics["skipped"]) == 0 and float(metrics["grad_norm"]) > 0
    assert {len(x.sharding.device_set) for x in jax.tree.leaves(state.params)} == {8}
    before = nnx.state(Qwen(cfg.model.arch, rngs=nnx.Rngs(0)), nnx.Param)
    assert any(float(abs(a - b).max()) > 0 for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(state.params),
                                                            strict=True))


def test_ablation_grid():
    runs = ablation_runs(tiny_run("crbc", 0), seed=1)
    depth = {n: r.train.credit.depth for n, r in runs.items() if n.startswith("depth")}
    assert depth == {"depth_0": 0, "depth_1": 1, "depth_2": 2, "depth_3": 3, "depth_inf": None}
    assert sorted(r.train.credit.w_step for n, r in runs.items() if n.startswith("w_step")) == [1.0, 5.0, 10.0]
    assert sorted(r.train.credit.beta for n, r in runs.items() if n.startswith("beta")) == [0.95, 0.98, 0.99, 1.0]
    groups = {n: r for n, r in runs.items() if n.startswith("group")}
    assert sorted(r.train.rollout.group_size for r in groups.values()) == [4, 8, 16]
    for r in groups.values():
        assert r.collect.group_size == r.train.rollout.group_size  # both sides of the sizes changed
        assert r.train.rollout.rows % (r.train.micro_batch_size * r.train.mini_batches) == 0
    assert len({r.out_dir for r in runs.values()}) == 15 and all(r.train.seed == 1 for r in runs.values())
    with pytest.raises(ValueError, match="vary CRBC"):
        ablation_runs(tiny_run("grpo", 0))


def test_ablations_dry_run_lists_every_run(capsys):
    assert ablations.main(["--dry-run", "--seeds", "0", "1"]) == 0
    out = capsys.readouterr().out
    assert "30 runs" in out and "K=inf w_S=10" in out and "G=16" in out and "beta=0.95" in out


def test_report_reproduces_the_table_from_the_metrics(tmp_path):
    runs = {}
    # eval success at updates 0 (the initial policy, no training batch), 1, 2
    finals = {("grpo", 0): [0.9, 0.1, 0.3], ("grpo", 1): [0.0, 0.2, 0.1], ("crbc", 0): [0.2, 0.4, 0.6],
              ("crbc", 1): [0.2, 0.5, 0.8]}
    for (method, seed), evals in finals.items():
        run = smoke_run(method, seed, results=str(tmp_path))
        runs[(method, seed)] = run
        with MetricsWriter(run.out_dir, tensorboard=False) as w:
            w.write(0, {"eval/success_rate": evals[0]})
            for step, value in enumerate(evals[1:], 1):
                w.write(step, {"rollout/success_rate": value / 2, "eval/success_rate": value})
    table = report(runs, str(tmp_path), "tiny")
    assert table["grpo"]["final"] == pytest.approx((0.2, 0.1414213), abs=1e-6)  # last evals 0.3, 0.1
    assert table["grpo"]["best"] == pytest.approx((0.25, 0.0707107), abs=1e-6)  # bests after updates 0.3, 0.2
    assert table["grpo"]["initial"] == pytest.approx((0.45, 0.6363961), abs=1e-6)
    assert table["grpo"]["gain"] == pytest.approx((-0.25, 0.4949747), abs=1e-6)  # -0.6, +0.1
    assert table["crbc"]["final"] == pytest.approx((0.7, 0.1414213), abs=1e-6)
    assert table["crbc"]["train_mean"] == pytest.approx((0.2875, 0.0530330), abs=1e-6)  # (0.2+0.3)/2, (0.25+0.4)/2
    md = (tmp_path / "tiny_results.md").read_text()
    # paired with grpo by seed and update: seed 0 (0.2-0.05, 0.3-0.15) -> 0.15, seed 1 (0.25-0.1, 0.4-0.05) -> 0.25
    assert table["crbc"]["train_minus_base"] == pytest.approx((0.2, 0.0707107), abs=1e-6)
    assert ("| crbc | 2 | 0.200 ± 0.000 | 0.700 ± 0.141 | 0.500 ± 0.141 | 0.700 ± 0.141 | 0.287 ± 0.053 "
            "| +0.200 ± 0.071 |" in md), md
    assert "| grpo | 2 |" in md and md.count("| — |") == 1, md
    assert json.load(open(tmp_path / "tiny_results.json"))["results"]["grpo"]["final_per_seed"] == [0.3, 0.1]
    assert (tmp_path / "tiny_curves.png").stat().st_size > 10_000
