"""``make demo``: GRPO, GiGPO and CRBC on the credit testbed's S2 from random init, 3 seeds, in a few minutes.

::

    python experiments/credit_testbed/demo.py            # make demo
    python experiments/credit_testbed/demo.py --jobs 1   # one run at a time

Nine runs (:data:`ARMS` × :data:`SEEDS`) of the comparison's S2 config (:func:`experiments.credit_testbed.presets.
arm_run`, the same MDPs and initial policy per seed), shortened to :data:`UPDATES` updates with the exact
evaluation every :data:`EVAL_EVERY`, and without the final sampled check; into ``runs/demo/`` (git-ignored; a
second ``make demo`` reports the finished runs without training them again). A line per evaluation as the runs
write them, then the table: each arm's exact success before the first update and after the last, the gain ± SE
over seeds with its z (gain / SE; the demo says which arm, if any, rose by less than :data:`MIN_Z` SE), the paired
difference to GRPO, and the batch's credit accuracy; the curves in ``runs/demo/s2_curves.png``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from agentjax.train.runconfig import RunConfig  # noqa: E402
from experiments.credit_testbed.presets import METHODS, RUNS, arm_run  # noqa: E402
from experiments.credit_testbed.presets import SEEDS as COMPARISON_SEEDS  # noqa: E402
from experiments.credit_testbed.presets import UPDATES as COMPARISON_UPDATES  # noqa: E402
from experiments.credit_testbed.run import compile_cache, run_all, trained  # noqa: E402

SETTING = "s2"
ARMS = ("grpo", "gigpo", "crbc")
SEEDS = (0, 1, 2)
UPDATES = 40
EVAL_EVERY = 10
MIN_Z = 3.0  # every arm must rise from its start by this many standard errors


def demo_runs(runs: str = RUNS) -> dict[tuple[str, str, int], RunConfig]:
    folder = os.path.join(runs, "demo")
    return {(SETTING, arm, seed): arm_run(SETTING, arm, seed, runs=folder, updates=UPDATES, eval_every=EVAL_EVERY)
            for seed in SEEDS for arm in ARMS}


@contextmanager
def progress(runs: Mapping[tuple[str, str, int], RunConfig], every: float = 1.0) -> Iterator[None]:
    """A line per evaluation of every run as its loop writes it to ``metrics.jsonl`` (polled from a thread)."""
    seen = {k: 0 for k in runs}
    stop = threading.Event()

    def poll() -> None:
        for key, run in runs.items():
            path = os.path.join(run.out_dir, "metrics.jsonl")
            if not os.path.exists(path):
                continue
            with open(path) as f:
                lines = [x for x in f.read().splitlines() if x.strip()]
            for text in lines[seen[key]:]:
                try:
                    line = json.loads(text)
                except json.JSONDecodeError:  # being written: next time
                    break
                seen[key] += 1
                if "exact/success" in line:
                    credit = (f", the batch's credit Pearson {line['credit/pearson']:+.2f}"
                              if "credit/pearson" in line else "")
                    print(f"  {key[1]:>5} seed {key[2]}: update {int(line['step']):>2}/{run.updates}, exact success "
                          f"{line['exact/success']:.3f}{credit}", flush=True)

    def watch() -> None:
        while not stop.wait(every):
            poll()

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        poll()


def verdict(table: Mapping[str, dict]) -> list[str]:
    """Whether every arm rose by at least :data:`MIN_Z` standard errors over seeds."""
    lines = []
    for label, r in table.items():
        gain = r["gain"]
        z = gain["mean"] / gain["se"] if gain["se"] > 0 else float("inf")
        lines.append(f"{label}: exact success {r['initial']['mean']:.3f} -> {r['final']['mean']:.3f}, gain "
                     f"{gain['mean']:+.3f} ± {gain['se']:.3f} ({z:.1f} SE) " +
                     ("rose beyond 3 SE" if z >= MIN_Z else f"did NOT rise by {MIN_Z:g} SE on this CPU"))
    return lines


def outcome(table: Mapping[str, dict]) -> str:
    """What these runs showed, in numbers: each method's paired difference to GRPO and the most accurate credit."""
    def ms(x: Mapping[str, float]) -> str:
        return f"{x['mean']:+.3f} ± {x['se']:.3f}" + (" (within noise)" if abs(x["mean"]) < 2 * x["se"] else "")

    versus = [f"{label} {ms(r['vs_grpo']['final'])}" for label, r in table.items() if "vs_grpo" in r]
    best = max(table, key=lambda label: table[label]["pearson"]["mean"])
    credit = ", ".join(f"{label} {r['pearson']['mean']:+.2f}" for label, r in table.items())
    return (f"In these runs the final exact success minus GRPO's on the same seed was: {'; '.join(versus)}. The most "
            f"accurate credit (Pearson with the exact advantage, averaged over the evaluations) was {best}'s "
            f"({credit}). ")


def explain(runs: Mapping[tuple[str, str, int], RunConfig], folder: str, table: Mapping[str, dict]) -> str:
    some = next(iter(runs.values()))
    ro = some.train.rollout
    return (
        f"What you saw: {len(ARMS)} credit methods ({', '.join(ARMS)}) each trained a 2-layer, d = 64 policy from "
        f"random init on the credit testbed's S2 (small text MDPs with slips and converging paths, whose model is "
        f"known), {len(SEEDS)} seeds each (a seed is its own 4 MDPs and initial policy, the same for every method), "
        f"{some.updates} updates of {ro.num_groups} MDPs x {ro.group_size} rollouts. Because the model is known, "
        "success is computed exactly from the policy's action probabilities (no sampling noise), and the credit "
        "accuracy is the correlation (and sign agreement) of each method's per-step advantage on the training batch "
        "with the exact advantage A^pi of the policy that collected it: GRPO gives every step of an episode the same "
        "credit, GiGPO adds a step term within groups of identical states, CRBC closes a Bellman system over the "
        "group's states. ± is the standard error over seeds; 'paired' compares methods on the same seed. "
        + outcome(table) +
        f"Files: {os.path.join(folder, 's2_results.md')}, the curves {os.path.join(folder, 's2_curves.png')}, each "
        f"run's metrics.jsonl under {folder}/s2/<method>/seed<k>/. The full comparison ({len(METHODS)} methods on "
        f"S1 and S2, SERO on S3, {len(COMPARISON_SEEDS)} seeds, {COMPARISON_UPDATES} updates, a sampled check at the "
        "end; about 2 hours on an idle 2-core CPU) and its tables: python experiments/credit_testbed/run.py --jobs 2 "
        "(experiments/credit_testbed/README.md).")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=2, help="runs at a time (separate processes)")
    parser.add_argument("--report-only", action="store_true", help="the report of the runs already there")
    parser.add_argument("--runs", default=RUNS, help="folder of the run folders (the demo's go to <runs>/demo)")
    args = parser.parse_args(argv)
    compile_cache(args.runs)
    runs = demo_runs(args.runs)
    folder = os.path.join(args.runs, "demo")
    start = time.perf_counter()
    if args.report_only:
        pass
    elif all(trained(r) for r in runs.values()):
        print(f"make demo: already trained in {folder} (delete it to train anew): its report", flush=True)
    else:
        print(f"make demo: {len(ARMS)} methods x {len(SEEDS)} seeds on the credit testbed's S2 from random init, "
              f"{UPDATES} updates each, in {args.jobs} processes; the first runs compile (a minute or two), later ones "
              "reuse the compiled programs. A line per evaluation:", flush=True)
        with progress(runs):
            run_all(runs, args.jobs, check=False, even=True)
    from experiments.credit_testbed.report import report

    table = report({k[1:]: r for k, r in runs.items()}, SETTING, folder, command="python "
                   "experiments/credit_testbed/demo.py")
    print("\n".join(verdict(table)))
    print(f"\n{explain(runs, folder, table)}\n(took {(time.perf_counter() - start) / 60:.1f} min)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
