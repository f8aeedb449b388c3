"""Benchmark cases of the SERO and SERA credit kernels at the papers' batch sizes.

SERO: one oracle branch per group of the 16 × 8 batch -> 16 branches × J = 50 oracle steps × L = 16 command
tokens. SERA: 8 root tasks × K = 8 trees × Q = 32 node slots (depth ≤ 3), one launch event per delegating
node (E = Q slots), F = 16 fork groups of I = 8 branches per root task; each stage's whole credit (reward,
leave-one-out, zero-variance filter, depth weights).
Each case's ``run`` is the jitted batched kernel on device arrays, its ``reference`` the NumPy reference
looped over the same inputs.
"""

from __future__ import annotations

import functools

import jax
import numpy as np
from harness import Case

from agentjax.credit import sera_stages, sero
from agentjax.credit.reference import sera as sera_ref
from agentjax.credit.reference import sero as sero_ref
from agentjax.losses import sero as sero_loss

NUM_BRANCHES, NUM_ORACLE_STEPS, NUM_COMMAND_TOKENS = 16, 50, 16
NUM_ROOT_TASKS, NUM_TREES, NUM_NODES, MAX_DEPTH = 8, 8, 32, 3
NUM_FORK_GROUPS, NUM_FORK_BRANCHES = 16, 8


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
    shape_q = shape_gk + (NUM_NODES,)
    parent = np.stack([t[0] for t in trees]).reshape(shape_q)
    mask = np.stack([t[1] for t in trees]).reshape(shape_q)
    child = mask & (parent >= 0)
    delegates = np.zeros(shape_q, bool)  # one launch event per delegating node, in the node's own slot
    for g, k, q in zip(*np.nonzero(child), strict=True):
        delegates[g, k, parent[g, k, q]] = True
    shape_f = (NUM_ROOT_TASKS, NUM_FORK_GROUPS, NUM_FORK_BRANCHES)
    success = rng.random(shape_gk) < 0.6
    return dict(
        parent=parent, mask=mask,
        child_reward=rng.uniform(0.0, 1.0, shape_q).astype(np.float32),
        graded=rng.random(shape_q) < 0.95,
        outcome=success.astype(np.float32),
        rows=rng.integers(1, 21, shape_q).astype(np.int32),
        event_q=np.where(child, parent, -1).astype(np.int32),
        event_node=np.where(delegates, np.arange(NUM_NODES), -1).astype(np.int32),
        score=rng.uniform(0.0, 1.0, shape_f).astype(np.float32),
        label=rng.random(shape_f) < 0.5,
        valid=rng.random(shape_f) < 0.95,
        child_depth=rng.integers(1, MAX_DEPTH + 1, shape_f[:2]).astype(np.int32),
    )


EXEC_KEYS = ("parent", "mask", "child_reward", "graded", "outcome", "rows")
DEC_KEYS = ("parent", "mask", "event_q", "event_node", "outcome")
RUBRIC_KEYS = ("score", "label", "valid", "child_depth")


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
        Case("sera execution credit", sera_shape,
             functools.partial(sera_stages.execution_credit, *(da[k] for k in EXEC_KEYS), max_depth=MAX_DEPTH),
             functools.partial(sera_ref.execution_credit, *(xa[k] for k in EXEC_KEYS)), paper=True),
        Case("sera decomposition credit", sera_shape,
             functools.partial(sera_stages.decomposition_credit, *(da[k] for k in DEC_KEYS), max_depth=MAX_DEPTH),
             functools.partial(sera_ref.decomposition_credit, *(xa[k] for k in DEC_KEYS)), paper=True),
        Case("sera rubric credit", f"G{NUM_ROOT_TASKS} F{NUM_FORK_GROUPS} I{NUM_FORK_BRANCHES}",
             functools.partial(sera_stages.rubric_credit, *(da[k] for k in RUBRIC_KEYS), max_depth=MAX_DEPTH),
             functools.partial(sera_ref.rubric_credit, *(xa[k] for k in RUBRIC_KEYS)), paper=True),
    ]
