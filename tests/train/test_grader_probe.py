"""The grader probe (agentjax/train/grader_probe.py) and which children SERA's grader is asked about.

The probe's numbers are checked on hand-made triples and on the held-out teacher trees of both tree envs with stub
graders whose answers ignore the child (pass everything, fail everything): balanced accuracy and AUC 0.5 whatever
the agreement, mixed labels from the planner and early-finish trees. TextWorld-Sync's grader is asked about every
child, as its judge (a child whose action ends the shared task never finishes), TextCraft-Synth's only about the
children that finished, and the SERA warm start's key changes only where the grade rows do.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import numpy as np
import pytest

from agentjax.models import load_tokenizer
from agentjax.rollout.tree_rubrics import scripted_output
from agentjax.train.grader_probe import auc, describe, graded_children, summarize
from agentjax.train.presets import preset


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer()


def test_summary_of_hand_made_children():
    children = [(True, True, 0.8), (True, False, 0.0), (False, False, 0.0), (False, False, 0.0), (False, True, 0.5)]
    s = summarize(children)
    assert (s["children"], s["successes"], s["failures"]) == (5, 2, 3)
    assert s["pass_rate"] == 0.5 and s["fail_rate"] == pytest.approx(2 / 3)
    assert s["balanced_accuracy"] == pytest.approx((0.5 + 2 / 3) / 2) and s["agreement"] == pytest.approx(3 / 5)
    assert s["pass_rate_se"] == pytest.approx(math.sqrt(0.25 / 2)) and s["majority"] == pytest.approx(3 / 5)
    assert s["auc"] == pytest.approx(4 / 6)  # 0.8 beats all three failures; 0.0 ties two (0.5 each), loses to 0.5
    assert "balanced accuracy" in describe(s)


def test_auc_against_a_brute_force_count():
    rng = np.random.default_rng(0)
    score, label = rng.integers(0, 4, 40) / 3, rng.random(40) < 0.4
    pairs = [(1.0 if a > b else 0.5 if a == b else 0.0) for a, la in zip(score, label, strict=True) if la
             for b, lb in zip(score, label, strict=True) if not lb]
    assert auc(score, label) == pytest.approx(np.mean(pairs))
    assert auc(np.full(6, 0.7), np.array([True, False] * 3)) == 0.5  # a constant grader
    assert math.isnan(auc(np.ones(3), np.ones(3, bool)))


class ConstantGrader:
    """Writes the first rubric it may and gives every child the same grade: the last of its choices (a success)
    or the first (the failure); never reads the child."""

    def __init__(self, tokenizer, passes: bool):
        self.tokenizer, self.passes, self.calls = tokenizer, passes, 0

    def choose(self, prompts, choices, params, key):
        self.calls += 1
        grading = all(c[0].startswith('{"success"') for c in choices)
        texts = [c[-1 if self.passes else 0] if grading else c[0] for c in choices]
        return scripted_output(self.tokenizer, texts, params.max_new_tokens, params.stop_token_ids[0])

    def generate(self, *args, **kwargs):
        raise AssertionError("a constrained, one-pass run chooses")


@pytest.mark.parametrize("env", ["textcraft_synth", "textworld_sync"])
@pytest.mark.parametrize("passes", [True, False])
def test_a_grader_that_ignores_the_child_is_at_chance(tokenizer, env, passes):
    run = preset("tiny", "sera", env)
    tasks = run.spec.tasks(run.evaluation_split)[:3]
    grader = ConstantGrader(tokenizer, passes)
    children, counts = graded_children(run, grader, tokenizer, tasks, jax.random.key(0))
    s = summarize(children)
    assert grader.calls > 0 and s["successes"] >= 1 and s["failures"] >= 1  # planner and early-finish trees
    assert s["pass_rate"] == float(passes) and s["fail_rate"] == float(not passes)
    assert s["balanced_accuracy"] == 0.5 and s["auc"] == 0.5
    assert s["agreement"] == pytest.approx((s["successes"] if passes else s["failures"]) / s["children"])
    assert counts["rubric/failures"] == counts["grade/failures"] == 0
    assert counts["grade/requests"] == s["children"]  # every graded child was labelled
    if env == "textworld_sync":  # graded whether or not they finished, as its judge judges them
        assert counts["grade/unfinished"] == 0
        assert s["stall/children"] > 0 and s["early_finish/children"] > 0  # a stalled tree too
    else:
        assert run.rubric_collect.require_finish and "stall/children" not in s  # nothing of it would be graded
    for tree in ("early_finish", "stall"):
        if s.get(f"{tree}/failures"):
            assert s[f"{tree}/fail_rate"] == float(not passes)


def test_stalled_children_idle_until_their_turns_or_the_world_run_out(tokenizer):
    """teacher_trees(children="stall"): each delegated child plays id % 3 of the planner's turns, then only the
    world's idle reply (TextWorld-Sync: look around); none finishes, and the judge labels them."""
    from agentjax.agents.tree import Status
    from agentjax.train.tree_warmstart import teacher_trees

    run = preset("tiny", "sera", "textworld_sync")
    rollouts, _ = teacher_trees(run, run.spec.tasks(run.evaluation_split)[:3], tokenizer, children="stall")
    children = [n for t in rollouts.trees for n in t.nodes[1:]]
    assert children and all(n.status in (Status.EXHAUSTED, Status.ENDED) for n in children)
    assert any(n.status is Status.EXHAUSTED for n in children) and not all(n.label for n in children)
    for n in children:
        assert all(t.reply.text == "<action>look around</action>" for t in n.turns[n.id % 3:])
        assert n.grade is not None and n.grade.success == bool(n.label)
    with pytest.raises(ValueError, match="children is one of"):
        teacher_trees(run, [], tokenizer, children="lazy")


@pytest.mark.parametrize("env", ["textcraft_synth", "textworld_sync"])
@pytest.mark.parametrize("kind", ["late_finish", "busy_finish"])
def test_late_and_busy_children_finish_as_late_as_the_planners(tokenizer, env, kind):
    """teacher_trees(children="late_finish" / "busy_finish"): each delegated child plays id % 3 of the planner's
    turns, then idles (the world's idle reply) or acts on its goal in a way the world rejects (its busy reply: an
    invalid turn), and finishes at turn LATE_TURNS (or its budget's last); they are graded on both envs, mostly
    failures, and a grader that passes them all is at 0.5 on the late-finish check whatever it does elsewhere."""
    from agentjax.agents.tree import Status
    from agentjax.train.grader_probe import late_finish
    from agentjax.train.tree_warmstart import LATE_TURNS, labelled_trees, teacher_trees

    run = preset("tiny", "sera", env)
    tasks = run.spec.tasks(run.evaluation_split)[:3]
    rollouts, _ = teacher_trees(run, tasks, tokenizer, children=kind)
    children = [n for t in rollouts.trees for n in t.nodes[1:]]
    finished = [n for n in children if n.status is Status.FINISHED]
    assert finished and sum(not n.label for n in finished) >= len(finished) / 2
    idle = teacher_trees(run, tasks[:1], tokenizer, children="stall")[0].trees[0].nodes[1].turns[-1].reply.text
    late = [n for n in finished if n.turns[-1].step > n.id % 3]  # (the planner may finish first: a success)
    assert late
    for n in late:
        assert len(n.turns) == min(LATE_TURNS, n.budget - 1) + 1 > 3 and n.turns[-1].reply.kind == "finish"
        between = n.turns[n.id % 3:-1]
        if kind == "late_finish":
            assert all(t.reply.text == idle for t in between)
        else:  # one command on its goal, rejected every time
            assert len({t.reply.text for t in between}) == 1 and between[0].reply.text != idle
            assert not any(t.valid for t in between) and between[0].reply.kind == "act"
        assert n.grade is not None and n.grade.success == bool(n.label)
    for passes in (True, False):
        check = late_finish(run, ConstantGrader(tokenizer, passes), tokenizer, tasks, jax.random.key(0), (1.0, 0.0),
                            trees=(kind,))
        assert check[f"{kind}/failures"] >= 1 and check[f"{kind}/fail_rate"] == float(not passes)
        assert check[f"{kind}/balanced_accuracy"] == (0.5 if passes else 1.0)  # against a pass rate of 1
    with pytest.raises(ValueError, match="trees are among"):
        next(labelled_trees(run, tasks, tokenizer, trees=("lazy",)))


def test_textworld_sync_grades_the_children_its_world_ended(tokenizer):
    """Planner trees on TextWorld-Sync end when the last dish is eaten, before the children finish: their grades
    (the warm start's demonstrations) now exist, successes like their labels."""
    from agentjax.agents.tree import Status
    from agentjax.train.tree_warmstart import teacher_trees

    run = preset("tiny", "sera", "textworld_sync")
    assert not run.rubric_collect.require_finish and preset("tiny", "sera", "textcraft_synth").rubric_collect \
        .require_finish
    rollouts, _ = teacher_trees(run, run.spec.tasks(run.evaluation_split)[:2], tokenizer)
    children = [n for t in rollouts.trees for n in t.nodes[1:]]
    assert any(n.status is Status.ENDED for n in children)
    assert all(n.grade is not None and n.grade.success == bool(n.label) and n.score == n.grade.final_score
               for n in children)


def test_only_textworld_syncs_sera_warm_start_key_moves(monkeypatch):
    from agentjax.train.runconfig import RunConfig
    from agentjax.train.warmstart import cache_key

    ws = preset("tiny", "sera", "textcraft_synth").warm_start
    runs = {env: preset("tiny", "sera", env).replace(warm_start=ws) for env in ("textcraft_synth", "textworld_sync")}
    keys = {env: cache_key(run) for env, run in runs.items()}
    as_before = RunConfig.rubric_collect.fget  # every child's grade asked only if it finished, as before the change
    monkeypatch.setattr(RunConfig, "rubric_collect", property(
        lambda self: dataclasses.replace(as_before(self), require_finish=True)))
    assert cache_key(runs["textcraft_synth"]) == keys["textcraft_synth"]
    assert cache_key(runs["textworld_sync"]) != keys["textworld_sync"]


@pytest.mark.parametrize("env", ["textcraft_synth", "textworld_sync"])
def test_grade_rows_carry_the_verifiers_verdict(tokenizer, env):
    """The grader-only rows (experiments/sera/grader_sft.py): one per graded child of the planner and early-finish
    trees, its reference grade's success flag the child's label, both labels present, constrained choices kept."""
    import json

    from agentjax.train.tree_warmstart import grade_rows

    run = preset("tiny", "sera", env)
    rows, labels = grade_rows(run, run.spec.tasks(run.spec.train_split)[:2], tokenizer)
    assert len(rows) == len(labels) and any(labels) and not all(labels)
    for (prompt, response, choices), label in zip(rows, labels, strict=True):
        assert json.loads(tokenizer.decode(response[:-1]))["success"] == label
        assert choices is not None and all(t in c for t, c in zip(response, choices, strict=True))
        assert "Grade it" in tokenizer.decode(prompt)


def test_a_grader_phase_has_a_key_of_its_own():
    """WarmStart.grader_steps: its own cache key; 0 leaves the key as before the field (the committed runs' keys:
    tests/train/test_tree_loop.py)."""
    from agentjax.train.runconfig import WarmStart
    from agentjax.train.warmstart import cache_key

    ws = WarmStart(episodes=2, steps=1, batch_size=2)
    run = preset("tiny", "sera", "textworld_sync").replace(warm_start=ws)
    assert cache_key(run.replace(warm_start=dataclasses.replace(ws, grader_steps=2))) != cache_key(run)
    assert cache_key(run.replace(warm_start=dataclasses.replace(ws, grader_steps=0))) == cache_key(run)
    with pytest.raises(ValueError, match="grader_steps"):
        WarmStart(grader_steps=-1)
    replay = dataclasses.replace(ws, grader_steps=2, grader_replay=0.5)  # rehearsal: a key of its own too
    assert cache_key(run.replace(warm_start=replay)) != cache_key(run.replace(warm_start=dataclasses.replace(
        ws, grader_steps=2))) and cache_key(run.replace(warm_start=dataclasses.replace(ws, grader_replay=0.0))) == \
        cache_key(run)
    for bad in (1.0, -0.1):
        with pytest.raises(ValueError, match="grader_replay"):
            WarmStart(grader_replay=bad)
    stall = dataclasses.replace(ws, grader_steps=2, stall_grades=True)
    assert cache_key(run.replace(warm_start=stall)) != cache_key(run.replace(warm_start=dataclasses.replace(
        ws, grader_steps=2)))
    with pytest.raises(ValueError, match="stall_grades"):
        WarmStart(stall_grades=True)  # nothing to add them to
    late = dataclasses.replace(stall, late_grades=True)
    assert cache_key(run.replace(warm_start=late)) != cache_key(run.replace(warm_start=stall))
    with pytest.raises(ValueError, match="late_grades"):
        WarmStart(late_grades=True)


def test_late_grades_add_failures_that_finish_late(tokenizer):
    """WarmStart.late_grades: grade_rows gains each task's late- and busy-finish trees' grades after its others (on
    both envs: those children finish, so they are graded), failures among them."""
    from agentjax.train.tree_warmstart import grade_rows

    for env in ("textworld_sync", "textcraft_synth"):
        run = preset("tiny", "sera", env)
        tasks = run.spec.tasks(run.spec.train_split)[:2]
        rows, labels = grade_rows(run, tasks, tokenizer, stall=True, late=False)
        more, more_labels = grade_rows(run, tasks, tokenizer, stall=True, late=True)
        rest = iter(zip(more, more_labels, strict=True))
        assert rows and all(any(pair == other for other in rest) for pair in zip(rows, labels, strict=True))
        assert len(more) > len(rows) and sum(more_labels) - sum(labels) < len(more) - len(rows)


def test_stall_grades_add_unfinished_failures_where_they_are_graded(tokenizer):
    """WarmStart.stall_grades: grade_rows gains the stalled trees' grades (failures among them) on TextWorld-Sync;
    on TextCraft-Synth an unfinished child is not graded, so the rows are the same."""
    from agentjax.train.tree_warmstart import grade_rows

    for env in ("textworld_sync", "textcraft_synth"):
        run = preset("tiny", "sera", env)
        tasks = run.spec.tasks(run.spec.train_split)[:2]
        rows, labels = grade_rows(run, tasks, tokenizer, stall=False)
        more, more_labels = grade_rows(run, tasks, tokenizer, stall=True)
        rest = iter(zip(more, more_labels, strict=True))  # each task's stalled tree after its other two
        assert rows and all(any(pair == other for other in rest) for pair in zip(rows, labels, strict=True))
        if env == "textworld_sync":
            assert len(more) > len(rows) and sum(more_labels) - sum(labels) < len(more) - len(rows)
        else:
            assert more == rows


def test_weighted_row_draws():
    """WarmStart.grader_replay's batches: rows drawn with the given probabilities; no weights keeps the uniform
    stream every warm start was built with."""
    from agentjax.train.warmstart import draw_rows

    uniform = draw_rows(np.random.default_rng(3), 10, 8)
    assert (uniform == np.random.default_rng(3).integers(0, 10, 8)).all()
    weights = np.r_[np.full(4, 0.5 / 4), np.zeros(2), np.full(4, 0.5 / 4)]
    picks = draw_rows(np.random.default_rng(0), 10, 4000, weights)
    assert not np.isin(picks, [4, 5]).any() and abs((picks < 4).mean() - 0.5) < 0.03
    with pytest.raises(ValueError, match="summing to 1"):
        draw_rows(np.random.default_rng(0), 3, 2, np.array([0.5, 0.2, 0.2]))


@pytest.mark.slow  # a warm start's two SFT phases compiled: `make test-slow`
def test_a_grader_phase_ends_the_warm_start(tmp_path, tokenizer):
    """WarmStart.grader_steps: after the warm start's steps, steps on grade rows only, recorded with their count and
    losses; the main steps are the grader-less warm start's, built and cached first, then loaded (not redone)."""
    import json
    import os

    from agentjax.train.runconfig import WarmStart
    from agentjax.train.warmstart import warm_start_folder

    ws = WarmStart(episodes=2, steps=1, batch_size=2, cache_dir=str(tmp_path / "cache"), grader_steps=2)
    graded = preset("tiny", "sera", "textworld_sync").replace(out_dir=str(tmp_path), warm_start=ws)
    record = json.load(open(os.path.join(warm_start_folder(graded, tokenizer), "warmstart.json")))
    assert record["grader_rows"] > record["grader_successes"] > 0 and len(record["grader_losses"]) == 2
    assert record["warm_start"]["grader_steps"] == 2
    from agentjax.train.warmstart import cache_key

    main = graded.replace(warm_start=dataclasses.replace(ws, grader_steps=0))
    assert record["main_steps_from"] == cache_key(main) and os.path.isdir(tmp_path / "cache" / cache_key(main))
    main_record = json.load(open(tmp_path / "cache" / cache_key(main) / "warmstart.json"))
    assert record["losses"] == main_record["losses"] and record["turns"] == main_record["turns"]
    assert record["weights_sha256"] != main_record["weights_sha256"]
    replay = graded.replace(warm_start=dataclasses.replace(ws, grader_replay=0.5))  # rehearsal: the same phase, mixed
    record = json.load(open(os.path.join(warm_start_folder(replay, tokenizer), "warmstart.json")))
    assert len(record["grader_losses"]) == 2 and record["warm_start"]["grader_replay"] == 0.5


@pytest.mark.slow  # a tiny model's forward on a held-out planner tree, twice
def test_planner_fit_scores_each_held_out_planner_turn(tokenizer):
    """The acting probe: every turn of the held-out planner trees scored once, by reply kind, and split into the
    root's and the children's; the finish scored in place of every turn that did not finish (TextWorld-Sync offers it
    at every turn); a row's score does not depend on the batch it is packed in (padding rows are dropped)."""
    from flax import nnx

    from agentjax.models import Qwen
    from agentjax.train.grader_probe import planner_fit

    run = preset("tiny", "sera", "textworld_sync")
    model = Qwen(run.train.model.arch, rngs=nnx.Rngs(0))
    fit = planner_fit(run, model, tokenizer, tasks=1)
    one = planner_fit(run, model, tokenizer, tasks=1, batch_size=1)
    kinds = {k.split("/")[0] for k in fit} - {"all", "root", "child"}
    assert {"act", "delegate"} <= kinds and "grade" not in kinds and "rubric" not in kinds
    assert fit["all/turns"] == sum(fit[f"{k}/turns"] for k in kinds) > 0
    assert fit["all/turns"] == fit["root/all/turns"] + fit["child/all/turns"] and fit["child/all/turns"] > 0
    for k in kinds:
        assert fit[f"{k}/turns"] == fit.get(f"root/{k}/turns", 0) + fit.get(f"child/{k}/turns", 0), k
    for where in ("root", "child"):
        assert fit[f"{where}/p_finish_turns"] == fit[f"{where}/all/turns"] - fit.get(f"{where}/finish/turns", 0)
        assert 0 < fit[f"{where}/p_finish"] < 1
    for k in fit:
        assert fit[k] == pytest.approx(one[k], rel=1e-4, abs=1e-6), k
    assert 0 < fit["all/p_reply"] < 1 and fit["all/nll"] > 0  # a random policy: the planner's replies are unlikely
