"""The tree trainer (RAO) end to end on TextCraft-Synth with a tiny random-init Qwen3 and the real tokenizer.

Checked: 2 updates from random init write metrics lines with the tree, judge, credit, schedule and time statistics,
saved trees that ``agentjax trees`` renders, evaluation files and checkpoints that hold the stage schedule; a run
stopped after update 1 and resumed equals the uninterrupted one (parameters bitwise, metrics lines but timings); the
warm start on planner trees (rows with the constrained choices, NLL falling, the cache reused); bad configs are
one clear error each, before any work.
"""

from __future__ import annotations

import dataclasses
import json
import os
import types

import jax
import pytest

from agentjax.cli import main
from agentjax.train import offline, trainer
from agentjax.train.config import LossConfig, ModelConfig, RAOCredit, TrainConfig
from agentjax.train.metrics import read_metrics
from agentjax.train.presets import preset, tiny_tree, tiny_tree_arch
from agentjax.train.runconfig import RunConfig, TreeConfig, WarmStart, run_from_dict
from agentjax.train.trees import NoSignalError, batch_capacity, load_trees
from tests.train.conftest import leaves_equal

orbax_leftovers = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
SHRUNK = tiny_tree_arch(d_model=32, mlp_dim=64, num_layers=1, head_dim=8)
TREE = TreeConfig(max_depth=1, max_children=4, max_nodes=5, max_turns=10, history_length=2)


def small_run(out_dir, **changes) -> RunConfig:
    """The tiny RAO preset shrunk: a 1-layer d=32 policy, 1 root task × 2 trees of ≤ 5 nodes, 4 turns a node, depth
    ≤ 1, eval on 1 task × 1 tree, no warm start; batches of 16 rows without compaction (one update shape). The
    random policy rarely crafts anything, so every root task would fail the zero-variance filter: it is off (the
    released TextWorld-Sync reading), and every batch takes a step."""
    run = tiny_tree(filter_zero_variance=False)
    run = run.replace(train=run.train.replace(model=ModelConfig(SHRUNK), compact_rows=False), tree=TREE)
    run = run.with_sizes(num_groups=1, group_size=2, max_steps=4, prompt_len=1024, capacity=48, micro_batch_size=16)
    return run.replace(**(dict(eval_tasks=1, eval_seeds=1, eval_every=1, updates=2, checkpoint_every=1,
                               warm_start=None, progress=False, out_dir=str(out_dir)) | changes))


def without_timings(lines):
    """The lines without timings, NaN (a standard error of one episode) as a string so lines compare equal."""
    return [{k: "nan" if v != v else v for k, v in line.items() if k != "time" and not k.startswith("time/")}
            for line in lines]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    out = tmp_path_factory.mktemp("uninterrupted")
    return out, trainer.train(small_run(out))


@pytest.mark.slow  # for CI time: `make test-slow` (README, "Tests")
def test_two_updates_write_metrics_trees_evaluations_and_checkpoints(uninterrupted, capsys):
    out, summary = uninterrupted
    initial, *lines = read_metrics(out)
    assert summary["optimizer_steps"] == 2 and summary["step"] == len(lines) >= 2
    assert initial["step"] == 0 and "eval/success_rate" in initial and "train/loss" not in initial
    required = ["tree/root_success", "tree/child_success", "tree/nodes", "tree/nodes_depth0", "tree/max_depth",
                "tree/invalid", "tree/rows", "judge/calls", "judge/requests", "judge/input_tokens",
                "credit/samples", "credit/kept_tasks", "schedule/step", "schedule/stage", "schedule/skipped",
                "time/collect", "time/generate", "time/env", "time/judge", "time/credit", "time/update",
                "time/checkpoint", "time/trees", "eval/success_rate", "eval/success_se", "eval/nodes"]
    trained = [line for line in lines if not line["schedule/no_signal"]]
    assert len(trained) == len(lines) == 2  # no filter: every batch trains
    for line in trained:
        assert not [k for k in required if k not in line], sorted(line)
        assert line["schedule/stage"] == 0 and line["train/skipped"] == 0 and line["tree/rows"] <= line[
            "tree/capacity"]
        assert line["credit/trained_tokens"] == line["train/tokens"] > 0
    assert [line["schedule/step"] for line in trained] == [1, 2]
    assert sorted(map(int, os.listdir(out / "checkpoints"))) == [line["step"] for line in trained]
    assert sorted(os.listdir(out / "eval")) == sorted(f"{s}.json" for s in [0] + [line["step"] for line in trained])
    info, trees = load_trees(str(out))
    assert info["stage"] == "execution" and len(trees) == 2 and {t.index for t in trees} == {0, 1}
    assert all(t.root_success is not None and t.nodes[0].turns for t in trees)
    assert run_from_dict(json.load(open(out / "run_config.json"))) == small_run(out)
    assert main(["trees", "--run", str(out), "--tree", "1"]) == 0
    printed = capsys.readouterr().out
    assert "tree 1 of task textcraft_synth.train" in printed and "reward" in printed and "turn 0" in printed
    assert main(["trees", "--run", str(out), "--eval", "--update", "0"]) == 0 and "root" in capsys.readouterr().out
    assert main(["trees", "--run", str(out), "--update", "99"]) == 2
    assert "no train trees saved at step 99" in capsys.readouterr().err


@pytest.mark.slow  # end to end: `make test-slow` (README, "Tests")
@orbax_leftovers
def test_resume_equals_uninterrupted(uninterrupted, tmp_path):
    out, full = uninterrupted
    stop = next(line["step"] for line in read_metrics(out) if line.get("schedule/step") == 1)  # batches up to step 1
    first = trainer.train(small_run(tmp_path), stop_after=stop)
    assert first["step"] == stop and first["optimizer_steps"] == 1
    resumed = trainer.train(small_run(tmp_path), resume=True)
    assert resumed["resumed_from"] == stop and resumed["optimizer_steps"] == 2
    assert leaves_equal(resumed["params"], full["params"])
    assert without_timings(read_metrics(tmp_path)) == without_timings(read_metrics(out))
    with pytest.raises(FileExistsError, match="already holds checkpoints"):
        trainer.train(small_run(tmp_path))
    changed = small_run(tmp_path, tree=dataclasses.replace(TREE, max_turns=9))
    with pytest.raises(ValueError, match="tree.max_turns"):
        trainer.train(changed, resume=True)


@pytest.mark.slow  # for CI time: `make test-slow` (README, "Tests")
def test_a_run_without_signal_stops(uninterrupted, tmp_path):
    """With the zero-variance filter the random policy's batches train nothing (every tree fails): the schedule
    does not advance, and the run stops once more than ``max_skipped_batches`` were skipped."""
    run = small_run(tmp_path, eval_every=0, tree=dataclasses.replace(TREE, max_skipped_batches=1))
    run = run.replace(train=run.train.replace(credit=RAOCredit()))
    with pytest.raises(NoSignalError, match="2 batches trained nothing"):
        trainer.train(run)
    lines = read_metrics(tmp_path)
    assert [(x["schedule/no_signal"], x["schedule/step"], x["schedule/skipped"]) for x in lines] == [(1, 0, 1),
                                                                                                    (1, 0, 2)]
    assert "train/loss" not in lines[0] and not os.path.exists(tmp_path / "checkpoints" / "1")


@pytest.mark.slow  # for CI time: `make test-slow` (README, "Tests")
def test_rao_plus_d_trains_delegation_tokens_on_its_decomposition_steps(uninterrupted, tmp_path):
    """Stages 1 : 1 : 0: the first optimizer step trains execution tokens, the second the delegation tokens of launch
    events (leaf coverage); a decomposition batch without a launch event trains nothing and is drawn again."""
    run = small_run(tmp_path, eval_every=0, checkpoint_every=0)
    run = run.replace(train=run.train.replace(credit=RAOCredit(stages=(1, 1, 0), filter_zero_variance=False)))
    summary = trainer.train(run)
    lines = read_metrics(tmp_path)
    assert summary["optimizer_steps"] == 2 and lines[0]["schedule/stage"] == 0 and not lines[0]["schedule/no_signal"]
    assert all(line["schedule/stage"] == 1 for line in lines[1:]) and lines[-1]["schedule/step"] == 2
    last = lines[-1]
    assert last["train/tokens"] == last["credit/trained_tokens"] > 0 and last["credit/samples"] >= 1  # events
    info, trees = load_trees(str(tmp_path))
    assert info["stage"] == "decomposition" and any(len(t.nodes) > 1 for t in trees)


@pytest.mark.slow  # end to end: `make test-slow` (README, "Tests")
def test_warm_start_on_planner_trees(tmp_path):
    from agentjax.models import load_tokenizer
    from agentjax.train.tree_warmstart import tree_demonstrations
    from agentjax.train.warmstart import cache_key, warm_start_folder

    run = small_run(tmp_path, warm_start=WarmStart(episodes=3, steps=6, batch_size=4, learning_rate=3e-3))
    tokenizer = load_tokenizer()
    rows = tree_demonstrations(run, tokenizer)
    assert len(rows) >= 3 and all(len(r) == len(c) for _, r, c in rows)
    for _, response, choices in rows:  # the planner's reply is what the constrained decoder could emit
        assert all(t in c for t, c in zip(response, choices, strict=True))
    folder = warm_start_folder(run, tokenizer)
    record = json.load(open(os.path.join(folder, "warmstart.json")))
    assert record["turns"] == len(rows) and record["loss_last"] < record["loss_first"] and "agreement" not in record
    assert warm_start_folder(run, tokenizer) == folder  # cached
    flat = preset("tiny", "grpo", "textcraft_synth").replace(warm_start=run.warm_start)
    assert cache_key(flat.replace(out_dir=run.out_dir)) != cache_key(run)
    without = run.replace(env_kwargs={"show_recipes": False})  # no planner replies among the admissible ones
    with pytest.raises(ValueError, match="planner_replies=True"):
        tree_demonstrations(without, tokenizer)


def test_batch_capacity():
    assert [batch_capacity(n, 16, 1024) for n in (1, 16, 17, 100, 600)] == [16, 16, 32, 128, 1024]
    with pytest.raises(ValueError, match="more than train.rollout.capacity=1024"):
        batch_capacity(1025, 16, 1024)


def rao_train(**kw) -> TrainConfig:
    return TrainConfig(credit=RAOCredit(), loss=LossConfig(kl_coef=0.0, entropy_coef=0.0), **kw)


@pytest.mark.parametrize("make, match", [
    (lambda: RAOCredit(stages=(16, 2, 2)), "rubric stage needs SERA"),
    (lambda: RAOCredit(stages=(0, 0, 0)), "not all 0"),
    (lambda: RAOCredit(clip_low=2.0, clip_high=1.0), "clip_low 2.0 > clip_high"),
    (lambda: TrainConfig(credit=RAOCredit()), "without KL or entropy"),
    (lambda: rao_train(mini_batches=2, micro_batch_size=4), "one optimizer step per batch"),
    (lambda: TreeConfig(max_nodes=0), "max_nodes must be >= 1"),
    (lambda: TreeConfig(max_nodes=8, node_slots=4), "cannot hold"),
    (lambda: tiny_tree().replace(tree=None), "needs RunConfig.tree"),
    (lambda: preset("tiny", "grpo", "textcraft_synth").replace(tree=TreeConfig()), "flat method"),
    (lambda: tiny_tree().replace(env="sokoban"), "trains recursive agents on textcraft_synth, textworld_sync"),
    (lambda: tiny_tree().replace(workers=2), "workers=0"),
    (lambda: preset("paper-1.5b", "rao", "textcraft_synth"), "paper preset is paper-4b"),
    (lambda: preset("paper-4b", "grpo", "textcraft_synth"), "tree methods' preset"),
    (lambda: preset("tiny", "rao", "webshop"), "trains recursive agents on"),
    (lambda: tiny_tree().replace(eval_search=2), "needs --method sera"),
    (lambda: tiny_tree("sera").replace(eval_search=-1), "eval_search must be >= 0"),
    (lambda: tiny_tree("sera", branches=1), "branches >= 2"),
])
def test_bad_configs_are_clear_errors(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_bad_world_kwargs_are_caught_by_check():
    with pytest.raises(ValueError, match="do not fit textcraft_synth's tree world"):
        tiny_tree().replace(env_kwargs={"budget": 3}).check()
    with pytest.raises(ValueError, match="eval_env_kwargs"):
        tiny_tree().replace(eval_env_kwargs={"nope": 1}).check()


@pytest.mark.slow  # for CI time: `make test-slow` (README, "Tests")
def test_sera_trains_on_rubric_scores_and_logs_its_rubric_calls(tmp_path):
    """SERA (stages 1 : 1 : 0): children's rewards are their parents' rubric scores (constrained rubric choices and
    grades of the tiny policy), the rubric and grading calls are counted in every metrics line, and the saved trees
    carry the rubrics."""
    from agentjax.train.config import SERACredit

    tree = dataclasses.replace(TREE, rubric_tokens=320, grade_tokens=96, rubric_choices=True)
    run = small_run(tmp_path, eval_every=0, checkpoint_every=2, tree=tree)
    run = run.replace(train=run.train.replace(credit=SERACredit(stages=(1, 1, 0), filter_zero_variance=False)))
    assert run.rubric_collect.constrained and run.rubric_collect.reading == "final"
    summary = trainer.train(run)
    lines = read_metrics(tmp_path)
    assert summary["optimizer_steps"] == 2
    for line in lines:
        assert {"rubric/requests", "rubric/failures", "grade/requests", "grade/agreement", "time/rubric"} <= set(line)
        assert line["rubric/failures"] == 0 and line["grade/failures"] == 0  # constrained: always well formed
    assert sum(line["rubric/requests"] for line in lines) >= 1 and sum(line["rubric/calls"] for line in lines) >= 1
    info, trees = load_trees(str(tmp_path))
    assert all(t.child_reward == "score" for t in trees)
    children = [n for t in trees for n in t.nodes[1:]]
    assert children and all(n.rubric is not None for n in children)
    assert all(n.score is not None or (n.grade is None and not n.finished) for n in children)
    # the saved run evaluates with rubric-guided search, graded by the checkpoint or by the initial policy, each to
    # its own file beside the plain evaluation
    for grader, name in (("policy", "eval_2_search2.json"), ("initial", "eval_2_search2_initial.json")):
        result = offline.evaluate_checkpoint(str(tmp_path), search=2, grader=grader)
        assert json.load(open(tmp_path / name))["outcomes"] == result["outcomes"] and result["step"] == 2
        assert 0 <= result["success_rate"] <= 1 and "search/groups" in result and len(result["outcomes"]) == 1


def test_evaluation_searches_only_when_asked(monkeypatch):
    """``eval_search`` turns rubric-guided search on for evaluation only (with the run's rubrics); training and a
    run without it grow trees without search."""
    from agentjax.rollout.tree_search import SearchConfig
    from agentjax.train import trees as tree_algorithm

    calls = []

    class Called(Exception):
        pass

    def record(*args, **kwargs):
        calls.append(kwargs)
        raise Called

    monkeypatch.setattr(tree_algorithm, "run_trees", record)
    run = tiny_tree("sera").replace(eval_search=3)
    policy, key = types.SimpleNamespace(tokenizer=None), jax.random.key(0)
    for r, evaluation in ((run, True), (run, False), (run.replace(eval_search=0), True)):
        with pytest.raises(Called):
            tree_algorithm.grow(r, [], policy, key, evaluation=evaluation, grader="g")
    (ev, tr, off) = calls
    assert ev["search"] == SearchConfig(candidates=3) and ev["rubrics"] == run.rubric_collect and ev["grader"] == "g"
    assert tr["search"] is None and tr["rubrics"] == run.rubric_collect
    assert off["search"] is None and off["rubrics"] is None


def test_sera_warm_start_rows_teach_the_rubric_and_grade_formats(tmp_path):
    from agentjax.agents.rubric import grade_choices, parse_rubric, rubric_choices
    from agentjax.models import load_tokenizer
    from agentjax.train.config import SERACredit
    from agentjax.train.tree_warmstart import tree_demonstrations

    run = preset("tiny", "sera", "textcraft_synth").replace(out_dir=str(tmp_path), warm_start=WarmStart(
        episodes=2, steps=1, batch_size=2))
    assert isinstance(run.train.credit, SERACredit) and run.train.credit.stages == (3, 1, 1)
    tokenizer = load_tokenizer()
    rows = tree_demonstrations(run, tokenizer)
    texts = [tokenizer.decode(r[:-1]) for _, r, _ in rows]
    rubrics = [t for t in texts if t.startswith('{"criteria"')]
    grades = [t for t in texts if t.startswith('{"success"')]
    assert rubrics and len(grades) == len(rubrics)  # planner children all finish: each is graded
    for text in rubrics:
        rubric = parse_rubric(text)  # the teacher writes the first of the rubric choices
        goal = rubric.criteria[0].description.removeprefix("the subtask is done: ")
        assert text == rubric_choices(goal, run.train.rollout.max_steps)[0]
        assert any(g in grade_choices(rubric) for g in grades)
    for _, response, choices in rows:  # every row is what the constrained decoder could emit
        assert all(t in c for t, c in zip(response, choices, strict=True))


def test_textworld_sync_grades_the_children_its_world_ended():
    """Planner trees on TextWorld-Sync end when the last dish is eaten, before the children finish: their grades
    (the warm start's demonstrations) exist, successes like their labels; TextCraft-Synth grades finished children
    only."""
    from agentjax.agents.tree import Status
    from agentjax.models import load_tokenizer
    from agentjax.train.tree_warmstart import teacher_trees

    run = preset("tiny", "sera", "textworld_sync")
    assert not run.rubric_collect.require_finish and preset("tiny", "sera", "textcraft_synth").rubric_collect \
        .require_finish
    rollouts, _ = teacher_trees(run, run.spec.tasks(run.evaluation_split)[:2], load_tokenizer())
    children = [n for t in rollouts.trees for n in t.nodes[1:]]
    assert any(n.status is Status.ENDED for n in children)
    assert all(n.grade is not None and n.grade.success == bool(n.label) and n.score == n.grade.final_score
               for n in children)


def test_only_textworld_syncs_sera_warm_start_key_has_the_unfinished_grades(monkeypatch):
    from agentjax.train.warmstart import cache_key

    ws = preset("tiny", "sera", "textcraft_synth").warm_start
    runs = {env: preset("tiny", "sera", env).replace(warm_start=ws) for env in ("textcraft_synth", "textworld_sync")}
    keys = {env: cache_key(run) for env, run in runs.items()}
    graded = RunConfig.rubric_collect.fget  # every child's grade asked only if it finished
    monkeypatch.setattr(RunConfig, "rubric_collect", property(
        lambda self: dataclasses.replace(graded(self), require_finish=True)))
    assert cache_key(runs["textcraft_synth"]) == keys["textcraft_synth"]
    assert cache_key(runs["textworld_sync"]) != keys["textworld_sync"]


# The warm-start keys of the committed SERA tables' runs (experiments/sera/results/*_results.json, ``starts``): a
# change to the key's inputs would silently rebuild the warm starts those runs started from.
COMMITTED_KEYS = {("tiny", "rao"): "674e7589b6f8a65c", ("tiny", "grpo"): "799c47b5214a44df",
                  ("tiny", "sera"): "37159b3c8e5f894f", ("sync", "rao"): "ac006b24bb3b373e",
                  ("sync", "sera"): "29146e436fe12cb8"}


def test_the_committed_runs_warm_start_keys_stay():
    from agentjax.train.warmstart import cache_key
    from experiments.sera.presets import ARMS, sync_run, tiny_run

    for arm, (base, _) in ARMS.items():  # an ablation arm shares its base method's warm start
        assert cache_key(tiny_run(arm, 1)) == COMMITTED_KEYS["tiny", base], arm
        assert cache_key(sync_run(1, method=arm)) == COMMITTED_KEYS["sync", base], arm
    assert cache_key(tiny_run("grpo", 1)) == COMMITTED_KEYS["tiny", "grpo"]
