"""GPU benchmark: one update of the ``paper-1.5b`` ALFWorld preset, split into generate / credit / update, and the
sampler's decode throughput against the HBM-bandwidth bound.

The setting is :func:`agentjax.train.presets.paper` (``method``, ``"alfworld"``, ``"1.5b"``) with random weights on
one device (the preset's ``(fsdp 8, tp 1)`` mesh is not used): Qwen2.5-1.5B, float32 parameters, bfloat16
matmuls, rematerialised blocks; 16 groups × 8 rollouts of ≤ 50 turns, prompts of 2048 and responses of 512
tokens, micro-batches of 16 rows, AdamW, PPO-clip + KL (a reference forward) + entropy. The episode structure is
:func:`agentjax.rollout.synthetic.synthetic_batch` (ALFWorld-like groups: ~5,000 real rows of the 6,400-row
capacity with the default seed); prompts are random token ids filling all 2048 slots (no tokenizer needed); the
responses and behaviour log-probs come from :class:`agentjax.models.Sampler` at the preset's sampling parameters.
Every stage reports its first call (compile + run) apart from the steady-state time.

Stages, in the order they run (the JSON is rewritten after each, so a later failure keeps the earlier numbers):

``device``
    the best time of a bf16 ``n × n`` matmul (``2n³`` FLOPs) and of a read-only pass over a bf16 array (a sum:
    bytes = its size): the achievable FLOP/s and HBM bandwidth, beside the data-sheet values.
``generate``
    the collector makes one ``Sampler.generate`` call per turn for the live rollouts, padded to a multiple of
    ``batch_bucket`` (64) rows; turn ``t`` of the synthetic batch has ``n_t`` live rollouts (its rows with
    ``step == t``). A padded size ``s`` is timed once (after a warm-up call that compiles the same programs with a
    one-token limit per row); the update's generation time is ``Σ_t time(s_t)``. The largest size is measured first
    and its responses fill the batch (row ``i`` takes response ``i mod s``). The smaller sizes are timed last with
    ``--all-sizes`` (and in a dry run); otherwise they are counted at the largest size's time, an upper bound, and
    listed as ``bounded_sizes`` (the default batch: 48 calls of 128 rows and 2 of 64, so the bound moves the total
    by a few per cent, and saves a compile).
``decode_roofline``
    from the largest size's calls: the decode window is ``time(full call) − time(call with a one-token limit)``,
    i.e. steps ``i = 1 … n−1`` of the ``n``-step loop (the prefill and step 0 are in both). Bytes that step ``i``
    must read from HBM at batch ``B``:

        bytes_i = W + B · (P + i + 1) · κ,     W = (parameters read) · itemsize(param_dtype),
        κ = 2 · layers · kv_heads · head_dim · itemsize(dtype)            (K and V of one token, all layers)

    with ``P`` real prompt tokens per row; the embedding is read once (the logits; the token gather is B rows).
    bound time = ``Σ_i bytes_i / BW``; ratio = bound time / measured time (the fraction of the roofline reached),
    against the data-sheet bandwidth and the measured one. The static cache is read whole every step
    (``slots = Lp + n``); ``ratio_static`` uses ``W + B · slots · κ`` per step instead.
``credit``
    :func:`agentjax.train.advantages.compute_advantages` on the whole batch (host placement check included),
    blocked on; the median of ``--credit-repeats`` calls after the first.
``update``
    :func:`agentjax.train.update.make_update` on the batch at full capacity. Padding micro-batches are skipped by
    the update, so the first call, with one real micro-batch, compiles the program that every call here runs; then
    it is timed with 1 and with ``k`` real micro-batches (``--update-micro-batches``, 8 of ~310; ``--full``: all
    ~5,000 rows, ≈ 1.5·10¹⁷ FLOPs: minutes on one GPU). per micro-batch = ``(t_k − t_1) / (k − 1)``; the
    full update is estimated as ``t_1 + (m − 1) · per micro-batch`` for its ``m`` real micro-batches. Model FLOPs of
    a real row with ``T`` decoded tokens (prompt + fed response) of which ``R`` are trained:

        F_fwd = 2 · N_mm · T + 2 · V · D · R + 2 · layers · heads · head_dim · T (T + 1)
        N_mm  = layers · (D·heads·head_dim + 2·D·kv_heads·head_dim + heads·head_dim·D + 3·D·F)

    (the matmul weights of the blocks; the LM head only at the ``R`` response positions, as the loss computes it;
    causal QKᵀ and PV), and the update does ``3 · F_fwd`` (policy forward + backward: ``6·N·T`` for the matmuls)
    plus ``F_fwd`` for the reference forward of the KL term (``kl_coef > 0``). Rematerialisation, softmaxes and
    the optimizer are not counted. MFU = FLOPs / (time · peak bf16 FLOP/s), the data-sheet dense peak of
    ``model_gpu.PEAK_BF16_FLOPS`` (``mfu_policy``: the ``3 · F_fwd`` part only; ``mfu_vs_matmul``: against the
    device stage's matmul instead). A ``remat=True`` model with the KL term currently fails to trace in
    ``nnx.remat``; :func:`checkpoint_blocks` works around it, and the JSON says so (``remat_workaround``).

``--dry-run``: a shrunken model (1 layer, d 32, vocabulary 256) and 2 groups × 4 rollouts × ≤ 6 turns, 16 + 32
tokens a row, GRPO credit: every code path above, on a CPU in well under a minute of CPU time; nominal peak FLOP/s
and bandwidth where the device has no data-sheet entry (flagged in the JSON). Runs on a machine with only jax, flax,
optax, orbax, chex, jaxtyping and numpy (:mod:`bare`). Writes ``experiments/bench/results/gpu_update.json``;
``gpu_check.sh`` runs this file and ``model_gpu.py`` and merges their JSON. Usage::

    python experiments/bench/gpu_update.py [--method crbc] [--update-micro-batches 8] [--full] [--out PATH]
    python experiments/bench/gpu_update.py --dry-run
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import pathlib
import platform
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable

BENCH = pathlib.Path(__file__).resolve().parent
# the repository root before this folder (sys.path[0] when run as a script): experiments/bench/envs.py would
# otherwise shadow the top-level `envs` package that agentjax imports (model_gpu, which puts this folder first
# again, is imported after agentjax: in main)
sys.path[:0] = [str(BENCH.parents[1]), str(BENCH)]

from bare import plain_table, stub_missing  # noqa: E402

STUBBED = stub_missing()  # before anything imports agentjax

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402
from flax.errors import TraceContextError  # noqa: E402
from harness import write_json  # noqa: E402

from agentjax.models import Qwen, Sampler, qwen  # noqa: E402
from agentjax.models.config import QwenConfig  # noqa: E402
from agentjax.models.sampler import SampleOutput, SamplingParams  # noqa: E402
from agentjax.rollout.batch import StepBatch  # noqa: E402
from agentjax.rollout.synthetic import synthetic_batch  # noqa: E402
from agentjax.train.advantages import compute_advantages  # noqa: E402
from agentjax.train.config import RolloutConfig, TrainConfig  # noqa: E402
from agentjax.train.presets import paper  # noqa: E402
from agentjax.train.state import init_state, make_optimizer  # noqa: E402
from agentjax.train.update import UpdateBatch, make_update  # noqa: E402

RESULTS = BENCH / "results" / "gpu_update.json"
# HBM bandwidth from the data sheets (bytes/s), matched in order against jax's device_kind
HBM_BYTES_PER_S = (
    ("H200", 4.8e12),
    ("H100 PCIe", 2.0e12),
    ("H100", 3.35e12),  # SXM
    ("A100", 2.0e12),  # 80 GB
)
NOMINAL_PEAK_FLOPS, NOMINAL_HBM = 1e12, 1e11  # --dry-run on a device without an entry: numbers, not a claim


@dataclasses.dataclass(frozen=True)
class Setting:
    """What one benchmark run measures (the preset, or its dry-run shrink)."""

    train: TrainConfig
    sampling: SamplingParams
    batch_bucket: int  # the collector pads each turn's generate call to a multiple of this
    synthetic: dict  # extra synthetic_batch arguments
    device_sizes: tuple[int, int]  # (matmul n, elements of the bandwidth array)


def setting(method: str, dry_run: bool) -> Setting:
    run = paper(method, "alfworld", "1.5b")
    train, sampling = run.train, run.collect.sampling
    if not dry_run:
        return Setting(train, sampling, run.collect.batch_bucket, {}, (8192, 2**31))
    arch = train.model.arch.replace(vocab_size=256, d_model=32, mlp_dim=64, num_layers=1, num_heads=2,
                                    num_kv_heads=1, head_dim=16, name="gpu-check-dry-run")
    rollout = RolloutConfig(num_groups=2, group_size=4, max_steps=6, prompt_len=16, response_len=32, capacity=48)
    train = train.replace(model=dataclasses.replace(train.model, arch=arch), rollout=rollout, micro_batch_size=4,
                          loss=dataclasses.replace(train.loss, logprob_chunk=8))
    sampling = dataclasses.replace(sampling, max_new_tokens=32, prompt_bucket=16)
    return Setting(train, sampling, 4, dict(num_states=6), (128, 2**20))


def hbm_bandwidth(device: jax.Device, override: float | None) -> float | None:
    if override:
        return override
    kind = getattr(device, "device_kind", "")
    return next((bw for name, bw in HBM_BYTES_PER_S if name.lower() in kind.lower()), None)


def _best(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t0)
    return min(times)


# -- stages -------------------------------------------------------------------------------------------------------
def _time_matmul(n: int, repeats: int) -> float:
    ka, kb = jax.random.split(jax.random.key(0))
    a, b = jax.random.normal(ka, (n, n), jnp.bfloat16), jax.random.normal(kb, (n, n), jnp.bfloat16)
    matmul = jax.jit(lambda x, y: x @ y)
    jax.block_until_ready(matmul(a, b))
    return _best(lambda: matmul(a, b), repeats)


def _time_read(elements: int, repeats: int) -> float:
    x = jnp.ones((elements,), jnp.bfloat16)
    read = jax.jit(lambda v: jnp.sum(v, dtype=jnp.float32))
    jax.block_until_ready(read(x))
    return _best(lambda: read(x), repeats)


def measure_device(n: int, elements: int, repeats: int = 10) -> dict:
    """Best-of-``repeats`` bf16 matmul FLOP/s and read bandwidth (a sum over a bf16 array)."""
    mm_s, read_s = _time_matmul(n, repeats), _time_read(elements, repeats)
    nbytes = 2 * elements
    return dict(matmul_n=n, matmul_s=mm_s, matmul_flops_per_s=2 * n**3 / mm_s, read_bytes=nbytes, read_s=read_s,
                read_bytes_per_s=nbytes / read_s, timing=f"best of {repeats} calls after a compiling one")


def turn_schedule(batch: StepBatch, max_steps: int, bucket: int) -> tuple[np.ndarray, np.ndarray]:
    """(live rollouts per turn [T], the generate call's rows per turn [T], padded to ``bucket``; 0: no call)."""
    steps = np.asarray(batch.step)[np.asarray(batch.row_mask)]
    live = np.bincount(steps, minlength=max_steps)[:max_steps]
    return live, -(-live // bucket) * bucket


def time_generate(sampler: Sampler, size: int, prompt_len: int, params: SamplingParams, repeats: int,
                  seed: int) -> tuple[dict, SampleOutput]:
    """One padded generate call of ``size`` rows with ``prompt_len``-token random prompts: the warm-up (compile +
    prefill + one step), the prefill-only call (a one-token limit per row) and the full call."""
    rng = np.random.default_rng(seed)
    prompts = rng.integers(0, sampler.config.vocab_size, (size, prompt_len)).tolist()
    key = jax.random.key(seed)
    one = np.ones((size,), np.int32)
    t0 = time.perf_counter()
    sampler.generate(prompts, params, key, max_new_tokens=one)  # host arrays: synchronised
    first_s = time.perf_counter() - t0
    prefill_s = _best(lambda: sampler.generate(prompts, params, key, max_new_tokens=one), repeats)
    full_s, out = float("inf"), None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = sampler.generate(prompts, params, key)
        full_s = min(full_s, time.perf_counter() - t0)
    row = dict(rows=size, prompt_tokens=prompt_len, max_new_tokens=params.max_new_tokens, first_call_s=first_s,
               compile_s=max(first_s - prefill_s, 0.0), prefill_s=prefill_s, generate_s=full_s,
               steps=int(out.length_b.max()), tokens=int(out.length_b.sum()), tokens_per_s=out.length_b.sum() / full_s,
               stopped_early=int((out.length_b < params.max_new_tokens).sum()))
    return row, out


def decode_roofline(config: QwenConfig, call: dict, prompt_slots: int, bw: float | None,
                    bw_measured: float | None) -> dict:
    """The HBM bound of the decode window of ``call`` (a :func:`time_generate` row; module docstring)."""
    b, p, n = call["rows"], call["prompt_tokens"], call["steps"]
    window = n - 1  # decode steps 1 .. n-1
    if window < 1:
        raise ValueError(f"the full call ran {n} step(s); the decode window needs at least 2")
    measured_s = call["generate_s"] - call["prefill_s"]
    if measured_s <= 0:
        raise RuntimeError(f"the decode window was not resolved: the full call ({call['generate_s']:.4f} s) was not "
                           f"slower than the one-token call ({call['prefill_s']:.4f} s); raise --repeats")
    read = config.num_params() - (0 if config.tie_embeddings else config.vocab_size * config.d_model)
    weight_bytes = read * jnp.dtype(config.jnp_param_dtype).itemsize
    kappa = 2 * config.num_layers * config.num_kv_heads * config.head_dim * jnp.dtype(config.jnp_dtype).itemsize
    filled = sum(p + i + 1 for i in range(1, n))
    bytes_filled = window * weight_bytes + b * kappa * filled
    slots = prompt_slots + call["max_new_tokens"]
    bytes_static = window * (weight_bytes + b * slots * kappa)
    row = dict(rows=b, prompt_tokens=p, decode_steps=window, measured_s=measured_s,
               tokens_per_s=b * window / measured_s, per_step_ms=1e3 * measured_s / window,
               weight_bytes=weight_bytes, kv_bytes_per_token=kappa, kv_slots=slots,
               bytes_per_step_mean=bytes_filled / window, bytes_per_step_static=bytes_static / window,
               hbm_bytes_per_s=bw, hbm_measured_bytes_per_s=bw_measured)
    for tag, bandwidth in (("", bw), ("_measured_bw", bw_measured)):
        if bandwidth:
            bound_s = bytes_filled / bandwidth
            row[f"bound_tokens_per_s{tag}"] = b * window / bound_s
            row[f"ratio{tag}"] = bound_s / measured_s
            row[f"ratio_static{tag}"] = bytes_static / bandwidth / measured_s
    return row


def fill_batch(base: StepBatch, out: SampleOutput | None, vocab: int, seed: int) -> tuple[StepBatch, str]:
    """``base`` with random full-length prompts and the sampler's responses (row ``i`` gets response
    ``i mod rows``); without ``out``, random full-length responses with log-prob ``−log V``."""
    rng = np.random.default_rng(seed)
    b, lp = base.prompt_tokens.shape
    lr = base.response_tokens.shape[1]
    real = np.asarray(base.row_mask)
    prompt = np.where(real[:, None], rng.integers(0, vocab, (b, lp)), 0).astype(np.int32)
    if out is None:
        tokens = rng.integers(0, vocab, (b, lr)).astype(np.int32)
        length = np.full((b,), lr)
        logp = np.full((b, lr), -np.log(vocab), np.float32)
        source = "random tokens (generate failed)"
    else:
        src = np.arange(b) % out.tokens_bt.shape[0]
        tokens, length, logp = out.tokens_bt[src, :lr], out.length_b[src], out.logp_bt[src, :lr]
        source = f"Sampler.generate, {out.tokens_bt.shape[0]} responses reused cyclically"
    mask = (np.arange(lr)[None, :] < length[:, None]) & real[:, None]
    batch = base.replace(prompt_tokens=jnp.asarray(prompt), prompt_mask=jnp.asarray(np.broadcast_to(real[:, None],
                         (b, lp))), response_tokens=jnp.asarray(np.where(mask, tokens, 0).astype(np.int32)),
                         response_mask=jnp.asarray(mask),
                         behaviour_logp=jnp.asarray(np.where(mask, logp, 0.0).astype(np.float32)))
    return batch, source


def measure_credit(train: TrainConfig, batch: StepBatch, repeats: int):
    t0 = time.perf_counter()
    adv = jax.block_until_ready(compute_advantages(train.credit, batch, train.rollout))
    first_s = time.perf_counter() - t0
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(compute_advantages(train.credit, batch, train.rollout))
        times.append(time.perf_counter() - t0)
    credit_s = statistics.median(times)
    return dict(method=train.credit.method, rows=int(np.asarray(batch.row_mask).sum()), first_call_s=first_s,
                compile_s=max(first_s - credit_s, 0.0), credit_s=credit_s, all_s=times), adv


def row_flops(config: QwenConfig, batch: StepBatch) -> tuple[np.ndarray, np.ndarray]:
    """Per-row forward model FLOPs ``F_fwd`` (module docstring) and decoded tokens ``T`` ([B], 0 on padding)."""
    d, f, n, k, h, layers = (config.d_model, config.mlp_dim, config.num_heads, config.num_kv_heads, config.head_dim,
                             config.num_layers)
    n_mm = layers * (d * n * h + 2 * d * k * h + n * h * d + 3 * d * f)
    real = np.asarray(batch.row_mask)
    trained = np.asarray(batch.response_mask).sum(1) * real  # R; the fed responses end at the last trained token
    t = (np.asarray(batch.prompt_mask).sum(1) + trained) * real
    fwd = 2.0 * n_mm * t + 2.0 * config.vocab_size * d * trained + 2.0 * layers * n * h * t * (t + 1.0)
    return fwd * real, t


def checkpoint_blocks() -> None:
    """Work-around for the remat + KL update: ``nnx.remat`` around a block raises ``TraceContextError`` ("Cannot
    mutate Param from a different trace level") when the block's parameters come from outside the gradient's trace,
    as the reference parameters of the KL forward do (every ``remat=True`` model with ``kl_coef > 0``, e.g. the
    paper presets). This swaps the module's rematerialised block call for the same block under ``jax.checkpoint``
    on its split state (the same recomputation, no Param mutation); used only when the library's own call fails,
    and reported as ``remat_workaround`` in the JSON."""

    def remat_block_call(block, *args):
        graphdef, block_state = nnx.split(block)
        return jax.checkpoint(lambda st, *a: qwen._block_call(nnx.merge(graphdef, st), *a))(block_state, *args)

    qwen._remat_block_call = remat_block_call


def measure_update(train: TrainConfig, model: Qwen, batch: StepBatch, adv, micro_batches: int, full: bool,
                   peak: float | None) -> dict:
    """The update's first call (compile + one micro-batch), then 1 and ``k`` real micro-batches (module docstring)."""
    tx = make_optimizer(train.optimizer)
    state = init_state(train, model, jax.random.key(train.seed), tx)
    update = make_update(train, model, tx)
    mb = train.micro_batch_size
    real = np.flatnonzero(np.asarray(batch.row_mask))
    m_full = -(-real.size // mb)
    k = m_full if full else min(max(2, micro_batches), m_full)
    fwd, tokens = row_flops(train.model.arch, batch)
    passes = 3.0 + (train.loss.kl_coef > 0)  # policy forward + backward, and the reference forward

    def subset(rows: int) -> tuple[StepBatch, float, float]:
        mask = np.zeros(batch.capacity, bool)
        mask[real[:rows]] = True
        return batch.replace(row_mask=jnp.asarray(mask)), float(fwd[mask].sum()), float(tokens[mask].sum())

    one, one_fwd, _ = subset(mb)
    many, many_fwd, many_tokens = subset(k * mb)
    workaround = None
    print(f"update: first call (compile + 1 of {m_full} micro-batches)", flush=True)
    try:
        t0 = time.perf_counter()
        state, metrics = jax.block_until_ready(update(state, UpdateBatch.of(one, adv), jax.random.key(1)))
    except TraceContextError as err:  # fails while tracing: nothing ran, the state was not donated
        workaround = f"{type(err).__name__}: {err}"[:300]
        checkpoint_blocks()
        t0 = time.perf_counter()
        state, metrics = jax.block_until_ready(update(state, UpdateBatch.of(one, adv), jax.random.key(1)))
    first_s = time.perf_counter() - t0
    print(f"update: first call {first_s:.1f} s", flush=True)
    t0 = time.perf_counter()
    state, metrics = jax.block_until_ready(update(state, UpdateBatch.of(one, adv), jax.random.key(2)))
    t1 = time.perf_counter() - t0
    t0 = time.perf_counter()
    state, metrics = jax.block_until_ready(update(state, UpdateBatch.of(many, adv), jax.random.key(3)))
    tk = time.perf_counter() - t0
    per_mb = (tk - t1) / (k - 1) if k > 1 else tk
    est_full_s = tk if k == m_full else t1 + (m_full - 1) * per_mb
    flops_k, flops_full = passes * many_fwd, passes * float(fwd.sum())
    row = dict(rows_capacity=batch.capacity, real_rows=int(real.size), micro_batch_rows=mb,
               micro_batches_full=m_full, micro_batches_timed=k, rows_timed=int(min(k * mb, real.size)),
               tokens_timed=many_tokens, first_call_s=first_s, compile_s=max(first_s - t1, 0.0), one_micro_batch_s=t1,
               update_s=tk, per_micro_batch_s=per_mb, full_update_s=est_full_s, full_update_measured=k == m_full,
               tokens_per_s=many_tokens / tk, model_flops_timed=flops_k, model_flops_full=flops_full,
               model_tflops_per_s=flops_k / tk / 1e12, kl_reference_forward=bool(train.loss.kl_coef > 0),
               loss=float(metrics["loss"]), grad_norm=float(metrics["grad_norm"]), skipped=float(metrics["skipped"]),
               remat_workaround=workaround)
    if peak:
        row |= dict(mfu=flops_k / tk / peak, mfu_policy=3.0 * many_fwd / tk / peak,
                    mfu_marginal=passes * (many_fwd - one_fwd) / (tk - t1) / peak if tk > t1 else None,
                    mfu_full_estimate=flops_full / est_full_s / peak)
    return row


# -- the run ------------------------------------------------------------------------------------------------------
class Report:
    """Stage results, rewritten to ``path`` after every stage."""

    def __init__(self, path: pathlib.Path, meta: dict):
        self.path, self.meta, self.stages = path, meta, {}

    def run(self, name: str, fn: Callable[[], dict]):
        print(f"-- {name}", flush=True)
        t0, c0 = time.perf_counter(), time.process_time()
        try:
            row = dict(status="ok") | fn()
        except Exception as err:  # keep the other stages' numbers; the error goes into the JSON
            traceback.print_exc()
            row = dict(status="error", error=f"{type(err).__name__}: {err}"[:2000],
                       traceback=traceback.format_exc()[-4000:])
        row["wall_s"] = time.perf_counter() - t0
        row["cpu_s"] = time.process_time() - c0
        self.stages[name] = row
        self.write()
        print(json.dumps({k: v for k, v in row.items() if not isinstance(v, list | dict) and k != "traceback"},
                         default=str), flush=True)
        return row

    def write(self) -> None:
        rows = [dict(stage=name) | row for name, row in self.stages.items()]
        tmp = self.path.with_suffix(".tmp")
        clean = json.loads(json.dumps(dict(meta=self.meta, rows=rows), default=str))
        write_json(clean["rows"], tmp, clean["meta"])
        os.replace(tmp, self.path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="a shrunken model and tiny shapes (runs on a CPU)")
    parser.add_argument("--method", default=None,
                        help="credit method of the preset (grpo, gigpo, crbc, ...; default crbc, dry run grpo)")
    parser.add_argument("--update-micro-batches", type=int, default=8, help="real micro-batches in the timed update")
    parser.add_argument("--full", action="store_true", help="time the update on every real row (minutes on one GPU)")
    parser.add_argument("--all-sizes", action="store_true",
                        help="time every generate batch size of the schedule (default: the largest; a dry run: all)")
    parser.add_argument("--repeats", type=int, default=None, help="timed generate calls per size (default 1; dry 5)")
    parser.add_argument("--credit-repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0, help="synthetic batch and random prompts")
    parser.add_argument("--peak-flops", type=float, default=None, help="peak bf16 FLOP/s of the device")
    parser.add_argument("--hbm-bw", type=float, default=None, help="HBM bandwidth of the device, bytes/s")
    parser.add_argument("--out", type=pathlib.Path, default=None,
                        help=f"default {RESULTS} (a dry run: a file in the temporary directory)")
    args = parser.parse_args()
    if args.out is None:
        args.out = pathlib.Path(tempfile.gettempdir()) / "gpu_update_dry_run.json" if args.dry_run else RESULTS
    args.out.parent.mkdir(parents=True, exist_ok=True)
    repeats = args.repeats or (5 if args.dry_run else 1)
    if args.dry_run:
        jax.config.update("jax_numpy_rank_promotion", "raise")  # the tests' strict numerics
    import model_gpu  # after agentjax (see the sys.path note at the top)

    device = jax.devices()[0]
    peak, bw = model_gpu.peak_flops(device, args.peak_flops), hbm_bandwidth(device, args.hbm_bw)
    nominal = args.dry_run and (peak is None or bw is None)
    if args.dry_run:
        peak, bw = peak or NOMINAL_PEAK_FLOPS, bw or NOMINAL_HBM
    args.method = args.method or ("grpo" if args.dry_run else "crbc")
    s = setting(args.method, args.dry_run)
    train, ro, arch = s.train, s.train.rollout, s.train.model.arch
    print(f"{arch.name}: {arch.num_params() / 1e9:.3f}B parameters on {device.device_kind} ({jax.default_backend()}), "
          f"peak {peak} FLOP/s, HBM {bw} B/s; batch {ro.num_groups}x{ro.group_size}x{ro.max_steps} "
          f"(capacity {ro.rows}), prompt {ro.prompt_len}, response {ro.response_len}", flush=True)
    meta = dict(jax=jax.__version__, backend=jax.default_backend(), device_kind=device.device_kind,
                devices=len(jax.devices()), peak_flops=peak, hbm_bytes_per_s=bw, nominal_peaks=nominal,
                dry_run=args.dry_run, stubbed_modules=STUBBED, python=platform.python_version(),
                machine=platform.machine(), xla_flags=os.environ.get("XLA_FLAGS", ""),
                date=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"), preset="paper-1.5b alfworld",
                train=train.to_dict(), sampling=dataclasses.asdict(s.sampling), batch_bucket=s.batch_bucket,
                args={k: str(v) for k, v in vars(args).items()})
    report = Report(args.out, meta)
    device_row = report.run("device", lambda: measure_device(*s.device_sizes))

    base = synthetic_batch(args.seed, ro.num_groups, ro.group_size, ro.max_steps, capacity=ro.rows,
                           prompt_len=ro.prompt_len, response_len=ro.response_len, **s.synthetic)
    live, padded = turn_schedule(base, ro.max_steps, s.batch_bucket)
    sizes = sorted({int(c) for c in padded if c}, reverse=True)
    calls: dict[int, dict] = {}
    outputs: dict[int, SampleOutput] = {}
    state = dict(model=None, sampler=None)

    def generate(sizes_now: list[int]) -> dict:
        if state["model"] is None:
            t0 = time.perf_counter()
            state["model"] = Qwen(arch, rngs=nnx.Rngs(train.seed))
            state["sampler"] = Sampler(state["model"])
            state["init_s"] = time.perf_counter() - t0
        for size in sizes_now:
            calls[size], out = time_generate(state["sampler"], size, ro.prompt_len, s.sampling, repeats,
                                             args.seed + size)
            outputs.setdefault(size, out)
        complete = all(size in calls for size in sizes)
        largest = calls[max(calls)]
        timed = [calls.get(int(c), largest) if c else None for c in padded]  # unmeasured: bounded by the largest
        total = float(sum(c["generate_s"] for c in timed if c))
        tokens = sum(n * c["tokens"] / c["rows"] for n, c in zip(live, timed, strict=True) if c)
        return dict(live_per_turn=live.tolist(), rows_per_call=padded.tolist(), sizes=sizes,
                    calls=list(calls.values()), model_init_s=state["init_s"], complete=complete,
                    bounded_sizes=[size for size in sizes if size not in calls], turns=int((padded > 0).sum()),
                    rollout_turns=int(live.sum()), generate_s=total, tokens=tokens, tokens_per_s=tokens / total)

    gen_row = report.run("generate", lambda: generate(sizes[:1]))
    measured_bw = device_row.get("read_bytes_per_s")

    def roofline() -> dict:
        if not sizes or sizes[0] not in calls:
            raise RuntimeError("the generate stage measured no call")
        return decode_roofline(arch, calls[sizes[0]], ro.prompt_len, bw, measured_bw)

    report.run("decode_roofline", roofline)
    batch, source = fill_batch(base, outputs.get(sizes[0]) if sizes else None, arch.vocab_size, args.seed)
    adv_box = {}

    def credit() -> dict:
        row, adv_box["adv"] = measure_credit(train, batch, args.credit_repeats)
        return row

    report.run("credit", credit)

    def update() -> dict:
        model = state["model"] or Qwen(arch, rngs=nnx.Rngs(train.seed))
        adv = adv_box["adv"] if "adv" in adv_box else compute_advantages(train.credit, batch, train.rollout)
        row = dict(responses=source) | measure_update(train, model, batch, adv, args.update_micro_batches, args.full,
                                                      peak)
        if device_row.get("matmul_flops_per_s"):
            row["mfu_vs_matmul"] = row["model_tflops_per_s"] * 1e12 / device_row["matmul_flops_per_s"]
        return row | dict(memory=model_gpu.memory_stats(device))

    update_row = report.run("update", update)
    if gen_row["status"] == "ok" and len(sizes) > 1 and (args.all_sizes or args.dry_run):
        gen_row = report.run("generate", lambda: generate(sizes[1:]))
    stages = report.stages
    if all(stages[k]["status"] == "ok" for k in ("generate", "credit", "update")):
        total = gen_row["generate_s"] + stages["credit"]["credit_s"] + update_row["full_update_s"]
        report.meta["update_total_s"] = dict(
            total_s=total, generate_s=gen_row["generate_s"], credit_s=stages["credit"]["credit_s"],
            update_s=update_row["full_update_s"], rollout_turns=gen_row["rollout_turns"],
            samples_per_s=gen_row["rollout_turns"] / total, generate_bounded_sizes=gen_row["bounded_sizes"],
            update_measured=update_row["full_update_measured"],
            note="env stepping and prompt building are not included; the update is extrapolated unless --full, the "
                 "generate calls of bounded sizes are counted at the largest size's time")
        report.write()
    rows = [dict(stage=name, status=r["status"], first_s=r.get("first_call_s"), compile_s=r.get("compile_s"),
                 steady_s=r.get("generate_s", r.get("credit_s", r.get("update_s", r.get("measured_s")))),
                 tokens_per_s=r.get("tokens_per_s"), mfu=r.get("mfu"), ratio=r.get("ratio")) for name, r in
            stages.items()]
    plain_table(rows, ("stage", "status", "first_s", "compile_s", "steady_s", "tokens_per_s", "mfu", "ratio"),
                title="paper-1.5b ALFWorld update on one device")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
