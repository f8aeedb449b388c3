"""Benchmark cases of the SERO and SERA credit kernels at the papers' batch sizes.

SERO: one oracle branch per group of the 16 × 8 batch -> 16 branches × J = 50 oracle steps × L = 16 command
tokens. SERA: 8 root tasks × K = 8 trees × Q = 32 node slots (depth ≤ 3), rubrics of C = 4 criteria.
Each case's ``run`` is the jitted batched kernel on device arrays, its ``reference`` the NumPy reference
looped over the same inputs.
"""

from __future__ import annotations

import functools

import jax
import numpy as np
from harness import Case

from agentjax.credit import sera, sero
from agentjax.credit.reference import sera as sera_ref
from agentjax.credit.reference import sero as sero_ref
from agentjax.losses import sero as sero_loss

NUM_BRANCHES, NUM_ORACLE_STEPS, NUM_COMMAND_TOKENS = 16, 50, 16
NUM_ROOT_TASKS, NUM_TREES, NUM_NODES, NUM_CRITERIA, MAX_DEPTH = 8, 8, 32, 4, 3


def sero_inputs(rng: np.random.Generator) -> dict[str, np.ndarray]:
    shape = (NUM_BRANCHES, NUM_ORACLE_STEPS, NUM_COMMAND_TOKENS)
    lengths = rng.integers(1, NUM_ORACLE_STEPS + 1, NUM_BRANCHES)
    num_tokens = rng.integers(1, NUM_COMMAND_TOKENS + 1, shape[:2])
    return dict(
        logp=-rng.exponential(0.3, shape).astype(np.float32),
        token_mask=np.arange(NUM_COMMAND_TOKENS)[None, None, :] < num_tokens[..., None],
        step_mask=np.arange(NUM_ORACLE_STEPS)[None, :] < lengths[:, None],
        valid=rng.random(NUM_BRANCHES) < 0.9,
        oracle=(rng.random(NUM_BRANCHES) < 0.8).astype(np.float32),
        suffix=np.zeros(NUM_BRANCHES, np.float32),  # roots come from failed rollouts
    )


def random_tree(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """A random tree of depth ≤ MAX_DEPTH on a random number of the Q slots (root in slot 0)."""
    size = int(rng.integers(1, NUM_NODES + 1))
    parent, depth = [-1], [0]
    for _ in range(1, size):
        p = int(rng.choice([i for i in range(len(parent)) if depth[i] < MAX_DEPTH]))
        parent.append(p)
        depth.append(depth[p] + 1)
    parent_q = np.full(NUM_NODES, -1, np.int32)
    parent_q[:size] = parent
    return parent_q, np.arange(NUM_NODES) < size


def sera_inputs(rng: np.random.Generator) -> dict[str, np.ndarray]:
    trees = [random_tree(rng) for _ in range(NUM_ROOT_TASKS * NUM_TREES)]
    shape_gk = (NUM_ROOT_TASKS, NUM_TREES)
    shape_c = shape_gk + (NUM_NODES, NUM_CRITERIA)
    success = rng.random(shape_gk) < 0.6
    return dict(
        parent=np.stack([t[0] for t in trees]).reshape(shape_gk + (NUM_NODES,)),
        mask=np.stack([t[1] for t in trees]).reshape(shape_gk + (NUM_NODES,)),
        success=success,
        gate=rng.random(shape_gk + (NUM_NODES,)) < 0.7,
        weight=rng.uniform(0.5, 3.0, shape_c).astype(np.float32),
        score=rng.uniform(0.0, 1.0, shape_c).astype(np.float32),
        crit_mask=rng.random(shape_c) < 0.9,
        outcome=success.astype(np.float32),
    )


def _sero_reference(x: dict[str, np.ndarray], scheme: str, match_mass: bool) -> list:
    out = []
    for b in range(NUM_BRANCHES):
        c = sero_ref.compatibility(x["logp"][b], x["token_mask"][b], x["step_mask"][b])
        w = sero_ref.branch_weights(c, x["step_mask"][b], scheme=scheme, match_mass=match_mass)
        g = sero_ref.improvement_gate(x["valid"][b], x["oracle"][b], x["suffix"][b])
        out.append((c, w, g))
    return out


@jax.jit
def _sero_loss(logp_old, token_mask, step_mask, valid, oracle, suffix, logp_new):
    credit = sero.batched_sero_credit(logp_old, token_mask, step_mask, valid, oracle, suffix)
    mean_logp = sero.batched_mean_token_logp(logp_new, token_mask, step_mask)
    return sero_loss.oracle_loss(mean_logp, credit.weight_j, credit.gate, step_mask, NUM_BRANCHES)


def _sero_loss_reference(x: dict[str, np.ndarray], logp_new: np.ndarray) -> float:
    credit = _sero_reference(x, "sero", False)
    mean_logp = np.stack([sero_ref.mean_token_logp(logp_new[b], x["token_mask"][b], x["step_mask"][b])
                          for b in range(NUM_BRANCHES)])
    weight = np.stack([c[1] for c in credit])
    gate = np.array([c[2] for c in credit])
    return sero_ref.oracle_loss(mean_logp, weight, gate, x["step_mask"], NUM_BRANCHES)


def _coverage_reference(x: dict[str, np.ndarray]) -> list:
    out = []
    for g in range(NUM_ROOT_TASKS):
        reward = np.stack([sera_ref.leaf_coverage(x["parent"][g, k], x["mask"][g, k], x["success"][g, k])
                           for k in range(NUM_TREES)])
        delegation = x["mask"][g] & (x["parent"][g] >= 0)
        out.append((reward, sera_ref.tree_loo_advantage(reward, delegation, tree_average=True)))
    return out


def _execution_reference(x: dict[str, np.ndarray]) -> list:
    out = []
    for g in range(NUM_ROOT_TASKS):
        reward = np.stack([
            sera_ref.execution_reward(x["parent"][g, k], x["mask"][g, k], x["gate"][g, k], x["weight"][g, k],
                                      x["score"][g, k], x["crit_mask"][g, k], x["outcome"][g, k])
            for k in range(NUM_TREES)])
        out.append((reward, sera_ref.tree_loo_advantage(reward, x["mask"][g], tree_average=False)))
    return out


@jax.jit
def _depth_weights(parent, mask):
    depth = sera.batched_node_depth(parent, mask, max_depth=MAX_DEPTH)
    return sera.batched_depth_weights(depth.ravel(), mask.ravel(), max_depth=MAX_DEPTH)


def _depth_weights_reference(x: dict[str, np.ndarray]) -> np.ndarray:
    depth = [sera_ref.node_depth(x["parent"][g, k], x["mask"][g, k])
             for g in range(NUM_ROOT_TASKS) for k in range(NUM_TREES)]
    return sera_ref.depth_weights(np.concatenate(depth), x["mask"].ravel(), max_depth=MAX_DEPTH)


def cases(seed: int) -> list[Case]:
    rng = np.random.default_rng(seed)
    xo = sero_inputs(rng)
    do = {k: jax.device_put(v) for k, v in xo.items()}
    sero_args = tuple(do[k] for k in ("logp", "token_mask", "step_mask", "valid", "oracle", "suffix"))
    logp_new = (xo["logp"] + rng.normal(0, 0.05, xo["logp"].shape)).astype(np.float32)
    logp_new_d = jax.device_put(logp_new)
    sero_shape = f"Br{NUM_BRANCHES} J{NUM_ORACLE_STEPS} L{NUM_COMMAND_TOKENS}"

    xa = sera_inputs(rng)
    da = {k: jax.device_put(v) for k, v in xa.items()}
    sera_shape = f"G{NUM_ROOT_TASKS} K{NUM_TREES} Q{NUM_NODES}"
    exec_args = tuple(da[k] for k in ("parent", "mask", "gate", "weight", "score", "crit_mask", "outcome"))

    return [
        Case("sero credit (reachability)", sero_shape,
             functools.partial(sero.batched_sero_credit, *sero_args),
             functools.partial(_sero_reference, xo, "sero", False), paper=True),
        Case("sero credit (depth decay, matched mass)", sero_shape,
             functools.partial(sero.batched_sero_credit, *sero_args, scheme="depth_decay", match_mass=True),
             functools.partial(_sero_reference, xo, "depth_decay", True), paper=True),
        Case("sero oracle loss (credit + L_O)", sero_shape,
             functools.partial(_sero_loss, *sero_args, logp_new_d),
             functools.partial(_sero_loss_reference, xo, logp_new), paper=True),
        Case("sera leaf coverage + decomposition LOO", sera_shape,
             functools.partial(sera.batched_leaf_coverage, da["parent"], da["mask"], da["success"],
                               max_depth=MAX_DEPTH),
             functools.partial(_coverage_reference, xa), paper=True),
        Case("sera execution reward + LOO", f"{sera_shape} C{NUM_CRITERIA}",
             functools.partial(sera.batched_execution_reward, *exec_args),
             functools.partial(_execution_reference, xa), paper=True),
        Case("sera inverse-frequency depth weights", sera_shape,
             functools.partial(_depth_weights, da["parent"], da["mask"]),
             functools.partial(_depth_weights_reference, xa), paper=True),
    ]
