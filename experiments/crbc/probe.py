"""One tiny Sokoban run with the RL step changed: the probes behind the tiny preset's step and the pool setting.

The run is ``experiments/crbc/presets.py``'s ``tiny_run`` (the shared warm start, the same 128 eval episodes and
sampling streams at every eval point) with the learning rate and the optimizer steps per update set here (and
optionally the batch shape, the policy's size or the warm start's length), written to ``--out``; at the end it
prints the eval success at every eval point and the gain over the first one, paired by episode (mean ± standard
error over the 128 episodes).

    python experiments/crbc/probe.py --method grpo --lr 5e-4 --mini-batches 1 --out /tmp/probe/grpo-5e-4
    python experiments/crbc/probe.py ... --out DIR --record NAME --description "what it varies"
    python experiments/crbc/probe.py --table            # results/probes.md from results/probes.json

With ``--fixed-rooms 16`` every update draws its 16 groups from the eval split's first 16 rooms, and the evaluation
plays those same rooms (8 sampling seeds each, 128 episodes), so the curve is training-room success, not held-out.
``--record NAME`` adds the probe's curve, gain and command to ``results/probes.json`` (replacing one of that name)
and rebuilds ``results/probes.md``, the table of the probes kept.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import shlex
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from agentjax.train import runconfig  # noqa: E402
from agentjax.train.presets import tiny_arch  # noqa: E402
from experiments.crbc import run as experiment  # noqa: E402
from experiments.crbc.presets import RESULTS, tiny_run  # noqa: E402
from experiments.crbc.report import episode_gain  # noqa: E402

PROBES = os.path.join(RESULTS, "probes.json")


@dataclasses.dataclass(frozen=True)
class FixedRooms(runconfig.EnvSpec):
    """An env spec whose train split is the eval split's first ``rooms`` tasks (``--fixed-rooms``)."""

    rooms: int = 16

    def tasks(self, split: str) -> list:
        return super().tasks(self.eval_split)[:self.rooms] if split == self.train_split else super().tasks(split)


def table(probes: list[dict]) -> str:
    """``results/probes.md``: one row per kept probe (description, command, success by update, paired gain)."""
    rows = ["# Probes of the tiny Sokoban RL step (GiGPO, seed 0, from the tiny preset's warm start)", "",
            "Eval success on the same 128 episodes (common random numbers) at every eval point: \"held-out\" is 64 "
            "`valid` rooms x 2 sampling seeds, \"the 16 rooms it trains on\" (`--fixed-rooms 16`) those rooms x 8 "
            "seeds; gain = last − first, paired by episode (± SE over the 128 episodes); \"(noise)\" marks "
            "|gain| < 2 SE. Each row's command (with `--out DIR --record NAME`) made it; `python "
            "experiments/crbc/probe.py --table` rebuilds this table from `probes.json`.", "",
            "| probe | command | success by update | gain |", "|---|---|---|---|"]
    for p in probes:
        curve = ", ".join(f"{u}: {v:.3f}" for u, v in p["success"].items())
        noise = " (noise)" if abs(p["gain"]) < 2 * p["gain_se"] else ""
        gain = f"{p['gain']:+.3f} ± {p['gain_se']:.3f}{noise}"
        rows.append(f"| {p['description']} | `{p['command']}` | {curve} | {gain} |")
    return "\n".join(rows) + "\n"


def write_table(path: str = PROBES) -> str:
    with open(path) as f:
        text = table(json.load(f)["probes"])
    with open(os.path.splitext(path)[0] + ".md", "w") as f:
        f.write(text)
    return text


def record(name: str, description: str, argv: list[str], curve: dict, path: str = PROBES) -> None:
    """Add (or replace) probe ``name`` in ``path`` with its command (``argv`` without ``--out`` and the recording
    flags) and curve, and rebuild the table."""
    drop = {"--out", "--record", "--description"}
    kept = [a for i, a in enumerate(argv) if a not in drop and (i == 0 or argv[i - 1] not in drop)]
    entry = {"name": name, "description": description,
             "command": " ".join(["python experiments/crbc/probe.py", *map(shlex.quote, kept)])} | {
        k: curve[k] for k in ("success", "first", "last", "gain", "gain_se", "episodes")}
    probes = []
    if os.path.exists(path):
        with open(path) as f:
            probes = [p for p in json.load(f)["probes"] if p["name"] != name]
    with open(path, "w") as f:
        json.dump({"probes": [*probes, entry]}, f, indent=1)
    write_table(path)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--method", default="grpo")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, help="AdamW learning rate (required)")
    parser.add_argument("--mini-batches", type=int, help="optimizer steps per update (required)")
    parser.add_argument("--updates", type=int, default=None, help="default: the preset's")
    parser.add_argument("--groups", type=int, default=None, help="rooms an update (default: the preset's 16)")
    parser.add_argument("--group-size", type=int, default=None,
                        help="rollouts a room (default: the preset's 8); with --groups, the rooms/rollouts trade-off")
    parser.add_argument("--eval-temperature", type=float, default=None,
                        help="evaluation temperature (0: greedy, one eval seed; default: the sampler's 1.0)")
    parser.add_argument("--fixed-rooms", type=int, default=None,
                        help="train on the eval split's first N rooms and evaluate on them (module docstring)")
    parser.add_argument("--width", type=int, default=None,
                        help="the policy's d_model (default: the tiny preset's 64; heads of 16 dims, MLP 4x; the "
                             "warm start is built for this policy and cached under its own key)")
    parser.add_argument("--layers", type=int, default=None, help="the policy's blocks (default: the preset's 2)")
    parser.add_argument("--warm-steps", type=int, default=None,
                        help="AdamW steps of the warm start (default: the preset's 2,000; a weaker start is cached "
                             "under its own key)")
    parser.add_argument("--out", help="the run's folder (required)")
    parser.add_argument("--record", metavar="NAME", help="keep the probe in results/probes.json and .md")
    parser.add_argument("--description", default="", help="with --record: what the probe varies, in words")
    parser.add_argument("--table", action="store_true", help="rebuild results/probes.md from results/probes.json")
    args = parser.parse_args(argv)
    if args.table:
        print(write_table())
        return
    if args.lr is None or args.mini_batches is None or not args.out:
        parser.error("--lr, --mini-batches and --out are required")
    run = tiny_run(args.method, args.seed, updates=args.updates)
    optimizer = dataclasses.replace(run.train.optimizer, learning_rate=args.lr)
    run = run.replace(train=run.train.replace(optimizer=optimizer, mini_batches=args.mini_batches), out_dir=args.out)
    if args.width or args.layers:
        width = args.width or run.train.model.arch.d_model
        arch = tiny_arch(d_model=width, mlp_dim=4 * width, num_heads=width // 16, num_kv_heads=max(width // 32, 1),
                         head_dim=16, num_layers=args.layers or run.train.model.arch.num_layers,
                         name=f"tiny-qwen2-151k-d{width}-l{args.layers or run.train.model.arch.num_layers}")
        run = run.replace(train=run.train.replace(model=dataclasses.replace(run.train.model, arch=arch)))
    if args.warm_steps:
        run = run.replace(warm_start=dataclasses.replace(run.warm_start, steps=args.warm_steps))
    if args.groups or args.group_size:
        run = run.with_sizes(**({"num_groups": args.groups} if args.groups else {}),
                             **({"group_size": args.group_size} if args.group_size else {}))
    if args.eval_temperature is not None:
        run = run.replace(eval_temperature=args.eval_temperature,
                          eval_seeds=1 if args.eval_temperature == 0 else run.eval_seeds)
    if args.fixed_rooms:
        if 128 % args.fixed_rooms:
            parser.error(f"--fixed-rooms {args.fixed_rooms} must divide the 128 eval episodes")
        spec = runconfig.ENVS[run.env]
        runconfig.ENVS[run.env] = FixedRooms(**vars(spec), rooms=args.fixed_rooms)
        run = run.replace(eval_tasks=args.fixed_rooms, eval_seeds=128 // args.fixed_rooms)
        if run.train.rollout.num_groups > args.fixed_rooms:
            parser.error(f"{run.train.rollout.num_groups} groups an update need --fixed-rooms >= that")
    experiment.compile_cache(experiment.RESULTS)
    experiment.run_one(run)
    curve = episode_gain(args.out)
    if args.record:
        record(args.record, args.description or args.record, sys.argv[1:] if argv is None else argv, curve)
    print(json.dumps(dict(method=args.method, seed=args.seed, lr=args.lr, mini_batches=args.mini_batches,
                          groups=run.train.rollout.num_groups, group_size=run.train.rollout.group_size,
                          arch=run.train.model.arch.name, warm_steps=run.warm_start.steps,
                          fixed_rooms=args.fixed_rooms) | curve))


if __name__ == "__main__":
    main()
