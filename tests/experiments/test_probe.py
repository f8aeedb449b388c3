"""experiments/crbc/probe.py and the demo: the eval curve and the paired gain they print (report.episode_gain)."""

import json
import os
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
    assert "a gain under 2 of them is within noise" in text and "committed" not in text


def test_the_demo_says_what_it_does_and_how_long_it_takes(tmp_path, capsys):
    """The plan names each stage with its expected duration; the progress lines come from the run's metrics as the
    loop writes them, and from the warm start built in this process."""
    from agentjax.train import warmstart
    from experiments.crbc import demo
    from experiments.crbc.run import demo_run

    run = demo_run("gigpo", 0, results=str(tmp_path))
    text = demo.plan(run, cached=False)
    assert "[1/3] warm start" in text and "4,000 training rooms" in text and "2,000 supervised AdamW steps" in text
    assert "[2/3] RL: 16 gigpo updates" in text and "[3/3] evaluation at updates 0, 4, 8, 12, 16" in text
    assert "cached in" in demo.plan(run, cached=True)
    os.makedirs(run.out_dir)
    with demo.update_progress(run, every=0.01):
        with open(os.path.join(run.out_dir, "metrics.jsonl"), "w") as f:
            f.write(json.dumps({"step": 4, "rollout/success_rate": 0.5, "time/total": 12.0,
                                "eval/success_rate": 0.25, "held_out/success_rate": 0.125, "time/eval": 3.0}) + "\n")
    out = capsys.readouterr().out
    assert "update 4/16: batch success 0.500 (12 s)" in out
    assert "eval at update 4: the pool's rooms 0.250, held-out rooms 0.125 (3 s)" in out
    originals = warmstart.demonstrations, warmstart.supervised
    with demo.warm_start_progress():
        assert warmstart.demonstrations is not originals[0] and warmstart.supervised is not originals[1]
    assert (warmstart.demonstrations, warmstart.supervised) == originals


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
