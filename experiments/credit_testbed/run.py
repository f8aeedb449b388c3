"""The credit-testbed comparison: every arm × seed on the pre-registered settings, then one table and one figure per
setting (``README.md``, "The comparison").

::

    python experiments/credit_testbed/run.py --jobs 2            # everything (presets.ARMS x presets.SEEDS)
    python experiments/credit_testbed/run.py --settings s2 --arms grpo crbc --seeds 0 1
    python experiments/credit_testbed/run.py --report-only       # the tables and figures from results/*.json
    python experiments/credit_testbed/run.py --quick             # s2, GRPO and CRBC, seed 0, 4 updates: the pipeline
    python experiments/credit_testbed/run.py --dry-run           # list the runs and their state

Resumable: a run whose ``metrics.jsonl`` reaches its last update and whose final sampled check
(``eval_<update>.json``) is there is skipped; a run without its check gets only the check; any other starts
again (a run keeps one checkpoint, after its last update). Runs go to ``runs/<setting>/<arm>/seed<seed>/``
(git-ignored). ``--jobs`` child processes at a time (``--run-configs``), each training the unfinished arms of one
setting and seed one after the other (a partial comparison has whole seeds; the runs of a process share its
compiled programs), logged to ``runs/logs/<setting>-seed<seed>.log``; the processes share JAX's persistent
compilation cache (``runs/.jax_cache``), so a program compiles once for the whole comparison.

The report (:mod:`experiments.credit_testbed.report`) reads each run's record from its folder, else from the
committed ``results/<setting>_results.json``, so ``--report-only`` rebuilds every table from git alone.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from agentjax.train.metrics import read_metrics  # noqa: E402
from agentjax.train.runconfig import RunConfig, run_from_dict  # noqa: E402
from experiments.credit_testbed.presets import (  # noqa: E402
    ARMS,
    CHECK_SEEDS,
    RESULTS,
    RUNS,
    SEEDS,
    SETTINGS,
    arm_run,
    comparison,
)

Key = tuple[str, str, int]  # (setting, arm label, seed)
QUICK = dict(settings=("s2",), arms=("grpo", "crbc"), seeds=(0,), updates=4, eval_every=2)


def check_path(run: RunConfig) -> str:
    """The final sampled check of ``run``: ``<out_dir>/eval_<updates>.json`` (``agentjax.train.offline``'s
    ``evaluate_checkpoint``)."""
    return os.path.join(run.out_dir, f"eval_{run.updates}.json")


def trained(run: RunConfig) -> bool:
    path = os.path.join(run.out_dir, "metrics.jsonl")
    return os.path.exists(path) and any(line["step"] >= run.updates for line in read_metrics(path))


def finished(run: RunConfig, check: bool = True) -> bool:
    """Trained to its last update, with its final sampled check (where ``check``)."""
    return trained(run) and (not check or os.path.exists(check_path(run)))


def compile_cache(runs: str = RUNS) -> None:
    """JAX's persistent compilation cache under ``runs/.jax_cache``, shared by every run and child process."""
    import jax

    jax.config.update("jax_compilation_cache_dir", os.path.join(runs, ".jax_cache"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)


def run_one(run: RunConfig, check: bool = True) -> dict | None:
    """Train ``run`` in this process unless it is trained (resuming from its checkpoint if it has one), then, where
    ``check``, its final sampled check: the last checkpoint on the pool's MDPs × :data:`CHECK_SEEDS` sampled
    episodes, beside the exact success of the same policy. Returns the check."""
    from agentjax.train import evaluate_checkpoint, train

    if not trained(run):
        train(run, resume=True)  # from its checkpoint where it has one, else from the start
    return evaluate_checkpoint(run.out_dir, step=run.updates, seeds=CHECK_SEEDS) if check else None


DONE = "credit_testbed: run done:"  # a child's line after each run (the parent's progress reads it)


def run_many(runs: list[RunConfig], check: bool = True) -> int:
    """Train ``runs`` one after the other in this process (:func:`run_one`; the jitted programs they share compile
    or load once); a run another process is training is left to it, a run that fails is reported and the next one
    goes on. Returns the number of failed runs."""
    import traceback

    from agentjax.train.checkpoint import RunFolderBusy

    failed = 0
    for run in runs:
        t0 = time.perf_counter()
        try:
            run_one(run, check)
            state = "ok"
        except RunFolderBusy as e:
            state = f"left to another process ({e})"
        except Exception:  # one run's failure must not end the others of the batch
            traceback.print_exc()
            failed += 1
            state = "FAILED"
        print(f"{DONE} {run.out_dir} {state} {time.perf_counter() - t0:.0f}", flush=True)
    return failed


def run_in_process(runs: list[RunConfig], log_path: str, check: bool = True,
                   on_done: Callable[[str, str, float], None] | None = None) -> int:
    """Train ``runs`` in one child process (``--run-configs``), its output appended to ``log_path``; calls
    ``on_done(out_dir, state, seconds)`` as each run ends. Returns the child's exit status (the failed runs)."""
    folder = os.path.dirname(log_path)
    os.makedirs(folder, exist_ok=True)
    paths = []
    for run in runs:
        with tempfile.NamedTemporaryFile("w", suffix=".json", dir=folder, delete=False) as f:
            json.dump(run.to_dict(), f)
        paths.append(f.name)
    try:
        with open(log_path, "a") as log:
            child = subprocess.Popen([sys.executable, __file__, "--run-configs", *paths] +
                                     ([] if check else ["--no-check"]), stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
            for line in child.stdout:
                log.write(line)
                log.flush()
                if line.startswith(DONE) and on_done is not None:
                    out_dir, rest = line[len(DONE):].split(maxsplit=1)
                    state, seconds = rest.rsplit(maxsplit=1)
                    on_done(out_dir, state, float(seconds))
            return child.wait()
    finally:
        for path in paths:
            os.remove(path)


def describe(key: Key) -> str:
    setting, label, seed = key
    return f"{setting} {label:>18} seed {seed}"


def run_all(runs: Mapping[Key, RunConfig], jobs: int, check: bool = True, logs: str | None = None,
            even: bool = False) -> None:
    """Run what is not finished, ``jobs`` processes at a time, each process the unfinished arms of one setting and
    seed (so that a partial comparison has whole seeds; ``even``: instead exactly ``jobs`` processes, the runs dealt
    out in turn, for a short set of runs that should not wait on one process), a line as each run ends; logs in
    ``logs`` (default: a ``logs`` folder beside the run folders)."""
    from agentjax.train.checkpoint import being_trained

    todo = {k: r for k, r in runs.items() if not finished(r, check) and not being_trained(r.out_dir)}
    print(f"{len(runs) - len(todo)} of {len(runs)} runs finished or being trained elsewhere; {len(todo)} to run, "
          f"{jobs} processes at a time", flush=True)
    if not todo:
        return
    batches: dict[str, list[Key]] = {}
    for i, key in enumerate(todo):
        batches.setdefault(f"part{i % max(jobs, 1)}" if even else f"{key[0]}-seed{key[2]}", []).append(key)
    logs = logs or os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(next(iter(todo.values())).out_dir))),
                                "logs")
    start = time.perf_counter()
    key_of = {r.out_dir: k for k, r in todo.items()}
    done: list[Key] = []
    lock = threading.Lock()

    def on_done(out_dir: str, state: str, seconds: float) -> None:
        with lock:
            done.append(key_of.get(out_dir, ("?", out_dir, -1)))
            print(f"[{len(done)}/{len(todo)}] {describe(done[-1])}: {state} in {seconds:.0f} s "
                  f"({(time.perf_counter() - start) / 60:.1f} min in all)", flush=True)

    def batch(item: tuple[str, list[Key]]) -> int:
        name, keys = item
        return run_in_process([todo[k] for k in keys], os.path.join(logs, f"{name}.log"), check, on_done)

    with ThreadPoolExecutor(max(jobs, 1)) as pool:
        codes = list(pool.map(batch, batches.items()))
    failed = [describe(k) for k in todo if not finished(todo[k], check)]
    if failed or any(codes):
        raise SystemExit(f"runs not finished (see {logs}/): {failed}")


def select(settings: tuple[str, ...], arms: tuple[str, ...] | None, seeds: tuple[int, ...], *, runs: str,
           **sizes: int) -> dict[Key, RunConfig]:
    """The runs of the chosen settings, arms (default: each setting's :data:`ARMS`) and seeds, seed by seed."""
    if arms is None:
        return comparison(settings, seeds, runs=runs, **sizes)
    return {(s, a, seed): arm_run(s, a, seed, runs=runs, **sizes) for seed in seeds for s in settings for a in arms}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--settings", nargs="+", choices=SETTINGS, default=list(SETTINGS))
    parser.add_argument("--arms", nargs="+", help="arm labels (default: each setting's presets.ARMS), e.g. grpo "
                        "crbc graphgpo+sero graphgpo+sero-root graphgpo+sero-flat")
    parser.add_argument("--seeds", nargs="+", type=int, default=list(SEEDS))
    parser.add_argument("--jobs", type=int, default=1, help="runs at a time (separate processes)")
    parser.add_argument("--quick", action="store_true", help="s2, GRPO and CRBC, seed 0, 4 updates, into "
                        "runs/quick/ with its report beside (the pipeline end to end, a minute or two)")
    parser.add_argument("--report-only", action="store_true", help="rebuild the tables and figures, train nothing")
    parser.add_argument("--dry-run", action="store_true", help="list the runs and their state, and stop")
    parser.add_argument("--results", default=RESULTS, help="folder of the tables, figures and results JSON")
    parser.add_argument("--runs", default=RUNS, help="folder of the run folders")
    parser.add_argument("--run-configs", nargs="+", help=argparse.SUPPRESS)  # a child of run_in_process
    parser.add_argument("--no-check", action="store_true", help=argparse.SUPPRESS)  # the child skips the check
    args = parser.parse_args(argv)
    compile_cache(args.runs)
    if args.run_configs:
        runs = []
        for path in args.run_configs:
            with open(path) as f:
                runs.append(run_from_dict(json.load(f)))
        return min(run_many(runs, check=not args.no_check), 100)
    sizes: dict[str, int] = {}
    settings, arms, seeds = tuple(args.settings), tuple(args.arms) if args.arms else None, tuple(args.seeds)
    runs_dir, results = args.runs, args.results
    if args.quick:
        settings, arms, seeds = QUICK["settings"], arms or QUICK["arms"], QUICK["seeds"]
        sizes = dict(updates=QUICK["updates"], eval_every=QUICK["eval_every"])
        runs_dir = os.path.join(args.runs, "quick")
        results = runs_dir if args.results == RESULTS else args.results
    runs = select(settings, arms, seeds, runs=runs_dir, **sizes)
    if args.dry_run:
        for key, run in runs.items():
            state = "finished" if finished(run) else "trained, check missing" if trained(run) else "to run"
            print(f"{describe(key)}: {run.updates} updates, {state} -> {run.out_dir}")
        return 0
    if not args.report_only:
        run_all(runs, args.jobs)
    from experiments.credit_testbed.report import report

    for setting in settings:
        command = "python experiments/credit_testbed/run.py " + ("--quick" if args.quick else f"--settings {setting}")
        report({k[1:]: r for k, r in runs.items() if k[0] == setting}, setting, results, command=command)
    return 0


__all__ = ["ARMS", "check_path", "finished", "main", "run_all", "run_one", "select", "trained"]

if __name__ == "__main__":
    sys.exit(main())
