"""Benchmark: SERA's constrained rubric and grading calls — one teacher-forced pass vs the decode loop.

The tiny SERA preset's writer and grader choose among fixed well-formed answers (:mod:`agentjax.agents.rubric`:
the reference rubric under four weightings, ~220 tokens each; a failure or a success at four levels). Three ways
to draw them, the same constrained distribution, on the tiny preset's policy (2-layer Qwen3, the real tokenizer)
and a batch of ``--rows`` prompts of ~``--prompt-words`` words:

- ``loop dense``: ``Sampler.generate(allowed=...)``, one decode step per answer token, ``[B, V]`` logits a step;
- ``loop sparse``: the same loop with the allowed tokens' logits only (``sparse=True``);
- ``one pass``: :meth:`Sampler.choose` (:mod:`agentjax.models.choose`): every answer scored in one decoder pass.

Each is called once first (compile; ``compile_s``), then ``--repeats`` times; the median and the ratio to the dense
loop are printed and written to ``experiments/bench/results/rubric_calls.json``. Usage:
``python experiments/bench/rubric_calls.py [--repeats 5]``. Quote the ratios: absolute times on a shared machine are
noisy.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import pathlib
import statistics
import sys
import time

import jax
import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from agentjax.agents.rubric import grade_choices, reference_rubric, rubric_choices  # noqa: E402
from agentjax.models.sampler import Sampler  # noqa: E402
from agentjax.models.tokenizer import load_tokenizer  # noqa: E402
from agentjax.rollout.tree_rubrics import _calls  # noqa: E402
from agentjax.train.trainer import build_model  # noqa: E402
from experiments.bench.harness import write_json  # noqa: E402
from experiments.sera.presets import tiny_run  # noqa: E402

WAYS = {"loop dense": dict(sparse_logits=False, one_pass=False), "loop sparse": dict(sparse_logits=True,
        one_pass=False), "one pass": dict(one_pass=True)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=6)
    parser.add_argument("--prompt-words", type=int, default=700)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    run = tiny_run("sera", 0).replace(warm_start=None)
    tokenizer = load_tokenizer(run.tokenizer)
    policy = Sampler(build_model(run, tokenizer, None), tokenizer)
    config = run.rubric_collect
    rng = np.random.default_rng(0)
    words = ["craft", "stick", "planks", "inventory", "get", "the", "oak", "of", "1", "2"]
    messages = [[{"role": "user", "content": " ".join(rng.choice(words, args.prompt_words))}]
                for _ in range(args.rows)]
    goals = [f"craft {i + 1} stone pickaxe" for i in range(args.rows)]
    calls = {"rubric": ([rubric_choices(g, 8) for g in goals], config.writing),
             "grade": ([grade_choices(reference_rubric(g, 8)) for g in goals], config.grading)}
    rows = []
    for call, (choices, params) in calls.items():
        medians = {}
        for way, changes in WAYS.items():
            rc = dataclasses.replace(config, **changes)
            fn = functools.partial(_calls, policy, tokenizer, messages, None, choices, params, rc, jax.random.key(1))
            t0 = time.perf_counter()
            out = fn()
            compile_s = time.perf_counter() - t0
            times = []
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
            medians[way] = statistics.median(times)
            rows.append(dict(call=call, way=way, rows=args.rows, answer_tokens=int(len(out[0].response_ids)),
                             ms=1e3 * medians[way], compile_s=compile_s - medians[way]))
        for row in rows[-len(WAYS):]:
            row["speedup_vs_dense"] = medians["loop dense"] / (row["ms"] / 1e3)
    print(f"{'call':7} {'way':12} {'tokens':>6} {'median ms':>10} {'x dense':>8} {'compile s':>9}")
    for row in rows:
        print(f"{row['call']:7} {row['way']:12} {row['answer_tokens']:6d} {row['ms']:10.1f} "
              f"{row['speedup_vs_dense']:8.2f} {row['compile_s']:9.1f}")
    write_json(rows, ROOT / "experiments" / "bench" / "results" / "rubric_calls.json",
               dict(loadavg=os.getloadavg(), repeats=args.repeats, prompt_words=args.prompt_words,
                    model=run.train.model.arch.name))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
