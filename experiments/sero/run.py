"""The SERO tiny experiment: base vs base + SERO on Sokoban 6×6 and TextCraft-Synth, its ablations, and the
interaction-matched baseline.

::

    python experiments/sero/run.py                      # GraphGPO and CRBC, each with and without SERO, seeds 0-2
    python experiments/sero/run.py --jobs 2             # two runs at a time, in separate processes
    python experiments/sero/run.py --ablations --seeds 0    # the weighting ablations and the λ_O sweep (GraphGPO)
    python experiments/sero/run.py --pool --ablations --only coef_0.01 coef_0.05 --jobs 2   # two of them, pool
    python experiments/sero/run.py --matched            # + the interaction-matched baselines (after the SERO runs)
    python experiments/sero/run.py --pool --jobs 2      # the pool setting (below): results/pool_results.md
    python experiments/sero/run.py --textcraft --methods graphgpo   # TextCraft-Synth: results/textcraft_results.md
    python experiments/sero/run.py --smoke              # 2 updates, small sizes: the pipeline end to end
    python experiments/sero/run.py ... --report-only    # the same command's tables again, without training

Every run is the tiny Sokoban preset of the CRBC experiment (:mod:`experiments.sero.presets`): the same cached warm
start, rooms, sampling streams and budget (20 updates × 16 rooms × 8 rollouts); a SERO run adds the oracle branch
(≤ one root per room with a failure, Sokoban's BFS solver from the restored snapshot, λ_O = 0.1) and nothing else:
its primary rollouts of the first update are those of the base run (tests/train/test_sero.py).

The pool setting (``--pool``, :func:`experiments.sero.presets.pool_run`) is the CRBC experiment's: trained on a fixed
pool of 16 rooms (AdamW 2e-3 x 4 steps an update, 16 updates), evaluated on those rooms and on 16 held-out rooms,
where every base method measurably improves its rooms; the base runs are the CRBC pool comparison's own, and each
SERO arm adds the oracle branch on the same pool. ``--ablations`` and ``--matched`` take ``--pool`` too (reports
``pool_ablations_*``, ``pool_matched_*``).

The TextCraft-Synth setting (``--textcraft``, :func:`experiments.sero.presets.textcraft_run`) is the SERA
experiment's flat run (its planner warm start, sizes and evaluation) with each method's credit; the branch's oracle
is the TextCraft planner (report ``textcraft_*``).

The reports read each finished run's record (:func:`experiments.crbc.report.gather`: its folder under
``results/runs/``, not kept in git, else the committed ``results/<name>_results.json``, which keeps the records with
the ``sero/`` series of :data:`SERO_METRICS`): ``results/<name>_results.md`` / ``.json`` / ``<name>_curves.png``
(eval success ± SE over seeds, gains paired by episode, each arm's paired difference to its own base) and
``<name>_branches.md`` (what the branches did: roots attempted / valid / gated in, oracle steps, branch vs on-policy
suffix success, the branch's environment steps and wall time as shares of the update's), for ``name`` = ``tiny``,
``pool``, ``textcraft``, ``ablations`` / ``pool_ablations`` and ``matched`` / ``pool_matched``.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from agentjax.train.config import SeroConfig  # noqa: E402
from agentjax.train.runconfig import RunConfig  # noqa: E402
from experiments.crbc.report import RunRecord, gather, load_results, results_path, write_report  # noqa: E402
from experiments.crbc.run import compile_cache, held_out_report, run_all, setting  # noqa: E402
from experiments.sero.presets import (  # noqa: E402
    COEF,
    METHODS,
    RESULTS,
    SEEDS,
    ablation_configs,
    ablation_runs,
    extra_updates,
    label,
    matched_run,
    pool_run,
    smoke_run,
    textcraft_run,
    tiny_run,
)

Runs = dict[tuple[str, int], RunConfig]
BRANCH_KEYS = ("roots_attempted", "roots_valid", "roots_gated", "oracle_steps", "trained_steps", "branch_return",
               "suffix_return", "compat_mean", "weight_mean", "env_steps", "time_total")
# the metrics.jsonl series a SERO report keeps in each run's record (experiments.crbc.report.gather): the branch
# table's and the interaction-matched baseline's
SERO_METRICS = (*(f"sero/{k}" for k in BRANCH_KEYS), "rollout/num_turns", "time/total")


SETTINGS = {"tiny": tiny_run, "pool": pool_run, "textcraft": textcraft_run, "smoke": smoke_run}
TITLES = {"sokoban": "Sokoban 6x6", "textcraft_synth": "TextCraft-Synth"}


def comparison(methods, seeds, *, updates=None, results=RESULTS, name="tiny") -> Runs:
    """``{(label, seed): run}``: every method with and without SERO, seed by seed, in the setting ``name`` (a key
    of :data:`SETTINGS`)."""
    smoke, make = name == "smoke", SETTINGS[name]
    out: Runs = {}
    for seed in seeds:
        for method in methods:
            for sero in (None, SeroConfig(coef=COEF)):
                kw = {} if smoke else {"updates": updates}
                out[(label(method, sero), seed)] = make(method, seed, sero, results=results, **kw)
    return out


def baselines(runs: Runs) -> dict[str, str]:
    """Each label's paired baseline: its base method (``graphgpo+sero`` → ``graphgpo``; ablations and matched runs
    too)."""
    return {lab: lab.split("+")[0].split(":")[0] for lab, _ in runs}


def finished_records(runs: Runs, json_path: str) -> dict[tuple[str, int], RunRecord]:
    """The records of the runs that finished (:func:`experiments.crbc.report.gather` with :data:`SERO_METRICS`:
    each run's folder, else the results JSON ``json_path``); a run cut short would report its last eval as final."""
    records = gather(runs, json_path, SERO_METRICS)
    return {k: r for k, r in records.items() if r.steps >= runs[k].updates}


def _lines(record: RunRecord) -> list[dict[str, float]]:
    """The record's metric series as one dict a step (the keys a metrics.jsonl line has, in its order)."""
    steps = sorted(set().union(*(series.keys() for series in record.metrics.values())))
    return [{k: series[s] for k, series in sorted(record.metrics.items()) if s in series} for s in steps]


def branch_table(records: dict[tuple[str, int], RunRecord]) -> dict[str, dict]:
    """Per SERO arm: the mean over updates and seeds of each ``sero/`` metric, and the branch's environment steps
    and wall time as shares of the primary collection's and of the whole update's."""
    out: dict[str, dict] = {}
    for lab in dict.fromkeys(lab for lab, _ in records):
        lines = [x for (l2, _), r in records.items() if l2 == lab for x in _lines(r) if "sero/roots_attempted" in x]
        if not lines:
            continue
        row = {k: float(np.mean([x.get(f"sero/{k}", 0.0) for x in lines])) for k in BRANCH_KEYS}
        turns = float(np.mean([x["rollout/num_turns"] for x in lines]))
        total = float(np.mean([x["time/total"] for x in lines]))  # the update's wall time, evaluations included
        row |= {"updates": len(lines), "env_step_share": row["env_steps"] / turns,
                "time_share": row["time_total"] / total if total else float("nan")}
        out[lab] = row
    return out


def branch_markdown(table: dict[str, dict]) -> str:
    cols = ("roots_attempted", "roots_valid", "roots_gated", "oracle_steps", "branch_return", "suffix_return",
            "compat_mean", "weight_mean", "env_step_share", "time_share")
    rows = ["| arm | updates | " + " | ".join(cols) + " |", "|---|---|" + "---|" * len(cols)]
    for lab, r in table.items():
        rows.append(f"| {lab} | {r['updates']} | " + " | ".join(f"{r[c]:.3f}" if c in r else "—" for c in cols)
                    + " |")
    unknown = any("time_share" not in r for r in table.values())  # a table kept without its runs' update times
    note = "\nWhat was kept of these runs does not give their time share (—).\n" if unknown else ""
    return "\n".join(rows) + "\n" + note


def header(runs: Runs, title: str, command: str, name: str) -> str:
    some = next(iter(runs.values()))
    return (f"# {title}: {TITLES.get(some.env, some.env)}, {some.train.model.arch.name}, `{some.collect.prompt}` "
            f"prompts ({setting(some)}, "
            "the same episodes and sampling streams at every eval point and for every arm of a seed)\n\n"
            "Mean ± standard error over training seeds (with one seed: none); \"(noise)\" marks |mean| < 2 SE; "
            "\"final − base\" pairs each arm with its base "
            f"method (no SERO) on the same episodes. Made by `{command}`; `{command} --report-only` rebuilds this "
            f"table from `{name}_results.json`.\n\n")


def report(runs: Runs, results: str, name: str, title: str, command: str) -> dict:
    """``<name>_results.*`` (:func:`experiments.crbc.report.write_report`) and ``<name>_branches.md`` (what the
    branches did) from the finished runs' records; the JSON keeps the branch table as ``"branches"``."""
    path = results_path(results, name)
    done = finished_records(runs, path)
    stored = load_results(path)
    if not done and "results" in stored and "runs" not in stored:  # a table made before records were kept
        listed = {(lab, s) for lab, row in stored["results"].items() for s in row["seeds"]}
        shown, branches = {k: r for k, r in runs.items() if k in listed}, stored.get("branches", {})
    else:
        shown, branches = {k: runs[k] for k in done}, branch_table(done)
    missing = sorted(f"{lab} seed {s}" for (lab, s) in runs if (lab, s) not in shown)
    if not shown:
        raise SystemExit(f"no finished runs to report ({', '.join(missing)})")
    note = f"Not finished in this folder (left out): {', '.join(missing)}.\n\n" if missing else ""
    some = next(iter(shown.values()))
    table = write_report(done, results, name, header(shown, title, command, name) + note, config=some.to_dict(),
                         baselines=baselines(shown), baseline_column="base", same_start=True,
                         extra={"branches": branches} if branches else None, **held_out_report(some))
    if branches:
        text = (f"# What the branches did ({name})\n\nMean over updates and seeds of the `sero/` metrics: roots "
                "attempted (groups with a failure) / valid (restored and checked) / gated in (the oracle succeeded "
                "where the rollout failed), oracle steps, the branch's and the failed rollout's success from the "
                "root, the behaviour compatibility and weight of an oracle step, and the branch's environment steps "
                "and wall time as shares of the primary rollouts' turns and of the whole update. Made by "
                f"`{command}`; `{command} --report-only` rebuilds it from `{name}_results.json`.\n\n"
                + branch_markdown(branches))
        with open(os.path.join(results, f"{name}_branches.md"), "w") as f:
            f.write(text)
        print(text)
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--methods", nargs="+", default=list(METHODS))
    parser.add_argument("--seeds", nargs="+", type=int, default=list(SEEDS))
    parser.add_argument("--updates", type=int, help="override the preset's number of updates")
    parser.add_argument("--jobs", type=int, default=1, help="runs at a time (separate processes)")
    parser.add_argument("--ablations", action="store_true",
                        help="the weighting ablations and λ_O sweep of the first method (with its base and SERO arms)")
    parser.add_argument("--only", nargs="+", metavar="ABLATION", choices=[n for n in ablation_configs() if n != "sero"],
                        help="with --ablations: these ablations only (names as in presets.ablation_configs)")
    parser.add_argument("--matched", action="store_true", help="the interaction-matched baselines (§A.2)")
    parser.add_argument("--pool", action="store_true", help="the pool setting (presets.pool_run): the bases are the "
                        "CRBC pool comparison's runs")
    parser.add_argument("--textcraft", action="store_true", help="the TextCraft-Synth setting (presets."
                        "textcraft_run: the SERA experiment's flat run)")
    parser.add_argument("--smoke", action="store_true", help="2 updates, seed 0 only, small sizes")
    parser.add_argument("--results", default=RESULTS, help="folder of the tables, figures and runs")
    parser.add_argument("--report-only", action="store_true")
    parser.add_argument("--dry-run", action="store_true", help="list the runs and stop")
    args = parser.parse_args(argv)
    compile_cache(args.results)
    seeds = [0] if args.smoke and args.seeds == list(SEEDS) else args.seeds
    chosen = [n for n in ("pool", "textcraft", "smoke") if getattr(args, n)]
    if len(chosen) > 1:
        parser.error(f"{' and '.join('--' + n for n in chosen)} are different settings: choose one")
    name = chosen[0] if chosen else "tiny"
    if name == "textcraft" and (args.ablations or args.matched):
        parser.error("--ablations and --matched run on Sokoban (the tiny or --pool setting), not --textcraft")
    runs = comparison(args.methods, seeds, updates=args.updates, results=args.results, name=name)
    if args.only and not args.ablations:
        parser.error("--only chooses among the ablations: add --ablations")
    if args.ablations:
        for seed in seeds:
            runs |= {(lab, seed): r for lab, r in ablation_runs(args.methods[0], seed, results=args.results,
                                                                updates=args.updates, pool=args.pool).items()
                     if not args.only or lab.split(":")[1] in args.only}
    if args.dry_run:
        for (lab, s), run in runs.items():
            print(f"{lab} seed {s}: {run.updates} updates -> {run.out_dir}")
        return 0
    if not args.report_only:
        run_all(runs, args.jobs)
    folder = os.path.join(args.results, "runs", "smoke") if args.smoke else args.results
    if args.matched:  # after the SERO runs: their branches' environment steps set the extra updates
        matched: Runs = {}
        arms = {k: r for k, r in runs.items() if k[0].endswith("+sero")}
        for (lab, seed), record in finished_records(arms, results_path(folder, name)).items():
            method = lab.split("+")[0]
            matched[(f"{method}:matched", seed)] = matched_run(method, seed, extra_updates(record, args.updates),
                                                               results=args.results, updates=args.updates,
                                                               pool=args.pool)
        if not args.report_only:
            run_all(matched, args.jobs)
        runs |= matched
    given, skip = [], False  # the command line that made the runs: without --report-only and --jobs N
    for a in sys.argv[1:] if argv is None else argv:
        if not skip and a not in ("--report-only", "--jobs"):
            given.append(a)
        skip = a == "--jobs"
    command = " ".join(["python experiments/sero/run.py", *given])
    main_runs = {k: r for k, r in runs.items() if ":" not in k[0]}
    if not args.ablations:  # an ablation run reports its own table (its base and SERO arms included), never
        report(main_runs, folder, name, "SERO tiny experiment", command)  # a subset over the comparison's report
    shown = args.methods[:1] if args.ablations else args.methods  # the bases and SERO arms beside the extra runs
    extra = {k: r for k, r in runs.items() if k not in main_runs or k[0] in shown
             or k[0] in {f"{m}+sero" for m in shown}}
    if (args.ablations or args.matched) and len({lab for lab, _ in extra}) > 2:
        extra_name, title = ("ablations", "SERO ablations") if args.ablations else (
            "matched", "SERO interaction-matched baselines (§A.2: extra base updates for the branches' env steps)")
        report(extra, folder, f"pool_{extra_name}" if args.pool else extra_name, title, command)
    return 0


if __name__ == "__main__":
    sys.exit(main())
