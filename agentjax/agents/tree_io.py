"""Trees as JSON: what a tree run saves per batch (``<out_dir>/trees/<step>.json``) and ``agentjax trees`` prints.

:func:`tree_to_dict` keeps what :func:`~agentjax.agents.tree.render_tree` shows and the credit reads — the task, the
limits, every node (goal, parent, depth, status, budget, finish message, label and the judge's reason; SERA's
rubric, grade, score and the texts of the rubric and grading calls) and every turn (the reply's kind and text, the
feedback, validity, launched children, the row reward) — and drops the token arrays. :func:`tree_from_dict` rebuilds
a :class:`~agentjax.agents.tree.Tree` whose replies carry their kind, text, finish message and error (not the parsed
calls), enough to render it.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import numpy as np

from agentjax.agents.grammar import Reply
from agentjax.agents.rubric import Grade, Rubric
from agentjax.agents.tree import Goal, Node, NodeTurn, PolicyCall, Status, Tree, TreeLimits
from envs.base import Task


def _jsonable(x: Any) -> Any:
    return json.loads(json.dumps(x, default=str))


def _text(call: PolicyCall | None) -> dict[str, str] | None:
    return None if call is None else {"text": call.text, "error": call.error}


def _call(saved: dict[str, str] | None) -> PolicyCall | None:
    if saved is None:
        return None
    empty = np.zeros(0, np.int32)
    return PolicyCall(prompt_ids=empty, response_ids=empty, logp=np.zeros(0, np.float32), text=saved["text"],
                      error=saved["error"])


def tree_to_dict(tree: Tree) -> dict[str, Any]:
    """A JSON-ready dict of ``tree`` (module docstring)."""
    task = tree.task
    return {
        "task": {"env": task.env, "task_id": task.task_id, "split": task.split, "seed": task.seed,
                 "meta": _jsonable(dict(task.meta))},
        "group": tree.group, "index": tree.index, "task_index": tree.task_index,
        "limits": dataclasses.asdict(tree.limits), "root_success": tree.root_success,
        "events": [list(e) for e in tree.events], "child_reward": tree.child_reward,
        "nodes": [{
            "id": n.id, "parent": n.parent, "depth": n.depth, "budget": n.budget, "launch_step": n.launch_step,
            "event": n.event, "rank": n.rank, "status": n.status.value, "children": list(n.children),
            "goal": {"text": n.goal.text, "targets": dict(n.goal.targets), "context": n.goal.context},
            "finish_message": n.finish_message, "label": n.label, "judge_reason": n.judge_reason,
            "rubric": None if n.rubric is None else n.rubric.as_dict(), "grade": None if n.grade is None else
            n.grade.as_dict(), "score": n.score, "rubric_text": _text(n.rubric_call), "grade_text": _text(n.grade_call),
            "turns": [{"step": u.step, "kind": u.reply.kind, "text": u.reply.text, "message": u.reply.message,
                       "error": u.reply.error, "feedback": u.feedback, "valid": u.valid, "children": list(u.children),
                       "event": u.event, "reward": u.reward, "executed": u.executed} for u in n.turns],
        } for n in tree.nodes],
    }


def tree_from_dict(data: dict[str, Any]) -> Tree:
    """The :class:`Tree` of :func:`tree_to_dict` (replies without their parsed calls)."""
    t = data["task"]
    tree = Tree(task=Task(t["env"], t["task_id"], t["split"], t.get("seed", 0), t.get("meta", {})),
                group=data["group"], index=data["index"], task_index=data["task_index"],
                limits=TreeLimits(**data["limits"]), root_success=data["root_success"],
                events=[tuple(e) for e in data["events"]], child_reward=data.get("child_reward", "label"))
    for n in data["nodes"]:
        g = n["goal"]
        node = Node(id=n["id"], parent=n["parent"], depth=n["depth"], goal=Goal(g["text"], g["targets"], g["context"]),
                    budget=n["budget"], launch_step=n["launch_step"], event=n["event"], rank=n["rank"],
                    status=Status(n["status"]), children=list(n["children"]), finish_message=n["finish_message"],
                    label=n["label"], judge_reason=n["judge_reason"], score=n.get("score"),
                    rubric=Rubric.from_dict(n["rubric"]) if n.get("rubric") else None,
                    grade=Grade(**{**n["grade"], "scores": tuple(n["grade"]["scores"])}) if n.get("grade") else None,
                    rubric_call=_call(n.get("rubric_text")), grade_call=_call(n.get("grade_text")))
        node.turns = [NodeTurn(step=u["step"], reply=Reply(kind=u["kind"], text=u["text"], message=u["message"],
                                                           error=u["error"]),
                               feedback=u["feedback"], valid=u["valid"], children=tuple(u["children"]),
                               event=u["event"], reward=u["reward"], executed=u.get("executed", True))
                      for u in n["turns"]]
        tree.nodes.append(node)
    return tree


__all__ = ["tree_from_dict", "tree_to_dict"]
