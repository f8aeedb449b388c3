"""SERO's reachability weights along oracle branches, early vs later policy, and the compatibility proxy against
sampled action matches (the helper of ``notebooks/sero_reachability.ipynb``; papers/SERO.txt §4.3, §5.4 and
Figure 4, §A.3).

1. **A policy pair.** ``"checkpoints"``: two checkpoints of a real SERO run (default the pool-setting run of
   :func:`experiments.sero.presets.pool_run`, ``graphgpo+sero`` seed 0): "early" is the run's initial policy (its
   cached warm start, ``early="init"``) or a checkpoint step, "later" its newest checkpoint (or a step); the run's
   own config (``run_config.json``) gives the sizes, the collector and the SERO config. ``"quick"`` (CI, or no
   checkpoints): a small random-init Qwen2-structure policy ("early") and the same weights after a short supervised
   warm start on oracle demonstrations (:func:`agentjax.train.warmstart.supervised`; "later") on Sokoban 6×6.
   ``"auto"`` takes the checkpoints when the run folder has any.
2. **Branches.** Each policy plays ``batches`` primary batches of the run's task stream (positions 0, 1, … of its pool
   if it trained on one; the same rooms and collection keys for both policies) with the training collector, and every
   batch goes through SERO's branch exactly as the trainer runs it (:meth:`agentjax.train.sero.SeroBranch.branch`):
   roots from failed rollouts (:func:`~agentjax.rollout.oracle.select_roots`, the same key derivation), restored in
   isolated slots, the BFS oracle through the remaining budget (:func:`~agentjax.rollout.oracle.run_branches`), one
   forward of the frozen policy over every oracle step (:func:`~agentjax.train.sero.make_scorer`,
   :func:`~agentjax.train.sero.step_log_compat`) and the weights ``w_0 = 1, w_j = Π_{i<j} c_i``
   (:func:`~agentjax.train.sero.sero_credit`). Reported per oracle depth j: the mean weight and compatibility over the
   branches that reach j (Figure 4), and the same for both policies scoring the pooled branches of both (a paired
   comparison: identical roots and continuations, only the scorer differs).
3. **Compatibility vs sampled action match (§A.3).** At every step of a subset of the branches the frozen policy's
   reply is sampled ``samples`` times at the step's prompt with the training collector's constrained decoding (its
   sampling parameters; the admissible replies of the step's observation, replayed from the root's snapshot), each
   reply projected onto an action as the collector does; the match frequency ``f_j`` is the share equal to the
   oracle's action. Spearman's ρ between ``c_j`` and ``f_j`` (ranks with ties averaged, :func:`spearman`) with a
   percentile interval from a bootstrap over branches, and the oracle-prefix reproduction estimate
   ``Π_{i<j} f_i`` binned by ``w_j`` (the probability that a policy rollout follows the oracle prefix: the prompts
   along the prefix are fixed, the draws independent).

On Sokoban every command (``Up``, ``Down``, ``Left``, ``Right``) is a single token inside forced format tokens, so
``c_j`` is exactly the constrained decoder's probability of the oracle's action and ``w_j`` the probability of
reproducing the whole prefix: here §A.3's check measures the scorer and the sampler agreeing (up to sampling noise),
not the length-normalised proxy's approximation of multi-token commands (§B.1) that ALFWorld tests.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from agentjax.models import Qwen, Sampler, load_hf, load_tokenizer
from agentjax.rollout.collect import PROJECTORS, Rollouts, run_episodes
from agentjax.rollout.oracle import Branch, run_branches, select_roots, to_oracle_batch
from agentjax.rollout.policy import batch_padding
from agentjax.train.checkpoint import Checkpointer
from agentjax.train.config import LossConfig, ModelConfig, SeroConfig
from agentjax.train.offline import find_run
from agentjax.train.presets import tiny, tiny_arch
from agentjax.train.runconfig import RunConfig, WarmStart, run_from_dict
from agentjax.train.sero import SERO_KEY, sero_credit, step_log_compat
from agentjax.train.state import abstract_state, policy_params
from agentjax.train.trainer import CHECKPOINTS, RUN_CONFIG, build_model, task_stream
from agentjax.train.warmstart import cache_key, run_demonstrations, supervised
from experiments.crbc.credit_analysis import notebook_config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_RUN = "experiments/sero/results/runs/pool/graphgpo+sero/seed0"
POLICIES = ("auto", "checkpoints", "quick")
WEIGHT_BINS = (0.0, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0)  # bins (lo, hi] of w_j for the prefix-reproduction table


# -- configuration ----------------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class ReachabilityConfig:
    """Settings of one analysis run; :meth:`full` is the notebook's default, :meth:`small` the CI run."""

    policies: str = "auto"  # "checkpoints", "quick", or "auto" (checkpoints when run_dir has any)
    run_dir: str = DEFAULT_RUN  # the SERO run whose checkpoints/<step> are read (relative to the repository)
    early: str = "init"  # "init" (the run's initial policy: its warm start) or a checkpoint step
    later: str = "latest"  # "latest" or a checkpoint step
    batches: int = 4  # primary batches per policy (<= one root per group with a failure)
    samples: int = 32  # N replies sampled per oracle step (§A.3)
    match_steps: int = 400  # at most this many oracle steps sampled per policy (whole branches, seeded; 0: all)
    bootstrap: int = 1000  # branch-bootstrap resamples of Spearman's ρ (0: none)
    seed: int = 0  # collection keys, root draws, the quick pair's init and warm start, the subsets, the bootstrap
    quick_width: int = 64  # the quick pair's policy: d_model (4 heads, 2 kv heads, mlp 4·d) ...
    quick_layers: int = 2  # ... and layers
    quick_groups: int = 16  # the quick pair's batches: groups x rollouts x step cap
    quick_group_size: int = 8
    quick_max_steps: int = 15
    quick_warm_episodes: int = 400  # the quick "later" policy's warm start: oracle episodes ...
    quick_warm_steps: int = 300  # ... AdamW steps of 32 turns ...
    quick_warm_lr: float = 2e-3  # ... at this learning rate
    out: str = "notebooks/results/sero_reachability.json"  # JSON path; PNGs beside it

    @classmethod
    def full(cls) -> ReachabilityConfig:
        return cls()

    @classmethod
    def small(cls) -> ReachabilityConfig:
        return cls(policies="quick", batches=2, samples=16, match_steps=0, bootstrap=100, quick_width=32,
                   quick_layers=1, quick_groups=2, quick_group_size=4, quick_max_steps=6, quick_warm_episodes=32,
                   quick_warm_steps=10, quick_warm_lr=1e-2)

    def __post_init__(self):
        if self.policies not in POLICIES:
            raise ValueError(f"policies must be one of {POLICIES}, got {self.policies!r}")
        for name in ("batches", "samples", "quick_width", "quick_layers", "quick_groups", "quick_group_size",
                     "quick_max_steps", "quick_warm_episodes", "quick_warm_steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.quick_width % 4:
            raise ValueError(f"quick_width must be a multiple of 4 (4 heads), got {self.quick_width}")
        if self.match_steps < 0 or self.bootstrap < 0:
            raise ValueError("match_steps and bootstrap must be >= 0")
        if self.early != "init" and not self.early.isdigit():
            raise ValueError(f"early must be 'init' or a checkpoint step, got {self.early!r}")
        if self.later != "latest" and not self.later.isdigit():
            raise ValueError(f"later must be 'latest' or a checkpoint step, got {self.later!r}")


ENV_VARS = {  # variable -> (field, parser)
    "SERO_NB_POLICIES": ("policies", str.strip),
    "SERO_NB_RUN": ("run_dir", str.strip),
    "SERO_NB_EARLY": ("early", str.strip),
    "SERO_NB_LATER": ("later", str.strip),
    "SERO_NB_BATCHES": ("batches", int),
    "SERO_NB_SAMPLES": ("samples", int),
    "SERO_NB_MATCH_STEPS": ("match_steps", int),
    "SERO_NB_BOOTSTRAP": ("bootstrap", int),
    "SERO_NB_SEED": ("seed", int),
    "SERO_NB_OUT": ("out", str),
}


def config_from_env(environ: Mapping[str, str] = os.environ) -> ReachabilityConfig:
    """:meth:`ReachabilityConfig.small` if ``AGENTJAX_NOTEBOOK_SMALL=1`` else ``full``, overridden by
    :data:`ENV_VARS`; a value that does not parse raises ``ValueError`` naming the variable
    (:func:`experiments.crbc.credit_analysis.notebook_config`)."""
    return notebook_config(ReachabilityConfig, ENV_VARS, environ)


# -- the policy pair --------------------------------------------------------------------------------------------------
class Policy(NamedTuple):
    name: str  # "early" / "later"
    params: Any  # the policy's nnx.Param state
    label: str  # where it comes from


class Setup(NamedTuple):
    """What the analysis runs on: one run config (sizes, collector, SERO), a model structure and two policies."""

    run: RunConfig
    source: str  # "checkpoints" | "quick"
    description: str  # one sentence for the notebook
    tokenizer: Any
    model: Qwen  # the structure (its weights are overwritten with each policy's before use)
    policies: tuple[Policy, Policy]


def _abs(path: str) -> str:
    return path if os.path.isabs(path) else os.path.join(ROOT, path)


def _copy(params: Any) -> Any:
    return jax.tree.map(jnp.copy, params)  # nnx states share Variables with the model: keep our own arrays


def checkpoint_steps(run_dir: str) -> list[int]:
    """The committed checkpoint steps of a run folder (none when the folder or its checkpoints are missing)."""
    try:
        out_dir, _ = find_run(_abs(run_dir))
    except FileNotFoundError:
        return []
    with Checkpointer(os.path.join(out_dir, CHECKPOINTS), read_only=True) as ckpt:
        return ckpt.steps()


def quick_run(config: ReachabilityConfig) -> RunConfig:
    """The quick pair's run: the tiny GraphGPO Sokoban preset with a ``quick_width`` × ``quick_layers`` policy, the
    ``quick_*`` sizes, SERO's default config and the quick warm start; no evaluation, a serial pool."""
    w = config.quick_width
    arch = tiny_arch(d_model=w, mlp_dim=4 * w, num_layers=config.quick_layers, head_dim=w // 4)
    run = tiny("graphgpo", "sokoban")
    rows = config.quick_groups * config.quick_group_size * config.quick_max_steps
    micro = next(m for m in (40, 32, 24, 16, 12, 8, 6, 4, 2, 1) if rows % m == 0)
    run = run.replace(train=run.train.replace(model=ModelConfig(arch), micro_batch_size=micro, mini_batches=1,
                                              sero=SeroConfig(micro_batch_size=config.quick_max_steps)))
    run = run.with_sizes(num_groups=config.quick_groups, group_size=config.quick_group_size,
                         max_steps=config.quick_max_steps)
    ws = WarmStart(episodes=config.quick_warm_episodes, steps=config.quick_warm_steps, batch_size=32,
                   learning_rate=config.quick_warm_lr, seed=config.seed)
    return run.replace(warm_start=ws, eval_every=0, workers=0, progress=False, out_dir=os.path.join(ROOT, "runs",
                                                                                                    "sero-quick"))


def quick_policies(config: ReachabilityConfig) -> Setup:
    """Random init (seed ``config.seed``) as "early" and the same weights after the quick warm start as "later"."""
    run = quick_run(config)
    tokenizer = load_tokenizer(run.tokenizer)
    model = Qwen(run.train.model.arch, rngs=nnx.Rngs(config.seed))
    early = _copy(policy_params(model))
    rows = run_demonstrations(run, tokenizer)
    ro = run.train.rollout
    loss = LossConfig(logprob_chunk=run.train.loss.logprob_chunk, logprob_remat=run.train.loss.logprob_remat)
    losses = supervised(model, rows, run.warm_start, ro.prompt_len, ro.response_len, loss,
                        max_allowed=run.collect.max_allowed)
    later = _copy(policy_params(model))
    a = run.train.model.arch
    ws = run.warm_start
    arch = f"{a.num_layers}-layer d={a.d_model} Qwen2-structure policy"
    description = (f"quick pair (no checkpoints used): a random-init {arch} ('early') and the same weights after "
                   f"{ws.steps} AdamW steps of supervised warm start on {len(rows)} oracle turns of {ws.episodes} "
                   f"episodes (NLL {losses[0]:.3f} -> {losses[-1]:.3f}; 'later'); Sokoban 6x6, "
                   f"{ro.num_groups} groups x {ro.group_size} rollouts x {ro.max_steps} steps a batch")
    return Setup(run=run, source="quick", description=description, tokenizer=tokenizer, model=model,
                 policies=(Policy("early", early, "random init"),
                           Policy("later", later, f"warm start ({ws.steps} steps)")))


def checkpoint_policies(config: ReachabilityConfig) -> Setup:
    """The pair from ``config.run_dir`` (module docstring, 1); the run's config from its ``run_config.json``."""
    out_dir, _ = find_run(_abs(config.run_dir))
    with open(os.path.join(out_dir, RUN_CONFIG)) as f:
        run = run_from_dict(json.load(f))
    sero = run.train.sero or SeroConfig()
    run = run.replace(train=run.train.replace(sero=sero), eval_every=0, workers=0, progress=False)
    tokenizer = load_tokenizer(run.tokenizer)
    model = build_model(run.replace(warm_start=None), tokenizer, None)  # structure: the weights come below
    with Checkpointer(os.path.join(out_dir, CHECKPOINTS), read_only=True) as ckpt:
        steps = ckpt.steps()
        if not steps:
            raise FileNotFoundError(f"{out_dir}/{CHECKPOINTS} holds no checkpoint")
        later_step = steps[-1] if config.later == "latest" else int(config.later)
        like = abstract_state(run.train, model)
        later = Policy("later", _copy(ckpt.restore(later_step, like).state.params), f"checkpoint {later_step}")
        if config.early == "init":
            if run.warm_start is not None:
                folder = os.path.join(run.warm_start.cache_dir or os.path.join(out_dir, "warmstart"),
                                      cache_key(run))
                if not os.path.isfile(os.path.join(folder, "warmstart.json")):
                    raise FileNotFoundError(f"the run's warm start is not cached at {folder}; set SERO_NB_EARLY to a "
                                            f"checkpoint step (available: {steps})")
                early = Policy("early", policy_params(load_hf(folder, config=run.train.model.arch)),
                               "initial policy (warm start, update 0)")
            else:
                early = Policy("early", policy_params(build_model(run, tokenizer, None)), "initial policy (update 0)")
        else:
            step = int(config.early)
            early = Policy("early", _copy(ckpt.restore(step, like).state.params), f"checkpoint {step}")
    if early.label == later.label:
        raise ValueError(f"early and later are the same policy ({early.label})")
    ro = run.train.rollout
    shown = os.path.relpath(out_dir, ROOT) if out_dir.startswith(ROOT + os.sep) else out_dir
    description = (f"checkpoints of {shown} ({run.train.credit.method}+SERO): "
                   f"'early' = {early.label}, 'later' = {later.label}; {run.env}, {ro.num_groups} groups x "
                   f"{ro.group_size} rollouts x {ro.max_steps} steps a batch")
    return Setup(run=run, source="checkpoints", description=description, tokenizer=tokenizer, model=model,
                 policies=(early, later))


def load_policies(config: ReachabilityConfig) -> Setup:
    """:func:`checkpoint_policies` or :func:`quick_policies` as ``config.policies`` says (``"auto"``: the
    checkpoints when ``run_dir`` has any)."""
    use = config.policies
    if use == "auto":
        use = "checkpoints" if checkpoint_steps(config.run_dir) else "quick"
    return checkpoint_policies(config) if use == "checkpoints" else quick_policies(config)


def set_weights(setup: Setup, sampler: Sampler, policy: Policy) -> None:
    """Point the model and the sampler at ``policy``'s parameters (copies: later updates cannot alias them)."""
    nnx.update(setup.model, _copy(policy.params))
    sampler.update_weights(setup.model)


# -- branches ---------------------------------------------------------------------------------------------------------
def batch_key(config: ReachabilityConfig, index: int) -> jax.Array:
    """The collection key of primary batch ``index`` (the same for both policies)."""
    return jax.random.fold_in(jax.random.key(config.seed), index)


def primary_rollouts(setup: Setup, pool: Any, sampler: Sampler, config: ReachabilityConfig, index: int) -> Rollouts:
    """Primary batch ``index`` (task-stream position ``index``) with the sampler's current policy; a run trained on
    a fixed pool (``RunConfig.train_pool``) draws from that pool, as its trainer did."""
    run = setup.run
    tasks = run.spec.tasks(run.spec.train_split)[:run.train_pool or None]
    idx = task_stream(len(tasks), config.seed, index, run.train.rollout.num_groups)
    return run_episodes(pool, [tasks[i] for i in idx], sampler, run.train_collect, batch_key(config, index),
                        task_indices=idx)


class BranchSet(NamedTuple):
    """One policy's scored branches over every batch: ``Br`` attempted branches, ``J`` = the step cap."""

    branches: tuple[Branch, ...]  # [Br]
    oracles: tuple[Any, ...]  # per batch, the OracleBatch (to rescore with another policy)
    counts: tuple[int, ...]  # per batch, attempted branches
    log_c_bj: np.ndarray  # [Br, J] log c_j under the rooting policy (0 off the steps)
    step_mask_bj: np.ndarray  # [Br, J] bool
    weight_bj: np.ndarray  # [Br, J] SERO weights (sero_credit, the run's scheme)
    gate_b: np.ndarray  # [Br] the improvement gate
    stats: dict[str, float]  # primary rollouts and branch outcomes


def _sero_key(config: ReachabilityConfig, index: int) -> jax.Array:
    return jax.random.fold_in(batch_key(config, index), SERO_KEY)


def score(setup: Setup, scorer: Any, params: Any, oracle: Any, key: jax.Array) -> tuple[np.ndarray, ...]:
    """``(log c [Br, J], step mask [Br, J], weight [Br, J], gate [Br])`` of one oracle batch under ``params``."""
    run = setup.run
    log_c, mask = step_log_compat(scorer(params, oracle.steps), oracle.steps, run.train.rollout.num_groups,
                                  run.train.rollout.max_steps)
    credit = sero_credit(run.train.sero, oracle, log_c, mask, key)
    return tuple(np.asarray(x) for x in (log_c, mask, credit["weight_bj"], credit["gate_b"]))


def collect_branches(setup: Setup, pool: Any, sampler: Sampler, scorer: Any, policy: Policy,
                     config: ReachabilityConfig) -> BranchSet:
    """``config.batches`` primary batches of ``policy`` and their SERO branches, scored by ``policy`` (module
    docstring, 2; the steps of :meth:`agentjax.train.sero.SeroBranch.branch`, keeping the branch records)."""
    run, sero = setup.run, setup.run.train.sero
    collect = run.train_collect
    set_weights(setup, sampler, policy)
    parts, branches, oracles, counts = [], [], [], []
    episodes = won = 0
    for i in range(config.batches):
        rollouts = primary_rollouts(setup, pool, sampler, config, i)
        episodes += len(rollouts.episodes)
        won += sum(ep.won for ep in rollouts.episodes)
        key = _sero_key(config, i)
        rng = np.random.default_rng(np.asarray(jax.random.key_data(key)).ravel().tolist())
        roots = select_roots(rollouts, rng, collect, mode=sero.roots, priority_power=sero.priority_power,
                             gate_on=sero.gate_on)
        ran = run_branches(pool, run.branch_slots, roots, setup.tokenizer, collect,
                           max_oracle_steps=sero.max_oracle_steps, gate_on=sero.gate_on)
        oracle = to_oracle_batch(ran.branches, collect, num_branches=run.train.rollout.num_groups,
                                 capacity=run.train.oracle_rows)
        n = len(ran.branches)
        parts.append(tuple(x[:n] for x in score(setup, scorer, policy.params, oracle, key)))
        branches += ran.branches
        oracles.append(oracle)
        counts.append(n)
    log_c, mask, weight, gate = (np.concatenate([p[k] for p in parts]) for k in range(4))
    ended = [b.ended for b in branches]
    stats = {"episodes": episodes, "success_rate": won / max(episodes, 1), "roots_attempted": len(branches),
             "roots_valid": int(sum(b.valid for b in branches)), "roots_gated": int((gate > 0).sum()),
             "oracle_steps": int(mask.sum()), "branches_won": int(sum(b.won for b in branches))}
    stats |= {f"ended_{why}": ended.count(why) for why in sorted(set(ended))}
    return BranchSet(branches=tuple(branches), oracles=tuple(oracles), counts=tuple(counts), log_c_bj=log_c,
                     step_mask_bj=mask, weight_bj=weight, gate_b=gate, stats=stats)


def rescore(setup: Setup, scorer: Any, policy: Policy, bset: BranchSet, config: ReachabilityConfig,
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(log c, step mask, weight)`` ``[Br, J]`` of ``bset``'s branches scored by another ``policy``."""
    parts = [tuple(x[:n] for x in score(setup, scorer, policy.params, oracle, _sero_key(config, i))[:3])
             for i, (oracle, n) in enumerate(zip(bset.oracles, bset.counts, strict=True))]
    return tuple(np.concatenate([p[k] for p in parts]) for k in range(3))


def depth_table(weight_bj: np.ndarray, step_mask_bj: np.ndarray, log_c_bj: np.ndarray) -> list[dict[str, float]]:
    """Per oracle depth j reached by some branch: ``n`` branches, mean and standard error of ``w_j``, mean ``c_j``."""
    rows = []
    for j in range(step_mask_bj.shape[1]):
        m = step_mask_bj[:, j]
        if not m.any():
            continue
        w, c = weight_bj[m, j].astype(np.float64), np.exp(log_c_bj[m, j].astype(np.float64))
        se = float(w.std(ddof=1) / np.sqrt(len(w))) if len(w) > 1 else 0.0
        rows.append({"depth": j, "n": int(m.sum()), "weight": float(w.mean()), "weight_se": se,
                     "compat": float(c.mean())})
    return rows


def supervision_mass(weight_bj: np.ndarray, step_mask_bj: np.ndarray) -> dict[str, float]:
    """Per branch ``Σ_j w_j`` (the supervision mass SERO spends on it) and its share of the branch's steps."""
    n_b = step_mask_bj.sum(1)
    keep = n_b > 0
    mass_b = np.where(step_mask_bj, weight_bj, 0.0).sum(1)[keep]
    return {"branches": int(keep.sum()), "mass": float(mass_b.mean()) if keep.any() else 0.0,
            "mass_share": float((mass_b / n_b[keep]).mean()) if keep.any() else 0.0,
            "steps": float(n_b[keep].mean()) if keep.any() else 0.0}


# -- sampled action matches (§A.3) ------------------------------------------------------------------------------------
def replay_admissible(setup: Setup, branch: Branch) -> list[tuple[str, ...]]:
    """The admissible actions at each oracle step of ``branch``: its root restored in a fresh env, the oracle's
    actions replayed."""
    run = setup.run
    env = run.spec.env_class()(**run.env_kwargs)
    try:
        obs = env.restore(branch.root.snapshot)
        out = []
        for step in branch.steps:
            out.append(tuple(obs.admissible or ()))
            obs, *_ = env.step(step.action)
        return out
    finally:
        close = getattr(env, "close", None)
        if close is not None:
            close()


class Matches(NamedTuple):
    """One policy's sampled match frequencies, one entry per sampled oracle step ``n``."""

    branch_n: np.ndarray  # [n] int, index into the BranchSet
    depth_n: np.ndarray  # [n] int, j
    compat_n: np.ndarray  # [n] c_j under the policy
    weight_n: np.ndarray  # [n] w_j
    freq_n: np.ndarray  # [n] share of the samples equal to the oracle's action
    samples: int  # N


def match_frequencies(setup: Setup, sampler: Sampler, policy: Policy, bset: BranchSet,
                      config: ReachabilityConfig) -> Matches:
    """Sample ``policy``'s reply ``config.samples`` times at every step of a seeded subset of whole branches (at
    most ``config.match_steps`` steps; 0: all) and count the oracle's action (module docstring, 3)."""
    run = setup.run
    collect = run.collect
    n_samples = config.samples
    order = np.random.default_rng([config.seed, 3]).permutation(len(bset.branches))
    chosen, total = [], 0
    for b in order:
        k = len(bset.branches[b].steps)
        if k and (not config.match_steps or total + k <= config.match_steps):
            chosen.append(int(b))
            total += k
    chosen.sort()
    items = []  # (branch, step, admissible)
    for b in chosen:
        branch = bset.branches[b]
        items += [(b, s, adm) for s, adm in zip(branch.steps, replay_admissible(setup, branch), strict=True)]
    if not items:
        empty = np.zeros(0)
        return Matches(empty.astype(int), empty.astype(int), empty, empty, empty, n_samples)
    set_weights(setup, sampler, policy)
    prompts, allowed, owner = [], [], []
    for i, (_, s, adm) in enumerate(items):
        replies = [collect.constrained_format.format(action=a) for a in adm]
        prompts += [s.prompt_ids.tolist()] * n_samples
        allowed += [replies] * n_samples
        owner += [i] * n_samples
    hits = np.zeros(len(items))
    project = PROJECTORS[run.env]  # both sides projected as the collector projects a reply (Sokoban: lower case)
    target = [project(collect.constrained_format.format(action=s.action), adm, require_think=False).action
              for _, s, adm in items]
    rows = run.train.rollout.num_groups * run.train.rollout.group_size
    width = rows + batch_padding(rows, collect.batch_bucket, pow2=collect.pow2_batches)  # the collector's first turn
    limits = np.full(width, collect.max_response_tokens, np.int32)
    key = jax.random.fold_in(jax.random.key(config.seed), 0xA3)
    for c, start in enumerate(range(0, len(prompts), width)):
        p, a = prompts[start:start + width], allowed[start:start + width]
        real = len(p)
        p, a = p + [p[0]] * (width - real), a + [a[0]] * (width - real)
        extra = {"sparse": True} if collect.sparse_logits else {}
        chunk_key = jax.random.fold_in(key, c)
        if collect.row_keys:
            extra["row_keys"] = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(chunk_key,
                                                                                 np.arange(width, dtype=np.uint32))
        out = sampler.generate(p, collect.sampling, chunk_key, max_new_tokens=limits, allowed=a,
                               max_trie_edges=collect.max_trie_edges, **extra)
        for r in range(real):
            i = owner[start + r]
            hits[i] += project(out.texts[r], items[i][2], require_think=False).action == target[i]
    b_n = np.array([b for b, _, _ in items])
    d_n = np.array([s.depth for _, s, _ in items])
    return Matches(branch_n=b_n, depth_n=d_n, compat_n=np.exp(bset.log_c_bj[b_n, d_n].astype(np.float64)),
                   weight_n=bset.weight_bj[b_n, d_n].astype(np.float64), freq_n=hits / n_samples, samples=n_samples)


def rankdata(x: np.ndarray) -> np.ndarray:
    """1-based ranks of ``x`` with ties given their average rank (scipy's ``rankdata(method="average")``)."""
    x = np.asarray(x, np.float64)
    order = np.argsort(x, kind="stable")
    sorted_x = x[order]
    new = np.concatenate([[True], sorted_x[1:] != sorted_x[:-1]])
    starts = np.flatnonzero(new)
    ends = np.append(starts[1:], len(x))  # tie block [start, end) holds ranks start + 1 .. end
    avg = (starts + ends + 1) / 2.0
    ranks = np.empty(len(x))
    ranks[order] = np.repeat(avg, ends - starts)
    return ranks


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman's ρ: the Pearson correlation of the average ranks; NaN when either side is constant or n < 2."""
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"spearman: two 1-d arrays of one length, got {x.shape} and {y.shape}")
    if len(x) < 2:
        return float("nan")
    rx, ry = rankdata(x) - (len(x) + 1) / 2.0, rankdata(y) - (len(y) + 1) / 2.0
    den = np.sqrt((rx * rx).sum() * (ry * ry).sum())
    return float((rx * ry).sum() / den) if den > 0 else float("nan")


def correlation_summary(m: Matches, *, bootstrap: int, seed: int) -> dict[str, float]:
    """ρ(c_j, f_j) with a 2.5–97.5% percentile interval over ``bootstrap`` resamples of whole branches (resamples
    where ρ is undefined are dropped), Pearson, the means, and the counts."""
    rho = spearman(m.compat_n, m.freq_n)
    out = {"rho": rho, "rho_lo": float("nan"), "rho_hi": float("nan"), "n_steps": int(len(m.freq_n)),
           "n_branches": int(len(np.unique(m.branch_n))), "samples": m.samples,
           "mean_compat": float(m.compat_n.mean()) if len(m.freq_n) else float("nan"),
           "mean_freq": float(m.freq_n.mean()) if len(m.freq_n) else float("nan"),
           "pearson": float(np.corrcoef(m.compat_n, m.freq_n)[0, 1]) if len(m.freq_n) > 1 and m.compat_n.std() > 0
           and m.freq_n.std() > 0 else float("nan")}
    groups = [np.flatnonzero(m.branch_n == b) for b in np.unique(m.branch_n)]
    if bootstrap and len(groups) > 1:
        rng = np.random.default_rng([seed, 5])
        draws = []
        for _ in range(bootstrap):
            rows = np.concatenate([groups[g] for g in rng.integers(len(groups), size=len(groups))])
            draws.append(spearman(m.compat_n[rows], m.freq_n[rows]))
        draws = np.asarray(draws)
        draws = draws[np.isfinite(draws)]
        if len(draws):
            out["rho_lo"], out["rho_hi"] = (float(q) for q in np.percentile(draws, [2.5, 97.5]))
    return out


def pool_matches(parts: Sequence[Matches]) -> Matches:
    """Several policies' matches as one set (branch ids kept apart)."""
    offset, b = 0, []
    for p in parts:
        b.append(p.branch_n + offset)
        offset += int(p.branch_n.max()) + 1 if len(p.branch_n) else 0
    cat = lambda f: np.concatenate([getattr(p, f) for p in parts])  # noqa: E731
    return Matches(branch_n=np.concatenate(b), depth_n=cat("depth_n"), compat_n=cat("compat_n"),
                   weight_n=cat("weight_n"), freq_n=cat("freq_n"), samples=parts[0].samples)


def prefix_bins(m: Matches, edges: Sequence[float] = WEIGHT_BINS) -> list[dict[str, float]]:
    """Steps at depth >= 1 binned by ``w_j`` into ``(lo, hi]``: the mean weight and the mean oracle-prefix
    reproduction estimate ``Π_{i<j} f_i`` (module docstring, 3) per bin."""
    prefix = np.ones(len(m.freq_n))
    for b in np.unique(m.branch_n):
        rows = np.flatnonzero(m.branch_n == b)
        rows = rows[np.argsort(m.depth_n[rows])]
        prefix[rows] = np.concatenate([[1.0], np.cumprod(m.freq_n[rows])[:-1]])
    deep = m.depth_n >= 1
    out = []
    for lo, hi in zip(edges[:-1], edges[1:], strict=True):
        sel = deep & (m.weight_n > lo) & (m.weight_n <= hi)
        if sel.any():
            out.append({"lo": lo, "hi": hi, "n": int(sel.sum()), "weight": float(m.weight_n[sel].mean()),
                        "prefix_freq": float(prefix[sel].mean())})
    return out


# -- output -----------------------------------------------------------------------------------------------------------
def _clean(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if isinstance(x, (np.floating, float)):
        return float(x) if np.isfinite(x) else None
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, np.bool_):
        return bool(x)
    return x


def write_json(path: str | os.PathLike, results: Mapping[str, Any]) -> None:
    """``results`` as JSON (NumPy scalars converted, non-finite numbers as null)."""
    with open(path, "w") as f:
        json.dump(_clean(results), f, indent=1)


__all__ = ["BranchSet", "ENV_VARS", "Matches", "Policy", "ReachabilityConfig", "Setup", "checkpoint_policies",
           "checkpoint_steps", "collect_branches", "config_from_env", "correlation_summary", "depth_table",
           "load_policies", "match_frequencies", "pool_matches", "prefix_bins", "primary_rollouts",
           "quick_policies", "quick_run", "rankdata", "replay_admissible", "rescore", "set_weights", "spearman",
           "supervision_mass", "write_json"]
