"""Does the SERA grader read the child? The grader probe (agentjax/train/grader_probe.py) of each SERA arm's warm
start and last checkpoints, on held-out children with known, mixed outcomes -> results/<name>_grader.md.

    python experiments/sera/grader.py                 # TextCraft-Synth: SERA's warm start, its runs' checkpoints
    python experiments/sera/grader.py --sync --methods sera sera_fg   # TextWorld-Sync
    python experiments/sera/grader.py --sync --methods sera_gwrs --no-checkpoints --build   # warm starts, no RL

A policy whose grades ignore the child reaches a balanced accuracy of 0.5 (its pass rate on the verifier's
successes equals its pass rate on the failures) and an AUC of 0.5, whatever its agreement: a grader that passes
everything agrees with the verifier on the share of successes. Before RL is worth its hours, SERA's execution
reward needs a grader above that line.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

from agentjax.models import load_tokenizer  # noqa: E402
from experiments.sera.presets import RESULTS, SEEDS, sync_run, tiny_run  # noqa: E402

COLUMNS = ("pass_rate", "fail_rate", "balanced_accuracy", "auc", "agreement", "majority")


def policies(run) -> list[tuple[str, str, Callable[[], Any]]]:
    """(label, result file, model loader) of the warm start of ``run`` (built already) and of its run's newest
    checkpoint, where they exist."""
    from agentjax.models import load_hf
    from agentjax.train.checkpoint import Checkpointer
    from agentjax.train.loop import CHECKPOINTS, restore_model
    from agentjax.train.warmstart import cache_folder

    out = []
    warm = cache_folder(run)
    if os.path.isfile(os.path.join(warm, "warmstart.json")):
        out.append((f"warm start `{os.path.basename(warm)[:12]}`", os.path.join(warm, f"grader_probe_{run.env}.json"),
                    lambda: load_hf(warm, config=run.train.model.arch)))
    if os.path.isdir(os.path.join(run.out_dir, CHECKPOINTS)):
        with Checkpointer(os.path.join(run.out_dir, CHECKPOINTS)) as ckpt:
            steps = ckpt.steps()
        if steps:
            out.append((f"seed {run.train.seed}, last checkpoint ({steps[-1]})",
                        os.path.join(run.out_dir, f"grader_probe_{steps[-1]}.json"),
                        lambda: restore_model(run, run.out_dir, steps[-1], load_tokenizer(run.tokenizer))[0]))
    return out


def probe(run, path: str, load: Callable[[], Any], tasks: int) -> dict:
    """The grader probe, its late-finish check (``late_finish/...``) and the planner fit (``fit/...``) of the policy
    ``load()`` returns, cached in ``path`` (a result made with ``tasks`` tasks; a cached probe without the check or
    the fit gets them added)."""
    import jax

    from agentjax.models import Sampler
    from agentjax.train.grader_probe import LATE_TREES, grader_agreement, late_finish, planner_fit, probe_trees

    result: dict = {}  # (a cached probe whose fit lacks the depth split gets the fit again)
    if os.path.isfile(path):
        with open(path) as f:
            result = json.load(f)
        if (result.get("tasks") != tasks or result.get("trees", ["planner", "early_finish"]) != probe_trees(run)
                or "early_finish/failures" not in result):
            result = {}  # made with other tasks or trees (before the stalled tree)
    missing = [tree for tree in LATE_TREES if f"{tree}/failures" not in result]  # late checks a cache lacks
    if result and "fit/root/p_finish" in result and not missing:
        return result
    model, tokenizer = load(), load_tokenizer(run.tokenizer)
    if not result:  # a fresh probe, the late checks included
        t0 = time.perf_counter()
        result, missing = grader_agreement(run, model, tokenizer, tasks=tasks), []
        result["seconds"] = time.perf_counter() - t0
    if missing:  # with grader_agreement's key
        held_out = run.spec.tasks(run.evaluation_split)[:tasks]
        result |= late_finish(run, Sampler(model, tokenizer), tokenizer, held_out, jax.random.key(0),
                              (result["pass_rate"], result["pass_rate_se"]), trees=missing)
    if "fit/root/p_finish" not in result:
        result |= {f"fit/{k}": v for k, v in planner_fit(run, model, tokenizer, tasks=tasks).items()}
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    return result


def table(rows: list[tuple[str, str, dict]], command: str, env: str, tasks: int) -> str:
    trees = ("a planner, an early-finish and a stalled tree" if env == "TextWorld-Sync"  # where unfinished
             else "a planner and an early-finish tree")  # children are graded (grader_probe.probe_trees)
    head = (f"# SERA's grader on held-out children ({env}, the eval split's first {tasks} tasks x {trees}; "
            "late- and busy-finish trees apart)\n\n"
            f"Made by `{command}`; what is measured: agentjax/train/grader_probe.py. Balanced accuracy and AUC are "
            "0.5 for a grader that ignores the child; \"majority\" is what a constant grader's agreement reaches. The "
            "last three columns are the acting policy on the same tasks' planner trees (`grader_probe.planner_fit`): "
            "the mean probability of the planner's reply to each turn (all turns; act turns), the rate at which "
            "temperature-1 sampling reproduces it; then the probability of the finish reply at the turns where the "
            "planner went on, at the root and in the children (a policy that stops early puts its mass there). The "
            "late-finish columns grade two more trees apart (`grader_probe.late_finish`): children that idle, or "
            "act on their goal in ways the world rejects (busy), then finish at turn 7, failures that stop as late as "
            "the planner's children; each balanced accuracy is that fail rate's mean with the pass rate on successes "
            "(0.5 for a grader that passes whatever finishes late).\n\n"
            "| method | policy | children (successes) | pass rate on successes | fail rate on failures | "
            "fail rate: early finish / stalled | balanced accuracy | AUC | late finish, idle: fail rate | "
            "balanced accuracy | late finish, busy: fail rate | balanced accuracy | agreement | majority | "
            "rubric / grade parse failures | "
            "planner turns: π(planner's reply) | act turns | π(finish) where the planner went on: root / children |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
    lines = []
    for method, label, r in rows:
        lines.append(f"| {method} | {label} | {int(r['children'])} ({int(r['successes'])}) | "
                     f"{r['pass_rate']:.2f} ± {r['pass_rate_se']:.2f} | "
                     f"{r['fail_rate']:.2f} ± {r['fail_rate_se']:.2f} | {_by_tree(r)} | "
                     f"{r['balanced_accuracy']:.3f} ± {r['balanced_accuracy_se']:.3f} | {r['auc']:.3f} | "
                     f"{_late(r, 'late_finish')} | {_late(r, 'busy_finish')} | "
                     f"{r['agreement']:.3f} | {r['majority']:.3f} | {int(r.get('rubric/failures', 0))} / "
                     f"{int(r.get('grade/failures', 0))} | {r['fit/all/p_reply']:.3f} ({int(r['fit/all/turns'])}) | "
                     f"{r['fit/act/p_reply']:.3f} ({int(r['fit/act/turns'])}) | {r['fit/root/p_finish']:.3f} / "
                     f"{r['fit/child/p_finish']:.3f} |")
    return head + "\n".join(lines) + "\n"


def _by_tree(r: dict) -> str:
    def one(tree: str) -> str:
        n = int(r.get(f"{tree}/failures", 0))
        return f"{r[f'{tree}/fail_rate']:.2f} ({n})" if n else "—"

    return f"{one('early_finish')} / {one('stall')}"


def _late(r: dict, tree: str) -> str:
    n = int(r[f"{tree}/failures"])
    if not n:
        return "— (0) | —"
    return (f"{r[f'{tree}/fail_rate']:.2f} ± {r[f'{tree}/fail_rate_se']:.2f} ({n}) | "
            f"{r[f'{tree}/balanced_accuracy']:.3f} ± {r[f'{tree}/balanced_accuracy_se']:.3f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--methods", nargs="+", default=["sera"], help="SERA arms (default: sera)")
    parser.add_argument("--seeds", nargs="+", type=int, default=list(SEEDS), help="runs whose last checkpoint to probe")
    parser.add_argument("--sync", action="store_true", help="the TextWorld-Sync runs")
    parser.add_argument("--tasks", type=int, default=16, help="held-out tasks (a teacher tree per kind of child each)")
    parser.add_argument("--results", default=RESULTS)
    parser.add_argument("--no-checkpoints", action="store_true", help="the warm starts only")
    parser.add_argument("--build", action="store_true", help="build the warm starts not cached yet (no RL)")
    args = parser.parse_args(argv)
    os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(args.results, "runs", ".jax-cache"))
    rows, seen = [], set()
    for method in args.methods:
        for seed in args.seeds:
            run = (sync_run(seed, method=method, results=args.results) if args.sync
                   else tiny_run(method, seed, results=args.results))
            if args.build:
                from agentjax.train.warmstart import warm_start_folder

                warm_start_folder(run, load_tokenizer(run.tokenizer))
            for label, path, load in policies(run):
                if path in seen or (args.no_checkpoints and "warm start" not in label):
                    continue
                seen.add(path)
                r = probe(run, path, load, args.tasks)
                rows.append((method, label, r))
                print(f"{method} {label}: balanced accuracy {r['balanced_accuracy']:.3f} ± "
                      f"{r['balanced_accuracy_se']:.3f}, AUC {r['auc']:.3f} ({r['seconds']:.0f} s)", flush=True)
    if not rows:
        print(f"no warm start or checkpoint of {args.methods} under {args.results}/runs: run experiments/sera/run.py "
              "first")
        return 1
    name = "sync" if args.sync else "tiny"
    command = "python experiments/sera/grader.py " + " ".join(argv if argv is not None else sys.argv[1:])
    path = os.path.join(args.results, f"{name}_grader.md")
    with open(path, "w") as f:
        f.write(table(rows, command.strip(), "TextWorld-Sync" if args.sync else "TextCraft-Synth", args.tasks))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
