"""experiments/bench/memory_plan.py: the full-size settings it plans (sizes and the KV-cache formula against counts
made by hand), and ``--quick`` end to end (shrunken settings through the same code: the update and generation
programs of the 7B preset on its (2, 4) mesh and of the tree preset on (1, 8), compiled on 8 fake devices) writing the
JSON."""

from __future__ import annotations

import importlib.util
import json
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "experiments" / "bench" / "memory_plan.py"


@pytest.fixture(scope="module")
def plan():
    spec = importlib.util.spec_from_file_location("bench_memory_plan", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


def test_full_size_setting_and_kv_cache(plan):
    s = plan.setting("paper-1.5b", "crbc", "alfworld")
    arch = s.train.model.arch
    assert (arch.num_layers, arch.num_kv_heads, arch.head_dim, arch.dtype) == (28, 2, 128, "bfloat16")
    assert s.mesh == (8, 1) and s.train.rollout.rows == 16 * 8 * 50
    # the accelerator's attention blocking, not the CPU's
    assert (arch.attention_chunk, arch.attention_unroll) == (256, 1)
    # first turn: 16 groups x 8 rollouts live (a multiple of the 64-row bucket); evaluation: 134 games x 3 seeds,
    # padded to 448; prompts of 2,048 slots and 512 new tokens
    assert (s.gen_rows, s.eval_rows, s.prompt_slots, s.sampling.max_new_tokens) == (128, 448, 2048, 512)
    # K and V, 28 layers, 128 rows, 2,560 slots, 2 kv heads of 128, bfloat16
    assert plan.kv_bytes(s, 128) == 2 * 28 * 128 * 2560 * 2 * 128 * 2 == 9_395_240_960

    tree = plan.setting("paper-4b", "sera", "textworld_sync")
    assert tree.tree and tree.mesh == (1, 8) and tree.train.loss.kl_coef == 0
    # 8 root tasks x 8 trees: 64 roots on the first turn; 10,240-token prompts and 3,072 new tokens
    assert (tree.gen_rows, tree.prompt_slots, tree.sampling.max_new_tokens) == (64, 10240, 3072)
    assert plan.kv_bytes(tree, 1) == 2 * 36 * 13312 * 8 * 128 * 2


def test_quick_run_compiles_both_programs(tmp_path):
    # a process of its own: the abstract batches are StepBatch / UpdateBatch pytrees of ShapeDtypeStructs, which the
    # suite's runtime type checks of array annotations would reject
    out = tmp_path / "memory_plan.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--cases",
                           "paper-7b:crbc:alfworld,paper-4b:sera:textcraft_synth", "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    data = json.loads(out.read_text())
    assert data["meta"]["quick"] and data["meta"]["device_bytes"] == 80 * 10**9
    rows = {(r["preset"], r["program"]): r for r in data["cases"]}
    assert set(rows) == {(p, g) for p in ("paper-7b", "paper-4b") for g in ("update", "generate")}
    for (_, program), r in rows.items():
        assert "error" not in r, r
        m = r["memory"] if program == "update" else None
        if m is not None:
            assert r["peak_bytes"] == m["argument"] + m["output"] - m["alias"] + m["temp"]
        assert r["fits"] and 0 < r["fraction"] < 1e-3
        state = r["state_bytes"]
        # AdamW's two moments per parameter (plus its step counts); the KL reference only where kl_coef > 0
        assert 2 * state["params"] <= state["opt_state"] <= 2 * state["params"] + 64
        assert state["ref_params"] == (state["params"] if r["kl_coef"] > 0 else 0)

    for name in ("paper-7b", "paper-4b"):
        update = rows[name, "update"]
        # the update donates its whole state: every state buffer is written in place
        assert update["memory"]["alias"] == update["state_bytes"]["total"]
        assert update["memory"]["argument"] >= update["state_bytes"]["total"]
        gen = rows[name, "generate"]
        kv = gen["kv_cache"]
        # the quick model: 2 layers, 8 kv heads of 8, bfloat16
        assert kv["total_bytes"] == 2 * 2 * gen["rows"] * gen["cache_slots"] * 8 * 8 * 2
        # the cache is split 8 ways: its rows over fsdp, its kv heads over tp
        assert kv["split"] == 8 and "'tp'" in gen["cache_spec"]
        # the decode loop writes its carry, the cache included, in place
        assert gen["decode"]["memory"]["alias"] >= kv["device_bytes"]
        assert gen["peak_bytes"] >= gen["state_bytes"]["total"] + kv["device_bytes"]


def test_a_planned_mesh_and_micro_batch_change_together(plan):
    # the 7B preset's 2-row micro-batches do not split over fsdp 4: mesh and micro-batch are replaced in one step
    s = plan.setting("paper-7b", "crbc", "textcraft_synth", mesh=(4, 2), micro=8)
    assert s.mesh == (4, 2) and s.train.micro_batch_size == 8
    tree = plan.setting("paper-4b", "sera", "textworld_sync", mesh=(8, 1), micro=8)
    assert tree.mesh == (8, 1) and tree.train.micro_batch_size == 8


def test_merge_replaces_recomputed_rows_in_place(plan):
    previous = [{"case": "a", "program": "update", "peak_gib": 1.0}, {"case": "b", "program": "update",
                                                                      "status": "error"},
                {"case": "c", "program": "generate", "peak_gib": 3.0}]
    rows = [{"case": "b", "program": "update", "peak_gib": 2.0}, {"case": "d", "program": "update", "peak_gib": 4.0}]
    merged = plan.merge_rows(previous, rows)
    assert [(r["case"], r.get("peak_gib")) for r in merged] == [("a", 1.0), ("b", 2.0), ("c", 3.0), ("d", 4.0)]
