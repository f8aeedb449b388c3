"""The tiny Sokoban warm start's learning curve: held-out oracle agreement every ``--every`` supervised steps.

The recipe of :mod:`agentjax.train.warmstart` (the oracle's demonstrations on the first ``--episodes`` of a
seeded permutation of the train rooms, AdamW without weight decay on batches of ``--batch`` turns drawn with
replacement, the NLL of the constrained choices) with a probe of :func:`agentjax.train.probe.oracle_agreement`
on the warm start's own held-out states (the first 64 ``valid`` rooms) at every ``--every`` steps. It is the
measurement behind ``TINY_WARM_STARTS`` (:mod:`agentjax.train.presets`): on 1,000 episodes the loss stalls, on
4,000 it keeps falling.

    python experiments/crbc/warmstart_curve.py --episodes 4000 --steps 3000 --out /tmp/ws_curve.jsonl

One JSON line per probe: step, the mean loss of the last 100 steps, agreement ± SE, the oracle reply's mean
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
import optax  # noqa: E402
from flax import nnx  # noqa: E402

from agentjax.models import Qwen  # noqa: E402
from agentjax.models.tokenizer import load_tokenizer  # noqa: E402
from agentjax.train.config import LossConfig  # noqa: E402
from agentjax.train.presets import tiny  # noqa: E402
from agentjax.train.probe import oracle_agreement  # noqa: E402
from agentjax.train.warmstart import AGREEMENT_TASKS, _pack, _sft_step, demonstrations  # noqa: E402


def curve(episodes: int, steps: int, every: int, *, learning_rate: float = 2e-3, batch_size: int = 32,
          seed: int = 0, env: str = "sokoban"):
    """Yield one probe record every ``every`` steps (module docstring)."""
    run = tiny("grpo", env)
    tokenizer = load_tokenizer(run.tokenizer)
    spec = run.spec
    tasks = spec.tasks(spec.train_split)
    order = np.random.default_rng(seed).permutation(len(tasks))[:episodes]
    world = spec.env_class()(**run.env_kwargs)
    rows = demonstrations(world, [tasks[i] for i in order], tokenizer, run.collect)
    held_out = spec.tasks(spec.eval_split)[:AGREEMENT_TASKS]
    model = Qwen(run.train.model.arch, rngs=nnx.Rngs(seed))
    graphdef, params = nnx.split(model, nnx.Param)
    tx = optax.adamw(learning_rate, weight_decay=0.0)
    opt_state = tx.init(params)
    loss = LossConfig(logprob_chunk=run.train.loss.logprob_chunk, logprob_remat=run.train.loss.logprob_remat)
    ro, rng, losses, t0 = run.train.rollout, np.random.default_rng(seed), [], time.perf_counter()
    for step in range(1, steps + 1):
        batch = _pack([rows[i] for i in rng.integers(0, len(rows), batch_size)], ro.prompt_len, ro.response_len,
                      run.collect.max_allowed)
        params, opt_state, value = _sft_step(graphdef, params, opt_state, batch, tx=tx, loss=loss)
        losses.append(float(value))
        if step % every == 0 or step == steps:
            nnx.update(model, params)
            probe = oracle_agreement(model, tokenizer, world, held_out, run.collect)
            yield dict(step=step, turns=len(rows), loss=float(np.mean(losses[-100:])), agreement=probe["agreement"],
                       agreement_se=probe["agreement_se"], oracle_prob=probe["oracle_prob"],
                       seconds=time.perf_counter() - t0)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=4000, help="oracle episodes (train rooms) to imitate")
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--every", type=int, default=500, help="steps between probes")
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--batch", type=int, default=32, help="turns a step")
    parser.add_argument("--out", help="JSON lines (default: print only)")
    args = parser.parse_args(argv)
    out = open(args.out, "w") if args.out else None
    for record in curve(args.episodes, args.steps, args.every, learning_rate=args.lr, batch_size=args.batch):
        print(json.dumps(record), flush=True)
        if out:
            out.write(json.dumps(record) + "\n")
            out.flush()


if __name__ == "__main__":
    main()
