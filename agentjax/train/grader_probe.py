"""Does SERA's grader read the child? Its grades of held-out children against the verifier, against chance.

The flat runs' warm start is checked by :mod:`agentjax.train.probe` (agreement with the oracle's action). A SERA
policy has a second role to check before RL: the grader whose scores become its children's execution rewards. A
grader that passes whatever finishes (or fails everything) gives a reward that does not depend on what the child
did. :func:`grader_agreement` measures it on children whose outcome is known and mixed: on held-out tasks (the
run's eval split's first ones) the env's planner plays two trees per task
(:func:`~agentjax.train.tree_warmstart.teacher_trees`): a planner tree, whose children do their subtasks, and an
early-finish tree, whose delegated children finish after ``id % 3`` of the planner's turns and mostly fail. The
probed policy writes each child's rubric (the run's :class:`~agentjax.rollout.tree_rubrics.RubricConfig`:
temperature 1, constrained where the run is) and grades each finished child with it at temperature 0, exactly as
in training; the verifier (TextCraft-Synth's program check, TextWorld-Sync's judge) labels every child.

Reported over the finished children with a label and a grade that parsed: ``pass_rate`` on the verifier's
successes, ``fail_rate`` on its failures, ``balanced_accuracy`` (their mean; 0.5 for any grader that ignores the
child, whatever it says, since it gives every child the same flag distribution), ``agreement`` and ``majority``
(the larger label share: what a constant grader reaches), ``auc`` of the final score against the label (ties
count one half; 0.5 for a constant score), binomial standard errors, the counts, and the rubric and grade calls
that failed to parse. Children that did not finish are scored 0 without a call (``require_finish``) and are not
counted.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from agentjax.train.runconfig import RunConfig

GRADER_TASKS = 16  # held-out tasks (the eval split's first ones); two teacher trees each


def graded_children(run: RunConfig, grader: Any, tokenizer: Any, tasks: Sequence[Any], key: jax.Array
                    ) -> tuple[list[tuple[bool, bool, float]], dict[str, float]]:
    """``(verifier label, grade's success flag, grade's final score)`` of every labelled, graded child of the
    planner and early-finish trees of ``tasks``, and the summed rubric counters (``rubric/...``, ``grade/...``).
    A task whose planner tree does not fit is skipped (logged), as in the warm start."""
    from agentjax.rollout.tree_collect import tree_stats
    from agentjax.train.tree_warmstart import both_trees

    out: list[tuple[bool, bool, float]] = []
    counts: dict[str, float] = {}
    for rollouts in both_trees(run, tasks, tokenizer, grader=grader, key=key):
        stats = tree_stats(rollouts)
        for name in ("rubric/requests", "rubric/failures", "grade/requests", "grade/failures", "grade/unfinished"):
            counts[name] = counts.get(name, 0.0) + float(stats.get(name, 0.0))
        for tree in rollouts.trees:
            for node in tree.nodes[1:]:
                if node.label is not None and node.grade is not None:
                    out.append((bool(node.label), bool(node.grade.success), float(node.grade.final_score)))
    return out, counts


def _rate(hits: int, n: int) -> tuple[float, float]:
    if n == 0:
        return float("nan"), float("nan")
    p = hits / n
    return p, math.sqrt(p * (1 - p) / n)


def auc(score: np.ndarray, label: np.ndarray) -> float:
    """P(a success's score > a failure's score), ties one half (Mann-Whitney); NaN without both labels."""
    pos, neg = score[label], score[~label]
    if not len(pos) or not len(neg):
        return float("nan")
    greater = (pos[:, None] > neg[None, :]).mean()
    ties = (pos[:, None] == neg[None, :]).mean()
    return float(greater + 0.5 * ties)


def summarize(children: Sequence[tuple[bool, bool, float]]) -> dict[str, float]:
    """The probe's numbers (module docstring) from ``(label, success flag, final score)`` triples."""
    label = np.array([c[0] for c in children], bool)
    passed = np.array([c[1] for c in children], bool)
    score = np.array([c[2] for c in children], np.float64)
    n, n_pos = len(children), int(label.sum())
    pass_rate, pass_se = _rate(int((passed & label).sum()), n_pos)
    fail_rate, fail_se = _rate(int((~passed & ~label).sum()), n - n_pos)
    agreement, agreement_se = _rate(int((passed == label).sum()), n)
    return {"children": float(n), "successes": float(n_pos), "failures": float(n - n_pos),
            "pass_rate": pass_rate, "pass_rate_se": pass_se, "fail_rate": fail_rate, "fail_rate_se": fail_se,
            "balanced_accuracy": (pass_rate + fail_rate) / 2, "balanced_accuracy_se": math.hypot(pass_se, fail_se) / 2,
            "agreement": agreement, "agreement_se": agreement_se,
            "majority": max(n_pos, n - n_pos) / n if n else float("nan"), "auc": auc(score, label)}


def grader_agreement(run: RunConfig, model: Any, tokenizer: Any, *, tasks: int = GRADER_TASKS,
                     seed: int = 0) -> dict[str, float]:
    """The grader probe of ``model`` under ``run``'s tree and rubric settings on the first ``tasks`` tasks of the
    run's eval split (module docstring). ``run`` must be a SERA run (``run.rubric_collect``)."""
    from agentjax.models import Sampler

    if run.rubric_collect is None:
        raise ValueError("grader probe: the run writes no rubrics (a SERA method, e.g. --method sera, has a grader)")
    held_out = run.spec.tasks(run.evaluation_split)[:tasks]
    children, counts = graded_children(run, Sampler(model, tokenizer), tokenizer, held_out, jax.random.key(seed))
    return {"tasks": float(len(held_out)), **summarize(children), **counts}


def describe(probe: dict[str, float]) -> str:
    """One line for logs and reports."""
    return (f"grader on {int(probe['children'])} held-out children ({int(probe['successes'])} verified successes): "
            f"passes {probe['pass_rate']:.2f} of successes, fails {probe['fail_rate']:.2f} of failures, balanced "
            f"accuracy {probe['balanced_accuracy']:.3f} ± {probe['balanced_accuracy_se']:.3f} (chance 0.5), AUC "
            f"{probe['auc']:.3f}")


__all__ = ["GRADER_TASKS", "auc", "describe", "grader_agreement", "graded_children", "summarize"]
