"""``agentjax train`` / ``agentjax eval``: presets with flags, and clear errors (exit status 2) for bad flags and
impossible configs before any work starts (each case returns in well under a second: nothing is built); a --help a
person can read (at most 60 grouped flags, each with its help; internals are not flags; each thing one spelling);
every env's tiny and paper presets; SERO's ``--sero`` / ``--sero.*`` flags (parsed and validated only, and the
dry run's ``sero`` block); the golden runs' saved configs against the command line's; one real update on each env
that no other training test runs (TextCraft-Synth, TextWorld, TextWorld-Sync), configured by the command line.

The one-update runs share one shrunk model and one set of shapes (1 layer of width 32, 1,024 prompt and 64 reply
tokens, 32 allowed tokens a position), so the update and the sampler compile once for the three: 76-88 s for the
first, 5-9 s each for the others on the shared 2-core machine under a load average of 7-12 (marked ``slow``). They need
``$AGENTJAX_DATA`` (TextCraft-Synth, TextWorld-Sync) and TextWorld's game of the first training batch, generated into
``$TEXTWORLD_GAMES`` (default ``~/.cache/agentjax/textworld``) when missing.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import time
from pathlib import Path

import pytest

from agentjax.cli import _USAGE, build_run, main
from agentjax.train.config import CREDIT_METHODS, SeroConfig
from agentjax.train.presets import TREE_METHODS
from agentjax.train.runconfig import ENVS, RunConfig, run_from_dict

BASE = ["train", "--method", "crbc", "--env", "sokoban", "--preset", "tiny"]
ALL_ENVS = ("sokoban", "alfworld", "webshop", "textcraft", "textcraft_synth", "textworld", "textworld_sync", "mdp")
NEW_ENVS = ("textcraft_synth", "textworld", "textworld_sync")


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
    code, out, _ = run_cli(capsys, *BASE, "--dry-run", "--learning-rate", "1e-5", "--credit.w-step", "10",
                           "--updates", "3", "--num-groups", "2", "--group-size", "16")
    assert code == 0
    config = json.loads(out)
    assert config["train"]["optimizer"]["learning_rate"] == 1e-5 and config["updates"] == 3
    assert config["train"]["credit"] == {"method": "crbc", "beta": 0.98, "depth": None, "w_traj": 1.0, "w_step": 10.0,
                                         "sigma_min": 0.1, "score": "return"}
    assert config["train"]["rollout"]["num_groups"] == 2 and config["collect"]["group_size"] == 16
    assert config["train"]["rollout"]["capacity"] == 2 * 16 * 15 == config["collect"]["capacity"]


def test_paper_presets_build_for_every_method_and_env(tmp_path):
    (tmp_path / "config.json").write_text("{}")  # only its presence is checked before work
    methods = ("grpo", "rloo", "ppo", "gigpo", "hgpo", "graphgpo", "crbc")
    for env in ALL_ENVS:  # every method on three envs, the env-dependent credit branches on the others
        for method in methods if env in ("sokoban", "alfworld", "webshop") else ("grpo", "gigpo", "crbc"):
            for name, mesh in (("paper-1.5b", (8, 1)), ("paper-7b", (2, 4))):
                run, args = build_run(["--method", method, "--env", env, "--preset", name, "--model", str(tmp_path)])
                assert run.train.credit.method == method and run.mesh == mesh and not args.resume


def test_every_env_is_on_the_command_line():
    assert set(ENVS) == set(ALL_ENVS)
    assert all(env in _USAGE for env in ALL_ENVS)


@pytest.mark.parametrize("env", ALL_ENVS)
def test_tiny_dry_run_for_every_env(capsys, env):
    code, out, err = run_cli(capsys, "train", "--method", "grpo", "--env", env, "--preset", "tiny", "--dry-run")
    assert code == 0, err
    config = json.loads(out)
    ro, co = config["train"]["rollout"], config["collect"]
    assert config["env"] == env and co["constrained"] and co["masked_logp"] and co["prompt"] == "compact"
    assert (ro["max_steps"], ro["prompt_len"], ro["response_len"], ro["capacity"]) == (
        co["max_steps"], co["max_prompt_tokens"], co["sampling"]["max_new_tokens"], co["capacity"])
    assert ro["capacity"] == ro["num_groups"] * 8 * ro["max_steps"]
    if env == "mdp":  # a word-level tokenizer and a small policy from random init, its own sizes
        assert config["warm_start"] is None and config["tokenizer"] == "words:mdp" and co["sample_seeds"]
        assert config["train"]["model"]["arch"]["vocab_size"] == 256 and co["sampling"]["stop_token_ids"] == [2, 0]
        assert config["env_kwargs"] == {"setting": "s2"} and ro["num_groups"] == 4 == config["train_pool"]
        assert ro["max_steps"] == 14 and config["eval_split"] == "train"  # the pool is evaluated (presets.py)
        assert ro["capacity"] % (config["train"]["mini_batches"] * config["train"]["micro_batch_size"]) == 0
        return
    assert config["warm_start"] is not None and config["tokenizer"] is None  # every other env has an oracle
    assert ro["capacity"] % (4 * 40) == 0 and not co["sample_seeds"]  # whole mini-batches
    assert ro["num_groups"] == (16 if env == "sokoban" else 4)
    if env.startswith("textcraft"):  # the constrained decoder needs the admissible commands
        assert config["env_kwargs"] == {"admissible": True}


@pytest.mark.parametrize("env", [e for e in ALL_ENVS if e != "alfworld"])  # ALFWorld's splits need $ALFWORLD_DATA
def test_the_presets_fit_the_splits(env):
    from agentjax.train.presets import paper, tiny

    spec = ENVS[env]
    train, evaluation = len(spec.tasks(spec.train_split)), len(spec.tasks(spec.eval_split))
    for run in (tiny("grpo", env), paper("grpo", env)):
        assert run.train.rollout.num_groups <= train and run.eval_tasks <= evaluation


def test_size_shortcuts_keep_whole_micro_batches_and_no_warm_start(capsys):
    code, out, err = run_cli(capsys, "train", "--method", "grpo", "--env", "textworld", "--preset", "tiny",
                             "--num-groups", "1", "--group-size", "2", "--max-steps", "2", "--no-warm-start",
                             "--dry-run")
    assert code == 0, err
    config = json.loads(out)
    assert config["train"]["rollout"]["capacity"] == 4 == config["collect"]["capacity"]
    assert (config["train"]["micro_batch_size"], config["train"]["mini_batches"]) == (4, 1)
    assert config["warm_start"] is None


def test_a_missing_data_folder_names_what_the_env_needs(tmp_path, monkeypatch):
    monkeypatch.setenv("AGENTJAX_DATA", str(tmp_path))
    with pytest.raises(FileNotFoundError, match=r"textcraft_synth needs \$AGENTJAX_DATA/textcraft"):
        ENVS["textcraft_synth"].tasks("train_medium")


# One shrunk model and one set of shapes for every env (module docstring): the update compiles once. The sizes are
# flags; the model's architecture and the sampler's buckets are the preset's (not flags), set here in code.
SMOKE = ["--num-groups", "1", "--group-size", "2", "--max-steps", "2", "--no-warm-start", "--eval-every", "0",
         "--updates", "1", "--no-progress", "--no-tensorboard", "--prompt-len", "1024", "--response-len", "64"]


def shrunk(run: RunConfig) -> RunConfig:
    """``run`` with the smoke runs' model (1 layer of width 32) and sampler shapes (one prompt bucket, 32 allowed
    tokens a position)."""
    arch = dataclasses.replace(run.train.model.arch, d_model=32, mlp_dim=64, num_layers=1, head_dim=8)
    collect = run.collect.replace(max_allowed=32, sampling=dataclasses.replace(run.collect.sampling,
                                                                                prompt_bucket=1024))
    return run.replace(train=run.train.replace(model=dataclasses.replace(run.train.model, arch=arch)),
                       collect=collect)


@pytest.mark.slow  # the first of the three compiles the update and the sampler (module docstring)
@pytest.mark.parametrize("env", NEW_ENVS)
def test_one_update_on_the_new_envs(tmp_path, env):
    from agentjax.train import train

    run, _ = build_run(["--method", "grpo", "--env", env, "--preset", "tiny", "--out-dir", str(tmp_path), *SMOKE])
    summary = train(shrunk(run))
    last = summary["last"]
    assert summary["step"] == 1 and last["rollout/num_episodes"] == 2 and last["train/skipped"] == 0
    assert last["train/rows"] == 4 and math.isfinite(last["train/loss"])


@pytest.mark.parametrize("argv, message", [
    (["train", "--method", "sft", "--env", "sokoban", "--preset", "tiny"], "argument --method: invalid choice: 'sft'"),
    (["train", "--method", "crbc", "--env", "minecraft", "--preset", "tiny"], "argument --env: invalid choice"),
    (["train", "--method", "crbc", "--env", "sokoban", "--preset", "huge"], "argument --preset: invalid choice"),
    (["train", "--method", "crbc", "--env", "sokoban"], "the following arguments are required: --preset"),
    (["fit"], "unknown command 'fit'"),
    ([*BASE, "--micro-batch-size", "7"], "does not split into micro-batches of 7"),
    ([*BASE, "--mesh", "3", "3"], "--micro-batch-size=40 must be a multiple of the mesh's fsdp size 3"),
    ([*BASE, "--mesh", "2", "2"], r"--mesh=\(2, 2\) needs 4 devices"),
    ([*BASE, "--eval-seeds", "0"], "--eval-seeds must be >= 1"),
    ([*BASE, "--credit.beta", "1.5"], r"--credit.beta must be in \(0, 1\]"),
    ([*BASE, "--learning-rate", "0"], "--learning-rate must be > 0"),
    ([*BASE, "--temperature", "0"], "--temperature must be > 0"),
    ([*BASE, "--model", "/nonexistent"], "has no config.json"),
    ([*BASE, "--max-nonfinite-updates", "-1"], "--max-nonfinite-updates must be >= 0"),
    ([*BASE, "--env-kwargs", "room_size", "7"], "env_kwargs=.* do not fit SokobanEnv"),
    ([*BASE, "--workers", "1000"], "--workers=1000 is more than the 128 env slots"),
    (["train", "--method", "crbc", "--env", "sokoban", "--preset", "paper-1.5b"], "pass --model DIR"),
    (["eval", "--checkpoint", "/nonexistent"], "not a training run folder"),
])
def test_bad_flags_and_impossible_configs_are_clear_errors(capsys, argv, message):
    code, out, err = run_cli(capsys, *argv)
    assert code == 2
    flat = " ".join(err.replace("│", " ").split())  # tyro wraps its messages in a box
    assert re.search(message, flat), err


def test_an_unknown_flag_is_named(capsys):
    code, _, err = run_cli(capsys, *BASE, "--credit.lam", "0.9")  # a PPO parameter, not CRBC's
    assert code == 2 and "--credit.lam" in err


# Spellings the command line no longer has: sampler / compiler internals (the preset's and the backend's), the
# collector's copies of the sizes, the batch capacity, the model's architecture, and the second SERO spelling.
INTERNALS = [("--collect.dense-draws",), ("--collect.sparse-logits",), ("--collect.row-bucket", "64"),
             ("--collect.max-trie-edges", "1024"), ("--train.model.arch.attention-unroll", "4"),
             ("--collect.group-size", "8"), ("--train.rollout.num-groups", "2"), ("--capacity", "16"),
             ("--tokenizer", "words:mdp"), ("--train.sero.coef", "0.3"), ("--train.optimizer.learning-rate", "1e-5"),
             ("--train.credit.beta", "0.9")]


@pytest.mark.parametrize("flag", INTERNALS, ids=lambda f: f[0])
def test_internals_and_old_spellings_are_not_flags(capsys, flag):
    code, out, err = run_cli(capsys, *BASE, "--sero", *flag, "--dry-run")
    assert code == 2 and not out and flag[0] in err


def help_flags(text: str) -> dict[str, str]:
    """The flags a --help text lists (argparse's and tyro's entries), each with its help (defaults left out)."""
    rows = [line.replace("│", " ").rstrip() for line in text.splitlines()]
    entries: dict[str, str] = {}
    flag = None
    for line in rows:
        match = re.match(r"^\s{1,3}(--[a-z][\w.-]*)(.*)$", line)
        if match:
            flag = match.group(1)
            entries[flag] = match.group(2)
        elif flag and line.startswith(" " * 10) and line.strip():
            entries[flag] += " " + line.strip()
        elif not line.strip() or "─" in line or "╭" in line or "╰" in line:
            flag = None
    helps = {}
    for name, rest in entries.items():  # drop the metavar and the "(default: ...)" / "(preset: ...)" hint
        words = re.sub(r"\((default|preset): [^)]*\)", "", rest).split()
        helps[name] = " ".join(w for w in words if not re.fullmatch(r"[A-Z{\[][\w{},|.\[\]-]*|--[\w.-]+,?", w))
    return helps


PAPER = [(m, e, "paper-4b" if m in TREE_METHODS else p) for m in sorted(CREDIT_METHODS)
         for e in (("textcraft_synth", "textworld_sync") if m in TREE_METHODS else ("alfworld", "webshop"))
         for p in (("paper-4b",) if m in TREE_METHODS else ("paper-1.5b", "paper-7b"))]


@pytest.mark.parametrize("method, env, preset", [*dict.fromkeys(PAPER), ("sera", "textworld_sync", "tiny"),
                                                 ("crbc", "sokoban", "tiny"), ("graphgpo", "mdp", "tiny")])
def test_help_lists_at_most_60_grouped_flags_each_with_its_help(capsys, method, env, preset):
    code, out, _ = run_cli(capsys, "train", "--method", method, "--env", env, "--preset", preset, "--help")
    assert code == 0
    flags = help_flags(out)
    assert len(flags) <= 60, (len(flags), sorted(flags))
    assert all(len(text.split()) >= 2 for text in flags.values()), {k: v for k, v in flags.items() if
                                                                     len(v.split()) < 2}
    groups = re.findall(r"^[\s│╭─]*(\w+) options\b", out, re.M)
    assert groups[:3] == ["run", "model", "sizes"] and "credit" in groups and "output" in groups
    assert ("tree" in groups) == (method in TREE_METHODS) and "sero" not in groups
    for flag in ("--num-groups", "--group-size", "--max-steps", "--learning-rate", "--updates", "--eval-every",
                 "--out-dir", "--dry-run", "--resume", "--seed", "--model", "--sero"):
        assert flag in flags
    assert not any(f.startswith(("--train.", "--collect.")) for f in flags)


def test_sero_flags_are_listed_with_sero(capsys):
    code, out, _ = run_cli(capsys, "train", "--method", "crbc", "--env", "alfworld", "--preset", "paper-1.5b",
                           "--sero", "--help")
    flags = help_flags(out)
    assert code == 0 and {f"--sero.{f.name.replace('_', '-')}" for f in dataclasses.fields(SeroConfig)} <= set(flags)
    assert all(len(text.split()) >= 2 for text in flags.values())


def test_each_size_is_set_once(capsys):
    code, out, err = run_cli(capsys, *BASE, "--num-groups", "2", "--max-steps", "3", "--prompt-len", "96",
                             "--response-len", "12", "--dry-run")
    assert code == 0, err
    config = json.loads(out)
    ro, co = config["train"]["rollout"], config["collect"]
    assert (ro["num_groups"], ro["max_steps"], ro["prompt_len"], ro["response_len"]) == (2, 3, 96, 12)
    assert (co["max_steps"], co["max_prompt_tokens"], co["sampling"]["max_new_tokens"]) == (3, 96, 12)
    assert ro["capacity"] == co["capacity"] == 2 * 8 * 3  # every turn fits


def test_env_kwargs_merge_onto_the_presets(capsys):
    code, out, err = run_cli(capsys, "train", "--method", "grpo", "--env", "textcraft", "--preset", "tiny",
                             "--eval-env-kwargs", "admissible", "False", "--dry-run")
    assert code == 0, err
    config = json.loads(out)
    assert config["env_kwargs"] == {"admissible": True} and config["eval_env_kwargs"] == {"admissible": False}


@pytest.mark.parametrize("path", sorted((Path(__file__).parent / "golden").glob("*.json")), ids=lambda p: p.stem)
def test_a_saved_run_config_loads_and_the_command_line_gives_it_again(path):
    """A golden run's run_config.json (written by older code) loads, and its argv builds the same config; the only
    differences are fields added since, at their defaults."""
    golden = json.loads(path.read_text())
    saved = golden["run_config"]
    assert run_from_dict(saved).out_dir == saved["out_dir"]
    run, _ = build_run([*golden["argv"], "--out-dir", saved["out_dir"]])

    def flat(d, prefix=""):
        return {k2: v2 for k, v in d.items() for k2, v2 in (flat(v, f"{prefix}{k}.") if isinstance(v, dict) else
                                                            {f"{prefix}{k}": v}).items()}

    now, then = flat(run.to_dict()), flat(saved)
    assert {k: now[k] for k in then} == then
    defaults = flat(RunConfig().to_dict())
    assert all(now[k] == defaults[k] for k in set(now) - set(then))


SERO = ["--method", "graphgpo", "--env", "sokoban", "--preset", "tiny"]


def test_sero_is_off_by_default_and_on_with_its_defaults():
    run, _ = build_run(SERO)
    assert run.train.sero is None and not run.train_collect.snapshots and len(run.branch_slots) == 0
    run, _ = build_run([*SERO, "--sero"])
    assert run.train.sero == SeroConfig() and run.train.sero.coef == 0.1
    assert run.train_collect.snapshots and len(run.branch_slots) == run.train.rollout.num_groups  # the roots' slots
    assert run.train.credit.method == "graphgpo"  # on top of the base method


def test_sero_fields_are_flags_and_imply_sero(tmp_path):
    bank = tmp_path / "bank.npz"
    bank.write_bytes(b"")  # only its presence is checked before work
    run, _ = build_run([*SERO, "--sero.scheme", "root_only", "--sero.coef", "0.5", "--sero.k", "3", "--sero.roots",
                        "prioritised", "--sero.bank", str(bank), "--sero.max-oracle-steps", "4",
                        "--sero.bank_branches", "2", "--sero.soft-gate", "--sero.gate-on=reward",
                        "--sero.oracle-timeout", "30", "--workers", "2"])
    assert run.train.sero == SeroConfig(coef=0.5, scheme="root_only", k=3, roots="prioritised", bank=str(bank),
                                        max_oracle_steps=4, bank_branches=2, soft_gate=True, gate_on="reward",
                                        oracle_timeout=30.0)
    run, _ = build_run([*SERO, "--sero.coef", "0.3", "--sero.micro-batch-size", "8"])
    assert (run.train.sero.coef, run.train.oracle_micro_batch_size) == (0.3, 8)
    assert run.train.oracle_rows == 16 * 15  # every step of every group's budget, whole micro-batches of 8


def test_dry_run_prints_the_sero_block(capsys):
    code, out, err = run_cli(capsys, "train", *SERO, "--sero", "--sero.scheme", "short_bridge", "--sero.k", "3",
                             "--dry-run")
    assert code == 0, err
    config = json.loads(out)
    assert config["train"]["sero"] == dataclasses.asdict(SeroConfig(scheme="short_bridge", k=3))
    assert config["train"]["credit"]["method"] == "graphgpo"
    code, out, err = run_cli(capsys, "train", *SERO, "--dry-run")
    assert code == 0 and json.loads(out)["train"]["sero"] is None


@pytest.mark.parametrize("argv, message", [
    (["--sero", "--sero.coef", "-0.5"], r"--sero.coef must be > 0, got -0.5"),
    (["--sero.coef", "0"], r"--sero.coef must be > 0, got 0.0"),
    (["--sero.gamma", "2"], r"--sero.gamma must be in \(0, 1\], got 2.0"),
    (["--sero.bank", "/nonexistent/bank.npz"], r"--sero.bank '/nonexistent/bank.npz' is not a file"),
    (["--sero.capacity", "7"], r"the oracle batch of 7 rows \(sero.capacity\) does not split into micro-batches of 40"),
    (["--sero.oracle-timeout", "5"], r"--sero.oracle-timeout=5.0 .* set --workers >= 1"),
    (["--sero.oracle-timeout", "0", "--workers", "2"], r"--sero.oracle-timeout must be > 0, got 0.0"),
])
def test_bad_sero_values_are_one_line_errors(capsys, argv, message):
    code, out, err = run_cli(capsys, "train", *SERO, *argv, "--dry-run")
    assert code == 2 and not out and err.count("\n") == 1 and err.startswith("agentjax train: error: "), err
    assert re.search(message, err), err


@pytest.mark.parametrize("argv, message", [
    (["--sero.scheme", "root-only"], r"invalid choice.*root-only.*sero.*root_only"),
    (["--sero.k", "1.5"], r"--sero.k.*1.5"),
    (["--sero.roots", "greedy"], r"invalid choice.*greedy"),
    (["--sero.lambda", "0.1"], r"--sero.lambda"),
])
def test_bad_sero_flags_are_named(capsys, argv, message):
    code, out, err = run_cli(capsys, "train", *SERO, *argv, "--dry-run")
    assert code == 2 and not out
    assert re.search(message, " ".join(err.replace("│", " ").split())), err


def test_help(capsys):
    code, out, _ = run_cli(capsys)
    assert code == 2 and "agentjax train --method" in out
    code, out, _ = run_cli(capsys, "train", "--help")
    assert code == 0 and "--preset" in out and "--sero " in out and "--help lists every flag" in out
    assert "--sero" in _USAGE
    code, out, _ = run_cli(capsys, *BASE, "--sero", "--help")  # this parser's flags, then the run's
    assert code == 0 and "--sero.k INT" in out and "--sero.scheme {sero,root_only," in out
    assert "--train.sero" not in out


# -- RAO: recursive trees -------------------------------------------------------------------------------------------
RAO = ["train", "--method", "rao", "--env", "textcraft_synth", "--preset", "tiny"]


@pytest.mark.parametrize("env", ["textcraft_synth", "textworld_sync"])
def test_rao_dry_run_with_tree_and_schedule_overrides(capsys, env):
    code, out, err = run_cli(capsys, "train", "--method", "rao", "--env", env, "--preset", "tiny", "--dry-run",
                             "--num-groups", "1", "--group-size", "2", "--max-steps", "4", "--tree.max-depth", "1",
                             "--credit.stages", "12", "4", "0")
    assert code == 0, err
    config = json.loads(out)
    credit, ro, tree = config["train"]["credit"], config["train"]["rollout"], config["tree"]
    assert credit["method"] == "rao" and credit["stages"] == [12, 4, 0] and credit["clip_high"] == 5.0
    assert credit["filter_zero_variance"] == (env == "textcraft_synth")  # the released configs
    assert (ro["num_groups"], ro["group_size"], ro["max_steps"], tree["max_depth"]) == (1, 2, 4, 1)
    assert ro["capacity"] == 1 * 2 * tree["max_nodes"] * 4 == config["collect"]["capacity"]  # every turn fits
    assert config["train"]["loss"]["kl_coef"] == 0 and config["workers"] == 0
    if env == "textworld_sync":  # trains with a shared budget of 100 steps, evaluates with the task's own
        assert config["env_kwargs"]["budget"] == 100 and config["eval_env_kwargs"]["budget"] is None


def test_rao_paper_preset(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    for env, steps in (("textcraft_synth", 250), ("textworld_sync", 400)):
        run, _ = build_run(["--method", "rao", "--env", env, "--preset", "paper-4b", "--model", str(tmp_path)])
        ro = run.train.rollout
        assert run.train.model.arch.name == "qwen3-4b" and run.mesh == (1, 8) and run.updates == steps
        assert (ro.num_groups, ro.group_size, ro.max_steps, run.tree.max_depth) == (8, 8, 20, 3)
        assert run.train.optimizer.learning_rate == 3e-6 and (run.train.optimizer.b1, run.train.optimizer.b2) == (
            0.9, 0.95) and run.train.optimizer.weight_decay == 0.017 and run.train.optimizer.max_grad_norm == 1.0


@pytest.mark.parametrize("argv, message", [
    (["train", "--method", "rao", "--env", "textcraft_synth", "--preset", "paper-1.5b"], "paper preset is paper-4b"),
    (["train", "--method", "grpo", "--env", "textcraft_synth", "--preset", "paper-4b"], "tree methods' preset"),
    (["train", "--method", "rao", "--env", "sokoban", "--preset", "tiny"], "trains recursive agents on"),
    ([*RAO, "--credit.stages", "16", "2", "2"], "rubric stage needs SERA"),
    ([*RAO, "--kl-coef", "0.01"], "--kl-coef"),  # CISPO without KL or entropy, one step a batch, no env workers:
    ([*RAO, "--mini-batches", "2"], "--mini-batches"),  # not flags of a tree run
    ([*RAO, "--workers", "2"], "--workers"),
    ([*RAO, "--eval-search", "2"], "--eval-search"),  # SERA's
    ([*RAO, "--tree.max-nodes", "0"], "--tree.max-nodes must be >= 1"),
    ([*RAO, "--eval-env-kwargs", "nope", "1"], "eval_env_kwargs=.* do not fit textcraft_synth.s tree world"),
    ([*RAO, "--sero"], "SERO's oracle branch is for the flat methods"),
])
def test_bad_rao_configs_are_clear_errors(capsys, argv, message):
    code, out, err = run_cli(capsys, *argv, "--dry-run")
    assert code == 2
    assert re.search(message, " ".join(err.replace("│", " ").split())), err


@pytest.mark.slow  # compiles the sampler and the tree update (tests/train/test_trainer_trees.py trains)
def test_one_rao_update_configured_by_the_command_line(capsys, tmp_path):
    from agentjax.train import train

    run, _ = build_run([*RAO[1:], "--out-dir", str(tmp_path), *SMOKE, "--max-steps", "4", "--tree.max-depth", "1",
                        "--tree.max-nodes", "4", "--credit.no-filter-zero-variance"])
    summary = train(shrunk(run))
    assert summary["optimizer_steps"] == 1 and summary["last"]["schedule/step"] == 1
    assert math.isfinite(summary["last"]["train/loss"]) and summary["last"]["tree/rows"] >= 2
    capsys.readouterr()
    assert main(["trees", "--run", str(tmp_path)]) == 0 and "tree 0 of task" in capsys.readouterr().out


def test_a_run_folder_another_process_trains_is_refused(capsys, tmp_path):
    from agentjax.train.checkpoint import run_folder_lock

    with run_folder_lock(str(tmp_path)):
        code, _, err = run_cli(capsys, *BASE, "--out-dir", str(tmp_path))
    assert code == 2 and f"{tmp_path} is being trained by pid {os.getpid()}" in err


def test_missing_data_and_too_few_tasks_are_one_line_errors_before_the_run_folder(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("AGENTJAX_DATA", str(tmp_path / "nowhere"))
    out_dir = tmp_path / "run"
    code, out, err = run_cli(capsys, "train", "--method", "grpo", "--env", "textcraft", "--preset", "tiny",
                             "--out-dir", str(out_dir))
    assert code == 2 and not out and err.count("\n") == 1 and "AGENTJAX_DATA" in err, err
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path / "nowhere"))  # its split is a committed manifest: a reset reads
    code, out, err = run_cli(capsys, "train", "--method", "grpo", "--env", "alfworld", "--preset", "tiny",
                             "--out-dir", str(out_dir))
    assert code == 2 and not out and err.count("\n") == 1 and "ALFWORLD_DATA" in err, err
    code, out, err = run_cli(capsys, *BASE, "--eval-tasks", "100000", "--out-dir", str(out_dir))
    assert code == 2 and err.count("\n") == 1 and "eval_tasks=100000 but sokoban valid has 500 tasks" in err, err
    assert not out_dir.exists()  # nothing was made


@pytest.mark.parametrize("stop, code", [("CheckpointError", 2), ("ResumeMismatch", 2), ("NonFiniteUpdateError", 1)])
def test_a_run_without_a_checkpoint_that_restores_or_stopped_for_nan_is_an_error_line(capsys, tmp_path, monkeypatch,
                                                                                     stop, code):
    """Every checkpoint of the folder fails to restore or the resumed config differs from the checkpoint's (before
    any update), or the run stopped after too many non-finite steps: the error's message and no traceback."""
    from agentjax import cli
    from agentjax.train import checkpoint, trainer, update

    error = {"CheckpointError": checkpoint.CheckpointError, "ResumeMismatch": trainer.ResumeMismatch,
             "NonFiniteUpdateError": update.NonFiniteUpdateError}[stop]

    def train(run, resume=False):
        raise error(f"{stop} in {run.out_dir}")

    monkeypatch.setattr(cli, "train", train)  # the name the command calls
    got, out, err = run_cli(capsys, *BASE, "--out-dir", str(tmp_path))
    assert got == code and not out and err == f"agentjax train: error: {stop} in {tmp_path}\n"
