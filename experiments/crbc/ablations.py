"""The paper's CRBC ablations, run through the experiment driver: closure depth K ∈ {0, 1, 2, 3, ∞},
step weight w_S ∈ {1, 5, 10}, β ∈ {0.95, 0.98, 0.99, 1.0}, group size G ∈ {4, 8, 16} (one factor at a time
around the base run; :func:`experiments.crbc.presets.ablation_runs`).

::

    python experiments/crbc/ablations.py --dry-run                 # list the tiny preset's ablation runs
    python experiments/crbc/ablations.py --seeds 0 1 2 --jobs 2    # run them, then the table
    python experiments/crbc/ablations.py --preset paper-1.5b --env alfworld --dry-run

Results: ``results/ablations_<preset>_results.md`` / ``.json`` and ``_curves.png`` (the same report as run.py).
"""

from __future__ import annotations

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from experiments.crbc.presets import RESULTS, ablation_runs, base_run  # noqa: E402
from experiments.crbc.run import report, run_all  # noqa: E402


def runs_for(preset: str, env: str, seeds: list[int], updates: int | None = None) -> dict:
    base = base_run(preset, env)
    if updates:
        base = base.replace(updates=updates)
    return {(name, seed): run for seed in seeds for name, run in ablation_runs(base, seed).items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="CRBC ablations (K, w_S, beta, G)")
    parser.add_argument("--preset", default="tiny", choices=("tiny", "paper-1.5b", "paper-7b"))
    parser.add_argument("--env", default="sokoban", choices=("sokoban", "alfworld", "webshop"))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--updates", type=int)
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--dry-run", action="store_true", help="list the runs with what each one changes")
    args = parser.parse_args(argv)
    if args.preset == "tiny" and args.env != "sokoban":
        parser.error("the tiny preset is Sokoban only")
    runs = runs_for(args.preset, args.env, args.seeds, args.updates)
    if args.dry_run:
        for (name, seed), run in runs.items():
            c, ro = run.train.credit, run.train.rollout
            print(f"{name:>10} seed {seed}: K={'inf' if c.depth is None else c.depth} w_S={c.w_step:g} "
                  f"beta={c.beta:g} G={ro.group_size} rows={ro.rows} micro={run.train.micro_batch_size} "
                  f"updates={run.updates} -> {run.out_dir}")
        print(f"{len(runs)} runs")
        return 0
    run_all(runs, args.jobs)
    report(runs, RESULTS, f"ablations_{args.preset}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
