"""experiments/credit_testbed/run.py and report.py: the runs it lists, what counts as finished, the table's numbers
on hand-made run folders, and the table rebuilt from the results JSON alone (``--report-only`` on a fresh clone).
The real quick path (two short training runs) is slow-marked."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

from experiments.credit_testbed import report as rep
from experiments.credit_testbed import run as driver
from experiments.credit_testbed.presets import ARMS, POOL, SEEDS, arm_of, arm_run, comparison

UPDATES, EVERY = 10, 5


def fake_run(run, exact, pearson, check=(0.5, 0.03, 0.52)):
    """A run folder as the trainer and the final check leave it: ``exact`` / ``pearson`` at updates 0, 5, 10."""
    os.makedirs(os.path.join(run.out_dir, "eval"), exist_ok=True)
    with open(os.path.join(run.out_dir, "metrics.jsonl"), "w") as f:
        for i, u in enumerate(range(0, len(exact) * run.eval_every, run.eval_every)):
            line = {"step": u, "exact/success": exact[i], "exact/value": exact[i] / 2}
            if u:
                line |= {"credit/pearson": pearson[i - 1], "credit/sign_agreement": 0.6, "rollout/success_rate": 0.5}
            f.write(json.dumps(line) + "\n")
            with open(os.path.join(run.out_dir, "eval", f"{u}.json"), "w") as g:
                json.dump({"step": u, "outcomes": [[1], [0], [1], [0]]}, g)
    sampled, se, exact_final = check
    with open(driver.check_path(run), "w") as f:
        json.dump({"step": run.updates, "success_rate": sampled, "success_se": se, "outcomes": [[1] * 64] * POOL,
                   "exact": {"success": exact_final}}, f)


def test_the_comparison_lists_every_arm_and_seed_with_its_own_mdps(tmp_path):
    runs = comparison(runs=str(tmp_path))
    assert len(runs) == sum(len(ARMS[s]) for s in ARMS) * len(SEEDS) >= 3 * 6 * 10
    assert {label for s, label, _ in runs if s == "s3"} == {"graphgpo", "graphgpo+sero", "graphgpo+sero-root",
                                                           "graphgpo+sero-flat", "crbc", "crbc+sero", "crbc+sero-root",
                                                           "crbc+sero-flat"}
    caps = {"s1": 34, "s2": 14, "s3": 20}
    for (setting, label, seed), run in runs.items():
        assert run.env_kwargs == {"setting": setting, "seed_offset": POOL * seed} and run.train.seed == seed
        assert run.collect.max_steps == caps[setting] == run.train.rollout.max_steps  # the setting's own cap
        assert run.warm_start is None and run.train_pool == POOL == run.eval_tasks and run.eval_split == "train"
        arm = arm_of(label)
        assert run.train.credit.method == arm.method
        assert (run.train.sero.scheme if run.train.sero else None) == arm.sero
        assert run.out_dir == os.path.join(str(tmp_path), setting, label, f"seed{seed}")
    with pytest.raises(ValueError, match="unknown arm"):
        arm_of("crbc+sera")


def test_a_run_is_finished_with_its_check_and_finished_runs_are_not_run_again(tmp_path, monkeypatch, capsys):
    run = arm_run("s2", "grpo", 0, runs=str(tmp_path), updates=UPDATES, eval_every=EVERY)
    assert not driver.trained(run) and not driver.finished(run)
    fake_run(run, [0.5, 0.7, 0.95], [0.2, 0.3])
    assert driver.finished(run)
    os.remove(driver.check_path(run))
    assert driver.trained(run) and not driver.finished(run) and driver.finished(run, check=False)
    fake_run(run, [0.5, 0.7, 0.95], [0.2, 0.3])
    started = []
    monkeypatch.setattr(driver, "run_in_process", lambda runs, *a, **k: started.extend(runs) or 0)
    driver.run_all({("s2", "grpo", 0): run}, jobs=2)
    assert not started and "0 to run" in capsys.readouterr().out
    batches = []
    monkeypatch.setattr(driver, "run_in_process", lambda runs, log, *a: batches.append((runs, log)) or 0)
    monkeypatch.setattr(driver, "finished", lambda run, check=True: False)  # nothing trains: listed as unfinished
    todo = {("s2", label, seed): arm_run("s2", label, seed, runs=str(tmp_path)) for seed in (0, 1, 2)
            for label in ("grpo", "crbc")}
    with pytest.raises(SystemExit, match="runs not finished"):
        driver.run_all(todo, jobs=2)  # one process per setting and seed
    assert sorted(os.path.basename(log) for _, log in batches) == ["s2-seed0.log", "s2-seed1.log", "s2-seed2.log"]
    batches.clear()
    with pytest.raises(SystemExit, match="runs not finished"):
        driver.run_all(todo, jobs=2, even=True)  # exactly 2 processes, the runs dealt out in turn
    assert sorted(len(runs) for runs, _ in batches) == [3, 3]
    assert sum((runs for runs, _ in batches), []) != list(todo.values()) and \
        sorted(r.out_dir for runs, _ in batches for r in runs) == sorted(r.out_dir for r in todo.values())


def test_the_table_on_hand_made_runs_and_its_rebuild_from_the_json_alone(tmp_path):
    runs_dir, results = tmp_path / "runs", tmp_path / "results"
    runs = {(label, seed): arm_run("s3", label, seed, runs=str(runs_dir), updates=UPDATES, eval_every=EVERY)
            for label in ("crbc", "crbc+sero") for seed in (0, 1, 2)}
    curves = {  # exact success at updates 0, 5, 10
        ("crbc", 0): [0.1, 0.3, 0.5], ("crbc", 1): [0.2, 0.4, 0.6], ("crbc", 2): [0.1, 0.2, 0.3],
        ("crbc+sero", 0): [0.1, 0.9, 0.95], ("crbc+sero", 1): [0.2, 0.5, 0.92], ("crbc+sero", 2): [0.1, 0.3, 0.4],
    }
    for key, run in runs.items():
        fake_run(run, curves[key], [0.1 * (key[1] + 1), 0.3], check=(0.55, 0.03, 0.5))
    training = arm_run("s3", "crbc", 3, runs=str(runs_dir), updates=UPDATES + 5, eval_every=EVERY)
    fake_run(training, [0.1, 0.2, 0.3], [0.1, 0.1])  # at update 10 of 15: still training, left out
    assert set(rep.records_of(runs | {("crbc", 3): training}, str(results / "none.json"))) == set(runs)
    table = rep.report(runs, "s3", str(results))
    sero, base = table["crbc+sero"], table["crbc"]
    gains = [0.85, 0.72, 0.3]
    assert sero["gain"]["mean"] == pytest.approx(np.mean(gains))
    assert sero["gain"]["se"] == pytest.approx(np.std(gains, ddof=1) / np.sqrt(3))
    assert sero["vs_base"]["final"]["mean"] == pytest.approx(np.mean([0.45, 0.32, 0.1]))
    assert "vs_grpo" not in sero  # no GRPO arm on this table
    # updates to 0.9: seed 0 at 5, seed 1 at 10, seed 2 never (censored at its last update, 10)
    assert sero["updates_to"]["mean"] == pytest.approx(np.mean([5, 10, 10])) and sero["censored"] == 1
    assert base["censored"] == 3 and sero["vs_base"]["updates_to"]["mean"] == pytest.approx(np.mean([-5, 0, 0]))
    assert base["pearson"]["mean"] == pytest.approx(np.mean([0.2, 0.25, 0.3]))
    # the check: sampled 0.55 vs exact 0.5 on 256 episodes is 1.6 binomial SE
    assert sero["check_diff"]["mean"] == pytest.approx(0.05) and sero["check_beyond"] == {"2": 0, "3": 0, "runs": 3}
    text = (results / "s3_results.md").read_text()
    assert "| crbc+sero | 3 |" in text and "(1/3)" in text and "--settings s3 --report-only" in text
    assert "(the ceiling): 1.000 over seeds" in text and "3 of 3 seeds' MDPs allow 0.9" in text  # S3 has no slips
    assert (results / "s3_curves.png").stat().st_size > 10_000
    stored = json.loads((results / "s3_results.json").read_text())
    assert len(stored["runs"]) == 6 and "seed_offset" not in stored["config"]["env_kwargs"]

    shutil.rmtree(runs_dir)  # a fresh clone: no run folders, only the committed JSON
    assert driver.main(["--settings", "s3", "--arms", "crbc", "crbc+sero", "--seeds", "0", "1", "2", "--report-only",
                        "--runs", str(runs_dir), "--results", str(results)]) == 0
    assert (results / "s3_results.md").read_text() == text
    assert rep.stored_table(str(results), "s3")["crbc+sero"]["curves"]["exact/success"][5]["mean"] == \
        pytest.approx(np.mean([0.9, 0.5, 0.3]))


def test_the_quick_path_lists_two_short_runs(tmp_path, capsys):
    assert driver.main(["--quick", "--dry-run", "--runs", str(tmp_path)]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 2 and all("4 updates, to run" in line for line in out)
    assert {line.split()[1] for line in out} == {"grpo", "crbc"}


@pytest.mark.slow
def test_the_quick_path_trains_checks_and_reports(tmp_path):
    """Two 4-update runs on S2 (minutes on 2 cores: compiling), their checks, the table; then resumed as done."""
    assert driver.main(["--quick", "--jobs", "2", "--runs", str(tmp_path)]) == 0
    table = rep.stored_table(str(tmp_path / "quick"), "s2")
    assert set(table) == {"grpo", "crbc"} and table["crbc"]["vs_grpo"]["final"]["n"] == 1
    for label in table:
        assert table[label]["check_beyond"]["runs"] == 1 and 0 < table[label]["final"]["mean"] < 1
        assert np.isfinite(table[label]["pearson"]["mean"])
    assert driver.main(["--quick", "--runs", str(tmp_path)]) == 0  # finished: reported again, nothing trained


def test_the_demo_is_the_comparisons_s2_runs_shortened_and_says_when_a_method_did_not_rise(tmp_path):
    from experiments.credit_testbed import demo

    runs = demo.demo_runs(str(tmp_path))
    assert sorted({(label, seed) for _, label, seed in runs}) == [(a, s) for a in sorted(demo.ARMS) for s in demo.SEEDS]
    for (setting, label, seed), run in runs.items():
        full = arm_run(setting, label, seed, runs=str(tmp_path))
        assert setting == "s2" and (run.updates, run.eval_every) == (demo.UPDATES, demo.EVAL_EVERY)
        assert run.replace(updates=full.updates, eval_every=full.eval_every, checkpoint_every=full.checkpoint_every,
                           out_dir=full.out_dir) == full
        assert run.out_dir.startswith(str(tmp_path / "demo"))

    def row(gain, se):
        return {"initial": {"mean": 0.5}, "final": {"mean": 0.5 + gain}, "gain": {"mean": gain, "se": se}}

    lines = demo.verdict({"grpo": row(0.3, 0.05), "crbc": row(0.1, 0.05)})
    assert "(6.0 SE) rose beyond 3 SE" in lines[0] and "(2.0 SE) did NOT rise by 3 SE" in lines[1]
