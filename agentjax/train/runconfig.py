"""`RunConfig`: one training run — the update's `TrainConfig` plus the env, the collector, the schedule and the files.

Sizes have one source: ``train.rollout`` (groups, group size, step cap, prompt / response capacity, batch rows).
``collect`` holds the collector's other settings; its copies of the sizes are filled in from ``train.rollout``
(:func:`sized_collect`), so a run states each size once. :meth:`RunConfig.with_sizes` changes sizes (the batch rows
follow), and :meth:`RunConfig.replace` refuses a ``collect`` whose sizes disagree (set them in ``train.rollout``).

Validation happens in two stages, both before anything heavy is built: ``__post_init__`` checks the values
themselves (no I/O), :meth:`RunConfig.check` what needs the machine (device count for the mesh, the tokenizer's
vocabulary against the model's, the split sizes, checkpoint folders).

Environments are looked up in :data:`ENVS` by name (``--env``); each :class:`EnvSpec` names the env class,
its training and evaluation splits, the collector preset and what the env needs on disk. The presets of the
environments without a :class:`CollectConfig` classmethod are here (:func:`collect_preset`); their prompt
capacities come from prompts measured with the real Qwen2.5 tokenizer and the verl-agent templates (history 2):

- TextCraft (free-form commands, ADaPT's setting): ≤ 1,449 tokens on all 1,100 tasks (steps 0-2, where the
  crafting listing is in the prompt) -> 2,048; 40 steps. With the admissible lists (constrained decoding) ≤ 3,631
  tokens, replies ≤ 29 tokens, up to 33 allowed tokens at a reply position -> ``max_allowed`` 48.
- TextCraft-Synth (free-form): train_medium ≤ 2,198 tokens, val easy ≤ 765, medium ≤ 2,335, hard ≤ 4,986,
  extreme median 6,606, max 15,421 -> 8,192 (every training prompt and every easy / medium / hard eval prompt
  fit; 82% of the extreme ones, the rest are cut by the paper presets' ``truncation="left"``); 75 steps (the task
  files' limit); train on the 852 medium tasks, evaluate on the 632 val tasks of all four difficulties (SERA).
  With the admissible lists (the tiny presets' constrained decoding) the first prompts of val's extreme tasks
  reach 31,104 tokens; the longest constrained reply is 59 tokens on train_medium, 105 on val.
- TextWorld CookingWorld: ≤ 967 tokens over oracle and random-admissible episodes of 42 games of all six levels
  (level 6 the longest) -> 2,048; 100 steps (the env's limit, 1.7 x the longest walkthrough); replies ≤ 14 tokens,
  at most 15 allowed tokens at a reply position -> ``max_allowed`` 32.
- The credit-testbed MDPs (envs/mdp): the setting by env kwargs (``setting="s1" | "s2" | "s3"``, the
  pre-registered ones; default ``MDPConfig()``), one MDP per task seed, the train / valid splits of envs/mdp;
  14 steps (the step cap of s2 and of the default; s1 needs 34, s3 20: ``--max-steps``); first prompts ≤ 173 Qwen
  tokens with the verl-agent template (every state of 30 tasks of each setting; two history records add about 100)
  -> 512; every episode its own slip stream (``CollectConfig.sample_seeds``).
- TextWorld-Sync (the released benchmark): ≤ 1,375 tokens over oracle and random-admissible episodes (first 60
  turns) of 152 tasks of the three splits (every family x difficulty) -> 2,048; compact prompts ≤ 1,121; 200 steps
  (the authors' single-agent root cap; the shared world budget, 65-125 steps, or 100 in training, ends an episode
  first unless inventory lookups, which take no world step, fill it); replies ≤ 13 tokens with the stop token, at
  most 14 allowed tokens at a reply position -> ``max_allowed`` 32. Evaluation on the test split (SERA's 1,400).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import inspect
import json
import os
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any

import jax

from agentjax.agents.tree import TreeLimits
from agentjax.rollout.collect import CollectConfig
from agentjax.rollout.tree_collect import TreeCollectConfig
from agentjax.rollout.tree_rubrics import ForkConfig, RubricConfig
from agentjax.train.config import CREDIT_METHODS, SERACredit, TrainConfig
from agentjax.train.tree_worlds import TREE_ENVS, check_world_kwargs, make_judge

QWEN_TOKENIZER_SIZE = 151_665  # ids 0..151_664 of the Qwen2.5 tokenizer (BPE + added tokens)
WORDS_PREFIX = "words:"  # RunConfig.tokenizer = "words:<env>": a word-level tokenizer of the env (train/tokenizers.py)


@dataclasses.dataclass(frozen=True)
class EnvSpec:
    """How the trainer builds an environment and where its tasks come from."""

    name: str
    module: str  # the module of the env class
    cls: str  # the class name (instantiated as ``cls(**env_kwargs)`` in every pool slot)
    train_split: str
    eval_split: str
    collect: Callable[..., CollectConfig]  # the collector preset (CollectConfig.<env>)
    data: str  # what the env needs on disk (for error messages)

    def env_class(self) -> type:
        return getattr(importlib.import_module(self.module), self.cls)

    def tasks(self, split: str) -> list:
        """The tasks of ``split``; a missing data folder or file is an error that says what the env needs."""
        try:
            return self.env_class().tasks(split)
        except FileNotFoundError as e:
            raise FileNotFoundError(f"{self.name} needs {self.data}: {e}") from e


def collect_preset(**defaults: Any) -> Callable[..., CollectConfig]:
    """A collector preset like :meth:`CollectConfig.alfworld`: ``CollectConfig(**(defaults | overrides))``."""

    def make(**overrides: Any) -> CollectConfig:
        return CollectConfig(**(defaults | overrides))

    return make


ENVS: Mapping[str, EnvSpec] = types.MappingProxyType({
    "sokoban": EnvSpec("sokoban", "envs.sokoban.env", "SokobanEnv", "train", "valid", CollectConfig.sokoban,
                       "nothing (rooms are generated from the seed)"),
    "alfworld": EnvSpec("alfworld", "envs.alfworld.env", "AlfWorldEnv", "train", "valid_unseen", CollectConfig.alfworld,
                        "$ALFWORLD_DATA (make alfworld-data unpacks $AGENTJAX_DATA/alfworld)"),
    "webshop": EnvSpec("webshop", "envs.webshop.env", "WebShopEnv", "train", "test", CollectConfig.webshop,
                       "$AGENTJAX_DATA/webshop"),
    "textcraft": EnvSpec("textcraft", "envs.textcraft.env", "TextCraftEnv", "train", "val",
                         collect_preset(max_steps=40, max_prompt_tokens=2048, max_allowed=48),
                         "$AGENTJAX_DATA/textcraft (textcraft_{train,val}.jsonl)"),
    "textcraft_synth": EnvSpec("textcraft_synth", "envs.textcraft.env", "TextCraftSynthEnv", "train_medium", "val",
                               collect_preset(max_steps=75, max_prompt_tokens=8192),
                               "$AGENTJAX_DATA/textcraft (textcraft_synth_recipes.json, "
                               "textcraft_synth_{train,val}.jsonl.xz)"),
    "textworld": EnvSpec("textworld", "envs.textworld.env", "TextWorldCookingEnv", "train", "valid",
                         collect_preset(max_steps=100, max_prompt_tokens=2048, max_allowed=32),
                         "the manifest's tw-cooking games, generated on first use into $TEXTWORLD_GAMES (default "
                         "~/.cache/agentjax/textworld; `python -m envs.textworld.generate --split train --split valid` "
                         "makes them ahead, ~2 s a game)"),
    "textworld_sync": EnvSpec("textworld_sync", "envs.textworld_sync.env", "TextWorldSyncEnv", "train", "test",
                              collect_preset(max_steps=200, max_prompt_tokens=2048, max_allowed=32),
                              "$AGENTJAX_DATA/textworld_sync (SERA's released files: training/, validation/, eval/)"),
    "mdp": EnvSpec("mdp", "envs.mdp.env", "MDPEnv", "train", "valid",
                   collect_preset(max_steps=14, max_prompt_tokens=512, sample_seeds=True),
                   "nothing (the MDPs are generated from the seed and the setting)"),
})


@dataclasses.dataclass(frozen=True)
class WarmStart:
    """Supervised warm start on oracle demonstrations, before RL (:mod:`agentjax.train.warmstart`).

    Identical for every method and every RL seed of a run family: the demonstrations, the initial weights
    (random init with ``seed``, not ``TrainConfig.seed``, or the model checkpoint) and the SFT steps depend on
    these fields, the model architecture, the env and the prompt settings only; the result is cached under
    ``cache_dir`` keyed by a hash of them.
    """

    episodes: int = 64  # oracle episodes on training tasks (a fixed permutation of the split, seeded by ``seed``)
    steps: int = 100  # AdamW steps of next-token NLL on the demonstrated responses
    batch_size: int = 32  # turns per SFT step (sampled with replacement, seeded by ``seed``)
    learning_rate: float = 1e-3
    seed: int = 0
    cache_dir: str | None = None  # default <out_dir>/warmstart

    def __post_init__(self):
        for name in ("episodes", "steps", "batch_size", "learning_rate"):
            if not getattr(self, name) > 0:
                raise ValueError(f"WarmStart.{name} must be > 0, got {getattr(self, name)!r}")


@dataclasses.dataclass(frozen=True)
class TreeConfig:
    """The recursive-agent trees of a RAO run (METHODS.md "SERA" 1; :mod:`agentjax.train.trees`).

    The sizes shared with the flat runs keep their meaning: ``train.rollout.num_groups`` root tasks per batch,
    ``group_size`` trees per root task (K), ``max_steps`` turns per node (20), ``prompt_len`` / ``response_len``
    per node turn; ``capacity`` bounds the rows of a batch (default every turn fitting:
    ``num_groups · K · max_nodes · max_steps``; a batch is padded to ``micro_batch_size · 2^j`` rows below it). The
    sampler and prompt settings come from ``collect`` (:attr:`RunConfig.tree_collect`); ``env_kwargs`` go to the
    env's tree world (:mod:`agentjax.train.tree_worlds`).
    """

    max_depth: int = 3  # a node delegates only while its depth < max_depth
    max_children: int = 8  # children per delegation
    max_nodes: int = 64  # nodes per tree
    max_turns: int = 400  # the collector's cap on turns of a batch (trees still running are cut)
    history_length: int | None = None  # own turns shown in a node's prompt (None: all that fit)
    node_slots: int | None = None  # Q of the tree arrays (default max_nodes)
    event_slots: int | None = None  # E of the tree arrays (default 2 Q)
    max_skipped_batches: int = 20  # stop once more batches than this trained nothing (no signal / NaN)
    saved_trees: int = 4  # trees per batch written to <out_dir>/trees/<step>.json (and those of each evaluation)
    rubric_tokens: int = 512  # SERA: new tokens of a rubric-writing call
    grade_tokens: int = 256  # SERA: new tokens of a grading call
    rubric_choices: bool = False  # SERA: rubrics and grades chosen among the fixed ones (tiny constrained policies)

    def __post_init__(self):
        if self.max_depth < 0:
            raise ValueError(f"TreeConfig.max_depth must be >= 0, got {self.max_depth}")
        for name in ("max_children", "max_nodes", "max_turns", "rubric_tokens", "grade_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"TreeConfig.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("max_skipped_batches", "saved_trees"):
            if getattr(self, name) < 0:
                raise ValueError(f"TreeConfig.{name} must be >= 0, got {getattr(self, name)}")
        if self.history_length is not None and self.history_length < 0:
            raise ValueError(f"TreeConfig.history_length must be >= 0 or None, got {self.history_length}")
        if self.node_slots is not None and self.node_slots < self.max_nodes:
            raise ValueError(f"TreeConfig.node_slots={self.node_slots} cannot hold a tree of max_nodes="
                             f"{self.max_nodes}; raise it or leave it None")


def _size_pairs(collect: CollectConfig, rollout: Any) -> tuple[tuple[str, Any, str, Any], ...]:
    """(``rollout``'s name, its value, collect's name, collect's value) for every size the collector holds."""
    return (("group_size", rollout.group_size, "group_size", collect.group_size),
            ("max_steps", rollout.max_steps, "max_steps", collect.max_steps),
            ("prompt_len", rollout.prompt_len, "max_prompt_tokens", collect.max_prompt_tokens),
            ("response_len", rollout.response_len, "sampling.max_new_tokens", collect.sampling.max_new_tokens),
            ("rows", rollout.rows, "capacity", collect.capacity))


def sized_collect(collect: CollectConfig, rollout: Any) -> CollectConfig:
    """``collect`` with the sizes of ``rollout`` (a :class:`~agentjax.train.config.RolloutConfig`): group size, step
    cap, prompt capacity, reply capacity (``sampling.max_new_tokens``) and batch rows (``capacity``)."""
    if all(want == got for _, want, _, got in _size_pairs(collect, rollout)):
        return collect
    return collect.replace(group_size=rollout.group_size, max_steps=rollout.max_steps,
                           max_prompt_tokens=rollout.prompt_len, capacity=rollout.rows,
                           sampling=dataclasses.replace(collect.sampling, max_new_tokens=rollout.response_len))


def full_capacity(rollout: Any, tree: TreeConfig | None) -> int:
    """Rows of a batch with every turn fitting: ``G · R · max_steps`` (flat) or ``G · K · max_nodes · max_steps``."""
    rows = rollout.num_groups * rollout.group_size * rollout.max_steps
    return rows * tree.max_nodes if tree is not None else rows


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """A training run (module docstring).

    Attributes:
      train: the update's config (model, sizes, credit method, loss, optimizer, seed).
      env: a key of :data:`ENVS`.
      env_kwargs: keyword arguments of the env class (e.g. ``{"max_steps": 15}``; a tree run: of its tree world).
      eval_env_kwargs: the env's keyword arguments at evaluation (None: ``env_kwargs``); e.g. TextWorld-Sync trains
        trees with a shared budget of 100 steps and evaluates with each task's own.
      collect: the collector's settings (prompt, rewards, sampler and decoding: the preset's and the backend's
        choices); its sizes are filled in from ``train.rollout`` (:func:`sized_collect`).
      updates: total updates of the run (a resumed run continues up to it).
      eval_every: evaluate after every N-th update and after the last (0: never).
      eval_at_start: also evaluate the initial policy (update 0) when a run starts from scratch.
      eval_tasks: the first N tasks of the eval split are evaluated.
      eval_seeds: sampled rollouts per eval task (one per seed; success is averaged per seed, then mean ± std).
      eval_temperature: sampling temperature of evaluation (None: the collector's; 0: greedy, one seed).
      eval_split: the split evaluation draws its first ``eval_tasks`` from (None: the env's ``eval_split``).
      train_pool: train on the first N tasks of the train split only (0: the whole split) — a finite training set,
        like Procgen's fixed level counts; with ``eval_split`` set to the train split and ``eval_tasks = N``, the
        evaluation measures success on the tasks trained on (the tiny CRBC experiment's pool setting).
      held_out_tasks: also evaluate the first N tasks of the env's own eval split at every eval point (same seeds,
        temperature and sampling streams): with ``train_pool``, the generalisation curve beside the training
        pool's (``held_out/`` metrics, outcomes in ``eval/held_out/<step>.json``); 0: off.
      eval_search: SERA's rubric-guided search at evaluation: candidate subtrees per delegated child (0: off;
        :mod:`agentjax.rollout.tree_search`, released default 2; needs ``--method sera``).
      checkpoint_every: save after every N-th update (and always after the last).
      keep_checkpoints: the newest N checkpoints are kept.
      out_dir: metrics.jsonl, tb/, checkpoints/, run_config.json, initial_policy.json.
      workers: env worker processes (0: a SerialPool in this process).
      tokenizer: a tokenizer folder, ``"words:<env>"`` (a word-level tokenizer of the env's words and templates:
        :mod:`agentjax.train.tokenizers`), or None (the offline Qwen2.5 tokenizer).
      warm_start: supervised warm start on oracle demonstrations (None: off).
      mesh: ``(fsdp, tp)`` device mesh for the model (None: one device).
      require_pretrained: refuse to start without ``train.model.checkpoint`` (the paper presets).
      progress: show the live progress bar.
      tensorboard: also write TensorBoard scalars.
      tree: the recursive-agent trees of a tree method (RAO; :class:`TreeConfig`); None for the flat methods.
    """

    train: TrainConfig = TrainConfig()
    env: str = "sokoban"
    env_kwargs: dict[str, int | float | str | bool] = dataclasses.field(default_factory=dict)
    collect: CollectConfig = CollectConfig()
    updates: int = 150
    eval_every: int = 10
    eval_at_start: bool = True
    eval_tasks: int = 64
    eval_seeds: int = 3
    eval_temperature: float | None = None
    eval_split: str | None = None
    train_pool: int = 0
    held_out_tasks: int = 0
    eval_search: int = 0
    checkpoint_every: int = 10
    keep_checkpoints: int = 3
    out_dir: str = "runs/default"
    workers: int = 0
    tokenizer: str | None = None
    warm_start: WarmStart | None = None
    mesh: tuple[int, int] | None = None
    require_pretrained: bool = False
    progress: bool = True
    tensorboard: bool = True
    eval_env_kwargs: dict[str, int | float | str | bool | None] | None = None
    tree: TreeConfig | None = None

    def __post_init__(self):
        object.__setattr__(self, "collect", sized_collect(self.collect, self.train.rollout))
        if self.env not in ENVS:
            raise ValueError(f"RunConfig.env={self.env!r} is not an environment; choose one of {sorted(ENVS)}")
        self._check_tree()
        for name in ("updates", "eval_seeds", "keep_checkpoints"):
            if getattr(self, name) < 1:
                raise ValueError(f"RunConfig.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("eval_every", "checkpoint_every", "workers", "train_pool", "held_out_tasks"):
            if getattr(self, name) < 0:
                raise ValueError(f"RunConfig.{name} must be >= 0, got {getattr(self, name)}")
        if self.train_pool and self.train_pool < self.train.rollout.num_groups:
            raise ValueError(f"RunConfig.train_pool={self.train_pool} is smaller than the "
                             f"{self.train.rollout.num_groups} groups of a batch (each group plays a distinct task); "
                             "raise it or lower num_groups")
        if self.eval_every and self.eval_tasks < 1:
            raise ValueError(f"RunConfig.eval_tasks must be >= 1 when evaluating, got {self.eval_tasks}")
        if self.eval_search < 0:
            raise ValueError(f"RunConfig.eval_search must be >= 0 (0: off), got {self.eval_search}")
        if self.eval_search and self.rubric_collect is None:
            raise ValueError("RunConfig.eval_search: rubric-guided search grades candidates with the policy's rubrics; "
                             "it needs --method sera")
        if self.eval_temperature is not None and self.eval_temperature < 0:
            raise ValueError(f"RunConfig.eval_temperature must be >= 0 or None, got {self.eval_temperature}")
        if self.eval_temperature == 0 and self.eval_seeds > 1:
            raise ValueError(f"greedy evaluation (eval_temperature=0) is deterministic: eval_seeds={self.eval_seeds} "
                             "would repeat the same episodes; set eval_seeds=1 or a temperature > 0")
        if self.mesh is not None:
            if len(self.mesh) != 2 or min(self.mesh) < 1:
                raise ValueError(f"RunConfig.mesh must be (fsdp, tp) with sizes >= 1, got {self.mesh}")
            if self.train.micro_batch_size % self.mesh[0]:
                raise ValueError(f"TrainConfig.micro_batch_size={self.train.micro_batch_size} must be a multiple of "
                                 f"the mesh's fsdp size {self.mesh[0]} (rows are split over fsdp)")
        self._check_sizes()

    def _check_tree(self) -> None:
        method = self.train.credit.method
        if self.train.is_tree != (self.tree is not None):
            raise ValueError(f"--method {method} " + ("trains recursive trees and needs RunConfig.tree (the rao "
                             "presets set it)" if self.train.is_tree else "is a flat method; RunConfig.tree must be "
                             "None"))
        if self.tree is None:
            return
        if self.held_out_tasks:
            raise ValueError(f"RunConfig.held_out_tasks={self.held_out_tasks}: the tree trainer (--method {method}) "
                             "evaluates one series; set held_out_tasks=0")
        if self.env not in TREE_ENVS:
            raise ValueError(f"--method {method} trains recursive agents on {', '.join(TREE_ENVS)}, not {self.env!r}")
        if self.workers:
            raise ValueError(f"RunConfig.workers={self.workers}: the tree collector steps its shared worlds in this "
                             "process; set workers=0")

    def _check_sizes(self) -> None:
        ro = self.train.rollout
        episodes = ro.num_groups * ro.group_size
        if self.tree is not None:
            return
        if ro.rows < episodes:
            raise ValueError(f"the batch has {ro.rows} row slots (train.rollout.capacity) for {ro.num_groups} groups x "
                             f"group size {ro.group_size} = {episodes} rollouts of at least one turn each; raise the "
                             "capacity or lower num_groups / group_size")
        if self.workers > max(episodes, self.eval_slots):
            raise ValueError(f"RunConfig.workers={self.workers} is more than the {max(episodes, self.eval_slots)} "
                             "env slots; use fewer workers")

    # -- derived ------------------------------------------------------------------------------------------------
    @property
    def spec(self) -> EnvSpec:
        return ENVS[self.env]

    @property
    def evaluation_split(self) -> str:
        """The split of the eval tasks: ``eval_split`` or the env's."""
        return self.eval_split or self.spec.eval_split

    @property
    def eval_slots(self) -> int:
        """Env slots of an evaluation: the larger of its two series (eval tasks, held-out tasks) x eval seeds."""
        return max(self.eval_tasks, self.held_out_tasks) * self.eval_seeds if self.eval_every else 0

    @property
    def branch_slots(self) -> range:
        """SERO's isolated env slots (one per group, after the primary rollouts' slots; empty without SERO)."""
        ro = self.train.rollout
        start = ro.num_groups * ro.group_size
        return range(start, start + (ro.num_groups if self.train.sero is not None else 0))

    @property
    def slots(self) -> int:
        """Env slots of the pool: a training batch (and SERO's branch slots) or an evaluation, whichever is larger."""
        return max(self.branch_slots.stop, self.eval_slots)

    @property
    def train_collect(self) -> CollectConfig:
        """The collector config of the training batches: ``collect``, with the per-turn snapshots SERO restores."""
        return self.collect.replace(snapshots=True) if self.train.sero is not None else self.collect

    @property
    def eval_collect(self) -> CollectConfig:
        """The collector config of evaluation: ``eval_seeds`` rollouts per task, no fixed capacity, one sampling
        stream per episode (``row_keys``: common random numbers across eval points and runs)."""
        sampling = self.collect.sampling
        if self.eval_temperature is not None:
            sampling = dataclasses.replace(sampling, temperature=self.eval_temperature)
        return self.collect.replace(group_size=self.eval_seeds, capacity=None, sampling=sampling, row_keys=True)

    @property
    def eval_kwargs(self) -> dict[str, Any]:
        """The env's keyword arguments at evaluation (``eval_env_kwargs``, else ``env_kwargs``)."""
        return dict(self.env_kwargs if self.eval_env_kwargs is None else self.eval_env_kwargs)

    @property
    def tree_collect(self) -> TreeCollectConfig:
        """The tree collector's config of the training batches
        (:class:`~agentjax.rollout.tree_collect.TreeCollectConfig`): ``K = group_size`` trees per root task, the
        node budget ``max_steps`` and the tree limits, ``collect``'s sampler, prompt and decoding settings."""
        if self.tree is None:
            raise ValueError("RunConfig.tree_collect: a flat run has no trees")
        co, tr = self.collect, self.tree
        return TreeCollectConfig(
            trees_per_task=co.group_size, limits=TreeLimits(max_steps=co.max_steps, max_depth=tr.max_depth,
                                                            max_children=tr.max_children, max_nodes=tr.max_nodes),
            max_turns=tr.max_turns, history_length=tr.history_length, sampling=co.sampling,
            max_prompt_tokens=co.max_prompt_tokens, truncation=co.truncation, invalid_penalty=co.invalid_penalty,
            success_reward=co.success_reward, constrained=co.constrained, masked_logp=co.masked_logp,
            sparse_logits=co.sparse_logits, max_allowed=co.max_allowed, max_trie_edges=co.max_trie_edges,
            batch_bucket=co.batch_bucket, pow2_batches=co.pow2_batches, row_keys=co.row_keys,
            node_slots=tr.node_slots, event_slots=tr.event_slots)

    @property
    def rubric_collect(self) -> RubricConfig | None:
        """SERA's rubric writing and grading in the tree collector (:class:`~agentjax.rollout.tree_rubrics.
        RubricConfig`: ``collect``'s sampler settings at temperature 1 / 0, ``tree.rubric_tokens`` /
        ``grade_tokens`` new tokens, prompts up to ``collect.max_prompt_tokens``, the credit's reading); None when the
        method has no rubrics. The grader is asked about the children the env's judge judges: on TextCraft-Synth
        only finished ones (a child that did not finish scores 0 without a call), on TextWorld-Sync every child, as
        its judge (a child whose action ends the shared task, or that spent its budget after doing its subtask,
        never gets to finish)."""
        if self.tree is None or not isinstance(self.train.credit, SERACredit):
            return None
        co, tr = self.collect, self.tree
        sampling = lambda temperature, tokens: dataclasses.replace(  # noqa: E731
            co.sampling, temperature=temperature, max_new_tokens=tokens)
        return RubricConfig(reading=self.train.credit.reading, writing=sampling(1.0, tr.rubric_tokens),
                            grading=sampling(0.0, tr.grade_tokens), max_prompt_tokens=co.max_prompt_tokens,
                            constrained=tr.rubric_choices, batch_bucket=co.batch_bucket,
                            max_context_chars=min(12_000, 2 * co.max_prompt_tokens),
                            max_trie_edges=max(co.max_trie_edges, 8192),
                            sparse_logits=co.sparse_logits and tr.rubric_choices, one_pass=tr.rubric_choices,
                            require_finish=make_judge(self.env).require_finish)

    @property
    def fork_collect(self) -> ForkConfig | None:
        """SERA's rubric-stage fork groups (:class:`~agentjax.rollout.tree_rubrics.ForkConfig` from the credit's
        ``branches`` and ``fork_budget``); None when the method has no rubric stage."""
        if self.rubric_collect is None or not self.train.credit.stages[2]:
            return None
        return ForkConfig(branches=self.train.credit.branches, budget=self.train.credit.fork_budget)

    @property
    def eval_tree_collect(self) -> Any:
        """The tree collector's config of evaluation: ``eval_seeds`` trees per task, one sampling stream per tree
        slot and node (``row_keys``: common random numbers across eval points and runs), ``eval_temperature``."""
        sampling = self.collect.sampling
        if self.eval_temperature is not None:
            sampling = dataclasses.replace(sampling, temperature=self.eval_temperature)
        return self.tree_collect.replace(trees_per_task=self.eval_seeds, sampling=sampling, row_keys=True)

    def replace(self, **changes: Any) -> RunConfig:
        """``dataclasses.replace``; a new ``collect`` must carry the sizes of the run's ``train.rollout`` (sizes are
        set there: :meth:`with_sizes`)."""
        if changes.get("collect") is not None:
            rollout = changes.get("train", self.train).rollout
            for name, want, cname, got in _size_pairs(changes["collect"], rollout):
                if want != got:
                    raise ValueError(f"train.rollout.{name}={want} but collect.{cname}={got}: the collector's sizes "
                                     "are train.rollout's; change sizes there (RunConfig.with_sizes), not in collect")
        return dataclasses.replace(self, **changes)

    def with_sizes(self, *, micro_batch_size: int | None = None, **sizes: int | None) -> RunConfig:
        """Change ``num_groups``, ``group_size``, ``max_steps``, ``prompt_len``, ``response_len`` or ``capacity``
        in ``train.rollout`` (``capacity`` defaults to every turn fitting; the collector follows), and the
        micro-batch size if given."""
        unknown = set(sizes) - {"num_groups", "group_size", "max_steps", "prompt_len", "response_len", "capacity"}
        if unknown:
            raise ValueError(f"with_sizes: unknown sizes {sorted(unknown)}")
        ro = dataclasses.replace(self.train.rollout, **sizes)
        if "capacity" not in sizes:
            ro = dataclasses.replace(ro, capacity=full_capacity(ro, self.tree))
        micro = micro_batch_size or self.train.micro_batch_size
        return dataclasses.replace(self, train=self.train.replace(rollout=ro, micro_batch_size=micro))

    def check(self) -> None:
        """Checks that need the machine (module docstring); raises ``ValueError`` / ``FileNotFoundError``."""
        sero = self.train.sero
        if sero is not None and sero.oracle_timeout is not None and self.workers == 0:
            raise ValueError(f"SeroConfig.oracle_timeout={sero.oracle_timeout} bounds the env's oracle calls, "
                             "which only env worker processes allow; set RunConfig.workers >= 1")
        if self.mesh is not None and self.mesh[0] * self.mesh[1] != jax.device_count():
            raise ValueError(f"RunConfig.mesh={self.mesh} needs {self.mesh[0] * self.mesh[1]} devices, there are "
                             f"{jax.device_count()} ({jax.devices()[0].platform}); pick sizes whose product is that")
        ckpt = self.train.model.checkpoint
        if self.require_pretrained and ckpt is None:
            raise ValueError(f"this preset trains {self.train.model.arch.name} from its pretrained Instruct weights; "
                             "pass --model DIR (train.model.checkpoint: a Hugging Face folder with config.json and "
                             "safetensors)")
        if ckpt is not None and not os.path.isfile(os.path.join(ckpt, "config.json")):
            raise FileNotFoundError(f"train.model.checkpoint={ckpt!r} has no config.json; point it at a Hugging Face "
                                    "checkpoint folder")
        if self.tokenizer is not None and self.tokenizer.startswith(WORDS_PREFIX):
            env = self.tokenizer.removeprefix(WORDS_PREFIX)
            if env not in ENVS or not hasattr(ENVS[env].env_class(), "vocabulary"):
                raise ValueError(f"RunConfig.tokenizer={self.tokenizer!r}: a word tokenizer needs an env with a "
                                 f"vocabulary() (e.g. 'words:mdp'), not {env!r}")
        elif self.tokenizer is not None and not os.path.isdir(self.tokenizer):
            raise FileNotFoundError(f"RunConfig.tokenizer={self.tokenizer!r} is not a folder")
        if self.tokenizer is None and self.train.model.arch.vocab_size < QWEN_TOKENIZER_SIZE:
            raise ValueError(f"the model's vocabulary ({self.train.model.arch.vocab_size}) is smaller than the Qwen "
                             f"tokenizer's ({QWEN_TOKENIZER_SIZE}); use vocab_size >= {QWEN_TOKENIZER_SIZE} "
                             "(151,936 as Qwen2.5) or pass a smaller tokenizer folder")
        if self.tree is not None:
            check_world_kwargs(self.env, self.env_kwargs, "env_kwargs")
            check_world_kwargs(self.env, self.eval_kwargs, "eval_env_kwargs")
        else:
            for name, kwargs in (("env_kwargs", self.env_kwargs), ("eval_env_kwargs", self.eval_kwargs)):
                try:
                    inspect.signature(self.spec.env_class()).bind(**kwargs)
                except TypeError as e:
                    raise ValueError(f"RunConfig.{name}={kwargs} do not fit {self.spec.cls}: {e}") from None
        if self.warm_start is not None and self.tree is None and not self.collect.constrained:
            raise ValueError("the warm start imitates the constrained decoder's replies (collect.constrained_format); "
                             "set collect.constrained=True or warm_start=None")

    def check_tasks(self) -> None:
        """The task splits the run reads are on disk and hold enough tasks, and the env starts its first training
        task (ALFWorld's split is a committed manifest; its games are read from ``$ALFWORLD_DATA`` at reset): a
        missing data folder is a ``FileNotFoundError`` naming what the env needs and the variable to set. The envs
        keep a split once read, so the trainer reads it again for free; ``agentjax train`` checks this before it
        makes the run folder."""
        spec, groups = self.spec, self.train.rollout.num_groups
        tasks = spec.tasks(spec.train_split)
        n = len(tasks)
        if max(self.train_pool, groups) > n:
            raise ValueError(f"{self.env} {spec.train_split} has {n} tasks, fewer than RunConfig.train_pool="
                             f"{self.train_pool} or the {groups} groups of a batch; lower them")
        env = spec.env_class()(**(self.env_kwargs if self.tree is None else {}))  # a tree run's kwargs are its world's
        try:
            env.reset(tasks[0])
        finally:
            if callable(getattr(env, "close", None)):
                env.close()
        if not self.eval_every:
            return
        n = len(spec.tasks(self.evaluation_split))
        if self.eval_tasks > n:
            raise ValueError(f"RunConfig.eval_tasks={self.eval_tasks} but {self.env} {self.evaluation_split} has {n} "
                             "tasks; lower eval_tasks")
        n = len(spec.tasks(spec.eval_split)) if self.held_out_tasks else 0
        if self.held_out_tasks > n:
            raise ValueError(f"RunConfig.held_out_tasks={self.held_out_tasks} but {self.env} {spec.eval_split} has "
                             f"{n} tasks; lower held_out_tasks")

    # -- serialisation ------------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """JSON-ready nested dict (the credit block carries its ``method``); :func:`run_from_dict` inverts it."""
        out = dataclasses.asdict(self)
        out["train"] = self.train.to_dict()
        out["mesh"] = list(self.mesh) if self.mesh else None
        return json.loads(json.dumps(out))


def _build(tp: Any, value: Any) -> Any:
    """``value`` (JSON) as an instance of the annotation ``tp`` (dataclasses, tuples, optionals, unions)."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        if isinstance(value, dict) and "method" in value:  # the credit union
            params = {k: v for k, v in value.items() if k != "method"}
            return _build(CREDIT_METHODS[value["method"]], params)
        for arg in args:
            if arg is type(None):
                continue
            if dataclasses.is_dataclass(arg) and isinstance(value, dict):
                return _build(arg, value)
            if typing.get_origin(arg) is tuple and isinstance(value, list):
                return _build(arg, value)
        return value
    if dataclasses.is_dataclass(tp):
        hints = typing.get_type_hints(tp)
        fields = {f.name for f in dataclasses.fields(tp) if f.init}
        unknown = set(value) - fields
        if unknown:
            raise ValueError(f"{tp.__name__}: unknown fields {sorted(unknown)} in a saved config (older code?)")
        return tp(**{k: _build(hints[k], v) for k, v in value.items()})
    if origin is tuple and isinstance(value, list):
        args = typing.get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_build(args[0], v) for v in value)
        return tuple(_build(a, v) for a, v in zip(args, value, strict=True))
    return value


def run_from_dict(data: Mapping[str, Any]) -> RunConfig:
    """The :class:`RunConfig` of :meth:`RunConfig.to_dict` (e.g. a checkpoint's metadata)."""
    return _build(RunConfig, dict(data))


def config_hash(*parts: Any) -> str:
    """A short stable hash of JSON-able parts (cache keys)."""
    blob = json.dumps(parts, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


__all__ = ["ENVS", "WORDS_PREFIX", "EnvSpec", "QWEN_TOKENIZER_SIZE", "RunConfig", "TreeConfig", "WarmStart",
           "collect_preset", "config_hash", "full_capacity", "run_from_dict", "sized_collect"]
