"""Can the tiny policy learn to grade at all? Supervised steps on grade rows only, then the grader probe.

SERA's tiny warm start's grade rows (433 of its 6,464 rows on TextWorld-Sync) are all successes
(``WarmStart.failure_grades`` adds the early-finish trees' grades, mostly failures), and its grader answers every
held-out child the same way
(``results/<name>_grader.md``). This check gives the grader a fair chance before anyone blames the method: from
SERA's warm start, ``--steps`` AdamW steps of the warm start's NLL on the reference grade rows of the planner and
early-finish trees of ``--tasks`` training tasks (successes and failures, as the verifier labels them; batches of
16 drawn uniformly), then the grader probe (agentjax/train/grader_probe.py) on the same held-out children as
before and on the training tasks themselves (did it fit?). Writes ``results/<name>_grader_sft.md`` and keeps no
weights.

    python experiments/sera/grader_sft.py                        # TextCraft-Synth
    python experiments/sera/grader_sft.py --sync                 # TextWorld-Sync
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

from experiments.sera.presets import RESULTS, sync_run, tiny_run  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sync", action="store_true", help="TextWorld-Sync (default TextCraft-Synth)")
    parser.add_argument("--tasks", type=int, default=64, help="training tasks whose trees give the grade rows")
    parser.add_argument("--steps", type=int, nargs="+", default=[100, 300], help="probe after each of these steps")
    parser.add_argument("--probe-tasks", type=int, default=16, help="held-out tasks of the probe")
    parser.add_argument("--learning-rate", type=float, default=2e-3)
    parser.add_argument("--results", default=RESULTS)
    args = parser.parse_args(argv)
    os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(args.results, "runs", ".jax-cache"))
    import numpy as np

    from agentjax.models import load_hf, load_tokenizer
    from agentjax.train.config import LossConfig
    from agentjax.train.grader_probe import graded_children, summarize
    from agentjax.train.tree_update import TREE_COMPACT_BUCKET
    from agentjax.train.tree_warmstart import grade_rows, warm_start_tasks
    from agentjax.train.warmstart import cache_folder, supervised

    run = sync_run(0, method="sera", results=args.results) if args.sync else tiny_run("sera", 0, results=args.results)
    folder = cache_folder(run)
    if not os.path.isfile(os.path.join(folder, "warmstart.json")):
        print(f"no SERA warm start at {folder}: run experiments/sera/run.py{' --sync' if args.sync else ''} "
              "--methods sera first")
        return 1
    tokenizer = load_tokenizer(run.tokenizer)
    model = load_hf(folder, config=run.train.model.arch)
    chosen = warm_start_tasks(run.replace(warm_start=dataclasses.replace(run.warm_start, episodes=args.tasks)))
    held_out = run.spec.tasks(run.evaluation_split)[:args.probe_tasks]
    t0 = time.perf_counter()
    rows, labels = grade_rows(run, chosen, tokenizer)
    print(f"{len(rows)} grade rows ({sum(labels)} successes) from {len(chosen)} training tasks "
          f"({time.perf_counter() - t0:.0f} s)", flush=True)
    import jax

    from agentjax.models import Sampler

    def probe(tasks, seed):
        children, _ = graded_children(run, Sampler(model, tokenizer), tokenizer, tasks, jax.random.key(seed))
        return summarize(children)

    ro, co = run.train.rollout, run.collect
    loss = LossConfig(logprob_chunk=run.train.loss.logprob_chunk, logprob_remat=run.train.loss.logprob_remat)
    lr = max(ro.response_len, run.tree.rubric_tokens, run.tree.grade_tokens)
    points = [(0, probe(held_out, 0), probe(chosen[:args.probe_tasks], 1), float("nan"))]
    done = 0
    for target in sorted(args.steps):
        ws = dataclasses.replace(run.warm_start, steps=target - done, batch_size=16,
                                 learning_rate=args.learning_rate, seed=run.warm_start.seed + done)
        losses = supervised(model, rows, ws, ro.prompt_len, lr, loss, max_allowed=co.max_allowed,
                            compact_bucket=TREE_COMPACT_BUCKET)
        done = target
        points.append((done, probe(held_out, 0), probe(chosen[:args.probe_tasks], 1), float(np.mean(losses[-10:]))))
        h, t = points[-1][1], points[-1][2]
        print(f"step {done}: NLL {points[-1][3]:.4f}; held-out balanced accuracy {h['balanced_accuracy']:.3f} "
              f"(AUC {h['auc']:.3f}); training tasks {t['balanced_accuracy']:.3f}", flush=True)
    name = "sync" if args.sync else "tiny"
    command = "python experiments/sera/grader_sft.py " + " ".join(argv if argv is not None else sys.argv[1:])
    lines = [f"# Can the tiny policy learn to grade? ({'TextWorld-Sync' if args.sync else 'TextCraft-Synth'})", "",
             f"Made by `{command.strip()}` ({time.perf_counter() - t0:.0f} s): from SERA's warm start "
             f"`{os.path.basename(folder)[:12]}`, AdamW steps (batch 16, lr {args.learning_rate:g}) of the warm "
             f"start's NLL on {len(rows)} reference grade rows ({sum(labels)} successes, {len(rows) - sum(labels)} "
             f"failures) of the planner and early-finish trees of {len(chosen)} training tasks; then the grader probe "
             f"(agentjax/train/grader_probe.py) on the first {args.probe_tasks} held-out tasks and on the first "
             f"{args.probe_tasks} of those training tasks. 0.5 is a grader that ignores the child.", "",
             "| steps | grade-row NLL (last 10) | held-out: children (successes) | pass rate | fail rate | "
             "balanced accuracy | AUC | training tasks: balanced accuracy | AUC |", "|---" * 9 + "|"]
    for step, h, t, nll in points:
        lines.append(f"| {step} | {nll:.4f} | {int(h['children'])} ({int(h['successes'])}) | {h['pass_rate']:.2f} | "
                     f"{h['fail_rate']:.2f} | {h['balanced_accuracy']:.3f} ± {h['balanced_accuracy_se']:.3f} | "
                     f"{h['auc']:.3f} | {t['balanced_accuracy']:.3f} ± {t['balanced_accuracy_se']:.3f} | "
                     f"{t['auc']:.3f} |")
    path = os.path.join(args.results, f"{name}_grader_sft.md")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(path.replace(".md", ".json"), "w") as f:
        json.dump([{"steps": s, "held_out": h, "training": t, "nll": n} for s, h, t, n in points], f, indent=1)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
