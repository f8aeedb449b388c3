"""SERA's rubric-score calibration over training (the helper of ``notebooks/sera_rubrics.ipynb``).

Does the policy's rubric grade track the verified outcome, and does the rubric stage make it track it better? A SERA
run saves the trees of every batch (``<run>/trees/<step>.json``, ``tree.saved_trees`` a batch): each delegated child
carries its parent's rubric, the policy's grade (success flag, final score) and the verifier's label. Per batch,
over the graded children with a label (:func:`graded_children`):

- ``score_success`` / ``score_failure``: the mean final score of verified successes and failures;
- ``pairwise_accuracy``: the share of (success, failure) pairs of the batch in which the success scored higher
  (ties count one half) — the quantity the rubric stage's ranking reward trains, here over every graded child rather
  than within fork groups;
- ``agreement``: the share of children whose success flag equals the label.

The rubric stage's own numbers come from the metrics lines of its steps (``credit/pairwise_accuracy``,
``credit/margin_rate``, ``credit/usable_groups``, ``fork/mixed``), over its fork groups.

:func:`small_run` is the notebook's CI setting: the tiny SERA preset shrunk (a 1-layer d = 32 policy, no warm start,
1 root task × 2 trees, 3 optimizer steps of the stages 1 : 1 : 1, constrained rubric and grade choices), trained into
a temporary folder in a few minutes; otherwise the notebook reads a finished run (``SERA_NB_RUN``, default the tiny
comparison's SERA seed 0).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from agentjax.train.config import ModelConfig, SERACredit
from agentjax.train.metrics import read_metrics
from agentjax.train.presets import tiny_tree, tiny_tree_arch
from agentjax.train.runconfig import RunConfig

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_RUN = os.path.join(HERE, "results", "runs", "tiny", "sera", "seed0")
RUBRIC_KEYS = ("credit/pairwise_accuracy", "credit/margin_rate", "credit/usable_groups", "credit/reward_mean",
               "fork/groups", "fork/mixed", "fork/branch_success")


def small_run(out_dir: str) -> RunConfig:
    """The notebook's CI setting (module docstring)."""
    run = tiny_tree("sera", filter_zero_variance=False)
    tree = dataclasses.replace(run.tree, max_depth=1, max_children=4, max_nodes=5, max_turns=10)
    credit = SERACredit(stages=(1, 1, 1), filter_zero_variance=False, branches=2, fork_budget=4)
    run = run.replace(train=run.train.replace(model=ModelConfig(tiny_tree_arch(d_model=32, mlp_dim=64, num_layers=1,
                                                                              head_dim=8)),
                                              compact_rows=False, credit=credit), tree=tree)
    run = run.with_sizes(num_groups=1, group_size=2, max_steps=4, prompt_len=1024, capacity=48, micro_batch_size=16)
    return run.replace(eval_tasks=1, eval_seeds=1, eval_every=0, updates=3, checkpoint_every=0, warm_start=None,
                       progress=False, out_dir=out_dir)


def graded_children(run_dir: str) -> list[dict[str, Any]]:
    """Every delegated child of every saved training batch with a grade and a label: ``step``, ``stage``,
    ``depth``, ``score`` (the grade's final score), ``success`` (its flag), ``label`` (the verifier's)."""
    folder = os.path.join(run_dir, "trees")
    rows = []
    for name in sorted(os.listdir(folder), key=lambda n: (not n[0].isdigit(), n)):
        if not name.endswith(".json") or not name[0].isdigit():  # eval_<step>.json: evaluation trees
            continue
        with open(os.path.join(folder, name)) as f:
            saved = json.load(f)
        for tree in saved["trees"]:
            for node in tree["nodes"][1:]:
                if node.get("grade") and node.get("label") is not None:
                    rows.append({"step": saved["step"], "stage": saved.get("stage", ""), "depth": node["depth"],
                                 "score": float(node["grade"]["final_score"]),
                                 "success": bool(node["grade"]["success"]), "label": float(node["label"])})
    return rows


def pairwise_accuracy(scores: Sequence[float], labels: Sequence[float]) -> float | None:
    """P(s_success > s_failure) over all (success, failure) pairs, ties one half; None without both labels."""
    s, y = np.asarray(scores, float), np.asarray(labels, float) > 0.5
    pos, neg = s[y], s[~y]
    if not len(pos) or not len(neg):
        return None
    diff = pos[:, None] - neg[None, :]
    return float(np.mean((diff > 0) + 0.5 * (diff == 0)))


def by_step(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per training batch (module docstring): n, successes, score means by label, pairwise accuracy, agreement."""
    out = []
    for step in sorted({r["step"] for r in rows}):
        part = [r for r in rows if r["step"] == step]
        scores, labels = [r["score"] for r in part], [r["label"] for r in part]
        good = [r["score"] for r in part if r["label"] > 0.5]
        bad = [r["score"] for r in part if r["label"] <= 0.5]
        out.append({"step": step, "stage": part[0]["stage"], "n": len(part), "successes": len(good),
                    "score_success": float(np.mean(good)) if good else None,
                    "score_failure": float(np.mean(bad)) if bad else None,
                    "pairwise_accuracy": pairwise_accuracy(scores, labels),
                    "agreement": float(np.mean([r["success"] == (r["label"] > 0.5) for r in part]))})
    return out


def rubric_steps(run_dir: str) -> list[dict[str, Any]]:
    """The metrics lines of the rubric stage's batches: step, optimizer step and :data:`RUBRIC_KEYS`."""
    lines = read_metrics(os.path.join(run_dir, "metrics.jsonl"))
    return [{"step": x["step"], "optimizer_step": x.get("schedule/step"), **{k: x[k] for k in RUBRIC_KEYS if k in x}}
            for x in lines if x.get("schedule/stage") == 2]


__all__ = ["DEFAULT_RUN", "RUBRIC_KEYS", "by_step", "graded_children", "pairwise_accuracy", "rubric_steps",
           "small_run"]
