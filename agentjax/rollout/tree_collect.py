"""The tree collector: K recursive-agent trees per root task, one batched policy call per turn, a `TreeBatch` out.

``collect_trees(tasks, policy, world_factory, judge, config, key)`` grows ``K = config.trees_per_task`` trees
(:class:`agentjax.agents.tree.Tree`) per task, each over its own shared world (``world_factory(task)``, a
:class:`~agentjax.agents.tree.TreeWorld`; TextCraft: :class:`agentjax.agents.textcraft_tree.TextCraftTreeWorld`),
and returns them as one :class:`~agentjax.rollout.tree_batch.TreeBatch` plus statistics. It is :func:`run_trees`
(the loop, host records) followed by :func:`to_tree_batch` and :func:`tree_stats`. Each turn:

1. *Prompts* of every ``RUNNING`` node of every tree (a node waiting for its children is not live;
   :func:`~agentjax.rollout.tree_prompts.node_prompt`): a system message (the world's grammar; ``launch_subagent`` /
   ``<delegate>`` only while the node may delegate), the node's first message (goal, state at its start), then its
   own turns as assistant replies and user feedback (the last ``history_length``; older turns are dropped first when
   the prompt passes ``max_prompt_tokens``, then ``truncation`` applies as in the flat collector).
2. *One* ``policy.generate`` call for all of them — the policy call the flat collector makes
   (:func:`~agentjax.rollout.calls.generate_batch`): the same padding to ``batch_bucket`` with dummy rows, per-turn
   keys ``fold_in(key, turn)`` (``row_keys``: one stream per tree slot and node), and constrained decoding over
   ``world.admissible(tree, node)`` (``constrained``; tiny untrained policies). With a ``teacher`` (e.g. the planner's,
   :class:`~agentjax.agents.textcraft_tree.PlannerTeacher`) its replies are used instead and nothing is sampled
   (warm-start data; ``behaviour_logp`` = 0); a teacher is asked for a node's reply just before that reply runs in
   step 3, so a state-reading teacher (``teacher.with_world``: called as ``teacher(tree, node, world)``; TextWorld-
   Sync's planner) sees what its siblings did earlier in the turn.
3. *Replies*, node by node in a fixed order (tree, then node id): parsed by the world's grammar; environment calls
   run through the world, each atomic (siblings of one delegation act in the same turns and see each other's
   effects in that order); a finish stops the node; a delegation the tree allows (depth, children, nodes) and the
   world accepts spawns children that start next turn while the parent waits; anything invalid costs the penalty
   and shows the error (with ``world.status(node)`` when the world has it). A node whose budget (turns) is spent
   without finishing is ``EXHAUSTED``. A world with ``ended()`` (TextWorld-Sync: task done or failed, shared step
   budget spent) ends every agent's episode: the sampled replies of that turn still to run are recorded but not run
   (``NodeTurn.executed`` False, no penalty unless malformed; a teacher is not asked), and after the turn every node
   of the tree that has not stopped is ``ENDED`` (deepest first; a waiting parent gets its children's results for
   the record).
4. *After the turn*: a waiting parent whose children have all stopped gets their finish messages as the result of
   its delegation turn (and ``world.status(node)``) and runs again (or is exhausted if it has no turn left); the
   children that stopped are judged in one batched judge call (``judge``: :mod:`agentjax.agents.judge`); a stopped
   root fixes the tree's outcome.

Trees still running after ``max_turns`` turns are cut (status ``CUT``: truncated, a failure); a node ``ENDED`` by a
won world is terminated, by a spent budget truncated. Rewards per row:
``-invalid_penalty`` on an invalid turn, plus ``success_reward`` on the root's last row when the root succeeded; the
node-level reward inputs (labels, outcomes) are in ``TreeBatch.trees``.

The loop is a :class:`TreeState` (what the call was given, and the trees, worlds, pending judge requests, fork and
search groups and counters it grows) and one function per phase of a turn: ``_prompts`` (1), ``_generate`` (2),
``_replies`` (3), then SERA's ``_advance_searches`` and ``_write_rubrics``, ``_settle`` (4) and ``_judge_stopped``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import numpy as np

from agentjax.agents.tree import NO_PARENT, Node, NodeTurn, Status, Tree, TreeWorld
from agentjax.rollout.calls import ReplyTokens, generate_batch, scripted_output, tokenizer_of
from agentjax.rollout.policy import Policy, SampleOutput, Tokenizer, constrained_choices
from agentjax.rollout.tree_batch import TreeBatch
from agentjax.rollout.tree_config import TreeCollectConfig
from agentjax.rollout.tree_prompts import node_prompt, token_roles
from agentjax.rollout.tree_records import TreeRollouts, to_tree_batch, tree_stats
from agentjax.rollout.tree_rubrics import (
    ForkConfig,
    ForkGroup,
    RubricConfig,
    RubricCounters,
    grade_children,
    open_fork_group,
    write_rubrics,
)
from agentjax.rollout.tree_search import NOT_RUN, SearchConfig, SearchGroup, commit, open_search, select
from envs.base import Task

Teacher = Callable[..., str]  # teacher(tree, node) -> reply; teacher(tree, node, world) when teacher.with_world
Judge = Callable[[Sequence[Any]], list[Any]]  # judge(requests) -> verdicts (agentjax.agents.judge)
Live = list[tuple[int, Node]]  # the live nodes of a turn: (tree slot, node), in tree then node order


@dataclasses.dataclass
class Seconds:
    """Where a collection spent its host time."""

    prompt: float = 0.0  # building and encoding prompts and admissible replies
    generate: float = 0.0  # the policy's calls (and a teacher's replies)
    env: float = 0.0  # the worlds: starting nodes, running replies, stopping nodes
    judge: float = 0.0
    rubric: float = 0.0  # SERA's rubric writing and grading calls

    @contextlib.contextmanager
    def timed(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        yield
        setattr(self, name, getattr(self, name) + time.perf_counter() - start)


@dataclasses.dataclass
class TreeState:
    """One :func:`run_trees` call: what it was given (arguments there) and what its phases grow."""

    config: TreeCollectConfig
    policy: Policy
    grader: Policy  # writes and grades rubrics
    judge: Judge
    key: jax.Array
    tokenizer: Tokenizer
    teacher: Teacher | None
    rubrics: RubricConfig | None
    forks: ForkConfig | None
    search: SearchConfig | None
    scripted: bool  # reference rubrics and grades instead of the grader's (RubricConfig.scripted)
    tree_offset: int
    replies: ReplyTokens  # the token ids of admissible replies, encoded once
    trees: list[Tree] = dataclasses.field(default_factory=list)  # main trees (group-major), then fork / candidates
    worlds: list[TreeWorld] = dataclasses.field(default_factory=list)  # worlds[t]: the shared world of trees[t]
    requests: list[tuple[Tree, Node, Any]] = dataclasses.field(default_factory=list)  # stopped, to be judged
    launched: list[tuple[TreeWorld, Tree, Node]] = dataclasses.field(default_factory=list)  # rubric due this turn
    fork_groups: list[ForkGroup] = dataclasses.field(default_factory=list)
    searches: list[SearchGroup] = dataclasses.field(default_factory=list)
    searched: dict[int, int] = dataclasses.field(default_factory=dict)  # candidates created per main tree (cap)
    not_run: int = 0  # children past the search's fork cap
    counters: RubricCounters = dataclasses.field(default_factory=RubricCounters)
    live_per_call: list[int] = dataclasses.field(default_factory=list)
    padded_per_call: list[int] = dataclasses.field(default_factory=list)
    seconds: Seconds = dataclasses.field(default_factory=Seconds)


def run_trees(
    tasks: Sequence[Task],
    policy: Policy,
    world_factory: Callable[[Task], TreeWorld],
    judge: Judge,
    config: TreeCollectConfig,
    key: jax.Array,
    *,
    teacher: Teacher | None = None,
    task_indices: Sequence[int] | None = None,
    rubrics: RubricConfig | None = None,
    forks: ForkConfig | None = None,
    search: SearchConfig | None = None,
    grader: Policy | None = None,
    tree_offset: int = 0,
) -> TreeRollouts:
    """The tree loop of :func:`collect_trees` (module docstring), returning host records.

    Args:
      tasks: the root tasks, one group of ``K`` trees each.
      policy: a policy of :mod:`agentjax.rollout.policy` (``generate`` and ``tokenizer``; e.g.
        :class:`~agentjax.models.Sampler`); with a ``teacher`` only its tokenizer is used.
      world_factory: a fresh shared world per tree.
      judge: a :class:`~agentjax.agents.judge.Judge` (``judge(requests) -> verdicts``, with ``metrics``).
      config: :class:`TreeCollectConfig`.
      key: PRNG key; turn ``t`` samples with ``fold_in(key, t)``.
      teacher: ``teacher(tree, node) -> reply`` instead of sampling.
      task_indices: the StepBatch ``task`` id of each task (default its position).
      rubrics: SERA's rubric writing and grading (:mod:`agentjax.rollout.tree_rubrics`): children's rewards become
        their rubric scores (``Tree.child_reward = "score"``); None: RAO's labels.
      forks: SERA's rubric stage (needs ``rubrics``): a launched child gets a fork group while its tree's fork
        budget lasts (:func:`~agentjax.rollout.tree_rubrics.open_fork_group`; its branches run as fork trees in the
        same policy calls), and only fork groups get a rubric (the child's, frozen before any branch starts) and
        grades (each branch, after it stopped and was labelled); ``TreeRollouts.forks`` holds them.
      search: SERA's rubric-guided search at inference (needs ``rubrics``; :mod:`agentjax.rollout.tree_search`):
        delegated children resolved one at a time, each as N candidate subtrees on clones, the best-graded one
        committed; ``TreeRollouts.searches`` holds the groups.
      grader: the policy that writes and grades rubrics (default ``policy``; the paper's untrained-grader control).
      tree_offset: the batch's tree slot of this call's first tree, where a batch is grown in parts (one per
        process, :mod:`agentjax.parallel.multihost`): tree ``t`` of the call samples (``row_keys``) as tree
        ``tree_offset + t`` of the whole batch, so a tree's draws do not depend on the part that grows it. SERA's
        fork trees take the slots after the call's own trees, and rubric writing and grading draw per call, so
        those depend on the parts. Groups and trees stay numbered within the call.
    """
    t_start = time.perf_counter()
    state = _start(tasks, policy, world_factory, judge, config, key, teacher=teacher, task_indices=task_indices,
                   rubrics=rubrics, forks=forks, search=search, grader=grader, tree_offset=tree_offset)
    for turn in range(config.max_turns):
        live = [(t, n) for t, tree in enumerate(state.trees) for n in tree.live()]
        if not live:
            break
        prompts, cut, allowed = _prompts(state, live)
        out = _generate(state, live, prompts, allowed, turn)
        _replies(state, live, prompts, cut, allowed, out)
        if search is not None:
            _advance_searches(state, turn)
        if rubrics is not None and state.launched:
            _write_rubrics(state, turn)
        _settle(state)
        _judge_stopped(state, turn)
    _cut(state)
    _row_rewards(state)
    return _rollouts(state, len(tasks), time.perf_counter() - t_start)


# ------------------------------------------------------------------------------------------------ the phases


def _start(tasks: Sequence[Task], policy: Policy, world_factory: Callable[[Task], TreeWorld], judge: Judge,
           config: TreeCollectConfig, key: jax.Array, *, teacher: Teacher | None, task_indices: Sequence[int] | None,
           rubrics: RubricConfig | None, forks: ForkConfig | None, search: SearchConfig | None,
           grader: Policy | None, tree_offset: int) -> TreeState:
    """The checked arguments, and ``K`` trees per task whose roots have begun on fresh worlds."""
    if not tasks:
        raise ValueError("collect_trees: no tasks")
    if (forks is not None or search is not None) and rubrics is None:
        raise ValueError("collect_trees: fork groups and search candidates are graded with rubrics; give "
                         "rubrics=RubricConfig(...)")
    if forks is not None and search is not None:
        raise ValueError("collect_trees: fork groups (training) and search (inference) do not mix")
    tokenizer = tokenizer_of(policy)
    task_index = list(range(len(tasks))) if task_indices is None else [int(i) for i in task_indices]
    if len(task_index) != len(tasks):
        raise ValueError(f"collect_trees: {len(task_index)} task_indices for {len(tasks)} tasks")
    scripted = rubrics is not None and (teacher is not None if rubrics.scripted is None else rubrics.scripted)
    state = TreeState(config=config, policy=policy, grader=policy if grader is None else grader, judge=judge,
                      key=key, tokenizer=tokenizer, teacher=teacher, rubrics=rubrics, forks=forks, search=search,
                      scripted=scripted, tree_offset=tree_offset, replies=ReplyTokens(tokenizer))
    with state.seconds.timed("env"):
        for g, task in enumerate(tasks):
            for k in range(config.trees_per_task):
                tree, world = Tree(task, g, k, task_index[g], config.limits), world_factory(task)
                tree.child_reward = "label" if rubrics is None else "score"
                root = tree.add_root(world.root_goal())
                root.intro = world.begin(root)
                state.trees.append(tree)
                state.worlds.append(world)
    return state


def _prompts(s: TreeState, live: Live) -> tuple[list[list[int]], list[bool], list[list[list[int]]] | None]:
    """1. Every live node's prompt, whether it was shortened, and (constrained, no teacher) the token ids of its
    admissible replies."""
    with s.seconds.timed("prompt"):
        encoded = [node_prompt(s.tokenizer, s.worlds[t], s.trees[t], node, s.config) for t, node in live]
        allowed = None
        if s.config.constrained and s.teacher is None:
            allowed = s.replies.rows([s.worlds[t].admissible(s.trees[t], node) for t, node in live],
                                     s.config.max_response_tokens)
    return [ids for ids, _ in encoded], [cut for _, cut in encoded], allowed


def _generate(s: TreeState, live: Live, prompts: list[list[int]], allowed: list[list[list[int]]] | None,
              turn: int) -> SampleOutput | None:
    """2. One batched policy call for every live node; None with a teacher (asked node by node in 3). With
    ``row_keys`` tree slot ``t``, node ``q`` samples from its own stream, whoever else is live."""
    if s.teacher is not None:
        return None
    config, slots = s.config, s.config.slots
    with s.seconds.timed("generate"):
        row_ids = [(s.tree_offset + t) * slots + node.id for t, node in live] if config.row_keys else None
        out, pad = generate_batch(s.policy, prompts, config.sampling, jax.random.fold_in(s.key, turn),
                                  bucket=config.batch_bucket, pow2=config.pow2_batches, allowed=allowed,
                                  max_trie_edges=config.max_trie_edges, sparse=config.sparse_logits, row_ids=row_ids,
                                  pad_row_id=(s.tree_offset + len(s.trees)) * slots)
    s.live_per_call.append(len(live))
    s.padded_per_call.append(len(live) + pad)
    return out


def _replies(s: TreeState, live: Live, prompts: list[list[int]], cut: list[bool],
             allowed: list[list[list[int]]] | None, out: SampleOutput | None) -> None:
    """3. Every live node's reply, recorded and run, node by node in the live order; a teacher writes its reply
    just before it runs (not once the world has ended)."""
    s.launched.clear()
    stops = s.config.sampling.stop_token_ids
    for i, (t, node) in enumerate(live):
        if out is not None:
            sample, j = out, i
        elif _ended(s, t):  # nothing was sampled: a teacher is not asked once the world ended
            continue
        else:
            with s.seconds.timed("generate"):
                sample = scripted_output(s.tokenizer, [_ask_teacher(s, t, node)], s.config.max_response_tokens,
                                         stops[0] if stops else None)
            j = 0
        with s.seconds.timed("env"):
            record = _record(s, s.worlds[t], node, sample, j, prompts[i], cut[i],
                             None if allowed is None else allowed[i])
            _run_reply(s, t, node, record)


def _advance_searches(s: TreeState, turn: int) -> None:
    """Search: the stopped candidates' labels (diagnostics; a scripted grade follows them); then the complete groups
    graded in one batched call, each winner committed, and the next queued children started."""
    _judge_stopped(s, turn)
    ready = [g for g in s.searches if g.ready]
    if not ready:
        return
    with s.seconds.timed("rubric"):
        slot = {id(tr): i for i, tr in enumerate(s.trees)}
        jobs = [(root, s.worlds[slot[id(tr)]].judge_request(root))
                for g in ready for tr, root in zip(g.trees, g.roots, strict=True)]
        grade_children(s.grader, s.tokenizer, [(n, r) for n, r in jobs if n.rubric is not None], s.rubrics,
                       jax.random.fold_in(s.key, 3 * s.config.max_turns + turn), s.counters, teacher=s.scripted)
    for group in ready:
        select(group)
        child, t = group.child, group.tree
        if child.status.stopped:  # its world ended or the turn cap came first: nothing to commit
            group.reason = group.reason or f"the child was {child.status.value} before its candidates ended"
            continue
        commit(group, s.worlds[t])
        _stop(s, t, child, child.status)
        _start_next(s, t, s.trees[t].nodes[child.parent])


def _write_rubrics(s: TreeState, turn: int) -> None:
    """SERA: every child launched this turn gets its rubric, frozen before its first turn; a fork group's branches
    and a search's candidates take their child's."""
    with s.seconds.timed("rubric"):
        write_rubrics(s.grader, s.tokenizer, s.launched, s.rubrics,
                      jax.random.fold_in(s.key, s.config.max_turns + turn), s.counters, teacher=s.scripted)
        for group in s.fork_groups:
            for branch in group.branches[1:]:
                branch.rubric = group.child.rubric
        for search_group in s.searches:
            for root in search_group.roots:
                root.rubric = search_group.child.rubric


def _settle(s: TreeState) -> None:
    """4. Worlds that ended stop their trees; parents whose children all stopped resume (a parent out of turns
    stops in turn, which may free its parent)."""
    with s.seconds.timed("env"):
        for t in range(len(s.trees)):
            if not s.trees[t].done and _ended(s, t):
                _end_tree(s, t)
        changed = True
        while changed:
            changed = False
            for t, tree in enumerate(s.trees):
                for parent in tree.ready_parents():
                    _resume(s, t, parent)
                    if parent.steps_left <= 0:
                        _stop(s, t, parent, Status.EXHAUSTED)
                        changed = True


def _judge_stopped(s: TreeState, turn: int) -> None:
    """The nodes that stopped since the last call, labelled in one batched judge call; then, with rubrics, graded
    (fork groups: their branches only; search grades its candidates by group, in :func:`_advance_searches`)."""
    if not s.requests:
        return
    with s.seconds.timed("judge"):
        verdicts = s.judge([r for _, _, r in s.requests])
        for (_, node, _), v in zip(s.requests, verdicts, strict=True):
            node.label, node.judge_reason = (float(v.success) if v.ok else None), v.reason
    if s.rubrics is not None and s.search is None:  # after the labels: a teacher's grades follow them
        with s.seconds.timed("rubric"):
            jobs = [(node, r) for _, node, r in s.requests if s.forks is None or node.rubric is not None]
            grade_children(s.grader, s.tokenizer, jobs, s.rubrics,
                           jax.random.fold_in(s.key, 2 * s.config.max_turns + turn), s.counters, teacher=s.scripted)
    s.requests.clear()


def _cut(s: TreeState) -> None:
    """The turn cap: whatever still runs or waits is cut, deepest first, and judged."""
    for t, tree in enumerate(s.trees):
        for node in sorted(tree.nodes, key=lambda n: -n.depth):
            if not node.status.stopped:
                _stop(s, t, node, Status.CUT)
    _judge_stopped(s, s.config.max_turns)


def _row_rewards(s: TreeState) -> None:
    """Each turn's row reward: the invalid penalty, plus the success reward on a successful root's last row."""
    for tree in s.trees:
        for node in tree.nodes:
            for turn in node.turns:
                turn.reward = 0.0 if turn.valid else -s.config.invalid_penalty
        if tree.root.turns and tree.root_success:
            tree.root.turns[-1].reward += s.config.success_reward


def _rollouts(s: TreeState, num_groups: int, total_seconds: float) -> TreeRollouts:
    metrics = dict(getattr(getattr(s.judge, "metrics", None), "as_dict", dict)())
    return TreeRollouts(trees=tuple(tree for tree in s.trees if tree.fork is None), forks=tuple(s.fork_groups),
                        searches=tuple(s.searches), searches_not_run=s.not_run, num_groups=num_groups,
                        trees_per_task=s.config.trees_per_task, live_per_call=tuple(s.live_per_call),
                        padded_per_call=tuple(s.padded_per_call), judge_metrics=metrics,
                        rubric_metrics=s.counters.as_dict() if s.rubrics is not None else {},
                        prompt_seconds=s.seconds.prompt, generate_seconds=s.seconds.generate,
                        env_seconds=s.seconds.env, judge_seconds=s.seconds.judge, rubric_seconds=s.seconds.rubric,
                        total_seconds=total_seconds)


# ------------------------------------------------------------------------------------------------ a node's reply


def _record(s: TreeState, world: TreeWorld, node: Node, sample: SampleOutput, j: int, prompt: list[int], cut: bool,
            replies: list[list[int]] | None) -> NodeTurn:
    """Row ``j`` of ``sample`` as the node's next turn, parsed by the world's grammar (with the constrained
    decoder's choices under ``masked_logp``, and each token's role)."""
    n = int(sample.length_b[j])
    response = sample.tokens_bt[j, :n].astype(np.int32)
    reply = world.parse(sample.texts[j])
    stops = s.config.sampling.stop_token_ids
    allowed_ids = None
    if s.config.masked_logp and replies is not None:
        allowed_ids = constrained_choices(replies, stops, response.tolist())
    record = NodeTurn(step=len(node.turns), reply=reply, feedback="", valid=reply.valid,
                      prompt_ids=np.asarray(prompt, np.int32), prompt_truncated=cut, response_ids=response,
                      logp=sample.logp_unmasked_bt[j, :n].astype(np.float32),
                      logp_masked=sample.logp_bt[j, :n].astype(np.float32), allowed_ids=allowed_ids,
                      role_ids=token_roles(s.tokenizer, response, sample.texts[j], reply.role_spans(), stops))
    node.turns.append(record)
    return record


def _run_reply(s: TreeState, t: int, node: Node, record: NodeTurn) -> None:
    """The recorded reply runs (module docstring, 3): its environment calls, then a finish or a delegation; what
    the node reads next; a spent budget. Not run once an earlier reply of the turn ended the shared world."""
    reply = record.reply
    feedback: list[str] = []
    if not reply.valid:
        feedback.append(f"Error: {reply.error}")
    why_ended = _ended(s, t)
    if why_ended:
        record.executed = False
        feedback.append(f"Not run: {why_ended}")
        record.feedback = "\n".join(feedback)
        return
    refused = not reply.valid  # a malformed reply or a refused delegation: show the world as it is
    if reply.valid and reply.calls:
        text, ok = s.worlds[t].act(node, reply)
        feedback.append(text)
        record.valid &= ok
    if reply.kind == "finish":
        node.finish_message = reply.message
        _stop(s, t, node, Status.FINISHED)
    elif reply.kind == "delegate":
        why = _delegate(s, t, node, record)
        if why:
            feedback.append(f"Error: cannot delegate: {why}")
            record.valid, refused = False, True
        else:
            feedback.append(f"Launched {len(record.children)} subagent(s); you wait for their results.")
    if refused and node.status is Status.RUNNING and (status := _status_text(s, t, node)):
        feedback.append(status)
    record.feedback = "\n".join(feedback)
    if node.status is Status.RUNNING and node.steps_left <= 0:
        _stop(s, t, node, Status.EXHAUSTED)


def _delegate(s: TreeState, t: int, node: Node, record: NodeTurn) -> str:
    """A delegating reply: its launch event, and the children it spawns if the tree allows them and the world
    accepts their goals; returns why not ("" when spawned). Search resolves the children one at a time."""
    tree, world, delegations = s.trees[t], s.worlds[t], record.reply.delegations
    event = tree.add_event(node)
    why = tree.check_delegation(node, delegations)
    goals = []
    for d in delegations if not why else ():
        goal, why = world.child_goal(node, d)
        if goal is None:
            break
        goals.append(goal)
    if why:
        return why
    children = tree.spawn(node, goals, [d.max_steps or s.config.limits.max_steps for d in delegations], event)
    if s.search is not None:
        for child in children:
            child.status = Status.QUEUED
        _start_next(s, t, node)
    else:
        for child in children:
            _launch(s, t, child)
    record.children = tuple(c.id for c in children)
    return ""


def _launch(s: TreeState, t: int, child: Node) -> None:
    """A spawned child begins on its tree's world; with fork groups it also gets its branches while the tree's
    fork budget lasts (and only then a rubric)."""
    tree, world = s.trees[t], s.worlds[t]
    child.intro = world.begin(child)
    if s.forks is None:
        s.launched.append((world, tree, child))
    elif (opened := open_fork_group(t, tree, world, child, s.forks)) is not None:
        s.fork_groups.append(opened[0])
        s.launched.append((world, tree, child))
        _add_trees(s, opened[1])


def _start_next(s: TreeState, t: int, parent: Node) -> None:
    """Search: the parent's first queued child begins and opens its candidates (or is not run past the cap)."""
    tree, world = s.trees[t], s.worlds[t]
    for c in parent.waiting_on:
        child = tree.nodes[c]
        if child.status is not Status.QUEUED:
            continue
        child.intro = world.begin(child)
        main = t if tree.fork is None else tree.fork[0]
        opened = open_search(t, main, tree, world, child, s.search, s.searched)
        if opened is None:
            child.finish_message = NOT_RUN
            _stop(s, t, child, Status.CUT)
            s.not_run += 1
            continue
        s.searches.append(opened[0])
        s.launched.append((world, tree, child))
        _add_trees(s, opened[1])
        return


def _add_trees(s: TreeState, pairs: Sequence[tuple[Tree, TreeWorld]]) -> None:
    """Fork or candidate trees join the run (their roots reply from the next turn on)."""
    for tree, world in pairs:
        s.trees.append(tree)
        s.worlds.append(world)


# ------------------------------------------------------------------------------------------------ stopping nodes


def _stop(s: TreeState, t: int, node: Node, status: Status) -> None:
    """``node`` stops and its world records its end state. A main tree's root fixes the tree's outcome; a child, a
    fork branch's or a search candidate's root (labelled like a child) and a candidate's children wait for the
    judge; the other agents of a fork branch are not judged."""
    tree, world = s.trees[t], s.worlds[t]
    tree.stop(node, status)
    world.end(node)
    if node.parent == NO_PARENT and tree.fork is None:
        tree.root_success = bool(world.root_success(tree))
    elif node.parent == NO_PARENT or tree.fork is None or tree.search:
        s.requests.append((tree, node, world.judge_request(node)))


def _ended(s: TreeState, t: int) -> str:
    """Why tree ``t``'s shared world has ended for every agent ("" while it runs, or when the world cannot end)."""
    fn = getattr(s.worlds[t], "ended", None)
    return fn() if fn is not None else ""


def _status_text(s: TreeState, t: int, node: Node) -> str:
    fn = getattr(s.worlds[t], "status", None)
    return fn(node) if fn is not None else ""


def _children_results(tree: Tree, parent: Node) -> str:
    lines = ["Subagent results:"]
    for c in parent.waiting_on:
        child = tree.nodes[c]
        what = (f"finished: {child.finish_message}" if child.finished else
                "stopped without finishing (its budget ran out)" if child.status is Status.EXHAUSTED else
                "stopped without finishing (the shared world ended)" if child.status is Status.ENDED else
                NOT_RUN if child.finish_message == NOT_RUN else
                "was stopped")
        lines.append(f"[{child.rank + 1}] {child.goal.text.splitlines()[0]} -> {what}")
    return "\n".join(lines)


def _resume(s: TreeState, t: int, parent: Node) -> None:
    """Ends ``parent``'s wait: its children's results (and what it sees now) close its delegation turn."""
    last = parent.turns[-1]
    results = _children_results(s.trees[t], parent)
    last.feedback = "\n".join(x for x in (last.feedback, results, _status_text(s, t, parent)) if x)
    parent.waiting_on = ()
    parent.status = Status.RUNNING


def _end_tree(s: TreeState, t: int) -> None:
    """The shared world ended: every node that has not stopped is ENDED, deepest first."""
    for node in sorted(s.trees[t].nodes, key=lambda n: -n.depth):
        if node.status is Status.WAITING:
            _resume(s, t, node)
        if not node.status.stopped:
            _stop(s, t, node, Status.ENDED)


def _ask_teacher(s: TreeState, t: int, node: Node) -> str:
    if getattr(s.teacher, "with_world", False):
        return s.teacher(s.trees[t], node, s.worlds[t])
    return s.teacher(s.trees[t], node)


def collect_trees(
    tasks: Sequence[Task],
    policy: Policy,
    world_factory: Callable[[Task], TreeWorld],
    judge: Judge,
    config: TreeCollectConfig,
    key: jax.Array,
    *,
    teacher: Teacher | None = None,
    task_indices: Sequence[int] | None = None,
    rubrics: RubricConfig | None = None,
    forks: ForkConfig | None = None,
    search: SearchConfig | None = None,
) -> tuple[TreeBatch, dict[str, float]]:
    """``K`` trees per task as a :class:`TreeBatch` and :func:`tree_stats` (arguments: :func:`run_trees`). Use
    :func:`run_trees` directly to keep the host records (texts, e.g. for :func:`~agentjax.agents.tree.render_tree`)."""
    rollouts = run_trees(tasks, policy, world_factory, judge, config, key, teacher=teacher, task_indices=task_indices,
                         rubrics=rubrics, forks=forks, search=search)
    return to_tree_batch(rollouts, config), tree_stats(rollouts)


__all__ = ["Teacher", "TreeCollectConfig", "TreeRollouts", "TreeState", "collect_trees", "run_trees", "to_tree_batch",
           "tree_stats"]
