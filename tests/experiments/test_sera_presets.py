"""The SERA tiny experiment's presets: RAO and flat GRPO differ in the agent and its credit only (the same policy,
optimizer, warm-start budget, batch of root tasks and evaluation), and the report reads tree and flat runs alike."""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np
import pytest

from agentjax.train.config import GRPOCredit, RAOCredit
from experiments.crbc.report import summarise
from experiments.sera.presets import EVAL_SPLIT, FLAT_STEPS, smoke_run, sync_run, tiny_run


def test_the_arms_are_matched():
    rao, grpo = tiny_run("rao", 1), tiny_run("grpo", 1)
    assert isinstance(rao.train.credit, RAOCredit) and isinstance(grpo.train.credit, GRPOCredit)
    assert rao.tree is not None and grpo.tree is None
    assert rao.train.model == grpo.train.model and rao.train.model.arch.family == "qwen3"
    assert rao.train.optimizer == grpo.train.optimizer and rao.train.seed == grpo.train.seed == 1
    assert rao.train.mini_batches == grpo.train.mini_batches == 1 and grpo.train.epochs == 1
    for field in ("updates", "eval_every", "eval_tasks", "eval_seeds", "eval_split", "env", "tokenizer"):
        assert getattr(rao, field) == getattr(grpo, field), field
    assert rao.evaluation_split == EVAL_SPLIT
    for field in ("episodes", "steps", "batch_size", "learning_rate", "seed"):
        assert getattr(rao.warm_start, field) == getattr(grpo.warm_start, field), field
    assert rao.warm_start.cache_dir != grpo.warm_start.cache_dir  # planner trees vs flat planner episodes
    a, b = rao.train.rollout, grpo.train.rollout
    assert (a.num_groups, a.group_size) == (b.num_groups, b.group_size) and b.max_steps == FLAT_STEPS
    assert rao.out_dir != grpo.out_dir and rao.out_dir.endswith(os.path.join("rao", "seed1"))
    sera = tiny_run("sera", 1)
    assert sera.train.model == rao.train.model and sera.train.optimizer == rao.train.optimizer
    assert sera.tree == rao.tree and sera.train.rollout == rao.train.rollout and sera.rubric_collect.constrained
    assert sera.warm_start.cache_dir not in (rao.warm_start.cache_dir, grpo.warm_start.cache_dir)
    for run in (rao, grpo, sera, smoke_run("rao"), smoke_run("grpo"), smoke_run("sera"), sync_run()):
        run.check()
    assert sync_run().env == "textworld_sync" and sync_run().eval_kwargs["budget"] is None
    assert sync_run().evaluation_split == "validation"  # the test split stays for paper-scale runs
    sera_sync = sync_run(method="sera")
    sera_sync.check()
    assert sera_sync.train.model == sync_run().train.model and sera_sync.tree == sync_run().tree
    assert sera_sync.train.credit.stages == (3, 1, 1) and sera_sync.out_dir.endswith(os.path.join("sera", "seed0"))
    assert sera_sync.updates == sum(sera_sync.train.credit.stages) == sync_run().updates  # each SERA stage steps once
    with pytest.raises(ValueError, match="tree arm"):
        sync_run(method="grpo")


def _write_run(out_dir, outcomes: dict[int, list], train_key: str):
    os.makedirs(os.path.join(out_dir, "eval"), exist_ok=True)
    for step, rows in outcomes.items():
        with open(os.path.join(out_dir, "eval", f"{step}.json"), "w") as f:
            json.dump({"outcomes": rows}, f)
    with open(os.path.join(out_dir, "metrics.jsonl"), "w") as f:
        for step in (1, 2, 3):
            f.write(json.dumps({"step": step, train_key: 0.25 * step}) + "\n")


def test_the_report_pairs_a_tree_run_with_a_flat_one(tmp_path):
    """A tree run's eval files are keyed by batches drawn (a skipped batch adds one), a flat run's by updates: the
    paired difference compares the two final evaluations, and each run's training success is read."""
    tree, flat = tmp_path / "rao", tmp_path / "grpo"
    _write_run(tree, {0: [[0, 0], [1, 0]], 3: [[1, 1], [1, 0]]}, "tree/root_success")
    _write_run(flat, {0: [[0, 0], [1, 0]], 2: [[0, 1], [0, 0]]}, "rollout/success_rate")
    runs = {("rao", 0): dataclasses.make_dataclass("R", ["out_dir"])(str(tree)),
            ("grpo", 0): dataclasses.make_dataclass("R", ["out_dir"])(str(flat))}
    table = summarise(runs)
    assert table["rao"]["final"]["mean"] == 0.75 and table["grpo"]["final"]["mean"] == 0.25
    assert table["rao"]["final_minus_base"]["mean"] == 0.5
    assert np.isclose(table["rao"]["train_mean"]["mean"], 0.5) and np.isclose(table["grpo"]["train_mean"]["mean"], 0.5)


def test_an_arms_report_pairs_each_arm_with_its_base_where_they_started_alike(tmp_path):
    """Without GRPO among the runs each arm's paired column is against its base method (SERA's, RAO's), over the
    seeds whose runs started from the same policy; the tiny comparison keeps GRPO."""
    from experiments.sera.run import pairing

    assert pairing(["rao", "grpo", "sera"]) == {"threshold_method": "grpo"}
    arms = pairing(["rao", "rao_d", "sera", "sera_exec"])
    assert arms["baselines"] == {"rao": "rao", "rao_d": "rao", "sera": "sera", "sera_exec": "sera"}
    runs = {}
    for method, seed, final, weights in (("sera", 0, [1, 0], "a"), ("sera_exec", 0, [1, 1], "a"),
                                         ("sera", 1, [0, 0], "b"), ("sera_exec", 1, [1, 1], "c")):
        out = tmp_path / method / f"seed{seed}"
        _write_run(out, {0: [[0, 0]], 10: [final]}, "tree/root_success")
        (out / "initial_policy.json").write_text(json.dumps({"source": "warm_start", "weights_sha256": weights}))
        runs[method, seed] = dataclasses.make_dataclass("R", ["out_dir"])(str(out))
    kwargs = {k: v for k, v in arms.items() if k != "baseline_column"}
    table = summarise(runs, **kwargs)
    assert table["sera_exec"]["unpaired_seeds"] == [1] and "final_minus_base" not in table["sera"]
    assert table["sera_exec"]["final_minus_base"]["mean"] == 0.5  # seed 0 only: (1, 1) against (1, 0)


def test_pairwise_accuracy_by_hand():
    from experiments.sera.calibration import pairwise_accuracy

    # successes score 0.9 and 0.4, failures 0.4 and 0.1: pairs (0.9>0.4, 0.9>0.1, 0.4=0.4, 0.4>0.1) = 3.5 / 4
    assert pairwise_accuracy([0.9, 0.4, 0.4, 0.1], [1, 1, 0, 0]) == pytest.approx(0.875)
    assert pairwise_accuracy([0.5, 0.2], [1, 1]) is None and pairwise_accuracy([], []) is None


def test_the_ablation_arms_change_the_schedule_only():
    """SERA w/o D / w/o RT / execution-only and RAO + D (SERA Table 3) are their base arm with another stage cycle:
    everything else, warm start included, is the base's."""
    from agentjax.train.config import SERACredit
    from experiments.sera.presets import ARMS

    for arm, (base, stages) in ARMS.items():
        run, ref = tiny_run(arm, 2), tiny_run(base, 2)
        assert run.train.credit.stages == stages and type(run.train.credit) is type(ref.train.credit)
        assert dataclasses.replace(run.train.credit, stages=ref.train.credit.stages) == ref.train.credit, arm
        assert run.train.replace(credit=ref.train.credit) == ref.train, arm
        assert run.warm_start == ref.warm_start, arm
        assert run.tree == ref.tree and run.updates == ref.updates
        assert run.out_dir.endswith(os.path.join(arm, "seed2"))
        run.check()
        smoke = smoke_run(arm)
        assert smoke.train.credit.stages == tuple(min(n, 1) for n in stages)
        assert smoke.updates == max(2, sum(smoke.train.credit.stages))
        smoke.check()
    assert isinstance(tiny_run("sera_exec", 0).train.credit, SERACredit)
    assert tiny_run("rao_d", 0).train.credit.stages == (3, 1, 0)


def test_cost_table_counts_the_labels_each_method_trains_on(tmp_path):
    """Table 2's analogue: RAO's execution batches and SERA's rubric batches are the ones whose reward reads the
    verifier; every batch's rubric and grading calls count."""
    from experiments.sera.run import cost_table

    def write(name, rows):
        out = tmp_path / name
        (out / "eval").mkdir(parents=True)
        (out / "eval" / "0.json").write_text(json.dumps({"outcomes": [[0, 1]]}))  # a run's record needs one
        with open(out / "metrics.jsonl", "w") as f:
            for step, (stage, judged, graded) in enumerate(rows, 1):
                f.write(json.dumps({"step": step, "schedule/stage": stage, "judge/requests": judged,
                                    "grade/calls": graded, "rubric/calls": 1.0}) + "\n")
        return str(out)

    runs = {("rao", 0): tiny_run("rao", 0).replace(out_dir=write("rao", [(0, 10.0, 0.0), (0, 6.0, 0.0)])),
            ("sera", 0): tiny_run("sera", 0).replace(out_dir=write("sera", [(0, 10.0, 2.0), (1, 3.0, 1.0),
                                                                              (2, 7.0, 4.0)])),
            ("grpo", 0): tiny_run("grpo", 0).replace(out_dir=str(tmp_path / "none"))}
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
            for line in cost_table(runs).splitlines()[2:]}
    assert rows["rao"][:2] == ["16", "16"] and rows["sera"][:2] == ["7", "20"]
    assert rows["sera"][3] == "3" and rows["sera"][5] == "7" and rows["grpo"][0] == "—"


def test_search_table_pairs_search_with_the_runs_last_evaluation(tmp_path):
    from experiments.sera.run import search_file, search_table

    runs = {}
    for seed, (plain, trained, initial) in enumerate((([[0, 1], [0, 0]], [[1, 1], [0, 0]], [[0, 1], [0, 0]]),
                                                      ([[1, 1], [0, 0]], [[1, 1], [1, 0]], [[0, 0], [0, 0]]))):
        out = tmp_path / f"seed{seed}"
        _write_run(out, {0: [[0, 0], [0, 0]], 10: plain}, "tree/root_success")
        for name, rows in (("eval_10_search2.json", trained), ("eval_10_search2_initial.json", initial),
                           ("eval_5_search2.json", [[0, 0], [0, 0]])):  # an older one is not read
            stats = {"search/later_won": 0.1 * (seed + 1), "search/chosen_verified": 0.5, "search/any_verified": 0.75}
            (out / name).write_text(json.dumps({"outcomes": rows} | (stats if seed == 0 or "initial" in name else {})))
        runs[("sera", seed)] = tiny_run("sera", seed).replace(out_dir=str(out))
    runs[("rao", 0)] = tiny_run("rao", 0).replace(out_dir=str(tmp_path / "seed0"))  # RAO has no search
    assert search_file(str(tmp_path / "seed0"), 2, "initial").endswith("eval_10_search2_initial.json")
    assert search_file(str(tmp_path / "seed0"), 3, "policy") is None
    lines = search_table(runs, 2).splitlines()
    assert len(lines) == 3 and lines[2].startswith("| sera | 2 |")
    _write_run(tmp_path / "exec", {0: [[0, 0], [0, 0]], 10: [[1, 1], [0, 0]]}, "tree/root_success")
    unsearched = runs | {("sera_exec", 1): tiny_run("sera_exec", 1).replace(out_dir=str(tmp_path / "exec"))}
    assert search_table(unsearched, 2).splitlines()[3:] == ["", "Not searched (not in the table): sera_exec seed 1."]
    cells = [c.strip() for c in lines[2].split("|")[1:-1]]
    # no search 0.25, 0.5; trained 0.5, 0.75; initial 0.25, 0: differences +0.25, +0.25 and 0, -0.5
    assert cells[2].startswith("0.375") and cells[3].startswith("0.625") and cells[4].startswith("0.125")
    assert cells[5] == "+0.250 ± 0" and cells[6].startswith("-0.250 ± 0.25")
    # later candidate committed: trained 0.1 (seed 1's file has no search stats), initial mean(0.1, 0.2)
    assert cells[7] == "0.100 / 0.150" and cells[8] == "0.500 / 0.750"


def test_the_report_leaves_out_runs_still_training(tmp_path, capsys):
    from experiments.sera.run import finished

    done, running = tmp_path / "done", tmp_path / "running"
    _write_run(done, {0: [[0, 1]], 10: [[1, 1]]}, "tree/root_success")
    _write_run(running, {0: [[0, 1]], 5: [[1, 1]]}, "tree/root_success")
    runs = {("rao", 0): tiny_run("rao", 0).replace(out_dir=str(done)),
            ("rao", 1): tiny_run("rao", 1).replace(out_dir=str(running)),
            ("rao", 2): tiny_run("rao", 2).replace(out_dir=str(tmp_path / "none"))}
    assert list(finished(runs)) == [("rao", 0)]
    assert "rao seed 1" in capsys.readouterr().out


def test_the_report_says_what_each_run_started_from(tmp_path):
    """Seeds whose warm starts were built on different CPU types start from different policies: the report names each
    run's start from its initial_policy.json, grouping seeds that share one, and says where a run has no record."""
    from experiments.crbc.report import read_record
    from experiments.sera.run import start_label, starts_section

    def run(seed, record):
        out = tmp_path / f"seed{seed}"
        _write_run(out, {0: [[0, 1]]}, "tree/root_success")
        if record is not None:
            (out / "initial_policy.json").write_text(json.dumps(record))
        return read_record(str(out))

    warm = {"source": "warm_start", "key": "k", "weights_sha256": "5367b6ea1fafe5949f1e", "built_with":
            {"cpu_model": "Intel(R) Xeon(R) Processor"}}
    records = {("sera_exec", 0): run(0, None), ("sera_exec", 1): run(1, warm), ("sera_exec", 2): run(2, warm),
               ("rao", 0): run(3, {"source": "random", "seed": 0})}
    assert start_label(warm) == "warm start `5367b6ea1faf`, built on Intel(R) Xeon(R) Processor"
    lines = starts_section(records).splitlines()
    assert lines[2] == ("- sera_exec: seed 0: no record of its initial policy; seeds 1, 2: warm start `5367b6ea1faf`, "
                        "built on Intel(R) Xeon(R) Processor")
    assert lines[3] == "- rao: seed 0: random init, seed 0"


def test_dry_run_lists_the_asked_seeds_and_methods(tmp_path, capsys):
    """--seeds 0 1 2 is three seeds in every mode (it once read as "the default", one seed, under --sync)."""
    from experiments.sera.run import main

    def listed(*argv):
        assert main([*argv, "--dry-run", "--results", str(tmp_path)]) == 0
        return [line.split(":")[0] for line in capsys.readouterr().out.splitlines() if "optimizer steps" in line]

    assert listed("--sync", "--seeds", "0", "1", "2", "--methods", "rao", "sera") == [
        f"{m} seed {s}" for s in (0, 1, 2) for m in ("rao", "sera")]
    assert listed("--sync") == ["rao seed 0"]
    assert listed("--seeds", "1", "--methods", "sera_exec") == ["sera_exec seed 1"]
    assert len(listed()) == 3 * 7 and listed("--smoke", "--methods", "rao") == ["rao seed 0"]


def test_the_report_names_the_command_that_made_it():
    from experiments.sera.run import report_command

    def runs(methods, seeds):
        return {(m, s): None for s in seeds for m in methods}

    assert report_command(runs(["rao"], [0]), "sync") == "python experiments/sera/run.py --sync"
    assert report_command(runs(["rao", "sera"], [0, 1, 2]), "sync") == (
        "python experiments/sera/run.py --sync --methods rao sera --seeds 0 1 2")
    assert report_command(runs(["rao", "grpo", "rao_d", "sera", "sera_wo_d", "sera_wo_rt", "sera_exec"], [0, 1, 2]),
                          "tiny") == "python experiments/sera/run.py"
    assert report_command(runs(["rao", "rao_d"], [0, 1, 2]), "arms") == (
        "python experiments/sera/run.py --name arms --methods rao rao_d")
    assert report_command(runs(["sera"], [1]), "arms") == (
        "python experiments/sera/run.py --name arms --methods sera --seeds 1")


def test_grade_table_counts_each_childs_grade_against_its_label(tmp_path, monkeypatch):
    """Children of main trees only (a fork tree's left out), unlabelled ones skipped; a child graded a success earns
    its score whatever its label, one that did not finish scores 0 without a grade; pooled over seeds; then the
    graded children's passes by how they stopped and label."""
    import types

    from agentjax.agents.tree import Status
    from agentjax.train import trees as tree_algorithm
    from experiments.sera.run import grade_table

    def child(label, success=None, score=None, status=Status.FINISHED, turns=5):
        grade = None if success is None else types.SimpleNamespace(success=success)
        return types.SimpleNamespace(label=label, grade=grade, score=score, status=status, turns=[None] * turns)

    root = types.SimpleNamespace(label=None, grade=None, score=None)
    trees = {0: [types.SimpleNamespace(fork=None, nodes=[root, child(1.0, True, 1.0), child(0.0, True, 0.8, turns=2),
                                                         child(0.0, None, 0.0), child(None, True, 1.0)]),
                 types.SimpleNamespace(fork=(0, 1, 1), nodes=[root, child(0.0, False, 0.0)])],
             1: [types.SimpleNamespace(fork=None, nodes=[root, child(0.0, True, 1.0), child(1.0)])]}
    runs = {}
    for seed in (0, 1):
        run = sync_run(seed, method="sera", results=str(tmp_path))
        os.makedirs(os.path.join(run.out_dir, "trees"))
        runs["sera", seed] = run
    runs["rao", 0] = sync_run(0, results=str(tmp_path))  # no rubrics: not in the table
    monkeypatch.setattr(tree_algorithm, "saved_tree_files", lambda out: {"train": [3], "eval": []})
    monkeypatch.setattr(tree_algorithm, "load_trees", lambda out, step: ({}, trees[int(out[-1])]))
    table = grade_table(runs).splitlines()
    assert table[2] == "| sera | success | 1 | 0 | 0 | 1 | 1.00 |"
    assert table[3] == "| sera | failure | 2 | 0 | 1 | 0 | 0.60 |" and table[4] == ""
    assert table[-2:] == ["| sera | finished, > 3 turns | 1 / 1 | 1 / 1 |",
                          "| sera | finished, ≤ 3 turns | — | 1 / 1 |"]
    assert grade_table({("rao", 0): runs["rao", 0]}) is None


@pytest.mark.parametrize("name, flags", [("sync", ["--sync"]), ("tiny", []), ("arms", ["--name", "arms"])])
def test_the_committed_tables_come_from_their_json_alone(tmp_path, name, flags):
    """``run.py --report-only`` where no run folder exists (a clone: run folders are not in git) rebuilds every
    committed table of a report from its ``<name>_results.json`` alone: the same markdown, byte for byte, and the
    same JSON."""
    import shutil

    from experiments.sera.presets import RESULTS
    from experiments.sera.run import main

    shutil.copy(os.path.join(RESULTS, f"{name}_results.json"), tmp_path)
    assert main([*flags, "--report-only", "--results", str(tmp_path)]) == 0
    made = sorted(p for p in os.listdir(tmp_path) if p.endswith(".md"))
    assert made == sorted(p for p in os.listdir(RESULTS) if p.startswith(f"{name}_") and p.endswith(".md"))
    assert {"results", "shape", "cost", "grades"} <= {p[len(name) + 1:-3] for p in made}
    for table in [*made, f"{name}_results.json"]:
        assert (tmp_path / table).read_text() == open(os.path.join(RESULTS, table)).read(), table
