"""The ``agentjax`` command: ``train``, ``eval`` and ``data``.

::

    agentjax train --method {grpo,rloo,ppo,gigpo,hgpo,graphgpo,crbc} \\
                   --env {sokoban,alfworld,webshop,textcraft,textcraft_synth,textworld,textworld_sync,mdp} \\
                   --preset {tiny,paper-1.5b,paper-7b} [--sero] [--resume] [--dry-run] [flags]
    agentjax train --method {rao,sera} --env {textcraft_synth,textworld_sync} --preset {tiny,paper-4b} [...]
    agentjax eval --checkpoint RUN_DIR [--step N] [--tasks N] [--seeds N] [--temperature T]
                  [--search N] [--grader {policy,initial}]
    agentjax trees --run RUN_DIR [--update N] [--eval] [--tree I] [--max-chars N] [--list]
    agentjax data [--mirror URL] [--only DATASET ...] [--dest DIR] [--verify]

``train`` builds the preset (:mod:`agentjax.train.presets`) and applies the flags with ``tyro``. The flags are what
a user chooses, each set in one place and grouped (:data:`TRAIN_FLAGS`): run (``--seed``, ``--env-kwargs``,
``--workers``, ``--mesh``, ``--resume``, ``--dry-run``, ``--no-warm-start``), model (``--model DIR``), sizes
(``--num-groups``, ``--group-size``, ``--max-steps``, ``--prompt-len``, ``--response-len``, ``--micro-batch-size``,
...), optimizer (``--learning-rate``, ...), loss, episodes (``--temperature``, ``--history-length``, rewards),
schedule (``--updates``, ``--checkpoint-every``), evaluation (``--eval-*``), output (``--out-dir``,
``--no-progress``, ``--no-tensorboard``) and the method's own: ``--credit.*`` (the credit method's parameters, e.g.
``--credit.w-step 10``), ``--tree.*`` (tree methods), ``--sero.*`` (with SERO); ``agentjax train --method crbc --env
sokoban --preset tiny --help`` lists them with the preset's values. Sampler and compiler internals (buckets, trie
and allowed-token capacities, sparse decoding, attention blocks, the model's architecture and tokenizer) are the
preset's and the backend's: they are fields of the config that a preset sets, not flags. The batch holds every turn:
a size flag sets the rows (``train.rollout.capacity``), and the micro-batch size and mini-batch count become
divisors of the new batch (the preset's where they divide it) unless given. ``--env-kwargs KEY VALUE ...`` (and
``--eval-env-kwargs``) are merged onto the preset's. Everything is validated before any work: an unknown method /
env / preset or flag, a value out of range, a micro-batch that does not divide the batch, a mesh that does not match
the devices, a missing checkpoint folder are errors (exit status 2) that name the flag (tyro's box for an unknown
flag or a value that does not parse, one line for the rest). ``--dry-run`` stops after validation and prints the
config as JSON.

``--env mdp`` trains on the credit-testbed MDPs (envs/mdp): the setting is ``--env-kwargs setting s1|s2|s3`` (the
tiny preset: s2, a pool of 4 MDPs; the episode cap follows the setting's step cap, s1 34, s2 14, s3 20, unless
``--max-steps`` is given: :func:`~agentjax.train.presets.env_step_cap`), its tiny preset
a word-level tokenizer (``tokenizer="words:mdp"``) and a small policy from random init, and every evaluation also
logs the exact success (``exact/``) and the batch's credit accuracy (``credit/pearson``, ``credit/sign_agreement``:
:mod:`agentjax.train.exact`).

``--sero`` adds SERO's auxiliary oracle branch (``TrainConfig.sero = SeroConfig()``: λ_O = 0.1, reachability
weights, uniform roots, the strict-success gate; METHODS.md "SERO") on top of the chosen method. Every
:class:`~agentjax.train.config.SeroConfig` field is a flag ``--sero.FIELD``, e.g. ``--sero.scheme root_only
--sero.coef 0.5 --sero.k 3 --sero.roots prioritised --sero.bank bank.npz --sero.max-oracle-steps 8``; the switches
``--sero.match-mass`` and ``--sero.soft-gate`` take no value. Giving any ``--sero.*`` flag implies ``--sero``. A
scheme / roots / gate not among the choices, a value out of range (e.g. a coefficient <= 0), an oracle batch that
does not split into oracle micro-batches or a bank file that is not there is an error (exit status 2) before any
work.

``--method rao`` trains recursive agents (RAO, METHODS.md "SERA" 8: the tree algorithm of the trainer) on
TextCraft-Synth or TextWorld-Sync with the ``tiny`` (CPU) or ``paper-4b`` (Qwen3-4B-Instruct-2507) preset; the tree
settings are ``--tree.*`` flags (e.g. ``--tree.max-depth 2``), the method's ``--credit.*`` (e.g.
``--credit.stages 12 4 0`` for RAO + D), and the sizes the same flags as the flat methods (``--num-groups``
root tasks, ``--group-size`` trees per task, ``--max-steps`` turns per node). ``--method sera`` trains the same trees
with SERA's rubrics: at each delegation the policy writes the child's rubric and afterwards grades the child with it,
and the grade is the child's reward (:class:`~agentjax.train.config.SERACredit`; ``--credit.stages`` SERA's
16 : 2 : 2 by default, ``16 2 0`` SERA w/o RT, ``16 0 2`` w/o D, ``1 0 0`` execution with rubric rewards;
``--credit.reading weighted`` the paper's reward).

``trees`` prints trees a tree run saved (``<run>/trees/<step>.json``, ``--saved-trees`` per batch and per
evaluation) as text (:func:`agentjax.agents.tree.render_tree`): who delegated what, each node's replies and reward;
the last batch's by default, ``--update N`` that batch's, ``--eval`` the evaluation's, ``--tree I`` one of them;
``--list`` lists the saved steps.

``eval`` reads the run config from a checkpoint's metadata and evaluates the newest checkpoint that restores (or
``--step``) on the env's eval split; it prints and writes ``<run>/eval_<step>.json``.

``data`` (:mod:`envs.data`) downloads the benchmark files that are missing under ``--dest`` (default
``$AGENTJAX_DATA``, else ``../shared/data``) from the official sources, or from ``--mirror URL`` (a base URL serving
the data folder's layout), checks every sha256 and prints one line per file and a summary per dataset;
``--only alfworld webshop ...`` limits the datasets, ``--verify`` only checks what is there. A file that fails
(unreachable, wrong hash: the URL and both hashes are named) is an error line, and the exit status is then 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import os
import re
import sys
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import tyro

from agentjax.agents.tree import render_tree
from agentjax.parallel import initialize_distributed
from agentjax.train.checkpoint import CheckpointError, RunFolderBusy
from agentjax.train.config import CREDIT_METHODS, SERACredit, SeroConfig
from agentjax.train.offline import evaluate_checkpoint, find_run
from agentjax.train.presets import PRESETS, env_step_cap, preset
from agentjax.train.runconfig import ENVS, RunConfig, full_capacity
from agentjax.train.trainer import ResumeMismatch, train
from agentjax.train.trees import load_trees, saved_tree_files
from agentjax.train.update import NonFiniteUpdateError
from envs.data import DATASETS, fetch, summary

_USAGE = __doc__.split("::")[1].split("``train``")[0]


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit status 2 (argparse's convention)
        self.exit(2, f"{self.prog}: error: {message}\n")


def _fail(prog: str, error: Exception) -> int:
    print(f"{prog}: error: {error}", file=sys.stderr)
    return 2


# -- the flags of ``agentjax train`` ----------------------------------------------------------------------------------
def _always(run: RunConfig) -> bool:
    return True


def _flat(run: RunConfig) -> bool:
    return run.tree is None


def _tree(run: RunConfig) -> bool:
    return run.tree is not None


def _rubrics(run: RunConfig) -> bool:
    return isinstance(run.train.credit, SERACredit)


def _warm(run: RunConfig) -> bool:
    return run.warm_start is not None


@dataclasses.dataclass(frozen=True)
class Flag:
    """One ``agentjax train`` flag: ``--NAME`` (``--GROUP.NAME`` in a method group), the :class:`RunConfig` fields it
    sets (``paths``, dotted; none: the command's own, or set by :func:`_apply`), a one-line help and the runs
    it applies to (``when``: flat or tree runs, SERA, a preset with a warm start)."""

    name: str
    paths: tuple[str, ...]
    help: str
    when: Callable[[RunConfig], bool] = _always
    type: Any = None  # the flag's type where it is not its first path's annotation


KWARGS = dict[str, bool | int | float | None | str]  # a value is read as the first of these it parses as

# Groups of flags, in --help order: (description, flags, omit the group's prefix from the flag names).
TRAIN_FLAGS: Mapping[str, tuple[str, tuple[Flag, ...]]] = {
    "run": ("what runs where", (
        Flag("seed", ("train.seed",), "PRNG seed of the run (initial weights, task order, sampling)"),
        Flag("env_kwargs", (), "the env's keyword arguments (KEY VALUE ...; tree runs: its tree world's), merged onto "
             "the preset's", type=KWARGS),
        Flag("workers", ("workers",), "env worker processes (0: the envs step in this process)", _flat),
        Flag("mesh", ("mesh",), "(fsdp, tp) device mesh of the model (None: one device)"),
        Flag("warm_start", (), "the preset's supervised warm start on oracle demonstrations before RL "
             "(--no-warm-start: RL from the initial weights)", _warm, bool),
        Flag("resume", (), "continue the run in --out-dir from its newest checkpoint", type=bool),
        Flag("dry_run", (), "validate, print the config as JSON and stop", type=bool),
    )),
    "model": ("the policy (its architecture and tokenizer are the preset's)", (
        Flag("model", ("train.model.checkpoint",), "a Hugging Face checkpoint folder of the preset's architecture "
             "(None: random init)"),
    )),
    "sizes": ("the batch: each size set once (the collector's follow)", (
        Flag("num_groups", ("train.rollout.num_groups",), "tasks per batch (tree methods: root tasks)"),
        Flag("group_size", ("train.rollout.group_size",), "rollouts per task (tree methods: trees per task)"),
        Flag("max_steps", ("train.rollout.max_steps",), "turns per episode (tree methods: per node)"),
        Flag("prompt_len", ("train.rollout.prompt_len",), "prompt capacity in tokens"),
        Flag("response_len", ("train.rollout.response_len",), "reply capacity in tokens"),
        Flag("micro_batch_size", ("train.micro_batch_size",), "rows per micro-batch (gradient accumulation)"),
        Flag("mini_batches", ("train.mini_batches",), "optimizer steps per pass over the batch", _flat),
        Flag("epochs", ("train.epochs",), "passes over the batch per update", _flat),
    )),
    "optimizer": ("AdamW after global grad-norm clipping", (
        Flag("learning_rate", ("train.optimizer.learning_rate",), "peak learning rate"),
        Flag("warmup_steps", ("train.optimizer.warmup_steps",), "linear warm-up from 0 over this many steps"),
        Flag("lr_schedule", ("train.optimizer.schedule",), "after warm-up: constant, or cosine decay"),
        Flag("decay_steps", ("train.optimizer.decay_steps",), "cosine: steps after warm-up to reach the floor"),
        Flag("weight_decay", ("train.optimizer.weight_decay",), "AdamW's decoupled weight decay"),
        Flag("max_grad_norm", ("train.optimizer.max_grad_norm",), "global gradient-norm clip (None: off)"),
    )),
    "loss": ("the clipped policy loss", (
        Flag("clip_low", ("train.loss.clip_low",), "ε_low: the ratio floor is 1 − clip_low", _flat),
        Flag("clip_high", ("train.loss.clip_high",), "ε_high: the ratio ceiling is 1 + clip_high", _flat),
        Flag("dual_clip", ("train.loss.dual_clip",), "dual clip c > 1 for negative advantages (None: off)", _flat),
        Flag("kl_coef", ("train.loss.kl_coef",), "weight of the k3 KL penalty to the initial policy", _flat),
        Flag("entropy_coef", ("train.loss.entropy_coef",), "weight of the entropy bonus", _flat),
    )),
    "episodes": ("sampling, prompts and rewards", (
        Flag("temperature", ("collect.sampling.temperature", "train.loss.temperature"),
             "sampling temperature of training episodes (> 0; the loss uses the same)", type=float),
        Flag("history_length", ("collect.history_length",), "past (observation, action) records in the prompt", _flat),
        Flag("history_length", ("tree.history_length",), "a node's own past turns in its prompt (None: all that fit)",
             _tree),
        Flag("invalid_penalty", ("collect.invalid_penalty",), "subtracted from the reward of an invalid turn"),
        Flag("success_reward", ("collect.success_reward",), "the reward of a won episode"),
    )),
    "schedule": ("how long and how often", (
        Flag("updates", ("updates",), "updates of the run (tree methods: optimizer steps); --resume continues to it"),
        Flag("checkpoint_every", ("checkpoint_every",), "save a checkpoint after every N-th update (and the last)"),
        Flag("max_nonfinite_updates", ("train.max_nonfinite_updates",), "stop once more optimizer steps than this "
             "were skipped for a non-finite loss or gradient"),
    )),
    "evaluation": ("evaluation on the eval split", (
        Flag("eval_every", ("eval_every",), "evaluate after every N-th update and the last (0: never)"),
        Flag("eval_tasks", ("eval_tasks",), "evaluate the first N tasks of the eval split"),
        Flag("eval_seeds", ("eval_seeds",), "sampled episodes per eval task"),
        Flag("eval_temperature", ("eval_temperature",), "sampling temperature (None: training's; 0: greedy)"),
        Flag("eval_split", ("eval_split",), "the split evaluated (None: the env's eval split)"),
        Flag("eval_env_kwargs", (), "the env's keyword arguments at evaluation, merged onto training's (or the "
             "preset's evaluation ones)", type=KWARGS),
        Flag("train_pool", ("train_pool",), "train on the first N tasks of the train split only (0: all)"),
        Flag("held_out_tasks", ("held_out_tasks",), "also evaluate the first N tasks of the env's eval split", _flat),
        Flag("eval_search", ("eval_search",), "rubric-guided search: candidate subtrees per delegated child (0: off)",
             _rubrics),
    )),
    "output": ("what the run writes", (
        Flag("out_dir", ("out_dir",), "metrics.jsonl, tb/, checkpoints/, run_config.json"),
        Flag("progress", ("progress",), "show the live progress bar"),
        Flag("tensorboard", ("tensorboard",), "also write TensorBoard scalars"),
        Flag("saved_trees", ("tree.saved_trees",), "trees per batch and evaluation written to trees/", _tree),
    )),
}

# One line per credit parameter (the classes in agentjax.train.config, METHODS.md); (method, field) before field.
CREDIT_HELP: Mapping[str | tuple[str, str], str] = {
    "score": "the episode score: 'return' (total reward) or 'success' (binary)",
    "ddof": "the std's delta degrees of freedom (1: unbiased, as verl)",
    "gamma": "discount per turn",
    "lam": "GAE's λ (bias against variance of the advantages)",
    "whiten": "normalise the advantages over the batch's trained tokens",
    "value_coef": "weight of the clipped value loss",
    "value_clip": "the value loss's clip range (None: unclipped)",
    "mode": "group normalisation: mean_std_norm, or mean_norm (WebShop)",
    "step_weight": "weight of the step advantage",
    "history": "K: history levels k = 1..K+1 of the anchor groups",
    "alpha": "α of the level weights (k + 1)^α",
    "trajectory_term": "add the episode advantage as level 0",
    "normalised": "step returns 10·γ^(d(next) − d(cur) + 1) instead of 10·γ^d(next)",
    "episode_weight": "weight of the episode advantage",
    "success_reward": "the reward of reaching success in the step returns",
    ("graphgpo", "gamma"): "γ of the shortest-path step returns",
    "beta": "β: the closure's discount",
    "depth": "closure depth K (None: the full closure)",
    "w_traj": "w_G: weight of the trajectory (GRPO) term",
    "w_step": "w_S: weight of the closure's step term",
    "sigma_min": "σ_min: floor of the step term's std",
    "stages": "execution : decomposition : rubric optimizer steps per cycle",
    "baseline": "the execution leave-one-out baseline",
    "decomposition_baseline": "the decomposition stage's baseline",
    "empty_as_zero": "a tree without launch events counts as mean event reward 0",
    "depth_weighting": "inverse-frequency depth weights over trajectories, samples, or none",
    "filter_zero_variance": "skip root tasks whose trees all score the same",
    "clip_low": "CISPO's lower bound on the importance ratio (None: unbounded)",
    "clip_high": "CISPO's upper bound on the importance ratio (None: unbounded)",
    "reading": "the grade as reward: the final score (released) or gate · Σ w s (the paper)",
    "branches": "children per fork group of the rubric stage",
    "fork_budget": "forked environments per tree (branch 0 counted)",
    "margin": "the rubric ranking hinge's margin",
}

# The tree settings a user chooses (tree methods; the rubric lengths: SERA); the rest of TreeConfig is the preset's.
TREE_HELP: Mapping[str, str] = {
    "max_depth": "a node delegates only while its depth < max-depth",
    "max_children": "children per delegation",
    "max_nodes": "nodes per tree",
    "max_turns": "the collector's cap on turns of a batch (trees still running are cut)",
    "rubric_tokens": "new tokens of a rubric-writing call",
    "grade_tokens": "new tokens of a grading call",
}
RUBRIC_ONLY = ("rubric_tokens", "grade_tokens")

SERO_HELP: Mapping[str, str] = {  # one line per SeroConfig field (its docstring has the details)
    "coef": "λ_O, the weight of the oracle loss (> 0; SERO §5.3: 0.1)",
    "scheme": "the oracle steps' weights: reachability (sero) or an ablation (§5.3, §A.7)",
    "gamma": "depth_decay's factor, in (0, 1]",
    "k": "short_bridge's length (§A.7: 1 and 3)",
    "match_mass": "rescale every scheme to SERO's supervision mass per branch (§F.2)",
    "roots": "uniform (the paper) or prioritised by the behaviour policy's doubt (§G)",
    "priority_power": "the exponent of prioritised roots",
    "soft_gate": "the graded gate clip(Δ / gate_scale, 0, 1) instead of 1[Δ > 0]",
    "gate_scale": "the soft gate's reward scale",
    "gate_on": "the returns the gate compares: binary task success or the env's reward",
    "max_oracle_steps": "cap on oracle steps per branch (None: the remaining budget)",
    "oracle_timeout": "seconds an oracle call may take; past it the branch ends 'timeout' (needs --workers >= 1)",
    "micro_batch_size": "oracle rows per micro-batch (None: the update's)",
    "capacity": "oracle rows per update (None: groups × max steps, whole micro-batches)",
    "bank": "replay this fixed oracle bank (.npz, agentjax.train.sero.save_bank) instead of fresh branches",
    "bank_branches": "branches drawn from the bank per update (None: num_groups)",
}
SWITCHES = ("resume", "dry_run", "warm_start")  # one flag each: --resume, --dry-run, --no-warm-start
SIZES = ("num_groups", "group_size", "max_steps", "prompt_len", "response_len")


def _resolve(run: RunConfig, path: str) -> tuple[Any, str]:
    """The object holding the last field of a dotted ``path`` and that field's name."""
    *parents, leaf = path.split(".")
    obj = run
    for name in parents:
        obj = getattr(obj, name)
    return obj, leaf


def _hint(run: RunConfig, path: str) -> Any:
    owner, leaf = _resolve(run, path)
    return typing.get_type_hints(type(owner))[leaf]


def _method_flags(run: RunConfig, sero: bool) -> dict[str, tuple[str, tuple[Flag, ...]]]:
    """The method's groups: its credit parameters, the tree settings (tree methods), SERO's fields (with ``--sero``)."""
    credit, method = run.train.credit, run.train.credit.method
    groups = {"credit": (f"{method}'s credit parameters (METHODS.md)", tuple(
        Flag(f.name, (f"train.credit.{f.name}",), CREDIT_HELP.get((method, f.name), CREDIT_HELP[f.name]))
        for f in dataclasses.fields(credit)))}
    if run.tree is not None:
        groups["tree"] = ("the recursive agents' trees", tuple(
            Flag(name, (f"tree.{name}",), text) for name, text in TREE_HELP.items()
            if name not in RUBRIC_ONLY or _rubrics(run)))
    if sero:
        groups["sero"] = ("SERO's auxiliary oracle branch (METHODS.md \"SERO\")", tuple(
            Flag(f.name, (f"train.sero.{f.name}",), SERO_HELP[f.name]) for f in dataclasses.fields(SeroConfig)))
    return groups


def _flags(run: RunConfig, sero: bool) -> dict[str, tuple[str, tuple[Flag, ...]]]:
    """Every group of flags that applies to ``run`` (empty groups dropped)."""
    groups = {name: (text, tuple(f for f in flags if f.when(run))) for name, (text, flags) in TRAIN_FLAGS.items()}
    groups |= _method_flags(run, sero)
    return {name: group for name, group in groups.items() if group[1]}


def _default(run: RunConfig, flag: Flag) -> Any:
    if flag.name == "warm_start":
        return run.warm_start is not None
    if not flag.paths:
        return {} if flag.type is KWARGS else False
    owner, leaf = _resolve(run, flag.paths[0])
    return getattr(owner, leaf)


def _markers(run: RunConfig, flag: Flag) -> tuple[Any, ...]:
    """tyro's markers of ``flag``: its help; the command's switches without a ``--no-`` twin; the env's keyword
    arguments as ``KEY VALUE`` pairs with the preset's shown."""
    if flag.type is KWARGS:
        kwargs = run.env_kwargs if flag.name == "env_kwargs" else run.eval_env_kwargs
        shown = "training's" if kwargs is None else " ".join(f"{k} {v}" for k, v in kwargs.items()) or "none"
        return (tyro.conf.arg(help=flag.help, metavar="KEY VALUE ...", help_behavior_hint=f"(preset: {shown})"),)
    if flag.name in SWITCHES:
        return tyro.conf.FlagCreatePairsOff, tyro.conf.arg(help=flag.help, help_behavior_hint="")
    return (tyro.conf.arg(help=flag.help),)


def _view(run: RunConfig, groups: Mapping[str, tuple[str, tuple[Flag, ...]]]) -> tuple[type, Any]:
    """A tyro target for ``groups`` (one dataclass per group, one field per flag with its help) and its instance
    holding ``run``'s values. The groups outside :data:`TRAIN_FLAGS` keep their name as the flags' prefix."""
    fields, values = [], {}
    for group, (text, flags) in groups.items():
        members = [(f.name, typing.Annotated.__class_getitem__((f.type or _hint(run, f.paths[0]), *_markers(run, f))))
                   for f in flags]
        cls = dataclasses.make_dataclass(group.capitalize(), members)
        markers = (tyro.conf.OmitArgPrefixes,) if group in TRAIN_FLAGS else ()
        fields.append((group, typing.Annotated.__class_getitem__((cls, *markers, tyro.conf.arg(help=text)))))
        values[group] = cls(**{f.name: _default(run, f) for f in flags})
    view = dataclasses.make_dataclass("Flags", fields)
    return view, view(**values)


def _changes(run: RunConfig, groups: Mapping[str, tuple[str, tuple[Flag, ...]]], parsed: Any) -> dict[str, Any]:
    """The flags whose parsed value differs from ``run``'s, by name (method groups: ``group.name``)."""
    out = {}
    for group, (_, flags) in groups.items():
        for f in flags:
            value = getattr(getattr(parsed, group), f.name)
            if value != _default(run, f):
                out[f.name if group in TRAIN_FLAGS else f"{group}.{f.name}"] = value
    return out


def _assign(obj: Any, changes: Mapping[tuple[str, ...], Any]) -> Any:
    """``obj`` (nested frozen dataclasses) with every ``path: value`` of ``changes`` set, one ``replace`` per object
    (so each validates once, with all of its new values)."""
    direct: dict[str, Any] = {}
    nested: dict[str, dict[tuple[str, ...], Any]] = {}
    for path, value in changes.items():
        if len(path) == 1:
            direct[path[0]] = value
        else:
            nested.setdefault(path[0], {})[path[1:]] = value
    for name, sub in nested.items():
        direct[name] = _assign(direct.get(name, getattr(obj, name)), sub)
    return dataclasses.replace(obj, **direct) if direct else obj


def _apply(run: RunConfig, groups: Mapping[str, tuple[str, tuple[Flag, ...]]], given: dict[str, Any]) -> RunConfig:
    """``run`` with the flags in ``given`` (:func:`_changes`) set: sizes once (the batch holds every turn; micro-batch
    size and mini-batch count the preset's where they divide it), the credit and SERO configs rebuilt from their
    fields, the env's keyword arguments merged."""
    paths: dict[tuple[str, ...], Any] = {}
    for group, (_, flags) in groups.items():
        for f in flags:
            key = f.name if group in TRAIN_FLAGS else f"{group}.{f.name}"
            if key in given and f.paths and group not in ("credit", "sero"):
                paths |= {tuple(p.split(".")): given[key] for p in f.paths}
    for group, cls in (("credit", type(run.train.credit)), ("sero", SeroConfig)):
        mine = {k.removeprefix(f"{group}."): v for k, v in given.items() if k.startswith(f"{group}.")}
        if mine or (group == "sero" and "sero" in groups):
            old = run.train.credit if group == "credit" else run.train.sero or SeroConfig()
            paths[("train", group)] = cls(**(dataclasses.asdict(old) | mine))
    if "warm_start" in given:
        paths[("warm_start",)] = None
    if "env_kwargs" in given:
        paths[("env_kwargs",)] = dict(run.env_kwargs) | given["env_kwargs"]
    if "eval_env_kwargs" in given:  # onto the preset's evaluation kwargs, else onto training's (as given)
        base = run.eval_env_kwargs if run.eval_env_kwargs is not None else paths.get(("env_kwargs",), run.env_kwargs)
        paths[("eval_env_kwargs",)] = dict(base) | given["eval_env_kwargs"]
    if "temperature" in given and not given["temperature"] > 0:
        raise ValueError(f"--temperature must be > 0 (training samples; greedy evaluation is --eval-temperature 0), "
                         f"got {given['temperature']}")
    rows_changed = any(k in given for k in ("num_groups", "group_size", "max_steps", "tree.max_nodes"))
    if rows_changed:
        ro = dataclasses.replace(run.train.rollout, **{k: given[k] for k in SIZES if k in given})
        tree = run.tree and dataclasses.replace(run.tree, max_nodes=given.get("tree.max_nodes", run.tree.max_nodes))
        rows = full_capacity(ro, tree)
        micro = given.get("micro_batch_size", math.gcd(rows, run.train.micro_batch_size))
        mini = given.get("mini_batches", math.gcd(rows // micro, run.train.mini_batches))
        paths |= {("train", "rollout", "capacity"): rows, ("train", "micro_batch_size"): micro,
                  ("train", "mini_batches"): mini}
    return _assign(run, paths)


def _flag_names(groups: Mapping[str, tuple[str, tuple[Flag, ...]]]) -> dict[str, str]:
    """``Class.field`` (as the configs' errors name them) -> the flag that sets it."""
    out = {}
    for group, (_, flags) in groups.items():
        for f in flags:
            flag = "--" + (f.name if group in TRAIN_FLAGS else f"{group}.{f.name}").replace("_", "-")
            for path in f.paths:
                *parents, leaf = path.split(".")
                out[f"{'.'.join(parents) or 'run'}.{leaf}"] = flag
    return out


_OWNERS = {"RunConfig": "run", "TrainConfig": "train", "RolloutConfig": "train.rollout", "LossConfig": "train.loss",
           "OptimizerConfig": "train.optimizer", "SeroConfig": "train.sero", "TreeConfig": "tree",
           "CollectConfig": "collect"} | {c.__name__: "train.credit" for c in CREDIT_METHODS.values()}


def _name_flags(message: str, groups: Mapping[str, tuple[str, tuple[Flag, ...]]]) -> str:
    """An error message with each ``Class.field`` that a flag sets named by that flag."""
    flags = _flag_names(groups)

    def name(match: re.Match) -> str:
        owner = _OWNERS.get(match.group(1))
        return flags.get(f"{owner}.{match.group(2)}", match.group(0)) if owner else match.group(0)

    return re.sub(r"\b([A-Z]\w+)\.([a-z_]+)\b", name, message)


def build_run(argv: Sequence[str], prog: str = "agentjax train") -> tuple[RunConfig, argparse.Namespace]:
    """The validated ``RunConfig`` of ``agentjax train`` arguments and the command's own (``method``, ``env``,
    ``preset``, ``sero``, ``resume``, ``dry_run``); raises ``ValueError`` / ``FileNotFoundError`` / ``SystemExit``."""
    parser = _Parser(prog=prog, add_help=False, allow_abbrev=False, description="train a policy")
    parser.add_argument("--method", required=True, choices=sorted(CREDIT_METHODS), help="the credit method")
    parser.add_argument("--env", required=True, choices=sorted(ENVS), help="the environment")
    parser.add_argument("--preset", required=True, choices=PRESETS, help="sizes, model and settings to start from")
    parser.add_argument("--sero", action="store_true", help="add SERO's oracle branch (--sero.* flags; any implies it)")
    if any(a in ("-h", "--help") for a in argv) and not {"--method", "--env", "--preset"} <= set(argv):
        parser.print_help()
        print("\nwith --method, --env and --preset given, --help lists every flag with the preset's values")
        raise SystemExit(0)
    args, rest = parser.parse_known_args(argv)
    args.sero = args.sero or any(a.startswith("--sero.") for a in rest)
    base = preset(args.preset, args.method, args.env)
    if args.sero and base.train.sero is None:
        base = base.replace(train=base.train.replace(sero=SeroConfig()))
    groups = _flags(base, args.sero)
    view, default = _view(base, groups)
    if any(a in ("-h", "--help") for a in rest):  # this parser's flags, then the run's
        parser.print_help()
        print()
    parsed = tyro.cli(view, default=default, args=rest, prog=f"{prog} --method {args.method} --env {args.env} "
                      f"--preset {args.preset}" + (" --sero" if args.sero else ""))
    given = _changes(base, groups, parsed)
    args.resume, args.dry_run = given.pop("resume", False), given.pop("dry_run", False)
    try:
        run = _apply(base, groups, given)
        if "max_steps" not in given:
            run = env_step_cap(run)  # e.g. the mdp setting's own step cap (--env-kwargs setting s1: 34)
        bank = run.train.sero.bank if run.train.sero is not None else None
        if bank is not None and not os.path.isfile(bank):
            raise FileNotFoundError(f"--sero.bank {bank!r} is not a file; write a bank with "
                                    "agentjax.train.sero.save_bank or drop --sero.bank")
        run.check()
    except ValueError as e:
        raise ValueError(_name_flags(str(e), groups)) from None
    return run, args


def _train(argv: Sequence[str]) -> int:
    prog = "agentjax train"
    initialize_distributed()  # one process per host joins the job (README, "Several hosts"), before any JAX use
    try:
        run, args = build_run(argv, prog)
        if not args.dry_run:
            run.check_tasks()  # the data: before the run folder is made
    except (ValueError, FileNotFoundError, TypeError, NotImplementedError) as e:
        return _fail(prog, e)
    if args.dry_run:
        print(json.dumps(run.to_dict(), indent=1))
        return 0

    # force: absl (which orbax imports) has already given the root logger a handler, which would keep this format
    # and level from applying; the project's own INFO lines (the checkpoint a run resumed from) show, other
    # libraries' from WARNING on
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s", force=True)
    for name in ("agentjax", "envs"):
        logging.getLogger(name).setLevel(logging.INFO)
    try:
        outcome = train(run, resume=args.resume)
    except (FileExistsError, RunFolderBusy, CheckpointError, ResumeMismatch) as e:  # before any update
        return _fail(prog, e)
    except NonFiniteUpdateError as e:  # the run stopped; its metrics lines and checkpoints are written
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 1
    outcome.pop("params", None)
    print(json.dumps(outcome, indent=1, default=str))
    return 0


def _eval(argv: Sequence[str]) -> int:
    prog = "agentjax eval"
    parser = _Parser(prog=prog, description="evaluate a checkpoint on its env's eval split")
    parser.add_argument("--checkpoint", required=True, help="a run folder, its checkpoints/ folder or a step folder")
    parser.add_argument("--step", type=int, help="the checkpoint step (default: the newest that restores)")
    parser.add_argument("--tasks", type=int, help="evaluate the first N tasks of the eval split")
    parser.add_argument("--seeds", type=int, help="sampled rollouts per task")
    parser.add_argument("--temperature", type=float, help="sampling temperature (0: greedy, with --seeds 1)")
    parser.add_argument("--search", type=int, help="SERA runs: rubric-guided search with N candidates per delegated "
                        "child (0: off)")
    parser.add_argument("--grader", choices=("policy", "initial"), default="policy",
                        help="who writes and grades the search's rubrics: the checkpoint, or the run's initial "
                        "policy (the untrained-grader control)")
    args = parser.parse_args(argv)

    try:
        find_run(args.checkpoint)
        result = evaluate_checkpoint(args.checkpoint, step=args.step, tasks=args.tasks, seeds=args.seeds,
                                     temperature=args.temperature, search=args.search, grader=args.grader)
    except (ValueError, FileNotFoundError) as e:
        return _fail(prog, e)
    print(json.dumps(result, indent=1))
    return 0


def _trees(argv: Sequence[str]) -> int:
    prog = "agentjax trees"
    parser = _Parser(prog=prog, description="print the trees a tree run (--method rao / sera) saved")
    parser.add_argument("--run", required=True, help="the run's out_dir")
    parser.add_argument("--update", type=int, help="the batch (metrics line step) whose trees to print "
                        "(default: the last saved)")
    parser.add_argument("--eval", action="store_true", help="the evaluation's trees at that step instead")
    parser.add_argument("--tree", type=int, help="print only the I-th saved tree")
    parser.add_argument("--max-chars", type=int, default=160, help="clip each text to N characters (default 160)")
    parser.add_argument("--list", action="store_true", help="list the steps with saved trees")
    args = parser.parse_args(argv)

    try:
        if args.list:
            saved = saved_tree_files(args.run)
            for kind in ("train", "eval"):
                print(f"{kind}: {' '.join(map(str, saved[kind])) or '-'}")
            return 0
        info, trees = load_trees(args.run, args.update, evaluation=args.eval)
        if args.tree is not None and not 0 <= args.tree < len(trees):
            raise ValueError(f"--tree {args.tree}: {len(trees)} trees were saved at that step (0..{len(trees) - 1})")
    except (ValueError, FileNotFoundError) as e:
        return _fail(prog, e)
    chosen = trees if args.tree is None else [trees[args.tree]]
    print(", ".join(f"{k} {v}" for k, v in info.items()))
    print("\n\n".join(render_tree(t, max_chars=args.max_chars) for t in chosen))
    return 0


def _data(argv: Sequence[str]) -> int:
    prog = "agentjax data"
    parser = _Parser(prog=prog, description="download and verify the benchmark data (envs/data.py)")
    parser.add_argument("--mirror", metavar="URL", help="a base URL serving the data folder's layout "
                        "(default: the official sources)")
    parser.add_argument("--only", nargs="+", choices=DATASETS, metavar="DATASET",
                        help=f"only these datasets ({', '.join(DATASETS)})")
    parser.add_argument("--dest", help="the data root (default: $AGENTJAX_DATA, else ../shared/data)")
    parser.add_argument("--verify", action="store_true", help="only check the files that are there")
    args = parser.parse_args(argv)
    if args.verify and args.mirror:
        parser.error("--verify checks the files in place and takes no --mirror")
    try:
        results = fetch(args.dest, only=args.only, mirror=args.mirror, verify=args.verify, log=print)
    except (ValueError, OSError) as e:
        return _fail(prog, e)
    print(summary(results))
    failed = [r for r in results if not r.ok]
    for r in failed:
        print(f"{prog}: error: {r.path}: {r.status}: {r.detail}", file=sys.stderr)
    return 2 if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = {"train": _train, "eval": _eval, "trees": _trees, "data": _data}
    if not argv or argv[0] in ("-h", "--help"):
        print("usage:" + _USAGE)
        return 0 if argv else 2
    if argv[0] not in commands:
        print(f"agentjax: error: unknown command {argv[0]!r}; choose one of {sorted(commands)}", file=sys.stderr)
        return 2
    return commands[argv[0]](argv[1:])


if __name__ == "__main__":
    sys.exit(main())
