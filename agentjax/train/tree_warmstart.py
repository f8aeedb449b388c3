"""The supervised warm start of a tree run: planner-made trees → node-turn rows → the flat warm start's NLL.

:func:`tree_demonstrations` grows one tree per training task with the env's planner as the tree collector's teacher
(:func:`agentjax.train.tree_worlds.planner_teacher`; TextCraft-Synth:
:class:`~agentjax.agents.textcraft_tree.PlannerTeacher`, the recipe planner's plan split over a tree) under the
run's own tree collector config, so every prompt is exactly what the policy reads at that node and turn during RL
(system prompt, goal, history, truncation) and every response is the planner's reply and the stop token. The tasks
are the first ``WarmStart.episodes`` of a ``seed``-permutation of the train split; a task whose planner tree does
not exist or does not fit (base items missing, a reply longer than ``response_len``) is skipped and counted.

A SERA run (:attr:`~agentjax.train.runconfig.RunConfig.rubric_collect`) adds each child's reference rubric and
grade (:func:`~agentjax.agents.rubric.reference_rubric`, :func:`~agentjax.agents.rubric.reference_grade` of its
verifier label) as rows of their own prompts, so the policy learns both formats before RL. A planner child always
does its subtask, so every such grade is a success, and a grader taught only by them passes whatever finishes
(on TextWorld-Sync it passed every finished child the judge failed: ``experiments/sera/results/sync_grades.md``).
``WarmStart.failure_grades`` adds a second tree per task in which every delegated child finishes after ``id % 3``
of the planner's turns (0-2), mostly before its subtask is done; the judge labels it and only its reference grade
(a failure wherever the judge failed the child) is kept as a row: its replies, and its parent's after it, teach
nothing. ``WarmStart.grader_steps`` ends the warm start with that many steps on grade rows only
(:func:`grade_rows`: the planner and early-finish trees' reference grades of the same tasks, about half of them
failures): the main steps' grade rows are all successes, and a tiny grader trained by them grades every child
alike (``experiments/sera/results/<name>_grader.md``, ``<name>_grader_sft.md``). Its main steps are the warm start
without the phase, loaded from its cache (built there first when missing). On grade rows alone the phase also moves
the acting policy (the planner fit in ``<name>_grader.md``); ``WarmStart.grader_replay`` draws that share of each of
its batches from the main rows instead (rehearsal). Early finishes are short and the planner's children long, so a
grader taught by those two alone may key on length and pass children that fail without finishing;
``WarmStart.stall_grades`` adds, where such children are graded (TextWorld-Sync), the grades of a third tree per
task whose children idle after ``id % 3`` planner turns until their turns or the world run out
(:func:`failure_children`). Each kind of failure then still stops its own way, and a grader may go by that;
``WarmStart.late_grades`` adds the grades of two trees whose children, after those turns, idle or act on their goal
in ways the world rejects, then finish at turn :data:`LATE_TURNS`: failures that stop as late as the planner's
successes (the grader probe's late-finish checks).

With ``collect.masked_logp`` each row also carries the constrained decoder's choices at every response position,
over the node's admissible replies at that turn (the world's ``admissible``, recorded as the teacher replies); the
planner's reply must be among them (TextCraft-Synth: ``env_kwargs={"planner_replies": True}``), or the warm start
stops with an error. :func:`agentjax.train.warmstart.warm_start_folder` trains these rows with the flat warm start's
NLL (:func:`~agentjax.train.warmstart.supervised`) and caches the weights under a hash of the config (the tree
settings included), as for the flat runs.
"""

from __future__ import annotations

import dataclasses
import logging
import types
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import numpy as np

from agentjax.agents.tree import NO_PARENT
from agentjax.models.constrain import constrained_choices
from agentjax.rollout.tree_collect import run_trees
from agentjax.train.runconfig import RunConfig
from agentjax.train.tree_worlds import make_judge, planner_teacher, world_factory

log = logging.getLogger(__name__)

Demo = tuple[list[int], list[int], tuple[tuple[int, ...], ...] | None]  # prompt, response, choices per position
CHUNK = 16  # trees grown per collector call
# how a teacher tree's delegated children play (teacher_trees)
CHILDREN = ("planner", "early_finish", "stall", "late_finish", "busy_finish")
LATE_TURNS = 7  # late- and busy-finish children finish at this turn (or their budget's last), as the planner's stop


def _no_sampling(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("tree warm start: a teacher run samples nothing")


def teacher_trees(run: RunConfig, tasks: Sequence[Any], tokenizer: Any, *, children: str = "planner",
                  grader: Any = None, key: jax.Array | None = None
                  ) -> tuple[Any, dict[tuple[int, int, int], list[str]]]:
    """One tree per task of ``tasks`` played by the env's planner, its delegated children as ``children`` says
    (:data:`CHILDREN`: the planner's; ``early_finish``, finishing after ``id % 3`` of the planner's turns;
    ``stall``, idling after them until their turns or the world run out; ``late_finish``, idling after them and
    finishing at turn :data:`LATE_TURNS` (or the last of its budget), so that its failures stop as late as the
    planner's children; ``busy_finish``, the same with the world's ``busy_reply`` in place of the idle one, an action
    on its goal the world rejects; module docstring), with the run's reference rubrics and grades, or
    ``grader``'s (a :class:`~agentjax.models.Sampler`: it writes and grades the rubrics, :mod:`.grader_probe`).
    Returns the :class:`~agentjax.rollout.tree_collect.TreeRollouts` and, under ``collect.masked_logp``, each turn's
    admissible replies keyed by (tree group, node id, turn). ``key`` (default ``key(0)``) draws the grader's
    rubrics."""
    config = run.tree_collect.replace(trees_per_task=1)
    make_world = world_factory(run.env, run.env_kwargs, tokenizer=tokenizer,
                               max_reply_tokens=config.max_response_tokens)
    teacher = planner_teacher(run.env, config.limits)
    reads_world = getattr(teacher, "with_world", False)
    admissible: dict[tuple[int, int, int], list[str]] = {}

    if children not in CHILDREN:
        raise ValueError(f"teacher trees: children is one of {CHILDREN}, not {children!r}")

    def teach(tree, node, world):
        if children != "planner" and node.parent != NO_PARENT and len(node.turns) >= node.id % 3:
            late = children in ("late_finish", "busy_finish") and len(node.turns) >= min(LATE_TURNS, node.budget - 1)
            if children == "early_finish" or late:
                return world.finish_reply()
            return world.busy_reply(node) if children == "busy_finish" else world.idle_reply()
        reply = teacher(tree, node, world) if reads_world else teacher(tree, node)
        if config.masked_logp:
            admissible[(tree.group, node.id, len(node.turns))] = world.admissible(tree, node)
        return reply

    teach.with_world = True  # the collector passes each tree's world

    teaching = types.SimpleNamespace(tokenizer=tokenizer, generate=_no_sampling)  # the teacher replies
    rubrics = run.rubric_collect
    if grader is not None and rubrics is not None:
        rubrics = dataclasses.replace(rubrics, scripted=False)
    rollouts = run_trees(tasks, teaching, make_world, make_judge(run.env), config,
                         jax.random.key(0) if key is None else key, teacher=teach, rubrics=rubrics, grader=grader)
    return rollouts, admissible


def _grow(run: RunConfig, tasks: Sequence[Any], tokenizer: Any, *, children: str = "planner") -> list[Demo]:
    """The rows of the planner trees of ``tasks`` (one tree each); raises ValueError if one does not fit. With
    other ``children`` only the grade rows of the delegated children (module docstring)."""
    rollouts, admissible = teacher_trees(run, tasks, tokenizer, children=children)
    return [row for _, row in tree_rows(run, rollouts, admissible, tokenizer, turns=children == "planner")]


def tree_rows(run: RunConfig, rollouts: Any, admissible: dict[tuple[int, int, int], list[str]], tokenizer: Any, *,
              turns: bool = True) -> Iterator[tuple[str, Demo]]:
    """``(kind, row)`` of every node turn of ``rollouts`` (``kind`` the reply's: act, delegate, finish, ...; with
    ``turns``) and of each child's reference rubric and grade call ("rubric", "grade"; a SERA run), in tree and
    node order; under ``collect.masked_logp`` each row carries its constrained choices over ``admissible``."""
    config = run.tree_collect
    stops, encoded = config.sampling.stop_token_ids, reply_encoder(tokenizer)
    for tree in rollouts.trees:
        for node in tree.nodes:
            for turn in node.turns if turns else ():
                yield turn.reply.kind, turn_row(run, encoded, tree, node, turn, admissible)
            for kind, call in (("rubric", node.rubric_call), ("grade", node.grade_call)):  # SERA: a child's
                if call is not None and (turns or kind == "grade"):  # reference rubric and grade
                    yield kind, _call_row(call, config.masked_logp, stops, encoded)


def turn_row(run: RunConfig, encoded: Callable[[Sequence[str]], list[list[int]]], tree: Any, node: Any, turn: Any,
             admissible: dict[tuple[int, int, int], list[str]], response: Sequence[int] | None = None) -> Demo:
    """The row of ``turn`` of ``node``: its prompt, ``response`` (default the turn's reply, stop token included)
    and, under ``collect.masked_logp``, the constrained choices over the turn's admissible replies (the response
    must be one of them). ``encoded``: :func:`reply_encoder`'s."""
    config = run.tree_collect
    response = turn.response_ids.tolist() if response is None else list(response)
    choices = None
    if config.masked_logp:
        try:
            choices = constrained_choices(encoded(admissible[(tree.group, node.id, turn.step)]),
                                          config.sampling.stop_token_ids, response)
        except ValueError:
            raise ValueError(f"tree warm start: the planner's reply {turn.reply.text!r} on task "
                             f"{tree.task.task_id!r} is not among the node's admissible replies, so the "
                             "constrained policy could not emit it; let the world offer the planner's "
                             "replies (textcraft_synth: env_kwargs planner_replies=True) or turn "
                             "collect.masked_logp off") from None
    return turn.prompt_ids.tolist(), response, choices


def reply_encoder(tokenizer: Any) -> Callable[[Sequence[str]], list[list[int]]]:
    """Replies -> their token ids (each distinct reply encoded once)."""
    cache: dict[str, list[int]] = {}

    def encoded(replies: Sequence[str]) -> list[list[int]]:
        for r in replies:
            if r not in cache:  # (not setdefault: its default would encode every time)
                cache[r] = list(tokenizer.encode(r, add_special_tokens=False))
        return [cache[r] for r in replies]

    return encoded


def _call_row(call: Any, masked_logp: bool, stops: Sequence[int], encoded: Callable[..., list[list[int]]]) -> Demo:
    """The row of a reference rubric or grade call (with its constrained choices under ``masked_logp``)."""
    response = call.response_ids.tolist()
    choices = (constrained_choices(encoded(call.choices), stops, response)
               if masked_logp and call.choices is not None else None)
    if masked_logp and choices is None:
        raise ValueError("tree warm start: with collect.masked_logp SERA's rubrics and grades must be constrained "
                         "too (tree.rubric_choices=True)")
    return call.prompt_ids.tolist(), response, choices


def failure_children(run: RunConfig, stall: bool, late: bool = False) -> tuple[str, ...]:
    """The teacher trees whose children mostly fail, graded under ``run``: the early-finish tree, with ``stall`` the
    stalled one where the run's grader is asked about children that did not finish (TextWorld-Sync; TextCraft-Synth
    scores those 0 without a call, so a stalled tree has nothing to grade there), and with ``late`` the late- and
    busy-finish ones."""
    graded = run.rubric_collect is not None and not run.rubric_collect.require_finish
    return ("early_finish", *(("stall",) if stall and graded else ()),
            *(("late_finish", "busy_finish") if late else ()))


def labelled_trees(run: RunConfig, tasks: Sequence[Any], tokenizer: Any, *, stall: bool = False, late: bool = False,
                   grader: Any = None, key: jax.Array | None = None, trees: Sequence[str] | None = None
                   ) -> Iterator[tuple[str, Any]]:
    """For each task of ``tasks``, ``(children, rollouts)`` of its planner tree, then of its failure trees
    (:func:`failure_children`; :func:`teacher_trees`), or of the ``trees`` named (:data:`CHILDREN`). With ``key``
    the trees of task ``i`` draw the grader's rubrics with ``fold_in(key, k)``: ``k`` is ``2 i`` for the planner
    tree, ``2 i + 1`` for the early-finish one, ``2**31 + i`` for the stalled one, ``2**30 + i`` for the
    late-finish one and ``2**29 + i`` for the busy-finish one. A task whose first tree does not fit is skipped
    (logged)."""
    salt = {"planner": lambda i: 2 * i, "early_finish": lambda i: 2 * i + 1, "stall": lambda i: 2**31 + i,
            "late_finish": lambda i: 2**30 + i, "busy_finish": lambda i: 2**29 + i}
    if unknown := set(trees or ()) - set(CHILDREN):
        raise ValueError(f"labelled trees: trees are among {CHILDREN}, not {sorted(unknown)}")
    for i, task in enumerate(tasks):
        for children in ("planner", *failure_children(run, stall, late)) if trees is None else trees:
            sub = None if key is None else jax.random.fold_in(key, salt[children](i))
            try:
                rollouts, _ = teacher_trees(run, [task], tokenizer, children=children, grader=grader, key=sub)
            except ValueError as e:
                log.info("task %s skipped: %s", task.task_id, e)
                break
            yield children, rollouts


def grade_rows(run: RunConfig, tasks: Sequence[Any], tokenizer: Any, *, stall: bool | None = None,
               late: bool | None = None) -> tuple[list[Demo], list[bool]]:
    """The reference grade rows of the graded children of the planner and failure trees of ``tasks`` (a SERA run;
    ``stall`` and ``late`` default ``WarmStart.stall_grades`` and ``late_grades``), with each child's verifier label:
    grader-only training data (the grader phase, ``experiments/sera/grader_sft.py``). A task whose planner tree does
    not fit is skipped."""
    ws = run.warm_start
    stall = (ws is not None and ws.stall_grades) if stall is None else stall
    late = (ws is not None and ws.late_grades) if late is None else late
    config, rows, labels, encoded = run.tree_collect, [], [], reply_encoder(tokenizer)
    for _, rollouts in labelled_trees(run, tasks, tokenizer, stall=stall, late=late):
        for node in (n for tree in rollouts.trees for n in tree.nodes[1:]):
            if node.grade_call is not None and node.label is not None:
                rows.append(_call_row(node.grade_call, config.masked_logp, config.sampling.stop_token_ids, encoded))
                labels.append(bool(node.label))
    return rows, labels


def _grow_both(run: RunConfig, tasks: Sequence[Any], tokenizer: Any) -> list[Demo]:
    """The planner trees' rows, then (``WarmStart.failure_grades``, a SERA run) the failure trees' grade rows."""
    rows = _grow(run, tasks, tokenizer)
    ws = run.warm_start
    if ws.failure_grades and run.rubric_collect is not None:
        for children in failure_children(run, ws.stall_grades, ws.late_grades):
            rows += _grow(run, tasks, tokenizer, children=children)
    return rows


def warm_start_tasks(run: RunConfig) -> list[Any]:
    """The warm start's tasks: the first ``WarmStart.episodes`` of a ``seed``-permutation of the train split."""
    ws, spec = run.warm_start, run.spec
    tasks = spec.tasks(spec.train_split)
    return [tasks[i] for i in np.random.default_rng(ws.seed).permutation(len(tasks))[:ws.episodes]]


def tree_demonstrations(run: RunConfig, tokenizer: Any) -> list[Demo]:
    """The warm start's rows (module docstring)."""
    chosen = warm_start_tasks(run)
    rows, skipped = [], 0
    for start in range(0, len(chosen), CHUNK):
        chunk = chosen[start:start + CHUNK]
        try:
            rows += _grow_both(run, chunk, tokenizer)
            continue
        except ValueError as e:
            if "admissible replies" in str(e):
                raise
        for task in chunk:  # one of the chunk has no planner tree that fits: find it
            try:
                rows += _grow_both(run, [task], tokenizer)
            except ValueError as e:
                if "admissible replies" in str(e):
                    raise
                skipped += 1
                log.info("tree warm start: task %s skipped: %s", task.task_id, e)
    if skipped:
        log.warning("tree warm start: %d of %d tasks have no planner tree that fits; skipped", skipped, len(chosen))
    log.info("tree warm start: %d planner trees, %d node turns", len(chosen) - skipped, len(rows))
    return rows


__all__ = ["CHILDREN", "LATE_TURNS", "failure_children", "grade_rows", "labelled_trees", "reply_encoder",
           "teacher_trees", "tree_demonstrations", "tree_rows", "turn_row", "warm_start_tasks"]
