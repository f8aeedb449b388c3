"""What uses a run's policy without training it: evaluating a saved checkpoint, and SERO's fixed oracle bank.

A run folder (:func:`find_run`) holds ``checkpoints/<step>/`` with the run config in each checkpoint's metadata
(:func:`saved_run`). :func:`evaluate_checkpoint` restores one checkpoint's policy (:func:`restore_model`) and
evaluates it as the run's algorithm does at its eval points — the same eval tasks and the run's one evaluation key
(:mod:`agentjax.train.eval`: common random numbers with the run's own eval points) — and :func:`build_bank` collects
primary batches and their oracle branches with one frozen policy (SERO §A.1, §F.2).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from typing import Any

import jax

from agentjax.models import Qwen, Sampler
from agentjax.parallel import make_mesh
from agentjax.rollout.collect import run_episodes
from agentjax.train.checkpoint import Checkpointer
from agentjax.train.eval import eval_key, evaluate
from agentjax.train.exact import exact_probe
from agentjax.train.flat import make_pool
from agentjax.train.runconfig import RunConfig, run_from_dict
from agentjax.train.sero import save_bank
from agentjax.train.state import init_state, next_key, policy_params, sync_model
from agentjax.train.tokenizers import run_tokenizer
from agentjax.train.trainer import CHECKPOINTS, algorithm_class, build_model, setup, task_stream
from agentjax.train.trees import evaluate_trees

log = logging.getLogger(__name__)


# -- a saved run -----------------------------------------------------------------------------------------------------
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
    if step is not None and step not in steps:
        raise FileNotFoundError(f"{out_dir}/{CHECKPOINTS} has no checkpoint of step {step}; its steps are "
                                f"{', '.join(map(str, steps))} (leave the step out for the newest that restores)")
    meta_path = os.path.join(out_dir, CHECKPOINTS, str(step if step is not None else steps[-1]), "meta", "metadata")
    with open(meta_path) as f:
        return run_from_dict(json.load(f)["metadata"]["run"])


def restore_model(run: RunConfig, out_dir: str, step: int | None, tokenizer: Any, mesh: Any = None
                  ) -> tuple[Qwen, int]:
    """The policy of ``run``'s checkpoint ``step`` in ``out_dir`` (default the newest that restores) and its step."""
    model = build_model(run.replace(warm_start=None), tokenizer, mesh)  # structure only: the checkpoint has the weights
    like = init_state(run.train, model, jax.random.key(0), schedule=algorithm_class(run).schedule)
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


# -- SERO's fixed oracle bank ----------------------------------------------------------------------------------------
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
        state, flat = t.state, t.algorithm
        os.makedirs(folder, exist_ok=True)
        for i in range(batches):
            idx = task_stream(len(t.train_tasks), run.train.seed, i, run.train.rollout.num_groups)
            state, key = next_key(state)
            rollouts = run_episodes(flat.pool, [t.train_tasks[j] for j in idx], t.sampler, run.train_collect, key,
                                    task_indices=idx)
            _, metrics, oracle, log_c = flat.sero.branch(state.params, rollouts, key)
            path = os.path.join(folder, f"{i}.npz")
            save_bank(path, oracle, log_c)
            files.append(path)
            log.info("bank batch %d: %d roots, %d gated in, %d oracle steps -> %s", i, metrics["roots_attempted"],
                     metrics["roots_gated"], metrics["oracle_steps"], path)
    finally:
        t.close()
    return files


__all__ = ["build_bank", "evaluate_checkpoint", "find_run", "restore_model", "saved_run"]
