"""experiments/bench/update.py: its FLOP count against a count made by hand, and ``--quick`` end to end (2 small
updates of the tiny Sokoban preset) writing the JSON that the README's table reads."""

from __future__ import annotations

import importlib.util
import json
import math
import pathlib
import subprocess
import sys

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "experiments" / "bench" / "update.py"


def _module():
    spec = importlib.util.spec_from_file_location("bench_update", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_useful_flops_counts_every_matmul_and_attention_score():
    arch = dict(vocab=100, d_model=8, layers=3, heads=2, kv_heads=1, head_dim=4, mlp=16)
    d, layers, n, k, h, f = 8, 3, 2, 1, 4, 16
    weights = d * n * h + 2 * d * k * h + n * h * d + 3 * d * f  # q, k + v, o, gate + up + down
    prompts, replies, allowed = [5, 7], [2, 3], 4

    def forward(positions):  # the flops of the queries at `positions`, one by one: 2 per weight, 4·H a key a head
        return sum(layers * (2 * weights + 4 * n * h * (i + 1)) for i in positions)

    rows = list(zip(prompts, replies, strict=True))
    expected_generate = sum(forward(range(p + r)) + 2 * d * allowed * r for p, r in rows)
    expected_update = 3 * expected_generate  # the same tokens, forward + backward
    flops = _module().useful_flops(arch, False, np.array(prompts), np.array(replies), allowed, prefix=0, steps=1)
    assert flops == dict(update=expected_update, generate=expected_generate)

    # a shared prefix of 4 tokens, decoded once per optimizer step (2 steps), and the KL term's reference forward
    prefixed = 4 * (sum(forward(range(4, p + r)) + 2 * d * allowed * r for p, r in rows) + 2 * forward(range(4)))
    flops = _module().useful_flops(arch, True, np.array(prompts), np.array(replies), allowed, prefix=4, steps=2)
    assert flops["update"] == prefixed and flops["generate"] == expected_generate


def test_quick_run_writes_the_ratios(tmp_path):
    out = tmp_path / "update.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--matmul-reps", "3", "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    data = json.loads(out.read_text())
    assert {"date", "jax", "jaxlib", "cpu", "revision"} <= set(data["meta"])
    settings = data["settings"]
    assert settings["quick"] and settings["env"] == "sokoban" and settings["updates"] == len(data["updates"]) == 2
    bound = data["bound"]["flops_per_s"]
    assert bound == max(data["bound"][m]["best_flops_per_s"] for m in ("matmul_before", "matmul_after")) > 0
    summary = data["summary"]
    for stage in ("generate", "update"):
        achieved = summary["achieved_flops_per_s"][stage]
        assert summary["flops"][stage] > 0 and math.isclose(summary["ratio"][stage], achieved / bound)
    assert set(summary["median_s"]) == {"collect", "generate", "prompt", "env", "credit", "update", "total"}
    assert all(v > 0 for k, v in summary["median_s"].items() if k != "env")
    for record in data["updates"]:
        batch = record["batch"]
        assert 0 < batch["rows"] <= batch["capacity"] == 2 * 4 * 6
        assert batch["reply_tokens"] <= batch["rows"] * batch["reply_slots"]
        assert math.isfinite(record["metrics"]["loss"])
