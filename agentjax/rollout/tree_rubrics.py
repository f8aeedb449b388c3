"""SERA's rubric-writing and grading calls inside the tree collector, batched across all pending children.

METHODS.md "SERA" 2–3; :mod:`agentjax.agents.rubric` has the formats, prompts and parsers. With rubrics on
(``run_trees(..., rubrics=RubricConfig())``) the collector makes two more kinds of policy call:

- :func:`write_rubrics`, right after the replies of a turn: for every child launched in that turn (in every tree),
  its parent's side writes the child's rubric — one ``generate`` call for all of them at ``config.writing``
  (temperature 1). The request is the parent's goal, its trajectory and state as its world's judge request renders
  them now (before the child has run), the delegating reply and the child's goal and budget. The parsed rubric is
  frozen on the child (``Node.rubric``) before the child's first turn; a reply that does not parse leaves it None
  and is counted (``rubric/failures``). The call's tokens and log-probs are kept (``Node.rubric_call``): the rubric
  stage trains them.
- :func:`grade_children`, after the judge labelled the children that stopped in a turn: every child with a rubric is
  graded in one ``generate`` call at ``config.grading`` (temperature 0, no gradient) from the frozen rubric and the
  child's judge request (goal, trajectory, finish message, final state). Its score (``Node.score``, the reward of
  :func:`~agentjax.agents.rubric.grade_reward` under ``config.reading``) is SERA's execution reward of the child.
  A child without a rubric or whose grade does not parse (:func:`~agentjax.agents.rubric.parse_grade`) has no score
  and is dropped from the gradient (``grade/failures``). A child that did not finish scores 0 without a call when
  ``config.require_finish`` (its rubric's gate cannot hold); a run sets it as its env's judge does
  (:attr:`~agentjax.train.runconfig.RunConfig.rubric_collect`: TextCraft-Synth on, TextWorld-Sync off, where a
  child whose action ends the shared task never gets to finish and the released code grades every child).

With a teacher playing the nodes (warm-start data; or ``RubricConfig.scripted``) nothing is sampled: the rubric is
:func:`~agentjax.agents.rubric.reference_rubric` and the grade :func:`~agentjax.agents.rubric.reference_grade` of
the child's verifier label — demonstrations of the formats. With ``constrained`` (tiny policies, like their
constrained node replies) the writer chooses among :func:`~agentjax.agents.rubric.rubric_choices` (the reference
rubric under four weightings) and the grader among :func:`~agentjax.agents.rubric.grade_choices` (failure, or
success at four levels); a teacher's grade is the nearest of them, and with ``one_pass`` a policy that has
``choose`` (:class:`~agentjax.rollout.policy.Chooser`; the sampler has it) scores the whole answers in one pass
instead of a decode step per token (the same distribution). :class:`RubricCounters` counts calls, requests,
tokens, failures and the agreement of the policy's success flag with the verifier's label (``grade/agreement``, the
calibration the rubric stage trains).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax
import numpy as np

from agentjax.agents.judge import JudgeRequest
from agentjax.agents.prompts import encode_prompt
from agentjax.agents.rubric import (
    GRADE_LEVELS,
    MAX_CONTEXT_CHARS,
    MAX_CRITERIA,
    MIN_CRITERIA,
    Reading,
    RubricError,
    RubricRequest,
    format_grade,
    grade_choices,
    grade_reward,
    grading_messages,
    level_grade,
    parse_grade,
    parse_rubric,
    reference_grade,
    reference_rubric,
    rubric_choices,
    rubric_messages,
)
from agentjax.agents.tree import Node, PolicyCall, Tree, TreeWorld
from agentjax.rollout.calls import ReplyTokens, generate_batch, scripted_output
from agentjax.rollout.policy import CHAT_STOP_IDS, Chooser, Policy, SamplingParams, Tokenizer


@dataclasses.dataclass(frozen=True)
class RubricConfig:
    """How the collector writes and grades rubrics (module docstring)."""

    reading: Reading = "final"  # a child's reward: the grade's final score (released) or gate · Σ w s (paper)
    writing: SamplingParams = SamplingParams(temperature=1.0, max_new_tokens=512, stop_token_ids=CHAT_STOP_IDS,
                                             prompt_bucket=256)
    grading: SamplingParams = SamplingParams(temperature=0.0, max_new_tokens=256, stop_token_ids=CHAT_STOP_IDS,
                                             prompt_bucket=256)
    max_prompt_tokens: int = 4096  # longer prompts keep their last tokens (the request and the format sit there)
    min_criteria: int = MIN_CRITERIA
    max_criteria: int = MAX_CRITERIA
    max_context_chars: int = MAX_CONTEXT_CHARS
    require_finish: bool = True  # a child that did not finish scores 0 without a grading call (runs: as the judge)
    batch_bucket: int = 8
    constrained: bool = False  # choose among agents.rubric.rubric_choices / grade_choices (tiny policies)
    max_trie_edges: int = 8192
    sparse_logits: bool = False  # constrained calls from the allowed tokens' logits only (Sampler sparse=)
    one_pass: bool = False  # constrained calls in one teacher-forced pass (Sampler.choose) when the policy has it
    scripted: bool | None = None  # reference rubrics and grades instead of the policy's (None: when a teacher plays)

    def __post_init__(self):
        if not 1 <= self.min_criteria <= self.max_criteria:
            raise ValueError(f"RubricConfig: 1 <= min_criteria <= max_criteria, got {self.min_criteria}, "
                             f"{self.max_criteria}")
        if self.reading not in ("final", "weighted"):
            raise ValueError(f"RubricConfig.reading is 'final' or 'weighted', got {self.reading!r}")
        if min(self.max_prompt_tokens, self.batch_bucket) < 1:
            raise ValueError("RubricConfig: max_prompt_tokens and batch_bucket must be >= 1")


@dataclasses.dataclass(frozen=True)
class ForkConfig:
    """SERA's counterfactual fork groups for the rubric stage (METHODS.md "SERA" 5)."""

    branches: int = 8  # children per fork group: branch 0 is committed to the tree, the others run on clones
    budget: int = 16  # forked environments per tree (branch 0 counted): budget // branches groups a tree

    def __post_init__(self):
        if self.branches < 2 or self.budget < self.branches:
            raise ValueError(f"ForkConfig: at least 2 branches and a budget of at least one group, got {self}")


@dataclasses.dataclass
class ForkGroup:
    """One delegated child and its counterfactual branches, graded with the child's one rubric."""

    tree: int  # the main tree's position in TreeRollouts.trees
    child: Node  # branch 0, committed to the tree
    branches: tuple[Node, ...]  # the branches' first agents, branch 0 (the child) first
    fork_trees: tuple[Tree, ...]  # the trees of branches 1.. (their roots play the child on clones of its world)

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``[I]`` the policy's final scores, the labels and validity of the branches: valid with a label and a
        score (a grade that parsed, or 0 without a call for a branch that did not finish)."""
        score = np.array([n.grade.final_score if n.grade is not None else n.score or 0.0 for n in self.branches],
                         np.float32)
        label = np.array([bool(n.label) for n in self.branches], bool)
        valid = np.array([n.score is not None and n.label is not None for n in self.branches], bool)
        return score, label, valid


def open_fork_group(t: int, tree: Tree, world: TreeWorld, child: Node, config: ForkConfig
                    ) -> tuple[ForkGroup, list[tuple[Tree, TreeWorld]]] | None:
    """A fork group for ``child`` (just launched and begun in ``tree``) if the tree's fork budget allows: each branch
    ≥ 1 is a fork tree whose root replays the child's start — same goal, depth, budget and first message — on
    ``world.fork(child)``, an isolated clone of the world as the child found it. Returns the group and the new
    (tree, world) pairs to run, or None (budget spent, or a fork tree would itself fork)."""
    if tree.fork is not None or tree.forked_envs + config.branches > config.budget:
        return None
    tree.forked_envs += config.branches
    pairs, roots = [], [child]
    for branch in range(1, config.branches):
        twin = world.fork(child)
        fork = Tree(tree.task, tree.group, tree.index, tree.task_index, tree.limits, child_reward=tree.child_reward,
                    fork=(t, child.id, branch), origin_path=tree.path(child))
        root = fork.add_root(child.goal, depth=child.depth, budget=child.budget)
        root.intro, root.start_state = child.intro, child.start_state
        pairs.append((fork, twin))
        roots.append(root)
    return ForkGroup(t, child, tuple(roots), tuple(f for f, _ in pairs)), pairs


@dataclasses.dataclass
class RubricCounters:
    """Counters of one collection's rubric and grading calls (:meth:`as_dict` for the metrics)."""

    rubric_calls: int = 0  # generate calls
    rubrics: int = 0  # rubrics asked for (children launched)
    rubric_failures: int = 0
    rubric_input_tokens: int = 0
    rubric_output_tokens: int = 0
    grade_calls: int = 0
    grades: int = 0  # children graded by the policy
    grade_failures: int = 0  # graded children whose grade did not parse
    ungraded: int = 0  # children without a rubric (no grade, no score)
    unfinished: int = 0  # children scored 0 without a call (did not finish)
    grade_input_tokens: int = 0
    grade_output_tokens: int = 0
    agree: int = 0  # graded children whose success flag equals the verifier's label
    compared: int = 0  # graded children with a label

    def as_dict(self) -> dict[str, float]:
        out = {f"rubric/{k.removeprefix('rubric_') if k != 'rubrics' else 'requests'}": float(v)
               for k, v in dataclasses.asdict(self).items() if k.startswith("rubric")}
        out |= {f"grade/{k.removeprefix('grade_') if k != 'grades' else 'requests'}": float(v)
                for k, v in dataclasses.asdict(self).items() if k.startswith("grade")}
        out |= {"grade/ungraded": float(self.ungraded), "grade/unfinished": float(self.unfinished),
                "grade/agreement": self.agree / self.compared if self.compared else 0.0}
        return out


def _calls(policy: Policy, tokenizer: Tokenizer, messages: list[list[dict[str, str]]], texts: list[str] | None,
           choices: list[list[str]] | None, params: SamplingParams, config: RubricConfig, key: jax.Array
           ) -> list[PolicyCall]:
    """One batched policy call (or the scripted ``texts``) for ``messages``, over ``choices`` when given
    (constrained decoding; ``sparse_logits``: the same constrained distribution and log-probs, other random numbers);
    a :class:`PolicyCall` each."""
    prompts = [encode_prompt(tokenizer, m)[-config.max_prompt_tokens:] for m in messages]
    if texts is not None:
        stop = params.stop_token_ids[0] if params.stop_token_ids else None
        out = scripted_output(tokenizer, texts, params.max_new_tokens, stop)
    elif choices is not None and config.one_pass and isinstance(policy, Chooser):  # the same distribution
        out = policy.choose(prompts, choices, params, key)
    else:
        allowed = None if choices is None else ReplyTokens(tokenizer).rows(choices, params.max_new_tokens)
        out, _ = generate_batch(policy, prompts, params, key, bucket=config.batch_bucket, allowed=allowed,
                                max_trie_edges=config.max_trie_edges, sparse=config.sparse_logits)
    calls = []
    for j, prompt in enumerate(prompts):
        n = int(out.length_b[j])
        calls.append(PolicyCall(prompt_ids=np.asarray(prompt, np.int32), response_ids=out.tokens_bt[j, :n].astype(
            np.int32), logp=out.logp_bt[j, :n].astype(np.float32), text=out.texts[j],
            choices=None if choices is None else tuple(choices[j])))
    return calls


def rubric_request(world: TreeWorld, tree: Tree, child: Node) -> RubricRequest:
    """What the child's parent sees at the delegation (module docstring)."""
    parent = tree.nodes[child.parent]
    seen: JudgeRequest = world.judge_request(parent)
    return RubricRequest(parent_task=parent.goal.text, parent_trajectory=seen.trajectory,
                         delegation=parent.turns[-1].reply.text if parent.turns else "", child_goal=child.goal.text,
                         state=seen.final_state, tools=getattr(world, "tools", ""), budget=child.budget)


def write_rubrics(policy: Policy, tokenizer: Tokenizer, jobs: Sequence[tuple[TreeWorld, Tree, Node]],
                  config: RubricConfig, key: jax.Array, counters: RubricCounters, *, teacher: bool = False) -> None:
    """Each child of ``jobs`` (world, tree, child just launched) gets its frozen rubric, or None (module docstring)."""
    if not jobs:
        return
    messages = [rubric_messages(rubric_request(w, t, c), min_criteria=config.min_criteria,
                                max_criteria=config.max_criteria, max_context_chars=config.max_context_chars)
                for w, t, c in jobs]
    texts = [reference_rubric(c.goal.text, c.budget).to_json() for _, _, c in jobs] if teacher else None
    choices = [rubric_choices(c.goal.text, c.budget) for _, _, c in jobs] if config.constrained else None
    calls = _calls(policy, tokenizer, messages, texts, choices, config.writing, config, key)
    counters.rubric_calls += int(not teacher)
    counters.rubrics += len(jobs)
    for (_, _, child), call in zip(jobs, calls, strict=True):
        counters.rubric_input_tokens += len(call.prompt_ids)
        counters.rubric_output_tokens += len(call.response_ids)
        child.rubric_call = call
        try:
            child.rubric = parse_rubric(call.text, min_criteria=config.min_criteria, max_criteria=config.max_criteria)
        except RubricError as error:
            call.error = str(error)
            counters.rubric_failures += 1


def grade_children(policy: Policy, tokenizer: Tokenizer, jobs: Sequence[tuple[Node, JudgeRequest]],
                   config: RubricConfig, key: jax.Array, counters: RubricCounters, *, teacher: bool = False) -> None:
    """Each stopped child of ``jobs`` (child, its judge request) gets its grade and score (module docstring). Call
    after the judge, so that ``Node.label`` is set (the teacher's grades and the agreement counter read it)."""
    asked = []
    for child, request in jobs:
        if child.rubric is None:
            counters.ungraded += 1
        elif config.require_finish and not request.finished:
            counters.unfinished += 1
            child.score = 0.0
        else:
            asked.append((child, request))
    if not asked:
        return
    messages = [grading_messages(c.rubric, r, max_context_chars=config.max_context_chars) for c, r in asked]
    texts = None
    if teacher:
        grades = [reference_grade(c.rubric, bool(c.label), finished=c.finished, steps=len(c.turns), budget=c.budget,
                                  invalid=sum(not u.valid for u in c.turns)) for c, _ in asked]
        if config.constrained:  # the nearest of the grades the constrained grader may give (failure stays failure)
            grades = [level_grade(c.rubric, min(GRADE_LEVELS, key=lambda v: abs(v - g.final_score)) if g.success
                                  else 0.0) for (c, _), g in zip(asked, grades, strict=True)]
        texts = [format_grade(g, c.rubric) for (c, _), g in zip(asked, grades, strict=True)]
    choices = [grade_choices(c.rubric) for c, _ in asked] if config.constrained else None
    calls = _calls(policy, tokenizer, messages, texts, choices, config.grading, config, key)
    counters.grade_calls += int(not teacher)
    counters.grades += len(asked)
    for (child, _), call in zip(asked, calls, strict=True):
        counters.grade_input_tokens += len(call.prompt_ids)
        counters.grade_output_tokens += len(call.response_ids)
        child.grade_call = call
        try:
            child.grade = parse_grade(call.text, child.rubric)
        except RubricError as error:
            call.error = str(error)
            counters.grade_failures += 1
            continue
        child.score = grade_reward(child.grade, child.rubric, config.reading)
        if child.label is not None:
            counters.compared += 1
            counters.agree += int(child.grade.success == bool(child.label))


__all__ = ["ForkConfig", "ForkGroup", "RubricConfig", "RubricCounters", "grade_children", "open_fork_group",
           "rubric_request", "write_rubrics"]
