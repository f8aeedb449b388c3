"""experiments/crbc/probe.py: the eval curve and the paired gain it prints (report.episode_gain)."""

import json
import pathlib

import numpy as np
import pytest

from experiments.crbc.probe import main
from experiments.crbc.report import episode_gain


def test_eval_curve_pairs_the_gain_by_episode(tmp_path):
    (tmp_path / "eval").mkdir()
    first, last = [[0, 1], [0, 0], [1, 1]], [[1, 1], [0, 1], [1, 0]]  # 3 tasks x 2 seeds
    for step, outcomes in ((0, first), (4, [[0, 0]] * 3), (20, last)):
        (tmp_path / "eval" / f"{step}.json").write_text(json.dumps({"step": step, "outcomes": outcomes}))
    curve = episode_gain(str(tmp_path))
    assert curve["success"] == {0: 0.5, 4: 0.0, 20: 4 / 6} and (curve["first"], curve["last"]) == (0, 20)
    assert curve["episodes"] == 6
    diff = np.array([1, 0, 0, 1, 0, -1], float)
    assert curve["gain"] == pytest.approx(diff.mean())
    assert curve["gain_se"] == pytest.approx(diff.std(ddof=1) / np.sqrt(6))
    with pytest.raises(FileNotFoundError, match="no evaluations"):
        episode_gain(str(tmp_path / "missing"))


def test_the_step_is_required():
    with pytest.raises(SystemExit):
        main(["--method", "grpo", "--out", "x"])


def test_fixed_rooms_train_on_the_eval_rooms_they_evaluate():
    from agentjax.train.runconfig import ENVS
    from experiments.crbc.probe import FixedRooms

    spec = ENVS["sokoban"]
    fixed = FixedRooms(**vars(spec), rooms=16)
    assert fixed.tasks(spec.train_split) == spec.tasks(spec.eval_split)[:16]
    assert fixed.tasks(spec.eval_split) == spec.tasks(spec.eval_split)
    with pytest.raises(SystemExit):  # 128 eval episodes must split evenly over the rooms
        main(["--lr", "1e-3", "--mini-batches", "1", "--fixed-rooms", "24", "--out", "x"])


@pytest.mark.slow  # a warm start end to end (45 s of CI's budget): `make test-slow`
def test_the_warm_start_curve_probes_held_out_agreement(tmp_path):
    from experiments.crbc.warmstart_curve import main as curve_main

    out = tmp_path / "curve.jsonl"
    curve_main(["--episodes", "2", "--steps", "3", "--every", "2", "--batch", "4", "--out", str(out)])
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["step"] for r in records] == [2, 3]
    for r in records:
        assert 0.0 <= r["agreement"] <= 1.0 and r["turns"] > 0 and np.isfinite(r["loss"])


def test_the_probe_table_rebuilds_from_its_json(tmp_path):
    """`python experiments/crbc/probe.py --table`: results/probes.md from results/probes.json; --record keeps a
    probe's command without its output folder and the recording flags, replacing a probe of the same name."""
    from experiments.crbc import probe

    committed = pathlib.Path(probe.PROBES)
    assert probe.table(json.loads(committed.read_text())["probes"]) == committed.with_suffix(".md").read_text()
    curve = {"success": {0: 0.5, 4: 0.75}, "first": 0, "last": 4, "gain": 0.25, "gain_se": 0.1, "episodes": 8}
    path = str(tmp_path / "probes.json")
    argv = ["--method", "gigpo", "--lr", "1e-3", "--mini-batches", "2", "--out", "/tmp/x", "--record", "a",
            "--description", "two words"]
    probe.record("a", "two words", argv, curve, path)
    probe.record("a", "two words", argv, curve | {"gain": 0.125}, path)
    saved = json.loads((tmp_path / "probes.json").read_text())["probes"]
    assert len(saved) == 1 and saved[0]["gain"] == 0.125
    assert saved[0]["command"] == "python experiments/crbc/probe.py --method gigpo --lr 1e-3 --mini-batches 2"
    assert "| two words | `python experiments/crbc/probe.py" in (tmp_path / "probes.md").read_text()
