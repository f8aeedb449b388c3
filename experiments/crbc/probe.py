"""One tiny Sokoban run with the RL step changed: the probes that chose the tiny preset's learning rate.

The run is ``experiments/crbc/presets.py``'s ``tiny_run`` (the shared warm start, the same 128 eval episodes and
sampling streams at every eval point) with the learning rate and the optimizer steps per update set here, written
to ``--out``; at the end it prints the eval success at every eval point and the gain over the first one, paired by
episode (mean ± standard error over the 128 episodes).

    python experiments/crbc/probe.py --method grpo --lr 5e-4 --mini-batches 1 --out /tmp/probe/grpo-5e-4

The probes of the README ("The tiny CRBC experiment"), each 20 updates from the warm start, seed 0: GRPO at 2e-3 /
4 steps an update (the old preset), 5e-4 / 1, 2e-4 / 4, 2e-3 / 1 and GiGPO at 1e-3 / 1.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from experiments.crbc import run as experiment  # noqa: E402
from experiments.crbc.presets import tiny_run  # noqa: E402
from experiments.crbc.report import episode_gain  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--method", default="grpo")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, required=True, help="AdamW learning rate")
    parser.add_argument("--mini-batches", type=int, required=True, help="optimizer steps per update")
    parser.add_argument("--updates", type=int, default=None, help="default: the preset's")
    parser.add_argument("--groups", type=int, default=None, help="rooms an update (default: the preset's 16)")
    parser.add_argument("--eval-temperature", type=float, default=None,
                        help="evaluation temperature (0: greedy, one eval seed; default: the sampler's 1.0)")
    parser.add_argument("--out", required=True, help="the run's folder")
    args = parser.parse_args(argv)
    run = tiny_run(args.method, args.seed, updates=args.updates)
    optimizer = dataclasses.replace(run.train.optimizer, learning_rate=args.lr)
    run = run.replace(train=run.train.replace(optimizer=optimizer, mini_batches=args.mini_batches), out_dir=args.out)
    if args.groups:
        run = run.with_sizes(num_groups=args.groups)
    if args.eval_temperature is not None:
        run = run.replace(eval_temperature=args.eval_temperature,
                          eval_seeds=1 if args.eval_temperature == 0 else run.eval_seeds)
    experiment.compile_cache(experiment.RESULTS)
    experiment.run_one(run)
    curve = episode_gain(args.out)
    print(json.dumps(dict(method=args.method, seed=args.seed, lr=args.lr, mini_batches=args.mini_batches,
                          groups=run.train.rollout.num_groups) | curve))


if __name__ == "__main__":
    main()
