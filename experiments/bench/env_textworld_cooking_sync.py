"""Benchmark: TextWorld-Sync on tw-cooking (envs/textworld_cooking_sync): steps/s, the planner oracle over the whole
manifest, team play, the TextWorld check.

Throughput. Episodes of the valid split (``quick``: a sample): the single-agent planner's commands with a few invalid
commands mixed in, replayed through

- *raw*: the rules alone (``rules.execute`` on the ``WorldState``: parse, apply, score);
- *world*: ``World.step`` (the lock, the agent's budget, history and the commit log);
- *env*: ``TextWorldCookingSyncEnv.step`` (the Obs: feedback, anchor, admissible commands), and without admissible
  lists.

Only the step calls are timed; each figure is the median of ``repeats`` passes. Absolute times on a shared 2-core
machine are noisy; quote the ratios.

Oracle. The single-agent planner's whole plan from the start of every manifest task (train 1,500, valid 200,
test 1,400; ``quick``: every 10th), executed through ``World.step``: success (every dish eaten), plan length against
the task's step limit, per split, difficulty and family. Then ``TextWorldCookingSyncEnv.oracle`` step by step
(re-planning, plan cache, Obs) on the valid split (``quick``: a sample).

Teams. ``TeamOracle`` with 2 and 3 agents, one shared inventory and per-agent inventories, on the valid split
(``quick``: a sample): success, the makespan (rounds of one command per agent) and its speed-up over the single
agent's plan length.

Cross-check. tw-cooking games generated with TextWorld (``twcheck.cooking_game``; settings cycle through
``--recipe 1..4 --take = recipe --go 1/6/9/12 --open --cook --cut``): each game's walkthrough and random walks through
TextWorld's logic engine and the equivalent Sync world (admissible lists, executability, score, won, lost at every
step), and for some games the compiled Inform 7 game's feedback texts (``twcheck.compare_text``).

``run(quick=False) -> dict``; as a script it prints tables and writes
``experiments/bench/results/textworld_cooking_sync.json``::

    python experiments/bench/env_textworld_cooking_sync.py [--quick]
"""

from __future__ import annotations

import argparse
import collections
import copy
import json
import pathlib
import platform
import statistics
import sys
import tempfile
import time
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from envs.base import Task  # noqa: E402
from envs.textworld_cooking_sync import (  # noqa: E402
    DIFFICULTIES,
    FAMILIES,
    SPLIT_SIZES,
    TeamOracle,
    TextWorldCookingSyncEnv,
    World,
    assign,
    plan,
    rules,
    twcheck,
    world_state,
)
from envs.textworld_cooking_sync.env import ROOT as ROOT_AGENT  # noqa: E402

RESULTS = pathlib.Path(__file__).resolve().parent / "results" / "textworld_cooking_sync.json"
INVALID = ["jump", "take the moon", "cook knife with stove", "go up"]


def fresh(task: Task, shared: bool | None = None) -> World:
    world = World(world_state(task, shared))
    world.add_agent(ROOT_AGENT)
    return world


# -- throughput --------------------------------------------------------------------------------------------------------
def episodes(tasks: list[Task]) -> list[tuple[Task, list[str]]]:
    out = []
    for task in tasks:
        commands = plan(fresh(task).snapshot(), ROOT_AGENT)
        body = commands[:-1]
        for k, bad in enumerate(INVALID):
            body.insert(min(len(body), k * max(1, len(body) // len(INVALID))), bad)
        out.append((task, body + commands[-1:]))
    return out


def _raw(eps) -> tuple[float, int]:
    total, steps = 0.0, 0
    for task, commands in eps:
        state = fresh(task).snapshot()
        t0 = time.perf_counter()
        for c in commands:
            rules.execute(state, ROOT_AGENT, c)
        total += time.perf_counter() - t0
        steps += len(commands)
    return total, steps


def _world(eps) -> tuple[float, int]:
    total, steps = 0.0, 0
    for task, commands in eps:
        world = fresh(task)
        t0 = time.perf_counter()
        for c in commands:
            world.step(ROOT_AGENT, c)
        total += time.perf_counter() - t0
        steps += len(commands)
    return total, steps


def _env(eps, admissible: bool) -> tuple[float, int]:
    env = TextWorldCookingSyncEnv(max_steps=10_000, admissible=admissible)
    total, steps = 0.0, 0
    for task, commands in eps:
        env.reset(task)
        t0 = time.perf_counter()
        for c in commands:
            env.step(c)
        total += time.perf_counter() - t0
        steps += len(commands)
    return total, steps


def throughput(tasks: list[Task], repeats: int) -> list[dict[str, Any]]:
    eps = episodes(tasks)
    variants = {
        "raw (rules.execute)": _raw,
        "World.step": _world,
        "Env.step (admissible)": lambda e: _env(e, True),
        "Env.step (no admissible)": lambda e: _env(e, False),
    }
    rows, raw = [], None
    for name, fn in variants.items():
        timings = [fn(eps) for _ in range(repeats)]
        seconds = statistics.median(t for t, _ in timings)
        steps = timings[0][1]
        raw = raw or seconds
        rows.append(
            dict(
                variant=name,
                episodes=len(eps),
                steps=steps,
                seconds=seconds,
                steps_per_s=steps / seconds,
                ratio_to_raw=seconds / raw,
            )
        )
    return rows


# -- the oracle over the manifest --------------------------------------------------------------------------------------
def oracle_manifest(every: int = 1) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Every task's (every ``every``-th task's) whole single-agent plan, executed; returns (rows, failures)."""
    rows, failures = [], []
    for split in SPLIT_SIZES:
        for task in TextWorldCookingSyncEnv.tasks(split)[::every]:
            t0 = time.perf_counter()
            world, error = fresh(task), None
            try:
                commands = plan(world.snapshot(), ROOT_AGENT)
                for c in commands:
                    if not world.step(ROOT_AGENT, c).valid:
                        error = f"invalid planned command {c!r}"
                        break
            except Exception as e:  # recorded, not raised: the benchmark counts failures
                commands, error = [], repr(e)
            row = dict(
                split=split,
                task_id=task.task_id,
                family=task.meta["family"],
                difficulty=task.meta["difficulty"],
                won=world.won and error is None,
                plan_len=len(commands),
                max_steps=task.meta["max_steps"],
                seconds=time.perf_counter() - t0,
            )
            rows.append(row)
            if not row["won"] or row["plan_len"] > row["max_steps"]:
                failures.append({**row, "error": error})
    return rows, failures


def summarise(rows: list[dict[str, Any]], keys: tuple[str, ...]) -> list[dict[str, Any]]:
    groups: dict[tuple, list[dict[str, Any]]] = collections.defaultdict(list)
    for r in rows:
        groups[tuple(r[k] for k in keys)].append(r)
    out = []
    for key, rs in groups.items():
        lengths = [r["plan_len"] for r in rs]
        out.append(
            dict(
                zip(keys, key, strict=True),
                tasks=len(rs),
                success=sum(r["won"] for r in rs) / len(rs),
                within_limit=sum(r["won"] and r["plan_len"] <= r["max_steps"] for r in rs) / len(rs),
                mean_plan=statistics.fmean(lengths),
                max_plan=max(lengths),
                step_limit=rs[0]["max_steps"],
            )
        )
    order = {d: i for i, d in enumerate(DIFFICULTIES)} | {f: i for i, f in enumerate(FAMILIES)}
    order |= {s: i for i, s in enumerate(SPLIT_SIZES)}
    return sorted(out, key=lambda r: tuple(order.get(r[k], 0) for k in keys))


def env_oracle(tasks: list[Task]) -> dict[str, Any]:
    """``TextWorldCookingSyncEnv.oracle`` step by step: success within the task's step limit, commands always
    admissible."""
    env, won, not_admissible, steps, t0 = TextWorldCookingSyncEnv(), 0, 0, 0, time.perf_counter()
    for task in tasks:
        obs = env.reset(task)
        info = {"won": False}
        while not env.done:
            action = env.oracle()
            not_admissible += action not in obs.admissible
            obs, _, _, info = env.step(action)
        won += info["won"]
        steps += env.steps
    return dict(
        tasks=len(tasks),
        success=won / len(tasks),
        mean_steps=steps / len(tasks),
        oracle_not_admissible=not_admissible,
        seconds=time.perf_counter() - t0,
    )


# -- teams -------------------------------------------------------------------------------------------------------------
def teams(tasks: list[Task]) -> list[dict[str, Any]]:
    rows = []
    for n_agents in (2, 3):
        for shared in (True, False):
            won, rounds, speedups, t0 = 0, [], [], time.perf_counter()
            for task in tasks:
                world = World(world_state(task, shared))
                agents = [f"agent{k}" for k in range(n_agents)]
                for a in agents:
                    world.add_agent(a)
                single = len(plan(world.snapshot(), agents[0]))
                r = TeamOracle(world, assign(world.snapshot(), agents)).run(max_rounds=400)
                won += world.won
                if world.won:
                    rounds.append(r)
                    speedups.append(single / r)
            rows.append(
                dict(
                    agents=n_agents,
                    inventory="shared" if shared else "per-agent",
                    tasks=len(tasks),
                    success=won / len(tasks),
                    mean_makespan=statistics.fmean(rounds) if rounds else None,
                    mean_speedup=statistics.fmean(speedups) if speedups else None,
                    seconds=time.perf_counter() - t0,
                )
            )
    return rows


# -- the cross-check against TextWorld ---------------------------------------------------------------------------------
def crosscheck(n_games: int, n_text: int) -> dict[str, Any]:
    settings = [
        dict(recipe=2, take=2, go=6),
        dict(recipe=3, take=3, go=9),
        dict(recipe=4, take=4, go=12),
        dict(recipe=1, take=1, go=1),
    ]
    games, verbs, text_verbs, mismatches = [], set(), set(), []
    steps = text_steps = 0
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(n_games):
            s = settings[k % len(settings)]
            game = twcheck.cooking_game(100 + k, **s)
            walkthrough = game.metadata["walkthrough"]
            reports = [twcheck.compare(game)] + [
                twcheck.compare(game, walkthrough[: len(walkthrough) * j // 3], random_steps=40, seed=j)
                for j in range(3)
            ]
            row = dict(
                seed=100 + k,
                **s,
                walkthrough_len=len(walkthrough),
                walkthrough_won=reports[0].won,
                max_score=reports[0].max_score,
                steps=sum(r.steps for r in reports),
                mismatches=sum(len(r.mismatches) for r in reports),
            )
            for r in reports:
                verbs |= r.verbs
                mismatches += r.mismatches
            steps += row["steps"]
            if k < n_text:
                story = twcheck.compile_game(game, f"{tmp}/game{k}.z8")
                text = [twcheck.compare_text(game, story)] + [
                    twcheck.compare_text(game, story, walkthrough[: len(walkthrough) // 2], random_steps=40, seed=j)
                    for j in range(2)
                ]
                row["text_steps"] = sum(r.steps for r in text)
                row["text_mismatches"] = sum(len(r.mismatches) for r in text)
                for r in text:
                    text_verbs |= r.verbs
                    mismatches += r.mismatches
                text_steps += row["text_steps"]
            games.append(row)
    return dict(
        games=games,
        steps=steps,
        text_steps=text_steps,
        verbs=sorted(verbs),
        text_verbs=sorted(text_verbs),
        mismatches=mismatches[:50],
        n_mismatches=len(mismatches),
        walkthroughs_won=sum(g["walkthrough_won"] == (True, True) for g in games),
        seconds=time.perf_counter() - t0,
    )


# -- run ---------------------------------------------------------------------------------------------------------------
def run(quick: bool = False) -> dict[str, Any]:
    valid = TextWorldCookingSyncEnv.tasks("valid")
    t0 = time.perf_counter()
    result: dict[str, Any] = dict(quick=quick, machine=platform.platform(), python=platform.python_version())
    result["throughput"] = throughput(valid[::8] if quick else valid, 1 if quick else 3)
    rows, failures = oracle_manifest(10 if quick else 1)
    result["oracle_manifest"] = dict(
        tasks=len(rows),
        success=sum(r["won"] for r in rows) / len(rows),
        within_limit=sum(r["won"] and r["plan_len"] <= r["max_steps"] for r in rows) / len(rows),
        seconds=sum(r["seconds"] for r in rows),
        failures=failures[:50],
        n_failures=len(failures),
        by_split_difficulty=summarise(rows, ("split", "difficulty")),
        by_family_difficulty=summarise(rows, ("family", "difficulty")),
        by_split_family_difficulty=summarise(rows, ("split", "family", "difficulty")),
    )
    result["env_oracle"] = env_oracle(valid[::10] if quick else valid)
    result["teams"] = teams(valid[::29] if quick else valid)
    result["crosscheck"] = crosscheck(2, 1) if quick else crosscheck(12, 4)
    result["seconds"] = time.perf_counter() - t0
    return result


def print_tables(result: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=140)
    table = Table(title="TextWorld-Sync on tw-cooking steps/s (median, steps only)")
    for col in ("variant", "episodes", "steps", "s", "steps/s", "x raw"):
        table.add_column(col, justify="left" if col == "variant" else "right")
    for r in result["throughput"]:
        table.add_row(
            r["variant"],
            str(r["episodes"]),
            str(r["steps"]),
            f"{r['seconds']:.3f}",
            f"{r['steps_per_s']:.0f}",
            f"{r['ratio_to_raw']:.2f}",
        )
    console.print(table)

    m = result["oracle_manifest"]
    table = Table(
        title=f"planner oracle over the manifest ({m['tasks']} tasks): success "
        f"{100 * m['success']:.2f}%, within the step limit {100 * m['within_limit']:.2f}%"
    )
    for col in ("split", "difficulty", "tasks", "success", "within limit", "mean plan", "max plan", "limit"):
        table.add_column(col, justify="left" if col in ("split", "difficulty") else "right")
    for r in m["by_split_difficulty"]:
        table.add_row(
            r["split"],
            r["difficulty"],
            str(r["tasks"]),
            f"{100 * r['success']:.1f}%",
            f"{100 * r['within_limit']:.1f}%",
            f"{r['mean_plan']:.1f}",
            str(r["max_plan"]),
            str(r["step_limit"]),
        )
    console.print(table)
    table = Table(title="planner oracle by family (all splits): success % / mean plan length")
    table.add_column("family")
    for d in DIFFICULTIES:
        table.add_column(d, justify="right")
    cells = {(r["family"], r["difficulty"]): r for r in m["by_family_difficulty"]}
    for f in FAMILIES:
        table.add_row(
            f,
            *[
                f"{100 * cells[f, d]['success']:.0f}% / {cells[f, d]['mean_plan']:.0f}" if (f, d) in cells else "-"
                for d in DIFFICULTIES
            ],
        )
    console.print(table)

    e = result["env_oracle"]
    console.print(
        f"Env.oracle step by step on {e['tasks']} valid tasks: success {100 * e['success']:.1f}%, "
        f"mean steps {e['mean_steps']:.1f}, oracle commands not admissible: {e['oracle_not_admissible']}"
    )
    table = Table(title="team oracle (valid split)")
    for col in ("agents", "inventory", "tasks", "success", "makespan", "speed-up vs 1 agent"):
        table.add_column(col, justify="right")
    for r in result["teams"]:
        table.add_row(
            str(r["agents"]),
            r["inventory"],
            str(r["tasks"]),
            f"{100 * r['success']:.1f}%",
            "-" if r["mean_makespan"] is None else f"{r['mean_makespan']:.1f}",
            "-" if r["mean_speedup"] is None else f"{r['mean_speedup']:.2f}x",
        )
    console.print(table)
    c = result["crosscheck"]
    console.print(
        f"cross-check vs TextWorld: {len(c['games'])} games, walkthroughs won in both "
        f"{c['walkthroughs_won']}/{len(c['games'])}, {c['steps']} logic-engine steps and {c['text_steps']} "
        f"compiled-game steps compared, mismatches {c['n_mismatches']}; commands {', '.join(c['verbs'])}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="samples instead of the valid split, two TextWorld games")
    parser.add_argument("--out", type=pathlib.Path, default=RESULTS)
    args = parser.parse_args()
    result = run(quick=args.quick)
    print_tables(result)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(copy.deepcopy(result), indent=1, default=str))
    print(f"wrote {args.out} ({result['seconds']:.0f} s)")


if __name__ == "__main__":
    main()
