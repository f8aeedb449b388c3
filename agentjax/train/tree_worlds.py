"""The environments a tree run trains on: each env's shared tree world, its offline judge and its planner teacher.

A tree run (RAO, :mod:`agentjax.train.trees`) names its env like a flat run (``--env``); this module turns the
name and ``env_kwargs`` into what the tree collector (:func:`agentjax.rollout.tree_collect.run_trees`) takes:

=================  ==========================================  ==============================  ======================
env                world (``env_kwargs`` are its config)        judge (child labels)            warm-start teacher
=================  ==========================================  ==============================  ======================
textcraft_synth    ``TextCraftTreeWorld`` (the fields of        program check                   ``PlannerTeacher``
                   ``TextCraftTreeConfig``)                     (``ProgramJudge``)              (planner trees)
textworld_sync     ``TextWorldTreeWorld`` (the fields of        the subtask verifier            ``SyncPlannerTeacher``
                   ``TextWorldTreeConfig``: the shared budget)  (``SyncVerifierJudge``)         (one child per dish)
=================  ==========================================  ==============================  ======================

(:mod:`agentjax.agents.textcraft_tree`, :mod:`agentjax.agents.textworld_tree`.) The judge is built fresh for every
collection, so its counters (``judge/calls``, tokens, …) are per batch. TextWorld-Sync trains with a shared budget of
100 steps (``env_kwargs={"budget": 100}``) and evaluates with each task's own (``eval_env_kwargs={"budget": None,
"lookup_style": "evaluation"}``, the released evaluator).
"""

from __future__ import annotations

import functools
import importlib
import inspect
from collections.abc import Callable, Mapping
from typing import Any

from agentjax.agents.judge import Judge, ProgramJudge
from agentjax.agents.textcraft_tree import PlannerTeacher, TextCraftTreeConfig, TextCraftTreeWorld
from agentjax.agents.tree import TreeLimits, TreeWorld
from envs.base import Task

TREE_ENVS = ("textcraft_synth", "textworld_sync")
TEXTWORLD_TREE = "agentjax.agents.textworld_tree"  # the TextWorld-Sync adapter's module


def _textworld() -> Any:
    """The TextWorld-Sync tree adapter's module, or a clear error while it is missing."""
    try:
        module = importlib.import_module(TEXTWORLD_TREE)
    except ModuleNotFoundError as e:
        if e.name != TEXTWORLD_TREE:
            raise
        module = None
    needed = ("TextWorldTreeWorld", "TextWorldTreeConfig", "SyncVerifierJudge", "SyncPlannerTeacher")
    if module is None or not all(hasattr(module, name) for name in needed):
        raise NotImplementedError(f"textworld_sync trees are not wired yet: {TEXTWORLD_TREE} (the TextWorld-Sync "
                                  f"tree world: {', '.join(needed)}) is missing; train RAO on textcraft_synth")
    return module


def _check(env: str) -> None:
    if env not in TREE_ENVS:
        raise ValueError(f"no tree world for {env!r}; the tree envs are {', '.join(TREE_ENVS)}")


class CappedReplies:
    """A tree world whose admissible replies are only those that fit ``max_tokens`` response tokens with the stop
    token (constrained decoding refuses a longer one; e.g. a planner reply packing many crafts on an extreme task)."""

    def __init__(self, world: TreeWorld, tokenizer: Any, max_tokens: int, lengths: dict[str, int]):
        self.inner, self._tokenizer, self._max, self._lengths = world, tokenizer, max_tokens, lengths

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def admissible(self, tree: Any, node: Any) -> list[str]:
        out = []
        for reply in self.inner.admissible(tree, node):
            if reply not in self._lengths:
                self._lengths[reply] = len(self._tokenizer.encode(reply, add_special_tokens=False))
            if self._lengths[reply] < self._max:
                out.append(reply)
        return out

    def fork(self, node: Any) -> CappedReplies:
        """The inner world's fork (SERA's branches and search candidates), capped the same way."""
        return CappedReplies(self.inner.fork(node), self._tokenizer, self._max, self._lengths)

    def adopt(self, twin: CappedReplies) -> None:
        self.inner.adopt(twin.inner if isinstance(twin, CappedReplies) else twin)


def world_factory(env: str, kwargs: Mapping[str, Any], *, tokenizer: Any = None,
                  max_reply_tokens: int | None = None) -> Callable[[Task], TreeWorld]:
    """``factory(task) -> world``: a fresh shared world per tree of ``env`` configured by ``kwargs``; with a
    ``tokenizer`` and ``max_reply_tokens``, its admissible replies cut to those that fit (:class:`CappedReplies`)."""
    _check(env)
    if env == "textcraft_synth":
        make = functools.partial(TextCraftTreeWorld, config=TextCraftTreeConfig(**kwargs))
    else:
        module = _textworld()
        make = functools.partial(module.TextWorldTreeWorld, config=module.TextWorldTreeConfig(**kwargs))
    if tokenizer is None or max_reply_tokens is None:
        return make
    lengths: dict[str, int] = {}
    return lambda task: CappedReplies(make(task), tokenizer, max_reply_tokens, lengths)


def make_judge(env: str) -> Judge:
    """The offline judge of ``env``'s children (module docstring), with fresh counters."""
    _check(env)
    if env == "textcraft_synth":
        return ProgramJudge()
    return _textworld().SyncVerifierJudge()


def planner_teacher(env: str, limits: TreeLimits) -> Callable[..., str]:
    """``env``'s planner as the tree collector's teacher (the warm start's demonstrations): ``teacher(tree, node)``,
    or ``teacher(tree, node, world)`` where ``teacher.with_world`` (it reads the live world)."""
    _check(env)
    if env == "textcraft_synth":
        return PlannerTeacher(limits=limits)
    return _textworld().SyncPlannerTeacher()


def check_world_kwargs(env: str, kwargs: Mapping[str, Any], name: str = "env_kwargs") -> None:
    """Raises ``ValueError`` if ``kwargs`` do not fit ``env``'s tree world (``NotImplementedError`` while
    textworld_sync is not wired)."""
    _check(env)
    target: Any = TextCraftTreeConfig if env == "textcraft_synth" else _textworld().TextWorldTreeConfig
    try:
        inspect.signature(target).bind(**kwargs)
    except TypeError as e:
        raise ValueError(f"RunConfig.{name}={dict(kwargs)} do not fit {env}'s tree world ({target.__name__}): "
                         f"{e}") from None


__all__ = ["TREE_ENVS", "CappedReplies", "check_world_kwargs", "make_judge", "planner_teacher", "world_factory"]
