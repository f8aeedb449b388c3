"""The tree collector: K recursive-agent trees per root task, one batched policy call per turn, a `TreeBatch` out.

``collect_trees(tasks, policy, world_factory, judge, config, key)`` grows ``K = config.trees_per_task`` trees
(:class:`agentjax.agents.tree.Tree`) per task, each over its own shared world (``world_factory(task)``, a
:class:`~agentjax.agents.tree.TreeWorld`; TextCraft: :class:`agentjax.agents.textcraft_tree.TextCraftTreeWorld`),
and returns them as one :class:`~agentjax.rollout.tree_batch.TreeBatch` plus statistics. It is :func:`run_trees`
(the loop, host records) followed by :func:`to_tree_batch` and :func:`tree_stats`. Each turn:

1. *Prompts* of every ``RUNNING`` node of every tree (a node waiting for its children is not live): a system message
   (the world's grammar; ``launch_subagent`` / ``<delegate>`` only while the node may delegate), the node's first
   message (goal, state at its start), then its own turns as assistant replies and user feedback (the last
   ``history_length``; older turns are dropped first when the prompt passes ``max_prompt_tokens``, then
   ``truncation`` applies as in the flat collector).
2. *One* ``policy.generate`` call for all of them — the flat collector's sampler path: the same padding to
   ``batch_bucket`` with dummy rows, per-turn keys ``fold_in(key, turn)`` (``row_keys``: one stream per tree slot and
   node), and constrained decoding over ``world.admissible(tree, node)`` (``constrained``; tiny untrained policies)
   with the collector's own trie and allowed-token helpers. With a ``teacher`` (e.g. the planner's,
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
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any, Literal

import jax
import numpy as np

from agentjax.agents.grammar import Role
from agentjax.agents.projection import INVALID_PENALTY
from agentjax.agents.prompts import encode_prompt
from agentjax.agents.tree import NO_PARENT, Node, NodeTurn, Status, Tree, TreeLimits, TreeWorld
from agentjax.models.constrain import constrained_choices
from agentjax.models.sampler import SamplingParams, batch_padding
from agentjax.models.tokenizer import ENDOFTEXT_ID, IM_END_ID
from agentjax.rollout.collect import CollectConfig, Policy, _constraint, _encode, _tokenizer_of
from agentjax.rollout.tree_batch import TreeBatch
from agentjax.rollout.tree_records import TreeRollouts, to_tree_batch, tree_stats
from agentjax.rollout.tree_rubrics import (
    ForkConfig,
    ForkGroup,
    RubricConfig,
    RubricCounters,
    grade_children,
    open_fork_group,
    scripted_output,
    write_rubrics,
)
from agentjax.rollout.tree_search import NOT_RUN, SearchConfig, SearchGroup, commit, open_search, select
from envs.base import Task

Teacher = Callable[..., str]  # teacher(tree, node) -> reply; teacher(tree, node, world) when teacher.with_world


@dataclasses.dataclass(frozen=True)
class TreeCollectConfig:
    """How to grow trees (module docstring). Field names shared with ``CollectConfig`` mean the same."""

    trees_per_task: int = 8  # K trees per root task (SERA: 8 roots x 8 trees)
    limits: TreeLimits = TreeLimits()  # 20 turns per node, depth <= 3
    max_turns: int = 400  # the collector's cap on turns (trees still running are cut)
    history_length: int | None = None  # own turns shown in a node's prompt (None: all that fit)
    sampling: SamplingParams = SamplingParams(temperature=1.0, max_new_tokens=512, stop_token_ids=(IM_END_ID,
                                              ENDOFTEXT_ID), prompt_bucket=256)  # max_new_tokens: capacity Lr
    max_prompt_tokens: int = 4096  # capacity Lp
    truncation: Literal["error", "left"] = "left"
    invalid_penalty: float = INVALID_PENALTY
    success_reward: float = 10.0  # on the root's last row when the root succeeded
    constrained: bool = False  # decode only the world's admissible replies
    masked_logp: bool = False  # constrained log-probs as behaviour_logp, and allowed_tokens
    sparse_logits: bool = False
    max_allowed: int = 16
    max_trie_edges: int = 4096
    batch_bucket: int = 8
    pow2_batches: bool = False
    row_bucket: int = 64
    capacity: int | None = None
    row_keys: bool = False
    node_slots: int | None = None  # Q of TreeArrays (default limits.max_nodes)
    event_slots: int | None = None  # E of TreeArrays (default 2 Q; refused attempts past it are dropped, counted)

    def __post_init__(self):
        if min(self.trees_per_task, self.max_turns, self.max_prompt_tokens, self.batch_bucket, self.row_bucket) < 1:
            raise ValueError("TreeCollectConfig: trees_per_task, max_turns, max_prompt_tokens, batch_bucket and "
                             "row_bucket must be >= 1")
        if self.masked_logp and not self.constrained:
            raise ValueError("TreeCollectConfig.masked_logp needs constrained=True")
        if self.sparse_logits and not self.masked_logp:
            raise ValueError("TreeCollectConfig.sparse_logits needs masked_logp=True")
        if self.constrained and not self.sampling.stop_token_ids:
            raise ValueError("TreeCollectConfig.constrained needs sampling.stop_token_ids")

    @property
    def max_response_tokens(self) -> int:
        return self.sampling.max_new_tokens

    @property
    def slots(self) -> int:
        return self.node_slots or self.limits.max_nodes

    @property
    def events(self) -> int:
        return self.event_slots or 2 * self.slots

    def flat(self) -> CollectConfig:
        """The flat collector's config with this one's sampling and prompt settings (for its shared helpers)."""
        return CollectConfig(sampling=self.sampling, max_prompt_tokens=self.max_prompt_tokens,
                             truncation=self.truncation, max_trie_edges=self.max_trie_edges)

    def replace(self, **changes: Any) -> TreeCollectConfig:
        return dataclasses.replace(self, **changes)


# ------------------------------------------------------------------------------------------------ prompts


def node_messages(world: TreeWorld, tree: Tree, node: Node, history: int | None) -> list[dict[str, str]]:
    """The chat messages of a node's next turn (module docstring, 1) with its last ``history`` turns."""
    messages = [dict(role="system", content=world.system_prompt(tree.limits.can_delegate(node.depth))),
                dict(role="user", content=node.intro)]
    turns = node.turns if history is None else node.turns[len(node.turns) - history:] if history else []
    for turn in turns:
        messages.append(dict(role="assistant", content=turn.reply.text))
        messages.append(dict(role="user", content=f"{turn.feedback}\n({node.budget - turn.step - 1} steps left)"))
    return messages


def _node_prompt(tokenizer: Any, world: TreeWorld, tree: Tree, node: Node, config: TreeCollectConfig,
                 ) -> tuple[list[int], bool]:
    wanted = len(node.turns) if config.history_length is None else min(config.history_length, len(node.turns))
    history = wanted
    while True:
        ids = encode_prompt(tokenizer, node_messages(world, tree, node, history))
        if len(ids) <= config.max_prompt_tokens or history == 0:
            break
        history -= 1  # drop the oldest turn shown
    where = f"tree {tree.index} of task {tree.task.task_id!r}, node {node.id}, turn {len(node.turns)}"
    if len(ids) <= config.max_prompt_tokens:
        return ids, history < wanted
    ids, _ = _encode(tokenizer, node_messages(world, tree, node, 0), config.flat(), where)
    return ids, True


def token_roles(tokenizer: Any, response_ids: Sequence[int] | np.ndarray, text: str,
                spans: Sequence[tuple[int, int, Role]], stop_ids: Sequence[int]) -> np.ndarray:
    """[n] int8 role of each response token: a token whose characters overlap a span takes its role, every other
    token (stop tokens included) is :attr:`Role.EXECUTION`. ``text`` is the decoded reply without stop tokens."""
    ids = [int(t) for t in response_ids]
    roles = np.full(len(ids), int(Role.EXECUTION), np.int8)
    if not spans:
        return roles
    stops = set(int(s) for s in stop_ids)
    body = [t for t in ids if t not in stops]
    pieces = [tokenizer.decode([t]) for t in body]
    if "".join(pieces) == text:
        ends = np.cumsum([len(p) for p in pieces]).tolist()
    else:  # a character split over tokens: decode prefixes
        ends = [len(tokenizer.decode(body[: j + 1])) for j in range(len(body))]
    j = 0
    for i, t in enumerate(ids):
        if t in stops:
            continue
        lo, hi = (ends[j - 1] if j else 0), ends[j]
        for start, end, role in spans:
            if lo < end and hi > start:
                roles[i] = int(role)
        j += 1
    return roles


# ------------------------------------------------------------------------------------------------ the loop


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


def run_trees(
    tasks: Sequence[Task],
    policy: Policy,
    world_factory: Callable[[Task], TreeWorld],
    judge: Callable[[Sequence[Any]], list[Any]],
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
      policy: a :class:`~agentjax.models.Sampler` (``generate`` and ``tokenizer``); with a ``teacher`` only its
        tokenizer is used.
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
    if not tasks:
        raise ValueError("collect_trees: no tasks")
    if (forks is not None or search is not None) and rubrics is None:
        raise ValueError("collect_trees: fork groups and search candidates are graded with rubrics; give "
                         "rubrics=RubricConfig(...)")
    if forks is not None and search is not None:
        raise ValueError("collect_trees: fork groups (training) and search (inference) do not mix")
    grader = policy if grader is None else grader
    tokenizer = _tokenizer_of(policy)
    limits, k_size = config.limits, config.trees_per_task
    task_index = list(range(len(tasks))) if task_indices is None else [int(i) for i in task_indices]
    if len(task_index) != len(tasks):
        raise ValueError(f"collect_trees: {len(task_index)} task_indices for {len(tasks)} tasks")
    vocab_size = getattr(getattr(policy, "config", None), "vocab_size", None)
    stops = config.sampling.stop_token_ids
    flat = config.flat()
    stop_id = stops[0] if stops else None
    prompt_s = generate_s = env_s = judge_s = rubric_s = 0.0
    counters = RubricCounters()
    groups: list[ForkGroup] = []
    searches: list[SearchGroup] = []
    searched: dict[int, int] = {}  # candidates created per main tree (the search's fork cap)
    not_run = 0
    launched: list[tuple[TreeWorld, Tree, Node]] = []  # children whose rubric is due this turn
    scripted = rubrics is not None and (teacher is not None if rubrics.scripted is None else rubrics.scripted)

    t0 = time.perf_counter()
    trees: list[Tree] = []
    worlds: list[TreeWorld] = []
    for g, task in enumerate(tasks):
        for k in range(k_size):
            tree, world = Tree(task, g, k, task_index[g], limits), world_factory(task)
            tree.child_reward = "label" if rubrics is None else "score"
            root = tree.add_root(world.root_goal())
            root.intro = world.begin(root)
            trees.append(tree)
            worlds.append(world)
    env_s += time.perf_counter() - t0
    live_per_call, padded_per_call = [], []
    token_cache: dict[str, list[int]] = {}
    requests: list[tuple[Tree, Node, Any]] = []  # children that stopped this turn, with their judge requests

    def stop(t: int, node: Node, status: Status) -> None:
        trees[t].stop(node, status)
        worlds[t].end(node)
        if trees[t].fork is not None and node.parent == NO_PARENT:  # a branch or candidate: labelled like a child
            requests.append((trees[t], node, worlds[t].judge_request(node)))
        elif trees[t].fork is not None and not trees[t].search:  # inside a fork group's branch: not judged
            pass
        elif node.parent == NO_PARENT:
            trees[t].root_success = bool(worlds[t].root_success(trees[t]))
        else:
            requests.append((trees[t], node, worlds[t].judge_request(node)))

    def judge_stopped(turn: int) -> None:
        nonlocal judge_s, rubric_s
        if requests:
            t0 = time.perf_counter()
            verdicts = judge([r for _, _, r in requests])
            for (_, node, _), v in zip(requests, verdicts, strict=True):
                node.label, node.judge_reason = (float(v.success) if v.ok else None), v.reason
            judge_s += time.perf_counter() - t0
            if rubrics is not None and search is None:  # after the labels: a teacher's grades follow them (forks:
                # the branches only; search grades its candidates by group)
                t0 = time.perf_counter()
                jobs = [(node, r) for _, node, r in requests if forks is None or node.rubric is not None]
                grade_children(grader, tokenizer, jobs, rubrics,
                               jax.random.fold_in(key, 2 * config.max_turns + turn), counters,
                               teacher=scripted)
                rubric_s += time.perf_counter() - t0
            requests.clear()

    def ended(t: int) -> str:
        fn = getattr(worlds[t], "ended", None)
        return fn() if fn is not None else ""

    def status_text(t: int, node: Node) -> str:
        fn = getattr(worlds[t], "status", None)
        return fn(node) if fn is not None else ""

    def resume(t: int, parent: Node) -> None:
        """Ends ``parent``'s wait: its children's results (and what it sees now) close its delegation turn."""
        last = parent.turns[-1]
        results = _children_results(trees[t], parent)
        last.feedback = "\n".join(x for x in (last.feedback, results, status_text(t, parent)) if x)
        parent.waiting_on = ()
        parent.status = Status.RUNNING

    def end_tree(t: int) -> None:
        """The shared world ended: every node that has not stopped is ENDED, deepest first."""
        for node in sorted(trees[t].nodes, key=lambda n: -n.depth):
            if node.status is Status.WAITING:
                resume(t, node)
            if not node.status.stopped:
                stop(t, node, Status.ENDED)

    def start_next(t: int, parent: Node) -> None:
        """Search: the parent's first queued child begins and opens its candidates (or is not run past the cap)."""
        nonlocal not_run
        for c in parent.waiting_on:
            child = trees[t].nodes[c]
            if child.status is not Status.QUEUED:
                continue
            child.intro = worlds[t].begin(child)
            main = t if trees[t].fork is None else trees[t].fork[0]
            opened = open_search(t, main, trees[t], worlds[t], child, search, searched)
            if opened is None:
                child.finish_message = NOT_RUN
                stop(t, child, Status.CUT)
                not_run += 1
                continue
            searches.append(opened[0])
            launched.append((worlds[t], trees[t], child))
            for candidate, twin in opened[1]:
                trees.append(candidate)
                worlds.append(twin)
            return

    def advance_searches(turn: int) -> None:
        """Search: grade the complete groups (one batched call), commit each winner, start the next children."""
        nonlocal rubric_s
        judge_stopped(turn)  # the candidates' labels first (diagnostics; a scripted grade follows them)
        ready = [g for g in searches if g.ready]
        if not ready:
            return
        t0 = time.perf_counter()
        slot = {id(tr): i for i, tr in enumerate(trees)}
        jobs = [(root, worlds[slot[id(tr)]].judge_request(root)) for g in ready for tr, root in zip(g.trees, g.roots,
                                                                                                     strict=True)]
        grade_children(grader, tokenizer, [(n, r) for n, r in jobs if n.rubric is not None], rubrics,
                       jax.random.fold_in(key, 3 * config.max_turns + turn), counters, teacher=scripted)
        rubric_s += time.perf_counter() - t0
        for group in ready:
            select(group)
            child, t = group.child, group.tree
            if child.status.stopped:  # its world ended or the turn cap came first: nothing to commit
                group.reason = group.reason or f"the child was {child.status.value} before its candidates ended"
                continue
            commit(group, worlds[t])
            stop(t, child, child.status)
            start_next(t, trees[t].nodes[child.parent])

    def ask_teacher(t: int, node: Node) -> str:
        if getattr(teacher, "with_world", False):
            return teacher(trees[t], node, worlds[t])
        return teacher(trees[t], node)

    for turn in range(config.max_turns):
        live = [(t, n) for t, tree in enumerate(trees) for n in tree.live()]
        if not live:
            break
        # 1. prompts
        t0 = time.perf_counter()
        prompts, cut = [], []
        for t, node in live:
            ids, was_cut = _node_prompt(tokenizer, worlds[t], trees[t], node, config)
            prompts.append(ids)
            cut.append(was_cut)
        rows = None
        if config.constrained and teacher is None:
            rows = [worlds[t].admissible(trees[t], node) for t, node in live]
        prompt_s += time.perf_counter() - t0

        # 2. one batched policy call (a teacher is asked node by node in 3)
        t0 = time.perf_counter()
        out = None
        if teacher is None:
            pad = batch_padding(len(live), config.batch_bucket, pow2=config.pow2_batches)
            allowed = None
            if rows is not None:
                allowed = _constraint(tokenizer, rows + [rows[0]] * pad, flat, vocab_size, token_cache)
            limits_b = np.array([config.max_response_tokens] * len(live) + [1] * pad, np.int32)
            turn_key = jax.random.fold_in(key, turn)
            extra = {"sparse": True} if config.sparse_logits and rows is not None and all(rows) else {}
            if config.row_keys:  # tree slot t, node q: one stream whoever else is live
                ids = [(tree_offset + t) * config.slots + node.id for t, node in live] + [
                    (tree_offset + len(trees)) * config.slots] * pad
                extra["row_keys"] = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(turn_key, np.asarray(ids,
                                                                                                      np.uint32))
            out = policy.generate(prompts + [prompts[0]] * pad, config.sampling, turn_key, max_new_tokens=limits_b,
                                  allowed=allowed, **extra)
            if out.texts is None:
                raise ValueError("collect_trees: the policy returned no texts; give the Sampler a tokenizer")
            live_per_call.append(len(live))
            padded_per_call.append(len(live) + pad)
        generate_s += time.perf_counter() - t0

        # 3. replies, node by node
        t0 = time.perf_counter()
        launched.clear()  # children of this turn, for their rubrics
        for i, (t, node) in enumerate(live):
            tree, world = trees[t], worlds[t]
            if teacher is not None and ended(t):  # nothing was sampled: a teacher is not asked once the world ended
                continue
            if teacher is not None:
                t1 = time.perf_counter()
                sample, j = scripted_output(tokenizer, [ask_teacher(t, node)], config.max_response_tokens, stop_id), 0
                generate_s += time.perf_counter() - t1
                t0 += time.perf_counter() - t1  # the teacher's time counts as generation, not env
            else:
                sample, j = out, i
            n = int(sample.length_b[j])
            response = sample.tokens_bt[j, :n].astype(np.int32)
            reply = world.parse(sample.texts[j])
            allowed_ids = None
            if config.masked_logp and rows is not None:
                allowed_ids = constrained_choices([token_cache[r] for r in rows[i]], stops, response.tolist())
            record = NodeTurn(step=len(node.turns), reply=reply, feedback="", valid=reply.valid,
                              prompt_ids=np.asarray(prompts[i], np.int32), prompt_truncated=cut[i],
                              response_ids=response, logp=sample.logp_unmasked_bt[j, :n].astype(np.float32),
                              logp_masked=sample.logp_bt[j, :n].astype(np.float32), allowed_ids=allowed_ids,
                              role_ids=token_roles(tokenizer, response, sample.texts[j], reply.role_spans(), stops))
            node.turns.append(record)
            feedback: list[str] = []
            if not reply.valid:
                feedback.append(f"Error: {reply.error}")
            why_ended = ended(t)
            if why_ended:  # an earlier reply of this turn ended the shared world: this one does not run
                record.executed = False
                feedback.append(f"Not run: {why_ended}")
                record.feedback = "\n".join(feedback)
                continue
            refused = not reply.valid  # a malformed reply or a refused delegation: show the world as it is
            if reply.valid and reply.calls:
                text, ok = world.act(node, reply)
                feedback.append(text)
                record.valid &= ok
            if reply.kind == "finish":
                node.finish_message = reply.message
                stop(t, node, Status.FINISHED)
            elif reply.kind == "delegate":
                event = tree.add_event(node)
                why = tree.check_delegation(node, reply.delegations)
                goals = []
                for d in reply.delegations if not why else ():
                    goal, why = world.child_goal(node, d)
                    if goal is None:
                        break
                    goals.append(goal)
                if why:
                    feedback.append(f"Error: cannot delegate: {why}")
                    record.valid, refused = False, True
                else:
                    budgets = [d.max_steps or limits.max_steps for d in reply.delegations]
                    children = tree.spawn(node, goals, budgets, event)
                    for child in children if search is not None else ():  # one at a time, each searched
                        child.status = Status.QUEUED
                    if search is not None:
                        start_next(t, node)
                    for child in children if search is None else ():
                        child.intro = world.begin(child)
                        if forks is None:
                            launched.append((world, tree, child))
                        elif (opened := open_fork_group(t, tree, world, child, forks)) is not None:
                            groups.append(opened[0])
                            launched.append((world, tree, child))
                            for fork_tree, twin in opened[1]:
                                trees.append(fork_tree)
                                worlds.append(twin)
                    record.children = tuple(c.id for c in children)
                    feedback.append(f"Launched {len(children)} subagent(s); you wait for their results.")
            if refused and node.status is Status.RUNNING and (status := status_text(t, node)):
                feedback.append(status)
            record.feedback = "\n".join(feedback)
            if node.status is Status.RUNNING and node.steps_left <= 0:
                stop(t, node, Status.EXHAUSTED)

        env_s += time.perf_counter() - t0
        if search is not None:
            advance_searches(turn)
        if rubrics is not None and launched:  # SERA: every child's rubric, frozen before its first turn
            t1 = time.perf_counter()
            write_rubrics(grader, tokenizer, launched, rubrics, jax.random.fold_in(key, config.max_turns + turn),
                          counters, teacher=scripted)
            for group in groups:  # every branch is graded with the committed child's frozen rubric
                for branch in group.branches[1:]:
                    branch.rubric = group.child.rubric
            for search_group in searches:  # every candidate with its child's rubric
                for root in search_group.roots:
                    root.rubric = search_group.child.rubric
            rubric_s += time.perf_counter() - t1
        t0 = time.perf_counter()

        # 4. worlds that ended stop their trees; parents whose children all stopped (a parent out of turns stops in
        # turn, which may free its parent)
        for t in range(len(trees)):
            if not trees[t].done and ended(t):
                end_tree(t)
        changed = True
        while changed:
            changed = False
            for t, tree in enumerate(trees):
                for parent in tree.ready_parents():
                    resume(t, parent)
                    if parent.steps_left <= 0:
                        stop(t, parent, Status.EXHAUSTED)
                        changed = True
        env_s += time.perf_counter() - t0
        judge_stopped(turn)

    for t, tree in enumerate(trees):  # the turn cap: whatever still runs or waits is cut, deepest first
        for node in sorted(tree.nodes, key=lambda n: -n.depth):
            if not node.status.stopped:
                stop(t, node, Status.CUT)
    judge_stopped(config.max_turns)
    for tree in trees:  # row rewards
        for node in tree.nodes:
            for turn in node.turns:
                turn.reward = 0.0 if turn.valid else -config.invalid_penalty
        if tree.root.turns and tree.root_success:
            tree.root.turns[-1].reward += config.success_reward
    metrics = dict(getattr(getattr(judge, "metrics", None), "as_dict", dict)())
    main = tuple(tree for tree in trees if tree.fork is None)
    return TreeRollouts(trees=main, forks=tuple(groups), searches=tuple(searches), searches_not_run=not_run,
                        num_groups=len(tasks), trees_per_task=k_size,
                        live_per_call=tuple(live_per_call), padded_per_call=tuple(padded_per_call),
                        judge_metrics=metrics, rubric_metrics=counters.as_dict() if rubrics is not None else {},
                        prompt_seconds=prompt_s, generate_seconds=generate_s, env_seconds=env_s,
                        judge_seconds=judge_s, rubric_seconds=rubric_s, total_seconds=time.perf_counter() - t_start)


def collect_trees(
    tasks: Sequence[Task],
    policy: Policy,
    world_factory: Callable[[Task], TreeWorld],
    judge: Callable[[Sequence[Any]], list[Any]],
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


__all__ = ["TreeCollectConfig", "TreeRollouts", "collect_trees", "node_messages", "run_trees", "to_tree_batch",
           "token_roles", "tree_stats"]
