"""The runs of the credit-testbed comparison (``README.md``, "The comparison"): arms, settings, seeds.

Every run is the library's tiny mdp preset (:func:`agentjax.train.presets.tiny`: a 2-layer, d = 64 policy from
random init, a word tokenizer, 4 groups × 8 rollouts an update on a pool of 4 MDPs, AdamW 5e-3) on one of the
pre-registered settings (``envs/mdp/settings.py``), with the setting's own step cap
(:func:`~agentjax.train.presets.env_step_cap`) and these changes, the same for every arm:

- training seed ``s``: the policy's init and sampling streams (``train.seed = s``) and the MDPs: the pool is the
  family members ``4s .. 4s + 3`` of the setting (``MDPEnv(seed_offset=4s)``), so every seed is its own set of
  MDPs and every arm of a seed trains on the same ones;
- :data:`UPDATES` updates, the exact evaluation every :data:`EVAL_EVERY` (and before the first update); the
  sampled evaluation beside it plays 1 episode per MDP (the exact one is what the tables read);
- one checkpoint, after the last update, for the final sampled check (:data:`CHECK_SEEDS` episodes per MDP).

Arms (:data:`ARMS`): the credit methods alone on S1 and S2; on S3 GraphGPO and CRBC alone, with SERO
(reachability weights), with SERO's root step only (``scheme="root_only"``) and with uniform weights on every
oracle step (``scheme="full_flat"``, METHODS.md "SERO" 7: Full-Flat, one shared branch weight of 1).
"""

from __future__ import annotations

import dataclasses
import os
from typing import NamedTuple

from agentjax.train.config import SeroConfig
from agentjax.train.presets import env_step_cap, tiny
from agentjax.train.runconfig import RunConfig

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")
RUNS = os.path.join(HERE, "runs")

METHODS = ("grpo", "rloo", "ppo", "gigpo", "hgpo", "graphgpo", "crbc")
SERO_SCHEMES = {"sero": "sero", "sero-root": "root_only", "sero-flat": "full_flat"}  # label suffix -> scheme
SETTINGS = ("s1", "s2", "s3")
SEEDS = tuple(range(10))
POOL = 4  # MDPs per run (the tiny preset's pool), one group each per update
UPDATES = 50
EVAL_EVERY = 5
CHECK_SEEDS = 64  # the final sampled check: POOL x CHECK_SEEDS = 256 episodes
THRESHOLD = 0.9  # exact success the "updates to" column waits for


class Arm(NamedTuple):
    """One arm of the comparison: a credit method, optionally with SERO under a weighting scheme."""

    method: str
    sero: str | None = None  # a SeroConfig scheme, or None: the method alone

    @property
    def label(self) -> str:
        if self.sero is None:
            return self.method
        suffix = next(k for k, v in SERO_SCHEMES.items() if v == self.sero)
        return f"{self.method}+{suffix}"

    @property
    def base(self) -> str | None:
        """The label of the arm without SERO (None for an arm without it)."""
        return self.method if self.sero is not None else None


def arm_of(label: str) -> Arm:
    """The arm of a label (``"crbc"``, ``"graphgpo+sero-root"``)."""
    method, _, suffix = label.partition("+")
    if method not in METHODS or (suffix and suffix not in SERO_SCHEMES):
        raise ValueError(f"unknown arm {label!r}: a method of {METHODS}, optionally +{'/+'.join(SERO_SCHEMES)}")
    return Arm(method, SERO_SCHEMES[suffix] if suffix else None)


ARMS: dict[str, tuple[Arm, ...]] = {
    "s1": tuple(Arm(m) for m in METHODS),
    "s2": tuple(Arm(m) for m in METHODS),
    "s3": tuple(Arm(m, scheme) for m in ("graphgpo", "crbc") for scheme in (None, *SERO_SCHEMES.values())),
}


def arm_run(setting: str, arm: Arm | str, seed: int, *, runs: str = RUNS, updates: int = UPDATES,
                eval_every: int = EVAL_EVERY) -> RunConfig:
    """The run of ``arm`` on ``setting`` with training seed ``seed`` (module docstring), in
    ``<runs>/<setting>/<label>/seed<seed>``."""
    arm = arm_of(arm) if isinstance(arm, str) else arm
    if setting not in SETTINGS:
        raise ValueError(f"unknown setting {setting!r}; one of {SETTINGS}")
    run = tiny(arm.method, "mdp")
    run = env_step_cap(run.replace(env_kwargs={"setting": setting, "seed_offset": POOL * seed}))
    train = run.train.replace(seed=seed, sero=SeroConfig(scheme=arm.sero) if arm.sero is not None else None)
    return run.replace(train=train, updates=updates, eval_every=eval_every, eval_seeds=1, checkpoint_every=updates,
                       keep_checkpoints=1, progress=False, tensorboard=False,
                       out_dir=os.path.join(runs, setting, arm.label, f"seed{seed}"))


def comparison(settings: tuple[str, ...] = SETTINGS, seeds: tuple[int, ...] = SEEDS, *, runs: str = RUNS,
               **sizes: int) -> dict[tuple[str, str, int], RunConfig]:
    """``{(setting, label, seed): run}`` of the whole comparison, seed by seed (every arm of every setting has seed 0
    before any has seed 1, so a partial comparison has whole seeds everywhere)."""
    return {(s, arm.label, seed): arm_run(s, arm, seed, runs=runs, **sizes)
            for seed in seeds for s in settings for arm in ARMS[s]}


def with_updates(run: RunConfig, updates: int, eval_every: int) -> RunConfig:
    """``run`` shortened (the quick path and the tests): ``updates`` updates, evaluated every ``eval_every``."""
    return dataclasses.replace(run, updates=updates, eval_every=eval_every, checkpoint_every=updates)
