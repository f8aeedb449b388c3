"""CRBC credit analysis on real Sokoban rollout groups (the helper of ``notebooks/crbc_credit_analysis.ipynb``).

Three pieces, each plain functions over host arrays or a `GroupView`:

1. **Rollout groups from a scripted stochastic policy.** No LLM: the behaviour policy is ε-greedy around the
   environment's BFS oracle (:meth:`envs.sokoban.SokobanEnv.oracle`), ``π(a|s) = (1 − ε)·1[a = oracle(s)] + ε/4``
   over the four moves, so it is always valid and Markov in the room state. ``G = 8`` rollouts per group run
   from the same reset (one Sokoban task) in a real :class:`~envs.sokoban.SokobanEnv` (15-step limit). Rows
   follow the collector's conventions (``agentjax.rollout.collect``): reward ``10·won`` on the last step
   (METHODS.md, ``reward="success"``) or Sokoban's own shaped reward (``reward="env"``), minus 0.1 for an
   invalid action (never, here); anchors and actions are :func:`~agentjax.rollout.hash_texts` of the exact
   observation grid and of the action word (a hash collision inside a group raises); token fields are dummies.
2. **Exact Q^π.** A 6×6 one-box room has at most a few hundred reachable states, so for the scripted policy
   and horizon H = 15 the finite-horizon values are one backward recursion over ``(state, steps left h)``::

       Q_h(s,a) = r(s,a) + γ · 1[s' not solved] · V_{h−1}(s'),   V_h(s) = Σ_a π(a|s) Q_h(s,a),   V_0 = 0

   with ``r(s,a) = 1[s' solved]`` (``objective="success"``: V is the γ-discounted success probability, the
   quantity CRBC's closure estimates with γ = β) or Sokoban's reward (``objective="env"``). A visit at step t
   has ``h = H − t`` steps left; its true advantage is ``A = Q_h(s_t,a_t) − V_h(s_t)``. A truncated episode
   scores 0 (a failure), as in the credit kernels.
3. **Analyses.** Coverage of eligible visits by closure depth (:func:`agentjax.credit.batched_coverage`; papers
   CRBC.txt §D.2, Figure 5), ``V⁽ᴷ⁾`` converging to the closure (Proposition 1) and to the truth, and the
   correlation (Pearson, Spearman, group-bootstrap intervals) of each method's per-step credit with the true
   advantage.

Choices and deviations (also stated in the notebook): the paper's Sokoban policy sees an RGB image; here the
anchor is RAGEN's text grid (exact state, no aliasing). The empirical process is time-homogeneous (an anchor
is a room state, without the step count) while the true values depend on the steps left. Rooms with a
shortest solution shorter than ``min_solution_steps`` (3) are skipped: 37% of the first 600 train rooms are
solved in one or two moves, where every method's credit is trivial.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from agentjax.credit import (
    batched_coverage,
    batched_crbc,
    batched_gigpo,
    batched_graphgpo,
    batched_grpo,
    batched_hgpo,
    batched_rloo,
)
from agentjax.credit import crbc_process as cp
from agentjax.rollout import GroupView, StepBatch, hash_texts, to_groups
from envs.sokoban import ACTIONS, SokobanEnv, SokobanState, oracle_action, solution_length
from envs.sokoban.room import is_solved, step_room

INVALID_PENALTY = 0.1
SUCCESS_REWARD = 10.0
REWARDS = ("success", "env")
OBJECTIVES = ("success", "env")
METHODS = ("GRPO", "RLOO", "GiGPO", "HGPO", "GraphGPO", "CRBC")  # the advantages a trainer would use


# -- configuration ----------------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class AnalysisConfig:
    """Settings of one analysis run; :meth:`full` is the notebook's default, :meth:`small` the CI run."""

    epsilons: tuple[float, ...] = (0.1, 0.25, 0.5)  # ε of the scripted policy, one set of groups each
    groups_per_epsilon: int = 96  # groups (rooms) per ε; the same rooms for every ε
    group_size: int = 8  # G rollouts per group
    horizon: int = 15  # the env's step limit H
    seed: int = 0  # room choice and action sampling
    reward: str = "success"  # "success": 10·won (METHODS.md); "env": Sokoban's shaped reward
    min_solution_steps: int = 3  # skip rooms solvable in fewer moves
    depths: tuple[int, ...] = (0, 1, 2, 3, 4, 6, 8)  # finite closure depths K of coverage / CRBC (∞ added)
    value_depth: int = 30  # V⁽ᴷ⁾ for K = 0..value_depth in the convergence figure
    beta: float = 0.98  # CRBC's β, also the discount of the reference truth
    truth_discounts: tuple[float, ...] = (0.98, 0.95, 1.0)  # true advantages at these γ (first: the reference)
    bootstrap: int = 100  # group-bootstrap resamples for the correlation intervals (0: none)
    out: str = "notebooks/results/crbc_credit_analysis.json"  # JSON path; PNGs beside it

    @classmethod
    def full(cls) -> AnalysisConfig:
        return cls()

    @classmethod
    def small(cls) -> AnalysisConfig:
        return cls(epsilons=(0.2, 0.5), groups_per_epsilon=6, depths=(0, 2), value_depth=10,
                   truth_discounts=(0.98, 1.0), bootstrap=20)

    def __post_init__(self):
        if not self.epsilons or any(not 0.0 <= e <= 1.0 for e in self.epsilons):
            raise ValueError(f"epsilons must be a non-empty list of values in [0, 1], got {self.epsilons}")
        for name in ("groups_per_epsilon", "group_size", "horizon", "min_solution_steps", "value_depth"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.min_solution_steps > self.horizon:
            raise ValueError(f"min_solution_steps ({self.min_solution_steps}) must not exceed horizon ({self.horizon})")
        if self.reward not in REWARDS:
            raise ValueError(f"reward must be one of {REWARDS}, got {self.reward!r}")
        if any(k < 0 for k in self.depths):
            raise ValueError(f"depths are finite closure depths >= 0 (K = ∞ is always added), got {self.depths}")
        if not 0.0 < self.beta <= 1.0 or any(not 0.0 < g <= 1.0 for g in self.truth_discounts):
            raise ValueError("beta and truth_discounts must lie in (0, 1]")
        if not self.truth_discounts or self.bootstrap < 0:
            raise ValueError("truth_discounts must be non-empty and bootstrap >= 0")


ENV_VARS = {  # variable -> (field, parser)
    "CRBC_NB_EPSILONS": ("epsilons", lambda s: tuple(float(x) for x in s.split(","))),
    "CRBC_NB_GROUPS": ("groups_per_epsilon", int),
    "CRBC_NB_GROUP_SIZE": ("group_size", int),
    "CRBC_NB_SEED": ("seed", int),
    "CRBC_NB_REWARD": ("reward", str.strip),
    "CRBC_NB_MIN_SOLUTION": ("min_solution_steps", int),
    "CRBC_NB_DEPTHS": ("depths", lambda s: tuple(int(x) for x in s.split(","))),
    "CRBC_NB_VALUE_DEPTH": ("value_depth", int),
    "CRBC_NB_BOOTSTRAP": ("bootstrap", int),
    "CRBC_NB_OUT": ("out", str),
}


def notebook_config(cls: Any, env_vars: Mapping[str, tuple[str, Callable[[str], Any]]],
                    environ: Mapping[str, str]) -> Any:
    """A notebook's settings: ``cls.small()`` if ``AGENTJAX_NOTEBOOK_SMALL=1`` else ``cls.full()``, each field of
    ``env_vars`` (``{VARIABLE: (field, parse)}``) overridden where the variable is set. A value that does not parse
    raises ``ValueError`` naming the variable and the expected form (shared with experiments/sero/reachability.py).
    """
    small = environ.get("AGENTJAX_NOTEBOOK_SMALL", "0").strip()
    if small not in ("0", "1", ""):
        raise ValueError(f"AGENTJAX_NOTEBOOK_SMALL must be 0 or 1, got {small!r}")
    base = cls.small() if small == "1" else cls.full()
    updates = {}
    for var, (field, parse) in env_vars.items():
        if environ.get(var, "").strip():
            try:
                updates[field] = parse(environ[var])
            except ValueError as e:
                default = getattr(base, field)
                form = ",".join(map(str, default)) if isinstance(default, tuple) else default
                raise ValueError(f"{var}={environ[var]!r} does not parse ({e}); expected a value like {form!r}") from e
    try:
        return dataclasses.replace(base, **updates)
    except ValueError as e:
        given = ", ".join(f"{var}={environ[var]!r}" for var in env_vars if environ.get(var, "").strip())
        raise ValueError(f"{e} (from the environment: {given})") from e


def config_from_env(environ: Mapping[str, str] = os.environ) -> AnalysisConfig:
    """:meth:`AnalysisConfig.small` or ``full`` overridden by :data:`ENV_VARS` (:func:`notebook_config`)."""
    return notebook_config(AnalysisConfig, ENV_VARS, environ)


# -- the scripted policy and its rollouts -----------------------------------------------------------------------------
def policy_probs(state: SokobanState, epsilon: float) -> np.ndarray:
    """[4] ``π(a|s) = (1 − ε)·1[a = oracle(s)] + ε/4`` over :data:`ACTIONS` (Up, Down, Left, Right)."""
    p = np.full(len(ACTIONS), epsilon / len(ACTIONS))
    p[ACTIONS.index(oracle_action(state))] += 1.0 - epsilon
    return p


class Rollouts(NamedTuple):
    """Scripted rollout groups: the batch the credit kernels see plus host data for the exact values."""

    batch: StepBatch  # one row per turn, rows ordered (group, rollout, step), no padding
    view: GroupView  # to_groups(batch), [G, R, T] with T = horizon
    epsilon_g: np.ndarray  # [G] float, ε of the group's policy
    task_g: np.ndarray  # [G] int, Sokoban task seed of the group
    start_g: tuple[SokobanState, ...]  # [G] reset state of the group
    state_n: tuple[SokobanState, ...]  # [N] room state before the turn
    group_n: np.ndarray  # [N] int
    rollout_n: np.ndarray  # [N] int
    step_n: np.ndarray  # [N] int, t; steps left = horizon − t
    action_n: np.ndarray  # [N] int, index into ACTIONS


def choose_rooms(num_rooms: int, *, seed: int, min_solution_steps: int, horizon: int) -> list[int]:
    """Train-split task seeds in a seeded random order whose shortest solution has >= ``min_solution_steps``."""
    if not 1 <= min_solution_steps <= horizon:
        raise ValueError(f"min_solution_steps must lie in 1..horizon ({horizon}), got {min_solution_steps}")
    tasks = SokobanEnv.tasks("train")
    env = SokobanEnv(max_steps=horizon)
    chosen = []
    for i in np.random.default_rng(seed).permutation(len(tasks)):
        env.reset(tasks[i])
        n = solution_length(env.state)
        if n is not None and min_solution_steps <= n <= horizon:
            chosen.append(int(i))
            if len(chosen) == num_rooms:
                return chosen
    raise ValueError(f"only {len(chosen)} train rooms need {min_solution_steps}..{horizon} moves; "
                     "lower min_solution_steps or ask for fewer groups")


def run_group(env: SokobanEnv, task_index: int, epsilon: float, num_rollouts: int, rng: np.random.Generator):
    """``num_rollouts`` episodes of the ε-oracle policy from the task's reset state: per episode a list of
    (state, anchor text, action index, env reward, won, next anchor text)."""
    task = SokobanEnv.tasks("train")[task_index]
    episodes = []
    for _ in range(num_rollouts):
        obs = env.reset(task)
        turns, done = [], False
        while not done:
            state = env.state
            a = int(rng.choice(len(ACTIONS), p=policy_probs(state, epsilon)))
            next_obs, reward, done, info = env.step(ACTIONS[a])
            if not info["valid"]:
                raise RuntimeError(f"scripted action {ACTIONS[a]!r} was invalid")  # cannot happen: env contract
            turns.append((state, obs.anchor, a, reward, bool(info["won"]), next_obs.anchor))
            obs = next_obs
        episodes.append(turns)
    return episodes


def collect_groups(config: AnalysisConfig) -> Rollouts:
    """Every (ε, room) group of the config as one `StepBatch` (module docstring, point 1)."""
    rooms = choose_rooms(config.groups_per_epsilon, seed=config.seed, min_solution_steps=config.min_solution_steps,
                         horizon=config.horizon)
    env = SokobanEnv(max_steps=config.horizon)
    cols = {k: [] for k in ("group", "task", "rollout", "step", "anchor", "next_anchor", "action", "valid", "won",
                            "reward", "done", "terminated", "truncated")}
    state_n = []
    eps_g, task_g, start_g = [], [], []
    for e_i, eps in enumerate(config.epsilons):
        for r_i, task_index in enumerate(rooms):
            g = len(eps_g)
            rng = np.random.default_rng([config.seed, e_i, r_i])
            episodes = run_group(env, task_index, eps, config.group_size, rng)
            eps_g.append(eps)
            task_g.append(task_index)
            start_g.append(episodes[0][0][0])
            for r, turns in enumerate(episodes):
                for t, (state, anchor, a, env_reward, won, next_anchor) in enumerate(turns):
                    last = t == len(turns) - 1
                    base = SUCCESS_REWARD * won if config.reward == "success" else env_reward
                    row = dict(group=g, task=task_index, rollout=r, step=t, anchor=anchor, next_anchor=next_anchor,
                               action=ACTIONS[a], valid=True, won=won and last, reward=base, done=last,
                               terminated=last and won, truncated=last and not won)
                    for k, v in row.items():
                        cols[k].append(v)
                    state_n.append(state)
    group_n = np.asarray(cols["group"], np.int32)
    anchor_n = _checked_hash(cols["anchor"] + cols["next_anchor"], np.concatenate([group_n, group_n]))
    n = len(group_n)
    dtypes = dict(valid=bool, won=bool, done=bool, terminated=bool, truncated=bool, reward=np.float32)
    fields = {k: np.asarray(v, dtype=dtypes.get(k, np.int32)) for k, v in cols.items()
              if k not in ("anchor", "next_anchor", "action")}
    fields["reward"] = fields["reward"] - np.float32(INVALID_PENALTY) * ~fields["valid"]
    fields.update(anchor=anchor_n[:n], next_anchor=anchor_n[n:], action=_checked_hash(cols["action"], group_n))
    batch = StepBatch.from_rows(n, 1, 1, **fields)  # dummy one-token prompt / response fields
    view = to_groups(batch, num_groups=len(eps_g), num_rollouts=config.group_size, max_steps=config.horizon)
    return Rollouts(
        batch=batch, view=view, epsilon_g=np.asarray(eps_g), task_g=np.asarray(task_g), start_g=tuple(start_g),
        state_n=tuple(state_n), group_n=group_n, rollout_n=fields["rollout"], step_n=fields["step"],
        action_n=np.asarray([ACTIONS.index(a) for a in cols["action"]], np.int32),
    )


def _checked_hash(texts: Sequence[str], group_n: np.ndarray) -> np.ndarray:
    """:func:`hash_texts`, raising if two different texts of one group share an id."""
    ids = hash_texts(texts)
    g = group_n.tolist()
    if len(set(zip(g, texts, strict=True))) != len(set(zip(g, ids.tolist(), strict=True))):
        raise ValueError("two texts of one group hash to the same id; use agentjax.rollout.group_local_ids")
    return ids


# -- exact values of the scripted policy ------------------------------------------------------------------------------
class ExactValues(NamedTuple):
    """Finite-horizon values of the ε-oracle policy on one room's reachable states."""

    index: dict[SokobanState, int]  # state -> row of the tables
    q_hsa: np.ndarray  # [H + 1, S, 4] Q_h(s, a); h = steps left (Q_0 = 0)
    v_hs: np.ndarray  # [H + 1, S] V_h(s)
    pi_sa: np.ndarray  # [S, 4] the policy


def reachable_states(start: SokobanState):
    """All states reachable from ``start`` (solved states are terminal: not expanded).

    Returns (states [S], next index [S, 4], solved successor [S, 4] bool, env reward [S, 4]).
    """
    states, index, frontier = [start], {start: 0}, 0
    nxt, solved, reward = [], [], []
    while frontier < len(states):
        s = states[frontier]
        frontier += 1
        row_n, row_s, row_r = [], [], []
        for action in ACTIONS:
            if is_solved(s):
                child, r, done = s, 0.0, True
            else:
                step = step_room(s, action)
                child, r, done = step.state, step.reward, step.solved
            if child not in index:
                index[child] = len(states)
                states.append(child)
            row_n.append(index[child])
            row_s.append(done)
            row_r.append(r)
        nxt.append(row_n)
        solved.append(row_s)
        reward.append(row_r)
    return states, np.asarray(nxt), np.asarray(solved), np.asarray(reward, np.float64)


@functools.lru_cache(maxsize=4096)
def exact_values(start: SokobanState, epsilon: float, *, horizon: int, discount: float,
                 objective: str = "success") -> ExactValues:
    """``Q_h``, ``V_h`` for h = 0..H by backward recursion (module docstring, point 2).

    Args:
      start: the room's reset state (must not be solved). epsilon: the policy's ε. horizon: H.
      discount: γ. objective: "success" (reward 1 on the solving move) or "env" (Sokoban's shaped reward).
    """
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {OBJECTIVES}, got {objective!r}")
    if is_solved(start):
        raise ValueError("exact_values: the start state is already solved; there is nothing to evaluate")
    states, nxt_sa, solved_sa, env_r_sa = reachable_states(start)
    pi_sa = np.stack([policy_probs(s, epsilon) for s in states])
    terminal_s = np.asarray([is_solved(s) for s in states])
    r_sa = solved_sa.astype(np.float64) if objective == "success" else env_r_sa
    q_hsa = np.zeros((horizon + 1, len(states), len(ACTIONS)))
    v_hs = np.zeros((horizon + 1, len(states)))
    for h in range(1, horizon + 1):
        q_hsa[h] = r_sa + discount * np.where(solved_sa, 0.0, v_hs[h - 1][nxt_sa])
        q_hsa[h, terminal_s] = 0.0
        v_hs[h] = np.sum(pi_sa * q_hsa[h], axis=1)
    return ExactValues({s: i for i, s in enumerate(states)}, q_hsa, v_hs, pi_sa)


class TrueValues(NamedTuple):
    q_n: np.ndarray  # [N] Q^π_h(s_t, a_t), h = H − t
    v_n: np.ndarray  # [N] V^π_h(s_t)
    adv_n: np.ndarray  # [N] Q − V


def true_values(rollouts: Rollouts, *, horizon: int, discount: float, objective: str = "success") -> TrueValues:
    """Exact ``Q^π``, ``V^π`` and advantage at every visited (s, a, t) of ``rollouts``."""
    q_n, v_n = np.zeros(len(rollouts.state_n)), np.zeros(len(rollouts.state_n))
    for n, (state, g, t, a) in enumerate(zip(rollouts.state_n, rollouts.group_n, rollouts.step_n, rollouts.action_n,
                                             strict=True)):
        ex = exact_values(rollouts.start_g[g], float(rollouts.epsilon_g[g]), horizon=horizon, discount=discount,
                          objective=objective)
        i, h = ex.index[state], horizon - int(t)
        q_n[n], v_n[n] = ex.q_hsa[h, i, a], ex.v_hs[h, i]
    return TrueValues(q_n, v_n, q_n - v_n)


# -- credits of every method ------------------------------------------------------------------------------------------
def method_credits(view: GroupView, *, beta: float = 0.98, depths: Sequence[int] = ()) -> dict[str, np.ndarray]:
    """[G, R, T] per-step advantage of each method with its METHODS.md defaults, plus step terms alone.

    ``GiGPO step term`` is ``A^S`` (GiGPO with w = 1 minus GiGPO with w = 0), ``CRBC step term`` is ĉ,
    ``CRBC Q − V`` the raw closure credit c (unnormalised, ungated), ``CRBC K=k`` CRBC's advantage at depth k.
    """
    crbc = batched_crbc(view, beta=beta)
    gigpo = batched_gigpo(view)
    out = {
        "GRPO": batched_grpo(view),
        "RLOO": batched_rloo(view),
        "GiGPO": gigpo,
        "HGPO": batched_hgpo(view),
        "GraphGPO": batched_graphgpo(view),
        "CRBC": crbc.advantage,
        "GiGPO step term": gigpo - batched_gigpo(view, step_weight=0.0),
        "CRBC step term": crbc.credit,
        "CRBC Q − V": jnp.where(view.mask, crbc.q - crbc.v, 0.0),
    }
    for k in depths:
        out[f"CRBC K={k}"] = batched_crbc(view, beta=beta, depth=k).advantage
    return {name: np.asarray(x) for name, x in out.items()}


def to_rows(values_grt: np.ndarray, rollouts: Rollouts) -> np.ndarray:
    """[N] the per-visit values of a [G, R, T] array at the rows of ``rollouts``."""
    return np.asarray(values_grt)[rollouts.group_n, rollouts.rollout_n, rollouts.step_n]


def average_ranks(x: np.ndarray) -> np.ndarray:
    """[n] ranks 1..n of ``x``, ties sharing the mean of their ranks (Spearman's convention)."""
    x = np.asarray(x)
    order = np.argsort(x, kind="stable")
    sorted_x = x[order]
    starts = np.flatnonzero(np.r_[True, sorted_x[1:] != sorted_x[:-1]])
    sizes = np.diff(np.r_[starts, len(x)])
    ranks = np.empty(len(x))
    ranks[order] = np.repeat(starts + (sizes + 1) / 2.0, sizes)
    return ranks


def correlation(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """(Pearson, Spearman with average ranks for ties); NaN when either input is constant or has < 2 values."""
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"correlation: need two equal-length 1-D arrays, got {x.shape} and {y.shape}")

    def pearson(a, b):
        if np.ptp(a) == 0.0 or np.ptp(b) == 0.0:  # constant: undefined
            return float("nan")
        a, b = a - a.mean(), b - b.mean()
        return float(np.sum(a * b) / np.sqrt(np.sum(a * a) * np.sum(b * b)))

    if len(x) < 2:
        return float("nan"), float("nan")
    return pearson(x, y), pearson(average_ranks(x), average_ranks(y))


def accuracy_rows(credits_n: Mapping[str, np.ndarray], adv_n: np.ndarray, rollouts: Rollouts,
                  eligible_n: np.ndarray, *, bootstrap: int, seed: int = 0) -> list[dict]:
    """Correlation of every method's per-visit credit with the true advantage.

    One row per (method, visits ∈ {all, eligible}, ε ∈ {each, all}) with Pearson, Spearman, their 2.5/97.5%
    group-bootstrap percentiles (groups resampled with replacement, ``bootstrap`` times) and the visit count.
    """
    rows = []
    eps_n = rollouts.epsilon_g[rollouts.group_n]
    rng = np.random.default_rng(seed)
    for subset, sel_n in (("all", np.ones_like(eligible_n, bool)), ("eligible", eligible_n)):
        for eps in [*np.unique(rollouts.epsilon_g).tolist(), "all"]:
            keep_n = sel_n & ((eps_n == eps) if eps != "all" else True)
            groups = np.unique(rollouts.group_n[keep_n])
            rows_of = {g: np.flatnonzero(keep_n & (rollouts.group_n == g)) for g in groups}
            draws = [np.concatenate([rows_of[g] for g in rng.choice(groups, len(groups))])
                     for _ in range(bootstrap)] if len(groups) > 1 else []
            for name, c_n in credits_n.items():
                p, s = correlation(c_n[keep_n], adv_n[keep_n])
                boot = np.asarray([correlation(c_n[d], adv_n[d]) for d in draws]).reshape(-1, 2)
                lo, hi = (np.nanpercentile(boot, [2.5, 97.5], axis=0) if np.isfinite(boot).any()
                          else np.full((2, 2), np.nan))
                rows.append(dict(method=name, visits=subset, epsilon=eps, n=int(keep_n.sum()), pearson=p,
                                 spearman=s, pearson_lo=float(lo[0]), pearson_hi=float(hi[0]),
                                 spearman_lo=float(lo[1]), spearman_hi=float(hi[1])))
    return rows


def ranking(rows: Sequence[dict], *, metric: str, visits: str = "all", epsilon="all",
            methods: Sequence[str] = METHODS) -> list[tuple[str, float]]:
    """``(method, value)`` of :func:`accuracy_rows` for one slice, best first (NaN last)."""
    picked = [(r["method"], r[metric]) for r in rows
              if r["visits"] == visits and r["epsilon"] == epsilon and r["method"] in methods]
    return sorted(picked, key=lambda mv: -mv[1] if np.isfinite(mv[1]) else np.inf)


# -- coverage and convergence by closure depth ------------------------------------------------------------------------
def coverage_by_depth(view: GroupView, depths: Sequence[int | None], epsilon_g: np.ndarray) -> dict:
    """Coverage of eligible visits at each depth (None = full closure): papers/CRBC.txt §D.2, Figure 5.

    Per depth: the share of eligible visits whose value draws on all R rollouts, on at least 2 (another
    rollout's evidence), the mean count, the histogram of counts 0..R, and the all-R share per ε. Also the
    paired K = 0 vs full-closure count matrix and the share of eligible visits whose coverage grows.
    """
    r_len = view.mask.shape[1]
    by_depth, counts = {}, {}
    eligible = None
    for k in depths:
        c_grt, e_grt = (np.asarray(x) for x in batched_coverage(view, depth=k))
        eligible = e_grt if eligible is None else eligible
        c = c_grt[eligible]
        counts[k] = c
        eps_of = np.broadcast_to(epsilon_g[:, None, None], eligible.shape)[eligible]
        by_depth["inf" if k is None else str(k)] = dict(
            share_all=float(np.mean(c == r_len)), share_multi=float(np.mean(c >= 2)), mean=float(np.mean(c)),
            hist=(np.bincount(c, minlength=r_len + 1) / max(len(c), 1)).tolist(),
            share_all_by_epsilon={str(e): float(np.mean(c[eps_of == e] == r_len)) for e in np.unique(epsilon_g)},
        )
    paired = np.zeros((r_len + 1, r_len + 1))
    if 0 in counts and None in counts:
        np.add.at(paired, (counts[0], counts[None]), 1.0)
    n = int(eligible.sum())
    return dict(by_depth=by_depth, eligible_visits=n, eligible_share=float(eligible.sum() / view.mask.sum()),
                paired_k0_inf=(paired / max(n, 1)).tolist(),
                share_increased=float(np.mean(counts[None] > counts[0])) if 0 in counts and None in counts else None)


@functools.partial(jax.jit, static_argnames=("beta", "max_depth"))
def depth_values(view: GroupView, *, beta: float, max_depth: int) -> jax.Array:
    """[K+1, G, M] ``V⁽ᴷ⁾(s_m)`` at every visit ``m = r·T + t`` for K = 0..max_depth (0 on padding).

    ``V⁽⁰⁾`` is :func:`~agentjax.credit.crbc_process.visit_local_values`, each further depth one
    :func:`~agentjax.credit.crbc_process.bellman_backup` (``V⁽ᴷ⁺¹⁾ = r_π + β P_π V⁽ᴷ⁾``), all in one scan.
    """
    proc = jax.vmap(functools.partial(cp.build_process, beta=beta))(view)

    def backup(v_gs, _):
        return jax.vmap(lambda v, p: cp.bellman_backup(v, p, beta))(v_gs, proc), v_gs

    _, v_kgs = jax.lax.scan(backup, jax.vmap(cp.visit_local_values)(proc), None, length=max_depth + 1)
    v_kgm = jnp.take_along_axis(v_kgs, jnp.broadcast_to(proc.state[None], (max_depth + 1, *proc.state.shape)), 2)
    return jnp.where(proc.mask[None], v_kgm, 0.0)


def value_convergence(view: GroupView, closure_v_grt: np.ndarray, true_v_n: np.ndarray, rollouts: Rollouts, *,
                      beta: float, max_depth: int) -> dict:
    """Finite-depth values against the closure and against the truth, per depth K = 0..max_depth.

    ``gap``: ``max_s |V⁽ᴷ⁾(s) − V(s)|`` per group (every state of the process is some visit's), its mean and
    max over groups, with Proposition 1's bound ``β^K max_s |V⁽⁰⁾ − V|``; ``truth_error``: the mean over
    visits of ``|V⁽ᴷ⁾(s_t) − V^π_{H−t}(s_t)|`` (``_inf``: the closure's).

    Args:
      view: [G, R, T] groups. closure_v_grt: [G, R, T] the closure value of each visit's state
        (``batched_crbc(view).v``, the π̂-average of the closure Q, equal to the solve's V).
      true_v_n: [N] true values at the rows of ``rollouts``. beta: β. max_depth: the largest K.
    """
    g_len, r_len, t_len = view.mask.shape
    v_kgm = np.asarray(depth_values(view, beta=beta, max_depth=max_depth))
    v_inf_gm = np.asarray(closure_v_grt).reshape(g_len, r_len * t_len)
    gap_kg = np.abs(v_kgm - v_inf_gm[None]).max(-1)  # padding: 0 in both
    bound_kg = beta ** np.arange(max_depth + 1)[:, None] * gap_kg[:1]
    m_n = rollouts.rollout_n * t_len + rollouts.step_n
    v_kn = v_kgm[:, rollouts.group_n, m_n]
    return dict(
        depths=list(range(max_depth + 1)), gap_mean=gap_kg.mean(1).tolist(), gap_max=gap_kg.max(1).tolist(),
        bound_mean=bound_kg.mean(1).tolist(), bound_holds=bool(np.all(gap_kg <= bound_kg + 1e-5)),
        truth_error=np.abs(v_kn - true_v_n[None]).mean(1).tolist(),
        truth_error_inf=float(np.abs(v_inf_gm[rollouts.group_n, m_n] - true_v_n).mean()),
    )


def summary(rollouts: Rollouts, horizon: int) -> dict:
    """Per ε: groups, visits, success rate, mean length, and the Monte Carlo check of V^π at the reset state."""
    view = rollouts.view
    success_gr, length_gr = np.asarray(view.success), np.asarray(view.length)
    out = {}
    for eps in np.unique(rollouts.epsilon_g):
        g = np.flatnonzero(rollouts.epsilon_g == eps)
        exact = np.asarray([exact_values(rollouts.start_g[i], float(eps), horizon=horizon, discount=1.0)
                            .v_hs[horizon, 0] for i in g])
        out[str(eps)] = dict(groups=len(g), visits=int(length_gr[g].sum()), success=float(success_gr[g].mean()),
                             mean_length=float(length_gr[g].mean()), exact_success=float(exact.mean()),
                             mc_stderr=float(success_gr[g].mean(1).std() / np.sqrt(len(g)) + 1e-12))
    return out


def write_json(path: str | os.PathLike, results: Mapping) -> None:
    """Write ``results`` as strict JSON (non-finite floats become ``null``), creating the folder."""

    def clean(x):
        if isinstance(x, Mapping):
            return {str(k): clean(v) for k, v in x.items()}
        if isinstance(x, list | tuple):
            return [clean(v) for v in x]
        if isinstance(x, np.generic):
            x = x.item()
        if isinstance(x, float) and not np.isfinite(x):
            return None
        return x

    path = os.fspath(path)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        json.dump(clean(results), f, indent=1, allow_nan=False)
        f.write("\n")
