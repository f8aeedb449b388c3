"""Rollout groups on the credit-testbed MDPs (:mod:`envs.mdp`), every method's advantage from the real credit
kernels, and the exact advantage of the behaviour policy at the same rows.

1. **Groups.** A group is ``R`` episodes of one task (one MDP seed) from its start state in a real
   :class:`~envs.mdp.MDPEnv`, under a policy table ``π(a | steps left, state)`` (uniform by default), so every
   action is admissible. Rows follow the collector's conventions (:mod:`agentjax.rollout.collect`): reward
   ``success_reward · won`` on the winning step (the environment's own reward, 1 at the goal, by default), no
   invalid actions, ``terminated`` on entering the goal or the pit, ``truncated`` at the step cap (a failure).
   Anchors are group-local ids (:func:`~agentjax.rollout.group_local_ids`, the collector's) of ``Obs.anchor``,
   the state's observation text, which is unique per state; as in the trainer it carries no step count, so the
   kernels' empirical process is time-homogeneous while the exact values depend on the steps left. Actions are
   group-local ids of the action labels. Token fields are one-token dummies.
2. **Exact advantage.** :func:`envs.mdp.evaluate` of the behaviour policy (discounted success, β = 0.98) gives
   ``A^π_h(s, a)``; a visit at step t has ``h = H − t`` steps left. Decision rows: the state has more than one
   admissible action (every state that acts, with ``min_actions >= 2``).
3. **Methods.** The per-step advantage of each method with its METHODS.md defaults, from the real kernels on
   the ``[G, R, T]`` view: GRPO, RLOO, GiGPO (γ = 0.95, mean_std_norm, w = 1), HGPO (γ = 0.95, K = 2, α = 1),
   GraphGPO (γ = 0.1), CRBC (β = 0.98, K = ∞, w_G = 1, w_S = 5, σ_min = 0.1). PPO's GAE needs a critic: the
   reference row ``PPO-GAE (exact V)`` uses the exact ``V^π_h`` of the behaviour policy (γ = β = 0.98,
   λ = 0.95), a critic no trained run has, so it is an upper reference and never a competitor. Diagnostics:
   ``GiGPO step`` (A^S alone) and ``CRBC step`` (ĉ alone).

Every method is invariant to the reward's scale up to its ε (correlations and signs do not change), except the
magnitudes of RLOO and of the GAE reference.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple

import jax.numpy as jnp
import numpy as np

from agentjax.credit import batched_gae
from agentjax.credit.accuracy import credit_accuracy
from agentjax.rollout import GroupView, StepBatch, group_local_ids, to_groups
from envs.base import Task
from envs.mdp import BETA, MDP, Evaluation, MDPConfig, MDPEnv, evaluate, mdp_of, uniform_policy
from experiments.crbc.credit_analysis import method_credits, to_rows

METHODS = ("GRPO", "RLOO", "GiGPO", "HGPO", "GraphGPO", "CRBC")  # the competitors
REFERENCE = "PPO-GAE (exact V)"  # GAE with the exact critic: an upper reference
# the step terms alone: this module's name -> method_credits' name
DIAGNOSTICS = {"GiGPO step": "GiGPO step term", "CRBC step": "CRBC step term"}
GAE_LAMBDA = 0.95

Policy = Callable[[MDP], np.ndarray]  # model -> [S, A] or [H+1, S, A]


class Rollouts(NamedTuple):
    """Rollout groups on MDP seeds: the batch the kernels see and host data for the exact values."""

    batch: StepBatch  # one row per turn, rows ordered (group, rollout, step), padded to G·R·T rows
    view: GroupView  # to_groups(batch), [G, R, T]
    config: MDPConfig  # the setting every group's MDP is generated under
    seed_g: np.ndarray  # [G] int, the MDP seed (task) of each group
    group_n: np.ndarray  # [N] int
    rollout_n: np.ndarray  # [N] int
    step_n: np.ndarray  # [N] int, t
    steps_left_n: np.ndarray  # [N] int, h = H − t
    state_n: np.ndarray  # [N] int, the state before the turn
    action_n: np.ndarray  # [N] int, the action slot
    decision_n: np.ndarray  # [N] bool, the state had more than one admissible action
    success_gr: np.ndarray  # [G, R] bool, the episode reached the goal


def task_of(seed: int, sample_seed: int) -> Task:
    """The task of an MDP seed; ``sample_seed`` seeds the episode's slips (:class:`~envs.mdp.MDPEnv`)."""
    return Task(env="mdp", task_id=f"mdp-{seed}", split="train", seed=int(seed), meta={"sample_seed": sample_seed})


def policy_table(model: MDP, policy: Policy) -> np.ndarray:
    """[H+1, S, A] the policy of ``model`` per steps left."""
    pi = np.asarray(policy(model), np.float64)
    if pi.ndim == 2:
        pi = np.broadcast_to(pi, (model.max_steps + 1, *pi.shape))
    return pi


def collect(config: MDPConfig, seeds: Sequence[int], num_rollouts: int = 8, *, policy: Policy = uniform_policy,
            sample_seed: int = 0, max_steps: int | None = None, success_reward: float = 1.0) -> Rollouts:
    """One group of ``num_rollouts`` episodes per seed (module docstring, point 1).

    Args:
      config: the MDP setting. seeds: [G] the MDP seed of each group. num_rollouts: R.
      policy: model -> policy table (:func:`envs.mdp.uniform_policy`: uniform over the admissible actions).
      sample_seed: seeds the action draws and the slips (the same value gives the same groups).
      max_steps: T of the view (>= the setting's step cap; a larger T pads, to share compiled shapes).
      success_reward: the reward of the winning step.
    """
    horizon = config.step_cap
    t_len = horizon if max_steps is None else max_steps
    if t_len < horizon:
        raise ValueError(f"max_steps ({t_len}) must be >= the setting's step cap ({horizon})")
    env = MDPEnv(config)
    cols: dict[str, list] = {k: [] for k in ("group", "task", "rollout", "step", "state", "action_slot", "won",
                                             "reward", "done", "terminated", "truncated", "decision")}
    anchors, next_anchors, labels = [], [], []
    success_gr = np.zeros((len(seeds), num_rollouts), bool)
    for g, seed in enumerate(seeds):
        model = mdp_of(task_of(seed, 0), config)
        pi_hsa = policy_table(model, policy)
        rng = np.random.default_rng([int(seed), sample_seed])
        for r in range(num_rollouts):
            obs = env.reset(task_of(seed, sample_seed * num_rollouts + r))
            done, t = False, 0
            while not done:
                s, h = env.state, horizon - t
                a = int(rng.choice(model.mask_sa.shape[1], p=pi_hsa[h, s]))
                label = model.labels[s][a]
                next_obs, _, done, info = env.step(label)
                won = bool(info["won"])
                row = dict(group=g, task=int(seed), rollout=r, step=t, state=s, action_slot=a, won=won,
                           reward=success_reward * won, done=done, terminated=done and not info["truncated"],
                           truncated=bool(info["truncated"]), decision=int(model.num_actions_s[s]) > 1)
                for k, v in row.items():
                    cols[k].append(v)
                anchors.append(obs.anchor)
                next_anchors.append(next_obs.anchor)
                labels.append(label)
                obs, t = next_obs, t + 1
            success_gr[g, r] = won
    group_n = np.asarray(cols["group"], np.int32)
    n = len(group_n)
    ids = group_local_ids(anchors + next_anchors, np.concatenate([group_n, group_n]).tolist())
    batch = StepBatch.from_rows(
        len(seeds) * num_rollouts * t_len, 1, 1,
        reward=np.asarray(cols["reward"], np.float32), done=np.asarray(cols["done"]),
        terminated=np.asarray(cols["terminated"]), truncated=np.asarray(cols["truncated"]),
        won=np.asarray(cols["won"]), valid=np.ones(n, bool), group=group_n,
        task=np.asarray(cols["task"], np.int32), rollout=np.asarray(cols["rollout"], np.int32),
        step=np.asarray(cols["step"], np.int32), anchor=ids[:n], next_anchor=ids[n:],
        action=group_local_ids(labels, group_n.tolist()),
    )
    view = to_groups(batch, num_groups=len(seeds), num_rollouts=num_rollouts, max_steps=t_len)
    step_n = np.asarray(cols["step"])
    return Rollouts(
        batch=batch, view=view, config=config, seed_g=np.asarray(seeds), group_n=group_n,
        rollout_n=np.asarray(cols["rollout"]), step_n=step_n, steps_left_n=horizon - step_n,
        state_n=np.asarray(cols["state"]), action_n=np.asarray(cols["action_slot"]),
        decision_n=np.asarray(cols["decision"], bool), success_gr=success_gr,
    )


def evaluations(rollouts: Rollouts, *, policy: Policy = uniform_policy, beta: float = BETA) -> list[Evaluation]:
    """[G] the exact evaluation of the behaviour policy on each group's MDP."""
    out = []
    for seed in rollouts.seed_g:
        model = mdp_of(task_of(int(seed), 0), rollouts.config)
        out.append(evaluate(model, policy_table(model, policy), beta))
    return out


class Exact(NamedTuple):
    adv_n: np.ndarray  # [N] A^π_h(s_t, a_t), h = H − t
    v_n: np.ndarray  # [N] V^π_h(s_t)
    v_grt: np.ndarray  # [G, R, T] V^π at every real step (0 on padding): the exact critic


def exact_values(rollouts: Rollouts, evals: Sequence[Evaluation]) -> Exact:
    """The exact advantage and value at every row (module docstring, point 2)."""
    adv_n = np.empty(len(rollouts.group_n))
    v_n = np.empty(len(rollouts.group_n))
    for g, ev in enumerate(evals):
        rows = rollouts.group_n == g
        h, s, a = rollouts.steps_left_n[rows], rollouts.state_n[rows], rollouts.action_n[rows]
        adv_n[rows], v_n[rows] = ev.adv_hsa[h, s, a], ev.v_hs[h, s]
    v_grt = np.zeros(rollouts.view.mask.shape)
    v_grt[rollouts.group_n, rollouts.rollout_n, rollouts.step_n] = v_n
    return Exact(adv_n, v_n, v_grt)


def method_advantages(view: GroupView, critic_grt: np.ndarray | None = None, *, beta: float = BETA,
                      success_reward: float = 1.0) -> dict[str, np.ndarray]:
    """[G, R, T] per-step advantage of each method (module docstring, point 3): the kernels of
    :func:`experiments.crbc.credit_analysis.method_credits` (the same METHODS.md defaults; its step terms under
    this module's names), and the GAE reference only when an exact critic ``critic_grt`` (V^π for reward 1,
    [G, R, T]) is given."""
    credits = method_credits(view, beta=beta)
    out = {name: credits[name] for name in METHODS}
    if critic_grt is not None:
        # the final observation of a truncated episode has 0 steps left: V_0 = 0, so the bootstrap is 0
        bootstrap = jnp.zeros(view.length.shape, jnp.float32)
        value = jnp.asarray(success_reward * critic_grt, jnp.float32)
        out[REFERENCE] = np.asarray(batched_gae(view, value, bootstrap, gamma=beta, lam=GAE_LAMBDA)[0])
    return out | {name: credits[shared] for name, shared in DIAGNOSTICS.items()}


def batch_accuracy(rollouts: Rollouts, *, policy: Policy = uniform_policy, beta: float = BETA,
                   success_reward: float = 1.0, atol: float = 1e-12) -> dict[str, dict[str, float]]:
    """Each method's credit accuracy on one batch: ``{method: {"pearson", "sign_agreement"}}`` over its
    decision rows, each row weight 1 (:func:`agentjax.credit.accuracy.credit_accuracy`)."""
    exact = exact_values(rollouts, evaluations(rollouts, policy=policy, beta=beta))
    advantages = method_advantages(rollouts.view, exact.v_grt, beta=beta, success_reward=success_reward)
    weight = jnp.asarray(rollouts.decision_n, jnp.float32)
    y = jnp.asarray(exact.adv_n, jnp.float32)
    result = {}
    for name, adv_grt in advantages.items():
        acc = credit_accuracy(jnp.asarray(to_rows(adv_grt, rollouts), jnp.float32), y, weight, atol)
        result[name] = {k: float(v) for k, v in acc.items()}
    return result


def summarise(per_batch: Sequence[Mapping[str, Mapping[str, float]]]) -> dict[str, dict[str, float]]:
    """Mean and standard error over batches of each method's accuracy.

    A NaN Pearson means the method's advantage was constant over the batch's decision rows (the exact advantage
    always varies there): it carries no credit and counts as 0 (``pearson_undefined`` counts those batches). A NaN
    sign agreement (no row with a non-zero exact advantage) is left out.
    """
    out = {}
    for name in per_batch[0]:
        row: dict[str, float] = {}
        pearson = np.asarray([b[name]["pearson"] for b in per_batch], np.float64)
        row["pearson_undefined"] = int(np.sum(~np.isfinite(pearson)))
        for metric, x in (("pearson", np.nan_to_num(pearson, nan=0.0)),
                          ("sign_agreement", np.asarray([b[name]["sign_agreement"] for b in per_batch], np.float64))):
            x = x[np.isfinite(x)]
            row[metric] = float(x.mean()) if len(x) else float("nan")
            row[f"{metric}_se"] = float(x.std(ddof=1) / np.sqrt(len(x))) if len(x) > 1 else float("nan")
        out[name] = row
    return out
