"""The tiny Sokoban warm start's learning curve: held-out oracle agreement every ``--every`` supervised steps.

The recipe of :mod:`agentjax.train.warmstart` (the oracle's demonstrations on the first ``--episodes`` of a
seeded permutation of the train rooms, AdamW without weight decay on batches of ``--batch`` turns drawn with
replacement, the NLL of the constrained choices) with a probe of :func:`agentjax.train.probe.oracle_agreement`
on the warm start's own held-out states (the first 64 ``valid`` rooms) at every ``--every`` steps. It is the
measurement behind ``TINY_WARM_STARTS`` (:mod:`agentjax.train.presets`): on 1,000 episodes the loss stalls, on
4,000 it keeps falling.

    python experiments/crbc/warmstart_curve.py --episodes 4000 --steps 3000 --out /tmp/ws_curve.jsonl

One JSON line per probe (printed as it is made, written to ``--out`` at the end): step, the mean loss of the 100
steps before it, agreement ± SE, the oracle reply's mean
probability and the seconds so far.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from agentjax.models import Qwen  # noqa: E402
from agentjax.models.tokenizer import load_tokenizer  # noqa: E402
from agentjax.train.config import LossConfig  # noqa: E402
from agentjax.train.presets import tiny  # noqa: E402
from agentjax.train.probe import oracle_agreement  # noqa: E402
from agentjax.train.runconfig import WarmStart  # noqa: E402
from agentjax.train.warmstart import AGREEMENT_TASKS, run_demonstrations, supervised  # noqa: E402


def curve(episodes: int, steps: int, every: int, *, learning_rate: float = 2e-3, batch_size: int = 32,
          seed: int = 0, env: str = "sokoban") -> list[dict]:
    """One probe record every ``every`` steps (module docstring), printed as it is made."""
    run = tiny("grpo", env)
    run = run.replace(warm_start=WarmStart(episodes=episodes, steps=steps, batch_size=batch_size,
                                           learning_rate=learning_rate, seed=seed))
    tokenizer = load_tokenizer(run.tokenizer)
    spec = run.spec
    world, held_out = spec.env_class()(**run.env_kwargs), spec.tasks(spec.eval_split)[:AGREEMENT_TASKS]
    rows = run_demonstrations(run, tokenizer)
    records, losses, t0 = [], [], time.perf_counter()

    def probe(step: int, model: Qwen) -> None:
        agreement = oracle_agreement(model, tokenizer, world, held_out, run.collect)
        records.append(dict(step=step, turns=len(rows), agreement=agreement["agreement"],
                            agreement_se=agreement["agreement_se"], oracle_prob=agreement["oracle_prob"],
                            seconds=time.perf_counter() - t0))
        print(json.dumps(records[-1]), flush=True)

    model = Qwen(run.train.model.arch, rngs=nnx.Rngs(seed))
    ro = run.train.rollout
    loss = LossConfig(logprob_chunk=run.train.loss.logprob_chunk, logprob_remat=run.train.loss.logprob_remat)
    losses = supervised(model, rows, run.warm_start, ro.prompt_len, ro.response_len, loss,
                        max_allowed=run.collect.max_allowed, every=every, callback=probe)
    for r in records:  # the mean loss of the 100 steps up to each probe
        r["loss"] = float(np.mean(losses[max(0, r["step"] - 100):r["step"]]))
    return records


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=4000, help="oracle episodes (train rooms) to imitate")
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--every", type=int, default=500, help="steps between probes")
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--batch", type=int, default=32, help="turns a step")
    parser.add_argument("--out", help="JSON lines (default: print only)")
    args = parser.parse_args(argv)
    records = curve(args.episodes, args.steps, args.every, learning_rate=args.lr, batch_size=args.batch)
    if args.out:
        with open(args.out, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in records)


if __name__ == "__main__":
    main()
