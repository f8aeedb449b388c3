"""``agentjax train`` / ``agentjax eval``: presets with overrides, and clear one-line errors (exit status 2) for bad
flags and impossible configs before any work starts (each case returns in well under a second: nothing is built)."""

from __future__ import annotations

import json
import re
import time

import pytest

from agentjax.cli import build_run, main

BASE = ["train", "--method", "crbc", "--env", "sokoban", "--preset", "tiny"]


def run_cli(capsys, *argv):
    start = time.perf_counter()
    try:
        code = main(list(argv))
    except SystemExit as e:  # argparse / tyro exit themselves
        code = e.code
    out = capsys.readouterr()
    assert time.perf_counter() - start < 30, "the CLI did work before failing"
    return code, out.out, out.err


def test_dry_run_prints_the_preset_with_overrides(capsys):
    code, out, _ = run_cli(capsys, *BASE, "--dry-run", "--train.optimizer.learning-rate", "1e-5",
                           "--train.credit.w-step", "10", "--updates", "3", "--num-groups", "2", "--group-size", "16")
    assert code == 0
    config = json.loads(out)
    assert config["train"]["optimizer"]["learning_rate"] == 1e-5 and config["updates"] == 3
    assert config["train"]["credit"] == {"method": "crbc", "beta": 0.98, "depth": None, "w_traj": 1.0, "w_step": 10.0,
                                         "sigma_min": 0.1, "score": "return"}
    assert config["train"]["rollout"]["num_groups"] == 2 and config["collect"]["group_size"] == 16
    assert config["train"]["rollout"]["capacity"] == 2 * 16 * 15 == config["collect"]["capacity"]


def test_paper_presets_build_for_every_method_and_env(tmp_path):
    (tmp_path / "config.json").write_text("{}")  # only its presence is checked before work
    for method in ("grpo", "rloo", "ppo", "gigpo", "hgpo", "graphgpo", "crbc"):
        for env in ("sokoban", "alfworld", "webshop"):
            for name, mesh in (("paper-1.5b", (8, 1)), ("paper-7b", (4, 2))):
                run, args = build_run(["--method", method, "--env", env, "--preset", name,
                                       "--train.model.checkpoint", str(tmp_path)])
                assert run.train.credit.method == method and run.mesh == mesh and not args.resume


@pytest.mark.parametrize("argv, message", [
    (["train", "--method", "sft", "--env", "sokoban", "--preset", "tiny"], "argument --method: invalid choice: 'sft'"),
    (["train", "--method", "crbc", "--env", "minecraft", "--preset", "tiny"], "argument --env: invalid choice"),
    (["train", "--method", "crbc", "--env", "sokoban", "--preset", "huge"], "argument --preset: invalid choice"),
    (["train", "--method", "crbc", "--env", "sokoban"], "the following arguments are required: --preset"),
    (["fit"], "unknown command 'fit'"),
    ([*BASE, "--train.micro-batch-size", "7"], "does not split into micro-batches of 7"),
    ([*BASE, "--train.micro-batch-size", "4", "--train.rollout.capacity", "16", "--collect.capacity", "16"],
     "16 row slots .* 32 rollouts"),
    ([*BASE, "--train.rollout.group-size", "16"], "train.rollout.group_size=16 but collect.group_size=8"),
    ([*BASE, "--collect.max-steps", "5"], "train.rollout.max_steps=15 but collect.max_steps=5"),
    ([*BASE, "--mesh", "3", "3"], "micro_batch_size=40 must be a multiple of the mesh's fsdp size 3"),
    ([*BASE, "--mesh", "2", "2"], r"mesh=\(2, 2\) needs 4 devices"),
    ([*BASE, "--eval-seeds", "0"], "eval_seeds must be >= 1"),
    ([*BASE, "--train.credit.beta", "1.5"], r"CRBCCredit.beta must be in \(0, 1\]"),
    ([*BASE, "--train.model.checkpoint", "/nonexistent"], "has no config.json"),
    ([*BASE, "--train.model.arch.vocab-size", "512"], "smaller than the Qwen tokenizer"),
    ([*BASE, "--env-kwargs", "room_size", "7"], "env_kwargs=.* do not fit SokobanEnv"),
    ([*BASE, "--workers", "1000"], "workers=1000 is more than the 48 env slots"),
    (["train", "--method", "crbc", "--env", "sokoban", "--preset", "paper-1.5b"], "--train.model.checkpoint DIR"),
    (["eval", "--checkpoint", "/nonexistent"], "not a training run folder"),
])
def test_bad_flags_and_impossible_configs_are_clear_errors(capsys, argv, message):
    code, out, err = run_cli(capsys, *argv)
    assert code == 2
    flat = " ".join(err.replace("│", " ").split())  # tyro wraps its messages in a box
    assert re.search(message, flat), err


def test_an_unknown_override_is_named(capsys):
    code, _, err = run_cli(capsys, *BASE, "--train.credit.lam", "0.9")  # a PPO parameter, not CRBC's
    assert code == 2 and "--train.credit.lam" in err


def test_help(capsys):
    code, out, _ = run_cli(capsys)
    assert code == 2 and "agentjax train --method" in out
    code, out, _ = run_cli(capsys, "train", "--help")
    assert code == 0 and "--preset" in out
