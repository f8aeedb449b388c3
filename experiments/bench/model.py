"""Benchmark: the agentjax Qwen decoder (JAX, CPU) against transformers + PyTorch (CPU, fp32) on the same weights.

A random ``Qwen2ForCausalLM`` is built by transformers from ``QwenConfig.to_hf()``, written with
``save_pretrained`` and read back with :func:`agentjax.models.hf.load_hf`, so both sides hold bit-identical float32
weights. Two sizes: ``tiny`` (:meth:`QwenConfig.tiny_qwen2`) and ``0.5b-L4`` (Qwen2.5-0.5B's widths and its
151,936-token vocabulary, 4 blocks instead of 24). Per size:

``prefill``
    The forward over a ``B × L`` prompt and the float32 logits of the last position only. Ours: a jitted
    ``decode`` (no cache) + ``logits`` of position ``L − 1``; torch: ``model(ids, logits_to_keep=1,
    use_cache=False)`` under ``inference_mode``. tokens/s = B·L / time.
``decode bB``
    Greedy generation of exactly N new tokens after a P-token prompt (prefill of the prompt included), batch B.
    Ours: ``Sampler.generate`` (prompt bucket = P, so no padding); torch: ``model.generate(do_sample=False,
    max_new_tokens=N, min_new_tokens=N)`` with its default dynamic cache, EOS disabled. tokens/s = B·N / time.
    ``--static-cache`` adds transformers' ``cache_implementation="static"`` (eager, no ``torch.compile``).
``train``
    One forward + backward of the mean next-token NLL over ``B × L`` tokens, no optimizer update in either.
    Ours: jitted ``jax.value_and_grad`` over the parameters, the NLL from
    :func:`agentjax.models.logprobs.chunked_logprobs` on the final hidden states (``remat=False``: the logits
    are computed in one piece and kept for the backward pass, the same memory as torch's full logits);
    torch: ``model(ids, labels=ids).loss.backward()`` (full ``[B, L, V]`` logits, ``zero_grad(set_to_none=True)``
    first).
    tokens/s = B·L / time.

Timing: ours is called once first (compile + one run; ``compile_s`` = that call minus the median), torch once as
a warm-up; then the two alternate ``repeats`` times so both see the same machine noise, and each side's median is
reported. torch keeps its default thread count. Calls under 0.5 s alternate in blocks of 8 calls whose first 3
are not timed: torch's OpenMP threads keep spinning for a while after a parallel region (and XLA's likewise), so a
short call made right after the other library's calls shares the cores with them (the first calls of a block
are the slow ones; from the fourth on both sides run as fast as alone in a process).
Quote the ratio, not the absolute numbers, and only from a quiet machine: with another process on one of two
cores, torch's OpenMP parallel regions stall (by orders of magnitude on the tiny prefill) while XLA's thread pool
degrades gracefully, so the load average is recorded (``loadavg_start``, per row ``loadavg_1min``) and a warning
printed when it is high.

Prints a table (size × metric: ours tok/s, torch tok/s, ratio ours/torch, our compile time) and writes
``experiments/bench/results/model.json``. Usage: ``python experiments/bench/model.py [--quick] [--static-cache]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import pathlib
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import flax
import jax
import jax.numpy as jnp
import numpy as np
import torch
import transformers
from flax import nnx

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from harness import write_json  # noqa: E402

from agentjax.models.config import QwenConfig  # noqa: E402
from agentjax.models.hf import load_hf  # noqa: E402
from agentjax.models.logprobs import chunked_logprobs  # noqa: E402
from agentjax.models.qwen import Qwen  # noqa: E402
from agentjax.models.sampler import Sampler, SamplingParams  # noqa: E402

RESULTS = pathlib.Path(__file__).resolve().parent / "results" / "model.json"
SHORT_CALL_S = 0.5  # calls shorter than this are timed in blocks (module docstring, "Timing")
BLOCK = 8  # calls per block
UNTIMED = 3  # the first calls of a block, not timed


@dataclasses.dataclass(frozen=True)
class Shapes:
    """The workload of one size."""

    prefill: tuple[int, int]  # (B, L)
    decode_batches: tuple[int, ...]
    prompt: int  # P
    new_tokens: int  # N
    train: tuple[int, int]  # (B, L)
    repeats: int  # alternating timed calls of each side (heavy metrics use fewer, see heavy_repeats)
    heavy_repeats: int


def sizes(quick: bool) -> list[tuple[str, QwenConfig, Shapes]]:
    if quick:
        return [
            ("tiny", QwenConfig.tiny_qwen2(), Shapes((2, 64), (1, 4), 8, 8, (2, 64), 2, 1)),
            ("0.5b-L1", QwenConfig.qwen2p5_0p5b(num_layers=1), Shapes((1, 64), (1, 4), 8, 4, (1, 64), 2, 1)),
        ]
    return [
        ("tiny", QwenConfig.tiny_qwen2(), Shapes((4, 256), (1, 32), 16, 64, (4, 256), 15, 9)),
        ("0.5b-L4", QwenConfig.qwen2p5_0p5b(num_layers=4), Shapes((4, 256), (1, 32), 16, 32, (4, 256), 5, 3)),
    ]


# -- timing ---------------------------------------------------------------------------------------------------------
def _timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = jax.block_until_ready(fn())  # torch tensors and NumPy pass through unchanged
    return time.perf_counter() - t0, out


def compare(ours: Callable[[], Any], theirs: Callable[[], Any], repeats: int) -> dict:
    """Median seconds per call of both after a compile / warm-up call each, in alternating blocks (module docstring).

    Calls shorter than ``SHORT_CALL_S`` run in blocks of ``BLOCK`` consecutive calls whose first ``UNTIMED`` calls
    are not timed; longer ones alternate call by call.
    """
    first_s, _ = _timed(ours)
    theirs_warm_s, _ = _timed(theirs)
    block = BLOCK if max(_timed(ours)[0], theirs_warm_s) < SHORT_CALL_S else 1
    ours_s, theirs_s = [], []
    for _ in range(repeats):
        for fn, times in ((ours, ours_s), (theirs, theirs_s)):
            block_s = [_timed(fn)[0] for _ in range(block)]
            times.extend(block_s[UNTIMED:] if block > 1 else block_s)
    ours_med, theirs_med = statistics.median(ours_s), statistics.median(theirs_s)
    return dict(ours_s=ours_med, torch_s=theirs_med, compile_s=max(first_s - ours_med, 0.0), first_call_s=first_s,
                block=block, ours_all_s=ours_s, torch_all_s=theirs_s)


# -- the two models on the same weights -----------------------------------------------------------------------------
def make_pair(config: QwenConfig, folder: pathlib.Path) -> tuple[transformers.PreTrainedModel, Qwen]:
    torch.manual_seed(0)
    fields = config.to_hf()
    for special in ("bos_token_id", "eos_token_id"):  # Qwen's ids lie outside a test-size vocabulary
        if fields[special] >= config.vocab_size:
            fields[special] = None
    hf_config = transformers.Qwen2Config(**fields)
    hf_model = transformers.Qwen2ForCausalLM(hf_config).eval()
    hf_model.save_pretrained(folder)
    hf_model.generation_config.eos_token_id = None  # exactly N new tokens on both sides
    hf_model.generation_config.pad_token_id = 0
    return hf_model, load_hf(folder)


def bench_prefill(hf_model, model: Qwen, shapes: Shapes, rng: np.random.RandomState) -> dict:
    b, l = shapes.prefill
    tokens = rng.randint(0, model.config.vocab_size, (b, l))
    graphdef, params = nnx.split(model)

    @jax.jit
    def last_logits(params, tokens_bl):
        m = nnx.merge(graphdef, params)
        return m.logits(m.decode(tokens_bl).hidden_bld[:, -1:, :])

    ids = torch.tensor(tokens)
    tokens_j = jnp.asarray(tokens, jnp.int32)

    def theirs():
        with torch.inference_mode():
            return hf_model(ids, logits_to_keep=1, use_cache=False).logits

    row = compare(lambda: last_logits(params, tokens_j), theirs, shapes.repeats)
    ours_z, ref_z = np.asarray(last_logits(params, tokens_j)), theirs().numpy()
    row.update(metric="prefill", shape=f"B{b} L{l}", tokens=b * l,
               check=dict(max_abs_logit_diff=float(np.abs(ours_z - ref_z).max()),
                          max_abs_logit=float(np.abs(ref_z).max())))
    return row


def bench_decode(hf_model, model: Qwen, shapes: Shapes, batch: int, rng: np.random.RandomState,
                 static_cache: bool) -> dict:
    p, n = shapes.prompt, shapes.new_tokens
    prompts = rng.randint(0, model.config.vocab_size, (batch, p))
    sampler = Sampler(model)
    params = SamplingParams(temperature=0.0, max_new_tokens=n, prompt_bucket=p)
    key = jax.random.key(0)
    ids, mask = torch.tensor(prompts), torch.ones((batch, p), dtype=torch.long)

    def ours():
        return sampler.generate(prompts.tolist(), params, key).tokens_bt

    def theirs(**kw):
        with torch.inference_mode():
            return hf_model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=n, min_new_tokens=n,
                                     **kw)

    repeats = shapes.repeats if batch == 1 else shapes.heavy_repeats
    row = compare(ours, theirs, repeats)
    out, ref = sampler.generate(prompts.tolist(), params, key), theirs()[:, p:].numpy()
    if out.tokens_bt.shape != (batch, n) or ref.shape != (batch, n) or (out.length_b != n).any():
        raise RuntimeError(f"expected {n} new tokens a row on both sides: ours {out.length_b}, torch {ref.shape}")
    row.update(metric=f"decode b{batch}", shape=f"B{batch} P{p} N{n}", tokens=batch * n,
               check=dict(greedy_token_match=float((out.tokens_bt == ref).mean())))
    if static_cache:
        try:
            static = statistics.median(_timed(lambda: theirs(cache_implementation="static"))[0]
                                       for _ in range(1 + repeats))
            row["torch_static_s"] = static
        except Exception as err:  # optional: report why it did not run
            row["torch_static_error"] = f"{type(err).__name__}: {err}"[:300]
    return row


def bench_train(hf_model, model: Qwen, shapes: Shapes, rng: np.random.RandomState, chunk: int) -> dict:
    b, l = shapes.train
    tokens = rng.randint(0, model.config.vocab_size, (b, l))
    graphdef, params = nnx.split(model)

    def loss_fn(params, tokens_bl):
        m = nnx.merge(graphdef, params)
        hidden = m.decode(tokens_bl).hidden_bld
        logp, _ = chunked_logprobs(hidden[:, :-1], m.unembedding_vd, tokens_bl[:, 1:], chunk=chunk, remat=False)
        return -jnp.mean(logp)

    step = jax.jit(jax.value_and_grad(loss_fn))
    tokens_j = jnp.asarray(tokens, jnp.int32)
    ids = torch.tensor(tokens)

    def theirs():
        hf_model.zero_grad(set_to_none=True)
        loss = hf_model(ids, labels=ids, use_cache=False).loss
        loss.backward()
        return loss.detach()

    hf_model.train()  # dropout is 0 in Qwen2; train() only for form
    try:
        row = compare(lambda: step(params, tokens_j), theirs, shapes.heavy_repeats)
        ours_loss, ref_loss = float(step(params, tokens_j)[0]), float(theirs())
    finally:
        hf_model.zero_grad(set_to_none=True)
        hf_model.eval()
    row.update(metric="train", shape=f"B{b} L{l}", tokens=b * l,
               check=dict(loss_ours=ours_loss, loss_torch=ref_loss, chunk=chunk))
    return row


def run_size(name: str, config: QwenConfig, shapes: Shapes, static_cache: bool, chunk: int) -> list[dict]:
    rng = np.random.RandomState(0)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        hf_model, model = make_pair(config, pathlib.Path(tmp))
        print(f"[{name}] built, saved and loaded in {time.perf_counter() - t0:.1f}s "
              f"({config.num_params() / 1e6:.1f}M parameters, attention: {hf_model.config._attn_implementation})",
              flush=True)
        jobs = [lambda: bench_prefill(hf_model, model, shapes, rng)]
        jobs += [lambda b=b: bench_decode(hf_model, model, shapes, b, rng, static_cache) for b in shapes.decode_batches]
        jobs += [lambda: bench_train(hf_model, model, shapes, rng, chunk)]
        for job in jobs:
            row = job()
            row.update(size=name, ours_tok_s=row["tokens"] / row["ours_s"], torch_tok_s=row["tokens"] / row["torch_s"],
                       loadavg_1min=os.getloadavg()[0])
            row["ratio"] = row["ours_tok_s"] / row["torch_tok_s"]
            if "torch_static_s" in row:
                row["torch_static_tok_s"] = row["tokens"] / row["torch_static_s"]
            rows.append(row)
            print(f"[{name}] {row['metric']:<10} {row['shape']:<14} ours {row['ours_tok_s']:10.1f} tok/s  torch "
                  f"{row['torch_tok_s']:10.1f} tok/s  x{row['ratio']:.2f}  compile {row['compile_s']:.1f}s  "
                  f"{row['check']}", flush=True)
    return rows


def print_table(rows: list[dict]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="agentjax (JAX) vs transformers + PyTorch, CPU fp32, same weights (median tokens/s)")
    cols = ("size", "metric", "shape", "ours tok/s", "torch tok/s", "ours/torch", "compile s", "torch static tok/s")
    for col in cols:
        table.add_column(col, justify="left" if col in ("size", "metric", "shape") else "right")
    for r in rows:
        static = f"{r['torch_static_tok_s']:.1f}" if "torch_static_tok_s" in r else (
            "error" if "torch_static_error" in r else "")
        table.add_row(r["size"], r["metric"], r["shape"], f"{r['ours_tok_s']:.1f}", f"{r['torch_tok_s']:.1f}",
                      f"{r['ratio']:.2f}x", f"{r['compile_s']:.1f}", static)
    Console(width=140).print(table)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small shapes, 1-2 repeats (smoke run)")
    parser.add_argument("--only", choices=("tiny", "0.5b"), help="run one size")
    parser.add_argument("--static-cache", action="store_true",
                        help="also time transformers' generate with cache_implementation='static'")
    parser.add_argument("--chunk", type=int, default=128,
                        help="chunked_logprobs chunk of our training step (no effect with remat=False, as here)")
    parser.add_argument("--out", type=pathlib.Path, default=RESULTS)
    args = parser.parse_args()
    load_start = os.getloadavg()
    if load_start[0] > 0.5:
        print(f"warning: load average {load_start[0]:.2f} before the start: other processes share the {os.cpu_count()} "
              "cores; torch's OpenMP threads slow down sharply when a core is taken (each parallel region waits for "
              "the descheduled thread), so the ratios overstate ours. Rerun on a quiet machine.", flush=True)
    rows = []
    for name, config, shapes in sizes(args.quick):
        if args.only is None or name.startswith(args.only):
            rows += run_size(name, config, shapes, args.static_cache, args.chunk)
    print_table(rows)
    meta = dict(jax=jax.__version__, flax=flax.__version__, torch=torch.__version__,
                transformers=transformers.__version__, backend=jax.default_backend(), cpu_count=os.cpu_count(),
                torch_threads=torch.get_num_threads(), xla_flags=os.environ.get("XLA_FLAGS", ""),
                machine=platform.machine(), processor=platform.processor(), python=platform.python_version(),
                date=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"), quick=args.quick,
                dtype="float32", chunk=args.chunk, loadavg_start=load_start, loadavg_end=os.getloadavg(),
                sizes={name: dataclasses.asdict(shapes) | dict(config=dataclasses.asdict(config))
                       for name, config, shapes in sizes(args.quick)},
                note="tokens/s: prefill and train count B*L, decode counts B*N generated tokens (prompt prefill "
                     "included in the time); ratio = ours/torch; timed calls alternate between the two sides")
    write_json(rows, args.out, meta)
    print(f"wrote {args.out}")
    slow = [f"{r['size']} {r['metric']} (x{r['ratio']:.2f})" for r in rows if r["ratio"] < 1.0]
    if slow:
        print("below the 1.0x target: " + ", ".join(slow))


if __name__ == "__main__":
    main()
