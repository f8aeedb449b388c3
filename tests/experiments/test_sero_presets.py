"""The SERO experiment presets: the paper's setting (GraphGPO / HGPO on ALFWorld / WebShop, Qwen2.5-1.5B / 7B,
λ_O = 0.1, the strict-success gate) mirrors the paper and the base presets; one update of the whole trainer loop
with SERO on the WebShop paper preset, sharded on 8 fake CPU devices with a shrunken model (the WebShop data from
``$AGENTJAX_DATA``, else ``../shared/data``); the tiny runs and the ablation grid.

The loop test is the file's cost: 50-60 s of CPU (the sharded update, the sampler and the behaviour scorer compile
once each), more wall time on a loaded machine."""

from __future__ import annotations

import dataclasses
import json
import math

import jax
import jax.numpy as jnp
import pytest

import agentjax.train.sero
from agentjax.train.config import ModelConfig, SeroConfig
from agentjax.train.presets import STEP_CAPS, paper, tiny_arch
from agentjax.train.trainer import train
from experiments.crbc.presets import pool_run as crbc_pool_run
from experiments.sera.presets import tiny_run as sera_tiny_run
from experiments.sero.presets import COEF, ablation_configs, ablation_runs, paper_run, pool_run, textcraft_run, tiny_run

SHRUNK = tiny_arch(d_model=32, mlp_dim=64, num_layers=1, head_dim=8)  # 4 heads, 2 kv heads: tp = 2 divides both
PAPER_SERO = SeroConfig(coef=0.1, scheme="sero", roots="uniform", soft_gate=False, gate_on="success")


@pytest.mark.parametrize("env, cap, prompt", [("alfworld", 50, 2048), ("webshop", 15, 4096)])
@pytest.mark.parametrize("size", ["1.5b", "7b"])
@pytest.mark.parametrize("method", ["graphgpo", "hgpo"])
def test_paper_presets_mirror_the_paper(method, env, cap, prompt, size):
    run = paper_run(method, env, size)
    ro, co, cfg = run.train.rollout, run.collect, run.train
    assert cfg.sero == PAPER_SERO and cfg.sero.coef == COEF == 0.1  # λ_O (§5.3), strict success on both (§4.4, §D)
    assert cfg.credit.method == method and STEP_CAPS[env] == cap
    assert (ro.num_groups, ro.group_size, ro.max_steps, run.updates) == (16, 8, cap, 150)
    assert ro.prompt_len == co.max_prompt_tokens == prompt and ro.response_len == 512
    assert run.train.model.arch.name == f"qwen2.5-{size}" and run.require_pretrained
    assert run.mesh == ((8, 1) if size == "1.5b" else (2, 4))  # one node of 8 x 80 GB GPUs
    assert cfg.oracle_micro_batch_size == cfg.micro_batch_size == (8 if size == "1.5b" else 2)  # the update's
    assert cfg.oracle_rows == 16 * cap  # every step of every group's budget: one branch per group at most
    assert run.train_collect.snapshots and len(run.branch_slots) == 16  # the roots' snapshots and branch slots
    base = paper(method, env, size)  # the matched base run: the same preset but for SERO (§E)
    assert dataclasses.replace(run, train=cfg.replace(sero=None), out_dir=base.out_dir) == base
    assert run.out_dir.endswith(f"paper-{size}/{env}/{method}+sero")
    assert paper_run(method, env, size, coef=0.5, scheme="root_only").train.sero == dataclasses.replace(
        PAPER_SERO, coef=0.5, scheme="root_only")


def test_paper_run_takes_only_the_papers_backbones_and_benchmarks():
    with pytest.raises(ValueError, match="backbones"):
        paper_run("crbc", "alfworld")
    with pytest.raises(ValueError, match="benchmarks"):
        paper_run("graphgpo", "sokoban")


def shrunk(run, **sizes):
    """The preset with the tiny policy and small sizes (its mesh, method, collector and SERO settings kept)."""
    run = run.replace(train=run.train.replace(model=ModelConfig(SHRUNK)), require_pretrained=False)
    return run.with_sizes(**sizes)


@pytest.mark.slow  # end to end: `make test-slow` (README, "Tests")
def test_paper_preset_runs_one_update_with_sero_on_8_fake_devices(tmp_path, monkeypatch):
    """The whole loop for one update of HGPO+SERO on WebShop on the 7B preset's (2, 4) mesh: 1 group × 2 rollouts ×
    2 steps (replies of up to 64 tokens, so the oracle's search command fits). The oracle needs 3-6 steps to buy the
    target, more than the 2-step budget, so the test credits the valid branches with a win: the gate, the weights, the
    behaviour scores and the oracle term of the sharded update then run on the real oracle rows."""
    assert jax.device_count() == 8, "tests/conftest.py fakes 8 CPU devices"
    run = shrunk(paper_run("hgpo", "webshop", "7b"), num_groups=1, group_size=2, max_steps=2, prompt_len=512,
                 response_len=64, capacity=4, micro_batch_size=4)
    sampling = dataclasses.replace(run.collect.sampling, prompt_bucket=512)  # one prompt shape: one compile
    run = run.replace(updates=1, eval_every=0, checkpoint_every=0, workers=0, progress=False, out_dir=str(tmp_path),
                      collect=run.collect.replace(batch_bucket=8, sampling=sampling))
    assert run.train.sero == PAPER_SERO and run.train.oracle_rows == 4

    def won(branches, *args, **kwargs):
        oracle = to_oracle_batch(branches, *args, **kwargs)
        return oracle.replace(oracle_return=jnp.where(oracle.valid & oracle.attempted, 1.0, oracle.oracle_return))

    to_oracle_batch = agentjax.train.sero.to_oracle_batch
    monkeypatch.setattr(agentjax.train.sero, "to_oracle_batch", won)
    summary = train(run)
    last = summary["last"]
    assert summary["step"] == 1 and last["train/skipped"] == 0 and last["rollout/num_episodes"] == 2
    # one root (the group failed), restored exactly, the oracle's steps recorded and trained on
    assert last["sero/roots_attempted"] == last["sero/roots_valid"] == last["sero/roots_gated"] == 1
    assert last["sero/ended_mismatch"] == last["sero/ended_restore_error"] == last["sero/ended_crash"] == 0
    assert last["sero/ended_inadmissible"] == 0 and last["sero/env_steps"] == last["sero/oracle_steps"] >= 1
    assert last["sero/trained_steps"] == last["sero/oracle_steps"] and 0 < last["sero/compat_mean"] <= 1
    assert last["sero/suffix_return"] == 0  # the failed rollout's suffix, strict success
    loss, oracle_loss, total = last["train/loss"], last["train/oracle_loss"], last["train/total_loss"]
    assert all(map(math.isfinite, (loss, oracle_loss, total, last["train/grad_norm"]))) and oracle_loss > 0
    assert total == pytest.approx(loss + COEF * oracle_loss, rel=1e-5)
    shardings = {len(x.sharding.device_set) for x in jax.tree.leaves(summary["params"])}
    assert shardings == {8}  # every parameter lives on the (2, 4) mesh
    config = json.load(open(tmp_path / "run_config.json"))
    assert config["mesh"] == [2, 4] and config["train"]["sero"] == dataclasses.asdict(PAPER_SERO)


@pytest.mark.parametrize("method", ["graphgpo", "crbc"])
def test_a_tiny_sero_run_differs_from_its_base_in_sero_and_out_dir_only(method):
    sero = SeroConfig(coef=0.5, scheme="full_flat")
    with_sero, base = tiny_run(method, 2, sero), tiny_run(method, 2)
    assert with_sero.train.sero == sero and base.train.sero is None and with_sero.out_dir != base.out_dir
    assert dataclasses.replace(with_sero, train=with_sero.train.replace(sero=None), out_dir=base.out_dir) == base
    assert with_sero.train.seed == base.train.seed == 2 and with_sero.warm_start == base.warm_start  # one warm start


def test_the_pool_setting_reuses_the_crbc_pool_runs_as_its_bases():
    base, with_sero = pool_run("graphgpo", 1), pool_run("graphgpo", 1, SeroConfig(coef=COEF))
    assert base == crbc_pool_run("graphgpo", 1)  # the CRBC pool comparison's own run, its out_dir included
    assert "/sero/results/runs/pool/graphgpo+sero/seed1" in with_sero.out_dir and with_sero.train_pool == 16
    assert dataclasses.replace(with_sero, train=with_sero.train.replace(sero=None), out_dir=base.out_dir) == base
    moved = pool_run("graphgpo", 1, updates=3)  # another budget is not the comparison's run: it runs here
    assert moved.updates == 3 and "/sero/results/runs/pool/graphgpo/seed1" in moved.out_dir
    for name, r in ablation_runs("crbc", 0, pool=True).items():
        assert r.train_pool == 16 and f"/runs/pool/crbc+sero_{name.split(':')[1]}/seed0" in r.out_dir


@pytest.mark.parametrize("method", ["graphgpo", "crbc"])
def test_the_textcraft_setting_is_the_sera_experiments_flat_run_with_the_methods_credit(method):
    flat = sera_tiny_run("grpo", 1)  # the SERA experiment's flat TextCraft-Synth run
    base, with_sero = textcraft_run(method, 1), textcraft_run(method, 1, SeroConfig(coef=COEF))
    assert base.env == "textcraft_synth" and base.train.credit.method == method and base.train.sero is None
    assert with_sero.train.sero == SeroConfig(coef=COEF) and base.warm_start == with_sero.warm_start == flat.warm_start
    assert "/sera/results/runs/warmstart/grpo" in base.warm_start.cache_dir  # one warm start, the SERA experiment's
    assert base.out_dir.endswith(f"/sero/results/runs/textcraft/{method}/seed1")
    assert with_sero.out_dir.endswith(f"/sero/results/runs/textcraft/{method}+sero/seed1")
    assert dataclasses.replace(base, train=base.train.replace(credit=flat.train.credit), out_dir=flat.out_dir) == flat
    assert textcraft_run(method, 1, updates=3).updates == 3


def test_the_textcraft_setting_has_its_own_report_and_no_ablations(tmp_path, monkeypatch):
    from experiments.sero import run

    written = []
    monkeypatch.setattr(run, "report", lambda runs, folder, name, title, command: written.append((name, set(runs))))
    argv = ["--textcraft", "--methods", "graphgpo", "--seeds", "0", "--report-only", "--results", str(tmp_path)]
    assert run.main(argv) == 0
    assert written == [("textcraft", {("graphgpo", 0), ("graphgpo+sero", 0)})]
    for extra in (["--ablations"], ["--matched"], ["--pool"]):
        with pytest.raises(SystemExit):
            run.main([*argv, *extra])


def test_ablation_grid():
    configs = ablation_configs()
    assert configs == {
        "sero": SeroConfig(coef=0.1),
        "root_only": SeroConfig(coef=0.1, scheme="root_only"),
        "full_flat": SeroConfig(coef=0.1, scheme="full_flat"),
        "depth_decay": SeroConfig(coef=0.1, scheme="depth_decay"),
        "shuffled": SeroConfig(coef=0.1, scheme="shuffled"),
        "short_bridge_k1": SeroConfig(coef=0.1, scheme="short_bridge", k=1),
        "short_bridge_k3": SeroConfig(coef=0.1, scheme="short_bridge", k=3),
        "coef_0.01": SeroConfig(coef=0.01),
        "coef_0.05": SeroConfig(coef=0.05),
        "coef_0.5": SeroConfig(coef=0.5),
        "coef_1": SeroConfig(coef=1.0),
    }
    runs = ablation_runs("graphgpo", 1)
    assert set(runs) == {f"graphgpo+sero:{name}" for name in configs if name != "sero"}
    assert len({r.out_dir for r in runs.values()}) == len(runs) and all(r.train.seed == 1 for r in runs.values())
    base = tiny_run("graphgpo", 1)
    for name, r in runs.items():
        assert r.train.sero == configs[name.split(":")[1]]
        assert dataclasses.replace(r, train=r.train.replace(sero=None), out_dir=base.out_dir) == base


@pytest.mark.parametrize("flags, names", [
    ([], ["pool"]),
    (["--ablations", "--only", "coef_0.01"], ["pool_ablations"]),  # a subset never overwrites the comparison's report
    (["--matched"], ["pool", "pool_matched"]),
])
def test_run_writes_only_the_reports_its_runs_make(flags, names, tmp_path, monkeypatch):
    from experiments.sero import run

    written = []
    monkeypatch.setattr(run, "report", lambda runs, folder, name, title, command: written.append((name, set(runs))))
    monkeypatch.setattr(run, "finished_records", lambda runs, path: dict.fromkeys(runs))  # every run finished
    monkeypatch.setattr(run, "extra_updates", lambda record, updates=None: 1)
    argv = ["--pool", "--methods", "graphgpo", "--seeds", "0", "--report-only", "--results", str(tmp_path), *flags]
    assert run.main(argv) == 0
    assert [name for name, _ in written] == names
    if "--only" in flags:
        assert written[0][1] == {("graphgpo", 0), ("graphgpo+sero", 0), ("graphgpo+sero:coef_0.01", 0)}
