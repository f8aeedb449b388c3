"""Memory plan of the paper presets: does one update step, and one generate call, fit an 80 GB accelerator?

Each case is one preset at full size (:func:`agentjax.train.presets.preset`: ``paper-1.5b`` on its (fsdp 8, tp 1)
mesh, ``paper-7b`` on (fsdp 2, tp 4), the tree methods' ``paper-4b`` on (fsdp 1, tp 8)) compiled ahead of time on
8 fake CPU devices (``XLA_FLAGS=--xla_force_host_platform_device_count=8``): nothing is allocated, every argument is a
``jax.ShapeDtypeStruct`` carrying its sharding, and the numbers are the compiled programs' own
``compiled.memory_analysis()``, per device (the SPMD-partitioned program one device runs).

The programs are the ones a run compiles, built through the library's own paths:

- the model: ``nnx.eval_shape`` of :class:`~agentjax.models.qwen.Qwen` with the preset's architecture and the
  activation constraints of :func:`agentjax.parallel.fsdp_tp` on :func:`agentjax.parallel.make_mesh` (the preset's
  mesh), its parameters placed by :func:`agentjax.parallel.param_shardings` (what
  :func:`agentjax.parallel.create_sharded` and the sharded checkpoint loader do, without the initialiser);
- the state: :func:`agentjax.train.state.abstract_state` (``jax.eval_shape`` of :func:`~agentjax.train.state.init_state`
  with its shardings: the policy, AdamW's two moments, the frozen KL reference where ``kl_coef > 0``, counters);
- the update: :func:`agentjax.train.update.make_update` lowered on an
  :class:`~agentjax.train.update.UpdateBatch` at the preset's full capacity (``train.rollout.rows`` rows of
  ``prompt_len + response_len`` tokens: every turn of every rollout, for the tree methods every turn of every node
  of every tree), built as the trainers build it (flat: ``UpdateBatch.of`` the rows and ``jax.eval_shape`` of
  :func:`agentjax.train.advantages.compute_advantages`, and a key; trees: a stage's row and token masks, no key);
- generation: the sampler's jitted prefill and decode loop (:mod:`agentjax.models.sampler`, the programs
  ``Sampler.generate`` runs) on the weights the trainer samples with (the state's parameters, in their training
  shardings), at the collector's first-turn batch: every rollout (flat: ``groups × group size``) or every root
  (trees: ``groups × trees``) live, padded as the collector pads it (``batch_bucket``), prompts at the prompt
  capacity (rounded up to ``prompt_bucket``) plus ``max_new_tokens`` cache slots.

The batch and the other non-state inputs are replicated, as the trainer passes them (host arrays: ``jit`` places an
uncommitted argument replicated over the parameters' mesh); the model's activation constraints split the rows over
``fsdp`` inside the program. Attention runs as it compiles on an accelerator (``QwenConfig.attention_chunk`` 256,
``attention_unroll`` 1: the values an accelerator backend picks for 0; the CPU's own choice would be a different
program).

What the numbers count (per device, bytes). ``argument``: every input buffer — parameters, optimizer state, KL
reference, the batch, keys. ``output``: the new state and the metrics. ``alias``: outputs written into donated
inputs (the update donates its state; the decode loop its carry), so they are not extra memory. ``temp``: XLA's
scratch for the whole program (activations kept for the backward pass, the float32 gradient sums of the micro-batch
scan, all-gathered weights, collective buffers, the KV cache built inside the prefill). ``peak = argument + output −
alias + temp``: live buffers while the program runs. For generation the trainer's state stays resident (the
sampler reads its parameters), so ``generate peak = state + max over prefill / decode of (peak − their parameter
arguments)``.

What they do not count, and why this is an estimate of the GPU's numbers: XLA:CPU's buffer assignment and fusion
stand in for XLA:GPU's (another fusion pass, scheduler and layout padding give other temporaries; the GPU's
latency-hiding scheduler can keep more all-gathered weights alive at once); the CUDA context, cuBLAS / cuDNN
workspaces and NCCL's buffers (about 1-2 GB); allocator fragmentation; the host-side batch and the env pool. JAX
on a GPU preallocates ``XLA_PYTHON_CLIENT_MEM_FRACTION`` (default 0.75) of the device for its pool, so a peak above
0.75 × 80 GB needs that variable raised (e.g. 0.95). The KV cache of a generate call is also computed from the
config (``2 · layers · rows · slots · kv_heads · head_dim · itemsize``) and split by the cache's compiled sharding.

Each case compiles in its own child process (``nice -n 10``), one at a time; the parent polls the machine's free
memory and the child's resident set and stops the child if free memory falls below ``--min-free-gib``.
``--quick``: the same code paths on shrunken settings (a 2-layer model of width 64, a handful of rows), in this
process, with the XLA optimisation setting of the environment (the tests turn most passes off): seconds a program.

JSON (``experiments/bench/results/memory_plan.json``): ``meta`` (versions, device budget, flags), ``cases``: one
entry per (preset, method, env) with ``update`` and ``generate`` programs: ``memory`` (the memory analysis),
``peak_bytes``, ``fraction`` (of 80 GB), ``fits``, the state's and the batch's per-device bytes computed from their
shardings (``state_bytes``, ``batch_bytes``), ``compile_s`` and the child's ``host_peak_rss_bytes``; generation
also ``kv_cache`` (config formula, per device) for the training call and for evaluation (``eval_rows``: every eval
episode or tree at once, as :func:`agentjax.train.eval.evaluate` runs them) and ``rows_that_fit`` (KV-bound).
Usage::

    python experiments/bench/memory_plan.py [--quick] [--cases paper-7b:crbc:alfworld,...] [--programs update,generate]
        [--merge]   # recompute the given cases into the existing JSON (each row carries its ``revision``)
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import math
import os
import pathlib
import platform
import subprocess
import sys
import tempfile
import time

BENCH = pathlib.Path(__file__).resolve().parent
ROOT = BENCH.parents[1]
# the repository root before this folder: experiments/bench/envs.py would shadow the top-level `envs` package
sys.path[:0] = [str(ROOT)]
DEVICES = 8
# XLA:CPU's memory-minimising schedule: its default trades memory for concurrency among the cores, where XLA:GPU's
# scheduler keeps within a memory limit (95% of the device: xla_gpu_memory_limit_slop_factor)
SCHEDULER = "--xla_cpu_scheduler_type=CPU_SCHEDULER_TYPE_MEMORY_OPTIMIZED"
for flag, present in ((f"--xla_force_host_platform_device_count={DEVICES}", "xla_force_host_platform_device_count"),
                      (SCHEDULER, "xla_cpu_scheduler_type")):
    if present not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + flag).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from flax import nnx  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from agentjax.models.qwen import ACCELERATOR_CHUNK, Qwen  # noqa: E402
from agentjax.models.sampler import SamplingParams, _decode, _prefill  # noqa: E402
from agentjax.models.sampling import left_pad  # noqa: E402
from agentjax.parallel import activation_sharding, fsdp_tp, make_mesh, param_shardings  # noqa: E402
from agentjax.rollout.batch import StepBatch  # noqa: E402
from agentjax.rollout.policy import batch_padding  # noqa: E402
from agentjax.train.advantages import compute_advantages  # noqa: E402
from agentjax.train.config import RolloutConfig, TrainConfig  # noqa: E402
from agentjax.train.presets import TREE_METHODS, preset  # noqa: E402
from agentjax.train.state import abstract_state, make_optimizer  # noqa: E402
from agentjax.train.update import UpdateBatch, make_update  # noqa: E402

RESULTS = BENCH / "results" / "memory_plan.json"
DEVICE_BYTES = 80 * 10**9  # an 80 GB A100 / H100 (the data sheets' GB; 80 GiB would be 7% more)
JAX_POOL_FRACTION = 0.75  # XLA_PYTHON_CLIENT_MEM_FRACTION's default on GPUs
GIB = 2**30
# (preset, method, env): each preset with the env of its paper's headline table and the env with the longest rows
# (TextCraft-Synth: 8,192-token prompts; TextWorld-Sync trees: 10,240 + 3,072 tokens)
CASES = (("paper-1.5b", "crbc", "alfworld"), ("paper-1.5b", "crbc", "textcraft_synth"),
         ("paper-7b", "crbc", "alfworld"), ("paper-7b", "crbc", "textcraft_synth"),
         ("paper-4b", "sera", "textcraft_synth"), ("paper-4b", "sera", "textworld_sync"))
QUICK_CASES = (("paper-1.5b", "crbc", "alfworld"), ("paper-7b", "crbc", "alfworld"),
               ("paper-4b", "sera", "textcraft_synth"))
PROGRAMS = ("update", "generate")
# Update steps planned beside the presets: each preset's setting before this plan changed it, at its longest rows
# (1.5B: micro-batches of 16 rows; 7B: the (fsdp 4, tp 2) mesh, 8 rows; the tree preset: the (fsdp 8, tp 1) mesh,
# 8 rows), and the 7B preset under XLA:CPU's default schedule
REFERENCES = ("paper-1.5b:crbc:textcraft_synth:micro=16:only=update",
              "paper-7b:crbc:textcraft_synth:mesh=4x2:micro=8:only=update",
              "paper-4b:sera:textworld_sync:mesh=8x1:micro=8:only=update",
              "paper-7b:crbc:alfworld:sched=default:only=update")


@dataclasses.dataclass(frozen=True)
class Setting:
    """One case as its programs see it (the preset's, or the ``--quick`` shrink of it)."""

    preset: str
    method: str
    env: str
    train: TrainConfig
    mesh: tuple[int, int]
    tree: bool  # a tree method: CISPO on a stage's rows and tokens, the stage schedule in the state
    sampling: SamplingParams
    gen_rows: int  # rows of the collector's first-turn generate call (padded)
    eval_rows: int  # rows of evaluation's first-turn generate call (every eval episode / tree at once, padded)
    prompt_slots: int  # prompt slots of a generate call at the prompt capacity (multiple of prompt_bucket)


def setting(name: str, method: str, env: str, quick: bool = False, mesh: tuple[int, int] | None = None,
            micro: int | None = None) -> Setting:
    """The case's preset with the accelerator's attention blocking; ``quick`` shrinks model and batch; ``mesh`` and
    ``micro`` replace the preset's mesh and micro-batch size (to plan a change before making it)."""
    run = preset(name, method, env)
    changes = {"mesh": mesh} if mesh is not None else {}
    if micro is not None:
        changes["train"] = run.train.replace(micro_batch_size=micro)
    run = run.replace(**changes)  # together: a micro-batch must split over the new mesh's fsdp
    train, co = run.train, run.collect
    arch = train.model.arch.replace(attention_chunk=ACCELERATOR_CHUNK, attention_unroll=1)
    tree = method in TREE_METHODS
    per_task = run.train.rollout.group_size  # rollouts (flat) or trees (tree methods) per task
    gen_live = run.train.rollout.num_groups * per_task
    eval_live = run.eval_tasks * (run.eval_seeds if tree else run.eval_collect.group_size)
    sampling = co.sampling
    rollout = train.rollout
    if quick:
        arch = arch.replace(vocab_size=512, d_model=64, mlp_dim=128, num_layers=2, num_heads=16, num_kv_heads=8,
                            head_dim=8, attention_chunk=16, name=f"{arch.name}-quick")
        rollout = RolloutConfig(num_groups=2, group_size=4, max_steps=2, prompt_len=48, response_len=16,
                                capacity=16 if not tree else 32)
        train = train.replace(micro_batch_size=8, loss=dataclasses.replace(train.loss, logprob_chunk=8))
        sampling = dataclasses.replace(sampling, max_new_tokens=16, prompt_bucket=16)
        gen_live, eval_live = 8, 12
    train = train.replace(model=dataclasses.replace(train.model, arch=arch), rollout=rollout)
    bucket = co.batch_bucket if not quick else 8
    gen_rows = gen_live + batch_padding(gen_live, bucket, pow2=co.pow2_batches)
    eval_rows = eval_live + batch_padding(eval_live, bucket, pow2=co.pow2_batches)
    slots = left_pad([[0] * rollout.prompt_len], sampling.prompt_bucket)[0].shape[1]
    return Setting(name, method, env, train, tuple(run.mesh), tree, sampling, gen_rows, eval_rows, slots)


# -- abstract model, state and inputs -------------------------------------------------------------------------------
def abstract_model(s: Setting, mesh) -> Qwen:
    """The preset's model as ``ShapeDtypeStruct`` parameters placed by the training rules (no memory)."""
    rules = fsdp_tp()
    act = activation_sharding(rules, mesh)
    graphdef, state = nnx.split(nnx.eval_shape(lambda: Qwen(s.train.model.arch, rngs=nnx.Rngs(0), act_sharding=act)))
    placed = jax.tree.map(lambda x, sh: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sh), state,
                          param_shardings(state, rules, mesh))
    return nnx.merge(graphdef, placed)


def replicated(tree, mesh):
    """``tree``'s leaves as replicated ``ShapeDtypeStruct`` s on ``mesh`` (how ``jit`` places host inputs)."""
    rep = NamedSharding(mesh, P())
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=rep), tree)


def device_bytes(tree) -> int:
    """Bytes one device holds of ``tree``'s sharded ``ShapeDtypeStruct`` leaves (the largest shard's size)."""
    return sum(math.prod(x.sharding.shard_shape(x.shape)) * jnp.dtype(x.dtype).itemsize
               for x in jax.tree.leaves(tree))


def memory(compiled) -> dict:
    """The compiled program's memory analysis (per device) and its peak: argument + output − alias + temp."""
    m = compiled.memory_analysis()
    row = {k: int(getattr(m, f"{k}_size_in_bytes")) for k in ("argument", "output", "alias", "temp",
                                                              "generated_code")}
    row["peak"] = row["argument"] + row["output"] - row["alias"] + row["temp"]
    return row


def judged(peak: int) -> dict:
    return dict(peak_bytes=peak, peak_gib=peak / GIB, fraction=peak / DEVICE_BYTES, fits=peak <= DEVICE_BYTES,
                fits_default_pool=peak <= JAX_POOL_FRACTION * DEVICE_BYTES)


def state_breakdown(state) -> dict:
    return dict(params=device_bytes(state.params), opt_state=device_bytes(state.opt_state),
                ref_params=device_bytes(state.ref_params), total=device_bytes(state))


# -- the programs -----------------------------------------------------------------------------------------------------
def plan_update(s: Setting) -> dict:
    """Compile the preset's update step on abstract inputs; its memory analysis and the inputs' sizes."""
    mesh = make_mesh(*s.mesh)
    model = abstract_model(s, mesh)
    tx = make_optimizer(s.train.optimizer)
    state = abstract_state(s.train, model, tx, schedule=s.tree)
    ro = s.train.rollout
    steps = jax.eval_shape(lambda: StepBatch.empty(ro.rows, ro.prompt_len, ro.response_len))
    if s.tree:  # a stage's rows and tokens (train.trees), rows in batch order (no key)
        batch = UpdateBatch(steps, jax.ShapeDtypeStruct((ro.rows,), jnp.float32),
                            row_mask=jax.ShapeDtypeStruct((ro.rows,), jnp.bool_),
                            token_mask=jax.ShapeDtypeStruct((ro.rows, ro.response_len), jnp.bool_))
        key = None
    else:  # every real row with compute_advantages' credit, rows in an order drawn from the key (loop)
        adv = jax.eval_shape(lambda b: compute_advantages(s.train.credit, b, ro, check=False), steps)
        batch = UpdateBatch.of(steps, adv)
        key = replicated(jax.eval_shape(lambda: jax.random.key(0)), mesh)
    batch = replicated(batch, mesh)
    t0 = time.perf_counter()
    lowered = make_update(s.train, model, tx).lower(state, batch, key)
    lower_s = time.perf_counter() - t0
    compiled = lowered.compile()
    compile_s = time.perf_counter() - t0 - lower_s
    mem = memory(compiled)
    return dict(rows=ro.rows, prompt_len=ro.prompt_len, response_len=ro.response_len,
                state_bytes=state_breakdown(state),
                batch_bytes=device_bytes(batch), memory=mem, lower_s=lower_s, compile_s=compile_s,
                **judged(mem["peak"]))


def kv_bytes(s: Setting, rows: int) -> int:
    """The KV cache of a generate call from the config: K and V of every layer, row and slot."""
    a = s.train.model.arch
    slots = s.prompt_slots + s.sampling.max_new_tokens
    return 2 * a.num_layers * rows * slots * a.num_kv_heads * a.head_dim * jnp.dtype(a.jnp_dtype).itemsize


def plan_generate(s: Setting) -> dict:
    """Compile the sampler's prefill and decode loop at the collector's first-turn batch (module docstring)."""
    mesh = make_mesh(*s.mesh)
    model = abstract_model(s, mesh)
    tx = make_optimizer(s.train.optimizer)
    state = abstract_state(s.train, model, tx, schedule=s.tree)
    graphdef, weights = nnx.split(model)
    b, lp, new = s.gen_rows, s.prompt_slots, s.sampling.max_new_tokens
    tokens = replicated(jax.ShapeDtypeStruct((b, lp), jnp.int32), mesh)
    segment = replicated(jax.ShapeDtypeStruct((b, lp), jnp.int32), mesh)
    key = replicated(jax.eval_shape(lambda: jax.random.key(0)), mesh)
    t0 = time.perf_counter()
    lowered = _prefill.lower(graphdef, weights, tokens, segment, key, None, slots=lp + new, max_new=new, sparse=False)
    prefill = lowered.compile()
    prefill_s = time.perf_counter() - t0
    carry = jax.tree.map(lambda x, sh: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sh), lowered.out_info,
                         prefill.output_shardings)
    stop_ids = replicated(jax.ShapeDtypeStruct((len(s.sampling.stop_token_ids),), jnp.int32), mesh)
    limit = replicated(jax.ShapeDtypeStruct((b,), jnp.int32), mesh)
    until = replicated(jax.ShapeDtypeStruct((), jnp.int32), mesh)
    t0 = time.perf_counter()
    decode = _decode.lower(graphdef, weights, carry, None, stop_ids, limit, until, params=s.sampling).compile()
    decode_s = time.perf_counter() - t0
    weight_bytes = device_bytes(weights)
    resident = device_bytes(state)
    pre, dec = memory(prefill), memory(decode)
    peak = resident + max(pre["peak"], dec["peak"]) - weight_bytes
    cache = carry.cache
    kv_device = device_bytes((cache.k_lbskh, cache.v_lbskh))
    kv_total = kv_bytes(s, b)
    per_row_device = kv_device / b
    rows_fit = int((DEVICE_BYTES - (peak - kv_device)) // per_row_device) if per_row_device else None
    split = kv_total / kv_device
    return dict(rows=b, prompt_slots=lp, max_new_tokens=new, cache_slots=lp + new,
                cache_spec=str(cache.k_lbskh.sharding.spec), state_bytes=state_breakdown(state),
                weights_bytes=weight_bytes,
                kv_cache=dict(total_bytes=kv_total, device_bytes=kv_device, split=split, bytes_per_row=kv_total / b),
                eval_rows=s.eval_rows,
                eval_kv_cache=dict(total_bytes=kv_bytes(s, s.eval_rows),
                                   device_bytes=int(kv_bytes(s, s.eval_rows) / split)),
                prefill=dict(memory=pre, compile_s=prefill_s), decode=dict(memory=dec, compile_s=decode_s),
                rows_that_fit=rows_fit, eval_fits=s.eval_rows <= (rows_fit or 0), **judged(peak))


SCHEDULES = {"memory": SCHEDULER, "default": "--xla_cpu_scheduler_type=CPU_SCHEDULER_TYPE_DEFAULT"}


def parse_case(text: str) -> dict:
    """``preset:method:env[:mesh=FxT][:micro=N][:sched=memory|default][:only=update|generate]`` as
    :func:`setting`'s arguments, the XLA:CPU schedule (``sched``, :data:`SCHEDULES`) and the one program to plan
    (``only``)."""
    parts = text.split(":")
    if len(parts) < 3:
        raise SystemExit(f"--cases: {text!r} is not preset:method:env[:mesh=FxT][:micro=N][:sched=S] "
                         "(e.g. paper-7b:crbc:alfworld:mesh=2x4)")
    out: dict = dict(name=parts[0], method=parts[1], env=parts[2])
    for part in parts[3:]:
        key, _, value = part.partition("=")
        if key == "mesh":
            out["mesh"] = tuple(int(v) for v in value.split("x"))
        elif key == "micro":
            out["micro"] = int(value)
        elif key == "sched" and value in SCHEDULES:
            out["sched"] = value
        elif key == "only" and value in PROGRAMS:
            out["only"] = [value]
        else:
            raise SystemExit(f"--cases: {part!r} in {text!r}; the options are mesh=FxT, micro=N, "
                             f"sched={'|'.join(SCHEDULES)} and only={'|'.join(PROGRAMS)}")
    return out


def run_child(case: str, program: str, quick: bool) -> dict:
    args = parse_case(case)
    args.pop("sched", None)  # the parent set XLA_FLAGS
    args.pop("only", None)
    s = setting(**args, quick=quick)
    if not quick:  # the program a run compiles, every pass on (the test suite turns most off for speed)
        jax.config.update("jax_disable_most_optimizations", False)
    row = plan_update(s) if program == "update" else plan_generate(s)
    a = s.train.model.arch
    return dict(case=case, preset=s.preset, method=s.method, env=s.env, program=program, mesh=list(s.mesh),
                micro_batch_size=s.train.micro_batch_size, model=a.name, param_dtype=a.param_dtype, dtype=a.dtype,
                remat=a.remat, kl_coef=s.train.loss.kl_coef, xla_flags=os.environ.get("XLA_FLAGS", "")) | row


# -- the parent: one child process per program, memory watched --------------------------------------------------------
def _mem_available() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("/proc/meminfo has no MemAvailable line")


def _rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except FileNotFoundError:
        pass
    return 0


def spawn(case: str, program: str, quick: bool, min_free: int, timeout: float) -> dict:
    """Run one program's plan in a child process at nice 10; stop it when free memory drops below ``min_free``
    bytes or after ``timeout`` seconds."""
    with tempfile.TemporaryDirectory() as tmp:
        out = pathlib.Path(tmp) / "row.json"
        cmd = [sys.executable, __file__, "--child", case, "--program", program, "--row-out", str(out)]
        cmd += ["--quick"] if quick else []
        t0 = time.perf_counter()
        flags = os.environ["XLA_FLAGS"].replace(SCHEDULER, SCHEDULES[parse_case(case).get("sched", "memory")])
        child = subprocess.Popen(cmd, cwd=ROOT, env=os.environ | {"XLA_FLAGS": flags}, preexec_fn=lambda: os.nice(10))
        stopped, low = None, _mem_available()
        while True:
            pid, status, usage = os.wait4(child.pid, os.WNOHANG)
            if pid:
                break
            free = _mem_available()
            low = min(low, free)
            if stopped is None and (free < min_free or time.perf_counter() - t0 > timeout):
                stopped = (f"stopped: {free / GIB:.1f} GiB free (limit {min_free / GIB:.1f})" if free < min_free
                           else f"stopped after {timeout:.0f} s")
                child.kill()
            time.sleep(0.5)
        code = child.returncode = os.waitstatus_to_exitcode(status)
        host = dict(host_peak_rss_bytes=usage.ru_maxrss * 1024, wall_s=time.perf_counter() - t0, min_free_bytes=low)
        if code == 0 and out.exists():
            return json.loads(out.read_text()) | host
    c = parse_case(case)
    return dict(case=case, preset=c["name"], method=c["method"], env=c["env"], program=program, status="error",
                error=stopped or f"child exited with {code}") | host


def table(rows: list[dict]) -> None:
    t = Table(title=f"Per-device memory (GiB) against {DEVICE_BYTES / 1e9:.0f} GB")
    for col in ("case", "mesh", "micro", "program", "rows x tokens", "state", "argument", "temp", "output - alias",
                "peak", "of 80 GB", "fits", "KV cache", "eval KV", "rows that fit"):
        t.add_column(col, justify="left" if col in ("case", "program") else "right")
    for r in rows:
        if r.get("status") == "error":
            t.add_row(r["case"], "", "", r["program"], "", "", "", "", "", "", "", r["error"])
            continue
        gib = lambda v: f"{v / GIB:.2f}"  # noqa: E731
        if r["program"] == "update":
            m = r["memory"]
            size = f"{r['rows']} x {r['prompt_len'] + r['response_len']}"
            extra = ("", "", "")
        else:
            m = r["decode"]["memory"] if r["decode"]["memory"]["peak"] >= r["prefill"]["memory"]["peak"] else \
                r["prefill"]["memory"]
            size = f"{r['rows']} x {r['cache_slots']}"
            extra = (gib(r["kv_cache"]["device_bytes"]),
                     f"{gib(r['eval_kv_cache']['device_bytes'])} ({r['eval_rows']} rows)", str(r["rows_that_fit"]))
        t.add_row(r["case"], "x".join(map(str, r["mesh"])), str(r["micro_batch_size"]), r["program"], size,
                  gib(r["state_bytes"]["total"]), gib(m["argument"]), gib(m["temp"]), gib(m["output"] - m["alias"]),
                  gib(r["peak_bytes"]), f"{r['fraction']:.0%}", "yes" if r["fits"] else "NO", *extra)
    Console(width=240).print(t)


def git_revision() -> str | None:
    """The checkout's commit, with ``+changes`` when tracked files differ from it; None outside a checkout."""
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    if head.returncode:
        return None
    changed = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                             capture_output=True, text=True).stdout.strip()
    return head.stdout.strip() + ("+changes" if changed else "")


def merge_rows(previous: list[dict], rows: list[dict]) -> list[dict]:
    """``previous`` with each (case, program) that ``rows`` has replaced in place, then ``rows``' new ones."""
    new = {(r["case"], r["program"]): r for r in rows}
    return [new.pop((r["case"], r["program"]), r) for r in previous] + list(new.values())


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="shrunken settings through the same code (seconds)")
    ap.add_argument("--cases", default=None, help="preset:method:env[:mesh=FxT][:micro=N][:sched=memory|default]"
                    "[:only=update|generate],... (default: CASES and REFERENCES)")
    ap.add_argument("--programs", default=",".join(PROGRAMS), help="update,generate")
    ap.add_argument("--out", default=None, help=f"JSON path (default {RESULTS.relative_to(ROOT)})")
    ap.add_argument("--min-free-gib", type=float, default=2.0, help="stop a child below this much free memory")
    ap.add_argument("--timeout", type=float, default=3600.0, help="seconds per child")
    ap.add_argument("--revision", default=None, help="the commit of the code when it runs outside a checkout")
    ap.add_argument("--merge", action="store_true", help="replace these cases' rows in the existing --out JSON and "
                    "keep its other rows (each row names the revision that made it)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--program", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--row-out", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        row = run_child(args.child, args.program, args.quick)
        pathlib.Path(args.row_out).write_text(json.dumps(row, indent=1))
        return
    programs = [p for p in args.programs.split(",") if p]
    unknown = sorted(set(programs) - set(PROGRAMS))
    if unknown:
        raise SystemExit(f"--programs: unknown {unknown}; choose from {PROGRAMS}")
    cases = [":".join(c) for c in QUICK_CASES] if args.quick else [":".join(c) for c in CASES] + list(REFERENCES)
    if args.cases:
        cases = [c for c in args.cases.split(",") if c]
    for c in cases:
        parse_case(c)
    out = pathlib.Path(args.out) if args.out else RESULTS
    meta = dict(date=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"), jax=jax.__version__,
                jaxlib=jax.lib.__version__, python=platform.python_version(),
                revision=args.revision or git_revision(),
                devices=f"{DEVICES} fake CPU devices (XLA_FLAGS=--xla_force_host_platform_device_count)",
                device_bytes=DEVICE_BYTES, jax_pool_fraction=JAX_POOL_FRACTION, quick=args.quick,
                xla_optimizations="as the environment sets them" if args.quick else "all on",
                peak="argument + output - alias + temp, per device; generate: resident state + max(prefill, decode) "
                     "- their parameter arguments")
    previous = []
    if args.merge and out.exists():
        old = json.loads(out.read_text())
        previous = [r | {"revision": r.get("revision", old["meta"]["revision"])} for r in old["cases"]]
    rows = []
    for case in cases:
        for program in parse_case(case).get("only", programs):
            print(f"-- {case} {program}", flush=True)
            if args.quick:  # small programs: in this process
                t0 = time.perf_counter()
                row = run_child(case, program, quick=True) | dict(wall_s=time.perf_counter() - t0)
            else:
                row = spawn(case, program, False, int(args.min_free_gib * GIB), args.timeout)
            rows.append(row | {"revision": meta["revision"]})
            brief = {k: row.get(k) for k in ("status", "error", "peak_gib", "fraction", "fits", "compile_s",
                                              "wall_s") if k in row}
            print(json.dumps(brief), flush=True)
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(dict(meta=meta, cases=merge_rows(previous, rows)), indent=1))
    rows = merge_rows(previous, rows)
    table(rows)
    print(f"wrote {out}")
    if any(r.get("status") == "error" for r in rows):
        raise SystemExit("some programs did not compile (see the table and the JSON)")


if __name__ == "__main__":
    main()
