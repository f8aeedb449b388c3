"""The recursive-agent tree (SERA / RAO; METHODS.md "SERA" 1): nodes, goals, budgets, depth, status — plain data.

One shared policy plays every node. A node gets a :class:`Goal` and a budget of ``max_steps`` turns (20); each turn
it replies once (:mod:`agentjax.agents.grammar`): it acts in the environment, delegates one or several subtasks
(children, run concurrently; only while its depth < ``max_depth`` = 3, so depths 0..3), or finishes with a message.
A node that delegates *waits* until all children of that delegation have stopped, then continues with their finish
messages as the result of its delegation turn. A node stops when it finishes, when its budget is spent
(``EXHAUSTED``), when the collector stops the whole tree (``CUT``), or when the tree's shared world ends for every
agent at once (``ENDED``: TextWorld-Sync's world is done once the task succeeds or fails or its shared step budget is
spent). The root's reward is the verified
environment outcome; a child's success is its verifier / judge label (:mod:`agentjax.agents.judge`).

A :class:`Tree` is a list of :class:`Node` s indexed by id (the root is node 0, ids in creation order), each with
its parent id (``NO_PARENT`` = -1 at the root), depth, status and the :class:`NodeTurn` records of its replies.
A *launch event* is one reply that delegates (SERA's decomposition unit), recorded in ``Tree.events`` whether it
spawned children or was refused. :meth:`Tree.arrays` gives the fixed-shape ``[Q]`` node and ``[E]`` event arrays that
:mod:`agentjax.credit.sera` reads; :func:`render_tree` prints who delegated what, each node's replies and its reward.

:class:`TreeWorld` is what an environment supplies to the runtime (the tree collector,
:mod:`agentjax.rollout.tree_collect`): the shared world of one tree, its reply grammar, prompts and judge requests.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping, Sequence
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np

from agentjax.agents.grammar import Delegation, Reply, Role
from agentjax.agents.rubric import Grade, Rubric, rubric_summary
from envs.base import Task

NO_PARENT = -1


class Status(enum.Enum):
    RUNNING = "running"  # replies this turn
    WAITING = "waiting"  # waits for the children of its last delegation
    FINISHED = "finished"  # replied with a finish
    EXHAUSTED = "exhausted"  # spent its budget without finishing
    CUT = "cut"  # stopped by the collector's turn cap
    ENDED = "ended"  # its shared world ended (TextWorld-Sync: task done or failed, or the shared step budget spent)
    QUEUED = "queued"  # rubric-guided search: waits for its siblings before it (one searched delegation at a time)
    SEARCHING = "searching"  # rubric-guided search: its candidate subtrees run on clones of the world

    @property
    def stopped(self) -> bool:
        return self in (Status.FINISHED, Status.EXHAUSTED, Status.CUT, Status.ENDED)


@dataclasses.dataclass(frozen=True)
class Goal:
    """What a node is asked to do: the text it reads, and the structured targets a verifier checks."""

    text: str
    targets: Mapping[str, int] = dataclasses.field(default_factory=dict)  # TextCraft: {item: count to add}
    context: str = ""  # the parent's note to the child


@dataclasses.dataclass(frozen=True)
class TreeLimits:
    """Budgets and shape limits of a tree (SERA: 20 steps per node, depth <= 3)."""

    max_steps: int = 20  # turns per node (a child's requested budget is capped at this)
    max_depth: int = 3  # a node delegates only while its depth < max_depth
    max_children: int = 8  # children per delegation
    max_nodes: int = 64  # nodes per tree (a delegation that would pass it is invalid)

    def __post_init__(self):
        if min(self.max_steps, self.max_children, self.max_nodes) < 1 or self.max_depth < 0:
            raise ValueError(f"TreeLimits: positive budgets and a depth >= 0 please, got {self}")

    def can_delegate(self, depth: int) -> bool:
        return depth < self.max_depth


@dataclasses.dataclass
class NodeTurn:
    """One reply of a node and what came of it (host record; the collector turns it into a StepBatch row)."""

    step: int  # the node's turn index
    reply: Reply
    feedback: str  # what the node reads next: the calls' results, the error, or its children's finish messages
    valid: bool  # the reply parsed and every call / the delegation was accepted
    children: tuple[int, ...] = ()  # nodes launched by this turn
    event: int = -1  # the launch event this reply is (a parsed delegation, spawned or refused), -1 if none
    prompt_ids: np.ndarray | None = None  # [k] int32
    prompt_truncated: bool = False
    response_ids: np.ndarray | None = None  # [n] int32, the stop token included
    logp: np.ndarray | None = None  # [n] float32 without the constraint mask
    logp_masked: np.ndarray | None = None  # [n] float32 under the sampling distribution
    role_ids: np.ndarray | None = None  # [n] int8 Role of each response token
    allowed_ids: tuple[tuple[int, ...], ...] | None = None  # constrained decoding's choices per response token
    reward: float = 0.0  # the row reward (invalid penalty; the root's last row adds the success reward)
    executed: bool = True  # False: the shared world ended earlier in the same turn, so the reply was not run


@dataclasses.dataclass
class PolicyCall:
    """One call of the policy outside the nodes' own turns (SERA: a rubric written or a grade given for a child)."""

    prompt_ids: np.ndarray  # [k] int32
    response_ids: np.ndarray  # [n] int32, the stop token included
    logp: np.ndarray  # [n] float32 behaviour log-probs (0 for a teacher's text)
    text: str
    error: str = ""  # why the answer was not usable ("" when it parsed)
    choices: tuple[str, ...] | None = None  # the answers constrained decoding allowed (None: unconstrained)


@dataclasses.dataclass
class Node:
    """One agent of a tree."""

    id: int
    parent: int  # NO_PARENT at the root
    depth: int
    goal: Goal
    budget: int  # turns
    launch_step: int = -1  # the parent's turn that launched it (-1 at the root)
    event: int = -1  # the launch event that spawned it (-1 at the root)
    rank: int = 0  # position among the children of that launch
    status: Status = Status.RUNNING
    turns: list[NodeTurn] = dataclasses.field(default_factory=list)
    children: list[int] = dataclasses.field(default_factory=list)
    waiting_on: tuple[int, ...] = ()
    finish_message: str | None = None
    intro: str = ""  # the first user message (goal, state at start), fixed when the node starts
    start_state: Any = None  # world-specific (TextCraft: counts of the targets at start)
    end_state: Any = None
    label: float | None = None  # child: the verifier / judge verdict (1 / 0; None: not judged or judge failed)
    judge_reason: str = ""
    rubric: Rubric | None = None  # SERA: the rubric its parent wrote at the delegation (None: none or unparsable)
    rubric_call: PolicyCall | None = None
    grade: Grade | None = None  # SERA: the policy's grade of this child under its rubric
    grade_call: PolicyCall | None = None
    score: float | None = None  # SERA: the child's execution reward from its grade (None: not graded)

    @property
    def steps_left(self) -> int:
        return self.budget - len(self.turns)

    @property
    def finished(self) -> bool:
        return self.status is Status.FINISHED


@dataclasses.dataclass
class Tree:
    """One recursive rollout of a root task (``index`` k of the K trees of task ``group``)."""

    task: Task
    group: int
    index: int
    task_index: int
    limits: TreeLimits
    nodes: list[Node] = dataclasses.field(default_factory=list)
    root_success: bool | None = None  # the verified environment outcome, once the root stopped
    events: list[tuple[int, int]] = dataclasses.field(default_factory=list)  # launch events: (node id, its turn)
    child_reward: Literal["label", "score"] = "label"  # a child's reward: RAO's verifier label, SERA's rubric score
    fork: tuple[int, int, int] | None = None  # SERA fork tree: (main tree slot, committed child id, branch >= 1)
    forked_envs: int = 0  # SERA: forked environments used by this (main) tree's fork groups, branch 0 included
    origin_path: tuple[int, ...] = ()  # a fork tree: the ranks from its main tree's root to the node its root plays
    search: bool = False  # a candidate tree of rubric-guided search (its root is graded, not judged)

    @property
    def root(self) -> Node:
        return self.nodes[0]

    @property
    def done(self) -> bool:
        return bool(self.nodes) and self.root.status.stopped

    def add_root(self, goal: Goal, *, depth: int = 0, budget: int | None = None) -> Node:
        """The root; a fork tree's root plays a delegated child: its ``depth`` and ``budget``."""
        if self.nodes:
            raise ValueError("Tree.add_root: the tree has a root already")
        budget = self.limits.max_steps if budget is None else budget
        self.nodes.append(Node(id=0, parent=NO_PARENT, depth=depth, goal=goal, budget=budget))
        return self.root

    def live(self) -> list[Node]:
        return [n for n in self.nodes if n.status is Status.RUNNING]

    def check_delegation(self, node: Node, delegations: Sequence[Delegation]) -> str:
        """Why ``node`` may not launch ``delegations`` now ("" when it may)."""
        limits = self.limits
        if not limits.can_delegate(node.depth):
            return f"a node at depth {node.depth} cannot delegate (only while depth < {limits.max_depth})"
        if len(delegations) > limits.max_children:
            return f"at most {limits.max_children} subagents per delegation"
        if len(self.nodes) + len(delegations) > limits.max_nodes:
            return f"the tree may hold at most {limits.max_nodes} agents"
        return ""

    def add_event(self, node: Node) -> int:
        """Records ``node``'s current turn as a launch event (SERA's decomposition unit: one reply that delegates,
        whether or not it spawns children); returns its id."""
        self.events.append((node.id, len(node.turns) - 1))
        if node.turns:
            node.turns[-1].event = len(self.events) - 1
        return len(self.events) - 1

    def spawn(self, parent: Node, goals: Sequence[Goal], budgets: Sequence[int], event: int = -1) -> list[Node]:
        """Children of ``parent``'s current turn (it waits for them); budgets are capped at ``max_steps``."""
        children = []
        for rank, (goal, budget) in enumerate(zip(goals, budgets, strict=True)):
            child = Node(id=len(self.nodes), parent=parent.id, depth=parent.depth + 1, goal=goal,
                         budget=max(1, min(int(budget), self.limits.max_steps)), launch_step=len(parent.turns) - 1,
                         rank=rank, event=event)
            self.nodes.append(child)
            parent.children.append(child.id)
            children.append(child)
        parent.waiting_on = tuple(c.id for c in children)
        parent.status = Status.WAITING
        return children

    def stop(self, node: Node, status: Status) -> None:
        if not status.stopped:
            raise ValueError(f"Tree.stop: {status} is not a stopped status")
        node.status = status

    def ready_parents(self) -> list[Node]:
        """Waiting nodes whose children have all stopped."""
        return [n for n in self.nodes if n.status is Status.WAITING
                and all(self.nodes[c].status.stopped for c in n.waiting_on)]

    def path(self, node: Node) -> tuple[int, ...]:
        """The ranks from the root down to ``node`` (the root: ``()``); in a fork tree, from its main tree's root
        (the fork root plays the node at :attr:`origin_path`)."""
        ranks = []
        while node.parent >= 0:
            ranks.append(node.rank)
            node = self.nodes[node.parent]
        return self.origin_path + tuple(reversed(ranks))

    def leaf_coverage(self, children: Sequence[int]) -> float | None:
        """SERA's decomposition reward of a launch event that spawned ``children`` (METHODS.md "SERA" 4; the jitted
        kernel is :func:`agentjax.credit.sera.leaf_coverage`): ``R_root · |leaves under the children| / |leaves|``,
        0 for an attempt that spawned nothing; None while the root's outcome is unknown (for printing)."""
        if self.root_success is None:
            return None
        under, stack = 0, list(children)
        while stack:
            node = self.nodes[stack.pop()]
            under += not node.children
            stack.extend(node.children)
        return float(self.root_success) * under / len(self.leaves())

    def leaves(self) -> list[Node]:
        return [n for n in self.nodes if not n.children]

    def node_reward(self, node: Node) -> float | None:
        """A node's execution reward: the root's environment outcome; a child's verifier / judge label (RAO,
        ``child_reward="label"``) or its rubric score (SERA, ``"score"``); None when it has none (not trained)."""
        if node.parent == NO_PARENT:
            return None if self.root_success is None else float(self.root_success)
        return node.label if self.child_reward == "label" else node.score

    def arrays(self, num_nodes: int, num_events: int | None = None) -> dict[str, np.ndarray]:
        """The tree as ``[Q]`` node arrays and ``[E]`` event arrays (Q = ``num_nodes``, E = ``num_events`` slots,
        default Q; padding past the real ones), the layout of :mod:`agentjax.credit.sera`:

        ``parent`` (-1 at the root and padding), ``depth``, ``node_mask``, ``finished``, ``label`` (the node's reward,
        :meth:`node_reward`: a child's verdict or rubric score, the root's outcome; 0 when unknown), ``label_mask``
        (it exists), ``launch_step`` (the parent's
        turn, -1 at the root), ``turns`` (replies), ``delegated`` (launched children), ``event`` (the launch event
        that spawned the node, -1 at the root); ``event_node`` / ``event_step`` (the reply of each launch event:
        node and turn, -1 on padding). Events past ``E`` slots are left out only if they spawned nothing (they
        earn 0); ``dropped_events`` counts them."""
        num_events = num_nodes if num_events is None else num_events
        if len(self.nodes) > num_nodes:
            raise ValueError(f"Tree.arrays: {len(self.nodes)} nodes do not fit {num_nodes} slots")
        q, e = num_nodes, num_events
        out = dict(parent=np.full(q, NO_PARENT, np.int32), depth=np.zeros(q, np.int32), node_mask=np.zeros(q, bool),
                   finished=np.zeros(q, bool), label=np.zeros(q, np.float32), label_mask=np.zeros(q, bool),
                   launch_step=np.full(q, -1, np.int32), turns=np.zeros(q, np.int32), delegated=np.zeros(q, bool),
                   event=np.full(q, -1, np.int32), event_node=np.full(e, -1, np.int32),
                   event_step=np.full(e, -1, np.int32))
        spawned = {n.event for n in self.nodes if n.event >= 0}
        if len(spawned) > e:
            raise ValueError(f"Tree.arrays: {len(spawned)} launch events with children do not fit {e} slots")
        keep = sorted(spawned)
        keep = sorted(keep + [i for i in range(len(self.events)) if i not in spawned][: e - len(keep)])
        slot = {i: j for j, i in enumerate(keep)}
        for i, j in slot.items():
            out["event_node"][j], out["event_step"][j] = self.events[i]
        out["dropped_events"] = np.int32(len(self.events) - len(keep))
        for n in self.nodes:
            reward = self.node_reward(n)
            out["parent"][n.id], out["depth"][n.id], out["node_mask"][n.id] = n.parent, n.depth, True
            out["finished"][n.id], out["launch_step"][n.id] = n.finished, n.launch_step
            out["turns"][n.id], out["delegated"][n.id] = len(n.turns), bool(n.children)
            out["label"][n.id], out["label_mask"][n.id] = (0.0 if reward is None else reward), reward is not None
            out["event"][n.id] = slot[n.event] if n.event >= 0 else -1
        return out


@runtime_checkable
class TreeWorld(Protocol):
    """What an environment gives the tree runtime, per tree (one shared world; TextCraft: agents/textcraft_tree.py,
    TextWorld-Sync: agents/textworld_tree.py).

    Two optional methods, used by the collector when a world has them (TextWorld-Sync does, TextCraft does not):
    ``ended() -> str``, why the shared world has ended for every agent ("" while it runs; the collector then stops
    every node of the tree as ``ENDED``), and ``status(node) -> str``, what the node sees of the world now (shown
    after an invalid or refused reply and after its children return).
    """

    def root_goal(self) -> Goal: ...

    def parse(self, text: str) -> Reply: ...

    def system_prompt(self, can_delegate: bool) -> str: ...

    def begin(self, node: Node) -> str:
        """Records the node's start state; returns its first user message (goal, what it sees at the start)."""

    def act(self, node: Node, reply: Reply) -> tuple[str, bool]:
        """Runs the reply's environment calls in order (each atomic); the feedback text and whether all were valid."""

    def child_goal(self, node: Node, delegation: Delegation) -> tuple[Goal | None, str]:
        """The child's goal, or None and why the delegation is refused (e.g. an unknown item)."""

    def end(self, node: Node) -> None:
        """Records the node's end state (called once, when it stops)."""

    def judge_request(self, node: Node) -> Any: ...

    def root_success(self, tree: Tree) -> bool: ...

    def admissible(self, tree: Tree, node: Node) -> list[str]:
        """Replies a constrained decoder may emit for the node now (tiny untrained policies)."""


# ------------------------------------------------------------------------------------------------ rendering


def _clip(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def render_tree(tree: Tree, *, rewards: Mapping[int, float] | None = None, max_chars: int = 160) -> str:
    """The tree as indented text: who delegated what, each node's replies (and what followed) and its rewards.

    A node's execution reward is the root's environment outcome, a child's verifier label (RAO) or rubric score
    (SERA, shown with its rubric, grade and label); a delegating turn shows its launch event's leaf coverage (the
    decomposition reward). ``rewards`` (node id -> value) overrides the printed execution reward. Texts are clipped
    to ``max_chars``.
    """
    root = tree.root
    nodes = len(tree.nodes)
    depth = max(n.depth for n in tree.nodes)
    outcome = "pending" if tree.root_success is None else ("success" if tree.root_success else "failure")
    lines = [f"tree {tree.index} of task {tree.task.task_id} (group {tree.group}): root {outcome}, {nodes} node"
             f"{'s' * (nodes != 1)}, depth {depth}"]

    def visit(node: Node) -> None:
        pad = "    " * node.depth
        who = "root" if node.parent == NO_PARENT else f"delegated by [{node.parent}] at its turn {node.launch_step}"
        reward = rewards.get(node.id) if rewards is not None else tree.node_reward(node)
        source = ("env outcome" if node.parent == NO_PARENT else "verifier" if tree.child_reward == "label"
                  else "rubric score")
        shown = "none" if reward is None else f"{reward:g} ({source})" if rewards is None else f"{reward:g}"
        lines.append(f"{pad}[{node.id}] depth {node.depth}, {who}: {_clip(node.goal.text, max_chars)}")
        lines.append(f"{pad}  {node.status.value} after {len(node.turns)}/{node.budget} turns, reward {shown}"
                     + (f", finish message: {_clip(node.finish_message, max_chars)}" if node.finish_message else ""))
        if node.rubric_call is not None or node.rubric is not None:
            why = node.rubric_call.error if node.rubric_call is not None else ""
            shown = rubric_summary(node.rubric, node.grade) if node.rubric else f"failed: {why}"
            if node.grade_call is not None and node.grade_call.error:
                shown += f" (grade failed: {node.grade_call.error})"
            label = "none" if node.label is None else f"{node.label:g}"
            lines.append(f"{pad}  rubric: {shown}; verifier label {label}")
        for turn in node.turns:
            kind = turn.reply.kind + ("" if turn.valid or turn.reply.kind == "invalid" else ", refused")
            launched = f" -> {', '.join(f'[{c}]' for c in turn.children)}" if turn.children else ""
            if turn.event >= 0 and (coverage := tree.leaf_coverage(turn.children)) is not None:
                launched += f", leaf coverage {coverage:.3g}"
            lines.append(f"{pad}  turn {turn.step} ({kind}{launched}): {_clip(turn.reply.text, max_chars)}")
            for c in turn.children:  # the children, under the turn that launched them
                visit(tree.nodes[c])
            if turn.feedback:
                lines.append(f"{pad}    => {_clip(turn.feedback, max_chars)}")

    visit(root)
    return "\n".join(lines)


__all__ = [
    "NO_PARENT",
    "Goal",
    "Node",
    "NodeTurn",
    "PolicyCall",
    "Role",
    "Status",
    "Tree",
    "TreeLimits",
    "TreeWorld",
    "render_tree",
]
