"""Golden runs: ``agentjax train`` re-run from random init and compared with the numbers recorded before a refactor.

"Refactors keep users' numbers": every ``tests/golden/<name>.json`` holds a run recorded with the CLI (its
``argv`` after ``agentjax train``: the ``tiny`` preset, ``--no-warm-start``, 3 updates, a small evaluation; the list
and the recorder are ``tests/golden/record.py``), the scalar lines of its ``metrics.jsonl`` without wall-clock
values (:func:`scalar_metrics`), a sha256 of the final checkpoint's trainable arrays (``params`` and PPO's
``value_head``: :func:`param_digest`) with per-module summaries (sum, sum of |x|, sum of squares, max |x|), and the
machine and versions it was recorded on. This test trains the same argv in-process through ``agentjax.cli.main``
into ``tmp_path`` and compares:

* the metrics lines: the same steps and the same keys in every line; **exact** equality for the values that count
  discrete events (:func:`exact_key`: everything under ``rollout/``, ``eval/``, ``held_out/``, ``tree/``,
  ``schedule/``, ``judge/``, ``rubric/``, ``grade/``, SERO's root / step counts and branch endings, and the token /
  row / sample counts and skip counters of ``train/`` and ``credit/``), and ``|a - b| <= 1e-5 + 1e-4 |b|`` for the
  rest (losses, KL, entropy, ratios, grad norm, advantage and value statistics, SERO weights: float32 results of
  jitted code);
* the parameter summaries: ``sumsq``, ``abs_sum`` and ``max_abs`` within ``rtol=1e-4``; ``sum`` within
  ``1e-4 * abs_sum`` (a sum of terms of both signs has no relative scale of its own; |x| summed bounds its rounding);
* the sha256 of the parameters' bytes, **only when** the CPU (vendor, family, model, stepping, flags), the jax /
  jaxlib versions and the XLA optimisation setting equal the recording's: XLA compiles for the host CPU (vector
  widths, fused multiply-adds, reduction order differ between CPU models), so bit-identity holds on the recording
  machine only. Elsewhere the tolerance comparison is the test, and this run's result is written to
  ``tmp_path/<name>.json`` (the assertion messages say which comparison ran and where that file is).

Why these tolerances (measurements: tests/golden/README.md). The numbers are float32 and the programs small, so two
builds of the same program differ by reassociated sums. Re-recording the set with XLA's optimisations off (other
fusions, other reduction orders, the same CPU) moved no count and no success rate, moved the float metrics by at
most 4.7e-6 relative where |value| > 1e-3 and 4.8e-7 absolute anywhere, and the parameter summaries by at most
1.3e-8 relative; capping the instruction set at AVX2 (``--xla_cpu_max_isa=AVX2``, a stand-in for an older CPU)
left the parameters bit-identical and moved ``train/ratio_mean`` by 3.5e-6. rtol 1e-4 leaves 20x or more for
another CPU's drift and still fails a changed formula, coefficient, key, mini-batch split or token order, which
move these numbers by 1e-3 and more. atol 1e-5 is for the values that are zero up to rounding by construction
(advantage means ~1e-8, on-policy behaviour KL ~1e-9, explained variance ~1e-4, whose drift reached 2.4e-7): a
change that moved only those by < 1e-5 would still move the losses and parameters. Counts are exact because they
are host-side functions of the sampled tokens: the same policy to ~1e-6 samples the same tokens, unless a draw
lands within that drift of a decision boundary (it did not in any measurement; if it happens on another machine,
the sampled episodes diverge and the numbers with them: re-record there from the same commit to compare).

Recorded, like this test runs, under ``tests/conftest.py``'s settings (8 fake CPU devices, rank promotion "raise")
with XLA's optimisations on (its ``optimised_xla`` fixture: the runs are long enough to pay for optimised code, 6
minutes against 10): ``record.py`` imports that conftest before jax. Re-record after a change that is *meant* to
move the numbers: ``python -m tests.golden.record`` (README there). The set takes minutes of 2 CPU cores, so it is
``slow``: ``pytest -m slow -k golden``.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import re
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
FILES = sorted(GOLDEN.glob("*.json"))
RTOL, ATOL = 1e-4, 1e-5  # floats of jitted code (module docstring)
PARAM_RTOL = 1e-4
# Discrete outcomes of the sampled episodes and trees (host-side counts and rates of counts): equal or not.
EXACT_PREFIXES = ("rollout/", "eval/", "held_out/", "tree/", "schedule/", "judge/", "rubric/", "grade/", "step")
EXACT_NAMES = re.compile(r"(^|_|/)(num|count|counts|tokens|rows|samples|episodes|turns|skipped|nonfinite_total|"
                         r"kept_tasks|roots|branches|steps|calls|requests|successes|failures|timeouts|gated|ended)"
                         r"(_|$)")


# -- what a run leaves ----------------------------------------------------------------------------------------------
def wall_clock(key: str) -> bool:
    """Keys whose values depend on the clock: ``time``, ``time/…``, SERO's ``sero/time_…``, ``…seconds…``,
    ``…per_s…``."""
    last = key.rsplit("/", 1)[-1]
    return key == "time" or key.startswith("time/") or last.startswith("time_") or "seconds" in key or "per_s" in key


def scalar_metrics(line: dict[str, Any]) -> dict[str, Any]:
    """A metrics line's scalar values without the wall-clock ones (NaN / Inf kept as floats)."""
    return {k: v for k, v in sorted(line.items()) if not wall_clock(k) and isinstance(v, int | float)}


def exact_key(key: str) -> bool:
    """Compared exactly: counts and rates of discrete events (module docstring)."""
    return key.startswith(EXACT_PREFIXES) or bool(EXACT_NAMES.search(key.rsplit("/", 1)[-1]))


def _leaf_name(path: tuple) -> str:
    """``params/blocks/0/attn/q_dnh`` for orbax's ``['params']['blocks']['0']['attn']['q_dnh']['value']``."""
    keys = [str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))) for k in path]
    return "/".join(keys[:-1] if keys and keys[-1] == "value" else keys)


def _module(name: str) -> str:
    """The summary group of a leaf: ``params/blocks/0``, ``params/embed_vd``, ``value_head``."""
    parts = name.split("/")
    if parts[0] == "params":
        return "/".join(parts[:3] if len(parts) > 2 and parts[1] == "blocks" else parts[:2])
    return parts[0]


def trainable_arrays(out_dir: str | os.PathLike) -> dict[str, np.ndarray]:
    """``{leaf name: array}`` of ``params`` and ``value_head`` in the run's newest checkpoint (orbax, read without a
    target: the structure as saved)."""
    import jax
    import orbax.checkpoint as ocp

    ckpt = Path(out_dir) / "checkpoints"
    step = max(int(p.name) for p in ckpt.iterdir() if p.name.isdigit())
    with ocp.StandardCheckpointer() as reader:
        state = reader.restore(ckpt / str(step) / "state")
    tree = {"params": state["params"], "value_head": state.get("value_head", {})}
    flat = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {_leaf_name(p): np.asarray(x) for p, x in sorted(flat, key=lambda t: _leaf_name(t[0]))}


def param_digest(arrays: dict[str, np.ndarray]) -> dict[str, Any]:
    """sha256 over (name, dtype, shape, little-endian bytes) of every leaf in name order, and per-module float64
    ``sum``, ``abs_sum``, ``sumsq``, ``max_abs`` and ``size``."""
    h = hashlib.sha256()
    modules: dict[str, dict[str, float]] = {}
    for name, x in arrays.items():
        x = np.ascontiguousarray(x)
        h.update(f"{name}|{x.dtype.str}|{x.shape}|".encode())
        h.update(x.astype(x.dtype.newbyteorder("<"), copy=False).tobytes())
        m = modules.setdefault(_module(name), {"sum": 0.0, "abs_sum": 0.0, "sumsq": 0.0, "max_abs": 0.0, "size": 0})
        x64 = x.astype(np.float64)
        m["sum"] += float(x64.sum())
        m["abs_sum"] += float(np.abs(x64).sum())
        m["sumsq"] += float(np.square(x64).sum())
        m["max_abs"] = max(m["max_abs"], float(np.abs(x64).max(initial=0.0)))
        m["size"] += int(x.size)
    return {"sha256": h.hexdigest(), "leaves": len(arrays), "modules": modules}


def machine() -> dict[str, Any]:
    """What bit-identity depends on: the CPU and the jax / jaxlib versions (and, for the record, the rest)."""
    import flax
    import jax
    import jaxlib
    import optax
    import orbax.checkpoint

    cpu: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key in ("vendor_id", "cpu family", "model", "model name", "stepping", "flags") and key not in cpu:
                    cpu[key] = value.strip()
                if not line.strip() and cpu:
                    break
    except OSError:
        cpu["model name"] = platform.processor() or platform.machine()
    flags = cpu.pop("flags", "")
    cpu["flags_sha256"] = hashlib.sha256(flags.encode()).hexdigest()[:16]
    return {"cpu": cpu, "jax": jax.__version__, "jaxlib": jaxlib.__version__, "flax": flax.__version__,
            "optax": optax.__version__, "orbax": orbax.checkpoint.__version__, "numpy": np.__version__,
            "python": platform.python_version(), "cores": os.cpu_count(),
            "xla_flags": os.environ.get("XLA_FLAGS", ""),
            "disable_most_optimizations": bool(jax.config.values["jax_disable_most_optimizations"])}


def same_machine(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return a["cpu"] == b["cpu"] and (a["jax"], a["jaxlib"]) == (b["jax"], b["jaxlib"]) and \
        a.get("disable_most_optimizations") == b.get("disable_most_optimizations")


def run_golden(argv: list[str], out_dir: str | os.PathLike) -> dict[str, Any]:
    """Train ``agentjax train <argv> --out-dir out_dir`` in this process; returns what a golden file compares."""
    from agentjax.cli import main

    t0 = time.perf_counter()
    code = main(["train", *argv, "--out-dir", str(out_dir)])
    seconds = time.perf_counter() - t0
    assert code == 0, f"agentjax train {' '.join(argv)} exited with {code}"
    with open(Path(out_dir) / "metrics.jsonl", encoding="utf-8") as f:
        lines = [json.loads(line) for line in f if line.strip()]
    with open(Path(out_dir) / "run_config.json", encoding="utf-8") as f:
        run_config = json.load(f)
    return {"argv": argv, "command": "agentjax train " + " ".join(argv) + " --out-dir DIR",
            "metrics": [scalar_metrics(line) for line in lines], "params": param_digest(trainable_arrays(out_dir)),
            "machine": machine(), "seconds": round(seconds, 1), "run_config": run_config}


# -- comparing -------------------------------------------------------------------------------------------------------
def _close(a: float, b: float, rtol: float, atol: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return a == b or abs(a - b) <= atol + rtol * abs(b)


def metric_differences(got: list[dict], want: list[dict]) -> list[str]:
    """Every way ``got`` (metrics lines) differs from ``want`` beyond the tolerances (empty: they agree)."""
    if [g.get("step") for g in got] != [w.get("step") for w in want]:
        return [f"steps {[g.get('step') for g in got]} != golden {[w.get('step') for w in want]}"]
    out = []
    for g, w in zip(got, want, strict=True):
        step = w.get("step")
        if set(g) != set(w):
            out.append(f"step {step}: keys only in this run {sorted(set(g) - set(w))}, only in the golden "
                       f"{sorted(set(w) - set(g))}")
        for k in sorted(set(g) & set(w)):
            exact = exact_key(k)
            if not _close(float(g[k]), float(w[k]), 0.0 if exact else RTOL, 0.0 if exact else ATOL):
                out.append(f"step {step} {k}: {g[k]!r} != golden {w[k]!r} ({'exact' if exact else 'rtol/atol'})")
    return out


def param_differences(got: dict[str, Any], want: dict[str, Any]) -> list[str]:
    """The parameter summaries' differences beyond ``PARAM_RTOL`` (module docstring)."""
    if set(got["modules"]) != set(want["modules"]) or got["leaves"] != want["leaves"]:
        return [f"modules {sorted(got['modules'])} ({got['leaves']} leaves) != golden {sorted(want['modules'])} "
                f"({want['leaves']} leaves)"]
    out = []
    for name, w in want["modules"].items():
        g = got["modules"][name]
        if g["size"] != w["size"]:
            out.append(f"{name}: size {g['size']} != golden {w['size']}")
        for k in ("sumsq", "abs_sum", "max_abs"):
            if not _close(g[k], w[k], PARAM_RTOL, 0.0):
                out.append(f"{name} {k}: {g[k]!r} != golden {w[k]!r} (rtol {PARAM_RTOL})")
        if abs(g["sum"] - w["sum"]) > PARAM_RTOL * w["abs_sum"]:
            out.append(f"{name} sum: {g['sum']!r} != golden {w['sum']!r} (within {PARAM_RTOL} x abs_sum)")
    return out


@pytest.mark.slow  # six tiny-preset trainings: about 6 minutes on 2 cores (tests/golden/README.md)
@pytest.mark.usefixtures("optimised_xla")  # as recorded (record.py): half the time of the suite's -O0 setting
@pytest.mark.parametrize("path", FILES, ids=[f"golden-{p.stem}" for p in FILES])
def test_golden(path, tmp_path):
    golden = json.loads(path.read_text())
    got = run_golden(golden["argv"], tmp_path / "run")
    mine = tmp_path / f"{path.stem}.json"
    mine.write_text(json.dumps(got, indent=1))
    bitwise = same_machine(got["machine"], golden["machine"])
    how = ("the recording's CPU and jax: bitwise hash + tolerances" if bitwise else
           f"another CPU / jax than the recording's: tolerances only (this run's result: {mine})")
    diffs = metric_differences(got["metrics"], golden["metrics"])
    assert not diffs, f"{path.name} ({how}): metrics differ:\n  " + "\n  ".join(diffs[:40])
    diffs = param_differences(got["params"], golden["params"])
    assert not diffs, f"{path.name} ({how}): parameters differ:\n  " + "\n  ".join(diffs)
    if bitwise:
        assert got["params"]["sha256"] == golden["params"]["sha256"], (
            f"{path.name} ({how}): metrics and parameter summaries within tolerance but the parameters' sha256 "
            f"differs on the recording machine (this run's result: {mine})")


def test_golden_files_are_there():
    """The golden set exists and every file names its command (a lost file would silently drop a case)."""
    from tests.golden.record import RUNS

    assert sorted(p.stem for p in FILES) == sorted(RUNS), "tests/golden/*.json and record.py's RUNS differ"
    for p in FILES:
        golden = json.loads(p.read_text())
        assert golden["argv"] == RUNS[p.stem] and golden["metrics"] and golden["params"]["sha256"], p.name


def test_golden_comparison_catches_changes():
    """The comparison passes a golden run against itself and its float32 rounding, and fails a moved loss, a
    moved count, a lost key and moved parameters (no training: the recorded numbers, perturbed)."""
    import copy

    golden = json.loads(FILES[0].read_text())
    metrics, params = golden["metrics"], golden["params"]
    assert not metric_differences(metrics, metrics) and not param_differences(params, params)

    def moved(key: str, factor: float) -> list[dict]:
        out = copy.deepcopy(metrics)
        out[-1][key] *= factor
        return out

    assert not metric_differences(moved("train/loss", 1 + 1e-6), metrics)  # drift of another CPU
    assert metric_differences(moved("train/loss", 1 + 1e-3), metrics)  # a changed formula
    assert metric_differences(moved("train/tokens", 1 + 1e-6), metrics)  # counts are exact
    lost = copy.deepcopy(metrics)
    del lost[-1]["train/kl"]
    assert metric_differences(lost, metrics)
    shifted = copy.deepcopy(params)
    module = next(iter(shifted["modules"].values()))
    module["sumsq"] *= 1 + 1e-6
    assert not param_differences(shifted, params)
    module["sumsq"] *= 1 + 1e-3
    assert param_differences(shifted, params)
