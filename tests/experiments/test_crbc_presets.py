"""The CRBC experiment presets: the paper's setting, sharded on 8 fake CPU devices with a shrunken model (the
whole trainer loop for one Sokoban update; one sharded update on a batch of the ALFWorld / WebShop presets'
shape, whose envs need the benchmark data), the ablation grid, and the report from runs' metrics."""

from __future__ import annotations

import json
import os

import jax
import pytest
from flax import nnx

from agentjax.models import Qwen
from agentjax.parallel import create_sharded, fsdp_tp, make_mesh
from agentjax.train import UpdateBatch, compute_advantages, init_state, make_update
from agentjax.train.config import CRBCCredit, ModelConfig
from agentjax.train.metrics import MetricsWriter
from agentjax.train.presets import paper, tiny_arch
from agentjax.train.trainer import optimizer, train
from experiments.crbc import ablations
from experiments.crbc import report as report_module
from experiments.crbc.presets import POOL, ablation_runs, pool_run, smoke_run, tiny_run
from experiments.crbc.report import summarise
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
    assert run.mesh == ((8, 1) if size == "1.5b" else (2, 4))  # one node of 8 x 80 GB GPUs
    assert paper("gigpo", "webshop", size).train.credit.mode == "mean_norm"


def test_the_pool_setting_is_the_tiny_preset_on_a_fixed_pool_of_rooms():
    """Same warm start, policy, sizes and loss as the tiny run; trained and evaluated on the train split's first
    rooms, with held-out rooms evaluated beside (the same 128 episodes a series)."""
    base, run = tiny_run("crbc", 1), pool_run("crbc", 1)
    assert run.warm_start == base.warm_start and run.train.model == base.train.model
    assert run.train.rollout == base.train.rollout and run.train.loss == base.train.loss and run.train.seed == 1
    assert (run.train_pool, run.eval_split, run.eval_tasks, run.held_out_tasks) == (POOL, "train", POOL, POOL)
    assert run.eval_tasks * run.eval_seeds == base.eval_tasks * base.eval_seeds == 128
    assert run.train.rollout.num_groups <= POOL and run.out_dir.endswith(os.path.join("pool", "crbc", "seed1"))
    assert (run.train.optimizer.learning_rate, run.train.mini_batches) == (2e-3, 4)
    assert (base.train_pool, base.held_out_tasks) == (0, 0)


def shrunk(run, **sizes):
    """The preset with the tiny policy and small sizes (its mesh, method and collector settings kept)."""
    run = run.replace(train=run.train.replace(model=ModelConfig(SHRUNK)), require_pretrained=False)
    return run.with_sizes(**sizes)


@pytest.mark.slow  # end to end: `make test-slow` (README, "Tests")
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
    assert shardings == {8}  # every parameter lives on the (2, 4) mesh
    assert json.load(open(tmp_path / "run_config.json"))["mesh"] == [2, 4]


@pytest.mark.slow  # end to end: `make test-slow` (README, "Tests")
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
    state, metrics = make_update(cfg, model, tx)(state, UpdateBatch.of(batch, adv), jax.random.key(1))
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


def test_report_reproduces_the_table_from_the_runs_files(tmp_path):
    """The report reads each run's eval/<update>.json outcomes (tasks x eval seeds) and metrics.jsonl; numbers
    checked by hand: mean ± standard error over training seeds, gains and differences paired by episode."""
    outcomes = {  # updates 0, 1, 2; two tasks x two eval seeds
        ("grpo", 0): [[[1, 0], [0, 0]], [[1, 1], [0, 0]], [[1, 1], [1, 0]]],  # 0.25, 0.5, 0.75
        ("grpo", 1): [[[0, 0], [0, 0]], [[1, 0], [0, 0]], [[1, 0], [0, 0]]],  # 0, 0.25, 0.25
        ("crbc", 0): [[[1, 0], [0, 0]], [[1, 1], [1, 0]], [[1, 1], [1, 1]]],  # 0.25, 0.75, 1
        ("crbc", 1): [[[0, 0], [0, 0]], [[1, 1], [0, 0]], [[1, 1], [1, 0]]],  # 0, 0.5, 0.75
    }
    runs = {}
    for (method, seed), per_update in outcomes.items():
        run = smoke_run(method, seed, results=str(tmp_path))
        runs[(method, seed)] = run
        os.makedirs(os.path.join(run.out_dir, "eval"))
        for step, o in enumerate(per_update):
            with open(os.path.join(run.out_dir, "eval", f"{step}.json"), "w") as f:
                json.dump({"step": step, "outcomes": o}, f)
        with MetricsWriter(run.out_dir, tensorboard=False) as w:
            for step in (1, 2):
                w.write(step, {"rollout/success_rate": (0.1 if method == "grpo" else 0.3) + 0.1 * (step - 1)})
    table = report(runs, str(tmp_path), "tiny")
    g, c = table["grpo"], table["crbc"]
    assert (g["initial"]["mean"], g["initial"]["se"]) == pytest.approx((0.125, 0.125))
    assert (g["final"]["mean"], g["final"]["se"]) == pytest.approx((0.5, 0.25))
    assert (g["gain"]["mean"], g["gain"]["se"], g["gain"]["z"]) == pytest.approx((0.375, 0.125, 3.0))
    assert (c["final"]["mean"], c["final"]["se"]) == pytest.approx((0.875, 0.125))
    assert (c["gain"]["mean"], c["gain"]["se"]) == pytest.approx((0.75, 0.0))
    assert (c["final_minus_base"]["mean"], c["final_minus_base"]["se"]) == pytest.approx((0.375, 0.125))
    assert (c["train_minus_base"]["mean"], c["train_minus_base"]["se"]) == pytest.approx((0.2, 0.0))
    assert g["curve"] == pytest.approx({0: 0.125, 1: 0.375, 2: 0.5})
    with_threshold = summarise(runs, threshold=0.5)
    assert with_threshold["grpo"]["updates_to_threshold"] == 2 and with_threshold["crbc"]["updates_to_threshold"] == 1
    md = (tmp_path / "tiny_results.md").read_text()
    assert "| crbc | 2 | 0.125 ± 0.125 | 0.875 ± 0.125 | 0.875 ± 0.125 | +0.750 ± 0.000 |" in md, md
    assert "| grpo | 2 | 0.125 ± 0.125 | 0.500 ± 0.250 |" in md and "+0.375 ± 0.125 |" in md, md
    assert json.load(open(tmp_path / "tiny_results.json"))["results"]["grpo"]["episodes"] == 4
    assert (tmp_path / "tiny_curves.png").stat().st_size > 10_000


def test_several_runs_train_in_child_processes_even_one_at_a_time(tmp_path, monkeypatch):
    from experiments.crbc import run as experiment

    called = []
    monkeypatch.setattr(experiment, "run_in_process", lambda run: called.append(run.out_dir) or 0)
    monkeypatch.setattr(experiment, "run_one", lambda run: pytest.fail("trained in the runner's own process"))
    runs = {(m, 0): smoke_run(m, 0, results=str(tmp_path)).replace(warm_start=None) for m in ("grpo", "crbc")}
    experiment.run_all(runs, jobs=1)
    assert sorted(called) == sorted(r.out_dir for r in runs.values())


def test_a_run_another_driver_took_since_the_listing_is_left_to_it(tmp_path, monkeypatch):
    """Two drivers on one queue: a run locked (or finished) by another process by the time its turn comes spawns no
    child, and a child that loses the lock race exits BUSY, which is not a failure."""
    from agentjax.train.checkpoint import run_folder_lock
    from experiments.crbc import run as experiment

    run = smoke_run("grpo", 0, results=str(tmp_path)).replace(warm_start=None)
    spawned = []
    monkeypatch.setattr(experiment.subprocess, "call", lambda *a, **k: spawned.append(a) or experiment.BUSY)
    os.makedirs(run.out_dir)
    with run_folder_lock(run.out_dir):
        assert experiment.run_in_process(run) == 0 and spawned == []
    assert experiment.run_in_process(run) == 0 and len(spawned) == 1  # the child lost the race: left to the winner
    monkeypatch.setattr(experiment.subprocess, "call", lambda *a, **k: 1)
    assert experiment.run_in_process(run) == 1  # a real failure stays one


def test_the_report_pairs_only_runs_that_started_from_the_same_policy(tmp_path):
    """Seed 1's CRBC run started from another policy than its GRPO base (a warm start rebuilt elsewhere: another
    update-0 evaluation on the same episodes), so only seed 0 enters the paired columns and the table lists seed 1
    as unpaired; where both runs record what they started from, the record decides."""
    first = {0: [[1, 0], [0, 0]], 1: [[0, 0], [0, 0]]}  # update 0's outcomes of GRPO's two seeds
    runs = {}
    for method, seed in (("grpo", 0), ("grpo", 1), ("crbc", 0), ("crbc", 1)):
        run = smoke_run(method, seed, results=str(tmp_path))
        runs[(method, seed)] = run
        os.makedirs(os.path.join(run.out_dir, "eval"))
        start = [[1, 1], [1, 1]] if (method, seed) == ("crbc", 1) else first[seed]
        for step, o in ((0, start), (2, [[1, 1], [1, 0]] if method == "crbc" else [[1, 0], [0, 0]])):
            with open(os.path.join(run.out_dir, "eval", f"{step}.json"), "w") as f:
                json.dump({"step": step, "outcomes": o}, f)
        with MetricsWriter(run.out_dir, tensorboard=False) as w:
            w.write(2, {"rollout/success_rate": 0.5})

    def alike(seed):
        crbc, grpo = (report_module.read_record(runs[(m, seed)].out_dir) for m in ("crbc", "grpo"))
        return report_module.started_alike(crbc, grpo)

    assert alike(0) and not alike(1)
    table = report(runs, str(tmp_path), "tiny")
    assert table["crbc"]["unpaired_seeds"] == [1] and table["crbc"]["final_minus_base"]["n"] == 1
    assert table["crbc"]["final_minus_base"]["mean"] == pytest.approx(0.5)  # seed 0 only: 0.75 - 0.25
    assert "Left out of the paired columns" in (tmp_path / "tiny_results.md").read_text()
    assert summarise(runs)["crbc"]["final_minus_base"]["n"] == 2  # without same_start: both seeds

    def record(key, sha):
        for method in ("grpo", "crbc"):
            with open(os.path.join(runs[(method, 0)].out_dir, "initial_policy.json"), "w") as f:
                json.dump({"source": "warm_start", "key": key, "weights_sha256": sha[method],
                           "built_with": {"cpu_count": 2 if method == "grpo" else 4}}, f)

    record("k", {"grpo": "a", "crbc": "a"})  # the same weights, built on other CPUs: alike
    assert alike(0)
    record("k", {"grpo": "a", "crbc": "b"})  # other weights: not alike, though update 0's outcomes agree
    assert not alike(0)


def test_the_pool_report_tabulates_the_held_out_series_beside(tmp_path):
    """A pool run's report: the pool's table, then the held-out series' (eval/held_out/<update>.json) with its own
    gains; the JSON keeps both and the figure gets a panel more."""
    runs = {}
    for method, pool, held_out in (("grpo", [0.0, 0.5], [0.5, 0.0]), ("crbc", [0.0, 1.0], [0.5, 0.5])):
        run = pool_run(method, 0, results=str(tmp_path)).replace(out_dir=str(tmp_path / method))
        runs[(method, 0)] = run
        for series, rates in (("", pool), ("held_out", held_out)):
            os.makedirs(os.path.join(run.out_dir, "eval", series), exist_ok=True)
            for step, rate in zip((0, 16), rates, strict=True):
                with open(os.path.join(run.out_dir, "eval", series, f"{step}.json"), "w") as f:
                    json.dump({"step": step, "outcomes": [[1, 1], [0, 0]] if rate == 0.5 else [[rate] * 2] * 2}, f)
        with MetricsWriter(run.out_dir, tensorboard=False) as w:
            w.write(16, {"rollout/success_rate": 0.5})
    report(runs, str(tmp_path), "pool")
    md = (tmp_path / "pool_results.md").read_text()
    head, held_out = md.split("## The same runs on 16 held-out `valid` rooms")
    assert "the pool setting: trained on the `train` split's first 16 rooms" in head
    assert "| crbc | 1 | 0.000 | 1.000 | 1.000 | +1.000 |" in head and "| grpo | 1 | 0.000 | 0.500 |" in head, md
    assert "| crbc | 1 | 0.500 | 0.500 | 0.500 | +0.000 |" in held_out, md
    assert "| grpo | 1 | 0.500 | 0.000 |" in held_out, md
    saved = json.load(open(tmp_path / "pool_results.json"))
    assert saved["results"]["crbc"]["gain"]["mean"] == 1.0 and saved["held_out"]["grpo"]["gain"]["mean"] == -0.5
    assert (tmp_path / "pool_curves.png").stat().st_size > 10_000


def test_run_all_leaves_a_run_another_process_is_training(tmp_path, capsys):
    """Two drivers on one results folder: the second skips the run the first is training (its folder's lock) instead
    of training it again into the same files."""
    from agentjax.train.checkpoint import run_folder_lock
    from experiments.crbc.run import run_all

    run = tiny_run("grpo", 0).replace(out_dir=str(tmp_path / "grpo"))
    with run_folder_lock(run.out_dir):
        run_all({("grpo", 0): run}, jobs=2)
    assert "grpo seed 0: being trained by another process: left to it" in capsys.readouterr().out
    assert os.listdir(run.out_dir) == [".train.lock"]  # nothing started: no warm start, no run_config.json
