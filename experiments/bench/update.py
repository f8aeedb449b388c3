"""Benchmark: one update of the tiny Sokoban preset against this CPU's float32 matmul rate, measured in the same run.

The run is the CRBC paper's tiny preset (:func:`experiments.crbc.presets.tiny_run`: Sokoban, compact prompts,
constrained sparse decoding, the 2-layer d = 64 Qwen2 policy with the 151,936-token vocabulary), from random-init
weights (no warm start), evaluation and checkpoints off. It follows the trainer loop's order
(:func:`agentjax.train.trainer.train`): collect (``generate``: the sampler's calls, ``prompt``: templating and
tokenising, ``env``: the environments), credit (advantages, blocked on), update (the optimizer steps over every row,
micro-batched, blocked on). ``--updates`` updates are timed; each stage's median over updates 2..N is reported, the
first update (which compiles) apart.

**The bound.** A jitted ``[S, S] @ [S, S]`` float32 matmul (``--matmul-size``), timed ``--matmul-reps`` times
before and again after the updates; the best rate of all is this CPU's achievable FLOP/s. Each stage's *ratio* is
its useful FLOP/s over that rate: the fraction of the bound it reaches. On a shared machine the matmul's median can
sit well below its best; ``ratio_to_median_matmul`` divides by the larger of the two medians instead, and
``ratio_best_update`` is the ratio of the fastest timed update (the least disturbed by other processes).

**Useful FLOPs** are counted analytically from the config and the batch's real tokens (not from XLA's
``cost_analysis``, which counts the compiled program's padded slots and need not multiply a loop's body by its trip
count); every row is one policy turn with ``P_b`` prompt and ``R_b`` reply tokens, ``T_b = P_b + R_b``, ``A``
allowed-token slots a reply position::

    per token, the blocks' matmuls     M = 2 · L · (D·N·H + 2·D·K·H + N·H·D + 3·D·F)
    causal attention, queries s..t-1   attn(s, t) = L · 2 · N·H · (t (t + 1) − s (s + 1))   (q·kᵀ and p·v, keys ≤ i)
    forward of a row after a prefix    fwd_b = M · (T_b − S) + attn(S, T_b) + 2·D·A·R_b   (the allowed ids' logits)
    update                             (3 + [β_KL > 0]) · (Σ_b fwd_b + steps · (M · S + attn(0, S)))
    generate                           Σ_b  M · P_b + attn(0, P_b)                           (prefill)
                                          + Σ_{j<R_b} M + L · 4 · N·H · (P_b + j + 1) + 2·D·A   (decode steps)

that is 2·N·tokens for generation and 6·N·tokens (8 with the KL term's reference forward) for the update, with
the attention and logit terms spelled out. ``S`` is the real rows' shared prompt prefix that the update decodes
once (:func:`agentjax.train.compact.compact_rows`, on by default on one CPU device; 0 without it), counted once
per optimizer step (``steps`` = epochs × mini-batches: the parameters change between steps); the sampler has no
prefix cache, so generation counts every row's whole prompt. Padding rows and slots, dummy rows in the
sampler's batches, recomputation and the optimizer's element-wise arithmetic are not counted:
achieved = useful FLOPs / seconds.

Writes ``experiments/bench/results/update.json`` (``--out``). Usage::

    python experiments/bench/update.py            # 5 updates, a 2048 matmul: a few minutes on 2 cores
    python experiments/bench/update.py --quick    # 2 small updates (2 groups x 4 rollouts x 6 steps), a 512 matmul
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
BENCH = pathlib.Path(__file__).resolve().parent
# this folder holds envs.py, which would shadow the top-level ``envs`` package that agentjax imports
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != str(BENCH)]
sys.path.insert(0, str(ROOT))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import jaxlib  # noqa: E402
import numpy as np  # noqa: E402

RESULTS = BENCH / "results" / "update.json"
STAGES = ("collect", "generate", "prompt", "env", "credit", "update", "total")
QUICK_SIZES = dict(num_groups=2, group_size=4, max_steps=6, micro_batch_size=12)


def matmul_rate(size: int, reps: int) -> dict:
    """FLOP/s of a jitted float32 ``[size, size] @ [size, size]``: the best and the median of ``reps`` calls."""
    key_a, key_b = jax.random.split(jax.random.key(size))
    a = jax.random.normal(key_a, (size, size), jnp.float32)
    b = jax.random.normal(key_b, (size, size), jnp.float32)
    fn = jax.jit(jnp.matmul)
    jax.block_until_ready(fn(a, b))
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(a, b))
        times.append(time.perf_counter() - t0)
    flops = 2.0 * size**3
    return dict(size=size, reps=reps, best_flops_per_s=flops / min(times),
                median_flops_per_s=flops / statistics.median(times))


def build_run(method: str, updates: int, quick: bool, workdir: str):
    """The tiny preset as the trainer runs it, from random-init weights, evaluation and checkpoints off."""
    from experiments.crbc.presets import tiny_run

    run = tiny_run(method, 0, updates=updates)
    if quick:
        run = run.with_sizes(**QUICK_SIZES)
    return run.replace(out_dir=os.path.join(workdir, method), eval_every=0, checkpoint_every=0, warm_start=None,
                       progress=False)


def arch_of(run) -> dict:
    arch = run.train.model.arch
    return dict(vocab=arch.vocab_size, d_model=arch.d_model, layers=arch.num_layers, heads=arch.num_heads,
                kv_heads=arch.num_kv_heads, head_dim=arch.head_dim, mlp=arch.mlp_dim)


def useful_flops(arch: dict, kl: bool, prompt_b: np.ndarray, reply_b: np.ndarray, allowed: int, prefix: int,
                 steps: int) -> dict:
    """Useful FLOPs of one update's generate and update stages from the real rows' token counts (module docstring)."""
    d, layers, n, k, h, f = (arch[x] for x in ("d_model", "layers", "heads", "kv_heads", "head_dim", "mlp"))
    per_token = 2 * layers * (d * n * h + 2 * d * k * h + n * h * d + 3 * d * f)
    p, r = prompt_b.astype(np.float64), reply_b.astype(np.float64)
    t = p + r
    attn = lambda s, x: layers * 2 * n * h * (x * (x + 1) - s * (s + 1))  # noqa: E731
    forward = per_token * (t - prefix) + attn(prefix, t) + 2 * d * allowed * r
    update = (3 + int(kl)) * (forward.sum() + steps * (per_token * prefix + attn(0, prefix)))
    # decode step j of a row attends to p + j + 1 keys: Σ_{j<r} (p + j + 1) = r·p + r(r + 1)/2
    decode_keys = r * p + r * (r + 1) / 2
    generate = (per_token * p + attn(0, p)).sum() + (per_token * r + layers * 4 * n * h * decode_keys
                                                      + 2 * d * allowed * r).sum()
    return dict(update=float(update), generate=float(generate))


def time_updates(run) -> list[dict]:
    """The trainer's collect -> credit -> update, ``run.updates`` times, each stage timed (module docstring)."""
    from agentjax.train.compact import COMPACT_BUCKET, compact_rows
    from agentjax.train.state import next_key, sync_model
    from agentjax.train.trainer import setup, task_stream

    t = setup(run)
    algorithm = t.algorithm  # the flat methods' (agentjax.train.flat.FlatAlgorithm)
    cfg, ro, arch = run.train, run.train.rollout, arch_of(run)
    kl = run.train.loss.kl_coef > 0
    compacted = hasattr(algorithm.update_fn, "jitted")  # make_update's compact_rows wrapper
    steps = cfg.epochs * cfg.mini_batches
    records = []
    try:
        for i in range(run.updates):
            t0 = time.perf_counter()
            sync_model(t.model, t.state, copy=False)
            t.sampler.update_weights(t.model)
            idx = task_stream(len(t.train_tasks), cfg.seed, int(t.state.data_position), ro.num_groups)
            state, key = next_key(t.state)
            collected = algorithm.collect(state, t.sampler, [t.train_tasks[j] for j in idx], idx, key)
            batch, stats = collected.steps, collected.stats
            t_collect = time.perf_counter() - t0
            state = state.replace(data_position=state.data_position + 1)
            t0 = time.perf_counter()
            collected = algorithm.credit(state, collected)
            t_credit = time.perf_counter() - t0
            state, key = next_key(state)
            t0 = time.perf_counter()
            state, metrics = algorithm.update(state, collected, key)
            t_update = time.perf_counter() - t0
            t.state = state
            rows = np.asarray(batch.row_mask)
            prompt_b = np.asarray(batch.prompt_mask)[rows].sum(1)
            reply_b = np.asarray(batch.response_mask)[rows].sum(1)
            allowed = int(batch.allowed_tokens.shape[2]) if batch.allowed_tokens is not None else arch["vocab"]
            prefix_p = compact_rows(batch, COMPACT_BUCKET)[1] if compacted else None
            prefix = 0 if prefix_p is None else len(prefix_p)
            seconds = dict(collect=t_collect, generate=stats.generate_seconds, prompt=stats.prompt_seconds,
                           env=stats.env_seconds, credit=t_credit, update=t_update,
                           total=t_collect + t_credit + t_update)
            records.append(dict(
                seconds=seconds, flops=useful_flops(arch, kl, prompt_b, reply_b, allowed, prefix, steps),
                batch=dict(rows=int(rows.sum()), capacity=int(rows.shape[0]), prompt_tokens=int(prompt_b.sum()),
                           reply_tokens=int(reply_b.sum()), prompt_slots=int(batch.prompt_mask.shape[1]),
                           reply_slots=int(batch.response_mask.shape[1]), allowed_slots=allowed,
                           shared_prefix=prefix,
                           generate_calls=int(stats.num_generate_calls), padded_rows=int(stats.num_padded_rows)),
                metrics={name: float(metrics[name]) for name in ("loss", "grad_norm") if name in metrics}))
            print(f"update {i + 1}/{run.updates}: collect {t_collect:.2f} s (generate {stats.generate_seconds:.2f}), "
                  f"credit {t_credit:.3f} s, update {t_update:.2f} s, {int(rows.sum())} rows", flush=True)
    finally:
        t.close()
    return records


def summarise(records: list[dict], bound: float, median_bound: float) -> dict:
    timed = records[1:]  # the first update compiles
    med = lambda f: statistics.median(f(r) for r in timed)  # noqa: E731
    seconds = {s: med(lambda r, s=s: r["seconds"][s]) for s in STAGES}
    achieved = {s: med(lambda r, s=s: r["flops"][s] / r["seconds"][s]) for s in ("generate", "update")}
    return dict(
        median_s=seconds, first_update_s=records[0]["seconds"],
        flops={s: med(lambda r, s=s: r["flops"][s]) for s in ("generate", "update")},
        achieved_flops_per_s=achieved, ratio={s: v / bound for s, v in achieved.items()},
        ratio_to_median_matmul={s: v / median_bound for s, v in achieved.items()},
        ratio_best_update={s: max(r["flops"][s] / r["seconds"][s] for r in timed) / bound
                           for s in ("generate", "update")},
        credit_over_update=seconds["credit"] / seconds["update"],
        rows=med(lambda r: r["batch"]["rows"]),
        samples_per_s=med(lambda r: r["batch"]["rows"] / r["seconds"]["total"]),
    )


def cpu_model() -> str:
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def git_revision() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", "agentjax", "envs",
                            "experiments"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    return head + ("+dirty" if dirty else "")


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--method", default="grpo", help="the credit method of the tiny preset")
    parser.add_argument("--updates", type=int, default=None, help="updates to run; the first one compiles "
                        "(default 5, --quick 2)")
    parser.add_argument("--matmul-size", type=int, default=None, help="S of the S x S matmul (default 2048, "
                        "--quick 512)")
    parser.add_argument("--matmul-reps", type=int, default=10, help="timed matmuls before and after the updates")
    parser.add_argument("--quick", action="store_true", help="2 groups x 4 rollouts x 6 steps, 2 updates, a 512 "
                        "matmul: the smallest configuration (tests)")
    parser.add_argument("--out", type=pathlib.Path, default=RESULTS)
    args = parser.parse_args(argv)
    updates = args.updates or (2 if args.quick else 5)
    size = args.matmul_size or (512 if args.quick else 2048)
    if updates < 2:
        parser.error("--updates must be >= 2 (the first update compiles and is not in the medians)")

    load_start = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="agentjax-bench-update-") as workdir:
        run = build_run(args.method, updates, args.quick, workdir)
        print(f"matmul {size}x{size} ({args.matmul_reps} reps) ...", flush=True)
        before = matmul_rate(size, args.matmul_reps)
        records = time_updates(run)
        after = matmul_rate(size, args.matmul_reps)
    bound = max(before["best_flops_per_s"], after["best_flops_per_s"])
    median_bound = max(before["median_flops_per_s"], after["median_flops_per_s"])
    ro, co = run.train.rollout, run.train_collect
    out = dict(
        meta=dict(script="experiments/bench/update.py", date=datetime.datetime.now(datetime.UTC).isoformat(
                      timespec="seconds"), revision=git_revision(), jax=jax.__version__, jaxlib=jaxlib.__version__,
                  python=platform.python_version(), cpu=cpu_model(), cpu_count=os.cpu_count(),
                  device=str(jax.devices()[0].device_kind), loadavg_start=load_start, loadavg_end=os.getloadavg(),
                  flops="analytic (module docstring of experiments/bench/update.py)"),
        settings=dict(preset="experiments.crbc.presets.tiny_run", env=run.env, method=args.method, quick=args.quick,
                      updates=updates, warm_start=None, num_groups=ro.num_groups, group_size=ro.group_size,
                      max_steps=ro.max_steps, prompt_len=ro.prompt_len, response_len=ro.response_len,
                      micro_batch_size=run.train.micro_batch_size, mini_batches=run.train.mini_batches,
                      epochs=run.train.epochs,
                      kl_coef=run.train.loss.kl_coef, sparse_logits=co.sparse_logits, prompt=co.prompt,
                      arch=arch_of(run)),
        bound=dict(flops_per_s=bound, matmul_before=before, matmul_after=after),
        summary=summarise(records, bound, median_bound),
        updates=records,
    )
    s = out["summary"]
    print(f"\nbound: {bound / 1e9:.1f} GFLOP/s (float32 {size}x{size} matmul, best of {2 * args.matmul_reps})")
    print(f"{'stage':<10}{'median s':>10}{'GFLOP':>10}{'GFLOP/s':>10}{'of bound':>10}")
    for stage in ("generate", "update"):
        print(f"{stage:<10}{s['median_s'][stage]:>10.3f}{s['flops'][stage] / 1e9:>10.2f}"
              f"{s['achieved_flops_per_s'][stage] / 1e9:>10.2f}{100 * s['ratio'][stage]:>9.1f}%")
    for stage in ("prompt", "env", "credit", "collect", "total"):
        print(f"{stage:<10}{s['median_s'][stage]:>10.3f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.out}")
    return out


if __name__ == "__main__":
    main()
