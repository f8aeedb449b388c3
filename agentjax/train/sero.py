"""SERO in the trainer: from one update's primary rollouts to the oracle rows the update trains on.

:class:`SeroBranch` (built by :class:`~agentjax.train.flat.FlatAlgorithm` when ``TrainConfig.sero`` is set) runs,
between collection and the update (METHODS.md "SERO"; papers/SERO.txt §4, §C.2):

1. roots from the primary rollouts and their oracle continuations in the pool's branch slots
   (:mod:`agentjax.rollout.oracle`), packed into an :class:`~agentjax.rollout.oracle.OracleBatch`;
2. *one* batched forward of the frozen behaviour policy (the parameters that collected the batch, before the
   update) over every oracle step: the command-token log-probs under the loss's serialisation, temperature and
   constrained-decoding renormalisation (:func:`agentjax.train.update.forward_rows`), so ``log c_j`` is exactly the
   ``ℓ_j`` the loss computes at the first step;
3. the weights of the configured scheme, the improvement gate against the on-policy suffix return, and each row's
   coefficient ``g_b · w_bj / #roots attempted`` (:func:`sero_credit`, the kernels of :mod:`agentjax.credit.sero`);
4. :class:`~agentjax.train.update.OracleRows` in the ``UpdateBatch`` (``oracle=rows``), which adds ``λ_O · L_O`` to
   the base loss at every optimizer step of the update (a choice: with ``mini_batches = M`` each step's base loss is a
   token mean over its own mini-batch, so adding the whole ``L_O`` to each keeps the ratio λ_O of §4.4 at every
   step; ``L_O`` is small, at most one branch per group).

The base method never sees any of it: the advantages are computed from the primary batch before the branch runs,
and ``metrics["loss"]`` stays the base loss (``oracle_loss`` and ``total_loss`` beside it); tests/train/test_sero.py
checks both. The sampling key of the branch is ``fold_in(collection key, SERO_KEY)``, so turning SERO on does not
change the primary stream of a seed (the first update's rollouts are the same with and without it).

A fixed oracle bank (§A.1, §F.2): :func:`save_bank` writes the oracle rows, the branch arrays and the behaviour
scores of one update's branches to one ``.npz`` (:func:`load_bank` concatenates several); with ``SeroConfig.bank``
every update draws ``bank_branches`` of its branches (without replacement, from the update's key) and weights them
with the *stored* compatibilities, so the schemes compared on one bank see identical roots and continuations
(``match_mass=True`` equalises the supervision mass per branch). A bank built at an early and at a later checkpoint
is the current-policy-root control (§A.4); :func:`agentjax.train.offline.build_bank` writes a bank from a policy.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from agentjax.credit.sero import batched_branch_weights, improvement_gate
from agentjax.losses.sero import row_coefficients
from agentjax.rollout.batch import StepBatch
from agentjax.rollout.collect import CollectConfig, Rollouts
from agentjax.rollout.oracle import BranchRun, OracleBatch, run_branches, select_roots, to_oracle_batch
from agentjax.train.config import SeroConfig, TrainConfig
from agentjax.train.update import COMPACT_BUCKET, OracleRows, compact_rows, forward_rows, policy_graphdef, trained_mask

SERO_KEY = 0x5E40  # fold_in(collection key, SERO_KEY): the branch's own stream
DEPTH_BINS = (0, 1, 2, 4, 8)  # the depths whose mean weight is logged (sero/weight_d<k>)


def make_scorer(config: TrainConfig, model: nnx.Module):
    """``score(params, steps) -> [N, Lr]``: log π(reply token) of oracle step rows under ``params`` (0 off the
    command tokens), in oracle micro-batches, exactly as the loss computes it; compacts the rows first on CPU."""
    graphdef = policy_graphdef(model)
    size = config.oracle_micro_batch_size

    @jax.jit
    def score(params, steps: StepBatch, prefix_p=None):
        def one(i):
            mb = jax.tree.map(lambda x: jax.lax.dynamic_slice_in_dim(x, i * size, size), steps)
            return forward_rows(graphdef, params, mb, loss=config.loss, with_entropy=False, prefix_p=prefix_p)[0]

        out = jax.lax.map(one, jnp.arange(steps.capacity // size))
        return jnp.where(trained_mask(steps), out.reshape((steps.capacity,) + out.shape[2:]), 0.0)

    def run(params, steps: StepBatch):
        if jax.default_backend() == "cpu" and getattr(model, "act_sharding", None) is None:
            steps, prefix_p = compact_rows(steps, COMPACT_BUCKET)
            return score(params, steps, prefix_p)
        return score(params, steps)

    return run


def step_log_compat(logp_nl: jax.Array, steps: StepBatch, num_branches: int, max_depth: int) -> tuple[jax.Array,
                                                                                                       jax.Array]:
    """Rows -> branch view: ``(log c [Br, J], step mask [Br, J])`` from row log-probs ``[N, Lr]`` (mean over the
    command tokens; a row without command tokens has log c = 0)."""
    mask_nl = trained_mask(steps)
    n_n = mask_nl.sum(-1)
    ell_n = jnp.where(mask_nl, logp_nl, 0.0).sum(-1) / jnp.maximum(n_n, 1)
    b, j = steps.group, jnp.clip(steps.step, 0, max_depth - 1)
    where = steps.row_mask
    log_c = jnp.zeros((num_branches, max_depth)).at[b, j].add(jnp.where(where, ell_n, 0.0))
    step_mask = jnp.zeros((num_branches, max_depth), bool).at[b, j].max(where)
    return log_c, step_mask


@functools.partial(jax.jit, static_argnames=("sero",))
def sero_credit(sero: SeroConfig, oracle: OracleBatch, log_c_bj: jax.Array, step_mask_bj: jax.Array,
                key: jax.Array) -> dict[str, jax.Array]:
    """Weights, gates and row coefficients of an oracle batch (module docstring, 3): ``weight_bj``, ``gate_b``,
    ``coef_n`` and ``num_roots`` (roots attempted)."""
    weight = batched_branch_weights(log_c_bj, step_mask_bj, scheme=sero.scheme, gamma=sero.gamma, k=sero.k,
                                    key=key if sero.scheme == "shuffled" else None, match_mass=sero.match_mass)
    gate = improvement_gate(oracle.valid & oracle.attempted, oracle.oracle_return, oracle.suffix_return,
                            scale=sero.gate_scale, soft=sero.soft_gate)
    num_roots = oracle.attempted.sum()
    steps = oracle.steps
    coef = row_coefficients(weight, gate, steps.group, steps.step, steps.row_mask, num_roots)
    return {"weight_bj": weight, "gate_b": gate, "coef_n": coef, "num_roots": num_roots}


def branch_metrics(run: BranchRun | None, oracle: OracleBatch, credit: dict[str, jax.Array], log_c_bj: jax.Array,
                   step_mask_bj: jax.Array) -> dict[str, float]:
    """``sero/`` metrics of one update: roots attempted / valid / gated in, oracle steps, the mean weight and
    compatibility by depth, branch vs suffix success, and why branches ended."""
    att = np.asarray(oracle.attempted)
    valid = np.asarray(oracle.valid) & att
    gate = np.asarray(credit["gate_b"])
    mask = np.asarray(step_mask_bj)
    w = np.asarray(credit["weight_bj"])
    c = np.exp(np.asarray(log_c_bj))
    n_att = max(int(att.sum()), 1)
    out = {"roots_attempted": float(att.sum()), "roots_valid": float(valid.sum()),
           "roots_gated": float((gate > 0).sum()), "oracle_steps": float(mask.sum()),
           "trained_steps": float((np.asarray(credit["coef_n"]) != 0).sum()),
           "branch_return": float(np.asarray(oracle.oracle_return)[att].sum() / n_att),
           "suffix_return": float(np.asarray(oracle.suffix_return)[att].sum() / n_att),
           "compat_mean": float(c[mask].mean()) if mask.any() else 0.0,
           "weight_mean": float(w[mask].mean()) if mask.any() else 0.0}
    for d in DEPTH_BINS:
        if d < mask.shape[1] and mask[:, d].any():
            out[f"weight_d{d}"] = float(w[:, d][mask[:, d]].mean())
    if run is not None:
        for why in ("mismatch", "restore_error", "crash", "timeout", "oracle_error", "inadmissible", "won"):
            out[f"ended_{why}"] = float(sum(br.ended == why for br in run.branches))
        out["env_steps"] = float(run.env_steps)
    return out


# -- the fixed bank ------------------------------------------------------------------------------------------------
_STEP_FIELDS = ("prompt_tokens", "prompt_mask", "response_tokens", "response_mask", "group", "step", "task",
                "row_mask", "allowed_tokens")


def save_bank(path: str, oracle: OracleBatch, log_c_bj: jax.Array) -> None:
    """One update's branches (rows, branch arrays, the behaviour log-compatibilities ``[Br, J]``) as ``.npz``."""
    arrays = {f"steps_{k}": np.asarray(getattr(oracle.steps, k)) for k in _STEP_FIELDS
              if getattr(oracle.steps, k) is not None}
    arrays |= {k: np.asarray(getattr(oracle, k)) for k in ("attempted", "valid", "oracle_return", "suffix_return")}
    np.savez_compressed(path, log_c_bj=np.asarray(log_c_bj), **arrays)


@dataclasses.dataclass(frozen=True)
class Bank:
    """A loaded bank: every attempted branch with its rows (host arrays)."""

    rows: dict[str, np.ndarray]  # the step fields, real rows only; "group" = the bank's branch index
    attempted: np.ndarray
    valid: np.ndarray
    oracle_return: np.ndarray
    suffix_return: np.ndarray
    log_c_bj: np.ndarray

    @property
    def num_branches(self) -> int:
        return len(self.valid)


def load_bank(paths: str | Sequence[str]) -> Bank:
    """Read (and concatenate) banks written by :func:`save_bank`; only attempted branches are kept."""
    paths = [paths] if isinstance(paths, str) else list(paths)
    parts = []
    offset = 0
    for path in paths:
        with np.load(path) as f:
            att = f["attempted"]
            keep = np.nonzero(att)[0]
            remap = np.full(len(att), -1)
            remap[keep] = np.arange(len(keep)) + offset
            real = f["steps_row_mask"].astype(bool)
            rows = {k[len("steps_"):]: f[k][real] for k in f.files if k.startswith("steps_")}
            rows["group"] = remap[rows["group"]]
            parts.append((rows, {k: f[k][keep] for k in ("valid", "oracle_return", "suffix_return", "log_c_bj")}))
            offset += len(keep)
    if not parts:
        raise ValueError("load_bank: no bank files")
    rows = {k: np.concatenate([p[0][k] for p in parts]) for k in parts[0][0]}
    br = {k: np.concatenate([p[1][k] for p in parts]) for k in parts[0][1]}
    return Bank(rows=rows, attempted=np.ones(offset, bool), **br)


def draw_from_bank(bank: Bank, rng: np.random.Generator, num_branches: int, capacity: int, template: StepBatch,
                   ) -> tuple[OracleBatch, np.ndarray]:
    """``num_branches`` of the bank's branches without replacement (all of them if it has fewer), repacked as an
    :class:`OracleBatch` of ``capacity`` rows shaped like ``template``, and their stored log c ``[Br, J]``."""
    take = np.sort(rng.choice(bank.num_branches, size=min(num_branches, bank.num_branches), replace=False))
    new_index = np.full(bank.num_branches, -1)
    new_index[take] = np.arange(len(take))
    keep = np.nonzero(np.isin(bank.rows["group"], take))[0][:capacity]
    fields = {k: v[keep] for k, v in bank.rows.items() if k != "row_mask"}
    fields["group"] = new_index[fields["group"]].astype(np.int32)
    lp, lr = template.prompt_tokens.shape[1], template.response_tokens.shape[1]
    steps = StepBatch.from_rows(capacity, lp, lr, **fields)
    pad = num_branches - len(take)
    col = lambda x, dtype: jnp.asarray(np.concatenate([x[take], np.zeros(pad, x.dtype)]).astype(dtype))  # noqa: E731
    log_c = np.zeros((num_branches,) + bank.log_c_bj.shape[1:], np.float32)
    log_c[:len(take)] = bank.log_c_bj[take]
    oracle = OracleBatch(steps=steps, attempted=jnp.arange(num_branches) < len(take), valid=col(bank.valid, bool),
                         oracle_return=col(bank.oracle_return, np.float32),
                         suffix_return=col(bank.suffix_return, np.float32))
    return oracle, log_c


# -- the branch of one update --------------------------------------------------------------------------------------
class SeroBranch:
    """One update's SERO branch (module docstring): ``branch(params, rollouts, key) -> (OracleRows, metrics)``.

    Args:
      config: the training config (``config.sero`` set; sizes from ``config.rollout``).
      collect: the primary collector config (its template, history window, reply format and sizes).
      model: the policy's structure (the behaviour scores run on the parameters passed to each call).
      tokenizer: the policy's tokenizer.
      pool: the env pool; ``slots`` are its branch slots (one per group), never a primary rollout's.
    """

    def __init__(self, config: TrainConfig, collect: CollectConfig, model: nnx.Module, tokenizer: Any, pool: Any,
                 slots: Sequence[int]):
        if config.sero is None:
            raise ValueError("SeroBranch needs TrainConfig.sero")
        self.config, self.sero, self.collect = config, config.sero, collect
        self.tokenizer, self.pool, self.slots = tokenizer, pool, list(slots)
        self.num_branches = config.rollout.num_groups
        self.max_depth = config.rollout.max_steps
        self.capacity = config.oracle_rows
        if len(self.slots) < self.num_branches:
            raise ValueError(f"SERO needs {self.num_branches} branch slots (one per group), got {len(self.slots)}")
        self.score = make_scorer(config, model)
        self.bank = load_bank(self.sero.bank) if self.sero.bank else None

    def branch(self, params: Any, rollouts: Rollouts, key: jax.Array,
               ) -> tuple[OracleRows, dict[str, float], OracleBatch, jax.Array]:
        """The oracle rows of an update and its ``sero/`` metrics (and the oracle batch and log c, for a bank)."""
        key = jax.random.fold_in(key, SERO_KEY)
        rng = np.random.default_rng(np.asarray(jax.random.key_data(key)).ravel().tolist())
        timing: dict[str, float] = {}
        run = None
        t0 = time.perf_counter()
        if self.bank is None:
            roots = select_roots(rollouts, rng, self.collect, mode=self.sero.roots,
                                 priority_power=self.sero.priority_power, gate_on=self.sero.gate_on)
            run = run_branches(self.pool, self.slots, roots, self.tokenizer, self.collect,
                               max_oracle_steps=self.sero.max_oracle_steps, gate_on=self.sero.gate_on,
                               oracle_timeout=self.sero.oracle_timeout)
            oracle = to_oracle_batch(run.branches, self.collect, num_branches=self.num_branches,
                                     capacity=self.capacity)
            timing |= {"restore": run.restore_seconds, "oracle": run.oracle_seconds, "prompt": run.prompt_seconds}
            t1 = time.perf_counter()
            logp = self.score(params, oracle.steps)
            log_c, step_mask = step_log_compat(logp, oracle.steps, self.num_branches, self.max_depth)
            log_c = jax.block_until_ready(log_c)
            timing["score"] = time.perf_counter() - t1
        else:
            template = StepBatch.empty(1, self.collect.max_prompt_tokens, self.collect.max_response_tokens)
            oracle, log_c_np = draw_from_bank(self.bank, rng, self.sero.bank_branches or self.num_branches,
                                              self.capacity, template)
            log_c = jnp.asarray(log_c_np[:, :self.max_depth])
            _, step_mask = step_log_compat(jnp.zeros(oracle.steps.response_tokens.shape), oracle.steps,
                                           oracle.num_branches, self.max_depth)
        credit = sero_credit(self.sero, oracle, log_c, step_mask, key)
        metrics = branch_metrics(run, oracle, credit, log_c, step_mask)
        metrics |= {f"time_{k}": v for k, v in timing.items()}
        metrics["time_total"] = time.perf_counter() - t0
        return OracleRows(steps=oracle.steps, coef=credit["coef_n"]), metrics, oracle, log_c


__all__ = ["Bank", "DEPTH_BINS", "SERO_KEY", "SeroBranch", "branch_metrics", "draw_from_bank", "load_bank",
           "make_scorer", "save_bank", "sero_credit", "step_log_compat"]
