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
does its subtask, so every demonstrated grade is a success: the warm start shows the grader no failing child.

With ``collect.masked_logp`` each row also carries the constrained decoder's choices at every response position,
over the node's admissible replies at that turn (the world's ``admissible``, recorded as the teacher replies); the
planner's reply must be among them (TextCraft-Synth: ``env_kwargs={"planner_replies": True}``), or the warm start
stops with an error. :func:`agentjax.train.warmstart.warm_start_folder` trains these rows with the flat warm start's
NLL (:func:`~agentjax.train.warmstart.supervised`) and caches the weights under a hash of the config (the tree
settings included), as for the flat runs.
"""

from __future__ import annotations

import logging
import types
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import numpy as np

from agentjax.rollout.policy import constrained_choices
from agentjax.rollout.tree_collect import run_trees
from agentjax.train.runconfig import RunConfig
from agentjax.train.tree_worlds import make_judge, planner_teacher, world_factory

log = logging.getLogger(__name__)

Demo = tuple[list[int], list[int], tuple[tuple[int, ...], ...] | None]  # prompt, response, choices per position
CHUNK = 16  # trees grown per collector call


def _no_sampling(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("tree warm start: a teacher run samples nothing")


def teacher_trees(run: RunConfig, tasks: Sequence[Any], tokenizer: Any
                  ) -> tuple[Any, dict[tuple[int, int, int], list[str]]]:
    """One tree per task of ``tasks`` played by the env's planner, with the run's reference rubrics and grades (a
    SERA run). Returns the :class:`~agentjax.rollout.tree_collect.TreeRollouts` and, under ``collect.masked_logp``,
    each turn's admissible replies keyed by (tree group, node id, turn)."""
    config = run.tree_collect.replace(trees_per_task=1)
    make_world = world_factory(run.env, run.env_kwargs, tokenizer=tokenizer,
                               max_reply_tokens=config.max_response_tokens)
    teacher = planner_teacher(run.env, config.limits)
    reads_world = getattr(teacher, "with_world", False)
    admissible: dict[tuple[int, int, int], list[str]] = {}

    def teach(tree, node, world):
        reply = teacher(tree, node, world) if reads_world else teacher(tree, node)
        if config.masked_logp:
            admissible[(tree.group, node.id, len(node.turns))] = world.admissible(tree, node)
        return reply

    teach.with_world = True  # the collector passes each tree's world

    teaching = types.SimpleNamespace(tokenizer=tokenizer, generate=_no_sampling)  # the teacher replies
    rollouts = run_trees(tasks, teaching, make_world, make_judge(run.env), config, jax.random.key(0), teacher=teach,
                         rubrics=run.rubric_collect)
    return rollouts, admissible


def _grow(run: RunConfig, tasks: Sequence[Any], tokenizer: Any) -> list[Demo]:
    """The rows of the planner trees of ``tasks`` (one tree each); raises ValueError if one does not fit."""
    rollouts, admissible = teacher_trees(run, tasks, tokenizer)
    return [row for _, row in tree_rows(run, rollouts, admissible, tokenizer)]


def tree_rows(run: RunConfig, rollouts: Any, admissible: dict[tuple[int, int, int], list[str]], tokenizer: Any
              ) -> Iterator[tuple[str, Demo]]:
    """``(kind, row)`` of every node turn of ``rollouts`` (``kind`` the reply's: act, delegate, finish, ...) and of
    each child's reference rubric and grade call ("rubric", "grade"; a SERA run), in tree and node order; under
    ``collect.masked_logp`` each row carries its constrained choices over ``admissible``."""
    config = run.tree_collect
    stops, encoded = config.sampling.stop_token_ids, reply_encoder(tokenizer)
    for tree in rollouts.trees:
        for node in tree.nodes:
            for turn in node.turns:
                yield turn.reply.kind, turn_row(run, encoded, tree, node, turn, admissible)
            for kind, call in (("rubric", node.rubric_call), ("grade", node.grade_call)):  # SERA: a child's
                if call is not None:  # reference rubric and grade
                    yield kind, _call_row(call, config.masked_logp, stops, encoded)


def turn_row(run: RunConfig, encoded: Callable[[Sequence[str]], list[list[int]]], tree: Any, node: Any, turn: Any,
             admissible: dict[tuple[int, int, int], list[str]]) -> Demo:
    """The row of ``turn`` of ``node``: its prompt, its reply (stop token included) and, under
    ``collect.masked_logp``, the constrained choices over the turn's admissible replies (the reply must be one of
    them). ``encoded``: :func:`reply_encoder`'s."""
    config = run.tree_collect
    response = turn.response_ids.tolist()
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
            rows += _grow(run, chunk, tokenizer)
            continue
        except ValueError as e:
            if "admissible replies" in str(e):
                raise
        for task in chunk:  # one of the chunk has no planner tree that fits: find it
            try:
                rows += _grow(run, [task], tokenizer)
            except ValueError as e:
                if "admissible replies" in str(e):
                    raise
                skipped += 1
                log.info("tree warm start: task %s skipped: %s", task.task_id, e)
    if skipped:
        log.warning("tree warm start: %d of %d tasks have no planner tree that fits; skipped", skipped, len(chosen))
    log.info("tree warm start: %d planner trees, %d node turns", len(chosen) - skipped, len(rows))
    return rows


__all__ = ["reply_encoder", "teacher_trees", "tree_demonstrations", "tree_rows", "turn_row", "warm_start_tasks"]
