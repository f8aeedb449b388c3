"""The SERA tiny experiments: RAO (recursive trees) vs flat GRPO and the SERA arms on TextCraft-Synth; the tree arms
on TextWorld-Sync.

::

    python experiments/sera/run.py                       # RAO and GRPO, seeds 0-2 (presets.py: what is matched)
    python experiments/sera/run.py --methods rao --seeds 0
    python experiments/sera/run.py --sync                 # TextWorld-Sync: tiny RAO run, seed 0 (shared world)
    python experiments/sera/run.py --sync --methods rao sera --seeds 0 1 2   # ... RAO and SERA, 3 seeds
    python experiments/sera/run.py --smoke                # 2 updates from a tiny warm start: the pipeline
    python experiments/sera/run.py --report-only          # rebuild the tables from the runs' files
    python experiments/sera/run.py --methods sera --search 2   # + rubric-guided search on the last checkpoints
    python experiments/sera/run.py --methods sera_exec sera_wo_d --name arms   # a subset: results/arms_results.md

The report reads only the runs' files (``metrics.jsonl``, ``eval/<step>.json``): ``results/tiny_results.md`` /
``.json`` / ``tiny_curves.png`` (eval success ± SE over training seeds, gains paired episode by episode, RAO's paired
difference to GRPO; :mod:`experiments.crbc.report`; below the table, what each run started from:
:func:`starts_section`), ``results/tiny_shape.md`` (what the agents did per batch: turns, nodes, delegation, invalid
replies, child label rate, grade agreement), ``results/<name>_grades.md`` (the policy's grades against the verifier:
:func:`grade_table`) and ``results/example_tree.txt`` / ``example_tree_sera.txt``, one tree of the last RAO / SERA
batch as text (``agentjax trees --run <run dir>`` prints any saved tree).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from agentjax.train.metrics import read_metrics  # noqa: E402
from agentjax.train.runconfig import RunConfig  # noqa: E402
from experiments.crbc.report import eval_outcomes, write_report  # noqa: E402
from experiments.crbc.run import compile_cache, run_all  # noqa: E402
from experiments.sera.presets import (  # noqa: E402
    ARMS,
    EVAL_SPLIT,
    METHODS,
    RESULTS,
    SEEDS,
    smoke_run,
    sync_run,
    tiny_run,
)

Runs = dict[tuple[str, int], RunConfig]
# Per-batch shape of what the agents did: (label, tree run's metric, flat run's metric).
SHAPE = (("turns a batch", "tree/turns", "rollout/num_turns"), ("nodes a tree", "tree/nodes", None),
         ("trees that delegate", "tree/delegating_trees", None), ("child label rate", "tree/child_success", None),
         ("invalid replies", "tree/invalid", "rollout/invalid_rate"),
         ("training success", "tree/root_success", "rollout/success_rate"),
         ("grades agreeing with the verifier", "grade/agreement", None))


def shape_table(runs: Runs) -> str:
    """Mean over batches and seeds of :data:`SHAPE` per method (± SE over seeds)."""
    rows = ["| method | " + " | ".join(name for name, _, _ in SHAPE) + " |", "|---" * (len(SHAPE) + 1) + "|"]
    for method in dict.fromkeys(m for m, _ in runs):
        cells = []
        for _, tree_key, flat_key in SHAPE:
            per_seed = []
            for (m, _), run in runs.items():
                path = os.path.join(run.out_dir, "metrics.jsonl")
                if m != method or not os.path.exists(path):
                    continue
                key = tree_key if run.tree is not None else flat_key
                values = [x[key] for x in read_metrics(path) if key is not None and key in x
                          and (key != "grade/agreement" or x.get("grade/requests"))]  # batches that graded
                if values:
                    per_seed.append(float(np.mean(values)))
            cells.append(_mean_se(per_seed))
        rows.append(f"| {method} | " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"


# The cost of each method's supervision over a training run (SERA's Table 2): (label, metric, rows counted) where
# rows counted is "labels" for the batches whose reward reads the verifier's labels (RAO's execution steps, SERA's
# rubric steps; every other label is a diagnostic, e.g. SERA's grade agreement) and "all" for every batch drawn.
COST = (("verifier labels that train", "judge/requests", "labels"), ("verifier labels, all", "judge/requests", "all"),
        ("verifier input tokens", "judge/input_tokens", "all"), ("rubric calls", "rubric/calls", "all"),
        ("rubric input tokens", "rubric/input_tokens", "all"), ("grading calls", "grade/calls", "all"),
        ("grading input tokens", "grade/input_tokens", "all"))


def label_stage(run: RunConfig) -> int | None:
    """The stage whose reward reads the verifier's labels: RAO's execution (0), SERA's rubric ranking (2); None for
    a flat run (its reward is the environment's)."""
    if run.tree is None:
        return None
    return 2 if run.train.credit.method == "sera" else 0


def cost_table(runs: Runs) -> str:
    """Totals over a run of :data:`COST` per method, mean ± SE over seeds (batches skipped by the filter count: their
    labels were paid for)."""
    rows = ["| method | " + " | ".join(name for name, _, _ in COST) + " |", "|---" * (len(COST) + 1) + "|"]
    for method in dict.fromkeys(m for m, _ in runs):
        cells = []
        for _, key, which in COST:
            per_seed = []
            for (m, _), run in runs.items():
                path = os.path.join(run.out_dir, "metrics.jsonl")
                if m != method or not os.path.exists(path) or run.tree is None:
                    continue
                stage = label_stage(run)
                per_seed.append(sum(x.get(key, 0.0) for x in read_metrics(path) if "schedule/stage" in x and (
                    which == "all" or x["schedule/stage"] == stage)))
            cells.append(_mean_se(per_seed, "{:.0f}"))
        rows.append(f"| {method} | " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"


def _mean_se(values: list[float], fmt: str = "{:.3g}") -> str:
    if not values:
        return "—"
    if len(values) == 1:
        return fmt.format(values[0])
    return f"{fmt.format(np.mean(values))} ± {np.std(values, ddof=1) / np.sqrt(len(values)):.2g}"


GRADERS = ("policy", "initial")  # who writes and grades the search's rubrics: the trained checkpoint, the warm start


def search_file(out_dir: str, candidates: int, grader: str) -> str | None:
    """The newest search evaluation :func:`agentjax.train.loop.evaluate_checkpoint` wrote in ``out_dir``
    (``eval_<step>_search<N>[_initial].json``), or None."""
    suffix = f"_search{candidates}{'_initial' if grader == 'initial' else ''}.json"
    steps = [int(name[5:-len(suffix)]) for name in os.listdir(out_dir) if name.startswith("eval_")
             and name.endswith(suffix) and name[5:-len(suffix)].isdigit()] if os.path.isdir(out_dir) else []
    return os.path.join(out_dir, f"eval_{max(steps)}{suffix}") if steps else None


def run_search(runs: Runs, candidates: int) -> None:
    """Evaluate every finished SERA-arm run's last checkpoint with rubric-guided search (``candidates`` per delegated
    child), graded by the checkpoint and by the initial policy; a result already on disk is kept."""
    from agentjax.train.loop import evaluate_checkpoint

    for (method, seed), run in runs.items():
        if run.train.credit.method != "sera" or max(eval_outcomes(run.out_dir), default=0) == 0:
            continue
        for grader in GRADERS:
            if search_file(run.out_dir, candidates, grader) is None:
                print(f"search {candidates} ({grader} grader): {method} seed {seed}", flush=True)
                evaluate_checkpoint(run.out_dir, search=candidates, grader=grader)


def search_table(runs: Runs, candidates: int) -> str:
    """Final eval success without search, with search graded by the checkpoint and by the initial policy, and the
    paired difference (search − none, episode by episode, then mean ± SE over seeds), per SERA arm; and what the
    search could change: how often a later candidate was committed (per grader), and the share of searched children
    whose committed candidate was verified against the share where any candidate was (the trained grader's run);
    then the finished SERA-arm runs that have no search evaluation, by name."""
    unsearched: list[str] = []
    rows = ["| method | seeds | no search | search, trained grader | search, initial grader | trained − none | "
            "initial − none | later candidate committed (trained / initial) | committed verified / any verified |",
            "|---" * 9 + "|"]
    for method in dict.fromkeys(m for m, _ in runs):
        base, by_grader, diff = [], {g: [] for g in GRADERS}, {g: [] for g in GRADERS}
        later, verified = {g: [] for g in GRADERS}, ([], [])
        for (m, seed), run in runs.items():
            outcomes = eval_outcomes(run.out_dir)
            if m != method or run.train.credit.method != "sera" or not outcomes:
                continue
            last = max(outcomes)
            found = {g: search_file(run.out_dir, candidates, g) for g in GRADERS}
            if None in found.values():
                unsearched.append(f"{m} seed {seed}")
                continue
            base.append(float(outcomes[last].mean()))
            for g, path in found.items():
                with open(path) as f:
                    result = json.load(f)
                searched = np.asarray(result["outcomes"], np.float64)
                by_grader[g].append(float(searched.mean()))
                diff[g].append(float((searched - outcomes[last]).mean()))
                if "search/later_won" in result:
                    later[g].append(result["search/later_won"])
                if g == GRADERS[0] and "search/chosen_verified" in result:
                    verified[0].append(result["search/chosen_verified"])
                    verified[1].append(result["search/any_verified"])
        if base:
            share = " / ".join(f"{np.mean(later[g]):.3f}" if later[g] else "—" for g in GRADERS)
            ceiling = f"{np.mean(verified[0]):.3f} / {np.mean(verified[1]):.3f}" if verified[0] else "—"
            cells = [str(len(base)), _mean_se(base), *(_mean_se(by_grader[g]) for g in GRADERS),
                     *(_mean_se(diff[g], "{:+.3f}") for g in GRADERS), share, ceiling]
            rows.append(f"| {method} | " + " | ".join(cells) + " |")
    if unsearched:  # finished runs the search has not evaluated (the command without --report-only runs them)
        rows += ["", f"Not searched (not in the table): {', '.join(unsearched)}."]
    return "\n".join(rows) + "\n"


def grade_table(runs: Runs) -> str | None:
    """How the policy graded the delegated children of the training trees each SERA run saved (``trees/<batch>.json``,
    ``tree.saved_trees`` trees a batch; forks' branches left out), against the verifier's label: the children per
    (label, what the child's rubric reward was), pooled over seeds; then the graded children's pass rates by how
    the child stopped (finished, out of turns, ended with the world; within 3 turns or after) and label: a grader
    that reads the child separates the labels within a row, one keyed on how the child stopped does not. None when
    no run saved a graded child (RAO, or run folders copied without their trees)."""
    from agentjax.train.tree_loop import load_trees, saved_tree_files

    kinds = ("graded success", "graded failure", "not finished (0, no call)", "no score")
    counts: dict[str, dict[tuple[int, str], int]] = {}
    scores: dict[str, dict[int, list[float]]] = {}
    stops: dict[str, dict[tuple[str, int], list[bool]]] = {}  # (how it stopped, label) -> passed, per graded child
    for (method, _), run in runs.items():
        if run.rubric_collect is None or not os.path.isdir(os.path.join(run.out_dir, "trees")):
            continue
        for step in saved_tree_files(run.out_dir)["train"]:
            for tree in load_trees(run.out_dir, step)[1]:
                for node in tree.nodes[1:] if tree.fork is None else ():
                    if node.label is None:
                        continue
                    kind = (kinds[0] if node.grade.success else kinds[1]) if node.grade is not None else \
                        kinds[2] if node.score == 0.0 else kinds[3]
                    by = counts.setdefault(method, {})
                    by[int(node.label), kind] = by.get((int(node.label), kind), 0) + 1
                    if node.score is not None:
                        scores.setdefault(method, {}).setdefault(int(node.label), []).append(node.score)
                    if node.grade is not None:
                        how = f"{node.status.value}, {'≤ 3' if len(node.turns) <= 3 else '> 3'} turns"
                        stops.setdefault(method, {}).setdefault((how, int(node.label)), []).append(node.grade.success)
    if not counts:
        return None
    rows = ["| method | verifier label | " + " | ".join(kinds) + " | mean rubric reward |", "|---" * 7 + "|"]
    for method, by in counts.items():
        for label in (1, 0):
            rewards = scores.get(method, {}).get(label, [])
            rows.append(f"| {method} | {'success' if label else 'failure'} | "
                        + " | ".join(str(by.get((label, k), 0)) for k in kinds)
                        + (f" | {np.mean(rewards):.2f} |" if rewards else " | — |"))
    rows += ["", "Graded children passed, by how the child stopped (passed / graded):", "",
             "| method | how the child stopped | verifier success | verifier failure |", "|---|---|---|---|"]
    for method, by in stops.items():
        for how in sorted({h for h, _ in by}):
            rows.append(f"| {method} | {how} | " + " | ".join(
                f"{sum(by[how, label])} / {len(by[how, label])}" if (how, label) in by else "—"
                for label in (1, 0)) + " |")
    return "\n".join(rows) + "\n"


def example_tree(runs: Runs, path: str, method_wanted: str = "rao") -> str | None:
    """The first tree of the last saved batch of the first run of ``method_wanted`` that has one, as text, to
    ``path``."""
    from agentjax.agents.tree import render_tree
    from agentjax.train.tree_loop import load_trees

    for (method, seed), run in runs.items():
        if method != method_wanted or not os.path.isdir(os.path.join(run.out_dir, "trees")):
            continue
        info, trees = load_trees(run.out_dir)
        if not trees:
            continue
        text = (f"# {method} seed {seed}, batch {info.get('step')} (stage {info.get('stage')}); printed by "
                f"`agentjax trees --run {os.path.relpath(run.out_dir, ROOT)} --tree 0`\n\n"
                + render_tree(trees[0], max_chars=200) + "\n")
        with open(path, "w") as f:
            f.write(text)
        return text
    return None


def start_label(out_dir: str) -> str:
    """What a run's RL started from, in words: its ``initial_policy.json`` record (the warm start's weights hash, a
    checkpoint, a random init's seed), or that the run has none (it predates the record)."""
    path = os.path.join(out_dir, "initial_policy.json")
    if not os.path.exists(path):
        return "no record (made before runs recorded their start)"
    with open(path) as f:
        record = json.load(f)
    if record.get("source") == "warm_start":
        cpu = (record.get("built_with") or {}).get("cpu_model")
        return f"warm start `{str(record.get('weights_sha256'))[:12]}`" + (f", built on {cpu}" if cpu else "")
    if record.get("source") == "random":
        return f"random init, seed {record.get('seed')}"
    return f"checkpoint {record.get('path')}"


def starts_section(runs: Runs) -> str:
    """Per method, which seeds started from which policy (:func:`start_label`): a warm start is rebuilt per machine
    type (agentjax/train/warmstart.py, "Reproducibility"), so seeds run on different machines may start apart; each
    run's gain is measured from its own start."""
    lines = ["What each run started from (each gain is from the run's own update-0 evaluation; a warm start is "
             "rebuilt per machine type, agentjax/train/warmstart.py):", ""]
    for method in dict.fromkeys(m for m, _ in runs):
        by_label: dict[str, list[int]] = {}
        for (m, seed), run in sorted(runs.items(), key=lambda kv: kv[0][1]):
            if m == method:
                by_label.setdefault(start_label(run.out_dir), []).append(seed)
        parts = [f"seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))}: {label}"
                 for label, seeds in by_label.items()]
        lines.append(f"- {method}: " + "; ".join(parts))
    return "\n".join(lines) + "\n"


def finished(runs: Runs) -> Runs:
    """The runs whose last evaluation is at or past their last optimizer step (a tree run's eval files count batches
    drawn, skipped ones too); a run still training, or not started, is left out of the tables and named."""
    done = {k: r for k, r in runs.items() if max(eval_outcomes(r.out_dir), default=-1) >= r.updates}
    for (method, seed) in runs.keys() - done.keys():
        print(f"not in the tables (not finished): {method} seed {seed}")
    return done


def pairing(methods: list[str]) -> dict:
    """The paired column of a report of ``methods`` (``write_report``'s arguments): with flat GRPO among them (the
    tiny comparison) every method against GRPO; else (an arms report, TextWorld-Sync) each arm against its base
    method (:data:`ARMS`: SERA's or RAO's), over the seeds where both started from the same policy."""
    if "grpo" in methods:
        return {"threshold_method": "grpo"}
    bases = {m: ARMS[m][0] for m in methods if m in ARMS}
    return {"baselines": bases, "baseline_column": "base arm", "threshold_method": "", "same_start": True}


def report(runs: Runs, folder: str, name: str) -> dict:
    runs = finished(runs)
    if not runs:
        raise SystemExit("no finished run to report")
    some = runs.get(("rao", 0)) or next(iter(runs.values()))
    ro = some.train.rollout
    command = report_command(runs, name)
    header = (f"# SERA tiny experiment: {' vs '.join(dict.fromkeys(m for m, _ in runs))} on {some.env}, "
              f"{some.train.model.arch.name} with the Qwen tokenizer ({ro.num_groups} root tasks x {ro.group_size} "
              f"rollouts a batch, {some.updates} optimizer steps; eval: first {some.eval_tasks} "
              f"`{some.evaluation_split}` tasks x {some.eval_seeds} seeds = {some.eval_tasks * some.eval_seeds} "
              "episodes, the same episodes and sampling streams at every eval point)\n\n"
              "Mean ± standard error over training seeds; \"(noise)\" marks |mean| < 2 SE; with one seed there is no "
              f"SE. Made by `{command}`; what is matched between the arms: experiments/sera/presets.py.\n\n")
    table = write_report(runs, folder, name, header, **pairing(list(dict.fromkeys(m for m, _ in runs))))
    starts = starts_section(runs)
    with open(os.path.join(folder, f"{name}_results.md"), "a") as f:
        f.write("\n" + starts)
    print(starts)
    shape = shape_table(runs)
    with open(os.path.join(folder, f"{name}_shape.md"), "w") as f:
        f.write(f"# What the agents did per batch ({name}; mean over batches, ± SE over seeds)\n\n" + shape)
    cost = cost_table(runs)
    with open(os.path.join(folder, f"{name}_cost.md"), "w") as f:
        f.write(f"# Supervision a training run paid for ({name}; totals over the run, ± SE over seeds; SERA's Table 2 "
                "analogue)\n\nThe verifier is TextCraft-Synth's program check (no input tokens) or TextWorld-Sync's "
                "judge; \"labels that train\" counts the batches whose reward reads them (RAO: execution steps, "
                "SERA: rubric steps), the other labels are diagnostics (SERA's grade agreement). Rubric and grading "
                "calls are the policy's own batched generate calls. A flat run has none.\n\n" + cost)
    print(shape + "\n" + cost)
    grades = grade_table(runs)
    if grades:
        with open(os.path.join(folder, f"{name}_grades.md"), "w") as f:
            f.write(f"# The policy's grades against the verifier ({name}; delegated children of the saved training "
                    "trees, pooled over seeds)\n\nA SERA child's execution reward is its grade's final score: a child "
                    "graded a success earns up to 1 whatever the verifier says; one that did not finish scores 0 "
                    "without a grading call on TextCraft-Synth and is graded like the others on TextWorld-Sync (as "
                    "its judge judges every child); one without a rubric or a parsable grade leaves the gradient. "
                    f"Each run saved {some.tree.saved_trees} trees a batch (`trees/`, not committed: made again by the "
                    "report on the machine that has the run folders).\n\n" + grades)
        print(grades)
    tree = example_tree(runs, os.path.join(folder, "example_tree.txt" if name == "tiny" else f"{name}_tree.txt"))
    if tree:
        print(tree[:3000])
    tree = example_tree(runs, os.path.join(folder, f"example_tree_sera{'' if name == 'tiny' else '_' + name}.txt"),
                        "sera")  # SERA's: each child's rubric, grade and label
    if tree:
        print(tree[:3000])
    return table


def report_command(runs: Runs, name: str) -> str:
    """The ``run.py`` command line that trains (or, finished, reports) ``runs`` under report ``name``: the mode's
    flag, then the methods and seeds where they are not the mode's defaults."""
    methods, seeds = list(dict.fromkeys(m for m, _ in runs)), sorted({s for _, s in runs})
    flag = {"smoke": " --smoke", "sync": " --sync", "tiny": ""}.get(name, f" --name {name}")
    default_methods = ["rao"] if name == "sync" else list(METHODS)
    default_seeds = [0] if name in ("smoke", "sync") else list(SEEDS)
    return ("python experiments/sera/run.py" + flag
            + ("" if methods == default_methods else f" --methods {' '.join(methods)}")
            + ("" if seeds == default_seeds else f" --seeds {' '.join(map(str, seeds))}"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--methods", nargs="+", choices=METHODS, help=f"default: {' '.join(METHODS)} (--sync: rao)")
    parser.add_argument("--seeds", nargs="+", type=int, help=f"default: {' '.join(map(str, SEEDS))} (--smoke, "
                        "--sync: 0)")
    parser.add_argument("--updates", type=int, help="override the preset's number of optimizer steps")
    parser.add_argument("--jobs", type=int, default=1, help="runs at a time (separate processes)")
    parser.add_argument("--smoke", action="store_true", help="2 updates from a tiny warm start, seed 0")
    parser.add_argument("--sync", action="store_true", help="the TextWorld-Sync tiny run (RAO, or --methods' tree "
                        "arms)")
    parser.add_argument("--results", default=RESULTS, help="folder of the tables, figures and runs")
    parser.add_argument("--name", default="tiny", help="the tiny report's name: results/<name>_results.md etc. (a "
                        "subset of the arms gets its own, e.g. --name arms)")
    parser.add_argument("--search", type=int, metavar="N", help="after training, evaluate the SERA arms' last "
                        "checkpoints with rubric-guided search of N candidates (trained and initial grader) and "
                        "write results/<name>_search.md")
    parser.add_argument("--report-only", action="store_true")
    parser.add_argument("--dry-run", action="store_true", help="list the runs and stop")
    args = parser.parse_args(argv)
    if args.smoke:
        runs = {(m, s): smoke_run(m, s, results=args.results) for m in args.methods or METHODS
                for s in args.seeds or [0]}
        name, folder = "smoke", os.path.join(args.results, "runs", "smoke")
    elif args.sync:
        runs = {(m, s): sync_run(s, method=m, results=args.results,
                                 **({"updates": args.updates} if args.updates else {}))
                for s in args.seeds or [0] for m in args.methods or ["rao"]}
        name, folder = "sync", args.results
    else:  # seed by seed: every method has its seed 0 before any seed 1
        runs = {(m, s): tiny_run(m, s, results=args.results, updates=args.updates) for s in args.seeds or SEEDS
                for m in args.methods or METHODS}
        name, folder = args.name, args.results
    if args.dry_run:
        for (m, s), run in runs.items():
            print(f"{m} seed {s}: {run.updates} optimizer steps, eval {run.evaluation_split} -> {run.out_dir}")
        return 0
    compile_cache(args.results)
    if not args.report_only:
        run_all(runs, args.jobs)
    report(runs, folder, name)
    if args.search:
        if not args.report_only:
            run_search(runs, args.search)
        table = search_table(runs, args.search)
        with open(os.path.join(folder, f"{name}_search.md"), "w") as f:
            f.write(f"# Rubric-guided search at inference ({name}; {args.search} candidates per delegated child)\n\n"
                    "Final eval success of each SERA arm's last checkpoint on the same eval episodes: without search "
                    "(the run's own last evaluation), with search graded by the trained checkpoint, and graded by the "
                    "run's initial (warm-started) policy — the untrained-grader control (SERA Table 4). Mean ± SE over "
                    "seeds; differences paired episode by episode. The last two columns say what search could "
                    "change: the share of searched children where a later candidate was committed (ties go to the "
                    "first), and the share whose committed candidate was verified against the share where any "
                    "candidate was (the ceiling of a perfect grader). Made by "
                    f"`{report_command(runs, name)} --search {args.search}`.\n\n" + table)
        print(table)
    print(json.dumps({f"{m}/seed{s}": r.out_dir for (m, s), r in runs.items()}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = ["EVAL_SPLIT", "cost_table", "grade_table", "main", "pairing", "report", "report_command", "run_search",
           "search_table", "shape_table", "start_label", "starts_section"]
