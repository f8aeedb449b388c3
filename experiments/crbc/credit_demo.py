"""Every credit estimator on one synthetic rollout batch, as a table (no training: the kernels alone).

The batch is the paper's shape (16 groups × 8 rollouts × 50 steps) from
`agentjax.rollout.synthetic.synthetic_batch`, whose anchors repeat the way ALFWorld's do. For each method the
table shows how much of the signal varies *within* a rollout (step-level credit; GRPO/RLOO have none), how
often a step is in an anchor comparison, the correlation of the advantage with the rollout's success, and the
jitted time per batch. CRBC's coverage diagnostic follows (papers/CRBC.txt §D.2).
"""

from __future__ import annotations

import functools
import time

import jax
import numpy as np
from rich.console import Console
from rich.table import Table

from agentjax.credit import (
    batched_coverage,
    batched_crbc,
    batched_gigpo,
    batched_graphgpo,
    batched_grpo,
    batched_hgpo,
    batched_rloo,
)
from agentjax.rollout import to_groups
from agentjax.rollout.synthetic import synthetic_batch

G, R, T = 16, 8, 50


def timed(fn, view):
    jax.block_until_ready(fn(view))
    times = []
    for _ in range(10):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(view))
        times.append(time.perf_counter() - t0)
    return float(np.median(times)) * 1e3


def main():
    batch = synthetic_batch(0, G, R, T)
    view = to_groups(batch, num_groups=G, num_rollouts=R, max_steps=T)
    mask = np.asarray(view.mask)
    success = np.broadcast_to(np.asarray(view.success)[..., None], mask.shape)
    console = Console(width=120)
    console.print(f"synthetic batch: {G} groups x {R} rollouts x {T} steps, {mask.sum()} turns, "
                  f"success rate {float(view.success.mean()):.2f}, mean length {float(view.length.mean()):.1f}")
    methods = {
        "GRPO": batched_grpo,
        "RLOO": batched_rloo,
        "GiGPO (mean_std_norm)": batched_gigpo,
        "GiGPO (mean_norm)": functools.partial(batched_gigpo, mode="mean_norm"),
        "HGPO (K=2)": batched_hgpo,
        "GraphGPO": batched_graphgpo,
        "CRBC (K=0)": lambda v: batched_crbc(v, depth=0).advantage,
        "CRBC (K=3)": lambda v: batched_crbc(v, depth=3).advantage,
        "CRBC (K=inf)": lambda v: batched_crbc(v).advantage,
    }
    table = Table(title="credit estimators on one synthetic batch")
    for col in ("method", "mean |A|", "within-rollout std", "corr(A, success)", "ms / batch"):
        table.add_column(col, justify="left" if col == "method" else "right")
    for name, fn in methods.items():
        adv = np.asarray(fn(view))
        within = np.nanmean([adv[g, r, mask[g, r]].std() for g in range(G) for r in range(R) if mask[g, r].any()])
        corr = np.corrcoef(adv[mask], success[mask])[0, 1]
        table.add_row(name, f"{np.abs(adv[mask]).mean():.3f}", f"{within:.3f}", f"{corr:+.3f}",
                      f"{timed(fn, view):.2f}")
    console.print(table)

    out = batched_crbc(view)
    eligible = np.asarray(out.eligible)
    cov = Table(title="CRBC coverage: share of eligible visits whose value draws on all rollouts of the group")
    for col in ("closure depth K", "all R rollouts", "mean rollouts"):
        cov.add_column(col, justify="right")
    for depth in (0, 1, 3, None):
        counts, _ = batched_coverage(view, depth=depth)
        counts = np.asarray(counts)[eligible]
        cov.add_row("inf" if depth is None else str(depth), f"{(counts == R).mean():.1%}", f"{counts.mean():.2f}")
    console.print(f"eligible visits (anchor with >= 2 observed actions): {eligible[mask].mean():.1%}")
    console.print(cov)


if __name__ == "__main__":
    main()
