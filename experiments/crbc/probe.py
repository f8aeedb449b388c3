"""One tiny Sokoban run with the RL step changed: the probes that chose the tiny preset's learning rate.

The run is ``experiments/crbc/presets.py``'s ``tiny_run`` (the shared warm start, the same 128 eval episodes and
sampling streams at every eval point) with the learning rate and the optimizer steps per update set here, written
to ``--out``; at the end it prints the eval success at every eval point and the gain over the first one, paired by
episode (mean ± standard error over the 128 episodes).

    python experiments/crbc/probe.py --method grpo --lr 5e-4 --mini-batches 1 --out /tmp/probe/grpo-5e-4

The probes of the README ("The tiny CRBC experiment"), each 20 updates from the warm start, seed 0: GRPO at 2e-3 /
4 steps an update (the old preset), 5e-4 / 1, 2e-4 / 4, 2e-3 / 1 and GiGPO at 1e-3 / 1; GiGPO at the preset's 5e-4 / 2
for 60 updates; and with ``--fixed-rooms 16`` (GiGPO 5e-4 / 2 and 2e-3 / 4) the check that RL improves the policy on
the rooms it trains on: every update draws its 16 groups from the eval split's first 16 rooms, and the evaluation
plays those same rooms (8 sampling seeds each, 128 episodes), so the curve is training-room success, not held-out.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from agentjax.train import runconfig  # noqa: E402
from agentjax.train.presets import tiny_arch  # noqa: E402
from experiments.crbc import run as experiment  # noqa: E402
from experiments.crbc.presets import tiny_run  # noqa: E402
from experiments.crbc.report import episode_gain  # noqa: E402


@dataclasses.dataclass(frozen=True)
class FixedRooms(runconfig.EnvSpec):
    """An env spec whose train split is the eval split's first ``rooms`` tasks (``--fixed-rooms``)."""

    rooms: int = 16

    def tasks(self, split: str) -> list:
        return super().tasks(self.eval_split)[:self.rooms] if split == self.train_split else super().tasks(split)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--method", default="grpo")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, required=True, help="AdamW learning rate")
    parser.add_argument("--mini-batches", type=int, required=True, help="optimizer steps per update")
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
    parser.add_argument("--out", required=True, help="the run's folder")
    args = parser.parse_args(argv)
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
    print(json.dumps(dict(method=args.method, seed=args.seed, lr=args.lr, mini_batches=args.mini_batches,
                          groups=run.train.rollout.num_groups, group_size=run.train.rollout.group_size,
                          arch=run.train.model.arch.name, warm_steps=run.warm_start.steps,
                          fixed_rooms=args.fixed_rooms) | curve))


if __name__ == "__main__":
    main()
