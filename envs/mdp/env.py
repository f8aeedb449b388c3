"""The credit-testbed MDPs as an environment on the protocol of :class:`envs.base.Env`.

A task is a seed: ``reset(task)`` builds (or reuses) the MDP of ``(task.seed, env.config)`` and starts at its
start state. The setting is an :class:`~envs.mdp.config.MDPConfig` (``MDPEnv(config)``) or the name of a
pre-registered one (``MDPEnv(setting="s2")``, :mod:`envs.mdp.settings`; what the trainer's ``--env-kwargs``
pass). ``seed_offset`` shifts the family member a task plays: task seed ``k`` plays the MDP of seed
``k + seed_offset``, so a run on the first N train tasks (``RunConfig.train_pool``) can play any N consecutive
members of the setting's family (one set per training seed). ``Obs.text`` and ``Obs.anchor`` are both the state's
observation (``"room 17. exits: north, ladder, blue door"``, :mod:`envs.mdp.text`), ``Obs.admissible`` its action
labels in the same order, and the step cap is the setting's (``MDPConfig.step_cap``).

Actions are labels, matched after lower-casing and collapsing white space. Any other string is *invalid*: the
state does not change, the observation is the same, the reward is 0 and ``info["valid"]`` is False (as in
Sokoban; the trainer applies the invalid penalty); it still counts towards the step cap. A valid action moves
to a successor drawn from ``P(·|s, a)``; entering the goal wins (reward 1, ``done``), entering the pit ends the
episode (reward 0, ``done``, ``info["dead_end"]``). ``info`` also carries ``state_id`` (the index of the new
state, for looking up exact values) and ``slipped`` (the successor is not the action's intended one).

Randomness. The slips are drawn from a generator of the episode: with ``task.meta["sample_seed"]`` it is seeded
from ``(task.seed, sample_seed)`` (reproducible; give each rollout of a group its own sample seed), otherwise
it is drawn from the environment's own stream (``sampling_seed``; None: fresh entropy), so that the rollouts
of a group on identical environments see independent slips. The trainer's collector gives every episode its own
sample seed, drawn from the batch's key and the episode's slot (``CollectConfig.sample_seeds``, which the ``mdp``
collector preset turns on): a batch's slips are then a function of its key, so runs and resumed runs repeat them
and evaluation sees the same slips in the same episode at every eval point. :meth:`MDPEnv.snapshot` records the
generator's state, so a restored episode has the same future as the original for the same actions.

Tasks (fixed manifests; the model is generated at reset from the seed and the environment's setting)::

    split    seeds                          task ids
    train    0 .. 9_999                     mdp-<seed>
    valid    1_000_000 .. 1_000_499         mdp-<seed>
    test     2_000_000 .. 2_000_499         mdp-<seed>
"""

from __future__ import annotations

import bisect
import functools
from typing import Any, ClassVar, NamedTuple

import numpy as np

from envs.base import Env, Obs, Task, step_info
from envs.mdp.config import MDPConfig
from envs.mdp.generate import generate_mdp
from envs.mdp.model import MDP
from envs.mdp.settings import setting as named_setting
from envs.mdp.solve import Optimal, optimal
from envs.mdp.text import INSTRUCTION, normalize, vocabulary

INVALID_ACTION_REWARD = 0.0  # the trainer applies the invalid penalty from info["valid"]

SPLITS: dict[str, range] = {
    "train": range(0, 10_000),
    "valid": range(1_000_000, 1_000_500),
    "test": range(2_000_000, 2_000_500),
}


class MDPSnapshot(NamedTuple):
    """Everything :meth:`MDPEnv.restore` needs; picklable."""

    task: Task  # the task the episode was reset to
    state: int  # the current state's index
    steps: int  # actions taken so far (valid or not)
    done: bool  # the episode has ended
    rng_state: dict[str, Any]  # the episode generator's state (numpy bit generator ``state``)


class _Tables(NamedTuple):
    """Per-model lookups an episode needs at every step."""

    model: MDP
    obs: tuple[Obs, ...]  # [S] the observation of each state
    action_index: tuple[dict[str, int], ...]  # [S] normalized label -> action slot
    support: tuple[tuple[tuple[tuple[int, ...], tuple[float, ...]], ...], ...]  # [S][a] (successors, cum. probs)


class MDPEnv(Env):
    """A generated MDP per task seed, under one setting (module docstring)."""

    name: ClassVar[str] = "mdp"

    def __init__(self, config: MDPConfig | None = None, sampling_seed: int | None = None, setting: str | None = None,
                 seed_offset: int = 0):
        if config is not None and setting is not None:
            raise ValueError(f"mdp: give a config or a setting name, not both (setting={setting!r})")
        if not isinstance(seed_offset, int) or seed_offset < 0:
            raise ValueError(f"mdp: seed_offset must be an int >= 0, got {seed_offset!r}")
        config = named_setting(setting) if setting is not None else config if config is not None else MDPConfig()
        super().__init__(config.step_cap)
        self.config = config
        self.seed_offset = seed_offset  # task seed k plays the MDP of seed k + seed_offset
        self._stream = np.random.default_rng(sampling_seed)
        self._tables: _Tables | None = None
        self.state = -1  # the current state's index
        self.rng: np.random.Generator | None = None  # the episode's generator

    @property
    def model(self) -> MDP:
        """The current task's MDP."""
        if self._tables is None:
            raise RuntimeError("mdp: no model before reset()")
        return self._tables.model

    # -- the protocol ----------------------------------------------------------------------------------------------
    def _reset(self, task: Task) -> Obs:
        self._tables = _tables(self.mdp_seed(task), self.config)
        if "sample_seed" in task.meta:
            self.rng = np.random.default_rng([task.seed, int(task.meta["sample_seed"])])
        else:
            self.rng = np.random.default_rng(self._stream.integers(2**63))
        self.state = self._tables.model.start
        return self._tables.obs[self.state]

    def _step(self, action: str) -> tuple[Obs, float, bool, dict[str, Any]]:
        tables, s = self._tables, self.state
        a = tables.action_index[s].get(normalize(action))
        if a is None:
            info = step_info(won=False, truncated=False, valid=False, state_id=s, slipped=False, dead_end=False)
            return tables.obs[s], INVALID_ACTION_REWARD, False, info
        successors, cumulative = tables.support[s][a]
        nxt = successors[min(bisect.bisect_right(cumulative, self.rng.random()), len(successors) - 1)]
        model = tables.model
        won, done = bool(model.goal_s[nxt]), bool(model.terminal_s[nxt])
        self.state = nxt
        info = step_info(won=won, truncated=False, valid=True, state_id=nxt,
                         slipped=nxt != int(model.next_sa[s, a]), dead_end=done and not won)
        return tables.obs[nxt], float(won), done, info

    def snapshot(self) -> MDPSnapshot:
        if self.task is None or self.rng is None:
            raise RuntimeError("mdp: snapshot() before reset()")
        return MDPSnapshot(self.task, self.state, self.steps, self.done, self.rng.bit_generator.state)

    def restore(self, snapshot: MDPSnapshot) -> Obs:
        task, state, steps, done, rng_state = snapshot
        if task.env != self.name:
            raise ValueError(f"snapshot of a {task.env!r} task, not {self.name!r}")
        tables = _tables(self.mdp_seed(task), self.config)
        if not 0 <= state < tables.model.num_states or not 0 <= steps <= self.max_steps:
            raise ValueError(f"mdp: snapshot state {state} / steps {steps} do not fit task {task.task_id!r}")
        rng = np.random.Generator(np.random.PCG64())
        rng.bit_generator.state = rng_state
        self._tables, self.task, self.state, self.steps, self.done, self.rng = tables, task, int(state), int(steps), \
            bool(done), rng
        return tables.obs[self.state]

    def oracle(self) -> str:
        """The optimal action (:func:`envs.mdp.solve.optimal`: the highest success probability, ties to the
        higher discounted value) at the current state with the steps that are left."""
        if self._tables is None:
            raise RuntimeError("mdp: oracle() before reset()")
        if self.done or self.model.terminal_s[self.state]:
            raise RuntimeError("mdp: oracle() after the episode ended")
        action = _optimal(self.mdp_seed(self.task), self.config).action_hs[self.max_steps - self.steps, self.state]
        return self.model.labels[self.state][action]

    def mdp_seed(self, task: Task) -> int:
        """The seed of the MDP this environment plays for ``task``: ``task.seed + seed_offset``."""
        return task.seed + self.seed_offset

    def model_of(self, task: Task) -> MDP:
        """The MDP this environment plays for ``task`` (its setting and seed offset; cached)."""
        return _tables(self.mdp_seed(task), self.config).model

    def observations(self, task: Task) -> tuple[Obs, ...]:
        """``[S]`` the observation this environment shows in each state of ``task``'s MDP (terminal ones included)."""
        return _tables(self.mdp_seed(task), self.config).obs

    @staticmethod
    def vocabulary() -> tuple[str, ...]:
        """Every word an observation, a label or the instruction can contain (:func:`envs.mdp.text.vocabulary`)."""
        return vocabulary()

    @classmethod
    def tasks(cls, split: str) -> list[Task]:
        """The fixed manifest of a split (module docstring); models are generated at reset."""
        if split not in SPLITS:
            raise ValueError(f"unknown mdp split {split!r}; one of {sorted(SPLITS)}")
        return list(_manifest(split))


def mdp_of(task: Task, config: MDPConfig) -> MDP:
    """The MDP an :class:`MDPEnv` with this setting (and no seed offset) plays for a task (cached)."""
    return _tables(task.seed, config).model


@functools.lru_cache(maxsize=1024)
def _tables(seed: int, config: MDPConfig) -> _Tables:
    model = generate_mdp(seed, config)
    obs = tuple(Obs(model.text(s), model.text(s), model.labels[s], INSTRUCTION) for s in range(model.num_states))
    index = tuple({normalize(label): a for a, label in enumerate(labels)} for labels in model.labels)
    return _Tables(model, obs, index, tuple(_support(model, s) for s in range(model.num_states)))


def _support(model: MDP, s: int) -> tuple[tuple[tuple[int, ...], tuple[float, ...]], ...]:
    """Per admissible action of ``s``: the successors with positive probability and their cumulative probabilities."""
    rows = []
    for a in range(int(model.num_actions_s[s])):
        successors = np.nonzero(model.p_sat[s, a] > 0)[0]
        rows.append((tuple(int(t) for t in successors), tuple(np.cumsum(model.p_sat[s, a, successors]).tolist())))
    return tuple(rows)


@functools.lru_cache(maxsize=1024)
def _optimal(seed: int, config: MDPConfig) -> Optimal:
    return optimal(_tables(seed, config).model)


@functools.lru_cache(maxsize=8)
def _manifest(split: str) -> tuple[Task, ...]:
    return tuple(Task(env="mdp", task_id=f"mdp-{seed}", split=split, seed=seed) for seed in SPLITS[split])
