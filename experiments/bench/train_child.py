"""Measurement child of ``experiments/bench/train.py``: the tiny preset's collect / credit / update, timed, as JSON.

Run with ``PYTHONPATH`` at the tree under test (the current checkout or a ``git worktree`` of the baseline
revision); it uses only APIs present in both (``experiments.crbc.presets.tiny_run``, ``agentjax.train.loop.setup``
/ ``task_stream``, ``agentjax.rollout.collect.collect``, ``agentjax.train.advantages.compute_advantages``, the
Trainer's ``update``, ``agentjax.train.state.next_key`` / ``sync_model``) and follows the loop's order
(``agentjax.train.loop.train``) with evaluation and checkpoints off, from random-init weights (no warm start), so
two trees with the same numerics collect the same episodes.

``--setting baseline`` reconstructs the tiny preset of the baseline revision (verl-agent prompts with 2 history
records, 640 prompt slots bucketed at 640, 4 groups × 8 rollouts × 15 steps, 10 reply tokens, micro-batch 40,
4 mini-batches); ``--setting current`` is this tree's tiny preset as it is. Besides the stage times it records
what the parent's "where the rest goes" table needs: compiles (``jax.monitoring``), jitted calls per update
(prefill / decode / update / credit wrappers), host seconds of the collector's pieces, padding counts, the
batch's real token counts (for the FLOP count) and the per-update metrics plus the sampled tokens (``.npz``) for
the numbers comparison. Prints one JSON object on the last line of stdout.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import functools
import hashlib
import json
import os
import statistics
import sys
import time

import numpy as np

# this folder holds envs.py, which would shadow the ``envs`` package of the tree under test (PYTHONPATH)
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]


def _timed(table: dict, name: str, fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            table[name] += time.perf_counter() - t0
    return wrapper


def _counted(table: dict, name: str, fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        table[name] += 1
        return fn(*args, **kwargs)
    return wrapper


def baseline_run(run):
    """The tiny preset's settings at the baseline revision, rebuilt explicitly (module docstring)."""
    run = run.with_sizes(num_groups=4, group_size=8, max_steps=15, prompt_len=640, response_len=10,
                         micro_batch_size=40)
    changes = dict(history_length=2, constrained=True, masked_logp=True, batch_bucket=8,
                   sampling=dataclasses.replace(run.collect.sampling, prompt_bucket=640))
    if hasattr(run.collect, "prompt"):  # the baseline has verl-agent prompts only
        changes["prompt"] = "verl-agent"
    for name, value in (("row_keys", False), ("sparse_logits", False), ("pow2_batches", False)):
        if hasattr(run.collect, name):  # fields the baseline lacks: their baseline behaviour
            changes[name] = value
    train = run.train.replace(mini_batches=4) if hasattr(run.train, "mini_batches") else run.train
    # the baseline's AdamW step: the tiny Sokoban preset's has changed since (TINY_LEARNING_RATES)
    train = train.replace(optimizer=dataclasses.replace(train.optimizer, learning_rate=2e-3))
    return run.replace(collect=run.collect.replace(**changes), train=train)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--setting", choices=("baseline", "current"), default="baseline")
    parser.add_argument("--method", default="grpo")
    parser.add_argument("--updates", type=int, default=3, help="updates; the first one compiles")
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--tag", default="run")
    parser.add_argument("--profile", action="store_true", help="one more update under jax.profiler.trace")
    parser.add_argument("--sparse", action="store_true",
                        help="with --setting baseline: decode with the allowed tokens' logits only (sparse_logits, "
                             "today's tiny presets' decoding) and the dense path's draws (dense_draws), the other "
                             "settings unchanged")
    args = parser.parse_args()

    import jax
    import jax.numpy as jnp

    compiles: list[tuple[str, float]] = []
    phase = {"name": "setup"}

    def on_duration(event: str, seconds: float, **_: object) -> None:
        if event.endswith("backend_compile_duration"):
            compiles.append((phase["name"], float(seconds)))

    jax.monitoring.register_event_duration_secs_listener(on_duration)

    import agentjax
    import agentjax.models.sampler as sampler_mod
    import agentjax.rollout.collect as collect_mod
    from agentjax.train.advantages import compute_advantages
    from agentjax.train.loop import setup, task_stream
    from agentjax.train.state import next_key, sync_model
    from experiments.crbc.presets import tiny_run

    host = collections.defaultdict(float)
    calls = collections.Counter()
    for name in ("_encode", "_constraint", "constrained_choices", "to_step_batch", "summarize"):
        if hasattr(collect_mod, name):
            setattr(collect_mod, name, _timed(host, name, getattr(collect_mod, name)))
    for name in ("left_pad",):
        if hasattr(sampler_mod, name):
            setattr(sampler_mod, name, _timed(host, name, getattr(sampler_mod, name)))
    sampler_mod.Sampler._finalise = _timed(host, "finalise", sampler_mod.Sampler._finalise)
    for name in dir(sampler_mod):  # the sampler's module-level jitted functions (prefill, decode, ...)
        obj = getattr(sampler_mod, name)
        if name.startswith("_") and hasattr(obj, "lower") and callable(obj):
            setattr(sampler_mod, name, _counted(calls, name, obj))
    prefill_shapes = []
    if hasattr(sampler_mod, "_prefill"):
        inner = sampler_mod._prefill

        def prefill(graphdef, weights, tokens_bl, segment_bl, *a, **k):
            seg = np.asarray(segment_bl)
            prefill_shapes.append((int(seg.shape[0]), int(seg.shape[1]), int(seg.sum()),
                                   [int(x) for x in seg.sum(1)]))
            return inner(graphdef, weights, tokens_bl, segment_bl, *a, **k)

        sampler_mod._prefill = prefill

    run = tiny_run(args.method, 0, updates=args.updates)
    run = run.replace(out_dir=os.path.join(args.workdir, args.tag), eval_every=0, checkpoint_every=0,
                      warm_start=None, progress=False)
    if args.setting == "baseline":
        run = baseline_run(run)
        if args.sparse:
            run = run.replace(collect=run.collect.replace(sparse_logits=True, dense_draws=True))
    t = setup(run)
    cfg, ro = run.train, run.train.rollout
    records = []
    tokens_per_update = []
    profile_dir = None
    try:
        n = args.updates + (1 if args.profile else 0)
        for i in range(n):
            profiling = args.profile and i == n - 1
            if profiling:
                profile_dir = os.path.join(args.workdir, f"{args.tag}-profile")
                jax.profiler.start_trace(profile_dir, create_perfetto_trace=True)
            host.clear()
            calls.clear()
            prefill_shapes.clear()
            phase["name"] = f"collect{i}"
            t0 = time.perf_counter()
            sync_model(t.model, t.state, copy=False)
            t.sampler.update_weights(t.model)
            idx = task_stream(len(t.train_tasks), cfg.seed, int(t.state.data_position), ro.num_groups)
            state, key = next_key(t.state)
            batch, stats = collect_mod.collect(t.pool, [t.train_tasks[j] for j in idx], t.sampler, run.collect, key,
                                               task_indices=idx)
            t_collect = time.perf_counter() - t0
            state = state.replace(data_position=state.data_position + 1)
            phase["name"] = f"credit{i}"
            t0 = time.perf_counter()
            values = t.value_fn(state, batch) if t.value_fn is not None else None
            adv = jax.block_until_ready(compute_advantages(cfg.credit, batch, ro, values=values))
            t_credit = time.perf_counter() - t0
            state, key = next_key(state)
            phase["name"] = f"update{i}"
            t0 = time.perf_counter()
            state, metrics = t.update(state, batch, adv, key)
            metrics = jax.block_until_ready(metrics)
            t_update = time.perf_counter() - t0
            t.state = state
            phase["name"] = "idle"
            if profiling:
                jax.profiler.stop_trace()
            row_mask = np.asarray(batch.row_mask)
            prompt_mask = np.asarray(batch.prompt_mask)
            response = np.asarray(batch.response_tokens)
            response_mask = np.asarray(batch.response_mask)
            tokens_per_update.append(response)
            rec = dict(
                collect_s=t_collect, generate_s=stats.generate_seconds, prompt_s=stats.prompt_seconds,
                env_s=stats.env_seconds, credit_s=t_credit, update_s=t_update,
                total_s=t_collect + t_credit + t_update, profiled=profiling,
                turns=int(stats.num_turns), generate_calls=int(stats.num_generate_calls),
                padded_rows=int(stats.num_padded_rows), prompt_tokens=int(stats.num_prompt_tokens),
                response_tokens=int(stats.num_response_tokens),
                reward_sum=float(np.asarray(batch.reward)[row_mask].sum()),
                tokens_sha=hashlib.sha256(np.ascontiguousarray(response).tobytes()).hexdigest()[:16],
                metrics={k: float(v) for k, v in metrics.items()},
                host_s=dict(host), calls=dict(calls),
                prefill=[dict(rows=r, slots=s, real=tok, row_real=rr) for r, s, tok, rr in prefill_shapes],
                batch=dict(capacity=int(row_mask.shape[0]), rows=int(row_mask.sum()),
                           prompt_slots=int(prompt_mask.shape[1]),
                           row_prompt_tokens=[int(x) for x in prompt_mask[row_mask].sum(1)],
                           row_response_tokens=[int(x) for x in response_mask[row_mask].sum(1)],
                           response_slots=int(response_mask.shape[1]),
                           allowed_slots=int(batch.allowed_tokens.shape[2]) if batch.allowed_tokens is not None
                           else 0),
            )
            rec["compiles"] = [s for p, s in compiles if p in (f"collect{i}", f"credit{i}", f"update{i}")]
            records.append(rec)
            print(f"[{args.tag}] update {i}: collect {t_collect:.2f}s (generate {stats.generate_seconds:.2f}) "
                  f"update {t_update:.2f}s, {len(rec['compiles'])} compiles", file=sys.stderr, flush=True)
    finally:
        t.pool.close()
        t.checkpoints.close()

    np.savez_compressed(os.path.join(args.workdir, f"{args.tag}-tokens.npz"), *tokens_per_update)

    def best_call(fn, *a, n=200):
        jax.block_until_ready(fn(*a))
        best = float("inf")
        for _ in range(n):
            t0 = time.perf_counter()
            jax.block_until_ready(fn(*a))
            best = min(best, time.perf_counter() - t0)
        return best

    noop = jax.jit(lambda *a: jnp.zeros(()))
    dispatch = dict(decode_s=best_call(noop, t.sampler.weights, jnp.zeros((32, 16))),
                    update_s=best_call(noop, t.state, batch), scalar_s=best_call(noop, jnp.zeros(())))
    compact = None
    try:
        from agentjax.train.update import compact_rows
    except ImportError:
        compact_rows = None
    if compact_rows is not None:
        small, prefix = compact_rows(batch)
        compact = dict(prompt_slots=int(small.prompt_tokens.shape[1]), prefix=0 if prefix is None else len(prefix))
    timed = [r for r in records[1:] if not r["profiled"]] or records[-1:]

    def median(key: str) -> float:
        return statistics.median(r[key] for r in timed)

    arch = run.train.model.arch
    out = dict(
        tag=args.tag, setting=args.setting, agentjax_file=agentjax.__file__, jax=jax.__version__,
        median_s={k: median(f"{k}_s") for k in ("collect", "generate", "prompt", "env", "credit", "update", "total")},
        first_s={k: records[0][f"{k}_s"] for k in ("collect", "generate", "credit", "update")},
        records=records, profile_dir=profile_dir, dispatch=dispatch, compact=compact,
        compiles_setup=[s for p, s in compiles if p == "setup"],
        config=dict(vocab=arch.vocab_size, d_model=arch.d_model, layers=arch.num_layers, heads=arch.num_heads,
                    kv_heads=arch.num_kv_heads, head_dim=arch.head_dim, mlp=arch.mlp_dim,
                    micro_batch=run.train.micro_batch_size, mini_batches=getattr(run.train, "mini_batches", 1),
                    kl_coef=run.train.loss.kl_coef, prompt_len=ro.prompt_len, response_len=ro.response_len,
                    prompt_bucket=run.collect.sampling.prompt_bucket, batch_bucket=run.collect.batch_bucket,
                    prompt=getattr(run.collect, "prompt", "verl-agent"), history=run.collect.history_length),
    )
    print(json.dumps(out))


if __name__ == "__main__":
    main()
