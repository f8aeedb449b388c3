"""The no-cache attention's two layouts side by side: compile time, step time and program size of a training step.

``QwenConfig.attention_unroll`` decides whether the query blocks of :func:`agentjax.models.qwen.causal_attention`
are unrolled (block ``c`` scores only keys ``[0, c_end)``: the triangle, but one block of program per 64 queries)
or scanned (one block shape in a ``lax.map`` that scores every key under the mask: twice the score FLOPs, a program
that does not grow with the sequence). For each model below, a jitted value-and-grad of a mean-square loss on the
final hidden states over ``B × L`` tokens (remat on), both layouts: lower + compile seconds, the median step
seconds after a warm-up call, and the ``dot`` count of the compiled HLO; the ratios unrolled / scanned.

- ``small-1``, ``small-4``: width 128, 1 and 4 blocks, vocabulary 256, B4 L2048, blocks of 64 queries;
- ``--full``: the Qwen2.5-1.5B shape in bf16 at B8 L2048 with AdamW, blocks of 256, compile only, scanned only
  (abstract parameters: nothing is allocated) — the program the H200 could not compile when unrolled.

Writes ``experiments/bench/results/attention_compile.json``. Usage::

    python experiments/bench/attention_compile.py [--full]
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import optax
from flax import nnx

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from harness import write_json  # noqa: E402

from agentjax.models.config import QwenConfig  # noqa: E402
from agentjax.models.logprobs import chunked_logprobs  # noqa: E402
from agentjax.models.qwen import Qwen  # noqa: E402

RESULTS = pathlib.Path(__file__).resolve().parent / "results" / "attention_compile.json"


def small(layers: int, unroll: int) -> dict:
    cfg = QwenConfig.tiny_qwen2(vocab_size=256, d_model=128, mlp_dim=512, num_layers=layers, num_heads=4,
                                num_kv_heads=2, head_dim=32, attention_chunk=64, attention_unroll=unroll, remat=True)
    graphdef, params = nnx.split(Qwen(cfg, rngs=nnx.Rngs(0)))

    def loss(params, tokens):
        return jnp.mean(nnx.merge(graphdef, params).decode(tokens).hidden_bld.astype(jnp.float32) ** 2)

    tokens = jnp.zeros((4, 2048), jnp.int32)
    t0 = time.perf_counter()
    step = jax.jit(jax.value_and_grad(loss)).lower(params, tokens).compile()
    compile_s = time.perf_counter() - t0
    jax.block_until_ready(step(params, tokens))
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        jax.block_until_ready(step(params, tokens))
        times.append(time.perf_counter() - t0)
    return dict(compile_s=compile_s, step_s=statistics.median(times), dots=step.as_text().count(" dot("))


def full(unroll: int) -> dict:
    cfg = QwenConfig.qwen2p5_1p5b(param_dtype="bfloat16", dtype="bfloat16", remat=True, attention_chunk=256,
                                  attention_unroll=unroll)
    graphdef, params = nnx.split(nnx.eval_shape(lambda: Qwen(cfg, rngs=nnx.Rngs(0))))
    tx = optax.adamw(1e-5)

    def train_step(params, opt_state, tokens):
        def nll(params):
            model = nnx.merge(graphdef, params)
            logp, _ = chunked_logprobs(model.decode(tokens).hidden_bld[:, :-1], model.unembedding_vd, tokens[:, 1:],
                                       chunk=512)
            return -jnp.mean(logp)

        loss, grads = jax.value_and_grad(nll)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    t0 = time.perf_counter()
    lowered = jax.jit(train_step).lower(params, jax.eval_shape(tx.init, params),
                                        jax.ShapeDtypeStruct((8, 2048), jnp.int32))
    lower_s = time.perf_counter() - t0
    compiled = lowered.compile()
    return dict(lower_s=lower_s, compile_s=time.perf_counter() - t0 - lower_s, dots=compiled.as_text().count(" dot("))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="also compile the 1.5B-shaped step (scanned; ~1 min)")
    parser.add_argument("--out", type=pathlib.Path, default=RESULTS)
    args = parser.parse_args()
    rows = []
    for layers in (1, 4):
        unrolled, scanned = small(layers, unroll=64), small(layers, unroll=1)
        row = dict(model=f"small-{layers}", shape="B4 L2048", unrolled=unrolled, scanned=scanned,
                   compile_ratio=unrolled["compile_s"] / scanned["compile_s"],
                   step_ratio=unrolled["step_s"] / scanned["step_s"], dots_ratio=unrolled["dots"] / scanned["dots"])
        rows.append(row)
        print(f"small-{layers} B4 L2048: compile {unrolled['compile_s']:.1f} s unrolled / {scanned['compile_s']:.1f} s "
              f"scanned = {row['compile_ratio']:.2f}x; step {unrolled['step_s']:.2f} / {scanned['step_s']:.2f} s = "
              f"{row['step_ratio']:.2f}x; dots {unrolled['dots']} / {scanned['dots']}", flush=True)
    if args.full:
        scanned = full(unroll=1)
        rows.append(dict(model="qwen2.5-1.5b", shape="B8 L2048", scanned=scanned))
        print(f"qwen2.5-1.5b B8 L2048, scanned: lower {scanned['lower_s']:.1f} s"
              f", compile {scanned['compile_s']:.1f} s, "
              f"dots {scanned['dots']}", flush=True)
    write_json(rows, args.out, dict(backend=jax.default_backend(), jax=jax.__version__,
                                    note="ratios are unrolled / scanned, both in this run"))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
