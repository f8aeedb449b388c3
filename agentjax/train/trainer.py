"""The trainer: one loop for every method — collect → credit → update → log → evaluate → checkpoint, resumable to the
same numbers.

``train(run)`` validates the :class:`~agentjax.train.runconfig.RunConfig` (values, then the machine), then builds,
in this order, the task lists, the tokenizer, the model (random init with ``train.seed``, an HF checkpoint, or the
cached supervised warm start, :mod:`agentjax.train.warmstart`; on ``run.mesh`` with the FSDP × TP rules), the
state (or the newest checkpoint that restores, with ``resume=True``), the method's
:class:`~agentjax.train.algorithm.Algorithm` — :class:`~agentjax.train.trees.TreeAlgorithm` for a run that trains
recursive trees (``run.tree``: RAO, SERA), else :class:`~agentjax.train.flat.FlatAlgorithm` (its env pools, SERO's
branch) — and the sampler. Each step (:meth:`Trainer.step`):

1. ``sync_model`` → the sampler's weights; the batch's tasks are ``task_stream(seed, data_position)``.
2. The algorithm collects them with a key from the state's stream; ``data_position + 1``.
3. Its credit (time: credit) and its own stages before the update (SERO's branch, the exact credit probe).
4. Its update with a fresh key (time: update).
5. Evaluation after a step that brings the algorithm's progress (:meth:`~agentjax.train.algorithm.Algorithm.progress`:
   updates of a flat method, applied optimizer steps of a tree method) to a multiple of ``eval_every`` or to
   ``run.updates`` (time: eval; one key per run, from the seed only: common random numbers across eval points, and
   evaluation never changes the training numbers); with ``eval_at_start`` a run that starts from scratch first
   evaluates the initial policy and logs it as step 0 (``eval/`` only). Then the algorithm's per-step files.
6. One metrics line (the algorithm's sections and ``time/`` the split) to ``metrics.jsonl`` and TensorBoard, and
   the progress bar. The algorithm's check runs first: a NaN/Inf update was skipped by the update (parameters
   unchanged), is logged, and the run stops (``NonFiniteUpdateError``) after ``train.max_nonfinite_updates`` skips;
   a tree run also stops after ``tree.max_skipped_batches`` batches without signal (``NoSignalError``) — the
   metrics line of the stopping step is written first, its checkpoint is not.
7. A checkpoint on the evaluation's rule with ``checkpoint_every`` (metadata: the run config).

Metrics lines, checkpoints and evaluation files are keyed by ``state.step`` (the batches drawn); the run ends once
the algorithm's progress reaches ``run.updates``.

Reproducibility. Every random draw comes from ``state.rng`` through ``next_key`` (collection, update order) or from
(seed, step) (evaluation); the task stream is a pure function of (seed, data_position); the state and the stream
position are in the checkpoint. So a run stopped after a checkpoint and resumed reproduces the uninterrupted run's
parameters and metrics lines exactly (timings aside) — tests/train/test_trainer_flat.py and test_trainer_trees.py
check it. On resume a corrupt newest checkpoint is reported (``CorruptCheckpointWarning``) and the previous one used;
``metrics.jsonl`` is cut back to the restored step. A resumed run must have the same train / env / collector config
as the checkpoint (checked; the schedule, ``updates`` and ``out_dir`` may change). Without ``resume`` an ``out_dir``
that already holds checkpoints is an error, never silently overwritten.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
import time
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
import optax
from flax import nnx

from agentjax.models import Qwen, Sampler, load_hf
from agentjax.parallel import create_sharded, fsdp_tp, make_mesh, param_shardings
from agentjax.parallel.global_batch import host_local_model, host_local_params
from agentjax.parallel.multihost import is_main, local_key
from agentjax.parallel.rules import activation_sharding
from agentjax.rollout.collect import CollectConfig
from agentjax.train.algorithm import NO_EVALUATION, Algorithm, Evaluation
from agentjax.train.checkpoint import Checkpointer, run_folder_lock
from agentjax.train.config import OptimizerConfig, TrainConfig
from agentjax.train.flat import FlatAlgorithm
from agentjax.train.metrics import MetricsWriter, ProgressBar, StageTimer, update_metrics
from agentjax.train.runconfig import RunConfig
from agentjax.train.shares import check_processes
from agentjax.train.state import TrainState, init_state, make_optimizer, next_key, sync_model
from agentjax.train.tokenizers import run_tokenizer
from agentjax.train.trees import TreeAlgorithm
from agentjax.train.warmstart import initial_policy, warm_start_folder

log = logging.getLogger(__name__)

CHECKPOINTS = "checkpoints"
RUN_CONFIG = "run_config.json"
INITIAL_POLICY = "initial_policy.json"  # what RL started from (agentjax.train.warmstart.initial_policy)
# Keys of the config that a resumed run must share with its checkpoint (the rest is schedule and files).
RESUME_KEYS = ("train", "env", "env_kwargs", "collect", "warm_start", "tokenizer", "tree", "train_pool")


# -- the task stream -----------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=4)
def _epoch_order(num_tasks: int, seed: int, epoch: int) -> np.ndarray:
    return np.random.default_rng((seed, epoch)).permutation(num_tasks)


def task_stream(num_tasks: int, seed: int, position: int, count: int) -> list[int]:
    """Task indices of batch ``position`` (``count`` tasks): positions ``position·count …`` of the stream that
    visits the split in a fresh permutation per epoch (seeded by ``(seed, epoch)``)."""
    if count > num_tasks:
        raise ValueError(f"a batch of {count} groups needs {count} tasks; the split has {num_tasks}")
    idx = range(position * count, (position + 1) * count)
    return [int(_epoch_order(num_tasks, seed, i // num_tasks)[i % num_tasks]) for i in idx]


# -- building ------------------------------------------------------------------------------------------------------
def algorithm_class(run: RunConfig) -> type[FlatAlgorithm] | type[TreeAlgorithm]:
    """The algorithm that trains ``run``: recursive trees where ``run.tree`` is set (RAO, SERA), else flat."""
    return TreeAlgorithm if run.tree is not None else FlatAlgorithm


def build_model(run: RunConfig, tokenizer: Any, mesh: jax.sharding.Mesh | None) -> Qwen:
    """The policy before RL: warm start (cached), HF checkpoint or random init (``train.seed``), on ``mesh``."""
    arch, rules = run.train.model.arch, fsdp_tp()
    folder = warm_start_folder(run, tokenizer) if run.warm_start is not None else run.train.model.checkpoint
    if folder is not None:
        if mesh is None:
            return load_hf(folder, config=arch)
        return load_hf(folder, config=arch, shardings=lambda s: param_shardings(s, rules, mesh),
                       act_sharding=activation_sharding(rules, mesh))
    if mesh is None:
        return Qwen(arch, rngs=nnx.Rngs(run.train.seed))
    return create_sharded(arch, rules, mesh, seed=run.train.seed)


@functools.lru_cache(maxsize=8)
def optimizer(config: OptimizerConfig) -> optax.GradientTransformation:
    """One optimizer object per config: ``make_update`` caches its compiled update on it, so runs of a process
    with the same config (a sweep, a resumed run) compile the update once."""
    return make_optimizer(config)


def _flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(d, Mapping):
        out = {}
        for k, v in d.items():
            out |= _flatten(v, f"{prefix}{k}.")
        return out
    return {prefix[:-1]: d}


class ResumeMismatch(ValueError):
    """A resumed run's config differs from its checkpoint's (:func:`check_resumable`)."""


def check_resumable(run: RunConfig, saved: Mapping[str, Any], path: str) -> None:
    """Raise :class:`ResumeMismatch` unless ``run`` may resume the checkpoint at ``path`` saved with the run config
    ``saved`` (:data:`RESUME_KEYS` equal; a nested field the checkpoint predates compares at its default)."""
    defaults = {f.name: f.default for f in dataclasses.fields(RunConfig)}  # keys older checkpoints did not save
    mine, theirs = _flatten({k: run.to_dict()[k] for k in RESUME_KEYS}), _flatten(
        {k: saved.get(k, defaults.get(k)) for k in RESUME_KEYS})
    # nested fields that older code did not have (and so did not save) compare at their defaults
    fresh = _flatten({"train": TrainConfig().to_dict(), "collect": dataclasses.asdict(CollectConfig())})
    diff = [k for k in sorted(set(mine) | set(theirs)) if mine.get(k) != theirs.get(k, fresh.get(k))]
    if diff:
        shown = "; ".join(f"{k}: checkpoint {theirs.get(k)!r} vs now {mine.get(k)!r}" for k in diff[:5])
        raise ResumeMismatch(f"cannot resume from {path}: the run config differs ({shown}); resume with the same "
                             "config or start a new out_dir")


def _existing_steps(directory: str) -> list[str]:
    return [n for n in os.listdir(directory) if n.isdigit()] if os.path.isdir(directory) else []


def train_split_tasks(run: RunConfig) -> list:
    """The tasks the task stream draws from: the train split (its first ``train_pool`` tasks where set)."""
    spec = run.spec
    tasks = spec.tasks(spec.train_split)
    if run.train_pool > len(tasks):
        raise ValueError(f"RunConfig.train_pool={run.train_pool} but {run.env} {spec.train_split} has "
                         f"{len(tasks)} tasks")
    tasks = tasks[:run.train_pool or None]
    if run.train.rollout.num_groups > len(tasks):
        raise ValueError(f"{run.train.rollout.num_groups} groups per batch need as many tasks; {run.env} "
                         f"{spec.train_split} has {len(tasks)}")
    return tasks


def eval_split_tasks(run: RunConfig) -> list:
    """The eval tasks: the first ``eval_tasks`` of the evaluation split (none without ``eval_every``)."""
    if not run.eval_every:
        return []
    tasks = run.spec.tasks(run.evaluation_split)
    if run.eval_tasks > len(tasks):
        raise ValueError(f"RunConfig.eval_tasks={run.eval_tasks} but {run.env} {run.evaluation_split} has "
                         f"{len(tasks)} tasks")
    return tasks[:run.eval_tasks]


@dataclasses.dataclass
class Built:
    """What every run builds before its algorithm (:func:`build`)."""

    tokenizer: Any
    model: Qwen
    tx: optax.GradientTransformation
    state: TrainState
    train_tasks: list
    eval_tasks: list
    checkpoints: Checkpointer
    resumed_from: int | None


def build(run: RunConfig, *, resume: bool = False, schedule: bool = False) -> Built:
    """Validate, then build what every run holds: the task lists, the tokenizer, the model (random init, an HF
    checkpoint or the cached warm start), the optimizer, the state (with the stage schedule's when ``schedule``) or
    the newest checkpoint that restores; writes ``initial_policy.json`` (what RL starts from) and, once the state is
    settled (a resumed run's config checked against its checkpoint's), ``run_config.json``. The caller closes
    ``checkpoints``."""
    run.check()
    ckpt_dir = os.path.join(run.out_dir, CHECKPOINTS)
    if not resume and _existing_steps(ckpt_dir):
        raise FileExistsError(f"{ckpt_dir} already holds checkpoints; pass resume=True (--resume) to continue that run "
                              "or choose another out_dir")
    train_tasks, eval_tasks = train_split_tasks(run), eval_split_tasks(run)
    tokenizer = run_tokenizer(run.tokenizer)
    if len(tokenizer) > run.train.model.arch.vocab_size:
        raise ValueError(f"the tokenizer has {len(tokenizer)} tokens, more than the model's vocabulary "
                         f"({run.train.model.arch.vocab_size}); raise train.model.arch.vocab_size")

    os.makedirs(run.out_dir, exist_ok=True)
    mesh = make_mesh(*run.mesh) if run.mesh else None
    model = build_model(run, tokenizer, mesh)
    started = os.path.join(run.out_dir, INITIAL_POLICY)
    # a resumed run keeps its record: its weights come from its checkpoint, whatever warm start a rebuild would give;
    # process 0 writes the run folder's files (one folder on storage all hosts share)
    if is_main() and not (resume and _existing_steps(ckpt_dir) and os.path.exists(started)):
        with open(started, "w") as f:
            json.dump(initial_policy(run), f, indent=1)
    tx = optimizer(run.train.optimizer)
    state = init_state(run.train, model, jax.random.key(run.train.seed), tx, schedule=schedule)
    checkpoints = Checkpointer(ckpt_dir, max_to_keep=run.keep_checkpoints)
    resumed_from = None
    if resume:
        try:
            restored = checkpoints.restore_latest(state)
            if restored is not None:
                check_resumable(run, restored.metadata.get("run", {}), restored.path)
        except BaseException:
            checkpoints.close()
            raise
        if restored is not None:
            state, resumed_from = restored.state, restored.step
            log.info("resumed from %s (step %d)", restored.path, restored.step)
        else:
            log.info("resume: %s holds no checkpoint; training from the start", ckpt_dir)
    if is_main():
        with open(os.path.join(run.out_dir, RUN_CONFIG), "w") as f:
            json.dump(run.to_dict(), f, indent=1)
    return Built(tokenizer, model, tx, state, train_tasks, eval_tasks, checkpoints, resumed_from)


# -- the trainer ---------------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class StepRecord:
    """What one step of the loop leaves (:meth:`Trainer.step`)."""

    step: int  # state.step after it: the metrics line's step
    line: dict[str, Any]  # the metrics line, time/ included
    evaluation: Evaluation | None  # the evaluation point after it, if one was due
    advanced: bool  # the algorithm's progress moved (a counted step)
    seconds: float  # wall-clock seconds of the step
    stop: RuntimeError | None  # the algorithm's reason to stop the run after logging the step


def _due(advanced: bool, progress: int, every: int, last: int) -> bool:
    return advanced and bool(every) and (progress % every == 0 or progress == last)


@dataclasses.dataclass
class Trainer:
    """Everything a run holds while it trains (built by :func:`setup`) and the loop (module docstring)."""

    run: RunConfig
    algorithm: Algorithm
    tokenizer: Any
    model: Qwen
    sampler: Sampler
    state: TrainState
    train_tasks: list
    eval_tasks: list
    checkpoints: Checkpointer
    resumed_from: int | None
    # several processes: the sampler's model on this process's devices (global_batch.host_local_model) and the mesh
    local_model: Qwen | None = None
    mesh: jax.sharding.Mesh | None = None

    def sync_sampler(self) -> None:
        """The sampler's weights := the state's parameters (on several processes: this host's copy of them)."""
        sync_model(self.model, self.state, copy=False)
        if self.local_model is None:
            self.sampler.update_weights(self.model)
        else:
            nnx.update(self.local_model, host_local_params(self.state.params, self.mesh))
            self.sampler.update_weights(self.local_model)

    def evaluate(self, step: int) -> Evaluation:
        """An evaluation point of the current state (the model synced with it) at metrics step ``step``."""
        self.sync_sampler()
        return self.algorithm.evaluate(self.state, self.sampler, step)

    def step(self) -> StepRecord:
        """One step (module docstring, 1-7): ``self.state`` moves on; the metrics line is returned, not written."""
        run, algorithm, timer = self.run, self.algorithm, StageTimer()
        t0 = time.perf_counter()
        before = algorithm.progress(self.state)
        self.sync_sampler()  # re-synced before every sampler use
        idx = task_stream(len(self.train_tasks), run.train.seed, int(self.state.data_position),
                          run.train.rollout.num_groups)
        state, key = next_key(self.state)
        batch = algorithm.collect(state, self.sampler, [self.train_tasks[i] for i in idx], idx, local_key(key))
        state = state.replace(data_position=state.data_position + 1)
        with timer("credit"):
            batch = algorithm.credit(state, batch)
        batch = algorithm.after_credit(state, batch, timer, evaluating=_due(True, before + 1, run.eval_every,
                                                                             run.updates))
        state, key = next_key(state)
        with timer("update"):
            state, metrics = algorithm.update(state, batch, key)
        self.state = state
        step, progress = int(state.step), algorithm.progress(state)
        advanced = progress > before
        evaluation = None
        if _due(advanced, progress, run.eval_every, run.updates):
            with timer("eval"):
                evaluation = self.evaluate(step)
        algorithm.save(state, batch, step, timer)
        line = algorithm.record(state, batch, metrics, evaluation or NO_EVALUATION)
        try:  # log a stopping step before stopping the run for it
            algorithm.check(state, batch, metrics)
            stop = None
        except RuntimeError as e:
            stop = e
        if stop is None and _due(advanced, progress, run.checkpoint_every, run.updates):
            with timer("checkpoint"):
                self.checkpoints.save(state, metadata={"run": run.to_dict()})
        timing = algorithm.timings(batch) | timer.metrics()
        timing["total"] = time.perf_counter() - t0
        line |= {f"time/{k}": float(v) for k, v in timing.items()}
        return StepRecord(step, line, evaluation, advanced, timing["total"], stop)

    def fit(self, stop_after: int | None = None) -> dict[str, Any]:
        """Train until the algorithm's progress reaches ``run.updates`` or, with ``stop_after``, after that many
        steps (as an interruption would, after the step's checkpoint if one was due); returns :func:`train`'s
        summary."""
        run, algorithm = self.run, self.algorithm
        start = int(self.state.step)
        # a fresh run restarts the log (-1 drops every line); a resumed one cuts it back to the restored step
        writer = MetricsWriter(run.out_dir, tensorboard=run.tensorboard,
                               resume_step=start if self.resumed_from is not None else -1)
        last, last_eval, seconds, done = {}, {}, [], 0
        try:
            if start == 0 and run.eval_every and run.eval_at_start and (stop_after is None or stop_after > 0):
                t0 = time.perf_counter()
                evaluation = self.evaluate(0)
                last_eval = evaluation.result
                writer.write(0, update_metrics(**evaluation.sections) | {"time/eval": time.perf_counter() - t0})
            with ProgressBar(run.updates, completed=algorithm.progress(self.state),
                             description=f"{run.train.credit.method} {run.env}", shown=algorithm.shown,
                             disable=not run.progress) as bar:
                while algorithm.progress(self.state) < run.updates and (stop_after is None or done < stop_after):
                    record = self.step()
                    if record.evaluation is not None:
                        last_eval = record.evaluation.result
                    last = writer.write(record.step, record.line)
                    if record.stop is not None:
                        raise record.stop
                    seconds.append(record.seconds)
                    bar.advance(last, steps=int(record.advanced))
                    done += 1
        finally:
            writer.close()
        return {"out_dir": run.out_dir, "step": int(self.state.step), **algorithm.summary(self.state),
                "resumed_from": self.resumed_from, "last": last, "last_eval": last_eval,
                "seconds_per_update": float(np.mean(seconds)) if seconds else None, "params": self.state.params}

    def close(self) -> None:
        """Close the checkpointer and the algorithm's pools."""
        self.checkpoints.close()
        self.algorithm.close()


def setup(run: RunConfig, *, resume: bool = False) -> Trainer:
    """Validate, then build the run (module docstring); the caller closes it (:meth:`Trainer.close`)."""
    method = algorithm_class(run)
    check_processes(run)
    b = build(run, resume=resume, schedule=method.schedule)
    try:
        algorithm = method(run, b.model, b.tokenizer, b.tx, b.eval_tasks)
    except BaseException:
        b.checkpoints.close()
        raise
    mesh = make_mesh(*run.mesh) if run.mesh else None
    local = host_local_model(b.model, mesh) if jax.process_count() > 1 else None  # each host samples its share
    return Trainer(run=run, algorithm=algorithm, tokenizer=b.tokenizer, model=b.model,
                   sampler=Sampler(local or b.model, b.tokenizer), state=b.state, train_tasks=b.train_tasks,
                   eval_tasks=b.eval_tasks, checkpoints=b.checkpoints, resumed_from=b.resumed_from,
                   local_model=local, mesh=mesh)


def train(run: RunConfig, *, resume: bool = False, stop_after: int | None = None) -> dict[str, Any]:
    """Train ``run`` (module docstring). ``stop_after`` ends this call after that many steps (as an interruption
    would, after the step's checkpoint if one was due). Returns a summary: ``out_dir``, ``step`` (batches drawn),
    a tree method's ``optimizer_steps``, ``resumed_from``, ``last`` (the last metrics line), ``last_eval``,
    ``seconds_per_update`` and ``params``. One trainer at a time per ``out_dir``
    (:func:`~agentjax.train.checkpoint.run_folder_lock`: a second one raises ``RunFolderBusy``)."""
    with run_folder_lock(run.out_dir):
        trainer = setup(run, resume=resume)
        try:
            return trainer.fit(stop_after)
        finally:
            trainer.close()


__all__ = ["CHECKPOINTS", "INITIAL_POLICY", "RUN_CONFIG", "Built", "ResumeMismatch", "StepRecord", "Trainer",
           "algorithm_class", "build", "build_model", "check_resumable", "optimizer", "setup", "task_stream", "train"]
