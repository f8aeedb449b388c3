"""The trainer loop: collect → credit → update → log → evaluate → checkpoint, resumable to the same numbers.

``train(run)`` validates the :class:`~agentjax.train.runconfig.RunConfig` (values, then the machine), then builds,
in this order, the task lists, the tokenizer, the model (random init with ``train.seed``, an HF checkpoint, or the
cached supervised warm start, :mod:`agentjax.train.warmstart`; on ``run.mesh`` with the FSDP × TP rules), the
state (or the newest checkpoint that restores, with ``resume=True``), the sampler and the env pool. Each update:

1. ``sync_model`` → the sampler's weights; the batch's tasks are ``task_stream(seed, data_position)``.
2. ``collect`` with a key from the state's stream (time: env / generate / prompt from ``RolloutStats``).
3. ``compute_advantages`` (PPO: the value head's values first), blocked until ready (time: credit).
4. ``update`` with a fresh key, ``data_position + 1`` (time: update).
5. One metrics line (``rollout/`` success, per-task-type success, returns, invalid rate, episode length, …;
   ``train/`` loss, KL, entropy, clip fraction, grad norm, lr, skips; ``credit/`` advantage statistics;
   ``time/`` the split; ``eval/`` when evaluated) to ``metrics.jsonl`` and TensorBoard, and the progress bar.
   Then :func:`~agentjax.train.update.check_nonfinite`: a NaN/Inf update was skipped by ``update`` (parameters
   unchanged), is logged here, and the run stops with ``NonFiniteUpdateError`` after
   ``train.max_nonfinite_updates`` skips — the metrics line of the last skip is written first.
6. Evaluation after every ``eval_every``-th update and after the last (:mod:`agentjax.train.eval`; one key per
   run, from the seed only: common random numbers across eval points, and evaluation never changes the training
   numbers); with ``eval_at_start`` a run that starts from scratch first evaluates the initial policy and logs
   it as update 0 (``eval/`` only). Per-episode outcomes go to ``<out_dir>/eval/<update>.json``.
7. A checkpoint after every ``checkpoint_every``-th update and after the last (metadata: the run config).

Reproducibility. Every random draw comes from ``state.rng`` through ``next_key`` (collection, update order) or from
(seed, update) (evaluation); the task stream is a pure function of (seed, data_position); the state and the stream
position are in the checkpoint. So a run stopped after a checkpoint and resumed reproduces the uninterrupted run's
parameters and metrics lines exactly (timings aside) — tests/train/test_loop.py checks it. On resume a corrupt
newest checkpoint is reported (``CorruptCheckpointWarning``) and the previous one used; ``metrics.jsonl`` is cut
back to the restored step. A resumed run must have the same train / env / collector config as the checkpoint
(checked; the schedule, ``updates`` and ``out_dir`` may change). Without ``resume`` an ``out_dir`` that already
holds checkpoints is an error, never silently overwritten.
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
from agentjax.parallel.rules import activation_sharding
from agentjax.rollout.collect import CollectConfig, run_episodes, to_step_batch
from agentjax.rollout.stats import summarize
from agentjax.train.advantages import compute_advantages
from agentjax.train.checkpoint import Checkpointer, run_folder_lock
from agentjax.train.config import OptimizerConfig, TrainConfig
from agentjax.train.eval import eval_key, evaluate
from agentjax.train.exact import exact_probe, exact_scalars
from agentjax.train.metrics import MetricsWriter, ProgressBar, StageTimer, update_metrics
from agentjax.train.runconfig import RunConfig, run_from_dict
from agentjax.train.sero import SeroBranch, save_bank
from agentjax.train.state import TrainState, init_state, make_optimizer, next_key, policy_params, sync_model
from agentjax.train.tokenizers import run_tokenizer
from agentjax.train.update import NonFiniteUpdateError, UpdateBatch, check_nonfinite, make_update, make_value_fn
from agentjax.train.warmstart import initial_policy, warm_start_folder
from envs.pool import EnvPool, SerialPool

log = logging.getLogger(__name__)

CHECKPOINTS = "checkpoints"
RUN_CONFIG = "run_config.json"
INITIAL_POLICY = "initial_policy.json"  # what RL started from (agentjax.train.warmstart.initial_policy)
HELD_OUT = "held_out"  # the second evaluation series (RunConfig.held_out_tasks): eval/held_out/, held_out/ metrics
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


def _flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(d, Mapping):
        out = {}
        for k, v in d.items():
            out |= _flatten(v, f"{prefix}{k}.")
        return out
    return {prefix[:-1]: d}


def _check_resumable(run: RunConfig, saved: Mapping[str, Any], path: str) -> None:
    defaults = {f.name: f.default for f in dataclasses.fields(RunConfig)}  # keys older checkpoints did not save
    mine, theirs = _flatten({k: run.to_dict()[k] for k in RESUME_KEYS}), _flatten(
        {k: saved.get(k, defaults.get(k)) for k in RESUME_KEYS})
    # nested fields that older code did not have (and so did not save) compare at their defaults
    fresh = _flatten({"train": TrainConfig().to_dict(), "collect": dataclasses.asdict(CollectConfig())})
    diff = [k for k in sorted(set(mine) | set(theirs)) if mine.get(k) != theirs.get(k, fresh.get(k))]
    if diff:
        shown = "; ".join(f"{k}: checkpoint {theirs.get(k)!r} vs now {mine.get(k)!r}" for k in diff[:5])
        raise ValueError(f"cannot resume from {path}: the run config differs ({shown}); resume with the same config "
                         "or start a new out_dir")


def _rollout_scalars(stats: Any) -> dict[str, float]:
    """The collector's statistics without its timings (those go to ``time/``)."""
    return {k: float(v) for k, v in stats.as_dict(prefix="").items() if not k.endswith("_seconds")}


@dataclasses.dataclass
class Trainer:
    """Everything a run holds while it trains (built by :func:`setup`)."""

    run: RunConfig
    tokenizer: Any
    model: Qwen
    sampler: Sampler
    state: TrainState
    update: Any
    value_fn: Any
    pool: Any
    train_tasks: list
    eval_tasks: list
    checkpoints: Checkpointer
    resumed_from: int | None
    sero: SeroBranch | None = None  # SERO's oracle branch (TrainConfig.sero)
    eval_pool: Any = None  # evaluation's pool where eval_env_kwargs differ (None: `pool`)
    held_out_tasks: list = dataclasses.field(default_factory=list)  # RunConfig.held_out_tasks' tasks
    exact: Any = None  # exact evaluation and credit accuracy on a known model (agentjax.train.exact; envs/mdp)

    @property
    def evaluation_pool(self) -> Any:
        return self.pool if self.eval_pool is None else self.eval_pool

    def close_pools(self) -> None:
        self.pool.close()
        if self.eval_pool is not None and self.eval_pool is not self.pool:
            self.eval_pool.close()


def _existing_steps(directory: str) -> list[str]:
    return [n for n in os.listdir(directory) if n.isdigit()] if os.path.isdir(directory) else []


@dataclasses.dataclass
class Built:
    """What the flat and the tree trainer build alike (:func:`build`)."""

    tokenizer: Any
    model: Qwen
    tx: optax.GradientTransformation
    state: TrainState
    train_tasks: list
    eval_tasks: list
    checkpoints: Checkpointer
    resumed_from: int | None


def build(run: RunConfig, *, resume: bool = False, schedule: bool = False) -> Built:
    """Validate, then build what every trainer holds: the task lists, the tokenizer, the model (random init, an HF
    checkpoint or the cached warm start), the optimizer, the state (with the stage schedule's when ``schedule``) or
    the newest checkpoint that restores; writes ``run_config.json`` and ``initial_policy.json`` (what RL starts
    from). The caller closes ``checkpoints``."""
    run.check()
    ckpt_dir = os.path.join(run.out_dir, CHECKPOINTS)
    if not resume and _existing_steps(ckpt_dir):
        raise FileExistsError(f"{ckpt_dir} already holds checkpoints; pass resume=True (--resume) to continue that run "
                              "or choose another out_dir")
    spec, ro = run.spec, run.train.rollout
    train_tasks = spec.tasks(spec.train_split)
    if run.train_pool > len(train_tasks):
        raise ValueError(f"RunConfig.train_pool={run.train_pool} but {run.env} {spec.train_split} has "
                         f"{len(train_tasks)} tasks")
    train_tasks = train_tasks[:run.train_pool or None]
    if ro.num_groups > len(train_tasks):
        raise ValueError(f"{ro.num_groups} groups per batch need as many tasks; {run.env} {spec.train_split} has "
                         f"{len(train_tasks)}")
    eval_tasks = []
    if run.eval_every:
        eval_tasks = spec.tasks(run.evaluation_split)
        if run.eval_tasks > len(eval_tasks):
            raise ValueError(f"RunConfig.eval_tasks={run.eval_tasks} but {run.env} {run.evaluation_split} has "
                             f"{len(eval_tasks)} tasks")
        eval_tasks = eval_tasks[:run.eval_tasks]
    tokenizer = run_tokenizer(run.tokenizer)
    if len(tokenizer) > run.train.model.arch.vocab_size:
        raise ValueError(f"the tokenizer has {len(tokenizer)} tokens, more than the model's vocabulary "
                         f"({run.train.model.arch.vocab_size}); raise train.model.arch.vocab_size")

    os.makedirs(run.out_dir, exist_ok=True)
    with open(os.path.join(run.out_dir, RUN_CONFIG), "w") as f:
        json.dump(run.to_dict(), f, indent=1)
    mesh = make_mesh(*run.mesh) if run.mesh else None
    model = build_model(run, tokenizer, mesh)
    started = os.path.join(run.out_dir, INITIAL_POLICY)
    if not (resume and _existing_steps(ckpt_dir) and os.path.exists(started)):  # a resumed run keeps its record: its
        with open(started, "w") as f:  # weights come from its checkpoint, whatever warm start a rebuild would give
            json.dump(initial_policy(run), f, indent=1)
    tx = optimizer(run.train.optimizer)
    state = init_state(run.train, model, jax.random.key(run.train.seed), tx, schedule=schedule)
    checkpoints = Checkpointer(ckpt_dir, max_to_keep=run.keep_checkpoints)
    resumed_from = None
    if resume:
        try:
            restored = checkpoints.restore_latest(state)
            if restored is not None:
                _check_resumable(run, restored.metadata.get("run", {}), restored.path)
        except BaseException:
            checkpoints.close()
            raise
        if restored is not None:
            state, resumed_from = restored.state, restored.step
            log.info("resumed from %s (step %d)", restored.path, restored.step)
    return Built(tokenizer, model, tx, state, train_tasks, eval_tasks, checkpoints, resumed_from)


def held_out_tasks(run: RunConfig) -> list:
    """The first ``RunConfig.held_out_tasks`` tasks of the env's eval split (the second evaluation series)."""
    if not (run.eval_every and run.held_out_tasks):
        return []
    tasks = run.spec.tasks(run.spec.eval_split)
    if run.held_out_tasks > len(tasks):
        raise ValueError(f"RunConfig.held_out_tasks={run.held_out_tasks} but {run.env} {run.spec.eval_split} has "
                         f"{len(tasks)} tasks")
    return tasks[:run.held_out_tasks]


def setup(run: RunConfig, *, resume: bool = False) -> Trainer:
    """Validate, then build the run (module docstring); the caller closes ``pool`` and ``checkpoints``."""
    b = build(run, resume=resume)
    tokenizer, model, tx, state, checkpoints = b.tokenizer, b.model, b.tx, b.state, b.checkpoints
    train_tasks, eval_tasks, resumed_from = b.train_tasks, b.eval_tasks, b.resumed_from
    pool = make_pool(run)
    eval_pool = make_eval_pool(run, pool)
    sero = None
    if run.train.sero is not None:
        sero = SeroBranch(run.train, run.train_collect, model, tokenizer, pool, run.branch_slots)
    return Trainer(run=run, tokenizer=tokenizer, model=model, sampler=Sampler(model, tokenizer), state=state,
                   update=make_update(run.train, model, tx),
                   value_fn=make_value_fn(run.train, model) if run.train.is_ppo else None,
                   pool=pool, train_tasks=train_tasks, eval_tasks=eval_tasks, checkpoints=checkpoints,
                   resumed_from=resumed_from, sero=sero, eval_pool=None if eval_pool is pool else eval_pool,
                   held_out_tasks=held_out_tasks(run), exact=exact_probe(run, tokenizer, eval_tasks, model))


def _eval_scalars(evaluation: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in evaluation.items() if k not in ("seconds", "outcomes", "exact")}


def _save_outcomes(run: RunConfig, tasks: list, step: int, evaluation: Mapping[str, Any], series: str = "") -> None:
    """``<out_dir>/eval/<step>.json``: the per-episode outcomes ``[task][seed]`` with the task ids, for paired
    comparisons between eval points and runs (the same episodes and keys: :mod:`agentjax.train.eval`); a second
    ``series`` (``held_out``) goes to ``eval/<series>/<step>.json``."""
    folder = os.path.join(run.out_dir, "eval", series)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, f"{step}.json"), "w") as f:
        json.dump({"step": step, "tasks": [t.task_id for t in tasks], "outcomes": evaluation["outcomes"],
                   "success_rate": evaluation["success_rate"], "success_se": evaluation["success_se"]}
                  | ({"exact": evaluation["exact"]} if "exact" in evaluation else {}), f)


def _evaluate(t: Trainer, step: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """Evaluate the model (synced with the state by the caller) on the eval tasks and, with
    ``RunConfig.held_out_tasks``, on the env's held-out split too; saves both series' outcomes."""
    run, key = t.run, eval_key(t.run.train.seed)
    t.sampler.update_weights(t.model)
    evaluation = evaluate(t.evaluation_pool, t.eval_tasks, t.sampler, run.eval_collect, key,
                          task_indices=range(len(t.eval_tasks)))
    if t.exact is not None:  # the eval tasks' exact success (agentjax.train.exact)
        evaluation["exact"] = t.exact.evaluate(t.state.params)
    _save_outcomes(run, t.eval_tasks, step, evaluation)
    held_out = {}
    if t.held_out_tasks:
        held_out = evaluate(t.evaluation_pool, t.held_out_tasks, t.sampler, run.eval_collect, key,
                            task_indices=range(len(t.held_out_tasks)))
        _save_outcomes(run, t.held_out_tasks, step, held_out, series=HELD_OUT)
    return evaluation, held_out


def _due(step: int, every: int, last: int) -> bool:
    return bool(every) and (step % every == 0 or step == last)


def train(run: RunConfig, *, resume: bool = False, stop_after: int | None = None) -> dict[str, Any]:
    """Train ``run`` (module docstring). ``stop_after`` ends this call after that many updates (as an interruption
    would, after the update's checkpoint if one was due). Returns a summary: ``out_dir``, ``step``,
    ``resumed_from``, ``last`` (the last metrics line), ``last_eval``, ``seconds_per_update``. A tree method's run
    (RAO: ``run.tree``) trains with :func:`agentjax.train.tree_loop.train_trees`. One trainer at a time per
    ``out_dir`` (:func:`~agentjax.train.checkpoint.run_folder_lock`: a second one raises ``RunFolderBusy``)."""
    with run_folder_lock(run.out_dir):
        if run.tree is not None:
            from agentjax.train.tree_loop import train_trees

            return train_trees(run, resume=resume, stop_after=stop_after)
        return _train_flat(run, resume=resume, stop_after=stop_after)


def _train_flat(run: RunConfig, *, resume: bool, stop_after: int | None) -> dict[str, Any]:
    """:func:`train` of a flat (one agent per episode) run, the folder's lock held."""
    t = setup(run, resume=resume)
    cfg, ro = run.train, run.train.rollout
    start = int(t.state.step)
    # a fresh run restarts the log (-1 drops every line); a resumed one cuts it back to the restored step
    writer = MetricsWriter(run.out_dir, tensorboard=run.tensorboard,
                           resume_step=start if t.resumed_from is not None else -1)
    last, last_eval, seconds, done = {}, {}, [], 0
    try:
        if start == 0 and run.eval_every and run.eval_at_start and (stop_after is None or stop_after > 0):
            t0 = time.perf_counter()
            sync_model(t.model, t.state, copy=False)
            last_eval, held_out = _evaluate(t, 0)
            writer.write(0, update_metrics(eval=_eval_scalars(last_eval), held_out=_eval_scalars(held_out),
                                           exact=exact_scalars(last_eval)) | {"time/eval": time.perf_counter() - t0})
        with ProgressBar(run.updates, completed=start, description=f"{cfg.credit.method} {run.env}",
                         shown=("rollout/success_rate", "eval/success_rate", "train/loss", "train/kl"),
                         disable=not run.progress) as bar:
            while int(t.state.step) < run.updates and (stop_after is None or done < stop_after):
                timer = StageTimer()
                t0 = time.perf_counter()
                sync_model(t.model, t.state, copy=False)  # re-synced before every sampler use
                t.sampler.update_weights(t.model)
                idx = task_stream(len(t.train_tasks), cfg.seed, int(t.state.data_position), ro.num_groups)
                state, key = next_key(t.state)
                rollouts = run_episodes(t.pool, [t.train_tasks[i] for i in idx], t.sampler, run.train_collect, key,
                                        task_indices=idx)
                batch, stats = to_step_batch(rollouts, run.train_collect), summarize(rollouts)
                state = state.replace(data_position=state.data_position + 1)
                with timer("credit"):
                    values = t.value_fn(state, batch) if t.value_fn is not None else None
                    adv = jax.block_until_ready(compute_advantages(cfg.credit, batch, ro, values=values))
                oracle, sero_metrics = {}, {}
                if t.sero is not None:  # after the base advantages, with the behaviour parameters (before the update)
                    with timer("sero"):
                        rows, sero_metrics, *_ = t.sero.branch(state.params, rollouts, key)
                    oracle = {"oracle": rows}
                exact_credit = {}
                if t.exact is not None and _due(int(state.step) + 1, run.eval_every, run.updates):
                    with timer("exact"):  # the behaviour parameters' exact A^π, before the update donates them
                        exact_credit = t.exact.credit(state.params, rollouts, adv)
                state, key = next_key(state)
                with timer("update"):
                    state, metrics = t.update(state, UpdateBatch.of(batch, adv, **oracle), key)
                    metrics = jax.block_until_ready(metrics)
                t.state = state
                step = int(state.step)
                evaluation, held_out = {}, {}
                if _due(step, run.eval_every, run.updates):
                    with timer("eval"):
                        sync_model(t.model, state, copy=False)
                        evaluation, held_out = _evaluate(t, step)
                    last_eval = evaluation
                timing = {"env": stats.env_seconds, "generate": stats.generate_seconds, "prompt": stats.prompt_seconds}
                record = update_metrics(train=metrics, rollout=_rollout_scalars(stats), credit=adv.stats | exact_credit,
                                        eval=_eval_scalars(evaluation), held_out=_eval_scalars(held_out),
                                        sero=sero_metrics, exact=exact_scalars(evaluation))
                try:  # log a skipped update before stopping the run for it
                    check_nonfinite(state, metrics, cfg)
                    stop = None
                except NonFiniteUpdateError as e:
                    stop = e
                if stop is None and _due(step, run.checkpoint_every, run.updates):
                    with timer("checkpoint"):
                        t.checkpoints.save(state, metadata={"run": run.to_dict()})
                timing |= timer.metrics()
                timing["total"] = time.perf_counter() - t0
                record |= {f"time/{k}": float(v) for k, v in timing.items()}
                last = writer.write(step, record)
                if stop is not None:
                    raise stop
                seconds.append(timing["total"])
                bar.advance(last)
                done += 1
    finally:
        writer.close()
        t.checkpoints.close()
        t.close_pools()
    return {"out_dir": run.out_dir, "step": int(t.state.step), "resumed_from": t.resumed_from, "last": last,
            "last_eval": last_eval, "seconds_per_update": float(np.mean(seconds)) if seconds else None,
            "params": t.state.params}


# -- SERO's fixed oracle bank --------------------------------------------------------------------------------------
def build_bank(run: RunConfig, folder: str, *, batches: int = 1, checkpoint: str | None = None,
               step: int | None = None) -> list[str]:
    """A fixed oracle bank (SERO §A.1, §F.2): ``batches`` primary batches collected by one frozen policy — ``run``'s
    initial policy (its warm start) or the checkpoint ``step`` (default: the newest) of the run in ``checkpoint`` —
    and their oracle branches, written to ``folder/<i>.npz`` (:func:`agentjax.train.sero.save_bank`; replay them
    with ``SeroConfig.bank``). The batches are the run's own task stream from its first position, with keys from
    ``train.seed``; nothing is trained. Returns the files."""
    if run.train.sero is None:
        raise ValueError("build_bank: the run has no SERO config (TrainConfig.sero)")
    run = run.replace(train=run.train.replace(sero=dataclasses.replace(run.train.sero, bank=None)), eval_every=0,
                      out_dir=os.path.join(folder, "run"))
    t = setup(run)
    files = []
    try:
        if checkpoint is not None:
            out_dir, found = find_run(checkpoint)
            with Checkpointer(os.path.join(out_dir, CHECKPOINTS)) as ckpt:
                want = step if step is not None else found
                restored = ckpt.restore(want, t.state) if want is not None else ckpt.restore_latest(t.state)
            t.state = restored.state
        sync_model(t.model, t.state, copy=False)
        t.sampler.update_weights(t.model)
        state = t.state
        os.makedirs(folder, exist_ok=True)
        for i in range(batches):
            idx = task_stream(len(t.train_tasks), run.train.seed, i, run.train.rollout.num_groups)
            state, key = next_key(state)
            rollouts = run_episodes(t.pool, [t.train_tasks[j] for j in idx], t.sampler, run.train_collect, key,
                                    task_indices=idx)
            _, metrics, oracle, log_c = t.sero.branch(state.params, rollouts, key)
            path = os.path.join(folder, f"{i}.npz")
            save_bank(path, oracle, log_c)
            files.append(path)
            log.info("bank batch %d: %d roots, %d gated in, %d oracle steps -> %s", i, metrics["roots_attempted"],
                     metrics["roots_gated"], metrics["oracle_steps"], path)
    finally:
        t.checkpoints.close()
        t.close_pools()
    return files


# -- evaluating a saved run ----------------------------------------------------------------------------------------
def find_run(path: str) -> tuple[str, int | None]:
    """``(out_dir, step or None)`` of a run folder, its ``checkpoints/`` folder or one step folder in it."""
    path = os.path.abspath(path)
    step = None
    if os.path.basename(path).isdigit() and os.path.basename(os.path.dirname(path)) == CHECKPOINTS:
        step, path = int(os.path.basename(path)), os.path.dirname(path)
    if os.path.basename(path) == CHECKPOINTS:
        path = os.path.dirname(path)
    if not os.path.isdir(os.path.join(path, CHECKPOINTS)):
        raise FileNotFoundError(f"{path} is not a training run folder (no {CHECKPOINTS}/ inside); pass the run's "
                                "out_dir, its checkpoints/ folder or one checkpoint step folder")
    return path, step


def saved_run(out_dir: str, step: int | None = None) -> RunConfig:
    """The run config saved with the checkpoint ``step`` of ``out_dir`` (default the newest)."""
    with Checkpointer(os.path.join(out_dir, CHECKPOINTS)) as probe:
        steps = probe.steps()
    if not steps:
        raise FileNotFoundError(f"{out_dir}/{CHECKPOINTS} holds no checkpoint")
    meta_path = os.path.join(out_dir, CHECKPOINTS, str(step if step is not None else steps[-1]), "meta", "metadata")
    with open(meta_path) as f:
        return run_from_dict(json.load(f)["metadata"]["run"])


def restore_model(run: RunConfig, out_dir: str, step: int | None, tokenizer: Any, mesh: Any = None
                  ) -> tuple[Qwen, int]:
    """The policy of ``run``'s checkpoint ``step`` in ``out_dir`` (default the newest that restores) and its step."""
    model = build_model(run.replace(warm_start=None), tokenizer, mesh)  # structure only: the checkpoint has the weights
    like = init_state(run.train, model, jax.random.key(0), schedule=run.tree is not None)
    with Checkpointer(os.path.join(out_dir, CHECKPOINTS)) as ckpt:
        restored = ckpt.restore(step, like) if step is not None else ckpt.restore_latest(like)
    sync_model(model, restored.state)
    return model, restored.step


def evaluate_checkpoint(path: str, *, step: int | None = None, tasks: int | None = None, seeds: int | None = None,
                        temperature: float | None = None, search: int | None = None,
                        grader: str = "policy") -> dict[str, Any]:
    """Evaluate a saved run's checkpoint (newest that restores, or ``step``) on its eval split; the run config is
    read from the checkpoint. Writes ``<out_dir>/eval_<step>.json`` (with search: ``eval_<step>_search<N>.json``,
    ``..._initial.json`` for the initial grader) and returns it. A SERA run may evaluate with
    rubric-guided search (``search`` candidates per delegated child), its rubrics written and graded by the
    checkpoint (``grader="policy"``) or by the run's initial policy — its warm start, or its starting weights —
    (``"initial"``: the paper's untrained-grader control)."""
    out_dir, found = find_run(path)
    step = step if step is not None else found
    run = saved_run(out_dir, step)
    changes: dict[str, Any] = {"eval_every": 1, "progress": False, "workers": 0}
    if tasks is not None:
        changes["eval_tasks"] = tasks
    if seeds is not None:
        changes["eval_seeds"] = seeds
    if temperature is not None:
        changes["eval_temperature"] = temperature
    if search is not None:
        changes["eval_search"] = search
    if grader not in ("policy", "initial"):
        raise ValueError(f"grader is 'policy' or 'initial', got {grader!r}")
    run = run.replace(**changes)
    run.check()
    eval_tasks = run.spec.tasks(run.evaluation_split)[:run.eval_tasks]
    tokenizer = run_tokenizer(run.tokenizer)
    mesh = make_mesh(*run.mesh) if run.mesh else None
    model, restored_step = restore_model(run, out_dir, step, tokenizer, mesh)
    if run.tree is not None:  # root success of the trees
        from agentjax.train.tree_loop import evaluate_trees

        judge = None
        if grader == "initial":
            if not run.eval_search:
                raise ValueError("grader='initial' grades rubric-guided search: give search (e.g. 2)")
            judge = Sampler(build_model(run, tokenizer, mesh), tokenizer)
        result, _ = evaluate_trees(run, eval_tasks, Sampler(model, tokenizer), eval_key(run.train.seed), grader=judge)
    else:
        pool = make_pool(run, evaluation=True)
        try:
            result = evaluate(pool, eval_tasks, Sampler(model, tokenizer), run.eval_collect,
                              eval_key(run.train.seed), task_indices=range(len(eval_tasks)))
        finally:
            pool.close()
        probe = exact_probe(run, tokenizer, eval_tasks, model)
        if probe is not None:
            result["exact"] = probe.evaluate(policy_params(model))
    result = {"step": restored_step, "env": run.env, "split": run.evaluation_split, "tasks": len(eval_tasks),
              "seeds": run.eval_seeds, "method": run.train.credit.method} | result
    tag = f"_search{run.eval_search}" + ("_initial" if grader == "initial" else "") if run.eval_search else ""
    with open(os.path.join(out_dir, f"eval_{restored_step}{tag}.json"), "w") as f:
        json.dump(result, f, indent=1)
    return result


__all__ = ["Trainer", "build_bank", "build_model", "evaluate_checkpoint", "find_run", "make_pool", "setup",
           "task_stream", "train"]
