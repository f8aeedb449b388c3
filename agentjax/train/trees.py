"""The tree methods, RAO and SERA, as an :class:`~agentjax.train.algorithm.Algorithm` of the trainer: grow trees →
stage credit → CISPO step, with tree evaluation and the saved trees.

A run trains recursive trees when ``run.tree`` is set and ``train.credit`` is
:class:`~agentjax.train.config.RAOCredit` or its SERA variant :class:`~agentjax.train.config.SERACredit`; the
model's warm start is the planner trees' (:mod:`agentjax.train.tree_warmstart`) and the state carries the stage
schedule (:class:`~agentjax.train.schedule.ScheduleState`). Each step of :class:`TreeAlgorithm`, in the trainer's
order:

1. ``collect``: the stage of the schedule's step (:func:`~agentjax.train.schedule.stage_name`; RAO 1 : 0 : 0 trains
   execution only, RAO + D 12 : 4 : 0 also decomposition) and ``K = group_size`` trees for each of the ``G =
   num_groups`` root tasks of the task stream (:func:`~agentjax.rollout.tree_collect.run_trees`: one policy call per
   turn over every live node of every tree, the env's shared world and judge, :mod:`agentjax.train.tree_worlds`),
   with SERA's rubric writing and grading (:attr:`~agentjax.train.runconfig.RunConfig.rubric_collect`: a child's
   reward is its rubric score; not at evaluation).
2. ``credit``: the trees as a :class:`~agentjax.rollout.tree_batch.TreeBatch` padded to ``micro_batch_size · 2^j``
   rows (few shapes to compile) below ``train.rollout.capacity`` and the stage's per-row credit
   (:func:`agentjax.train.tree_credit.row_credit`: child labels (RAO) or rubric scores (SERA) and root outcomes, LOO
   over the K trees, the zero-variance filter, depth weights). SERA's rubric stage grows its trees with fork groups
   instead (:attr:`~agentjax.train.runconfig.RunConfig.fork_collect`) and trains one row per fork group's rubric
   completion with its ranking advantage (:mod:`agentjax.train.rubric_stage`).
3. ``update``: one CISPO step on the stage's role tokens (:func:`agentjax.train.update.make_update`), which
   advances the schedule; a batch without a sampled row (every root task filtered) trains nothing and does not
   advance it (:func:`~agentjax.train.update.skip_batch`). More than ``tree.max_skipped_batches`` such batches
   stop the run (:class:`NoSignalError`): the policy gets no learning signal (warm start it).
4. The metrics line (``tree/`` root success, child label rate, nodes, depth histogram, invalid rate, rows;
   ``judge/`` calls and tokens; SERA's ``rubric/`` and ``grade/`` calls, tokens, failures and agreement; ``train/``
   CISPO loss, ratio, clip fraction, grad norm; ``credit/``; ``schedule/``; ``time/`` the split) and
   ``tree.saved_trees`` trees as JSON in ``<out_dir>/trees/<step>.json`` (``agentjax trees --run DIR`` prints them).

Evaluation: root success of ``eval_seeds`` trees on each eval task (:func:`evaluate_trees`), with
``eval_env_kwargs``, the key of :func:`~agentjax.train.eval.eval_key` (one per run) and per-tree-slot sampling
streams: common random numbers across eval points and runs, as in :mod:`agentjax.train.eval`; outcomes in
``<out_dir>/eval/<step>.json``.

Steps: metrics lines, checkpoints, evaluation and tree files are keyed by ``state.step``, the batches drawn; the run's
progress is the optimizer steps applied (``state.schedule.step``), and it ends at ``run.updates`` of them, the
schedule's total.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
import optax

from agentjax.agents.tree import Tree
from agentjax.agents.tree_io import tree_from_dict, tree_to_dict
from agentjax.models import Qwen
from agentjax.parallel import make_mesh
from agentjax.parallel.multihost import is_main, merge_tree_rollouts
from agentjax.rollout.batch import StepBatch
from agentjax.rollout.tree_collect import TreeRollouts, run_trees, tree_stats
from agentjax.rollout.tree_search import SearchConfig
from agentjax.train.algorithm import Algorithm, Evaluation
from agentjax.train.eval import eval_key
from agentjax.train.metrics import StageTimer, update_metrics
from agentjax.train.rubric_stage import rubric_credit_rows, rubric_rows
from agentjax.train.runconfig import RunConfig
from agentjax.train.schedule import STAGES, StageSchedule, stage_name
from agentjax.train.shares import Played, play_share, tree_batch
from agentjax.train.state import TrainState
from agentjax.train.tree_credit import RowCredit, row_credit
from agentjax.train.tree_worlds import make_judge, world_factory
from agentjax.train.update import UpdateBatch, check_nonfinite, make_update, skip_batch

TREES = "trees"


class NoSignalError(RuntimeError):
    """More batches than ``TreeConfig.max_skipped_batches`` trained nothing (no sampled row or a NaN/Inf step)."""


def stage_schedule(run: RunConfig) -> StageSchedule:
    """The run's stage schedule: the method's cycle (``RAOCredit.stages``) for ``run.updates`` optimizer steps."""
    return StageSchedule(*run.train.credit.stages, total_steps=run.updates)


def batch_capacity(rows: int, micro_batch_size: int, cap: int) -> int:
    """Rows of a batch holding ``rows`` node turns: ``micro_batch_size · 2^j`` (the smallest that fits), at most
    ``cap``; more rows than ``cap`` are an error."""
    if rows > cap:
        raise ValueError(f"a tree batch has {rows} node turns, more than train.rollout.capacity={cap}; raise it "
                         "(default: num_groups · group_size · tree.max_nodes · max_steps)")
    size = micro_batch_size
    while size < rows:
        size *= 2
    return min(size, cap)


# -- collection and evaluation ---------------------------------------------------------------------------------------
def grow(run: RunConfig, tasks: Sequence[Any], policy: Any, key: jax.Array, *, evaluation: bool = False,
         task_indices: Sequence[int] | None = None, forks: Any = None, grader: Any = None,
         tree_offset: int = 0) -> TreeRollouts:
    """The trees of ``tasks`` under the training (or, with ``evaluation``, the evaluation) settings; ``forks``:
    SERA's rubric-stage fork groups (:attr:`~agentjax.train.runconfig.RunConfig.fork_collect`). Evaluation runs
    without rubrics unless ``run.eval_search`` asks for rubric-guided search (graded by ``grader``, default the
    policy). ``tree_offset``: the batch's tree slot of the first tree (a process's share of the tasks)."""
    config = run.eval_tree_collect if evaluation else run.tree_collect
    factory = world_factory(run.env, run.eval_kwargs if evaluation else run.env_kwargs, tokenizer=policy.tokenizer,
                            max_reply_tokens=config.max_response_tokens if config.constrained else None)
    search = SearchConfig(candidates=run.eval_search) if evaluation and run.eval_search else None
    rubrics = run.rubric_collect if search is not None or not evaluation else None  # eval: root outcomes only
    return run_trees(tasks, policy, factory, make_judge(run.env), config, key, task_indices=task_indices,
                     rubrics=rubrics, forks=forks, search=search, grader=grader, tree_offset=tree_offset)


def _rubric_batch(run: RunConfig, rollouts: TreeRollouts, tokenizer: Any) -> tuple[Any, int]:
    """The rubric rows of a rubric-stage collection (:func:`~agentjax.train.rubric_stage.rubric_rows`), padded to
    ``micro_batch_size · 2^j`` rows, and that capacity."""
    forks, co = run.fork_collect, run.collect
    slots = run.train.rollout.num_groups * run.train.rollout.group_size * (forks.budget // forks.branches)
    micro = run.train.micro_batch_size
    capacity = batch_capacity(len(rollouts.forks), micro, -(-slots // micro) * micro)
    rows = rubric_rows(rollouts, forks, prompt_len=co.max_prompt_tokens, response_len=run.tree.rubric_tokens,
                       capacity=capacity, tokenizer=tokenizer, masked_logp=co.masked_logp,
                       max_allowed=co.max_allowed, stop_token_ids=co.sampling.stop_token_ids)
    return rows, capacity


def _kind(task: Any) -> str:
    return str(task.meta.get("task_type", task.meta.get("difficulty", "all")))


def evaluate_trees(run: RunConfig, tasks: Sequence[Any], policy: Any, key: jax.Array, *, grader: Any = None,
                   ) -> tuple[dict[str, Any], TreeRollouts]:
    """Root success of ``run.eval_seeds`` trees per task (module docstring, "Evaluation"), with
    :mod:`agentjax.train.eval`'s keys: ``success_rate`` (mean over seeds), ``success_std``, ``success_se``,
    ``success_seed<s>``, ``success/<task type or difficulty>``, the tree shape and label rates, ``seconds`` and
    ``outcomes`` (``[tasks][seeds]`` 0/1, for paired comparisons); with ``run.eval_search`` also the ``search/``
    statistics (``grader``: who writes and grades the rubrics, default the policy)."""
    rollouts = play_share(lambda t, i, first: grow(run, t, policy, key, evaluation=True, task_indices=i, grader=grader,
                                                   tree_offset=first),  # each process grows its share
                          tasks, range(len(tasks)), slots_per_task=run.eval_seeds, merge=merge_tree_rollouts).merged
    won_ts = np.array([bool(t.root_success) for t in rollouts.trees], np.float64).reshape(len(tasks), run.eval_seeds)
    per_seed, n = won_ts.mean(0), won_ts.size
    by_kind: dict[str, list[float]] = {}
    for task, row in zip(tasks, won_ts, strict=True):
        by_kind.setdefault(_kind(task), []).extend(row.tolist())
    stats = tree_stats(rollouts)
    out = {"success_rate": float(per_seed.mean()), "success_std": float(per_seed.std()),
           "success_se": float(won_ts.std(ddof=1) / np.sqrt(n)) if n > 1 else float("nan"),
           **{f"success_seed{s}": float(v) for s, v in enumerate(per_seed)},
           **{f"success/{k}": float(np.mean(v)) for k, v in sorted(by_kind.items())},
           **{k.removeprefix("tree/"): v for k, v in stats.items()
              if k.startswith("tree/") and k != "tree/root_success"},
           **({"search/groups": 0.0, "search/candidates": 0.0} if run.eval_search else {}),  # none delegated
           **{k: v for k, v in stats.items() if k.startswith("search/")},
           "trees": float(len(rollouts.trees)), "seconds": rollouts.total_seconds,
           "outcomes": won_ts.astype(int).tolist()}
    return out, rollouts


def _scalars(evaluation: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in evaluation.items() if k not in ("seconds", "outcomes")}


# -- saved trees -----------------------------------------------------------------------------------------------------
def _chosen(trees: Sequence[Tree], count: int, per_task: int) -> list[Tree]:
    """``count`` trees, the first tree of every task first, then the second, …"""
    order = sorted(range(len(trees)), key=lambda i: (i % per_task, i // per_task))
    return [trees[i] for i in order[:count]]


def save_trees(run: RunConfig, name: str, trees: Sequence[Tree], per_task: int, **info: Any) -> str | None:
    """``run.tree.saved_trees`` of ``trees`` to ``<out_dir>/trees/<name>.json`` (None when none are kept; written by
    JAX process 0)."""
    if not run.tree.saved_trees or not is_main():
        return None
    folder = os.path.join(run.out_dir, TREES)
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"{name}.json")
    with open(path, "w") as f:
        json.dump(info | {"trees": [tree_to_dict(t) for t in _chosen(trees, run.tree.saved_trees, per_task)]}, f)
    return path


def saved_tree_files(out_dir: str) -> dict[str, list[int]]:
    """The steps whose trees a run saved: ``{"train": [...], "eval": [...]}`` (ascending)."""
    folder = os.path.join(out_dir, TREES)
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"{out_dir} has no {TREES}/ folder: not a tree run, or no batch finished yet")
    names = [n.removesuffix(".json") for n in os.listdir(folder) if n.endswith(".json")]
    return {"train": sorted(int(n) for n in names if n.isdigit()),
            "eval": sorted(int(n.removeprefix("eval_")) for n in names if n.startswith("eval_")
                           and n.removeprefix("eval_").isdigit())}


def load_trees(out_dir: str, step: int | None = None, *, evaluation: bool = False) -> tuple[dict[str, Any], list[Tree]]:
    """The trees a run saved at batch ``step`` (default: the last) of training, or of the evaluation there:
    ``(info, trees)`` with ``info`` the file's other fields (step, stage, optimizer step)."""
    kind = "eval" if evaluation else "train"
    steps = saved_tree_files(out_dir)[kind]
    if not steps:
        raise FileNotFoundError(f"{out_dir}/{TREES} holds no {kind} trees")
    step = steps[-1] if step is None else step
    if step not in steps:
        raise FileNotFoundError(f"no {kind} trees saved at step {step} in {out_dir}/{TREES}; saved: {steps}")
    with open(os.path.join(out_dir, TREES, f"{'eval_' if evaluation else ''}{step}.json")) as f:
        data = json.load(f)
    return {k: v for k, v in data.items() if k != "trees"}, [tree_from_dict(d) for d in data["trees"]]


# -- the algorithm ---------------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class TreeStep:
    """One batch of a tree method: its stage and trees, then the credited rows."""

    stage: str  # the schedule's stage (schedule.STAGES)
    rollouts: TreeRollouts
    rows: int  # node turns grown
    stats: Mapping[str, Any]  # tree_stats of the trees (time/ keys: the collection's split)
    steps: StepBatch | None = None  # the trained rows: node turns, or the rubric stage's rubric completions
    capacity: int = 0  # rows of ``steps``
    credit: RowCredit | None = None
    signal: bool = False  # a row was sampled: the batch trains
    played: Played | None = None  # this process's share of the trees (several processes: its piece of the batch)


class TreeAlgorithm(Algorithm[TreeStep]):
    """RAO and SERA (module docstring): progress is the optimizer steps the stage schedule applied."""

    shown = ("tree/root_success", "eval/success_rate", "train/loss")
    schedule = True  # the state carries the stage schedule

    def __init__(self, run: RunConfig, model: Qwen, tokenizer: Any, tx: optax.GradientTransformation,
                 eval_tasks: list):
        if run.tree is None:
            raise ValueError(f"--method {run.train.credit.method} is not a tree method (RunConfig.tree)")
        self.run, self.tokenizer, self.eval_tasks = run, tokenizer, eval_tasks
        self.update_fn = make_update(run.train, model, tx)
        self.stages = stage_schedule(run)
        self.mesh = make_mesh(*run.mesh) if run.mesh else None  # several processes: where the batch is assembled

    def progress(self, state: TrainState) -> int:
        return int(state.schedule.step)

    def collect(self, state: TrainState, policy: Any, tasks: Sequence[Any], task_indices: Sequence[int],
                key: jax.Array) -> TreeStep:
        stage = stage_name(self.stages, int(state.schedule.step))
        forks = self.run.fork_collect if stage == "rubric" else None
        played = play_share(lambda t, i, first: grow(self.run, t, policy, key, task_indices=i, forks=forks,
                                                     tree_offset=first),  # each process grows its share
                            tasks, task_indices, slots_per_task=self.run.train.rollout.group_size,
                            merge=merge_tree_rollouts, allow_empty=False)
        rollouts = played.merged
        rows = sum(len(n.turns) for tree in rollouts.trees for n in tree.nodes)
        return TreeStep(stage, rollouts, rows, tree_stats(rollouts), played=played)

    def credit(self, state: TrainState, batch: TreeStep) -> TreeStep:
        run, cfg = self.run, self.run.train
        if batch.stage != "rubric":
            capacity = batch_capacity(batch.rows, cfg.micro_batch_size, cfg.rollout.rows)
            trees = tree_batch(batch.played, run.tree_collect.replace(capacity=capacity), self.mesh)
            credit = jax.block_until_ready(row_credit(trees, cfg.credit, batch.stage, max_depth=run.tree.max_depth))
            steps = trees.steps
        else:  # SERA's rubric stage: one row per fork group's rubric completion
            rubric, capacity = _rubric_batch(run, batch.rollouts, self.tokenizer)
            credit = jax.block_until_ready(rubric_credit_rows(rubric, cfg.credit, max_depth=run.tree.max_depth))
            steps = rubric.steps
        return dataclasses.replace(batch, steps=steps, capacity=capacity, credit=credit,
                                   signal=bool(credit.sample.any()))

    def update(self, state: TrainState, batch: TreeStep, key: jax.Array) -> tuple[TrainState, Mapping[str, Any]]:
        if not batch.signal:
            return skip_batch(state), {}
        credit = batch.credit  # one CISPO step in the batch's order: no key
        state, metrics = self.update_fn(state, UpdateBatch(batch.steps, credit.advantage, row_mask=credit.sample,
                                                           token_mask=credit.token_mask), None)
        return state, jax.block_until_ready(metrics)

    def evaluate(self, state: TrainState, policy: Any, step: int) -> Evaluation:
        """Root success on the eval tasks (:func:`evaluate_trees`); writes ``eval/<step>.json`` and the evaluation's
        trees (``trees/eval_<step>.json``)."""
        run = self.run
        evaluation, rollouts = evaluate_trees(run, self.eval_tasks, policy, eval_key(run.train.seed))
        folder = os.path.join(run.out_dir, "eval")
        if is_main():
            os.makedirs(folder, exist_ok=True)
            with open(os.path.join(folder, f"{step}.json"), "w") as f:
                json.dump({"step": step, "optimizer_step": int(state.schedule.step),
                           "tasks": [task.task_id for task in self.eval_tasks], "outcomes": evaluation["outcomes"],
                           "success_rate": evaluation["success_rate"], "success_se": evaluation["success_se"]}, f)
        save_trees(run, f"eval_{step}", rollouts.trees, run.eval_seeds, step=step, evaluation=True)
        return Evaluation(evaluation, {"eval": _scalars(evaluation)})

    def save(self, state: TrainState, batch: TreeStep, step: int, timer: StageTimer) -> None:
        with timer("trees"):
            save_trees(self.run, str(step), batch.rollouts.trees, self.run.train.rollout.group_size, step=step,
                       stage=batch.stage, optimizer_step=int(state.schedule.step))

    def record(self, state: TrainState, batch: TreeStep, metrics: Mapping[str, Any],
               evaluation: Evaluation) -> dict[str, Any]:
        record = update_metrics(train=metrics, credit=batch.credit.stats, eval=evaluation.sections.get("eval", {}))
        record |= {k: float(v) for k, v in batch.stats.items() if not k.startswith("time/")}
        schedule = state.schedule
        return record | {"tree/rows": float(batch.rows), "tree/capacity": float(batch.capacity),
                         "schedule/stage": float(STAGES.index(batch.stage)), "schedule/step": float(schedule.step),
                         "schedule/skipped": float(schedule.skipped), "schedule/no_signal": float(not batch.signal)}

    def check(self, state: TrainState, batch: TreeStep, metrics: Mapping[str, Any]) -> None:
        if batch.signal:
            check_nonfinite(state, metrics, self.run.train)
        limit = self.run.tree.max_skipped_batches
        if int(state.schedule.skipped) > limit:
            raise NoSignalError(f"{int(state.schedule.skipped)} batches trained nothing (limit TreeConfig."
                                f"max_skipped_batches={limit}): every root task's advantages were equal (or a step "
                                "was NaN/Inf); warm start the policy, or raise the limit")

    def timings(self, batch: TreeStep) -> dict[str, float]:
        timing = {k.removeprefix("time/").removesuffix("_s"): v for k, v in batch.stats.items()
                  if k.startswith("time/")}
        timing["collect"] = timing.pop("total")
        return timing

    def summary(self, state: TrainState) -> dict[str, Any]:
        return {"optimizer_steps": int(state.schedule.step)}


__all__ = ["TREES", "NoSignalError", "TreeAlgorithm", "TreeStep", "batch_capacity", "evaluate_trees", "grow",
           "load_trees", "save_trees", "saved_tree_files", "stage_schedule"]
