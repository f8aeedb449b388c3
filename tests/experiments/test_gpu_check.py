"""experiments/bench/gpu_check.sh --dry-run: both parts run on the CPU and the merged JSON holds finite positive
numbers for every stage (model_gpu's train and decode rows; gpu_update's device, generate, decode roofline, credit
and update stages)."""

from __future__ import annotations

import json
import math
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]

POSITIVE = {  # stage -> keys that must be finite and > 0
    "train": ("tokens_per_s", "step_s", "first_call_s", "model_tflops_per_s", "mfu"),
    "decode": ("tokens_per_s", "generate_s", "first_call_s"),
    "device": ("matmul_flops_per_s", "read_bytes_per_s"),
    "generate": ("generate_s", "tokens", "tokens_per_s", "model_init_s"),
    "decode_roofline": ("tokens_per_s", "bound_tokens_per_s", "ratio", "ratio_static", "ratio_measured_bw",
                        "weight_bytes", "kv_bytes_per_token"),
    "credit": ("credit_s", "first_call_s"),
    "update": ("update_s", "one_micro_batch_s", "first_call_s", "full_update_s", "tokens_per_s",
               "model_flops_timed", "model_flops_full", "mfu", "mfu_policy", "mfu_full_estimate"),
}


def _positive(row: dict, keys: tuple[str, ...], where: str) -> None:
    for key in keys:
        value = row.get(key)
        assert isinstance(value, int | float) and math.isfinite(value) and value > 0, f"{where}.{key} = {value!r}"


@pytest.mark.slow  # end to end: `make test-slow` (README, "Tests")
def test_gpu_check_dry_run_writes_every_part(tmp_path):
    env = dict(os.environ, OUT=str(tmp_path), PYTHON=sys.executable)
    proc = subprocess.run(["bash", str(ROOT / "experiments" / "bench" / "gpu_check.sh"), "--dry-run"], env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    data = json.loads((tmp_path / "gpu_check.json").read_text())
    meta = data["meta"]
    assert meta["dry_run"] is True
    assert {name: part["status"] for name, part in meta["parts"].items()} == {"model_gpu": "ok", "gpu_update": "ok"}
    assert (tmp_path / "gpu_check_logs" / "gpu_update.log").exists()

    rows = {r["metric"]: r for r in data["model_gpu"]["results"]}
    assert set(rows) == {"train", "decode"}
    for name in ("train", "decode"):
        _positive(rows[name], POSITIVE[name], f"model_gpu.{name}")

    stages = {r["stage"]: r for r in data["gpu_update"]["results"]}
    assert set(stages) == {"device", "generate", "decode_roofline", "credit", "update"}
    for name, row in stages.items():
        assert row["status"] == "ok", f"{name}: {row.get('error')}"
        _positive(row, POSITIVE[name], f"gpu_update.{name}")
    for name in ("generate", "credit", "update"):  # compile time reported apart from the steady state
        calls = stages[name]["calls"] if name == "generate" else [stages[name]]
        assert all(c["compile_s"] >= 0 and c["first_call_s"] > 0 for c in calls)
    gen = stages["generate"]
    assert gen["complete"] and len(gen["sizes"]) == len(gen["calls"]) >= 2  # the schedule's sizes, each timed
    update = stages["update"]
    assert update["micro_batches_timed"] >= 2 and update["rows_timed"] <= update["real_rows"] < update["rows_capacity"]
    assert update["skipped"] == 0 and math.isfinite(update["loss"])
    assert 0 < update["mfu_policy"] < update["mfu"]  # the reference forward of the KL term adds a third
    total = data["gpu_update"]["meta"]["update_total_s"]
    _positive(total, ("total_s", "generate_s", "credit_s", "update_s", "samples_per_s"), "update_total_s")
