"""``make demo``'s running commentary: a line per stage with its expected duration, progress within each, and an
ending that says what ran and what the numbers mean.

The demo (``python experiments/crbc/run.py --demo``) trains the pool setting's GiGPO run of seed 0
(:func:`experiments.crbc.run.demo_run`) in its own process. Its stages:

1. the supervised warm start, unless cached: the BFS oracle plays ``episodes`` training rooms, then ``steps``
   AdamW steps of next-token loss on its moves (:mod:`agentjax.train.warmstart`; progress every quarter of the
   episodes and every tenth of the steps, through :func:`warm_start_progress`);
2. the RL updates, one line each as the loop logs it (batch success, seconds);
3. the evaluations at updates 0, 4, …, 16 on the pool's rooms and on held-out rooms, one line each.

Expected durations are for 2 CPU cores (:data:`SECONDS`; 8 to 14 minutes in all, 5 or more of them for the warm
start); another CPU takes more or less.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Iterator

from agentjax.train.runconfig import RunConfig
from experiments.crbc.report import episode_gain

# seconds on 2 CPU cores (they vary by CPU, up to twice these): oracle episodes per 1,000, supervised steps per
# 1,000, an update (after the first two, which compile), one evaluation of both series
SECONDS = {"episodes": 4.0, "steps": 150.0, "update": 8.0, "first_updates": 30.0, "eval": 12.0}


def say(text: str) -> None:
    print(text, flush=True)


def _minutes(seconds: float) -> str:
    return f"about {seconds / 60:.0f} min" if seconds >= 90 else f"about {seconds:.0f} s"


def plan(run: RunConfig, cached: bool) -> str:
    """The stages of ``run`` with their expected durations (module docstring)."""
    ws, ro = run.warm_start, run.train.rollout
    method = run.train.credit.method
    evals = list(range(0, run.updates + 1, run.eval_every)) if run.eval_every else []
    if evals and evals[-1] != run.updates:
        evals.append(run.updates)
    if ws is None:
        warm = "[1/3] no warm start: RL starts from the random-init policy"
    elif cached:
        warm = f"[1/3] warm start: cached in {ws.cache_dir}, loaded in seconds"
    else:
        warm = (f"[1/3] warm start (once; cached in {ws.cache_dir} for every later run): the BFS oracle plays "
                f"{ws.episodes:,} training rooms ({_minutes(ws.episodes / 1000 * SECONDS['episodes'])}), then "
                f"{ws.steps:,} supervised AdamW steps on its moves "
                f"({_minutes(ws.steps / 1000 * SECONDS['steps'])})")
    first = min(run.updates, 2)
    update_s = first * SECONDS["first_updates"] + (run.updates - first) * SECONDS["update"]
    series = f"{run.eval_tasks * run.eval_seeds} episodes on the pool's rooms" + (
        f" and {run.held_out_tasks * run.eval_seeds} on held-out rooms" if run.held_out_tasks else "")
    total = update_s + len(evals) * SECONDS["eval"] + (0 if cached or ws is None else
                                                       ws.episodes / 1000 * SECONDS["episodes"]
                                                       + ws.steps / 1000 * SECONDS["steps"])
    return "\n".join([
        f"make demo: {method} on Sokoban 6x6, training seed {run.train.seed}, {_minutes(total)} in all on 2 CPU "
        "cores",
        warm,
        f"[2/3] RL: {run.updates} {method} updates of {ro.num_groups} rooms x {ro.group_size} rollouts "
        f"({_minutes(update_s)}: the first {first} compile, about {SECONDS['first_updates']:.0f} s each, then about "
        f"{SECONDS['update']:.0f} s each)",
        f"[3/3] evaluation at updates {', '.join(map(str, evals))}: {series} (about {SECONDS['eval']:.0f} s each, "
        "between the updates)",
    ])


@contextlib.contextmanager
def warm_start_progress() -> Iterator[None]:
    """Progress lines from the warm start built in this process: :func:`agentjax.train.warmstart.demonstrations`
    run a quarter of the rooms at a time (each room's episode is its own: the same demonstrations) and
    :func:`~agentjax.train.warmstart.supervised` with a callback every tenth of its steps (the same steps)."""
    from agentjax.train import warmstart

    demonstrations, supervised = warmstart.demonstrations, warmstart.supervised
    t0 = time.perf_counter()

    def demonstrations_with_progress(env, tasks, tokenizer, config):
        rows, chunk = [], max(len(tasks) // 4, 1)
        say(f"  warm start: the oracle plays {len(tasks):,} rooms")
        for i in range(0, len(tasks), chunk):
            rows += demonstrations(env, tasks[i:i + chunk], tokenizer, config)
            say(f"  warm start: {min(i + chunk, len(tasks)):,}/{len(tasks):,} oracle episodes, {len(rows):,} turns "
                f"({time.perf_counter() - t0:.0f} s)")
        return rows

    def supervised_with_progress(model, rows, ws, *args, **kwargs):
        start = time.perf_counter()

        def report(step, _model):
            say(f"  warm start: {step:,}/{ws.steps:,} supervised steps ({time.perf_counter() - start:.0f} s)")

        if kwargs.get("callback") is None:
            kwargs |= {"every": max(ws.steps // 10, 1), "callback": report}
        return supervised(model, rows, ws, *args, **kwargs)

    warmstart.demonstrations, warmstart.supervised = demonstrations_with_progress, supervised_with_progress
    try:
        yield
    finally:
        warmstart.demonstrations, warmstart.supervised = demonstrations, supervised


def _describe(line: dict, updates: int) -> list[str]:
    out = []
    step = int(line["step"])
    if "rollout/success_rate" in line:
        out.append(f"  update {step}/{updates}: batch success {line['rollout/success_rate']:.3f} "
                   f"({line.get('time/total', 0.0):.0f} s)")
    if "eval/success_rate" in line:
        held = (f", held-out rooms {line['held_out/success_rate']:.3f}" if "held_out/success_rate" in line else "")
        out.append(f"  eval at update {step}: the pool's rooms {line['eval/success_rate']:.3f}{held} "
                   f"({line.get('time/eval', 0.0):.0f} s)")
    return out


@contextlib.contextmanager
def update_progress(run: RunConfig, every: float = 0.5) -> Iterator[None]:
    """A line per update and per evaluation of ``run`` as its loop writes them to ``metrics.jsonl`` (read every
    ``every`` seconds from a thread; the lines already there when it starts are skipped)."""
    path = os.path.join(run.out_dir, "metrics.jsonl")
    seen = [sum(1 for _ in open(path)) if os.path.exists(path) else 0]
    stop = threading.Event()

    def poll() -> None:
        if not os.path.exists(path):
            return
        with open(path) as f:
            lines = [x for x in f.read().splitlines() if x.strip()]
        for text in lines[seen[0]:]:
            try:
                line = json.loads(text)
            except json.JSONDecodeError:  # a line being written: read it next time
                break
            seen[0] += 1
            for out in _describe(line, run.updates):
                say(out)

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


def ending(runs: dict[tuple[str, int], RunConfig], folder: str, name: str) -> list[str]:
    """The demo's closing lines: each run's paired gains on both series, and what they can and cannot say."""
    lines = []
    for (method, seed), run in runs.items():
        for series, where in (("", "the pool's rooms"), ("held_out", "held-out rooms")):
            if series and not run.held_out_tasks:
                continue
            g = episode_gain(run.out_dir, series)
            lines.append(f"{method} seed {seed}, {where}: eval success {g['success'][g['first']]:.3f} at update "
                         f"{g['first']} -> {g['success'][g['last']]:.3f} at update {g['last']}, gain "
                         f"{g['gain']:+.3f} ± {g['gain_se']:.3f} (paired over the {g['episodes']} episodes)")
    lines.append(
        "This was one training seed, so the table has no standard error over seeds; the paired gains above have one "
        "over episodes, and a gain under 2 of them is within noise. How much this run gains depends on the warm "
        "start it started from, and a warm start built on another CPU model is another policy (XLA's float rounding "
        "differs). The comparison over methods and seeds: python experiments/crbc/run.py --pool --jobs 2 "
        "(experiments/crbc/README.md).")
    return lines


__all__ = ["SECONDS", "ending", "plan", "update_progress", "warm_start_progress"]
