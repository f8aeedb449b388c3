"""experiments/crbc/probe.py and the demo: the eval curve and the paired gain they print (report.episode_gain)."""

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


def test_the_demo_explains_its_paired_gains(tmp_path):
    from experiments.crbc import run as experiment
    from experiments.crbc.presets import pool_run

    run = pool_run("gigpo", 0, results=str(tmp_path)).replace(out_dir=str(tmp_path / "gigpo" / "seed0"))
    folder = tmp_path / "gigpo" / "seed0" / "eval"
    (folder / "held_out").mkdir(parents=True)
    for step, outcomes, held_out in ((0, [[0, 0], [1, 0]], [[1, 1], [1, 0]]), (16, [[1, 0], [1, 1]], [[0, 1], [0, 0]])):
        (folder / f"{step}.json").write_text(json.dumps({"outcomes": outcomes}))
        (folder / "held_out" / f"{step}.json").write_text(json.dumps({"outcomes": held_out}))
    assert experiment.main(["--demo", "--dry-run", "--results", str(tmp_path)]) == 0
    text = experiment.explain({("gigpo", 0): run}, str(tmp_path), "demo", smoke=False, demo=True)
    assert "gigpo seed 0, the pool's rooms: eval success 0.250 at update 0 -> 0.750 at update 16, gain +0.500 ± 0.289" \
        in text
    assert "gigpo seed 0, held-out rooms: eval success 0.750 at update 0 -> 0.250 at update 16, gain -0.500 ± 0.289" \
        in text
    assert "the 16 rooms of the training pool" in text and "16 held-out rooms it never trains on" in text
    # the committed comparison's run of the same config, for a reader to compare with (git keeps its eval files)
    assert "committed run of the same config (experiments/crbc/results/runs/pool/gigpo/seed0): 0.461 -> 0.703" in text
    assert "this run started from another policy" in text  # its update 0 is not the committed run's
    committed = json.loads((pathlib.Path(experiment.ROOT) / "experiments/crbc/results/runs/pool/gigpo/seed0/eval/0.json"
                            ).read_text())
    for step in (0, 16):
        (folder / f"{step}.json").write_text(json.dumps({"outcomes": committed["outcomes"]}))
    text = experiment.explain({("gigpo", 0): run}, str(tmp_path), "demo", smoke=False, demo=True)
    assert "this run started from the same policy" in text


def test_the_demo_trains_its_own_run(tmp_path):
    from experiments.crbc.presets import pool_run
    from experiments.crbc.run import demo_run

    run, committed = demo_run("gigpo", 0, results=str(tmp_path)), pool_run("gigpo", 0, results=str(tmp_path))
    assert run.out_dir == str(tmp_path / "runs" / "demo" / "gigpo" / "seed0")  # git-ignored: a fresh clone trains
    assert run.replace(out_dir=committed.out_dir) == committed


@pytest.mark.slow  # a warm start end to end (45 s of CI's budget): `make test-slow`
def test_the_warm_start_curve_probes_held_out_agreement(tmp_path):
    from experiments.crbc.warmstart_curve import main as curve_main

    out = tmp_path / "curve.jsonl"
    curve_main(["--episodes", "2", "--steps", "3", "--every", "2", "--batch", "4", "--out", str(out)])
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["step"] for r in records] == [2, 3]
    for r in records:
        assert 0.0 <= r["agreement"] <= 1.0 and r["turns"] > 0 and np.isfinite(r["loss"])
