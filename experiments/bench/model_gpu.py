"""GPU benchmark: training tokens/s and MFU, and decode tokens/s, of a Qwen2.5-1.5B-shaped random model in bf16.

Training: a jitted step (forward + backward + AdamW via optax, parameters and optimizer state donated) of the mean
next-token NLL over ``B × L`` random tokens, the NLL from :func:`agentjax.models.logprobs.chunked_logprobs` on
the final hidden states; ``QwenConfig.qwen2p5_1p5b(param_dtype="bfloat16", dtype="bfloat16", remat=True)``.
tokens/s = B·L / median step time;

    MFU = config.flops_per_token(L) · B·L / (step time · peak bf16 FLOP/s)

with the model FLOPs of :meth:`QwenConfig.flops_per_token` (matmuls, 3 × forward, causal attention; the
recomputation of ``remat`` and of the chunked log-probs is not counted, as usual for MFU) and the dense bf16 peak
of the device from :data:`PEAK_BF16_FLOPS` (``--peak-flops`` overrides; unknown devices report no MFU).

Decode: greedy ``Sampler.generate`` of N new tokens after a P-token prompt at batch 64 (prompt prefill included),
after a warm-up call; tokens/s = B·N / median time.

Writes ``experiments/bench/results/model_gpu.json``. Usage::

    python experiments/bench/model_gpu.py                      # on a GPU machine
    python experiments/bench/model_gpu.py --dry-run            # tiny config, small shapes: runs anywhere (CPU)
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import faulthandler
import functools
import os
import pathlib
import platform
import statistics
import sys
import tempfile
import time

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from harness import write_json  # noqa: E402

from agentjax.models.config import QwenConfig  # noqa: E402
from agentjax.models.logprobs import chunked_logprobs  # noqa: E402
from agentjax.models.qwen import Qwen  # noqa: E402
from agentjax.models.sampler import Sampler, SamplingParams  # noqa: E402

RESULTS = pathlib.Path(__file__).resolve().parent / "results" / "model_gpu.json"

# dense bf16 peak FLOP/s (no sparsity), matched in order against jax's device_kind
PEAK_BF16_FLOPS = (
    ("H100 PCIe", 756e12),
    ("H100", 989e12),  # SXM
    ("H200", 989e12),
    ("A100", 312e12),
)


def peak_flops(device: jax.Device, override: float | None) -> float | None:
    if override:
        return override
    kind = getattr(device, "device_kind", "")
    return next((peak for name, peak in PEAK_BF16_FLOPS if name.lower() in kind.lower()), None)


def make_config(args) -> QwenConfig:
    numerics = dict(param_dtype="bfloat16", dtype="bfloat16", remat=not args.no_remat)
    if args.dry_run:
        return QwenConfig.tiny_qwen2(**numerics)
    layers = dict(num_layers=args.layers) if args.layers else {}
    return QwenConfig.preset(args.preset, **numerics, **layers)


def nll(graphdef, params, tokens_bl, chunk):
    model = nnx.merge(graphdef, params)
    hidden = model.decode(tokens_bl).hidden_bld
    logp, _ = chunked_logprobs(hidden[:, :-1], model.unembedding_vd, tokens_bl[:, 1:], chunk=chunk)
    return -jnp.mean(logp)


def bench_train(model: Qwen, args, peak: float | None) -> tuple[dict, Qwen]:
    config = model.config
    b, l = args.batch, args.seq
    graphdef, params = nnx.split(model)
    tx = optax.adamw(learning_rate=1e-5, weight_decay=0.01)
    opt_state = tx.init(params)

    @functools.partial(jax.jit, donate_argnums=(0, 1))
    def train_step(params, opt_state, tokens_bl):
        loss, grads = jax.value_and_grad(functools.partial(nll, graphdef))(params, tokens_bl, args.chunk)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    tokens = jnp.asarray(np.random.RandomState(0).randint(0, config.vocab_size, (b, l)), jnp.int32)
    # compile ahead of time and say so: the log then shows whether the compile or the first step takes the time
    print(f"train B{b} L{l}: compiling", flush=True)
    t0 = time.perf_counter()
    train_step = train_step.lower(params, opt_state, tokens).compile()
    compile_s = time.perf_counter() - t0
    print(f"train: compiled in {compile_s:.1f} s; first step", flush=True)
    t0 = time.perf_counter()
    params, opt_state, loss = jax.block_until_ready(train_step(params, opt_state, tokens))
    first_s = time.perf_counter() - t0
    print(f"train: first step {first_s:.2f} s", flush=True)
    losses, times = [float(loss)], []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        params, opt_state, loss = jax.block_until_ready(train_step(params, opt_state, tokens))
        times.append(time.perf_counter() - t0)
        losses.append(float(loss))
    step_s = statistics.median(times)
    flops = config.flops_per_token(l) * b * l
    row = dict(metric="train", shape=f"B{b} L{l}", tokens=b * l, step_s=step_s, all_s=times,
               compile_s=compile_s, first_call_s=first_s, tokens_per_s=b * l / step_s,
               flops_per_token=config.flops_per_token(l), model_tflops_per_s=flops / step_s / 1e12,
               mfu=(flops / step_s / peak) if peak else None, loss_first=losses[0], loss_last=losses[-1],
               optimizer="optax.adamw(lr=1e-5, weight_decay=0.01), states in the parameter dtype", chunk=args.chunk)
    return row, nnx.merge(graphdef, params)


def without_remat(model: Qwen) -> Qwen:
    """The same parameters under ``remat=False``: remat only matters for gradients, and ``Sampler`` fails on a
    ``remat=True`` model (``nnx.remat`` inside the jitted decode loop raises ``TraceContextError``)."""
    if not model.config.remat:
        return model
    plain = nnx.eval_shape(lambda: Qwen(model.config.replace(remat=False), rngs=nnx.Rngs(0)))
    nnx.update(plain, nnx.state(model))
    return plain


def bench_decode(model: Qwen, args) -> dict:
    model = without_remat(model)
    b, p, n = args.decode_batch, args.prompt_len, args.new_tokens
    prompts = np.random.RandomState(1).randint(0, model.config.vocab_size, (b, p)).tolist()
    sampler = Sampler(model)
    params = SamplingParams(temperature=0.0, max_new_tokens=n, prompt_bucket=p)
    key = jax.random.key(0)
    t0 = time.perf_counter()
    out = sampler.generate(prompts, params, key)
    first_s = time.perf_counter() - t0
    times = []
    for _ in range(args.decode_repeats):
        t0 = time.perf_counter()
        out = sampler.generate(prompts, params, key)  # returns host arrays: synchronised
        times.append(time.perf_counter() - t0)
    gen_s = statistics.median(times)
    generated = int(out.length_b.sum())
    return dict(metric="decode", shape=f"B{b} P{p} N{n}", tokens=generated, generate_s=gen_s, all_s=times,
                compile_s=max(first_s - gen_s, 0.0), first_call_s=first_s, tokens_per_s=generated / gen_s,
                per_step_ms=1e3 * gen_s / n, sampling="greedy, no stop tokens (prompt prefill included)")


def memory_stats(device: jax.Device) -> dict:
    try:
        stats = device.memory_stats() or {}
    except Exception:  # not every backend has them
        return {}
    return {k: stats[k] for k in ("peak_bytes_in_use", "bytes_limit") if k in stats}


def print_table(rows: list[dict]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="agentjax model on the accelerator (median)")
    for col in ("metric", "shape", "tokens/s", "time s", "compile s", "model TFLOP/s", "MFU"):
        table.add_column(col, justify="left" if col in ("metric", "shape") else "right")
    for r in rows:
        time_s = r.get("step_s", r.get("generate_s"))
        tflops = f"{r['model_tflops_per_s']:.1f}" if "model_tflops_per_s" in r else ""
        mfu = f"{100 * r['mfu']:.1f}%" if r.get("mfu") is not None else ("n/a" if r["metric"] == "train" else "")
        table.add_row(r["metric"], r["shape"], f"{r['tokens_per_s']:.1f}", f"{time_s:.3f}", f"{r['compile_s']:.1f}",
                      tflops, mfu)
    Console(width=120).print(table)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="tiny config and small shapes (runs on CPU)")
    parser.add_argument("--preset", default="qwen2.5-1.5b", help="QwenConfig preset name")
    parser.add_argument("--layers", type=int, default=0, help="override the number of blocks")
    parser.add_argument("--no-remat", action="store_true", help="keep activations instead of recomputing them")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--chunk", type=int, default=512, help="chunked_logprobs positions per chunk")
    parser.add_argument("--steps", type=int, default=10, help="timed training steps (after the compile step)")
    parser.add_argument("--decode-batch", type=int, default=64)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--decode-repeats", type=int, default=3)
    parser.add_argument("--skip-decode", action="store_true")
    parser.add_argument("--peak-flops", type=float, default=None, help="peak bf16 FLOP/s of one device")
    parser.add_argument("--stack-dump-every", type=float, default=0,
                        help="print every thread's Python stack every S seconds (to see where a stall is; 0: off)")
    parser.add_argument("--out", type=pathlib.Path, default=None,
                        help=f"default {RESULTS} (a dry run: a file in the temporary directory)")
    args = parser.parse_args()
    if args.out is None:
        args.out = pathlib.Path(tempfile.gettempdir()) / "model_gpu_dry_run.json" if args.dry_run else RESULTS
    if args.dry_run:
        args.batch, args.seq, args.chunk, args.steps = 2, 64, 32, 2
        args.decode_batch, args.prompt_len, args.new_tokens, args.decode_repeats = 4, 8, 8, 1
    if args.stack_dump_every > 0:
        faulthandler.dump_traceback_later(args.stack_dump_every, repeat=True)
    device = jax.devices()[0]
    peak = peak_flops(device, args.peak_flops)
    config = make_config(args)
    print(f"{config.name}: {config.num_params() / 1e9:.2f}B parameters on {device.device_kind} "
          f"({jax.default_backend()}), peak {peak or 'unknown'} FLOP/s", flush=True)
    t0 = time.perf_counter()
    model = Qwen(config, rngs=nnx.Rngs(0))
    init_s = time.perf_counter() - t0
    print(f"model initialised in {init_s:.1f} s", flush=True)
    rows = []
    train, model = bench_train(model, args, peak)
    rows.append(train)
    print(f"train  {train['shape']}: {train['tokens_per_s']:.0f} tok/s, step {train['step_s']:.3f}s, "
          f"compile {train['compile_s']:.1f}s, MFU {train['mfu']}", flush=True)
    train_memory = memory_stats(device)
    if not args.skip_decode:
        decode = bench_decode(model, args)
        rows.append(decode)
        print(f"decode {decode['shape']}: {decode['tokens_per_s']:.0f} tok/s, compile {decode['compile_s']:.1f}s",
              flush=True)
    print_table(rows)
    meta = dict(jax=jax.__version__, flax=flax.__version__, optax=optax.__version__, backend=jax.default_backend(),
                device_kind=device.device_kind, devices=len(jax.devices()), peak_flops=peak,
                xla_flags=os.environ.get("XLA_FLAGS", ""), machine=platform.machine(),
                python=platform.python_version(), dry_run=args.dry_run, init_s=init_s,
                date=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                config=dataclasses.asdict(config), memory_after_train=train_memory, memory_end=memory_stats(device),
                args={k: str(v) for k, v in vars(args).items()})
    write_json(rows, args.out, meta)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
