"""The tree trainer: RAO and SERA end to end — grow trees → stage credit → CISPO step → log → evaluate → checkpoint.

``train_trees(run)`` trains a :class:`~agentjax.train.runconfig.RunConfig` whose method trains recursive trees
(``train.credit`` = :class:`~agentjax.train.config.RAOCredit` or its SERA variant
:class:`~agentjax.train.config.SERACredit`, ``run.tree`` set; :func:`agentjax.train.loop.train`
hands such runs here). It builds, as the flat loop does, the task lists, the tokenizer, the model (random init, an
HF checkpoint, or the cached warm start on the planner's trees, :mod:`agentjax.train.tree_warmstart`), the state
with its stage schedule (:class:`~agentjax.train.schedule.ScheduleState`) or the newest checkpoint that restores.
Each batch:

1. The stage of the schedule's step (:func:`~agentjax.train.schedule.stage_name`; RAO 1 : 0 : 0 trains execution
   only, RAO + D 12 : 4 : 0 also decomposition) and ``G = num_groups`` root tasks from the task stream.
2. ``K = group_size`` trees per root task (:func:`~agentjax.rollout.tree_collect.run_trees`: one policy call per
   turn over every live node of every tree, the env's shared world and judge, :mod:`agentjax.train.tree_worlds`),
   with SERA's rubric writing and grading (:attr:`~agentjax.train.runconfig.RunConfig.rubric_collect`: a child's
   reward is its rubric score; not at evaluation), as a :class:`~agentjax.rollout.tree_batch.TreeBatch` padded to
   ``micro_batch_size · 2^j`` rows (few shapes to compile) below ``train.rollout.capacity``.
3. The stage's per-row credit (:func:`agentjax.train.tree_credit.row_credit`: child labels (RAO) or rubric
   scores (SERA) and root outcomes, LOO over the K trees, the zero-variance filter, depth weights). SERA's rubric
   stage grows its trees with fork groups instead (:attr:`~agentjax.train.runconfig.RunConfig.fork_collect`) and
   trains one row per fork group's rubric completion with its ranking advantage
   (:mod:`agentjax.train.rubric_stage`).
4. One CISPO step on the stage's role tokens (:func:`agentjax.train.update.make_update`), which advances
   the schedule; a batch without a sampled row (every root task filtered) trains nothing and does not advance it
   (:func:`~agentjax.train.update.skip_batch`). More than ``tree.max_skipped_batches`` such batches stop the
   run (:class:`NoSignalError`): the policy gets no learning signal (warm start it).
5. One metrics line (``tree/`` root success, child label rate, nodes, depth histogram, invalid rate, rows;
   ``judge/`` calls and tokens; SERA's ``rubric/`` and ``grade/`` calls, tokens, failures and agreement;
   ``train/`` CISPO loss, ratio, clip fraction, grad norm; ``credit/``; ``schedule/``; ``time/`` the split) to
   ``metrics.jsonl`` / TensorBoard, and ``tree.saved_trees`` trees as JSON in ``<out_dir>/trees/<step>.json``
   (``agentjax trees --run DIR`` prints them).
6. After every ``eval_every``-th applied step and the last: root success of ``eval_seeds`` trees on each of the
   first ``eval_tasks`` eval tasks (:func:`evaluate_trees`), with ``eval_env_kwargs``, the key of
   :func:`~agentjax.train.eval.eval_key` (one per run) and per-tree-slot sampling streams: common random numbers
   across eval points and runs, as in :mod:`agentjax.train.eval`; outcomes in ``<out_dir>/eval/<step>.json``.
7. A checkpoint after every ``checkpoint_every``-th applied step and the last (orbax; the schedule's state is
   in it), so a resumed run reproduces the uninterrupted one's parameters and metrics lines (timings aside).

Steps: metrics lines, checkpoints and evaluation files are keyed by ``state.step``, the batches drawn; the run
ends once ``run.updates`` optimizer steps were applied (``state.schedule.step``), the schedule's total.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from agentjax.agents.tree import Tree
from agentjax.agents.tree_io import tree_to_dict
from agentjax.models import Qwen, Sampler
from agentjax.rollout.tree_collect import TreeRollouts, run_trees, to_tree_batch, tree_stats
from agentjax.rollout.tree_search import SearchConfig
from agentjax.train.checkpoint import Checkpointer
from agentjax.train.eval import eval_key
from agentjax.train.loop import build, task_stream
from agentjax.train.metrics import MetricsWriter, ProgressBar, StageTimer, update_metrics
from agentjax.train.rubric_stage import rubric_credit_rows, rubric_rows
from agentjax.train.runconfig import RunConfig
from agentjax.train.schedule import STAGES, StageSchedule, stage_name
from agentjax.train.state import TrainState, next_key, sync_model
from agentjax.train.tree_credit import row_credit
from agentjax.train.tree_worlds import make_judge, world_factory
from agentjax.train.update import UpdateBatch, check_nonfinite, make_update, skip_batch

log = logging.getLogger(__name__)

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


@dataclasses.dataclass
class TreeTrainer:
    """Everything a tree run holds while it trains (built by :func:`setup_trees`)."""

    run: RunConfig
    tokenizer: Any
    model: Qwen
    sampler: Sampler
    state: TrainState
    update: Any
    schedule: StageSchedule
    train_tasks: list
    eval_tasks: list
    checkpoints: Checkpointer
    resumed_from: int | None


def setup_trees(run: RunConfig, *, resume: bool = False) -> TreeTrainer:
    """Validate, then build the tree run (module docstring); the caller closes ``checkpoints``."""
    if run.tree is None:
        raise ValueError(f"train_trees: --method {run.train.credit.method} is not a tree method (RunConfig.tree)")
    b = build(run, resume=resume, schedule=True)
    tokenizer, model, tx, state = b.tokenizer, b.model, b.tx, b.state
    train_tasks, eval_tasks, checkpoints, resumed_from = b.train_tasks, b.eval_tasks, b.checkpoints, b.resumed_from
    return TreeTrainer(run=run, tokenizer=tokenizer, model=model, sampler=Sampler(model, tokenizer), state=state,
                       update=make_update(run.train, model, tx), schedule=stage_schedule(run),
                       train_tasks=train_tasks, eval_tasks=eval_tasks, checkpoints=checkpoints,
                       resumed_from=resumed_from)


# -- collection, evaluation, files -----------------------------------------------------------------------------------
def grow(run: RunConfig, tasks: Sequence[Any], policy: Any, key: jax.Array, *, evaluation: bool = False,
         task_indices: Sequence[int] | None = None, forks: Any = None, grader: Any = None) -> TreeRollouts:
    """The trees of ``tasks`` under the training (or, with ``evaluation``, the evaluation) settings; ``forks``:
    SERA's rubric-stage fork groups (:attr:`~agentjax.train.runconfig.RunConfig.fork_collect`). Evaluation runs
    without rubrics unless ``run.eval_search`` asks for rubric-guided search (graded by ``grader``, default the
    policy)."""
    config = run.eval_tree_collect if evaluation else run.tree_collect
    factory = world_factory(run.env, run.eval_kwargs if evaluation else run.env_kwargs, tokenizer=policy.tokenizer,
                            max_reply_tokens=config.max_response_tokens if config.constrained else None)
    search = SearchConfig(candidates=run.eval_search) if evaluation and run.eval_search else None
    rubrics = run.rubric_collect if search is not None or not evaluation else None  # eval: root outcomes only
    return run_trees(tasks, policy, factory, make_judge(run.env), config, key, task_indices=task_indices,
                     rubrics=rubrics, forks=forks, search=search, grader=grader)


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
    """Root success of ``run.eval_seeds`` trees per task (module docstring, 6), with :mod:`agentjax.train.eval`'s
    keys: ``success_rate`` (mean over seeds), ``success_std``, ``success_se``, ``success_seed<s>``,
    ``success/<task type or difficulty>``, the tree shape and label rates, ``seconds`` and ``outcomes``
    (``[tasks][seeds]`` 0/1, for paired comparisons); with ``run.eval_search`` also the ``search/`` statistics
    (``grader``: who writes and grades the rubrics, default the policy)."""
    rollouts = grow(run, tasks, policy, key, evaluation=True, task_indices=range(len(tasks)), grader=grader)
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


def _chosen(trees: Sequence[Tree], count: int, per_task: int) -> list[Tree]:
    """``count`` trees, the first tree of every task first, then the second, …"""
    order = sorted(range(len(trees)), key=lambda i: (i % per_task, i // per_task))
    return [trees[i] for i in order[:count]]


def save_trees(run: RunConfig, name: str, trees: Sequence[Tree], per_task: int, **info: Any) -> str | None:
    """``run.tree.saved_trees`` of ``trees`` to ``<out_dir>/trees/<name>.json`` (None when none are kept)."""
    if not run.tree.saved_trees:
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
    from agentjax.agents.tree_io import tree_from_dict

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


def _eval_point(t: TreeTrainer, step: int) -> dict[str, Any]:
    sync_model(t.model, t.state, copy=False)
    t.sampler.update_weights(t.model)
    evaluation, rollouts = evaluate_trees(t.run, t.eval_tasks, t.sampler, eval_key(t.run.train.seed))
    folder = os.path.join(t.run.out_dir, "eval")
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, f"{step}.json"), "w") as f:
        json.dump({"step": step, "optimizer_step": int(t.state.schedule.step),
                   "tasks": [task.task_id for task in t.eval_tasks], "outcomes": evaluation["outcomes"],
                   "success_rate": evaluation["success_rate"], "success_se": evaluation["success_se"]}, f)
    save_trees(t.run, f"eval_{step}", rollouts.trees, t.run.eval_seeds, step=step, evaluation=True)
    return evaluation


def _scalars(evaluation: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in evaluation.items() if k not in ("seconds", "outcomes")}


def _due(applied: bool, step: int, every: int, last: int) -> bool:
    return applied and bool(every) and (step % every == 0 or step == last)


# -- the loop --------------------------------------------------------------------------------------------------------
def train_trees(run: RunConfig, *, resume: bool = False, stop_after: int | None = None) -> dict[str, Any]:
    """Train the tree run ``run`` (module docstring). ``stop_after`` ends this call after that many batches (as an
    interruption would). Returns ``out_dir``, ``step`` (batches), ``optimizer_steps``, ``resumed_from``, ``last``
    (the last metrics line), ``last_eval``, ``seconds_per_update`` and ``params``."""
    t = setup_trees(run, resume=resume)
    cfg, ro, tree_cfg = run.train, run.train.rollout, run.tree
    start = int(t.state.step)
    writer = MetricsWriter(run.out_dir, tensorboard=run.tensorboard,
                           resume_step=start if t.resumed_from is not None else -1)
    last, last_eval, seconds, done = {}, {}, [], 0
    try:
        if start == 0 and run.eval_every and run.eval_at_start and (stop_after is None or stop_after > 0):
            t0 = time.perf_counter()
            last_eval = _eval_point(t, 0)
            writer.write(0, update_metrics(eval=_scalars(last_eval)) | {"time/eval": time.perf_counter() - t0})
        with ProgressBar(run.updates, completed=int(t.state.schedule.step),
                         description=f"{cfg.credit.method} {run.env}",
                         shown=("tree/root_success", "eval/success_rate", "train/loss"),
                         disable=not run.progress) as bar:
            while int(t.state.schedule.step) < run.updates and (stop_after is None or done < stop_after):
                timer = StageTimer()
                t0 = time.perf_counter()
                stage = stage_name(t.schedule, int(t.state.schedule.step))
                sync_model(t.model, t.state, copy=False)
                t.sampler.update_weights(t.model)
                idx = task_stream(len(t.train_tasks), cfg.seed, int(t.state.data_position), ro.num_groups)
                state, key = next_key(t.state)
                forks = run.fork_collect if stage == "rubric" else None
                rollouts = grow(run, [t.train_tasks[i] for i in idx], t.sampler, key, task_indices=idx, forks=forks)
                rows = sum(len(n.turns) for tree in rollouts.trees for n in tree.nodes)
                stats = tree_stats(rollouts)
                state = state.replace(data_position=state.data_position + 1)
                with timer("credit"):
                    if forks is None:
                        capacity = batch_capacity(rows, cfg.micro_batch_size, ro.rows)
                        steps = to_tree_batch(rollouts, run.tree_collect.replace(capacity=capacity))
                        credit = jax.block_until_ready(row_credit(steps, cfg.credit, stage,
                                                                  max_depth=tree_cfg.max_depth))
                        steps = steps.steps
                    else:  # SERA's rubric stage: one row per fork group's rubric completion
                        steps, capacity = _rubric_batch(run, rollouts, t.tokenizer)
                        credit = jax.block_until_ready(rubric_credit_rows(steps, cfg.credit,
                                                                          max_depth=tree_cfg.max_depth))
                        steps = steps.steps
                state, key = next_key(state)
                signal = bool(credit.sample.any())
                metrics = {}
                with timer("update"):
                    if signal:
                        state, metrics = t.update(state, UpdateBatch(steps, credit.advantage, row_mask=credit.sample,
                                                                     token_mask=credit.token_mask), None)
                        metrics = jax.block_until_ready(metrics)
                    else:
                        state = skip_batch(state)
                t.state = state
                step, opt_step = int(state.step), int(state.schedule.step)
                applied = signal and not float(metrics["skipped"])
                evaluation = {}
                if _due(applied, opt_step, run.eval_every, run.updates):
                    with timer("eval"):
                        evaluation = last_eval = _eval_point(t, step)
                with timer("trees"):
                    save_trees(run, str(step), rollouts.trees, ro.group_size, step=step, stage=stage,
                               optimizer_step=opt_step)
                record = update_metrics(train=metrics, credit=credit.stats, eval=_scalars(evaluation))
                record |= {k: float(v) for k, v in stats.items() if not k.startswith("time/")}
                record |= {"tree/rows": float(rows), "tree/capacity": float(capacity),
                           "schedule/stage": float(STAGES.index(stage)), "schedule/step": float(opt_step),
                           "schedule/skipped": float(state.schedule.skipped), "schedule/no_signal": float(not signal)}
                stop = None
                try:
                    if signal:
                        check_nonfinite(state, metrics, cfg)
                    if int(state.schedule.skipped) > tree_cfg.max_skipped_batches:
                        raise NoSignalError(
                            f"{int(state.schedule.skipped)} batches trained nothing (limit TreeConfig."
                            f"max_skipped_batches={tree_cfg.max_skipped_batches}): every root task's advantages "
                            "were equal (or a step was NaN/Inf); warm start the policy, or raise the limit")
                except RuntimeError as e:
                    stop = e
                if stop is None and (_due(applied, opt_step, run.checkpoint_every, run.updates)):
                    with timer("checkpoint"):
                        t.checkpoints.save(state, metadata={"run": run.to_dict()})
                timing = {k.removeprefix("time/").removesuffix("_s"): v for k, v in stats.items()
                          if k.startswith("time/")}
                timing["collect"] = timing.pop("total")
                timing |= timer.metrics()
                timing["total"] = time.perf_counter() - t0
                record |= {f"time/{k}": float(v) for k, v in timing.items()}
                last = writer.write(step, record)
                if stop is not None:
                    raise stop
                seconds.append(timing["total"])
                bar.advance(last, steps=int(applied))
                done += 1
    finally:
        writer.close()
        t.checkpoints.close()
    return {"out_dir": run.out_dir, "step": int(t.state.step), "optimizer_steps": int(t.state.schedule.step),
            "resumed_from": t.resumed_from, "last": last, "last_eval": last_eval,
            "seconds_per_update": float(np.mean(seconds)) if seconds else None, "params": t.state.params}


__all__ = ["NoSignalError", "TreeTrainer", "batch_capacity", "evaluate_trees", "grow", "load_trees", "save_trees",
           "saved_tree_files", "setup_trees", "stage_schedule", "train_trees"]
