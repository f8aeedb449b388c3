"""Credit kernels: one rollout group in, per-step advantages (or weights, gates, rewards) out.

Every kernel is a pure function over one group (``GroupView`` with ``[R, T]`` fields, or a SERO branch / SERA
root task), and its ``batched_*`` form is ``jax.vmap``-ped over groups and jit-compiled. NumPy references with
explicit loops live in :mod:`agentjax.credit.reference` (tests and benchmarks only).

The per-group kernels ``gigpo``, ``hgpo`` and ``graphgpo`` share their module's name and are not re-exported
here (it would shadow the module); import them from the module.
"""

from agentjax.credit.crbc import CRBCOutput, batched_coverage, batched_crbc, crbc_advantages
from agentjax.credit.crbc_process import (
    EmpiricalProcess,
    build_process,
    closure_values,
    coverage,
    finite_depth_values,
    visit_local_values,
)
from agentjax.credit.gigpo import batched_gigpo, discounted_returns, episode_advantage
from agentjax.credit.graphgpo import batched_graphgpo, graph_returns, success_distances
from agentjax.credit.hgpo import batched_hgpo
from agentjax.credit.sera import (
    LeafCoverage,
    RankingReward,
    execution_reward,
    leaf_coverage,
    node_depth,
    ranking_reward,
    rubric_weighted_score,
    subtree_leaf_counts,
)
from agentjax.credit.sera_baselines import (
    depth_weights,
    execution_advantage,
    loo_advantage,
    nonconstant,
    tree_loo_advantage,
)
from agentjax.credit.sera_stages import (
    StageCredit,
    batched_node_depth,
    decomposition_credit,
    execution_credit,
    rubric_credit,
)
from agentjax.credit.sero import (
    SCHEMES,
    SeroCredit,
    batched_branch_weights,
    batched_sero_credit,
    branch_weights,
    compatibility,
    improvement_gate,
    reachability_weights,
    sero_branch_credit,
)
from agentjax.credit.trajectory import (
    batched_gae,
    batched_grpo,
    batched_rloo,
    episode_score,
    gae_advantages,
    grpo_advantages,
    rloo_advantages,
)

__all__ = [
    "SCHEMES",
    "CRBCOutput",
    "EmpiricalProcess",
    "LeafCoverage",
    "RankingReward",
    "SeroCredit",
    "StageCredit",
    "batched_branch_weights",
    "batched_coverage",
    "batched_crbc",
    "batched_gae",
    "batched_gigpo",
    "batched_graphgpo",
    "batched_grpo",
    "batched_hgpo",
    "batched_node_depth",
    "batched_rloo",
    "batched_sero_credit",
    "branch_weights",
    "build_process",
    "closure_values",
    "compatibility",
    "coverage",
    "crbc_advantages",
    "decomposition_credit",
    "depth_weights",
    "discounted_returns",
    "episode_advantage",
    "episode_score",
    "execution_advantage",
    "execution_credit",
    "execution_reward",
    "finite_depth_values",
    "gae_advantages",
    "graph_returns",
    "grpo_advantages",
    "improvement_gate",
    "leaf_coverage",
    "loo_advantage",
    "node_depth",
    "nonconstant",
    "ranking_reward",
    "reachability_weights",
    "rloo_advantages",
    "rubric_credit",
    "rubric_weighted_score",
    "sero_branch_credit",
    "subtree_leaf_counts",
    "success_distances",
    "tree_loo_advantage",
    "visit_local_values",
]
