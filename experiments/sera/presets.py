"""Presets of the SERA experiments: RAO (recursive trees) vs flat single-agent GRPO on TextCraft-Synth, tiny.

Both arms are built so that they differ in the agent and its credit only:

- the same policy: the tiny tree preset's 2-layer Qwen3 with the real Qwen tokenizer
  (:func:`agentjax.train.presets.tiny_tree_arch`), initialised with the same seed;
- the same warm-start budget: 300 AdamW steps of 16 rows at 2e-3 on 128 demonstrations of the planner — RAO on the
  planner's *trees* (:mod:`agentjax.train.tree_warmstart`: node-turn rows, children included), GRPO on the
  planner's *flat* episodes (:mod:`agentjax.train.warmstart`); each arm's warm start is cached once and shared by
  its seeds;
- the same training budget: 10 optimizer steps, one per batch, of 2 root tasks × 4 rollouts (trees or flat
  episodes) from TextCraft-Synth's ``train_medium`` split (SERA's), Adam with the released betas, decay and clipping
  at the tiny learning rate 1e-3; constrained decoding over each world's admissible replies;
- the same evaluation: the first :data:`EVAL_TASKS` easy and medium validation tasks
  (``val_easy_medium``) × :data:`EVAL_SEEDS` sampled seeds at temperature 1, before the first update and after
  every 5th, with common random numbers across eval points (a run's own key, :func:`agentjax.train.eval.eval_key`);
  success is the root's success (the targets crafted and the root finished) or the flat episode's.

The budgets differ where the agents do: a flat episode has up to :data:`FLAT_STEPS` actions; a tree's root has 8
turns and may delegate to up to 15 children of 8 turns each (depth <= 2), so a tree may act more often than a flat
episode (the report logs both arms' turns per episode). The credit is each method's own (RAO: per-node labels,
leave-one-out over the 4 trees of a task, depth weights, CISPO; GRPO: the episode return normalised in its group,
the clipped PPO surrogate with GRPO's KL term).

SERA (``sera``) is RAO's tree and policy with SERA's rubrics (the tiny preset's SERA: :data:`agentjax.train.presets.
TINY_SERA`, two cycles of 3 execution, 1 decomposition and 1 rubric step, fork groups of 4 branches, the writer and
grader choosing among fixed rubrics and grades under constrained decoding); its warm start adds the reference
rubric and grade of every planner child to the planner trees' rows (its own cache). The ablation arms of
:data:`ARMS` (SERA w/o D, w/o RT, execution-only, RAO + D) change the schedule only and share their base method's
warm start.

:func:`smoke_run` is the pipeline in a few minutes (tiny warm start, 2 updates); :func:`sync_run` is a tree arm's
TextWorld-Sync tiny run (several agents on one shared world).
"""

from __future__ import annotations

import dataclasses
import os

from agentjax.train.config import ModelConfig
from agentjax.train.presets import RELEASED_ADAM, preset, tiny_tree_arch
from agentjax.train.runconfig import RunConfig, WarmStart

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")
ENV = "textcraft_synth"
# The arms: base method and the tiny schedule's cycle (execution : decomposition : rubric optimizer steps). The
# paper's ablations (SERA Table 3) scaled to 10 steps like TINY_SERA's 3 : 1 : 1 is the paper's 16 : 2 : 2: SERA w/o
# D drops the decomposition steps (16 : 0 : 2), w/o RT the rubric steps (16 : 2 : 0), execution-only keeps the rubric
# rewards and nothing else (1 : 0 : 0), RAO + D trains leaf coverage on RAO's verifier-labelled trees (12 : 4 : 0).
ARMS: dict[str, tuple[str, tuple[int, int, int]]] = {
    "rao": ("rao", (1, 0, 0)), "rao_d": ("rao", (3, 1, 0)), "sera": ("sera", (3, 1, 1)),
    "sera_wo_d": ("sera", (3, 0, 1)), "sera_wo_rt": ("sera", (3, 1, 0)), "sera_exec": ("sera", (1, 0, 0))}
METHODS = ("rao", "grpo", *(arm for arm in ARMS if arm != "rao"))
SEEDS = (0, 1, 2)
EVAL_SPLIT = "val_easy_medium"
EVAL_TASKS = 16
EVAL_SEEDS = 2
UPDATES = 10
EVAL_EVERY = 5
FLAT_STEPS = 40  # the flat agent's action budget (the tiny preset's TextCraft-Synth cap)
FLAT_LENS = (2048, 64)  # prompt / reply tokens of a flat turn (oracle prompts: median 821; longer ones cut on the left)
WARM_START = WarmStart(episodes=128, steps=300, batch_size=16, learning_rate=2e-3)


def _common(run: RunConfig, method: str, seed: int, results: str, updates: int | None) -> RunConfig:
    base = ARMS[method][0] if method in ARMS else method  # the arms of one base method share its warm start
    warm = dataclasses.replace(WARM_START, cache_dir=os.path.join(results, "runs", "warmstart", base))
    return run.replace(train=run.train.replace(seed=seed), eval_split=EVAL_SPLIT, eval_tasks=EVAL_TASKS,
                       eval_seeds=EVAL_SEEDS, updates=updates or UPDATES, eval_every=EVAL_EVERY,
                       checkpoint_every=EVAL_EVERY, progress=False, warm_start=warm,
                       out_dir=os.path.join(results, "runs", "tiny", method, f"seed{seed}"))


def tiny_run(method: str, seed: int, *, results: str = RESULTS, updates: int | None = None) -> RunConfig:
    """The tiny TextCraft-Synth run of ``method`` (``grpo`` or an arm of :data:`ARMS`) and training seed ``seed``
    (module docstring); ``out_dir`` ``results/runs/tiny/<method>/seed<seed>``."""
    if method in ARMS:
        base, stages = ARMS[method]
        run = preset("tiny", base, ENV)
        run = run.replace(train=run.train.replace(credit=dataclasses.replace(run.train.credit, stages=stages)))
        return _common(run, method, seed, results, updates)
    if method != "grpo":
        raise ValueError(f"the SERA tiny experiment compares {METHODS}, not {method!r}")
    run = preset("tiny", "grpo", ENV)
    tree = preset("tiny", "rao", ENV)
    train = run.train.replace(model=ModelConfig(tiny_tree_arch()), optimizer=tree.train.optimizer, mini_batches=1,
                              epochs=1)
    assert all(getattr(train.optimizer, k) == v for k, v in RELEASED_ADAM.items())
    sampling = dataclasses.replace(run.collect.sampling, prompt_bucket=512)
    run = run.replace(train=train, collect=run.collect.replace(sampling=sampling))
    ro = tree.train.rollout
    run = run.with_sizes(num_groups=ro.num_groups, group_size=ro.group_size, max_steps=FLAT_STEPS,
                         prompt_len=FLAT_LENS[0], response_len=FLAT_LENS[1])
    return _common(run, method, seed, results, updates)


def smoke_run(method: str, seed: int = 0, *, results: str = RESULTS) -> RunConfig:
    """2 updates (an arm with several stages: one per stage) from an 8-demonstration warm start of 4 steps, eval on
    2 tasks × 1 seed: the pipeline end to end."""
    stages = tuple(min(n, 1) for n in ARMS[method][1]) if method in ARMS else (1, 0, 0)
    run = tiny_run(method, seed, results=results, updates=max(2, sum(stages)))
    if method in ARMS and sum(stages) > 1:  # every stage of the arm once; a 4-step warm start rarely wins a root, so
        # the zero-variance filter would skip every decomposition and rubric batch
        credit = dataclasses.replace(run.train.credit, stages=stages, filter_zero_variance=False)
        run = run.replace(train=run.train.replace(credit=credit))
    return run.replace(eval_every=1, eval_tasks=2, eval_seeds=1, checkpoint_every=1,
                       out_dir=os.path.join(results, "runs", "smoke", method, f"seed{seed}"),
                       warm_start=WarmStart(episodes=8, steps=4, batch_size=8, learning_rate=2e-3,
                                            cache_dir=os.path.join(results, "runs", "smoke", "warmstart", method)))


def sync_run(seed: int = 0, *, method: str = "rao", results: str = RESULTS, updates: int = 5) -> RunConfig:
    """TextWorld-Sync's tiny run of a tree arm of :data:`ARMS` (default RAO): the tiny tree preset (2 tasks × 4
    trees, 20 turns a node, the released training budget of 100 shared world steps a tree; evaluation with each
    task's own budget on 8 validation tasks × 2 trees), ``updates`` optimizer steps (5 by default: one cycle of
    SERA's 3 : 1 : 1, so each of its stages steps once), its base method's own planner-tree warm start on
    TextWorld-Sync."""
    if method not in ARMS:
        raise ValueError(f"the TextWorld-Sync run trains a tree arm of {tuple(ARMS)}, not {method!r}")
    base, stages = ARMS[method]
    run = preset("tiny", base, "textworld_sync")
    credit = dataclasses.replace(run.train.credit, stages=stages)
    warm = dataclasses.replace(WARM_START, cache_dir=os.path.join(results, "runs", "warmstart", f"{base}_sync"))
    return run.replace(train=run.train.replace(seed=seed, credit=credit), updates=updates, eval_every=updates,
                       checkpoint_every=updates, progress=False, warm_start=warm, eval_split="validation",
                       out_dir=os.path.join(results, "runs", "sync", method, f"seed{seed}"))


__all__ = ["ARMS", "ENV", "EVAL_SEEDS", "EVAL_SPLIT", "EVAL_TASKS", "METHODS", "RESULTS", "SEEDS", "smoke_run",
           "sync_run", "tiny_run"]
