"""Training configuration: frozen dataclasses, one per concern, composed in :class:`TrainConfig`.

Every class validates itself in ``__post_init__`` (a bad value raises ``ValueError`` naming the field and the
fix), is hashable (so it can be a static argument of ``jax.jit``) and turns into JSON with
:meth:`TrainConfig.to_dict` for checkpoint metadata. Presets are classmethods (STYLE.md 9); experiment folders
add their own on top of these defaults.

The credit method is a type, not a string: ``TrainConfig.credit`` is one of the ``*Credit`` classes below, each
holding exactly the parameters of its kernel in :mod:`agentjax.credit` (METHODS.md defaults), and
:func:`agentjax.train.advantages.compute_advantages` dispatches on the type. With ``tyro`` the union becomes
one sub-command per method.

Defaults where METHODS.md is silent follow verl / verl-agent's GiGPO ALFWorld recipe: learning rate 1e-6,
AdamW (β = 0.9, 0.999, weight decay 0.01), grad-norm clip 1.0, ε = 0.2, dual clip c = 3, k3 KL with
coefficient 0.01, entropy coefficient 0.001, "token-mean" aggregation.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Literal

from agentjax.credit.sero import SCHEMES
from agentjax.losses.policy import AGGREGATIONS, Aggregation
from agentjax.models.config import QwenConfig

Score = Literal["return", "success"]
NormMode = Literal["mean_norm", "mean_std_norm"]
_SCORES = ("return", "success")
_NORM_MODES = ("mean_norm", "mean_std_norm")


def _positive(obj: Any, *names: str) -> None:
    for name in names:
        if not getattr(obj, name) > 0:
            raise ValueError(f"{type(obj).__name__}.{name} must be > 0, got {getattr(obj, name)!r}")


def _non_negative(obj: Any, *names: str) -> None:
    for name in names:
        if not getattr(obj, name) >= 0:
            raise ValueError(f"{type(obj).__name__}.{name} must be >= 0, got {getattr(obj, name)!r}")


def _one_of(obj: Any, name: str, choices: tuple[str, ...]) -> None:
    if getattr(obj, name) not in choices:
        raise ValueError(f"{type(obj).__name__}.{name}={getattr(obj, name)!r}; choose one of {choices}")


def _unit(obj: Any, *names: str, closed_low: bool = False) -> None:
    for name in names:
        v = getattr(obj, name)
        if not ((0.0 <= v) if closed_low else (0.0 < v)) or v > 1.0:
            low = "[0" if closed_low else "(0"
            raise ValueError(f"{type(obj).__name__}.{name} must be in {low}, 1], got {v!r}")


# -- credit methods -----------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class GRPOCredit:
    """GRPO: ``(S_i − mean_g S) / (std_g S + 1e-6)`` per rollout (:func:`agentjax.credit.batched_grpo`)."""

    method: ClassVar[str] = "grpo"
    score: Score = "return"  # episode score S: total reward (10·R − 0.1·#invalid) or binary success R
    ddof: int = 1  # std's delta degrees of freedom (1: unbiased, as verl)

    def __post_init__(self):
        _one_of(self, "score", _SCORES)
        if self.ddof not in (0, 1):
            raise ValueError(f"GRPOCredit.ddof must be 0 or 1, got {self.ddof}")


@dataclasses.dataclass(frozen=True)
class RLOOCredit:
    """RLOO: ``S_i − mean_{j≠i} S_j`` per rollout (:func:`agentjax.credit.batched_rloo`)."""

    method: ClassVar[str] = "rloo"
    score: Score = "return"

    def __post_init__(self):
        _one_of(self, "score", _SCORES)


@dataclasses.dataclass(frozen=True)
class PPOCredit:
    """PPO: turn-level GAE(γ, λ) with a linear value head on the policy's last prompt token.

    The value head and its loss live with the method: ``value_coef`` weighs the clipped value loss against the
    policy loss (the trunk is shared, so it is smaller than PPO's usual 0.5: returns reach 10 here, and the
    value gradient would otherwise dominate the language model's), ``value_clip`` is verl's
    ``cliprange_value``. ``whiten`` normalises the advantages over the batch's trained tokens (verl's
    ``masked_whiten``).
    """

    method: ClassVar[str] = "ppo"
    gamma: float = 0.95  # discount per turn (GiGPO's step discount, so the methods see the same horizon)
    lam: float = 0.95  # GAE λ
    whiten: bool = True
    value_coef: float = 0.1
    value_clip: float | None = 0.5

    def __post_init__(self):
        _unit(self, "gamma", "lam", closed_low=True)
        _non_negative(self, "value_coef")
        if self.value_clip is not None:
            _positive(self, "value_clip")


@dataclasses.dataclass(frozen=True)
class GiGPOCredit:
    """GiGPO: episode + anchor-state step advantages (:func:`agentjax.credit.batched_gigpo`)."""

    method: ClassVar[str] = "gigpo"
    gamma: float = 0.95
    mode: NormMode = "mean_std_norm"  # "mean_norm" for WebShop
    step_weight: float = 1.0

    def __post_init__(self):
        _unit(self, "gamma", closed_low=True)
        _one_of(self, "mode", _NORM_MODES)


@dataclasses.dataclass(frozen=True)
class HGPOCredit:
    """HGPO: history-window anchor groups (:func:`agentjax.credit.batched_hgpo`)."""

    method: ClassVar[str] = "hgpo"
    gamma: float = 0.95
    history: int = 2  # K: levels k = 1..K+1
    alpha: float = 1.0
    mode: NormMode = "mean_std_norm"
    trajectory_term: bool = False

    def __post_init__(self):
        _unit(self, "gamma", closed_low=True)
        _non_negative(self, "history")
        _one_of(self, "mode", _NORM_MODES)


@dataclasses.dataclass(frozen=True)
class GraphGPOCredit:
    """GraphGPO: shortest-path-to-success step returns (:func:`agentjax.credit.batched_graphgpo`)."""

    method: ClassVar[str] = "graphgpo"
    gamma: float = 0.1
    normalised: bool = False
    mode: NormMode = "mean_std_norm"
    step_weight: float = 1.0
    episode_weight: float = 1.0
    success_reward: float = 10.0

    def __post_init__(self):
        _unit(self, "gamma")
        _one_of(self, "mode", _NORM_MODES)


@dataclasses.dataclass(frozen=True)
class CRBCCredit:
    """CRBC: cross-rollout Bellman closure credit + GRPO (:func:`agentjax.credit.batched_crbc`)."""

    method: ClassVar[str] = "crbc"
    beta: float = 0.98
    depth: int | None = None  # closure depth K; None = full closure (K = ∞)
    w_traj: float = 1.0
    w_step: float = 5.0
    sigma_min: float = 0.1
    score: Score = "return"

    def __post_init__(self):
        _unit(self, "beta")
        _positive(self, "sigma_min")
        if self.depth is not None:
            _non_negative(self, "depth")
        _one_of(self, "score", _SCORES)


@dataclasses.dataclass(frozen=True)
class RAOCredit:
    """RAO on recursive trees (METHODS.md "SERA" 6-8): per-node rewards, leave-one-out over the K trees of a root task,
    the zero-variance filter, inverse-frequency depth weights, CISPO; trained by :mod:`agentjax.train.trees`.

    A child's reward is its verifier / judge's binary label, the root's the environment outcome
    (:func:`agentjax.credit.sera_stages.execution_credit`). ``stages`` is the schedule's cycle ``e : d : r`` of
    optimizer steps (:class:`agentjax.train.schedule.StageSchedule`; RAO 1 : 0 : 0, RAO + D 12 : 4 : 0, whose
    decomposition steps train the delegation tokens with leaf coverage,
    :func:`~agentjax.credit.sera_stages.decomposition_credit`); the run's ``updates`` are its total steps. The
    released code's readings are the defaults (``Training/configs/textcraft.yaml``: CISPO with ρ clipped to [0, 5],
    no KL, the root-outcome LOO baseline, depth weights over trajectories, the zero-variance filter on TextCraft;
    ``textworld.yaml`` turns the filter off); the paper summary's readings are the other values
    (:mod:`agentjax.credit.sera_baselines`).
    """

    method: ClassVar[str] = "rao"
    stages: tuple[int, int, int] = (1, 0, 0)  # execution : decomposition : rubric optimizer steps per cycle
    baseline: Literal["root", "pooled", "tree_mean"] = "root"  # execution LOO baseline
    decomposition_baseline: Literal["tree_mean", "pooled"] = "tree_mean"
    empty_as_zero: bool = True  # a tree without launch events counts as mean event reward 0
    depth_weighting: Literal["trajectory", "sample", "none"] = "trajectory"
    filter_zero_variance: bool = True
    clip_low: float | None = 0.0  # CISPO bounds on the importance ratio (None: unbounded on that side)
    clip_high: float | None = 5.0

    def __post_init__(self):
        if len(self.stages) != 3 or min(self.stages) < 0 or sum(self.stages) == 0:
            raise ValueError(f"RAOCredit.stages must be three step counts (execution, decomposition, rubric) >= 0, "
                             f"not all 0; got {self.stages}")
        self._check_rubric_stage()
        _one_of(self, "baseline", ("root", "pooled", "tree_mean"))
        _one_of(self, "decomposition_baseline", ("tree_mean", "pooled"))
        _one_of(self, "depth_weighting", ("trajectory", "sample", "none"))
        if self.clip_low is not None and self.clip_high is not None and self.clip_low > self.clip_high:
            raise ValueError(f"RAOCredit: clip_low {self.clip_low} > clip_high {self.clip_high}")

    def _check_rubric_stage(self) -> None:
        if self.stages[2]:
            raise ValueError("RAOCredit.stages: the rubric stage needs SERA's rubrics and counterfactual forks, which "
                             "RAO does not have; use (1, 0, 0) (RAO) or (12, 4, 0) (RAO + D), or --method sera")


@dataclasses.dataclass(frozen=True)
class SERACredit(RAOCredit):
    """SERA (METHODS.md "SERA" 2-7): RAO's trees, baselines, depth weights and CISPO, with a child's execution reward
    its parent's rubric score instead of the verifier's label: at each delegation the policy writes the child's
    rubric and after the child stopped grades it (:mod:`agentjax.rollout.tree_rubrics`; ``reading``: the grade's
    final score, released, or ``gate · Σ w s``, the paper's); a child whose rubric or grade does not parse is left
    out of the gradient. ``stages`` = execution : decomposition : rubric optimizer steps per cycle: SERA 16 : 2 : 2,
    w/o D 16 : 0 : 2, w/o RT 16 : 2 : 0, execution only with rubric rewards 1 : 0 : 0. The rubric stage grows fresh
    trees with fork groups of ``branches`` children from clones of the pre-call world (``fork_budget`` forked
    environments per tree), ranks the branches' grades against their labels with ``margin`` and trains the rubric
    completions only (:mod:`agentjax.train.rubric_stage`).
    """

    method: ClassVar[str] = "sera"
    stages: tuple[int, int, int] = (16, 2, 2)
    reading: Literal["final", "weighted"] = "final"
    branches: int = 8  # children per fork group (the released fork-8)
    fork_budget: int = 16  # forked environments per tree, branch 0 counted
    margin: float = 0.2  # the ranking hinge's margin (released)

    def __post_init__(self):
        super().__post_init__()
        _one_of(self, "reading", ("final", "weighted"))
        if self.branches < 2 or self.fork_budget < self.branches:
            raise ValueError(f"SERACredit: branches >= 2 and fork_budget >= branches, got {self.branches}, "
                             f"{self.fork_budget}")
        if self.margin < 0:
            raise ValueError(f"SERACredit.margin must be >= 0, got {self.margin}")

    def _check_rubric_stage(self) -> None:
        pass  # SERA trains all three stages


CreditConfig = (GRPOCredit | RLOOCredit | PPOCredit | GiGPOCredit | HGPOCredit | GraphGPOCredit | CRBCCredit | RAOCredit
                | SERACredit)
CREDIT_METHODS: dict[str, type] = {c.method: c for c in CreditConfig.__args__}


def credit_for(method: str, **params: Any) -> CreditConfig:
    """The credit config of a method by its name (CLI / presets), e.g. ``credit_for("gigpo", mode="mean_norm")``."""
    if method not in CREDIT_METHODS:
        raise ValueError(f"unknown credit method {method!r}; choose one of {sorted(CREDIT_METHODS)}")
    return CREDIT_METHODS[method](**params)


# -- the rest -----------------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class RolloutConfig:
    """Sizes of one update's batch: ``num_groups`` tasks × ``group_size`` rollouts of ≤ ``max_steps`` turns.

    ``capacity`` is the number of `StepBatch` rows (default: every turn of every rollout fits); the credit kernels
    see ``[num_groups, group_size, max_steps]`` views.
    """

    num_groups: int = 16
    group_size: int = 8
    max_steps: int = 50
    prompt_len: int = 2048
    response_len: int = 512
    capacity: int | None = None

    def __post_init__(self):
        _positive(self, "num_groups", "group_size", "max_steps", "prompt_len", "response_len")
        if self.capacity is not None:
            _positive(self, "capacity")

    @property
    def rows(self) -> int:
        """Rows of the batch (``capacity`` or ``num_groups · group_size · max_steps``)."""
        return self.capacity or self.num_groups * self.group_size * self.max_steps


@dataclasses.dataclass(frozen=True)
class LossConfig:
    """The token-level objective ``L = agg(ℓ^clip) + β_KL agg(k3) − c_H agg(H)`` (+ PPO's value loss).

    See :mod:`agentjax.losses.policy`. ``temperature`` divides the logits exactly as the sampler did, so the
    ratio compares like with like; ``logprob_chunk`` / ``logprob_remat`` are passed to
    :func:`agentjax.models.logprobs.chunked_logprobs`.
    """

    clip_low: float = 0.2
    clip_high: float = 0.2
    dual_clip: float | None = 3.0
    kl_coef: float = 0.01
    entropy_coef: float = 0.001
    aggregation: Aggregation = "token-mean"
    temperature: float = 1.0
    logprob_chunk: int = 128
    logprob_remat: bool = True

    def __post_init__(self):
        _positive(self, "clip_low", "clip_high", "temperature", "logprob_chunk")
        _non_negative(self, "kl_coef", "entropy_coef")
        if self.clip_low >= 1.0:
            raise ValueError(f"LossConfig.clip_low must be < 1 (the ratio floor is 1 − clip_low), got {self.clip_low}")
        if self.dual_clip is not None and self.dual_clip <= 1.0:
            raise ValueError(f"LossConfig.dual_clip must be > 1 or None (off), got {self.dual_clip}")
        _one_of(self, "aggregation", AGGREGATIONS)


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
    """AdamW with linear warm-up from 0, then constant or cosine decay, after global grad-norm clipping."""

    learning_rate: float = 1e-6
    warmup_steps: int = 0
    schedule: Literal["constant", "cosine"] = "constant"
    decay_steps: int = 150  # cosine: steps after warm-up to reach min_lr_ratio · learning_rate
    min_lr_ratio: float = 0.0
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.01
    max_grad_norm: float | None = 1.0

    def __post_init__(self):
        _positive(self, "learning_rate", "decay_steps", "eps")
        _non_negative(self, "warmup_steps", "weight_decay", "min_lr_ratio")
        _one_of(self, "schedule", ("constant", "cosine"))
        for name in ("b1", "b2"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"OptimizerConfig.{name} must be in [0, 1), got {getattr(self, name)}")
        if self.max_grad_norm is not None:
            _positive(self, "max_grad_norm")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """The policy: its architecture and, optionally, an HF checkpoint folder to load (None: random init)."""

    arch: QwenConfig = QwenConfig.tiny_qwen2()
    checkpoint: str | None = None


@dataclasses.dataclass(frozen=True)
class SeroConfig:
    """SERO's auxiliary oracle branch on top of any credit method (METHODS.md "SERO"; papers/SERO.txt).

    Each update picks at most one root per group with a failure (:mod:`agentjax.rollout.oracle`), runs the env's
    oracle from it in isolated env slots, scores the oracle steps with the behaviour policy and adds
    ``coef · L_O`` to the base loss (:mod:`agentjax.train.sero`). Oracle data never enters the base method's
    rewards, advantages, statistics or importance ratios.

    Attributes:
      coef: λ_O (§5.3: 0.1; the sweep 0.05-1.0).
      scheme: the weights of the oracle steps: ``"sero"`` (reachability), or the ablations ``"root_only"``,
        ``"full_flat"``, ``"depth_decay"``, ``"shuffled"``, ``"short_bridge"`` (§5.3, §A.7, §F;
        :func:`agentjax.credit.sero.branch_weights`).
      gamma: depth-decay factor (not given in the paper). k: short-bridge length (§A.7: 1 and 3).
      match_mass: rescale every scheme to SERO's supervision mass per branch (the fixed-bank control, §F.2).
      roots: ``"uniform"`` (the paper: a failed rollout, then a pre-action turn, both uniformly) or
        ``"prioritised"`` (§G's suggested extension; our choice of priority: the failed rollout uniformly, then a
        turn with probability ∝ (1 − π_old(its action))^priority_power + 1e-3, the turns where the behaviour
        policy was least sure of what it did).
      soft_gate: the graded gate ``clip(Δ / gate_scale, 0, 1)`` instead of ``1[Δ > 0]`` (§4.4 with graded
        returns, e.g. WebShop's score). gate_scale: the reward normalisation scale (binary success: 1).
      gate_on: the returns the gate compares: ``"success"`` (binary task success, the paper's ALFWorld and WebShop
        strict-success gate) or ``"reward"`` (the env's own reward summed from the root on).
      max_oracle_steps: a cap on oracle steps per branch (None: the remaining budget H − t, §4.2).
      oracle_timeout: seconds each call of the env's oracle may take (one call asks every live branch for its next
        action); a worker past it is killed and restarted, its branches end ``timeout`` (invalid, counted in
        ``sero/ended_timeout``, never trained on). Not in the paper: it bounds a planner oracle's search (ALFWorld's
        is blind, with no time limit: 22 ms at the median, 20-65 s from some first states); restores and env steps
        stay unbounded. Needs env workers (``RunConfig.workers`` >= 1). None: unbounded.
      micro_batch_size: oracle rows per micro-batch of the auxiliary loss (None: the update's).
      capacity: oracle rows per update (None: num_groups · max_steps rounded up to whole micro-batches).
      bank: a fixed oracle bank (``.npz`` written by :func:`agentjax.train.sero.save_bank`) replayed instead of
        fresh branches (§A.1, §F.2); ``bank_branches`` drawn from it per update (None: num_groups).
    """

    coef: float = 0.1
    scheme: Literal["sero", "root_only", "full_flat", "depth_decay", "shuffled", "short_bridge"] = "sero"
    gamma: float = 0.9
    k: int = 1
    match_mass: bool = False
    roots: Literal["uniform", "prioritised"] = "uniform"
    priority_power: float = 1.0
    soft_gate: bool = False
    gate_scale: float = 1.0
    gate_on: Literal["success", "reward"] = "success"
    max_oracle_steps: int | None = None
    oracle_timeout: float | None = None
    micro_batch_size: int | None = None
    capacity: int | None = None
    bank: str | None = None
    bank_branches: int | None = None

    def __post_init__(self):
        _positive(self, "coef", "k", "gate_scale", "priority_power")
        _unit(self, "gamma")
        _one_of(self, "scheme", SCHEMES)
        _one_of(self, "roots", ("uniform", "prioritised"))
        _one_of(self, "gate_on", ("success", "reward"))
        for name in ("max_oracle_steps", "oracle_timeout", "micro_batch_size", "capacity", "bank_branches"):
            if getattr(self, name) is not None:
                _positive(self, name)


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Everything one update needs; the trainer loop adds its schedule on top.

    Attributes:
      micro_batch_size: rows per micro-batch; the batch (``rollout.rows``) must be a multiple. One call of
        ``update`` is one optimizer step over the whole batch, its gradient accumulated over micro-batches.
      mini_batches: optimizer steps per epoch of an update, each on ``rows / mini_batches`` rows (verl's
        ``ppo_mini_batch_size = rows / mini_batches``; 1: one step on the whole batch).
      epochs: passes over the batch per update (verl's ``ppo_epochs``), each in a fresh row order.
      max_nonfinite_updates: a run stops (``NonFiniteUpdateError``) once more optimizer steps than this have been
        skipped for a NaN/Inf loss or gradient.
      seed: PRNG seed of the run (initial state, sampling keys).
      sero: SERO's auxiliary oracle branch (:class:`SeroConfig`; None: off).
      compact_rows: before each update, cut the batch's prompt padding and decode the real rows' shared prompt
        prefix once (:func:`agentjax.train.update.compact_rows`; the same numbers up to float rounding, a compiled
        update per prompt width and prefix length). None: on a CPU backend with an unsharded model only.
    """

    model: ModelConfig = ModelConfig()
    rollout: RolloutConfig = RolloutConfig()
    credit: CreditConfig = GRPOCredit()
    loss: LossConfig = LossConfig()
    optimizer: OptimizerConfig = OptimizerConfig()
    micro_batch_size: int = 8
    mini_batches: int = 1
    epochs: int = 1
    max_nonfinite_updates: int = 3
    seed: int = 0
    compact_rows: bool | None = None
    sero: SeroConfig | None = None

    def __post_init__(self):
        _positive(self, "micro_batch_size", "mini_batches", "epochs")
        _non_negative(self, "max_nonfinite_updates")
        if not isinstance(self.credit, CreditConfig.__args__):
            raise ValueError(f"TrainConfig.credit must be one of {[c.__name__ for c in CreditConfig.__args__]}, "
                             f"got {type(self.credit).__name__}")
        if self.rollout.rows % self.micro_batch_size:
            raise ValueError(f"TrainConfig: the batch of {self.rollout.rows} rows does not split into micro-batches "
                             f"of {self.micro_batch_size}; choose a micro_batch_size that divides it")
        if self.rollout.rows % (self.mini_batches * self.micro_batch_size):
            raise ValueError(f"TrainConfig: the batch of {self.rollout.rows} rows does not split into "
                             f"{self.mini_batches} mini-batches of whole micro-batches of {self.micro_batch_size} "
                             "rows; choose mini_batches and micro_batch_size whose product divides it")
        if isinstance(self.credit, RAOCredit):
            self._check_rao()
        if self.sero is not None and self.oracle_rows % self.oracle_micro_batch_size:
            raise ValueError(f"TrainConfig: the oracle batch of {self.oracle_rows} rows (sero.capacity) does not split "
                             f"into micro-batches of {self.oracle_micro_batch_size} (sero.micro_batch_size); choose "
                             "sizes where one divides the other")

    def _check_rao(self) -> None:
        """RAO trains CISPO (token mean, no KL, no entropy bonus) with one optimizer step per batch (released:
        ``ppo_n_minibatches: 1``), on its own trees (no SERO branch)."""
        loss = self.loss
        if loss.kl_coef or loss.entropy_coef:
            raise ValueError(f"RAO trains CISPO without KL or entropy terms: set loss.kl_coef=0 and "
                             f"loss.entropy_coef=0 (got {loss.kl_coef}, {loss.entropy_coef})")
        if loss.aggregation != "token-mean":
            raise ValueError(f"RAO's CISPO is a token mean: set loss.aggregation='token-mean', got "
                             f"{loss.aggregation!r}")
        if self.mini_batches != 1 or self.epochs != 1:
            raise ValueError(f"RAO takes one optimizer step per batch: set mini_batches=1 and epochs=1 (got "
                             f"{self.mini_batches}, {self.epochs})")
        if self.sero is not None:
            raise ValueError("SERO's oracle branch is for the flat methods; RAO trains on trees (drop --sero)")

    @property
    def is_tree(self) -> bool:
        """The method trains on recursive trees (:mod:`agentjax.train.trees`)."""
        return isinstance(self.credit, RAOCredit)

    @property
    def oracle_rows(self) -> int:
        """Rows of SERO's oracle batch (``sero.capacity`` or one per step of every group's full budget)."""
        if self.sero is None:
            return 0
        if self.sero.capacity:
            return self.sero.capacity
        rows, micro = self.rollout.num_groups * self.rollout.max_steps, self.oracle_micro_batch_size
        return -(-rows // micro) * micro  # every step of every group's full budget, in whole micro-batches

    @property
    def oracle_micro_batch_size(self) -> int:
        if self.sero is None or self.sero.micro_batch_size is None:
            return self.micro_batch_size
        return self.sero.micro_batch_size

    @property
    def is_ppo(self) -> bool:
        return isinstance(self.credit, PPOCredit)

    def replace(self, **changes: Any) -> TrainConfig:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready nested dict (the credit block carries its ``method`` name)."""
        out = dataclasses.asdict(self)
        out["credit"] = {"method": self.credit.method} | out["credit"]
        return out

    @classmethod
    def tiny(cls, credit: CreditConfig | None = None, **kw: Any) -> TrainConfig:
        """A CPU test size: tiny Qwen2 (vocab 512), 2 groups × 4 rollouts × 4 steps (40 rows), 16 + 16 tokens a row."""
        return cls(**(dict(
            model=ModelConfig(QwenConfig.tiny_qwen2()),
            rollout=RolloutConfig(num_groups=2, group_size=4, max_steps=4, prompt_len=16, response_len=16,
                                  capacity=40),
            credit=credit or GRPOCredit(),
            loss=LossConfig(logprob_chunk=16, logprob_remat=False),
            optimizer=OptimizerConfig(learning_rate=1e-3),
            micro_batch_size=8,
        ) | kw))
