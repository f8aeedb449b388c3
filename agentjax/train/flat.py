"""The flat methods (one agent per episode: GRPO, RLOO, PPO, GiGPO, HGPO, GraphGPO, CRBC, each with or without SERO)
as an :class:`~agentjax.train.algorithm.Algorithm` of the trainer.

Each step of :class:`FlatAlgorithm`, in the trainer's order:

1. ``collect``: ``G = num_groups`` tasks × ``group_size`` episodes in the env pool
   (:func:`~agentjax.rollout.collect.run_episodes` with ``RunConfig.train_collect``), their
   :class:`~agentjax.rollout.batch.StepBatch` and statistics (time: env / generate / prompt from ``RolloutStats``).
2. ``credit``: :func:`~agentjax.train.advantages.compute_advantages` of ``train.credit`` (PPO: the value head's
   values first), blocked until ready (time: credit).
3. ``after_credit``: SERO's oracle branch (``train.sero``: :class:`~agentjax.train.sero.SeroBranch`, from the
   collection key and the behaviour parameters, before the update; time: sero), and where the env has a known
   model (envs/mdp) and an evaluation follows the step, the batch's credit accuracy against the behaviour policy's
   exact A^π (:mod:`agentjax.train.exact`; ``credit/pearson``, ``credit/sign_agreement``; time: exact).
4. ``update``: :func:`~agentjax.train.update.make_update`'s step with the step's key (and SERO's oracle rows);
   :func:`~agentjax.train.update.check_nonfinite` then logs a NaN/Inf update (skipped by ``update``, parameters
   unchanged) and stops the run with ``NonFiniteUpdateError`` after ``train.max_nonfinite_updates`` skips.
5. The metrics line: ``rollout/`` success, per-task-type success, returns, invalid rate, episode length, …;
   ``train/`` loss, KL, entropy, clip fraction, grad norm, lr, skips; ``credit/`` advantage statistics; ``sero/``;
   ``eval/``, ``held_out/`` and ``exact/`` when evaluated.

Evaluation (:mod:`agentjax.train.eval`): ``eval_seeds`` episodes of each eval task in the evaluation pool
(``eval_env_kwargs``), with the run's one evaluation key (common random numbers across eval points; evaluation
never changes the training numbers), the eval MDPs' exact success where the env has a known model, and with
``RunConfig.held_out_tasks`` a second series on the env's held-out split. Per-episode outcomes go to
``<out_dir>/eval/<step>.json`` (the second series to ``eval/held_out/<step>.json``).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import optax

from agentjax.models import Qwen
from agentjax.parallel import make_mesh
from agentjax.parallel.multihost import is_main
from agentjax.rollout.batch import StepBatch
from agentjax.rollout.records import Rollouts
from agentjax.rollout.stats import RolloutStats, summarize
from agentjax.train.advantages import Advantages, compute_advantages
from agentjax.train.algorithm import Algorithm, Evaluation
from agentjax.train.eval import eval_key, evaluate
from agentjax.train.exact import exact_probe, exact_scalars
from agentjax.train.metrics import StageTimer, update_metrics
from agentjax.train.runconfig import RunConfig
from agentjax.train.sero import SeroBranch
from agentjax.train.shares import flat_batch, play_episodes
from agentjax.train.state import TrainState
from agentjax.train.update import UpdateBatch, check_nonfinite, make_update, make_value_fn
from envs.pool import EnvPool, SerialPool

HELD_OUT = "held_out"  # the second evaluation series (RunConfig.held_out_tasks): eval/held_out/, held_out/ metrics


# -- env pools and task lists ----------------------------------------------------------------------------------------
def make_pool(run: RunConfig, *, evaluation: bool = False) -> SerialPool | EnvPool:
    """The env pool of the training batches (``env_kwargs``; also evaluation's when its kwargs are the same) or,
    with ``evaluation``, of evaluation only (``eval_env_kwargs``)."""
    kwargs = run.eval_kwargs if evaluation else run.env_kwargs
    slots = run.eval_slots if evaluation else run.slots
    make_env = functools.partial(run.spec.env_class(), **kwargs)
    if run.workers == 0:
        return SerialPool(make_env, slots)
    return EnvPool(make_env, slots, run.workers)


def make_eval_pool(run: RunConfig, pool: SerialPool | EnvPool) -> SerialPool | EnvPool:
    """``pool`` where evaluation runs the env with the training kwargs, else a pool of its own."""
    if not run.eval_every or run.eval_kwargs == dict(run.env_kwargs):
        return pool
    return make_pool(run, evaluation=True)


def held_out_tasks(run: RunConfig) -> list:
    """The first ``RunConfig.held_out_tasks`` tasks of the env's eval split (the second evaluation series)."""
    if not (run.eval_every and run.held_out_tasks):
        return []
    tasks = run.spec.tasks(run.spec.eval_split)
    if run.held_out_tasks > len(tasks):
        raise ValueError(f"RunConfig.held_out_tasks={run.held_out_tasks} but {run.env} {run.spec.eval_split} has "
                         f"{len(tasks)} tasks")
    return tasks[:run.held_out_tasks]


# -- metrics and files -----------------------------------------------------------------------------------------------
def _rollout_scalars(stats: RolloutStats) -> dict[str, float]:
    """The collector's statistics without its timings (those go to ``time/``)."""
    return {k: float(v) for k, v in stats.as_dict(prefix="").items() if not k.endswith("_seconds")}


def _eval_scalars(evaluation: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in evaluation.items() if k not in ("seconds", "outcomes", "exact")}


def save_outcomes(run: RunConfig, tasks: Sequence[Any], step: int, evaluation: Mapping[str, Any],
                  series: str = "") -> None:
    """``<out_dir>/eval/<step>.json``: the per-episode outcomes ``[task][seed]`` with the task ids, for paired
    comparisons between eval points and runs (the same episodes and keys: :mod:`agentjax.train.eval`); a second
    ``series`` (``held_out``) goes to ``eval/<series>/<step>.json``. Written by JAX process 0."""
    if not is_main():
        return
    folder = os.path.join(run.out_dir, "eval", series)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, f"{step}.json"), "w") as f:
        json.dump({"step": step, "tasks": [t.task_id for t in tasks], "outcomes": evaluation["outcomes"],
                   "success_rate": evaluation["success_rate"], "success_se": evaluation["success_se"]}
                  | ({"exact": evaluation["exact"]} if "exact" in evaluation else {}), f)


# -- the algorithm ---------------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class FlatStep:
    """One step of a flat method: what was collected, then its credit and SERO's oracle rows."""

    rollouts: Rollouts
    key: jax.Array  # the collection key (SERO's branch draws from it)
    steps: StepBatch
    stats: RolloutStats
    adv: Advantages | None = None
    oracle: Any = None  # SERO's OracleRows, the UpdateBatch's oracle rows
    sero_metrics: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    exact_credit: Mapping[str, float] = dataclasses.field(default_factory=dict)  # credit accuracy (envs/mdp)


class FlatAlgorithm(Algorithm[FlatStep]):
    """The flat methods (module docstring). Holds the env pools (closed by :meth:`close`), the jitted update (and
    PPO's value function), SERO's branch and the exact probe where the run has them."""

    shown = ("rollout/success_rate", "eval/success_rate", "train/loss", "train/kl")

    def __init__(self, run: RunConfig, model: Qwen, tokenizer: Any, tx: optax.GradientTransformation,
                 eval_tasks: list):
        self.run, self.eval_tasks = run, eval_tasks
        self.mesh = make_mesh(*run.mesh) if run.mesh else None  # several processes: where the batch is assembled
        self.pool = make_pool(run)
        self.eval_pool = None  # evaluation's pool where eval_env_kwargs differ (None: `pool`)
        try:
            eval_pool = make_eval_pool(run, self.pool)
            self.eval_pool = None if eval_pool is self.pool else eval_pool
            self.sero = None  # SERO's oracle branch (TrainConfig.sero)
            if run.train.sero is not None:
                self.sero = SeroBranch(run.train, run.train_collect, model, tokenizer, self.pool, run.branch_slots)
            self.update_fn = make_update(run.train, model, tx)
            self.value_fn = make_value_fn(run.train, model) if run.train.is_ppo else None
            self.held_out_tasks = held_out_tasks(run)
            # exact evaluation and credit accuracy on a known model (agentjax.train.exact; envs/mdp)
            self.exact = exact_probe(run, tokenizer, eval_tasks, model)
        except BaseException:
            self.close()
            raise

    @property
    def evaluation_pool(self) -> SerialPool | EnvPool:
        return self.pool if self.eval_pool is None else self.eval_pool

    def collect(self, state: TrainState, policy: Any, tasks: Sequence[Any], task_indices: Sequence[int],
                key: jax.Array) -> FlatStep:
        run = self.run  # each process plays its share of the groups (agentjax.train.shares; one process: all)
        played = play_episodes(self.pool, tasks, policy, run.train_collect, key, task_indices=task_indices,
                               allow_empty=False)
        steps = flat_batch(played, run.train_collect, run.train.rollout, self.mesh)
        return FlatStep(played.merged, key, steps, summarize(played.merged))

    def credit(self, state: TrainState, batch: FlatStep) -> FlatStep:
        values = self.value_fn(state, batch.steps) if self.value_fn is not None else None
        adv = compute_advantages(self.run.train.credit, batch.steps, self.run.train.rollout, values=values,
                                 check=jax.process_count() == 1)  # several: flat_batch checked each piece
        return dataclasses.replace(batch, adv=jax.block_until_ready(adv))

    def after_credit(self, state: TrainState, batch: FlatStep, timer: StageTimer, *, evaluating: bool) -> FlatStep:
        if self.sero is not None:  # after the base advantages, with the behaviour parameters (before the update)
            with timer("sero"):
                rows, sero_metrics, *_ = self.sero.branch(state.params, batch.rollouts, batch.key)
            batch = dataclasses.replace(batch, oracle=rows, sero_metrics=sero_metrics)
        if self.exact is not None and evaluating:
            with timer("exact"):  # the behaviour parameters' exact A^π, before the update donates them
                batch = dataclasses.replace(batch, exact_credit=self.exact.credit(state.params, batch.rollouts,
                                                                                  batch.adv))
        return batch

    def update(self, state: TrainState, batch: FlatStep, key: jax.Array) -> tuple[TrainState, Mapping[str, Any]]:
        state, metrics = self.update_fn(state, UpdateBatch.of(batch.steps, batch.adv, oracle=batch.oracle), key)
        return state, jax.block_until_ready(metrics)

    def evaluate(self, state: TrainState, policy: Any, step: int) -> Evaluation:
        """The eval tasks (with the exact success where the env has a known model) and, with
        ``RunConfig.held_out_tasks``, the held-out series; saves both series' outcomes."""
        run, key = self.run, eval_key(self.run.train.seed)
        evaluation = evaluate(self.evaluation_pool, self.eval_tasks, policy, run.eval_collect, key,
                              task_indices=range(len(self.eval_tasks)))
        if self.exact is not None:  # the eval tasks' exact success (agentjax.train.exact)
            evaluation["exact"] = self.exact.evaluate(state.params)
        save_outcomes(run, self.eval_tasks, step, evaluation)
        held_out = {}
        if self.held_out_tasks:
            held_out = evaluate(self.evaluation_pool, self.held_out_tasks, policy, run.eval_collect, key,
                                task_indices=range(len(self.held_out_tasks)))
            save_outcomes(run, self.held_out_tasks, step, held_out, series=HELD_OUT)
        return Evaluation(evaluation, {"eval": _eval_scalars(evaluation), HELD_OUT: _eval_scalars(held_out),
                                       "exact": exact_scalars(evaluation)})

    def record(self, state: TrainState, batch: FlatStep, metrics: Mapping[str, Any],
               evaluation: Evaluation) -> dict[str, Any]:
        evaluated = {"eval": {}, HELD_OUT: {}, "exact": {}} | dict(evaluation.sections)
        return update_metrics(train=metrics, rollout=_rollout_scalars(batch.stats),
                              credit=batch.adv.stats | batch.exact_credit, eval=evaluated["eval"],
                              held_out=evaluated[HELD_OUT], sero=batch.sero_metrics, exact=evaluated["exact"])

    def check(self, state: TrainState, batch: FlatStep, metrics: Mapping[str, Any]) -> None:
        check_nonfinite(state, metrics, self.run.train)

    def timings(self, batch: FlatStep) -> dict[str, float]:
        stats = batch.stats
        return {"env": stats.env_seconds, "generate": stats.generate_seconds, "prompt": stats.prompt_seconds}

    def close(self) -> None:
        self.pool.close()
        if self.eval_pool is not None:
            self.eval_pool.close()


__all__ = ["HELD_OUT", "FlatAlgorithm", "FlatStep", "held_out_tasks", "make_eval_pool", "make_pool", "save_outcomes"]
