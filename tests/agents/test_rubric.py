"""SERA's rubrics and grades: parsing, the consistency checks, the two reward readings, prompts, demonstrations.

Checked by hand on small cases: weights renormalised; the released key names read too; every malformed rubric or
grade raises :class:`RubricError` naming the problem (criteria count, names, weights, the success / score gate,
criterion scores out of range or unknown); the final-score and weighted readings; the reference rubric and grades
round-trip through the parsers (what the warm start teaches parses); the prompts carry the frozen rubric and cut long
context in the middle.
"""

from __future__ import annotations

import json

import pytest

from agentjax.agents.judge import JudgeRequest, parse_verdict
from agentjax.agents.rubric import (
    Criterion,
    Grade,
    Rubric,
    RubricError,
    RubricRequest,
    format_grade,
    grade_reward,
    grading_messages,
    parse_grade,
    parse_rubric,
    reference_grade,
    reference_rubric,
    rubric_messages,
    rubric_summary,
)


def _rubric_text(weights=(3.0, 1.0), **extra) -> str:
    criteria = [{"name": f"c{i}", "weight": w, "description": f"check {i}", "zero": "no", "full": "yes"}
                for i, w in enumerate(weights)]
    return json.dumps({"criteria": criteria, "success_gate": "done", "failure_conditions": ["lies"], **extra})


def test_parse_rubric_renormalises_weights_and_reads_prose_around_the_json():
    rubric = parse_rubric("<think>{\"criteria\": 1}</think>Here it is:\n```json\n" + _rubric_text() + "\n```")
    assert [c.name for c in rubric.criteria] == ["c0", "c1"]
    assert rubric.weights == pytest.approx((0.75, 0.25))
    assert rubric.success_gate == "done" and rubric.failure_conditions == ("lies",)
    assert Rubric.from_dict(json.loads(rubric.to_json())) == rubric


def test_parse_rubric_reads_the_released_key_names():
    text = json.dumps({"rubric_items": [{"name": "a", "weight": 1, "description": "d", "score_0": "z",
                                         "score_full": "f"}, {"name": "b", "weight": 1, "description": "e"}],
                       "scoring_procedure": "sum", "failure_conditions": "one condition"})
    rubric = parse_rubric(text)
    assert rubric.criteria[0] == Criterion("a", 0.5, "d", "z", "f")
    assert rubric.procedure == "sum" and rubric.failure_conditions == ("one condition",)


@pytest.mark.parametrize(
    "text, problem",
    [
        ("no json here", "no JSON object"),
        (_rubric_text(weights=(1.0,)), "2 to 8 criteria, this one 1"),
        (_rubric_text(weights=(1.0,) * 9), "2 to 8 criteria, this one 9"),
        (_rubric_text(weights=(1.0, -1.0)), "negative weight"),
        (_rubric_text(weights=(0.0, 0.0)), "sum to 0"),
        (_rubric_text(weights=(1.0, "heavy")), "finite number"),
        (_rubric_text(weights=(1.0, True)), "finite number"),
        (json.dumps({"criteria": [{"name": "a", "weight": 1, "description": "x"},
                                  {"name": "A", "weight": 1, "description": "y"}]}), "used twice"),
        (json.dumps({"criteria": [{"name": "a", "weight": 1}, {"name": "b", "weight": 1, "description": "y"}]}),
         "name and description"),
        (json.dumps({"criteria": ["a", "b"]}), "not an object"),
    ],
)
def test_parse_rubric_rejects_malformed_rubrics(text, problem):
    with pytest.raises(RubricError, match=problem):
        parse_rubric(text)


RUBRIC = Rubric((Criterion("done", 0.5, "d"), Criterion("report", 0.3, "r"), Criterion("fast", 0.2, "f")))


def _grade_text(success=True, final=0.8, scores=(("done", 1.0), ("report", 0.5))) -> str:
    return json.dumps({"success": success, "criterion_scores": [{"name": n, "score": s} for n, s in scores],
                       "final_score": final, "reason": "ok"})


def test_parse_grade_aligns_scores_with_the_rubric_and_fills_left_out_criteria_with_zero():
    grade = parse_grade("Grade: " + _grade_text(scores=(("report", 0.5), ("DONE", 1.0))), RUBRIC)
    assert grade == Grade(True, (1.0, 0.5, 0.0), 0.8, "ok")
    assert grade_reward(grade, RUBRIC) == 0.8  # the released reading: the final score
    assert grade_reward(grade, RUBRIC, "weighted") == pytest.approx(0.5 * 1.0 + 0.3 * 0.5)
    failed = parse_grade(_grade_text(success=False, final=0.0), RUBRIC)
    assert grade_reward(failed, RUBRIC, "weighted") == 0.0  # the gate zeroes the weighted sum
    with pytest.raises((ValueError, TypeError), match="reading"):  # the type checker (in tests) or the check
        grade_reward(grade, RUBRIC, "mean")


@pytest.mark.parametrize(
    "text, problem",
    [
        ("{\"final_score\": 1.0}", "boolean \"success\""),
        (_grade_text(success=False, final=0.3), "failed child scores exactly 0"),
        (_grade_text(success=True, final=0.0), "successful child scores above 0"),
        (_grade_text(final=1.5), "outside \\[0, 1\\]"),
        (_grade_text(final="high"), "finite number"),
        (json.dumps({"success": True, "final_score": float("nan")}), "finite number"),
        (_grade_text(scores=(("done", 1.2),)), "outside \\[0, 1\\]"),
        (_grade_text(scores=(("speed", 1.0),)), "not in the rubric"),
        (_grade_text(scores=(("done", 1.0), ("done", 0.5))), "scored twice"),
        (json.dumps({"success": True, "final_score": 0.5, "criterion_scores": "all good"}), "must be a list"),
    ],
)
def test_parse_grade_rejects_inconsistent_grades(text, problem):
    with pytest.raises(RubricError, match=problem):
        parse_grade(text, RUBRIC)


def test_reference_rubric_and_grades_round_trip_through_the_parsers():
    rubric = reference_rubric("craft 2 stick", budget=10)
    assert parse_rubric(rubric.to_json()) == rubric
    assert sum(rubric.weights) == pytest.approx(1.0)
    good = reference_grade(rubric, True, finished=True, steps=3, budget=10)
    assert good.success and 0 < good.final_score <= 1 and good.scores[0] == 1.0
    slow = reference_grade(rubric, True, finished=True, steps=9, budget=10, invalid=2)
    assert slow.final_score < good.final_score  # efficiency falls with the steps and invalid replies used
    bad = reference_grade(rubric, False, finished=True, steps=3, budget=10)
    assert bad.final_score == 0.0 and not bad.success
    for grade in (good, slow, bad):
        assert parse_grade(format_grade(grade, rubric), rubric) == grade
    assert "completion 0.60=1.00" in rubric_summary(rubric, good) and "final=" in rubric_summary(rubric, good)
    assert rubric_summary(None) == "(no rubric)"


def test_prompts_carry_the_request_and_cut_long_context_in_the_middle():
    request = RubricRequest(parent_task="craft a bed", parent_trajectory="x" * 30_000 + "LAST TURN",
                            delegation="<delegate>{...}</delegate>", child_goal="craft 3 white wool",
                            state="inventory: 2 string", budget=7)
    system, user = rubric_messages(request, max_context_chars=2_000)
    assert system["role"] == "system" and "craft 3 white wool" in user["content"]
    assert "LAST TURN" in user["content"] and "craft a bed" in user["content"]  # head and tail kept
    assert "the middle is cut" in user["content"] and len(user["content"]) < 4_000
    assert "7 turns" in user["content"] and "2 to 8 criteria" in user["content"]
    judge = JudgeRequest(goal="craft 3 white wool", finished=False, trajectory="craft(...)", final_state="inv")
    _, user = grading_messages(RUBRIC, judge)
    assert RUBRIC.to_json() in user["content"] and "stopped without finishing" in user["content"]


def test_judge_verdicts_still_read_the_first_object_with_a_boolean_success():
    assert parse_verdict('x {"a": {"success": true}} {"success": false, "reason": "no"}').reason == "no"
    assert not parse_verdict("{broken").ok
