"""Benchmark: an update of the tiny preset against a baseline revision, its roofline and where the time goes.

Three measurements in one run (``experiments/bench/results/train.json``):

1. **Before / after** (``--baseline REV``, default ``d399628``): ``REV`` is checked out into a temporary ``git
   worktree`` (removed at the end) and the same measurement runs in a child process
   (``experiments/bench/train_child.py``) with ``PYTHONPATH`` at that tree and at this one, alternating
   (``--rounds`` rounds of baseline, current) so that load changes on the shared machine hit both. Both sides run
   the baseline's tiny preset, rebuilt explicitly (Sokoban, verl-agent prompts with 2 history records, 640 prompt
   slots bucketed at 640, 4 groups × 8 rollouts × 15 steps, 10 reply tokens, constrained decoding with
   ``masked_logp``, micro-batches of 40, 4 mini-batches, AdamW at 2e-3, the 2-layer d = 64 model with the
   151,936-token vocabulary), from the same random-init weights (no warm start), seeds and keys, so that both
   collect the same episodes. Each child times ``--updates`` updates (collect, credit, update: the loop's order) and
   reports the medians after the compiling first one; ``update`` is the optimizer step (forward + backward of every
   row, micro-batched, blocked on), ``generate`` the sampler's calls, ``prompt`` templating / tokenising / tries,
   ``env`` the environments. The numbers: each side's update metrics (loss, grad_norm, pg_loss, kl), the batch's
   reward sum and turns, and the sampled tokens, compared update by update. The current side decodes with the
   allowed tokens' logits only (``sparse_logits``, computed without the ``[B, V]`` logits) and the dense path's
   random numbers (``dense_draws``: the same tokens); ``--dense`` gives it full-vocabulary decoding instead. The
   current tiny preset (compact prompts: a different setting) is timed as its own row, current code only.
2. **Roofline**: this CPU's float32 matmul rate, measured here (jitted matmuls of the model's shapes and a square
   one, best of ``--matmul-reps``), against the FLOP/s achieved by generate and update, with FLOPs counted from
   the config and the batch's real tokens (every row = one turn; ``T_b`` = prompt + reply tokens of row ``b``)::

       per token, non-embedding matmuls      2 · L · (D·N·H + 2·D·K·H + N·H·D + 3·D·F)
       attention of a row (causal)          L · 2 · N·H · T_b (T_b + 1)         (q·kᵀ and p·v over keys ≤ i)
       update forward of a row              the two above + 2·D·A·R_b           (A allowed ids at R_b replies)
       update                               Σ_b (3 + [β_KL > 0]) · forward_b    (forward + backward ≈ 3 forwards,
                                                                                  + the reference policy's forward)
       generate                              prefill of P_b prompt tokens + 2·D·V for the first logits, then per
                                             reply token j: 2·L·(…) + L·4·N·H·(P_b + j + 1) + 2·D·V (the dense
                                             sampler's full-vocabulary logits)

   Padding, dummy rows and recomputation are not counted (achieved = useful FLOPs / seconds).
3. **Where the rest goes**: jitted calls per update and the measured per-call dispatch overhead (a no-op jitted
   function on the same argument pytrees), compiles and compile seconds (``jax.monitoring``), host seconds in
   prompt building, tries, the constrained choices ("host masks"), packing the batch, and the sampler's output
   (its wait for the device included), padding fractions (prompt slots vs real prompt tokens in prefill and in the
   update, dummy rows per sampler call, micro-batch rows).

``--loop`` also runs the real trainer loop (:func:`agentjax.train.loop.train`) of the current tiny preset for
``--methods`` and reports its per-update split (env / generate / prompt / credit / update / total, samples/s, the
credit kernel's share of the update: target < 2%), as this script did before; no warm start unless
``--warm-start``.

Usage: ``python experiments/bench/train.py [--baseline d399628] [--rounds 2] [--updates 3] [--loop]``.
Quote the ratios (both sides in the same run), not the absolute seconds: the 2-core machine is shared.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

RESULTS = pathlib.Path(__file__).resolve().parent / "results" / "train.json"
CHILD = pathlib.Path(__file__).resolve().parent / "train_child.py"
STAGES = ("env", "generate", "prompt", "credit", "update", "total")
CREDIT_TARGET = 0.02  # credit time / update time
COMPARED = ("loss", "grad_norm", "pg_loss", "kl")


# -- 1. before / after --------------------------------------------------------------------------------------------
def run_child(tree: pathlib.Path, setting: str, tag: str, workdir: str, updates: int, method: str,
              sparse: bool = False) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree))
    cmd = [sys.executable, str(CHILD), "--setting", setting, "--tag", tag, "--workdir", workdir,
           "--updates", str(updates), "--method", method, *(["--sparse"] if sparse else [])]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, cwd=str(tree), capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"{tag} failed:\n{proc.stderr[-4000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    if not out["agentjax_file"].startswith(str(tree)):
        raise RuntimeError(f"{tag} imported agentjax from {out['agentjax_file']}, not from {tree}")
    out["wall_s"] = time.perf_counter() - t0
    print(f"  {tag}: update {out['median_s']['update']:.2f}s generate {out['median_s']['generate']:.2f}s "
          f"({out['wall_s']:.0f}s)", flush=True)
    return out


def compare_numbers(base: dict, cur: dict, workdir: str) -> dict:
    """Update-by-update relative differences of the metrics, reward sums, turns and sampled tokens."""
    import numpy as np

    tok_b = np.load(os.path.join(workdir, f"{base['tag']}-tokens.npz"))
    tok_c = np.load(os.path.join(workdir, f"{cur['tag']}-tokens.npz"))
    rows = []
    for i, (rb, rc) in enumerate(zip(base["records"], cur["records"], strict=False)):
        rel = {k: abs(rc["metrics"][k] - rb["metrics"][k]) / max(abs(rb["metrics"][k]), 1e-30)
               for k in COMPARED if k in rb["metrics"] and k in rc["metrics"]}
        a, b = tok_b[f"arr_{i}"], tok_c[f"arr_{i}"]
        rows.append(dict(update=i, rel_diff=rel, turns=(rb["turns"], rc["turns"]),
                         reward_sum=(rb["reward_sum"], rc["reward_sum"]),
                         reward_rel_diff=abs(rc["reward_sum"] - rb["reward_sum"]) / max(abs(rb["reward_sum"]), 1e-30),
                         tokens_identical=bool(a.shape == b.shape and (a == b).all()),
                         tokens_differing=int((a != b).sum()) if a.shape == b.shape else -1))
    return dict(per_update=rows)


# -- 2. roofline --------------------------------------------------------------------------------------------------
def matmul_rates(reps: int) -> dict:
    """Best-of-``reps`` float32 matmul FLOP/s of jitted ``[M, K] @ [K, N]`` on this machine, now."""
    import jax
    import jax.numpy as jnp

    shapes = {"mlp up (13200x64 @ 64x256)": (13200, 64, 256), "mlp down (13200x256 @ 256x64)": (13200, 256, 64),
              "qkv (13200x64 @ 64x64)": (13200, 64, 64), "unembedding (32x64 @ 64x151936)": (32, 64, 151_936),
              "square 1024": (1024, 1024, 1024)}
    fns, args = {}, {}
    for name, (m, k, n) in shapes.items():
        key_a, key_b = jax.random.split(jax.random.key(m + k + n))
        args[name] = (jax.random.normal(key_a, (m, k), jnp.float32), jax.random.normal(key_b, (k, n), jnp.float32))
        fns[name] = jax.jit(lambda a, b: a @ b)
        jax.block_until_ready(fns[name](*args[name]))
    best = {name: float("inf") for name in shapes}
    for _ in range(reps):  # alternating shapes: a load change hits all of them
        for name in shapes:
            t0 = time.perf_counter()
            jax.block_until_ready(fns[name](*args[name]))
            best[name] = min(best[name], time.perf_counter() - t0)
    rates = {name: 2 * m * k * n / best[name] for name, (m, k, n) in shapes.items()}
    return dict(flops_per_s=rates, peak_flops_per_s=max(rates.values()), reps=reps)


def flops(child: dict, record: dict) -> dict:
    """Useful FLOPs of one update's generate and update stages (module docstring)."""
    c, b = child["config"], record["batch"]
    d, layers, n, k, h, f, v = c["d_model"], c["layers"], c["heads"], c["kv_heads"], c["head_dim"], c["mlp"], c["vocab"]
    per_token = 2 * layers * (d * n * h + 2 * d * k * h + n * h * d + 3 * d * f)
    attn = lambda t: layers * 2 * n * h * t * (t + 1)  # noqa: E731
    passes = 3 + (1 if c["kl_coef"] > 0 else 0)
    update = generate = 0.0
    for p, r in zip(b["row_prompt_tokens"], b["row_response_tokens"], strict=True):
        t = p + r
        update += passes * (per_token * t + attn(t) + 2 * d * b["allowed_slots"] * r)
        generate += per_token * p + attn(p) + 2 * d * v  # prefill and the first logits
        generate += sum(per_token + layers * 4 * n * h * (p + j + 1) + 2 * d * v for j in range(r))
    return dict(update=update, generate=generate)


# -- 3. where the rest goes ---------------------------------------------------------------------------------------
def rest(child: dict) -> dict:
    timed = [r for r in child["records"][1:] if not r["profiled"]] or child["records"][-1:]
    med = lambda f: statistics.median(f(r) for r in timed)  # noqa: E731
    c = child["config"]
    calls = med(lambda r: sum(r["calls"].values()))
    prefill_slots = med(lambda r: sum(p["rows"] * p["slots"] for p in r["prefill"]))
    prefill_real = med(lambda r: sum(p["real"] for p in r["prefill"]))
    batch = timed[-1]["batch"]
    real_rows, cap, mb, mini = batch["rows"], batch["capacity"], c["micro_batch"], c["mini_batches"]
    per_mini = [len(range(m, real_rows, mini)) for m in range(mini)]  # real rows dealt round-robin
    computed = sum(-(-x // mb) * mb for x in per_mini)
    slots = batch["prompt_slots"] + batch["response_slots"]
    compact = child.get("compact") or {}
    update_slots = compact.get("prompt_slots", batch["prompt_slots"]) + batch["response_slots"]
    real_tokens = sum(p + r for p, r in zip(batch["row_prompt_tokens"], batch["row_response_tokens"], strict=True))
    prefix = compact.get("prefix", 0)
    return dict(
        sampler_calls=calls, dispatch_s=child["dispatch"],
        dispatch_total_s=calls * child["dispatch"]["decode_s"] + child["dispatch"]["update_s"],
        compiles_after_first=med(lambda r: len(r["compiles"])), compile_s_first=sum(child["records"][0]["compiles"]),
        compiles_first=len(child["records"][0]["compiles"]),
        host_s={k: med(lambda r, k=k: r["host_s"].get(k, 0.0)) for k in
                ("_encode", "_constraint", "constrained_choices", "to_step_batch", "finalise", "left_pad")},
        prefill_real_over_slots=prefill_real / prefill_slots,
        padded_rows_per_call=med(lambda r: r["padded_rows"] / max(r["generate_calls"], 1)),
        padded_rows_share=med(lambda r: r["padded_rows"] / (r["turns"] + r["padded_rows"])),
        update_real_over_slots=real_tokens / (real_rows * slots),
        update_real_over_computed_slots=(real_tokens - prefix * (real_rows - 1)) / (computed * update_slots + prefix),
        update_slots_per_row=(slots, update_slots), shared_prefix=prefix,
        micro_batch_rows=dict(capacity=cap, real=real_rows, computed=computed),
    )


def summary(children: list[dict], peak: float) -> dict:
    med = lambda key: statistics.median(c["median_s"][key] for c in children)  # noqa: E731
    times = {k: med(k) for k in ("collect", "generate", "prompt", "env", "credit", "update", "total")}
    fl = [flops(c, r) for c in children for r in c["records"][1:]]
    f_update = statistics.median(x["update"] for x in fl)
    f_generate = statistics.median(x["generate"] for x in fl)
    return dict(median_s=times, runs=len(children),
                flops=dict(update=f_update, generate=f_generate),
                achieved_flops_per_s=dict(update=f_update / times["update"], generate=f_generate / times["generate"]),
                roofline_ratio=dict(update=f_update / times["update"] / peak,
                                    generate=f_generate / times["generate"] / peak),
                rest=rest(children[-1]),
                turns=statistics.median(r["turns"] for c in children for r in c["records"]))


def print_tables(out: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=160)
    base, cur = out["baseline"], out["current"]
    t = Table(title=f"baseline settings, tiny Sokoban: median seconds per update ({out['meta']['rounds']} runs a side, "
                    f"alternating; ratio = baseline / current)")
    for col in ("stage", "baseline " + out["meta"]["baseline"], "current", "ratio"):
        t.add_column(col, justify="left" if col == "stage" else "right")
    for k in ("update", "generate", "prompt", "env", "credit", "collect", "total"):
        b, c = base["median_s"][k], cur["median_s"][k]
        t.add_row(k, f"{b:.3f}", f"{c:.3f}", f"{b / c:.2f}x" if c else "-")
    if "compact" in out:
        s = out["compact"]["median_s"]
        t.add_row("(current preset: update / generate / total)", "-",
                  f"{s['update']:.3f} / {s['generate']:.3f} / {s['total']:.3f}", "")
    console.print(t)

    r = Table(title=f"roofline: achieved GFLOP/s vs this CPU's float32 matmul "
                    f"({out['matmul']['peak_flops_per_s'] / 1e9:.1f} GFLOP/s best of the shapes, same run)")
    for col in ("stage", "side", "GFLOP", "seconds", "GFLOP/s", "of matmul peak"):
        r.add_column(col, justify="left" if col in ("stage", "side") else "right")
    rows = [("baseline", base), ("current", cur)] + ([("current preset", out["compact"])] if "compact" in out else [])
    for stage in ("update", "generate"):
        for side, s in rows:
            r.add_row(stage, side, f"{s['flops'][stage] / 1e9:.1f}", f"{s['median_s'][stage]:.2f}",
                      f"{s['achieved_flops_per_s'][stage] / 1e9:.2f}", f"{100 * s['roofline_ratio'][stage]:.1f}%")
    console.print(r)
    m = Table(title="matmul FLOP/s (best of reps)")
    m.add_column("shape")
    m.add_column("GFLOP/s", justify="right")
    for k, v in out["matmul"]["flops_per_s"].items():
        m.add_row(k, f"{v / 1e9:.1f}")
    console.print(m)

    w = Table(title="where the rest goes (median update after the first)")
    w.add_column("item")
    for side, _ in rows:
        w.add_column(side, justify="right")
    res = [s["rest"] for _, s in rows]
    items = [
        ("sampler jitted calls / update", lambda x: f"{x['sampler_calls']:.0f}"),
        ("dispatch per call (decode args / update args)",
         lambda x: f"{1e6 * x['dispatch_s']['decode_s']:.0f} / {1e6 * x['dispatch_s']['update_s']:.0f} µs"),
        ("dispatch total / update", lambda x: f"{x['dispatch_total_s']:.3f} s"),
        ("compiles in update 1 (s)", lambda x: f"{x['compiles_first']} ({x['compile_s_first']:.1f} s)"),
        ("compiles in later updates", lambda x: f"{x['compiles_after_first']:.0f}"),
        ("host: prompts (template + tokenise)", lambda x: f"{x['host_s']['_encode']:.2f} s"),
        ("host: tries", lambda x: f"{x['host_s']['_constraint']:.2f} s"),
        ("host: constrained choices (masks)", lambda x: f"{x['host_s']['constrained_choices']:.2f} s"),
        ("host: StepBatch packing", lambda x: f"{x['host_s']['to_step_batch']:.2f} s"),
        ("sampler output (device wait + decode)", lambda x: f"{x['host_s']['finalise']:.2f} s"),
        ("prefill: real prompt tokens / slots", lambda x: f"{100 * x['prefill_real_over_slots']:.0f}%"),
        ("dummy rows per sampler call",
         lambda x: f"{x['padded_rows_per_call']:.1f} ({100 * x['padded_rows_share']:.0f}%)"),
        ("update: real tokens / batch slots", lambda x: f"{100 * x['update_real_over_slots']:.0f}%"),
        ("update: slots a row (batch -> computed)",
         lambda x: f"{x['update_slots_per_row'][0]} -> {x['update_slots_per_row'][1]} (+{x['shared_prefix']} shared)"),
        ("update: real tokens / computed slots", lambda x: f"{100 * x['update_real_over_computed_slots']:.0f}%"),
        ("micro-batch rows: capacity / real / computed",
         lambda x: f"{x['micro_batch_rows']['capacity']} / {x['micro_batch_rows']['real']} / "
                   f"{x['micro_batch_rows']['computed']}"),
    ]
    for name, fn in items:
        w.add_row(name, *(fn(x) for x in res))
    console.print(w)

    n = Table(title="the numbers: current vs baseline, update by update (relative differences)")
    for col in ("update", *COMPARED, "reward sum", "turns", "sampled tokens"):
        n.add_column(col, justify="right")
    for cmp in out["numbers"]:
        for row in cmp["per_update"]:
            n.add_row(str(row["update"]), *(f"{row['rel_diff'].get(k, float('nan')):.1e}" for k in COMPARED),
                      f"{row['reward_rel_diff']:.1e}", f"{row['turns'][0]} / {row['turns'][1]}",
                      "identical" if row["tokens_identical"] else f"{row['tokens_differing']} differ")
    console.print(n)


# -- the real loop (as before) ------------------------------------------------------------------------------------
def bench_method(method: str, updates: int, workdir: str, warm_start: bool) -> dict:
    from agentjax.train.loop import train
    from agentjax.train.metrics import read_metrics
    from experiments.crbc.presets import tiny_run

    run = tiny_run(method, 0, updates=updates)
    run = run.replace(out_dir=os.path.join(workdir, method), eval_every=0, checkpoint_every=0)
    if not warm_start:
        run = run.replace(warm_start=None)
    t0 = time.perf_counter()
    train(run)
    wall = time.perf_counter() - t0
    records = read_metrics(run.out_dir)
    later = records[1:]
    median = lambda key: statistics.median(float(r[key]) for r in later)  # noqa: E731
    times = {stage: median(f"time/{stage}") for stage in STAGES}
    turns = median("rollout/num_turns")
    return dict(method=method, updates=len(records), wall_s=wall, warm_start=warm_start, median_s=times,
                first_update_s={stage: float(records[0][f"time/{stage}"]) for stage in STAGES},
                turns_per_update=turns, samples_per_s=turns / times["total"],
                credit_over_update=times["credit"] / times["update"],
                credit_share_of_total=times["credit"] / times["total"])


def print_loop(rows: list[dict]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="the real loop, current tiny preset: median seconds per update (updates 2..N)")
    for col in ("method", *STAGES, "turns", "samples/s", "credit/update"):
        table.add_column(col, justify="left" if col == "method" else "right")
    for r in rows:
        t = r["median_s"]
        table.add_row(r["method"], *(f"{t[s]:.3f}" for s in STAGES), f"{r['turns_per_update']:.0f}",
                      f"{r['samples_per_s']:.1f}", f"{100 * r['credit_over_update']:.2f}%")
    Console(width=150).print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default="d399628", help="the revision to compare with (git worktree)")
    parser.add_argument("--rounds", type=int, default=2, help="baseline / current child runs, alternating")
    parser.add_argument("--updates", type=int, default=3, help="updates per child (the first one compiles)")
    parser.add_argument("--method", default="grpo")
    parser.add_argument("--matmul-reps", type=int, default=20)
    parser.add_argument("--no-compact", action="store_true", help="skip the current preset's row")
    parser.add_argument("--loop", action="store_true", help="also the real loop's split for --methods")
    parser.add_argument("--methods", nargs="+", default=["grpo", "gigpo", "crbc"])
    parser.add_argument("--loop-updates", type=int, default=4)
    parser.add_argument("--warm-start", action="store_true", help="the loop runs from the cached warm start")
    parser.add_argument("--dense", action="store_true",
                        help="the current side decodes with full-vocabulary logits, as the baseline does (default: "
                             "sparse constrained decoding, today's tiny presets' path; the numbers are compared)")
    parser.add_argument("--out", type=pathlib.Path, default=RESULTS)
    args = parser.parse_args()
    if args.updates < 2 or args.loop_updates < 2:
        parser.error("--updates and --loop-updates must be >= 2 (the first update compiles)")
    load_start = os.getloadavg()
    rev = subprocess.run(["git", "rev-parse", "--short", args.baseline], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout.strip()
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout.strip()
    dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                                capture_output=True, text=True).stdout.strip())
    workdir = tempfile.mkdtemp(prefix="agentjax-bench-train-")
    tree = pathlib.Path(workdir) / "baseline"
    subprocess.run(["git", "worktree", "add", "--detach", str(tree), rev], cwd=ROOT, check=True,
                   capture_output=True)
    out: dict = {}
    try:
        print(f"matmul rates ({args.matmul_reps} reps) ...", flush=True)
        out["matmul"] = matmul_rates(args.matmul_reps)
        base_runs, cur_runs, compact_runs = [], [], []
        for i in range(args.rounds):
            print(f"round {i + 1}/{args.rounds}", flush=True)
            base_runs.append(run_child(tree, "baseline", f"base{i}", workdir, args.updates, args.method))
            cur_runs.append(run_child(ROOT, "baseline", f"cur{i}", workdir, args.updates, args.method,
                                      sparse=not args.dense))
        if not args.no_compact:
            compact_runs.append(run_child(ROOT, "current", "compact0", workdir, args.updates, args.method))
        peak = out["matmul"]["peak_flops_per_s"]
        out["baseline"] = summary(base_runs, peak)
        out["current"] = summary(cur_runs, peak)
        if compact_runs:
            out["compact"] = summary(compact_runs, peak)
        out["numbers"] = [compare_numbers(b, c, workdir) for b, c in zip(base_runs, cur_runs, strict=True)]
        out["children"] = dict(baseline=base_runs, current=cur_runs, compact=compact_runs)
        out["ratio"] = {k: out["baseline"]["median_s"][k] / out["current"]["median_s"][k]
                        for k in ("update", "generate", "collect", "total")}
        if args.loop:
            out["loop"] = [bench_method(m, args.loop_updates, workdir, args.warm_start) for m in args.methods]
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, capture_output=True)
        shutil.rmtree(workdir, ignore_errors=True)
    out["meta"] = dict(machine=platform.machine(), python=platform.python_version(), cpu_count=os.cpu_count(),
                       baseline=rev, current=head + ("+dirty" if dirty else ""), rounds=args.rounds,
                       current_decoding="dense" if args.dense else
                       "sparse with the dense draws (sparse_logits, dense_draws)",
                       updates=args.updates, method=args.method, loadavg_start=load_start,
                       loadavg_end=os.getloadavg(), date=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                       credit_target=CREDIT_TARGET)
    print_tables(out)
    if "loop" in out:
        print_loop(out["loop"])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
