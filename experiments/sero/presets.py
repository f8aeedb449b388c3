"""Presets of the SERO experiment: the tiny CPU comparison, its ablations, its smoke size, and the paper's setting.

Built on :mod:`agentjax.train.presets` and the CRBC experiment's tiny runs (:mod:`experiments.crbc.presets`), so a
SERO run and its base run differ in ``TrainConfig.sero`` only:

- :func:`tiny_run` — the tiny Sokoban preset (16 rooms × 8 rollouts, 20 updates, 2 optimizer steps an update at
  5e-4) for ``method`` with SERO on (``sero=SeroConfig(...)``) or off, from the CRBC experiment's warm start (one
  cached warm start for every method, seed and arm: ``experiments/crbc/results/warmstart/``). The branch's oracle
  is Sokoban's BFS solver; roots come from failed rollouts, so with 16 groups there are at most 16 branches an
  update. λ_O = 0.1 (SERO §5.3).
- :func:`pool_run` — the same on the CRBC experiment's pool setting (:func:`experiments.crbc.presets.pool_run`:
  trained on a fixed pool of 16 rooms, AdamW 2e-3 x 4 steps an update, 16 updates, evaluated on the pool's rooms
  and on 16 held-out rooms), where every base method measurably improves the rooms it trains on. Its base runs
  (no SERO) are the CRBC pool comparison's own runs (``experiments/crbc/results/runs/pool/``): the same config to
  the last field, so they are reused rather than repeated.
- :func:`textcraft_run` — TextCraft-Synth, the other environment where the tiny policy runs on a CPU: the SERA
  experiment's flat run (:func:`experiments.sera.presets.tiny_run` ``"grpo"``: its planner warm start, cached once
  with the SERA experiment's and shared by every method, seed and arm; 2 root tasks × 4 episodes of ≤ 40 actions
  an update, 10 updates; constrained decoding over the admissible commands; eval on 16 ``val_easy_medium`` tasks ×
  2 seeds) with ``method``'s credit. The branch's oracle is the TextCraft planner from the restored snapshot (an
  exact restore), so at most 2 branches an update.
- :func:`ablation_runs` — the paper's ablations of the weighting (§5.3, §A.7: Root-only, Full-Flat, Depth-decay,
  Shuffled, Short-Bridge k = 1 and 3) and the λ_O sweep {0.05, 0.1, 0.5, 1.0} around a ``method+sero`` run.
- :func:`matched_run` — the interaction-matched baseline (§A.2): the base method with as many more updates as
  SERO's branches cost in environment steps (:func:`extra_updates`, from a SERO run's logged ``sero/env_steps``).
- :func:`paper_run` — the paper's setting (Qwen2.5-1.5B / 7B, GraphGPO or HGPO backbone, ALFWorld or WebShop,
  λ_O = 0.1, one node of 8 × 80 GB GPUs as :func:`agentjax.train.presets.paper`).
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any

from agentjax.train.config import SeroConfig
from agentjax.train.presets import paper, paper_credit
from agentjax.train.runconfig import RunConfig, WarmStart
from experiments.crbc.presets import RESULTS as CRBC_RESULTS
from experiments.crbc.presets import pool_run as crbc_pool_run
from experiments.crbc.presets import tiny_run as crbc_tiny_run
from experiments.sera.presets import RESULTS as SERA_RESULTS
from experiments.sera.presets import tiny_run as sera_tiny_run

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")
WARMSTART = os.path.join(CRBC_RESULTS, "warmstart")  # the CRBC experiment's: the same policy starts every run
METHODS = ("graphgpo", "crbc")  # the bases compared with and without SERO
PAPER_METHODS = ("graphgpo", "hgpo")  # the paper's backbones
SEEDS = (0, 1, 2)
COEF = 0.1  # λ_O, SERO §5.3
SCHEMES = ("root_only", "full_flat", "depth_decay", "shuffled", "short_bridge")
BRIDGES = (1, 3)  # Short-Bridge k (§A.7)
COEFS = (0.01, 0.05, 0.1, 0.5, 1.0)  # the λ_O sweep: the paper's (§5.3) and 0.01 below it


def label(method: str, sero: SeroConfig | None) -> str:
    """``graphgpo`` / ``graphgpo+sero`` (the report's method column)."""
    return method if sero is None else f"{method}+sero"


def tiny_run(method: str, seed: int, sero: SeroConfig | None = None, *, name: str | None = None,
             results: str = RESULTS, updates: int | None = None) -> RunConfig:
    """The tiny Sokoban run of ``method`` (with SERO when ``sero`` is given) and training seed ``seed``; ``out_dir``
    ``results/runs/tiny/<name or label>/seed<seed>``."""
    run = crbc_tiny_run(method, seed, updates=updates)
    run = run.replace(train=run.train.replace(sero=sero),
                      warm_start=dataclasses.replace(run.warm_start, cache_dir=WARMSTART),
                      out_dir=os.path.join(results, "runs", "tiny", name or label(method, sero), f"seed{seed}"))
    return run


def pool_run(method: str, seed: int, sero: SeroConfig | None = None, *, name: str | None = None,
              results: str = RESULTS, updates: int | None = None) -> RunConfig:
    """The pool setting's run of ``method`` (with SERO when ``sero`` is given); ``out_dir``
    ``results/runs/pool/<name or label>/seed<seed>``, except the base run of the default preset (``sero`` None,
    ``results`` and ``updates`` the defaults): the CRBC pool comparison's own run, which it equals."""
    if sero is None and name is None and results == RESULTS and updates is None:
        return crbc_pool_run(method, seed)
    run = crbc_pool_run(method, seed, updates=updates)
    return run.replace(train=run.train.replace(sero=sero),
                       out_dir=os.path.join(results, "runs", "pool", name or label(method, sero), f"seed{seed}"))


def textcraft_run(method: str, seed: int, sero: SeroConfig | None = None, *, name: str | None = None,
                  results: str = RESULTS, updates: int | None = None) -> RunConfig:
    """The TextCraft-Synth run of ``method`` (module docstring; SERO when ``sero`` is given): the SERA experiment's
    flat run with ``method``'s credit, its warm start from the SERA experiment's cache; ``out_dir``
    ``results/runs/textcraft/<name or label>/seed<seed>``."""
    run = sera_tiny_run("grpo", seed, results=SERA_RESULTS, updates=updates)
    return run.replace(train=run.train.replace(credit=paper_credit(method, run.env), sero=sero),
                       out_dir=os.path.join(results, "runs", "textcraft", name or label(method, sero), f"seed{seed}"))


def smoke_run(method: str, seed: int, sero: SeroConfig | None = None, *, results: str = RESULTS) -> RunConfig:
    """2 updates of 2 groups × 4 rollouts × 6 steps from a 4-episode warm start: the pipeline in a minute."""
    run = tiny_run(method, seed, sero, results=results)
    run = run.with_sizes(num_groups=2, group_size=4, max_steps=6, micro_batch_size=12)
    if sero is not None:
        run = run.replace(train=run.train.replace(sero=dataclasses.replace(sero, micro_batch_size=4)))
    return run.replace(updates=2, eval_every=1, eval_tasks=4, eval_seeds=1, checkpoint_every=1,
                       out_dir=os.path.join(results, "runs", "smoke", label(method, sero), f"seed{seed}"),
                       warm_start=WarmStart(episodes=4, steps=5, batch_size=8, learning_rate=1e-3,
                                            cache_dir=os.path.join(results, "runs", "smoke", "warmstart")))


def ablation_configs(coef: float = COEF) -> dict[str, SeroConfig]:
    """``{name: SeroConfig}`` of the weighting ablations and the λ_O sweep (the main arm ``sero`` included)."""
    out = {"sero": SeroConfig(coef=coef)}
    for scheme in SCHEMES:
        if scheme == "short_bridge":
            out |= {f"short_bridge_k{k}": SeroConfig(coef=coef, scheme=scheme, k=k) for k in BRIDGES}
        else:
            out[scheme] = SeroConfig(coef=coef, scheme=scheme)
    out |= {f"coef_{c:g}": SeroConfig(coef=c) for c in COEFS if c != coef}
    return out


def ablation_runs(method: str, seed: int, *, results: str = RESULTS, updates: int | None = None, pool: bool = False,
                  ) -> dict[str, RunConfig]:
    """``{label: run}`` of every ablation of ``method+sero`` (labels ``<method>+sero:<ablation>``), on the tiny
    setting or (``pool``) the pool setting."""
    make = pool_run if pool else tiny_run
    return {f"{method}+sero:{name}": make(method, seed, sero, name=f"{method}+sero_{name}", results=results,
                                          updates=updates)
            for name, sero in ablation_configs().items() if name != "sero"}


def extra_updates(sero_record: Any, updates: int | None = None) -> int:
    """How many updates of the base method cost as many environment steps as ``updates`` (default: the run's own)
    updates of a SERO run's branches (§A.2): ``ceil(updates · mean sero/env_steps / mean primary env steps)`` an
    update, from the run's record (:class:`experiments.crbc.report.RunRecord` with the ``sero/env_steps`` and
    ``rollout/num_turns`` series)."""
    branch_t = sero_record.metrics.get("sero/env_steps", {})
    if not branch_t:
        raise ValueError("the SERO run's record has no sero/env_steps: run it before its matched baseline")
    turns_t = sero_record.metrics["rollout/num_turns"]
    branch = sum(branch_t.values()) / len(branch_t)
    primary = sum(turns_t[s] for s in branch_t) / len(branch_t)
    return math.ceil((updates or len(branch_t)) * branch / primary)


def matched_run(method: str, seed: int, extra: int, *, results: str = RESULTS, updates: int | None = None,
                pool: bool = False) -> RunConfig:
    """The base method with ``extra`` more updates (the interaction-matched baseline, label ``<method>:matched``);
    evaluated at the same points plus the last."""
    make = pool_run if pool else tiny_run
    run = make(method, seed, name=f"{method}_matched", results=results, updates=updates)
    return run.replace(updates=run.updates + extra)


def paper_run(method: str, env: str, size: str = "1.5b", *, coef: float = COEF, **sero) -> RunConfig:
    """The paper's setting (SERO §5): Qwen2.5-``size``-Instruct, ``method`` ∈ {graphgpo, hgpo} as the backbone on
    ``env`` ∈ {alfworld, webshop} with the paper preset's sizes and optimiser, SERO at λ_O = ``coef``; the oracle
    micro-batch is the update's. Hardware: one node of 8 × 80 GB GPUs (1.5B on an 8 × 1 FSDP × TP mesh, 7B on 2 × 4),
    as :func:`agentjax.train.presets.paper`."""
    if method not in PAPER_METHODS:
        raise ValueError(f"SERO's paper backbones are {PAPER_METHODS}, not {method!r}")
    if env not in ("alfworld", "webshop"):
        raise ValueError(f"SERO's paper benchmarks are alfworld and webshop, not {env!r}")
    run = paper(method, env, size)
    gate = dict(soft_gate=False, gate_on="success")  # §4.4: strict success on both benchmarks
    run = run.replace(train=run.train.replace(sero=SeroConfig(coef=coef, **(gate | sero))))
    return run.replace(out_dir=os.path.join(RESULTS, "runs", f"paper-{size}", env, f"{method}+sero"))


__all__ = ["COEF", "COEFS", "METHODS", "PAPER_METHODS", "RESULTS", "SEEDS", "ablation_configs", "ablation_runs",
           "extra_updates", "label", "matched_run", "paper_run", "pool_run", "smoke_run", "textcraft_run",
           "tiny_run"]
