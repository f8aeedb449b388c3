"""The trainer loop end to end on Sokoban with a tiny random Qwen2 (full Qwen vocabulary) and the real tokenizer.

Checked: a run stopped after update 1 and resumed equals the uninterrupted 2-update run (parameters bitwise,
every metrics line except timings); a corrupt newest checkpoint is reported, the previous one used, and the
re-run update reproduces the original line; NaN advantages make the update skip (logged line, unchanged
parameters) and the run stop after ``max_nonfinite_updates``; the metrics line carries every required statistic;
refusals before any work (existing checkpoints without resume, a changed config on resume, inconsistent sizes);
the task stream; the warm start (demonstrations win, NLL falls, the cache is reused).
"""

from __future__ import annotations

import dataclasses
import glob
import json
import logging
import os
import shutil

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from agentjax.train import flat, offline, trainer
from agentjax.train.checkpoint import Checkpointer, CorruptCheckpointWarning
from agentjax.train.config import ModelConfig
from agentjax.train.metrics import read_metrics
from agentjax.train.presets import tiny, tiny_arch, tiny_tree
from agentjax.train.runconfig import RunConfig, WarmStart, run_from_dict
from agentjax.train.update import NonFiniteUpdateError
from tests.train.conftest import leaves_equal

orbax_leftovers = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


def small_run(out_dir, method: str = "crbc", **changes) -> RunConfig:
    """The tiny preset shrunk: 1-layer d=32 policy, 1 group x 2 rollouts x 2 steps (one optimizer step per update),
    eval on 1 task, no warm start."""
    run = tiny(method)
    run = run.replace(train=run.train.replace(
        model=ModelConfig(tiny_arch(d_model=32, mlp_dim=64, num_layers=1, head_dim=8)), micro_batch_size=4,
        mini_batches=1))
    run = run.with_sizes(num_groups=1, group_size=2, max_steps=2)
    return run.replace(**(dict(eval_tasks=1, eval_seeds=1, eval_every=1, updates=2, checkpoint_every=1,
                               warm_start=None, progress=False, out_dir=str(out_dir)) | changes))


def without_timings(lines):
    return [{k: v for k, v in line.items() if k != "time" and not k.startswith("time/")} for line in lines]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    out = tmp_path_factory.mktemp("uninterrupted")
    summary = trainer.train(small_run(out))
    return out, summary


def test_metrics_lines_carry_every_statistic(uninterrupted):
    out, summary = uninterrupted
    initial, *lines = read_metrics(out)
    assert [line["step"] for line in lines] == [1, 2] and summary["step"] == 2
    # the initial policy is evaluated first (update 0: eval only), and the run records what it was
    assert initial["step"] == 0 and "eval/success_rate" in initial and "train/loss" not in initial
    assert json.load(open(out / trainer.INITIAL_POLICY)) == {"source": "random", "seed": 0}
    required = ["rollout/success_rate", "rollout/success/all", "rollout/mean_return", "rollout/invalid_rate",
                "rollout/mean_episode_length", "train/loss", "train/kl", "train/entropy", "train/clip_frac",
                "train/grad_norm", "train/lr", "train/skipped", "credit/adv_std", "credit/crbc_eligible_frac",
                "time/env", "time/generate", "time/credit", "time/update", "time/eval", "time/checkpoint",
                "eval/success_rate", "eval/success_std", "eval/success/all"]
    for line in lines:
        assert not [k for k in required if k not in line], line.keys()
        assert line["rollout/num_episodes"] == 2 and line["train/skipped"] == 0
    assert glob.glob(str(out / "tb" / "events.out.tfevents.*"))
    assert sorted(os.listdir(out / "checkpoints")) == ["1", "2"]
    assert run_from_dict(json.load(open(out / "run_config.json"))) == small_run(out)


@orbax_leftovers
def test_resume_equals_uninterrupted(uninterrupted, tmp_path):
    out, summary = uninterrupted
    run = small_run(tmp_path)
    first = trainer.train(run, stop_after=1)
    assert first["step"] == 1 and os.listdir(tmp_path / "checkpoints") == ["1"]
    record = {"source": "warm_start", "key": "built elsewhere", "weights_sha256": "0" * 64}
    (tmp_path / trainer.INITIAL_POLICY).write_text(json.dumps(record))  # as if started on another machine
    resumed = trainer.train(run, resume=True)
    assert resumed["resumed_from"] == 1 and resumed["step"] == 2
    assert json.loads((tmp_path / trainer.INITIAL_POLICY).read_text()) == record  # the start stays the first one's
    assert leaves_equal(resumed["params"], summary["params"])
    assert without_timings(read_metrics(tmp_path)) == without_timings(read_metrics(out))


@orbax_leftovers
def test_a_corrupt_latest_checkpoint_is_survived(uninterrupted, tmp_path):
    out, summary = uninterrupted
    shutil.copytree(out, tmp_path / "run")
    step_dir = tmp_path / "run" / "checkpoints" / "2"
    data = max(glob.glob(str(step_dir / "state" / "**" / "d" / "*"), recursive=True), key=os.path.getsize)
    raw = bytearray(open(data, "rb").read())
    raw[len(raw) // 2: len(raw) // 2 + 64] = bytes(b ^ 0x5A for b in raw[len(raw) // 2: len(raw) // 2 + 64])
    open(data, "wb").write(bytes(raw))
    with pytest.warns(CorruptCheckpointWarning, match="checkpoints/2 .*falling back"):
        resumed = trainer.train(small_run(tmp_path / "run"), resume=True)
    assert resumed["resumed_from"] == 1 and resumed["step"] == 2
    assert os.listdir(tmp_path / "run" / "checkpoints" / "corrupt")  # kept for inspection
    assert leaves_equal(resumed["params"], summary["params"])  # update 2 re-run to the same numbers
    assert without_timings(read_metrics(tmp_path / "run")) == without_timings(read_metrics(out))


def test_nonfinite_updates_are_skipped_logged_and_stop_the_run(uninterrupted, tmp_path, monkeypatch, caplog):
    real = flat.compute_advantages

    def nan_advantages(*args, **kwargs):
        adv = real(*args, **kwargs)
        return adv.replace(advantage=jnp.full_like(adv.advantage, jnp.nan))

    monkeypatch.setattr(flat, "compute_advantages", nan_advantages)
    run = small_run(tmp_path, updates=5, eval_every=0)
    run = run.replace(train=run.train.replace(max_nonfinite_updates=1))
    with caplog.at_level(logging.WARNING), pytest.raises(NonFiniteUpdateError, match="max_nonfinite_updates=1"):
        trainer.train(run)
    lines = read_metrics(tmp_path)
    assert [(x["step"], x["train/skipped"], x["train/nonfinite_total"]) for x in lines] == [(1, 1.0, 1.0),
                                                                                            (2, 1.0, 2.0)]
    assert "update 0 skipped" in caplog.text and "update 1 skipped" in caplog.text
    assert os.listdir(tmp_path / "checkpoints") == ["1"]  # the stopping update is not checkpointed
    monkeypatch.setattr(flat, "compute_advantages", real)
    trainers = [trainer.setup(run, resume=True), trainer.setup(small_run(tmp_path / "fresh", eval_every=0))]
    for t in trainers:
        t.close()
    resumed, fresh = (t.state for t in trainers)  # the skipped updates left the initial parameters
    assert int(resumed.step) == 1 and leaves_equal(resumed.params, fresh.params)


def test_refusals_before_any_work(uninterrupted, tmp_path):
    out, _ = uninterrupted
    with pytest.raises(FileExistsError, match="--resume"):
        trainer.train(small_run(out))
    shutil.copytree(out, tmp_path / "run")
    recorded = (tmp_path / "run" / trainer.RUN_CONFIG).read_text()
    with pytest.raises(trainer.ResumeMismatch, match="cannot resume.*differs.*learning_rate"):
        run = small_run(tmp_path / "run")
        trainer.setup(run.replace(train=run.train.replace(optimizer=dataclasses.replace(run.train.optimizer,
                                                                                     learning_rate=1.0))), resume=True)
    assert (tmp_path / "run" / trainer.RUN_CONFIG).read_text() == recorded  # the refused config is not written
    run = small_run(tmp_path)
    with pytest.raises(ValueError, match="train.rollout.group_size=2 but collect.group_size=3"):
        run.replace(collect=run.collect.replace(group_size=3))
    with pytest.raises(ValueError, match="row slots"):
        run.with_sizes(group_size=8, capacity=4)
    with pytest.raises(ValueError, match="eval_seeds=1 or a temperature"):
        run.replace(eval_temperature=0.0, eval_seeds=2)
    with pytest.raises(ValueError, match="not an environment"):
        run.replace(env="minecraft")


def test_a_checkpoint_without_a_newer_field_resumes_at_its_default(tmp_path):
    run = small_run(tmp_path)
    saved = run.to_dict()
    del saved["collect"]["sample_seeds"]  # written before CollectConfig had the field
    trainer.check_resumable(run, saved, "ckpt")
    with pytest.raises(ValueError, match="cannot resume.*collect.sample_seeds"):
        trainer.check_resumable(run.replace(collect=run.collect.replace(sample_seeds=True)), saved, "ckpt")


def test_task_stream_visits_every_task_once_per_epoch():
    stream = [i for p in range(5) for i in trainer.task_stream(10, 3, p, 4)]  # 20 draws = 2 epochs of 10
    assert sorted(stream[:10]) == list(range(10)) and sorted(stream[10:20]) == list(range(10))
    assert stream[:10] != stream[10:20]  # a fresh permutation per epoch
    assert trainer.task_stream(10, 3, 2, 4) == stream[8:12]  # a pure function of the position
    assert trainer.task_stream(10, 4, 0, 4) != stream[:4]
    with pytest.raises(ValueError, match="needs 11 tasks"):
        trainer.task_stream(10, 0, 0, 11)


def test_warm_start_imitates_the_oracle_and_is_cached(tmp_path, monkeypatch):
    from agentjax.models import load_tokenizer
    from agentjax.train import warmstart
    from envs.sokoban.env import SokobanEnv

    run = small_run(tmp_path, warm_start=WarmStart(episodes=2, steps=8, batch_size=4, learning_rate=3e-3,
                                                   cache_dir=str(tmp_path / "cache")))
    tokenizer = load_tokenizer()
    tasks = SokobanEnv.tasks("train")[:2]
    rows = warmstart.demonstrations(SokobanEnv(), tasks, tokenizer, run.collect.replace(max_steps=15))
    replies = [tokenizer.decode(r[:-1]) for _, r, _ in rows]
    assert all(r[-1] == run.collect.sampling.stop_token_ids[0] for _, r, _ in rows)
    if run.collect.masked_logp:  # the constrained decoder's choices at each reply position, the oracle's among them
        assert all(len(c) == len(r) and all(t in ci for t, ci in zip(r, c, strict=True)) for _, r, c in rows)
    assert set(replies) <= {f"<action>{a}</action>" for a in ("Up", "Down", "Left", "Right")}
    env, won = SokobanEnv(), 0  # the demonstrated actions solve both rooms
    for task in tasks:
        env.reset(task)
        done = False
        while not done:
            _, _, done, info = env.step(replies.pop(0)[len("<action>"):-len("</action>")])
        won += info["won"]
    assert won == 2 and not replies

    folder = warmstart.warm_start_folder(run, tokenizer)
    info = json.load(open(os.path.join(folder, "warmstart.json")))
    assert info["loss_last"] < info["loss_first"] and info["turns"] > 2
    assert 0.0 <= info["agreement"]["agreement"] <= 1.0 and info["agreement"]["chance"] == pytest.approx(0.25)
    assert info["weights_sha256"] == warmstart.weights_sha256(folder)  # the record names the weights it holds
    assert info["built_with"]["jax"] == jax.__version__ and info["built_with"]["cpu_count"] >= 1
    assert info["built_with"]["cpu_model"] == warmstart.cpu_info()["cpu_model"]  # the CPU type changes a build
    rebuilt = warmstart.warm_start_folder(run.replace(warm_start=dataclasses.replace(
        run.warm_start, cache_dir=str(tmp_path / "cache2"))), tokenizer)
    assert warmstart.weights_sha256(rebuilt) == info["weights_sha256"]  # a rebuild is bit-identical
    monkeypatch.setattr(warmstart, "supervised", lambda *a, **k: pytest.fail("the cache was not used"))
    assert warmstart.warm_start_folder(run.replace(out_dir=str(tmp_path / "other")), tokenizer) == folder
    model = trainer.build_model(run, tokenizer, None)
    fresh = trainer.build_model(run.replace(warm_start=None), tokenizer, None)
    assert not leaves_equal(nnx.state(model, nnx.Param), nnx.state(fresh, nnx.Param))
    # what a run records it started from (the reports pair runs by it): the warm start's key and weights
    started = warmstart.initial_policy(run)
    assert started == {"source": "warm_start", "key": os.path.basename(folder),
                       "weights_sha256": info["weights_sha256"], "built_with": info["built_with"]}
    assert warmstart.initial_policy(run.replace(warm_start=None)) == {"source": "random", "seed": run.train.seed}


@orbax_leftovers
def test_eval_command_evaluates_the_newest_checkpoint(uninterrupted, tmp_path, capsys):
    from agentjax.cli import main

    out, summary = uninterrupted
    shutil.copytree(out, tmp_path / "run")
    assert main(["eval", "--checkpoint", str(tmp_path / "run" / "checkpoints"), "--tasks", "2", "--seeds", "2"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert (result["step"], result["tasks"], result["seeds"], result["split"]) == (2, 2, 2, "valid")
    assert result["episodes"] == 4 and 0.0 <= result["success_rate"] <= 1.0
    assert json.load(open(tmp_path / "run" / "eval_2.json")) == result
    again = offline.evaluate_checkpoint(str(tmp_path / "run"), tasks=2, seeds=2)  # same key: same episodes
    assert {k: v for k, v in again.items() if k != "seconds"} == {k: v for k, v in result.items() if k != "seconds"}
    with Checkpointer(str(tmp_path / "run" / "checkpoints")) as ckpt:
        older = ckpt.steps()[0]
    assert older < 2  # a step folder names the checkpoint evaluated
    assert offline.evaluate_checkpoint(str(tmp_path / "run" / "checkpoints" / str(older)), tasks=2, seeds=2)["step"] \
        == older
    assert main(["eval", "--checkpoint", str(tmp_path / "run"), "--step", "9"]) == 2  # a step it does not have
    assert capsys.readouterr().err == (f"agentjax eval: error: {tmp_path / 'run'}/checkpoints has no checkpoint of "
                                       f"step 9; its steps are {older}, 2 (leave the step out for the newest that "
                                       "restores)\n")


def test_eval_env_kwargs_get_a_pool_of_their_own(tmp_path):
    """Evaluation runs the env with ``eval_env_kwargs`` (default: ``env_kwargs``, one shared pool)."""
    run = small_run(tmp_path, env_kwargs={"max_steps": 2})
    pool = flat.make_pool(run)
    try:
        assert flat.make_eval_pool(run, pool) is pool and pool.envs[0].max_steps == 2
        other = run.replace(eval_env_kwargs={"max_steps": 7})
        eval_pool = flat.make_eval_pool(other, pool)
        assert eval_pool is not pool and len(eval_pool.envs) == other.eval_slots
        assert {e.max_steps for e in eval_pool.envs} == {7} and other.eval_kwargs == {"max_steps": 7}
        eval_pool.close()
    finally:
        pool.close()
    with pytest.raises(ValueError, match="eval_env_kwargs=.* do not fit SokobanEnv"):
        run.replace(eval_env_kwargs={"room_size": 7}).check()


def test_eval_split_chooses_the_eval_tasks(tmp_path):
    """``eval_split`` evaluates on another split's first ``eval_tasks`` tasks (default: the env's eval split)."""
    run = small_run(tmp_path, eval_tasks=3)
    assert run.evaluation_split == run.spec.eval_split
    other = run.replace(eval_split=run.spec.train_split)
    assert run_from_dict(other.to_dict()) == other
    t = trainer.setup(other)
    try:
        assert [x.task_id for x in t.eval_tasks] == [x.task_id for x in run.spec.tasks(run.spec.train_split)[:3]]
    finally:
        t.close()
    with pytest.raises(ValueError, match="split 'nope'"):
        trainer.setup(run.replace(eval_split="nope", out_dir=str(tmp_path / "other")))


def test_a_training_pool_and_a_held_out_series(tmp_path, monkeypatch):
    """``train_pool`` draws every batch from the train split's first N tasks; ``held_out_tasks`` evaluates the env's
    eval split beside the eval tasks at every eval point, with its own outcomes and metrics."""
    played = []
    real = flat.FlatAlgorithm.collect

    def spy(self, state, policy, tasks, *args, **kwargs):  # the training batches' tasks
        played.extend(t.task_id for t in tasks)
        return real(self, state, policy, tasks, *args, **kwargs)

    monkeypatch.setattr(flat.FlatAlgorithm, "collect", spy)
    run = small_run(tmp_path, updates=3, eval_every=3, checkpoint_every=3, train_pool=2, held_out_tasks=3,
                    eval_split="train", eval_tasks=2)
    assert run.eval_slots == 3 * run.eval_seeds  # the larger series sizes the evaluation's pool
    assert run_from_dict(run.to_dict()) == run
    trainer.train(run)
    pool = {t.task_id for t in run.spec.tasks(run.spec.train_split)[:2]}
    assert len(played) == 3 and set(played) == pool  # 1 group an update, epochs of the 2-task pool
    held_out = [t.task_id for t in run.spec.tasks(run.spec.eval_split)[:3]]
    for step in (0, 3):
        with open(tmp_path / "eval" / f"{step}.json") as f:
            assert set(json.load(f)["tasks"]) == pool
        with open(tmp_path / "eval" / flat.HELD_OUT / f"{step}.json") as f:
            assert json.load(f)["tasks"] == held_out
    lines = {line["step"]: line for line in read_metrics(tmp_path)}
    assert "held_out/success_rate" in lines[0] and "held_out/success_rate" in lines[3]
    assert "held_out/success_rate" not in lines[1]
    with pytest.raises(ValueError, match="train_pool=1 is smaller than the 2 groups"):
        small_run(tmp_path, train_pool=1).with_sizes(num_groups=2)
    with pytest.raises(ValueError, match="train_pool=20000 but sokoban train has 10000"):
        trainer.setup(small_run(tmp_path / "big", train_pool=20000))
    with pytest.raises(ValueError, match="held_out_tasks must be >= 0"):
        small_run(tmp_path, held_out_tasks=-1)
    with pytest.raises(ValueError, match="the tree trainer .* evaluates one series"):
        tiny_tree("rao").replace(held_out_tasks=2)


def test_warm_start_prompts_are_cut_as_the_collector_cuts_them(tmp_path):
    """A demonstration prompt longer than ``max_prompt_tokens`` keeps its last tokens (``truncation="left"``), the
    same ids the collector's :func:`turn_prompt` gives the policy; with ``truncation="error"`` it is an error."""
    from agentjax.models import load_tokenizer
    from agentjax.train import warmstart
    from envs.sokoban.env import SokobanEnv

    tokenizer, tasks = load_tokenizer(), SokobanEnv.tasks("train")[:1]
    collect = small_run(tmp_path).collect.replace(max_steps=3)
    full = warmstart.demonstrations(SokobanEnv(), tasks, tokenizer, collect)
    cap = min(len(p) for p, _, _ in full) - 5
    cut = warmstart.demonstrations(SokobanEnv(), tasks, tokenizer, collect.replace(max_prompt_tokens=cap,
                                                                                   truncation="left"))
    assert [p[-cap:] for p, _, _ in full] == [p for p, _, _ in cut]
    assert [r for _, r, _ in full] == [r for _, r, _ in cut]
    with pytest.raises(ValueError, match="more than max_prompt_tokens"):
        warmstart.demonstrations(SokobanEnv(), tasks, tokenizer, collect.replace(max_prompt_tokens=cap,
                                                                                 truncation="error"))
