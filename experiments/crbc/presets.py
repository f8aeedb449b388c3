"""Presets of the CRBC experiment: the tiny CPU comparison, its smoke size, and the paper's ablation grid.

Built on :mod:`agentjax.train.presets` (the library's presets; the library never imports experiments).

- :func:`tiny_run` — ``agentjax.train.presets.tiny(method)`` on Sokoban 6×6 with RL seed ``seed``, its own
  ``out_dir`` under ``results/runs/`` and the warm start cached in ``results/warmstart/`` (one identical warm start
  for every method and seed: it depends on neither, see :mod:`agentjax.train.warmstart`).
- :func:`pool_run` — the pool setting: the same warm start and sizes, trained on a fixed pool of the train split's
  first :data:`POOL` rooms (every update plays each of them once) and evaluated on that pool (the success that RL
  raises) and on as many held-out ``valid`` rooms (whether it transfers), each 8 sampled seeds a room.
- :func:`smoke_run` — the same pipeline at a size that finishes in a minute or two (2 updates).
- :func:`ablation_runs` — the paper's ablations of CRBC (closure depth K ∈ {0, 1, 2, 3, ∞}, w_S ∈ {1, 5, 10},
  β ∈ {0.95, 0.98, 0.99, 1.0}, group size G ∈ {4, 8, 16}) around a base run. The G ablation keeps the number of
  groups and the step cap, so a larger G is a larger batch (as in the paper's table, which varies G alone).
"""

from __future__ import annotations

import dataclasses
import os

from agentjax.train.presets import paper, tiny
from agentjax.train.runconfig import RunConfig, WarmStart

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")
METHODS = ("grpo", "rloo", "gigpo", "hgpo", "graphgpo", "crbc", "ppo")  # the comparison
SEEDS = (0, 1, 2)

DEPTHS = (0, 1, 2, 3, None)  # None: the full closure, K = ∞
STEP_WEIGHTS = (1.0, 5.0, 10.0)
BETAS = (0.95, 0.98, 0.99, 1.0)
GROUP_SIZES = (4, 8, 16)


def tiny_run(method: str, seed: int, *, results: str = RESULTS, updates: int | None = None) -> RunConfig:
    run = tiny(method, "sokoban")
    run = run.replace(train=run.train.replace(seed=seed), out_dir=os.path.join(results, "runs", "tiny", method,
                                                                                f"seed{seed}"),
                      warm_start=dataclasses.replace(run.warm_start, cache_dir=os.path.join(results, "warmstart")),
                      progress=False)
    return run.replace(updates=updates) if updates else run


# The pool setting (experiments/crbc/README.md): held-out gains of the tiny policy stay within noise in every probe,
# while on rooms it trains on again GiGPO at 2e-3 x 4 steps an update rose 0.438 -> 0.562 in 20 updates
# (results/probes.md); 16 updates keep a run near 10 minutes on 2 CPU cores.
POOL = 16
POOL_LEARNING_RATE, POOL_MINI_BATCHES, POOL_UPDATES = 2e-3, 4, 16


def pool_run(method: str, seed: int, *, results: str = RESULTS, updates: int | None = None) -> RunConfig:
    """:func:`tiny_run` on the pool setting (module docstring): ``train_pool`` :data:`POOL`, eval on the pool's
    rooms x 8 seeds (``eval_split`` train) and :data:`POOL` held-out ``valid`` rooms x 8 seeds, AdamW 2e-3 with 4
    steps an update, :data:`POOL_UPDATES` updates, ``out_dir`` under ``results/runs/pool/``."""
    run = tiny_run(method, seed, results=results)
    seeds = 128 // POOL
    train = run.train.replace(optimizer=dataclasses.replace(run.train.optimizer, learning_rate=POOL_LEARNING_RATE),
                              mini_batches=POOL_MINI_BATCHES)
    return run.replace(train=train, train_pool=POOL, eval_split=run.spec.train_split, eval_tasks=POOL,
                       eval_seeds=seeds, held_out_tasks=POOL, updates=updates or POOL_UPDATES,
                       out_dir=os.path.join(results, "runs", "pool", method, f"seed{seed}"))


def smoke_run(method: str, seed: int, *, results: str = RESULTS) -> RunConfig:
    """2 updates of 2 groups × 4 rollouts × 6 steps, eval on 4 tasks, a 4-episode / 5-step warm start."""
    run = tiny_run(method, seed, results=results)
    run = run.with_sizes(num_groups=2, group_size=4, max_steps=6, micro_batch_size=12)
    return run.replace(updates=2, eval_every=1, eval_tasks=4,
                       eval_seeds=1, checkpoint_every=1,
                       out_dir=os.path.join(results, "runs", "smoke", method, f"seed{seed}"),
                       warm_start=WarmStart(episodes=4, steps=5, batch_size=8, learning_rate=1e-3,
                                            cache_dir=os.path.join(results, "runs", "smoke", "warmstart")))


def _credit(run: RunConfig, **params) -> RunConfig:
    return run.replace(train=run.train.replace(credit=dataclasses.replace(run.train.credit, **params)))


def ablation_runs(base: RunConfig, seed: int = 0) -> dict[str, RunConfig]:
    """``{name: run}`` of every ablation of a CRBC ``base`` run (module docstring); ``out_dir`` per name."""
    if base.train.credit.method != "crbc":
        raise ValueError(f"the ablations vary CRBC's parameters; the base run uses {base.train.credit.method!r}")
    root = os.path.join(os.path.dirname(base.out_dir.rstrip("/")), "ablations")
    runs: dict[str, RunConfig] = {}
    for k in DEPTHS:
        runs[f"depth_{'inf' if k is None else k}"] = _credit(base, depth=k)
    for w in STEP_WEIGHTS:
        runs[f"w_step_{w:g}"] = _credit(base, w_step=w)
    for b in BETAS:
        runs[f"beta_{b:g}"] = _credit(base, beta=b)
    for g in GROUP_SIZES:
        ro = base.train.rollout
        rows, micro = ro.num_groups * g * ro.max_steps, base.train.micro_batch_size
        while rows % (micro * base.train.mini_batches):  # keep mini-batches of whole micro-batches
            micro //= 2
        runs[f"group_{g}"] = base.with_sizes(group_size=g, micro_batch_size=micro)
    return {name: run.replace(train=run.train.replace(seed=seed), out_dir=os.path.join(root, name, f"seed{seed}"))
            for name, run in runs.items()}


def base_run(preset: str, env: str = "sokoban") -> RunConfig:
    """The CRBC run the ablations start from: ``tiny`` (Sokoban, CPU) or ``paper-1.5b`` / ``paper-7b``."""
    if preset == "tiny":
        return tiny_run("crbc", 0)
    return paper("crbc", env, preset.removeprefix("paper-")).replace(
        out_dir=os.path.join(RESULTS, "runs", preset, env, "crbc"))
