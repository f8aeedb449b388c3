"""The CRBC tiny experiment: methods × seeds of the ``tiny`` preset on Sokoban 6×6, then a results table and curves.

::

    python experiments/crbc/run.py                      # GRPO, RLOO, GiGPO, HGPO, GraphGPO, CRBC, PPO × seeds 0-2
    python experiments/crbc/run.py --jobs 2             # two runs at a time, in separate processes
    python experiments/crbc/run.py --methods grpo gigpo crbc --updates 30
    python experiments/crbc/run.py --pool --jobs 2 --methods grpo rloo gigpo hgpo graphgpo crbc
                                                        # the pool setting (below): results/pool_results.md
    python experiments/crbc/run.py --smoke              # 2 updates, 1 seed, small sizes: the pipeline end to end
    python experiments/crbc/run.py [--pool] --report-only   # rebuild the table and figure without training

Every run has the same budget (the tiny Sokoban preset: 20 updates × 16 groups × 8 rollouts × ≤ 15 turns, 2
optimizer steps an update at 5e-4; ``--updates`` changes it) and starts from the same supervised warm start on
oracle demonstrations (4,000 episodes, 2,000 AdamW steps; about 5 minutes on 2 cores, made once and cached in
``results/warmstart/``, identical for every method and seed; see :mod:`agentjax.train.warmstart`). Runs are made
seed by seed (every method's seed 0 first). Runs that already finished are not re-run (their ``metrics.jsonl``
reaches ``updates``); an interrupted run resumes from its checkpoint.

The pool setting (``--pool``, :func:`experiments.crbc.presets.pool_run`): the same warm start and batch shape,
trained on a fixed pool of the train split's first 16 rooms (each played once an update, AdamW 2e-3 x 4 steps, 16
updates) and evaluated on those rooms x 8 seeds and on 16 held-out ``valid`` rooms x 8 seeds at every eval point —
Procgen's train / test split in miniature: whether RL improves the policy where it trains, and what that does to
rooms it never sees. ``results/pool_results.md`` has both tables, ``results/pool_curves.png`` both curves.

The report (:func:`report`, :mod:`experiments.crbc.report`) reads each run's record — from its folder under
``results/runs/`` (not kept in git) where it has evaluations, else from the committed ``results/<name>_results.json``
— so ``--report-only`` rebuilds a table on a fresh clone, and seeds run here add to or replace the committed ones.
``results/<name>_results.md`` holds initial, final and best eval success (initial is the warm-started policy before
the first update, best is over the evaluations after updates), the gain final − initial, the paired difference to
GRPO on the same episodes and the training batches' success, as mean ± standard error over training seeds;
``results/<name>_curves.png`` the eval and training curves.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from agentjax.train.metrics import read_metrics  # noqa: E402
from agentjax.train.runconfig import RunConfig, run_from_dict  # noqa: E402
from experiments.crbc.presets import METHODS, RESULTS, SEEDS, pool_run, smoke_run, tiny_run  # noqa: E402
from experiments.crbc.report import gather, load_results, results_path, write_report  # noqa: E402


def finished(run: RunConfig) -> bool:
    path = os.path.join(run.out_dir, "metrics.jsonl")
    return os.path.exists(path) and any(line["step"] >= run.updates for line in read_metrics(path))


def run_one(run: RunConfig) -> dict:
    """Train ``run`` in this process (resuming if it has checkpoints); returns the summary without parameters."""
    from agentjax.train.trainer import CHECKPOINTS, train

    ckpt = os.path.join(run.out_dir, CHECKPOINTS)
    resume = os.path.isdir(ckpt) and any(n.isdigit() for n in os.listdir(ckpt))
    summary = train(run, resume=resume)
    summary.pop("params", None)
    return summary


BUSY = 75  # a --run-config child's exit status when another process trains its run folder (EX_TEMPFAIL)


def run_in_process(run: RunConfig) -> int:
    """Train ``run`` in a child process (``--run-config``); returns its exit status, 0 without a child where the
    run was finished or taken by another process since the queue was listed (two drivers share a queue)."""
    from agentjax.train.checkpoint import being_trained

    done = finished(run)
    if done or being_trained(run.out_dir):
        print(f"{run.out_dir}: {'done' if done else 'being trained'} by another process: left to it", flush=True)
        return 0
    os.makedirs(run.out_dir, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", suffix=".json", dir=run.out_dir, delete=False) as f:
        json.dump(run.to_dict(), f)
    log = open(os.path.join(run.out_dir, "stdout.log"), "a")  # noqa: SIM115
    try:
        code = subprocess.call([sys.executable, __file__, "--run-config", f.name], stdout=log, stderr=subprocess.STDOUT)
        if code == BUSY:  # another process took it between the check and the child's lock
            print(f"{run.out_dir}: being trained by another process: left to it", flush=True)
        return 0 if code == BUSY else code
    finally:
        log.close()
        os.remove(f.name)


def run_all(runs: dict[tuple[str, int], RunConfig], jobs: int) -> None:
    from agentjax.train.checkpoint import being_trained

    state = {k: "done" if finished(r) else "being trained by another process: left to it"
             if being_trained(r.out_dir) else "to run" for k, r in runs.items()}
    todo = {k: r for k, r in runs.items() if state[k] == "to run"}
    for (label, seed), run in runs.items():
        print(f"{label:>10} seed {seed}: {state[label, seed]} -> {run.out_dir}")
    if not todo:
        return
    shared = {r.warm_start.cache_dir for r in todo.values() if r.warm_start is not None}
    if jobs > 1 and shared:  # make the shared warm start once, before parallel runs race for it
        from agentjax.models import load_tokenizer
        from agentjax.train.warmstart import warm_start_folder

        first = next(iter(todo.values()))
        warm_start_folder(first, load_tokenizer(first.tokenizer))
    start = time.perf_counter()
    if jobs <= 1 and len(todo) == 1:  # one run: in this process, with its summary
        for (label, seed), run in todo.items():
            t0 = time.perf_counter()
            summary = run_one(run)
            print(f"{label} seed {seed}: {summary['step']} updates in {time.perf_counter() - t0:.0f} s "
                  f"({summary['seconds_per_update']:.1f} s/update), eval success "
                  f"{summary['last_eval'].get('success_rate', float('nan')):.3f}")
    else:  # each run in a child process, `jobs` at a time: one process training run after run exhausts its memory
        # maps (LLVM "Cannot allocate memory", then a segfault, after a few TextCraft-Synth runs)
        with ThreadPoolExecutor(max(jobs, 1)) as pool:
            codes = dict(zip(todo, pool.map(run_in_process, todo.values()), strict=True))
        failed = {k: c for k, c in codes.items() if c}
        if failed:
            raise SystemExit(f"runs failed (see their stdout.log): {failed}")
    print(f"all runs: {time.perf_counter() - start:.0f} s")


# -- the report ----------------------------------------------------------------------------------------------------
def setting(run: RunConfig) -> str:
    """The training and evaluation setting of ``run`` in words (the reports' headers; the SERO report's too)."""
    ro, episodes = run.train.rollout, f"{run.eval_tasks * run.eval_seeds} episodes"
    if run.train_pool:
        return (f"the pool setting: trained on the `{run.spec.train_split}` split's first {run.train_pool} rooms, "
                f"{ro.num_groups} groups x {ro.group_size} rollouts an update, {run.updates} updates, AdamW "
                f"{run.train.optimizer.learning_rate:g} x {run.train.mini_batches} steps an update; eval: those "
                f"{run.eval_tasks} rooms x {run.eval_seeds} seeds = {episodes}")
    tasks = "rooms" if run.env == "sokoban" else "tasks"
    return (f"{ro.num_groups} groups x {ro.group_size} rollouts, {run.updates} updates; eval: first "
            f"{run.eval_tasks} `{run.evaluation_split}` {tasks} x {run.eval_seeds} seeds = {episodes}")


def report(runs: dict[tuple[str, int], RunConfig], results: str, name: str = "tiny") -> dict:
    """Write ``<name>_results.md`` / ``.json`` and ``<name>_curves.png`` in ``results`` from the runs' records
    (:func:`experiments.crbc.report.gather`: each run's folder, else the committed ``<name>_results.json``; eval
    success ± SE over seeds, gains, paired differences, updates to threshold)."""
    some = next(iter(runs.values()))
    path = results_path(results, name)
    records = gather(runs, path)
    flag = {"smoke": " --smoke", "pool": " --pool"}.get(name, "")
    methods = list(dict.fromkeys(m for m, _ in records)) or list(load_results(path).get("results", {}))
    if methods != list(METHODS):
        flag += " --methods " + " ".join(methods)
    command = f"python experiments/crbc/run.py{flag}"
    common = ("the same episodes and sampling streams at every eval point and for every method of a seed)\n\n"
              "Mean ± standard error over training seeds; \"(noise)\" marks |mean| < 2 SE. Made by "
              f"`{command}`; `{command} --report-only` rebuilds this table from `{name}_results.json`.\n\n")
    header = (f"# CRBC tiny experiment: Sokoban 6x6, {some.train.model.arch.name}, `{some.collect.prompt}` prompts "
              f"({setting(some)}, " + common)
    return write_report(records, results, name, header, config=some.to_dict(), same_start=True,
                        **held_out_report(some))


def held_out_report(run: RunConfig) -> dict:
    """:func:`~experiments.crbc.report.write_report`'s arguments for ``run``'s held-out series (none without one):
    the second table's header and the curves' title (the CRBC and SERO reports)."""
    if not run.held_out_tasks:
        return {}
    header = (f"## The same runs on {run.held_out_tasks} held-out `{run.spec.eval_split}` rooms x {run.eval_seeds} "
              f"seeds ({run.held_out_tasks * run.eval_seeds} episodes, never trained on; 'train success' repeats the "
              "pool's)\n\n")
    return {"held_out_header": header, "title": "eval success (the training pool's rooms, ± SE over seeds)"}


def compile_cache(results: str) -> None:
    """JAX's persistent compilation cache under ``results/runs/.jax_cache``: the runs of an experiment (and the
    children of ``--jobs``) compile the same sampler and update programs, so every run after the first loads them
    instead of compiling (minutes per run on 2 CPU cores)."""
    import jax

    jax.config.update("jax_compilation_cache_dir", os.path.join(results, "runs", ".jax_cache"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--methods", nargs="+", default=list(METHODS))
    parser.add_argument("--seeds", nargs="+", type=int, default=list(SEEDS))
    parser.add_argument("--updates", type=int, help="override the preset's number of updates")
    parser.add_argument("--jobs", type=int, default=1, help="runs at a time (separate processes)")
    parser.add_argument("--smoke", action="store_true", help="2 updates, seed 0 only, small sizes")
    parser.add_argument("--pool", action="store_true",
                        help="the pool setting (presets.pool_run): train and evaluate on a fixed pool of rooms, "
                             "held-out rooms evaluated beside")
    parser.add_argument("--results", default=RESULTS, help="folder of the table, figure and runs")
    parser.add_argument("--report-only", action="store_true")
    parser.add_argument("--dry-run", action="store_true", help="list the runs and stop")
    parser.add_argument("--run-config", help=argparse.SUPPRESS)  # the child of --jobs > 1
    args = parser.parse_args(argv)
    compile_cache(args.results)
    if args.run_config:
        from agentjax.train.checkpoint import RunFolderBusy

        with open(args.run_config) as f:
            try:
                run_one(run_from_dict(json.load(f)))
            except RunFolderBusy as e:
                print(e, flush=True)
                return BUSY
        return 0
    if args.smoke:
        seeds = args.seeds if args.seeds != list(SEEDS) else [0]
        runs = {(m, s): smoke_run(m, s, results=args.results) for m in args.methods for s in seeds}
    else:
        make = pool_run if args.pool else tiny_run
        runs = {(m, s): make(m, s, results=args.results, updates=args.updates) for s in args.seeds
                for m in args.methods}  # seed by seed: every method has its seed 0 before any seed 1
    if args.dry_run:
        for (m, s), run in runs.items():
            print(f"{m} seed {s}: {run.updates} updates -> {run.out_dir}")
        return 0
    if not args.report_only:
        run_all(runs, args.jobs)
    # the smoke report goes beside its runs (not kept in git), the tables into results/
    folder = os.path.join(args.results, "runs", "smoke") if args.smoke \
        else args.results
    name = "smoke" if args.smoke else "pool" if args.pool else "tiny"
    report(runs, folder, name)
    print(explain(runs, folder, name, smoke=args.smoke))
    return 0


def explain(runs: dict[tuple[str, int], RunConfig], folder: str, name: str, *, smoke: bool) -> str:
    """What a reader of the table needs to know: what ran, what the numbers mean, where the files are."""
    some = next(iter(runs.values()))
    ro, ws = some.train.rollout, some.warm_start
    lines = [
        "",
        "What ran: " + ", ".join(sorted({m for m, _ in runs})) + f" on Sokoban 6x6 ({some.collect.prompt} prompts), "
        f"{some.updates} updates of {ro.num_groups} rooms x {ro.group_size} rollouts (<= {ro.max_steps} moves each), "
        f"from one shared supervised warm start ({ws.episodes} oracle episodes, {ws.steps} steps)"
        if ws else "What ran: " + ", ".join(sorted({m for m, _ in runs})) + " from random init",
        (f"The numbers: success rate on the {some.eval_tasks} rooms of the training pool (the only rooms it trains "
         f"on) x {some.eval_seeds} sampled seeds, and below on {some.held_out_tasks} held-out rooms it never trains "
         "on, "
         if some.train_pool else
         f"The numbers: success rate on {some.eval_tasks} held-out rooms x {some.eval_seeds} sampled seeds, ") +
        "before the first update (initial), after the last (final) and the best evaluation; ± is the standard error "
        "over training seeds (with one seed: none). Every evaluation of a seed plays the same episodes with the same "
        "random numbers, so a difference between evaluations is the policy's change, not sampling noise.",
        f"Files: the table {os.path.join(folder, name + '_results.md')} (and .json), the curves "
        f"{os.path.join(folder, name + '_curves.png')}, each run's metrics.jsonl, eval/<update>.json and "
        f"TensorBoard logs under {os.path.dirname(os.path.dirname(some.out_dir))}/<method>/<seed>/.",
    ]
    if smoke:
        lines.append("This was the smoke size (a minute or two: a 4-episode warm start and 2 updates, so the policy "
                     "is nearly untrained and success near 0 is expected): it checks the pipeline end to end. "
                     "The tiny experiment itself: python experiments/crbc/run.py --jobs 2 "
                     "(experiments/crbc/README.md).")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
