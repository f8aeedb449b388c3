"""Exact policy evaluation and the optimal policy of an :class:`~envs.mdp.model.MDP`, for the episode as played.

The episode has a step cap H (``model.max_steps``), so values depend on the steps left ``h``; a visit at step t
(0-based) has ``h = H − t``. Everything here is one backward recursion over ``(h, s)``, exact for the capped
episode whether or not the cap binds (no linear solve: with loops the cap can bind, and then the stationary
values would be wrong)::

    Q_h(s, a) = Σ_s' P(s'|s,a) · (1[s' goal] + β · 1[s' not terminal] · V_{h−1}(s')),    V_0 = 0
    V_h(s)    = Σ_a π_h(a|s) · Q_h(s, a),        A_h(s, a) = Q_h(s, a) − V_h(s)

so ``V_H(start) = E[β^(T−1) · 1[won]]`` for an episode of T steps (reward 1 on the goal step, β per step
before it; a truncated episode scores 0), the quantity of ``experiments/crbc/credit_analysis.py``. With β = 1
the same recursion gives the success probability. Row ``h = 0`` of every array is zero (no step left); terminal
states and masked actions are zero too.

:func:`optimal` maximises the success probability by value iteration over the same time-indexed model; among
the actions that reach the maximum (within 1e-12) it takes the one with the highest discounted value, so with
no risk anywhere it follows a shortest path.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

import numpy as np

from envs.mdp.config import MDPConfig
from envs.mdp.generate import generate_mdp
from envs.mdp.model import MDP

BETA = 0.98  # the default discount (CRBC's β)
_TIE = 1e-12  # success probabilities this close are a tie


class Evaluation(NamedTuple):
    """Exact values of a policy; index ``[h, s]`` / ``[h, s, a]`` with ``h`` steps left (0 .. H)."""

    v_hs: np.ndarray  # [H+1, S] V^π_h(s), discounted success
    q_hsa: np.ndarray  # [H+1, S, A] Q^π_h(s, a)
    adv_hsa: np.ndarray  # [H+1, S, A] A^π_h(s, a) = Q − V (0 on masked actions)
    success_hs: np.ndarray  # [H+1, S] undiscounted success probability under π
    start_value: float  # V^π_H(start), a whole episode's discounted success
    start_success: float  # a whole episode's success probability


class Optimal(NamedTuple):
    """The optimal policy (max success probability, ties to the higher discounted value) and its values."""

    success_hs: np.ndarray  # [H+1, S] the maximal success probability
    v_hs: np.ndarray  # [H+1, S] the discounted value of this policy
    action_hs: np.ndarray  # [H+1, S] int, its action (-1 where none: h = 0 or terminal)
    pi_hsa: np.ndarray  # [H+1, S, A] the same policy, one-hot (uniform at h = 0, zero rows for terminal states)


def uniform_policy(model: MDP) -> np.ndarray:
    """[S, A] the uniform policy over each state's admissible actions (zero rows for terminal states)."""
    counts = np.maximum(model.num_actions_s, 1)
    return model.mask_sa / counts[:, None]


def evaluate(model: MDP, pi: np.ndarray, beta: float = BETA) -> Evaluation:
    """V^π, Q^π, A^π (discount β) and the success probability of a policy, exactly (module docstring).

    Args:
      model: the MDP.
      pi: ``[S, A]`` a stationary policy, or ``[H+1, S, A]`` one per steps left (row h used with h steps left);
        each row of a state that acts is a distribution over its admissible actions.
      beta: the discount in (0, 1].
    """
    _check_beta(beta)
    pi_hsa = _check_policy(model, pi)
    v_hs, q_hsa = _backward(model, pi_hsa, beta)
    success_hs, _ = _backward(model, pi_hsa, 1.0)
    adv_hsa = np.where(model.mask_sa, q_hsa - v_hs[:, :, None], 0.0)
    start = model.max_steps, model.start
    return Evaluation(v_hs, q_hsa, adv_hsa, success_hs, float(v_hs[start]), float(success_hs[start]))


def success_probability(model: MDP, pi: np.ndarray) -> float:
    """The probability that an episode from the start under ``pi`` reaches the goal within the cap."""
    success_hs, _ = _backward(model, _check_policy(model, pi), 1.0)
    return float(success_hs[model.max_steps, model.start])


def optimal(model: MDP, beta: float = BETA) -> Optimal:
    """Value iteration over (steps left, state): ``U_h(s) = max_a Σ P(s'|s,a)(1[goal] + 1[not terminal] U_{h−1})``;
    ties (within 1e-12) go to the action with the higher discounted value of the policy being built."""
    _check_beta(beta)
    horizon, (num_states, num_actions) = model.max_steps, model.mask_sa.shape
    success_hs, v_hs = np.zeros((horizon + 1, num_states)), np.zeros((horizon + 1, num_states))
    action_hs = np.full((horizon + 1, num_states), -1)
    goal, alive = model.goal_s.astype(float), (~model.terminal_s).astype(float)
    acting = ~model.terminal_s
    for h in range(1, horizon + 1):
        u_sa = np.where(model.mask_sa, model.p_sat @ (goal + alive * success_hs[h - 1]), -np.inf)
        w_sa = model.p_sat @ (goal + beta * alive * v_hs[h - 1])
        best = u_sa.max(1, keepdims=True)
        a_s = np.where(u_sa >= best - _TIE, w_sa, -np.inf).argmax(1)
        rows = np.arange(num_states)
        success_hs[h] = np.where(acting, u_sa[rows, a_s], 0.0)
        v_hs[h] = np.where(acting, w_sa[rows, a_s], 0.0)
        action_hs[h] = np.where(acting, a_s, -1)
    pi_hsa = np.zeros((horizon + 1, num_states, num_actions))
    chosen = action_hs >= 0
    pi_hsa[chosen, action_hs[chosen]] = 1.0
    pi_hsa[~chosen] = uniform_policy(model)[np.nonzero(~chosen)[1]]
    return Optimal(success_hs, v_hs, action_hs, pi_hsa)


def random_success(config: MDPConfig, seeds: Iterable[int]) -> np.ndarray:
    """[len(seeds)] the uniform policy's success probability from the start, per seed, exactly: for choosing
    settings (e.g. a lock that a random policy almost never opens) by computation instead of by sampling."""
    result = []
    for seed in seeds:
        model = generate_mdp(int(seed), config)
        result.append(success_probability(model, uniform_policy(model)))
    return np.array(result)


# -- the recursion -----------------------------------------------------------------------------------------------------
def _backward(model: MDP, pi_hsa: np.ndarray, beta: float) -> tuple[np.ndarray, np.ndarray]:
    """(V [H+1, S], Q [H+1, S, A]) of the recursion in the module docstring, for one discount."""
    horizon, (num_states, num_actions) = model.max_steps, model.mask_sa.shape
    v_hs, q_hsa = np.zeros((horizon + 1, num_states)), np.zeros((horizon + 1, num_states, num_actions))
    goal, alive = model.goal_s.astype(float), (~model.terminal_s).astype(float)
    for h in range(1, horizon + 1):
        q_hsa[h] = model.p_sat @ (goal + beta * alive * v_hs[h - 1])
        v_hs[h] = (pi_hsa[h] * q_hsa[h]).sum(1)
    return v_hs, q_hsa


def _check_policy(model: MDP, pi: np.ndarray) -> np.ndarray:
    """The policy as ``[H+1, S, A]``; raises unless its rows are distributions over admissible actions."""
    pi = np.asarray(pi, dtype=float)
    shape = model.mask_sa.shape
    if pi.shape == shape:
        pi = np.broadcast_to(pi, (model.max_steps + 1, *shape))
    if pi.shape != (model.max_steps + 1, *shape):
        raise ValueError(f"pi must have shape {shape} or {(model.max_steps + 1, *shape)}, got {pi.shape}")
    rows = pi[1:, ~model.terminal_s]
    if np.any(pi < 0) or np.any(pi[:, ~model.mask_sa] != 0) or not np.allclose(rows.sum(-1), 1.0, atol=1e-9):
        raise ValueError("pi: each row of a state that acts must be a distribution over its admissible actions")
    return pi


def _check_beta(beta: float) -> None:
    if not 0.0 < beta <= 1.0:
        raise ValueError(f"beta must lie in (0, 1], got {beta}")
