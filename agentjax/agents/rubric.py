"""SERA's rubrics: the policy writes a rubric at each delegation and grades the child with it (METHODS.md "SERA" 2–3).

Two policy calls per delegated child, both plain chat prompts of the one shared policy:

- **Rubric writing** (:func:`rubric_messages`, sampled at temperature 1, trained by the rubric stage): before the child
  runs, the parent's side reads its own task, its trajectory up to the delegation, the delegation it just wrote, the
  child's goal, the pre-call state, the child's tools and budget, and answers a JSON object::

      {"criteria": [{"name": str, "weight": number >= 0, "description": str, "zero": str, "full": str}, ...],
       "success_gate": str, "failure_conditions": [str, ...], "procedure": str}

  with 2–8 criteria (:func:`parse_rubric`; the released key names ``rubric_items`` / ``score_0`` / ``score_full``
  / ``scoring_procedure`` are read too). Weights are renormalised to sum to 1. The parsed :class:`Rubric` is frozen
  before the child starts; the grader reads its canonical JSON (:meth:`Rubric.to_json`), not the raw reply.
- **Grading** (:func:`grading_messages`, greedy, no gradient): after the child stopped, the policy reads the frozen
  rubric, the child's goal, its trajectory and finish message and the final state, and answers::

      {"success": bool, "criterion_scores": [{"name": str, "score": number in [0, 1]}, ...],
       "final_score": number in [0, 1], "reason": str}

  :func:`parse_grade` rejects inconsistent answers: a failure with a non-zero final score, a success with a zero
  one, scores outside [0, 1], criteria the rubric does not have or named twice. Criteria left out score 0.

The child's execution reward (:func:`grade_reward`) is the final score (``reading="final"``, the released choice), or
``gate · Σ_k w_k s_k`` (``reading="weighted"``, the paper's). A rubric or grade that does not parse raises
:class:`RubricError` naming the problem; the tree collector counts it (a failed rubric; a child dropped from the
gradient). Text after the last ``</think>`` is read; the first JSON object of the right shape counts.

:func:`reference_rubric` and :func:`reference_grade` write well-formed rubrics and grades from what the programs know
(the goal, the verifier's label, the steps used): the warm start's demonstrations, so that a small policy learns the
format before the rubric stage trains its content.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from typing import Any, Literal

from agentjax.agents.judge import JudgeRequest, json_objects

MIN_CRITERIA = 2
MAX_CRITERIA = 8
MAX_CONTEXT_CHARS = 12_000  # the rubric writer's view of the parent: head and tail kept, the middle cut
Reading = Literal["final", "weighted"]
READINGS: tuple[Reading, ...] = ("final", "weighted")


class RubricError(ValueError):
    """A rubric or grade that cannot be used; the message says what is wrong with it."""


@dataclasses.dataclass(frozen=True)
class Criterion:
    name: str
    weight: float  # renormalised: the weights of a rubric sum to 1
    description: str
    zero: str = ""  # what earns 0
    full: str = ""  # what earns full marks


@dataclasses.dataclass(frozen=True)
class Rubric:
    """A frozen rubric: weighted criteria and a success gate (weights sum to 1)."""

    criteria: tuple[Criterion, ...]
    success_gate: str = ""
    failure_conditions: tuple[str, ...] = ()
    procedure: str = ""

    @property
    def weights(self) -> tuple[float, ...]:
        return tuple(c.weight for c in self.criteria)

    def as_dict(self) -> dict[str, Any]:
        criteria = [dataclasses.asdict(dataclasses.replace(c, weight=round(c.weight, 4))) for c in self.criteria]
        return {"criteria": criteria, "success_gate": self.success_gate,
                "failure_conditions": list(self.failure_conditions), "procedure": self.procedure}

    def to_json(self) -> str:
        """The canonical text the grader reads, the tree saves and a demonstration writes (weights to 4 places)."""
        return json.dumps(self.as_dict(), ensure_ascii=False)

    @classmethod
    def from_dict(cls, payload: Mapping[str, Any]) -> Rubric:
        return cls(tuple(Criterion(**c) for c in payload["criteria"]), payload.get("success_gate", ""),
                   tuple(payload.get("failure_conditions", ())), payload.get("procedure", ""))


@dataclasses.dataclass(frozen=True)
class Grade:
    """The policy's grade of one child under a frozen rubric."""

    success: bool
    scores: tuple[float, ...]  # per criterion of the rubric, in its order (0 where the grader left one out)
    final_score: float  # in [0, 1]; 0 when not successful, > 0 when successful
    reason: str = ""

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# ------------------------------------------------------------------------------------------------ parsing


def _text(value: Any) -> str:
    return value.strip() if isinstance(value, str) else ""


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise RubricError(f"{what} must be a finite number, got {value!r}")
    return float(value)


def parse_rubric(text: str, *, min_criteria: int = MIN_CRITERIA, max_criteria: int = MAX_CRITERIA) -> Rubric:
    """The first JSON object of ``text`` with a criteria list, checked and with weights renormalised.

    Raises:
      RubricError: no such object; fewer than ``min_criteria`` or more than ``max_criteria`` criteria; a
        criterion without a name or description, or with a name used twice; a negative or non-numeric weight;
        weights summing to 0.
    """
    for payload in json_objects(text):
        items = payload.get("criteria", payload.get("rubric_items"))
        if isinstance(items, list):
            break
    else:
        raise RubricError("no JSON object with a \"criteria\" list")
    if not min_criteria <= len(items) <= max_criteria:
        raise RubricError(f"a rubric has {min_criteria} to {max_criteria} criteria, this one {len(items)}")
    criteria, names = [], set()
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise RubricError(f"criterion {i} is not an object")
        name, description = _text(item.get("name")), _text(item.get("description"))
        if not name or not description:
            raise RubricError(f"criterion {i} needs a non-empty name and description")
        if name.lower() in names:
            raise RubricError(f"criterion name {name!r} is used twice")
        names.add(name.lower())
        weight = _number(item.get("weight"), f"criterion {name!r}'s weight")
        if weight < 0:
            raise RubricError(f"criterion {name!r} has a negative weight {weight}")
        criteria.append(Criterion(name, weight, description, _text(item.get("zero", item.get("score_0"))),
                                  _text(item.get("full", item.get("score_full")))))
    total = sum(c.weight for c in criteria)
    if total <= 0:
        raise RubricError("the criteria's weights sum to 0")
    criteria = tuple(dataclasses.replace(c, weight=c.weight / total) for c in criteria)
    failures = payload.get("failure_conditions", ())
    failures = (failures,) if isinstance(failures, str) else failures if isinstance(failures, list) else ()
    return Rubric(criteria, _text(payload.get("success_gate")), tuple(_text(f) for f in failures if _text(f)),
                  _text(payload.get("procedure", payload.get("scoring_procedure"))))


def parse_grade(text: str, rubric: Rubric) -> Grade:
    """The first JSON object of ``text`` with a boolean ``success``, checked against ``rubric``.

    Raises:
      RubricError: no such object; a final score missing, not a number or outside [0, 1]; a failure with a
        non-zero final score or a success with a zero one; a criterion score outside [0, 1], of a criterion the
        rubric does not have, or given twice.
    """
    for payload in json_objects(text):
        if isinstance(payload.get("success"), bool):
            break
    else:
        raise RubricError("no JSON object with a boolean \"success\"")
    success = payload["success"]
    final = _number(payload.get("final_score", payload.get("score")), "final_score")
    if not 0.0 <= final <= 1.0:
        raise RubricError(f"final_score {final} is outside [0, 1]")
    if not success and final != 0.0:
        raise RubricError(f"a failed child scores exactly 0, this grade gives {final}")
    if success and final <= 0.0:
        raise RubricError("a successful child scores above 0, this grade gives 0")
    index = {c.name.lower(): i for i, c in enumerate(rubric.criteria)}
    scores: list[float | None] = [None] * len(rubric.criteria)
    items = payload.get("criterion_scores", [])
    if not isinstance(items, list):
        raise RubricError("criterion_scores must be a list of {\"name\", \"score\"} objects")
    for item in items:
        name = _text(item.get("name")) if isinstance(item, dict) else ""
        if name.lower() not in index:
            raise RubricError(f"criterion {name!r} is not in the rubric ({', '.join(c.name for c in rubric.criteria)})")
        if scores[index[name.lower()]] is not None:
            raise RubricError(f"criterion {name!r} is scored twice")
        score = _number(item.get("score"), f"criterion {name!r}'s score")
        if not 0.0 <= score <= 1.0:
            raise RubricError(f"criterion {name!r}'s score {score} is outside [0, 1]")
        scores[index[name.lower()]] = score
    reason = payload.get("reason", "")
    return Grade(success, tuple(0.0 if s is None else s for s in scores), final,
                 reason if isinstance(reason, str) else str(reason))


def grade_reward(grade: Grade, rubric: Rubric, reading: Reading = "final") -> float:
    """A child's execution reward: the final score (released), or ``1[success] · Σ_k w_k s_k`` (the paper's)."""
    if reading == "final":
        return grade.final_score
    if reading == "weighted":
        return float(grade.success) * sum(w * s for w, s in zip(rubric.weights, grade.scores, strict=True))
    raise ValueError(f"reading must be one of {READINGS}, got {reading!r}")


# ------------------------------------------------------------------------------------------------ prompts

RUBRIC_SYSTEM = ("You are the parent agent. You have just delegated a subtask to a sub-agent, which has not started "
                 "yet. Write the rubric that will later score the sub-agent's finished work from 0 to 1: what the "
                 "parent needs from it at this point of its own task (the subtask done, a useful and truthful report, "
                 "no wasted or harmful steps), specific to this subtask rather than a template. Do not guess how the "
                 "sub-agent will do. Reply with one JSON object and nothing else.")

GRADING_SYSTEM = ("You grade one sub-agent's finished work with a rubric that was frozen before it started. Use only "
                  "what its trajectory and the final state show. If it did not complete its subtask, success is "
                  "false and the final score is exactly 0. Reply with one JSON object and nothing else.")

RUBRIC_FORMAT = ('{"criteria": [{"name": "...", "weight": 0.5, "description": "what to check", '
                 '"zero": "what earns 0", "full": "what earns full marks"}, ...], '
                 '"success_gate": "what must hold for any score above 0", '
                 '"failure_conditions": ["what forces a score of 0", ...], "procedure": "how to combine the criteria"}')

GRADE_FORMAT = ('{"success": true or false, "criterion_scores": [{"name": "...", "score": 0.0 to 1.0}, ...], '
                '"final_score": 0.0 to 1.0, "reason": "..."}')


@dataclasses.dataclass(frozen=True)
class RubricRequest:
    """What the rubric writer reads at one delegation (texts as the tree world renders them)."""

    parent_task: str  # the parent's own goal
    parent_trajectory: str  # the parent's turns before the delegation
    delegation: str  # the parent's delegating reply (its result is not known yet)
    child_goal: str
    state: str  # the world before the child starts, as the parent may observe it
    tools: str = ""  # what the child can do
    budget: int = 20  # the child's turns


def _cut_middle(text: str, max_chars: int) -> str:
    if len(text) <= max_chars:
        return text
    head = max_chars // 4
    return text[:head] + "\n[... the middle is cut ...]\n" + text[len(text) - (max_chars - head):]


def rubric_messages(request: RubricRequest, *, min_criteria: int = MIN_CRITERIA, max_criteria: int = MAX_CRITERIA,
                    max_context_chars: int = MAX_CONTEXT_CHARS) -> list[dict[str, str]]:
    """The chat messages of one rubric-writing call."""
    context = (f"Your task:\n{request.parent_task}\n\nWhat you did so far:\n{request.parent_trajectory or '(nothing)'}"
               f"\n\nYour delegating reply:\n{request.delegation}\n\nThe world now:\n{request.state or '(not shown)'}")
    user = (f"{_cut_middle(context, max_context_chars)}\n\nThe sub-agent's subtask:\n{request.child_goal}\n\n"
            f"It can: {request.tools or '(the same as you)'}; it has {request.budget} turns.\n\n"
            f"Write its rubric: {min_criteria} to {max_criteria} criteria with non-negative weights (they are "
            "rescaled to sum to 1), a strict success gate, the conditions that force 0. Answer in this JSON format:\n"
            + RUBRIC_FORMAT)
    return [dict(role="system", content=RUBRIC_SYSTEM), dict(role="user", content=user)]


def grading_messages(rubric: Rubric, request: JudgeRequest, *, max_context_chars: int = MAX_CONTEXT_CHARS
                     ) -> list[dict[str, str]]:
    """The chat messages of one grading call: the frozen rubric and what the child did (a judge's request)."""
    finish = request.finish_message if request.finished else "(it stopped without finishing)"
    work = (f"What it did:\n{request.trajectory or '(nothing)'}\n\nIts finish message:\n{finish}\n\n"
            f"The world when it stopped:\n{request.final_state or '(not shown)'}")
    user = (f"The rubric:\n{rubric.to_json()}\n\nThe sub-agent's subtask:\n{request.goal}\n\n"
            f"{_cut_middle(work, max_context_chars)}\n\nGrade it; a failed subtask scores exactly 0 and a completed "
            f"one above 0. Answer in this JSON format:\n{GRADE_FORMAT}")
    return [dict(role="system", content=GRADING_SYSTEM), dict(role="user", content=user)]


# ------------------------------------------------------------------------------------------------ demonstrations


RUBRIC_WEIGHTS = ((0.6, 0.2, 0.2), (0.8, 0.1, 0.1), (0.4, 0.3, 0.3), (0.5, 0.5, 0.0))  # completion, report, efficiency
GRADE_LEVELS = (0.25, 0.5, 0.75, 1.0)  # the final scores a constrained grader chooses from (and 0: failure)


def reference_rubric(child_goal: str, budget: int = 20, weights: tuple[float, float, float] = RUBRIC_WEIGHTS[0]
                     ) -> Rubric:
    """A well-formed rubric for any subtask: completion, report and efficiency criteria with ``weights`` (warm-start
    demonstrations of the format; :func:`rubric_choices`)."""
    goal = " ".join(child_goal.split())[:200]
    w_done, w_report, w_fast = weights
    return Rubric(
        (Criterion("completion", w_done, f"the subtask is done: {goal}", "not done or only partly done",
                   "done, as the final state shows"),
         Criterion("report", w_report, "the finish message tells the parent what was done, truthfully",
                   "no finish message or a false one", "a correct and useful summary"),
         Criterion("efficiency", w_fast, f"no wasted or invalid steps within the {budget} turns",
                   "the budget spent on loops or invalid replies", "only the needed steps")),
        success_gate="the subtask is done and the sub-agent finished",
        failure_conditions=("the subtask is not done", "the sub-agent claims work it did not do"),
        procedure="0 unless the gate holds; otherwise the weighted sum of the criteria's scores")


def reference_grade(rubric: Rubric, success: bool, *, finished: bool, steps: int, budget: int,
                    invalid: int = 0) -> Grade:
    """A grade consistent with a verifier's label: 0 on failure; on success completion 1, report 1 if the child
    finished, efficiency falling with the steps and invalid replies it used (warm-start demonstrations)."""
    if not success:
        return Grade(False, (0.0,) * len(rubric.criteria), 0.0, "the subtask is not done")
    efficiency = max(0.0, 1.0 - (max(steps - 1, 0) + 2 * invalid) / max(budget, 1))
    named = {"completion": 1.0, "report": float(finished), "efficiency": round(efficiency, 2)}
    scores = tuple(named.get(c.name, 1.0) for c in rubric.criteria)
    final = max(0.01, round(sum(w * s for w, s in zip(rubric.weights, scores, strict=True)), 2))
    return Grade(True, scores, final, "the subtask is done")


def level_grade(rubric: Rubric, level: float) -> Grade:
    """The grade of a constrained grader's choice: failure at level 0, else success with every criterion and the
    final score at ``level``."""
    if level <= 0:
        return Grade(False, (0.0,) * len(rubric.criteria), 0.0, "the subtask is not done")
    return Grade(True, (float(level),) * len(rubric.criteria), float(level), "the subtask is done")


def rubric_choices(child_goal: str, budget: int = 20) -> list[str]:
    """The rubrics a constrained writer chooses from (tiny policies): the reference rubric under each of
    :data:`RUBRIC_WEIGHTS`, as text."""
    return [reference_rubric(child_goal, budget, w).to_json() for w in RUBRIC_WEIGHTS]


def grade_choices(rubric: Rubric) -> list[str]:
    """The grades a constrained grader chooses from: failure, and success at each of :data:`GRADE_LEVELS`."""
    return [format_grade(level_grade(rubric, level), rubric) for level in (0.0, *GRADE_LEVELS)]


def format_grade(grade: Grade, rubric: Rubric) -> str:
    """A grade as the policy would write it (demonstration target)."""
    return json.dumps({"success": grade.success,
                       "criterion_scores": [{"name": c.name, "score": s}
                                            for c, s in zip(rubric.criteria, grade.scores, strict=True)],
                       "final_score": grade.final_score, "reason": grade.reason}, ensure_ascii=False)


def rubric_summary(rubric: Rubric | None, grade: Grade | None = None) -> str:
    """One line for printed trees: the criteria with weights (and the grade's scores)."""
    if rubric is None:
        return "(no rubric)"
    parts = [f"{c.name} {c.weight:.2f}" + (f"={s:.2f}" if grade else "")
             for c, s in zip(rubric.criteria, grade.scores if grade else (0.0,) * len(rubric.criteria), strict=True)]
    head = "; ".join(parts)
    return head if grade is None else f"{head} -> success={grade.success} final={grade.final_score:.2f}"
