"""The SERA tiny experiments: RAO (recursive trees) vs flat GRPO and the SERA arms on TextCraft-Synth; the tree arms
on TextWorld-Sync.

::

    python experiments/sera/run.py                       # every method of presets.METHODS, seeds 0-2: results/tiny_*
    python experiments/sera/run.py --methods rao --seeds 0
    python experiments/sera/run.py --sync                 # TextWorld-Sync: tiny RAO run, seed 0 (shared world)
    python experiments/sera/run.py --sync --methods rao sera --seeds 0 1 2   # ... RAO and SERA, 3 seeds
    python experiments/sera/run.py --smoke                # 2 updates from a tiny warm start: the pipeline
    python experiments/sera/run.py --methods sera --search 2   # + rubric-guided search on the last checkpoints
    python experiments/sera/run.py --methods rao rao_d --name arms   # a subset under its own name: results/arms_*
    python experiments/sera/run.py --report-only [--sync | --name arms]   # rebuild the committed tables

A report is built from one compact record per run (:func:`experiments.crbc.report.gather`): read from the run's
folder (``metrics.jsonl``, ``eval/<step>.json``, ``initial_policy.json``) where it has evaluations, otherwise taken
from the committed ``results/<name>_results.json``, which also keeps what the other tables read beside the records:
the search evaluations (``"search"``, :func:`search_evals`) and the grade counts of the saved training trees
(``"grades"``, :func:`grade_counts`). So ``--report-only`` rebuilds every table from git alone; without
``--methods`` / ``--seeds`` it reports the runs that JSON holds. Tables of a report ``<name>``:

- ``<name>_results.md`` / ``.json`` / ``<name>_curves.png``: eval success ± SE over training seeds, gains paired
  episode by episode, each method's paired difference to GRPO (or, without GRPO, each arm's to its base method;
  :func:`pairing`); below the table, what each run started from (:func:`starts_section`);
- ``<name>_shape.md``: what the agents did per batch (:func:`shape_table`);
- ``<name>_cost.md``: the supervision a run paid for (:func:`cost_table`);
- ``<name>_grades.md``: the policy's grades of delegated children against the verifier (:func:`grade_table`);
- ``<name>_search.md``: rubric-guided search on the last checkpoints (:func:`search_table`), where searched;
- ``example_tree.txt`` / ``example_tree_sera.txt`` (``<name>_tree.txt`` / ``example_tree_sera_<name>.txt``): one
  tree of the last saved RAO / SERA batch as text, written only where the run folders have their saved trees
  (``trees/``, never in git; ``agentjax trees --run <run dir>`` prints any saved tree).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping
from typing import Any

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from agentjax.train.runconfig import RunConfig  # noqa: E402
from experiments.crbc.report import (  # noqa: E402
    RunRecord,
    eval_outcomes,
    gather,
    load_results,
    results_path,
    write_report,
)
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

Key = tuple[str, int]  # (method, training seed)
Runs = dict[Key, RunConfig]
Records = Mapping[Key, RunRecord]
# Per-batch shape of what the agents did: (label, tree run's metric, flat run's metric).
SHAPE = (("turns a batch", "tree/turns", "rollout/num_turns"), ("nodes a tree", "tree/nodes", None),
         ("trees that delegate", "tree/delegating_trees", None), ("child label rate", "tree/child_success", None),
         ("invalid replies", "tree/invalid", "rollout/invalid_rate"),
         ("training success", "tree/root_success", "rollout/success_rate"),
         ("grades agreeing with the verifier", "grade/agreement", None))
# The cost of each method's supervision over a training run (SERA's Table 2): (label, metric, rows counted) where
# rows counted is "labels" for the batches whose reward reads the verifier's labels (RAO's execution steps, SERA's
# rubric steps; every other label is a diagnostic, e.g. SERA's grade agreement) and "all" for every batch drawn.
COST = (("verifier labels that train", "judge/requests", "labels"), ("verifier labels, all", "judge/requests", "all"),
        ("verifier input tokens", "judge/input_tokens", "all"), ("rubric calls", "rubric/calls", "all"),
        ("rubric input tokens", "rubric/input_tokens", "all"), ("grading calls", "grade/calls", "all"),
        ("grading input tokens", "grade/input_tokens", "all"))
# The metrics.jsonl series a run's record keeps for these tables (experiments.crbc.report.gather's metric_keys).
METRIC_KEYS = tuple(dict.fromkeys([k for _, *keys in SHAPE for k in keys if k] + [k for _, k, _ in COST]
                                  + ["schedule/stage", "grade/requests"]))


def records_of(runs: Runs, records: Records | None = None) -> dict[Key, RunRecord]:
    """``records``, or the records of ``runs`` read from their folders (runs without evaluations left out)."""
    return dict(records) if records is not None else gather(runs, "", METRIC_KEYS)


def _mean_se(values: list[float], fmt: str = "{:.3g}") -> str:
    if not values:
        return "—"
    if len(values) == 1:
        return fmt.format(values[0])
    return f"{fmt.format(np.mean(values))} ± {np.std(values, ddof=1) / np.sqrt(len(values)):.2g}"


def shape_table(runs: Runs, records: Records | None = None) -> str:
    """Mean over batches and seeds of :data:`SHAPE` per method (± SE over seeds); grade agreement over the batches
    that graded."""
    records = records_of(runs, records)
    rows = ["| method | " + " | ".join(name for name, _, _ in SHAPE) + " |", "|---" * (len(SHAPE) + 1) + "|"]
    for method in dict.fromkeys(m for m, _ in runs):
        cells = []
        for _, tree_key, flat_key in SHAPE:
            per_seed = []
            for (m, seed), run in runs.items():
                key = tree_key if run.tree is not None else flat_key
                if m != method or (m, seed) not in records or key is None:
                    continue
                metrics = records[m, seed].metrics
                graded = metrics.get("grade/requests", {})
                values = [v for step, v in metrics.get(key, {}).items() if key != "grade/agreement" or graded.get(step)]
                if values:
                    per_seed.append(float(np.mean(values)))
            cells.append(_mean_se(per_seed))
        rows.append(f"| {method} | " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"


def label_stage(run: RunConfig) -> int | None:
    """The stage whose reward reads the verifier's labels: RAO's execution (0), SERA's rubric ranking (2); None for
    a flat run (its reward is the environment's)."""
    if run.tree is None:
        return None
    return 2 if run.train.credit.method == "sera" else 0


def cost_table(runs: Runs, records: Records | None = None) -> str:
    """Totals over a run of :data:`COST` per method, mean ± SE over seeds (batches skipped by the filter count: their
    labels were paid for)."""
    records = records_of(runs, records)
    rows = ["| method | " + " | ".join(name for name, _, _ in COST) + " |", "|---" * (len(COST) + 1) + "|"]
    for method in dict.fromkeys(m for m, _ in runs):
        cells = []
        for _, key, which in COST:
            per_seed = []
            for (m, seed), run in runs.items():
                if m != method or (m, seed) not in records or run.tree is None:
                    continue
                metrics, stage = records[m, seed].metrics, label_stage(run)
                series = metrics.get(key, {})
                per_seed.append(sum(series.get(step, 0.0) for step, s in metrics.get("schedule/stage", {}).items()
                                    if which == "all" or s == stage))
            cells.append(_mean_se(per_seed, "{:.0f}"))
        rows.append(f"| {method} | " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"


GRADERS = ("policy", "initial")  # who writes and grades the search's rubrics: the trained checkpoint, the warm start
SEARCH_STATS = ("search/later_won", "search/chosen_verified", "search/any_verified")


def search_file(out_dir: str, candidates: int, grader: str) -> str | None:
    """The newest search evaluation :func:`agentjax.train.offline.evaluate_checkpoint` wrote in ``out_dir``
    (``eval_<step>_search<N>[_initial].json``), or None."""
    suffix = f"_search{candidates}{'_initial' if grader == 'initial' else ''}.json"
    steps = [int(name[5:-len(suffix)]) for name in os.listdir(out_dir) if name.startswith("eval_")
             and name.endswith(suffix) and name[5:-len(suffix)].isdigit()] if os.path.isdir(out_dir) else []
    return os.path.join(out_dir, f"eval_{max(steps)}{suffix}") if steps else None


def _candidate_counts(out_dir: str) -> set[int]:
    names = os.listdir(out_dir) if os.path.isdir(out_dir) else []
    return {int(n.split("_search")[1].split("_")[0].removesuffix(".json")) for n in names
            if n.startswith("eval_") and "_search" in n and n.split("_search")[1].split("_")[0]
            .removesuffix(".json").isdigit()}


def _encode(outcomes: np.ndarray) -> str:
    """[tasks, seeds] 0/1 outcomes as one string of task rows (the results JSON's form of an evaluation)."""
    return " ".join("".join("1" if x else "0" for x in row) for row in np.asarray(outcomes))


def _decode(text: str) -> np.ndarray:
    return np.asarray([[float(c) for c in row] for row in text.split()], np.float64)


def search_evals(runs: Runs, json_path: str) -> dict[Key, list[dict[str, Any]]]:
    """Per run, its search evaluations: ``{"candidates", "grader", "step", "outcomes"}`` (outcomes as a string of
    task rows) and the search statistics present (:data:`SEARCH_STATS`). Read from the run's folder (the newest
    ``eval_<step>_search<N>[_initial].json`` per candidate count and grader) where it has evaluations, otherwise
    the entries of ``json_path``'s ``"search"`` list (what :func:`report` stored)."""
    stored: dict[Key, list[dict[str, Any]]] = {}
    for entry in load_results(json_path).get("search", []):
        stored.setdefault((entry["label"], int(entry["seed"])), []).append(
            {k: v for k, v in entry.items() if k not in ("label", "seed")})
    out: dict[Key, list[dict[str, Any]]] = {}
    for key, run in runs.items():
        if not eval_outcomes(run.out_dir):
            if key in stored:
                out[key] = stored[key]
            continue
        found = []
        for n in sorted(_candidate_counts(run.out_dir)):
            for grader in GRADERS:
                path = search_file(run.out_dir, n, grader)
                if path is None:
                    continue
                with open(path) as f:
                    result = json.load(f)
                step = int(os.path.basename(path)[5:].split("_")[0])
                found.append({"candidates": n, "grader": grader, "step": step,
                              "outcomes": _encode(np.asarray(result["outcomes"], np.float64)),
                              **{k: result[k] for k in SEARCH_STATS if k in result}})
        if found:
            out[key] = found
    return out


def run_search(runs: Runs, candidates: int) -> None:
    """Evaluate every finished SERA-arm run's last checkpoint with rubric-guided search (``candidates`` per delegated
    child), graded by the checkpoint and by the initial policy; a result already on disk is kept."""
    from agentjax.train.offline import evaluate_checkpoint

    for (method, seed), run in runs.items():
        if run.train.credit.method != "sera" or max(eval_outcomes(run.out_dir), default=0) == 0:
            continue
        for grader in GRADERS:
            if search_file(run.out_dir, candidates, grader) is None:
                print(f"search {candidates} ({grader} grader): {method} seed {seed}", flush=True)
                evaluate_checkpoint(run.out_dir, search=candidates, grader=grader)


def search_table(runs: Runs, candidates: int, records: Records | None = None,
                 evals: Mapping[Key, list[dict[str, Any]]] | None = None) -> str:
    """Final eval success without search, with search graded by the checkpoint and by the initial policy, and the
    paired difference (search − none, episode by episode, then mean ± SE over seeds), per SERA arm; and what the
    search could change: how often a later candidate was committed (per grader), and the share of searched children
    whose committed candidate was verified against the share where any candidate was (the trained grader's run);
    then the finished SERA-arm runs that have no search evaluation, by name. ``evals``: :func:`search_evals`'s
    (default: read from the run folders)."""
    records = records_of(runs, records)
    evals = evals if evals is not None else search_evals(runs, "")
    unsearched: list[str] = []
    rows = ["| method | seeds | no search | search, trained grader | search, initial grader | trained − none | "
            "initial − none | later candidate committed (trained / initial) | committed verified / any verified |",
            "|---" * 9 + "|"]
    for method in dict.fromkeys(m for m, _ in runs):
        base, by_grader, diff = [], {g: [] for g in GRADERS}, {g: [] for g in GRADERS}
        later, verified = {g: [] for g in GRADERS}, ([], [])
        for (m, seed), run in runs.items():
            if m != method or run.train.credit.method != "sera" or (m, seed) not in records:
                continue
            outcomes = records[m, seed].eval
            last = max(outcomes)
            found = {e["grader"]: e for e in evals.get((m, seed), []) if e["candidates"] == candidates}
            if set(GRADERS) - set(found):
                unsearched.append(f"{m} seed {seed}")
                continue
            base.append(float(outcomes[last].mean()))
            for g in GRADERS:
                result = found[g]
                searched = _decode(result["outcomes"])
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


GRADE_KINDS = ("graded success", "graded failure", "not finished (0, no call)", "no score")
VERDICTS = ("success", "failure")  # the verifier's label of a child, in table order


def grade_counts(runs: Runs) -> dict[str, dict[str, Any]]:
    """How the policy graded the delegated children of the training trees each SERA run saved (``trees/<batch>.json``,
    ``tree.saved_trees`` trees a batch; forks' branches left out), against the verifier's label, pooled over the
    seeds of a method whose run folders hold saved trees: ``{method: {"seeds", "children": {verdict: counts of
    GRADE_KINDS}, "reward": {verdict: mean rubric reward or None}, "stopped": [[how the child stopped, [passed,
    graded] or None per verdict], ...]}}``. How a graded child stopped: finished, out of turns, ended with the
    world; within 3 turns or after. Methods without saved trees (RAO, runs without their ``trees/``) are left out."""
    from agentjax.train.trees import load_trees, saved_tree_files

    out: dict[str, dict[str, Any]] = {}
    raw: dict[str, tuple[dict, dict, dict]] = {}
    for (method, seed), run in runs.items():
        if run.rubric_collect is None or not os.path.isdir(os.path.join(run.out_dir, "trees")):
            continue
        counts, scores, stops = raw.setdefault(method, ({}, {}, {}))
        out.setdefault(method, {"seeds": []})["seeds"].append(seed)
        for step in saved_tree_files(run.out_dir)["train"]:
            for tree in load_trees(run.out_dir, step)[1]:
                for node in tree.nodes[1:] if tree.fork is None else ():
                    if node.label is None:
                        continue
                    verdict = VERDICTS[0] if node.label else VERDICTS[1]
                    kind = (GRADE_KINDS[0] if node.grade.success else GRADE_KINDS[1]) if node.grade is not None else \
                        GRADE_KINDS[2] if node.score == 0.0 else GRADE_KINDS[3]
                    counts[verdict, kind] = counts.get((verdict, kind), 0) + 1
                    if node.score is not None:
                        scores.setdefault(verdict, []).append(node.score)
                    if node.grade is not None:
                        how = f"{node.status.value}, {'≤ 3' if len(node.turns) <= 3 else '> 3'} turns"
                        stops.setdefault((how, verdict), []).append(node.grade.success)
    for method, (counts, scores, stops) in raw.items():
        if not counts:
            del out[method]
            continue
        out[method] |= {
            "children": {v: [counts.get((v, k), 0) for k in GRADE_KINDS] for v in VERDICTS},
            "reward": {v: float(np.mean(scores[v])) if scores.get(v) else None for v in VERDICTS},
            "stopped": [[how, *([sum(stops[how, v]), len(stops[how, v])] if (how, v) in stops else None
                                for v in VERDICTS)] for how in sorted({h for h, _ in stops})]}
    return out


def grade_markdown(counts: Mapping[str, Mapping[str, Any]]) -> str | None:
    """The grades table of :func:`grade_counts`' counts (the children per verifier label and what they were graded,
    then the graded children's passes by how the child stopped: a grader that reads the child separates the labels
    within a row, one keyed on how the child stopped does not); None without any."""
    if not counts:
        return None
    rows = ["| method | verifier label | " + " | ".join(GRADE_KINDS) + " | mean rubric reward |", "|---" * 7 + "|"]
    for method, c in counts.items():
        for verdict in VERDICTS:
            reward = c["reward"].get(verdict)
            rows.append(f"| {method} | {verdict} | " + " | ".join(map(str, c["children"][verdict]))
                        + (f" | {reward:.2f} |" if reward is not None else " | — |"))
    rows += ["", "Graded children passed, by how the child stopped (passed / graded):", "",
             "| method | how the child stopped | verifier success | verifier failure |", "|---|---|---|---|"]
    for method, c in counts.items():
        for how, *cells in c["stopped"]:
            rows.append(f"| {method} | {how} | " + " | ".join(f"{p} / {n}" if p is not None else "—"
                                                               for p, n in (x or (None, None) for x in cells)) + " |")
    return "\n".join(rows) + "\n"


def grade_table(runs: Runs) -> str | None:
    """:func:`grade_markdown` of the runs' saved trees (:func:`grade_counts`); None where none has graded
    children."""
    return grade_markdown(grade_counts(runs))


def example_tree(runs: Runs, path: str, method_wanted: str = "rao") -> str | None:
    """The first tree of the last saved batch of the first run of ``method_wanted`` that has one, as text, to
    ``path``."""
    from agentjax.agents.tree import render_tree
    from agentjax.train.trees import load_trees

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


def start_label(record: Mapping[str, Any] | None) -> str:
    """What a run's RL started from, in words, from its ``initial_policy.json`` record (the warm start's weights hash,
    a checkpoint, a random init's seed), or that the run has none."""
    if record is None:
        return "no record of its initial policy"
    if record.get("source") == "warm_start":
        cpu = (record.get("built_with") or {}).get("cpu_model")
        return f"warm start `{str(record.get('weights_sha256'))[:12]}`" + (f", built on {cpu}" if cpu else "")
    if record.get("source") == "random":
        return f"random init, seed {record.get('seed')}"
    return f"checkpoint {record.get('path')}"


def starts_section(records: Records) -> str:
    """Per method, which seeds started from which policy (:func:`start_label`): a warm start built on another CPU type
    or core count is another policy (agentjax/train/warmstart.py, "Reproducibility"), so each run's gain is measured
    from its own start."""
    lines = ["What each run started from (each gain is from the run's own update-0 evaluation; a warm start built on "
             "another CPU type is another policy, agentjax/train/warmstart.py):", ""]
    for method in dict.fromkeys(m for m, _ in records):
        by_label: dict[str, list[int]] = {}
        for (m, seed), record in sorted(records.items(), key=lambda kv: kv[0][1]):
            if m == method:
                by_label.setdefault(start_label(record.initial_policy), []).append(seed)
        parts = [f"seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))}: {label}"
                 for label, seeds in by_label.items()]
        lines.append(f"- {method}: " + "; ".join(parts))
    return "\n".join(lines) + "\n"


def finished(runs: Runs, records: Records | None = None) -> Runs:
    """The runs whose last evaluation is at or past their last optimizer step (a tree run's eval files count batches
    drawn, skipped ones too); a run still training, or with no record, is left out of the tables and named."""
    records = records_of(runs, records)
    done = {k: r for k, r in runs.items() if k in records and max(records[k].eval, default=-1) >= r.updates}
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


def _write(folder: str, name: str, text: str) -> None:
    with open(os.path.join(folder, name), "w") as f:
        f.write(text)


def report(runs: Runs, folder: str, name: str, search: int | None = None) -> dict:
    """Every table of report ``name`` in ``folder`` (module docstring) from the records of ``runs``; the search table
    for ``search`` candidates, or, where the report's results JSON stores search evaluations already, for the largest
    count they searched."""
    path = results_path(folder, name)
    stored = load_results(path)
    records = gather(runs, path, METRIC_KEYS)
    runs = finished(runs, records)
    if not runs:
        raise SystemExit("no finished run to report")
    records = {k: records[k] for k in runs}
    methods = list(dict.fromkeys(m for m, _ in runs))
    some = runs.get(("rao", 0)) or next(iter(runs.values()))
    ro = some.train.rollout
    searched = search is not None or "search" in stored
    evals = search_evals(runs, path) if searched else {}
    grades = {m: c for m, c in stored.get("grades", {}).items() if m in methods} | grade_counts(runs)
    grades = {m: grades[m] for m in methods if m in grades}
    extra = ({"search": [{"label": m, "seed": s, **e} for (m, s), found in evals.items() for e in found]}
             if searched else {}) | ({"grades": grades} if grades else {})
    header = (f"# SERA tiny experiment: {' vs '.join(methods)} on {some.env}, {some.train.model.arch.name} with the "
              f"Qwen tokenizer ({ro.num_groups} root tasks x {ro.group_size} rollouts a batch, {some.updates} "
              f"optimizer steps; eval: first {some.eval_tasks} `{some.evaluation_split}` tasks x {some.eval_seeds} "
              f"seeds = {some.eval_tasks * some.eval_seeds} episodes, the same episodes and sampling streams at every "
              "eval point)\n\n"
              "Mean ± standard error over training seeds; \"(noise)\" marks |mean| < 2 SE; with one seed there is no "
              f"SE. Made by `{report_command(runs, name)}`; what is matched between the arms: "
              "experiments/sera/presets.py.\n\n")
    table = write_report(records, folder, name, header, config=some.to_dict(), extra=extra,
                         title="eval success (± SE over seeds)", **pairing(methods))
    starts = starts_section(records)
    with open(os.path.join(folder, f"{name}_results.md"), "a") as f:
        f.write("\n" + starts)
    shape, cost = shape_table(runs, records), cost_table(runs, records)
    made = (f"Made by `{report_command(runs, name)}`; `{report_command(runs, name)} --report-only` rebuilds it from "
            f"`{name}_results.json`.\n\n")
    _write(folder, f"{name}_shape.md", f"# What the agents did per batch ({name}; mean over batches, ± SE over "
           "seeds)\n\n" + made + shape)
    _write(folder, f"{name}_cost.md", f"# Supervision a training run paid for ({name}; totals over the run, ± SE over "
           "seeds; SERA's Table 2 analogue)\n\nThe verifier is TextCraft-Synth's program check (no input tokens) or "
           "TextWorld-Sync's judge; \"labels that train\" counts the batches whose reward reads them (RAO: execution "
           "steps, SERA: rubric steps), the other labels are diagnostics (SERA's grade agreement). Rubric and grading "
           "calls are the policy's own batched generate calls. A flat run has none. " + made + cost)
    print(starts + "\n" + shape + "\n" + cost)
    if grades:
        text = grade_markdown(grades)
        _write(folder, f"{name}_grades.md", f"# The policy's grades against the verifier ({name}; delegated children "
               "of the saved training trees, pooled over seeds)\n\nA SERA child's execution reward is its grade's "
               "final score: a child graded a success earns up to 1 whatever the verifier says; one that did not "
               "finish scores 0 without a grading call on TextCraft-Synth and is graded like the others on "
               "TextWorld-Sync (as its judge judges every child); one without a rubric or a parsable grade leaves the "
               f"gradient. Each run saved {some.tree.saved_trees} trees a batch; the trees are not in git, their "
               f"counts are kept in `{name}_results.json` (`grades`). " + made + text)
        print(text)
    counts = sorted({e["candidates"] for found in evals.values() for e in found})
    if search or counts:
        n = search or counts[-1]
        text = search_table(runs, n, records, evals)
        _write(folder, f"{name}_search.md", f"# Rubric-guided search at inference ({name}; {n} candidates per "
               "delegated child)\n\nFinal eval success of each SERA arm's last checkpoint on the same eval episodes: "
               "without search (the run's own last evaluation), with search graded by the trained checkpoint, and "
               "graded by the run's initial (warm-started) policy — the untrained-grader control (SERA Table 4). Mean "
               "± SE over seeds; differences paired episode by episode. The last two columns say what search could "
               "change: the share of searched children where a later candidate was committed (ties go to the "
               "first), and the share whose committed candidate was verified against the share where any candidate "
               f"was (the ceiling of a perfect grader). Made by `{report_command(runs, name)} --search {n}`.\n\n"
               + text)
        print(text)
    for path, method in (("example_tree.txt" if name == "tiny" else f"{name}_tree.txt", "rao"),
                         (f"example_tree_sera{'' if name == 'tiny' else '_' + name}.txt", "sera")):
        tree = example_tree(runs, os.path.join(folder, path), method)  # SERA's: each child's rubric, grade, label
        if tree:
            print(tree[:3000])
    return table


def report_command(runs: Mapping[Key, Any], name: str) -> str:
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
    parser.add_argument("--methods", nargs="+", choices=METHODS, help=f"default: {' '.join(METHODS)} (--sync: rao; "
                        "--report-only: those of the report's results JSON)")
    parser.add_argument("--seeds", nargs="+", type=int, help=f"default: {' '.join(map(str, SEEDS))} (--smoke, "
                        "--sync: 0; --report-only: those of the report's results JSON)")
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
    parser.add_argument("--report-only", action="store_true", help="rebuild the tables from the runs' records (run "
                        "folders, else the committed results JSON); train nothing")
    parser.add_argument("--dry-run", action="store_true", help="list the runs and stop")
    args = parser.parse_args(argv)
    if args.smoke:
        name, folder, methods, seeds = "smoke", os.path.join(args.results, "runs", "smoke"), METHODS, [0]
    elif args.sync:
        name, folder, methods, seeds = "sync", args.results, ["rao"], [0]
    else:
        name, folder, methods, seeds = args.name, args.results, METHODS, SEEDS
    pairs = [(m, s) for s in args.seeds or seeds for m in args.methods or methods]  # every method's seed 0 first
    stored = [(e["label"], int(e["seed"])) for e in load_results(results_path(folder, name)).get("runs", [])]
    if args.report_only and not (args.methods or args.seeds) and stored:
        pairs = stored  # the committed table's runs
    if args.smoke:
        runs = {(m, s): smoke_run(m, s, results=args.results) for m, s in pairs}
    elif args.sync:
        runs = {(m, s): sync_run(s, method=m, results=args.results, **({"updates": args.updates} if args.updates
                                                                         else {})) for m, s in pairs}
    else:
        runs = {(m, s): tiny_run(m, s, results=args.results, updates=args.updates) for m, s in pairs}
    if args.dry_run:
        for (m, s), run in runs.items():
            print(f"{m} seed {s}: {run.updates} optimizer steps, eval {run.evaluation_split} -> {run.out_dir}")
        return 0
    if not args.report_only:
        compile_cache(args.results)
        run_all(runs, args.jobs)
        if args.search:
            run_search(runs, args.search)
    report(runs, folder, name, args.search)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = ["EVAL_SPLIT", "METRIC_KEYS", "cost_table", "grade_counts", "grade_markdown", "grade_table", "main",
           "pairing", "report", "report_command", "run_search", "search_evals", "search_table", "shape_table",
           "start_label", "starts_section"]
