"""TextWorld-Sync in the recursive tree runtime: the shared world of a tree, its judges and its planner teacher.

:class:`TextWorldTreeWorld` is the :class:`~agentjax.agents.tree.TreeWorld` of the released TextWorld-Sync benchmark
(:mod:`envs.textworld_sync`), as SERA's runtime runs it (GitHub ``OliverLeeXZ/SERA``: the training runtime
``Training/runtime/textworld_continuous_policy/env.py`` and prompts, the evaluator
``Evaluation/TextWorld/textworld_parallel/evaluator.py``; read there, written here):

- *One engine world per tree* (:class:`~envs.textworld_sync.world.World`): the root is the engine's ``root`` agent;
  every child is its own agent on the same world (``<parent>/subagent-<node id>``), added when it starts, where the
  root stands (the engine's ``fork_shared``), with its own location and history. Ingredients, the shared inventory,
  the prepared counter, the gate, the tool cooldowns and the *shared step budget* belong to the world.
- *The shared budget* (``TextWorldTreeConfig.budget``): 100 in the released training runtime
  (:meth:`TextWorldTreeConfig.training`), the task's own ``shared_environment_max_steps`` in the evaluator
  (:meth:`TextWorldTreeConfig.evaluation`, ``budget=None``). Every environment command of every agent uses one
  step, accepted or not (the engine's rule); the inventory lookups (``inventory`` / ``view inventory`` / ``check
  inventory``) use none. Once the world is done — the task succeeded or failed, or the budget is spent —
  :meth:`TextWorldTreeWorld.ended` says so and the collector ends every agent's episode (status ``ENDED``).
- *Serialised transitions*: each command is checked, applied and observed under the world's lock (the collector
  runs the replies of a turn one after the other, siblings in node order, so a concurrent delegation is the serial
  run of its siblings' commands in that order; the engine's event log records it).
- *The reply grammar*: :func:`~agentjax.agents.grammar.parse_textworld` (``<action>``, ``<finish>``,
  ``<delegate>{json}</delegate>`` with one or several delegations). A malformed reply is an invalid action with
  the penalty and uses *no* world step, as in the released training runtime (it only observes). The released
  evaluator differs: it pulls a best-effort command out of a malformed reply and steps it (``extract_action``);
  that reading is not implemented here. A delegation's goal is any non-empty text (the released parser's rule);
  its ``max_steps`` is capped at the node budget (20); a node delegates while its depth < 3.
- *What a node reads* (the released prompts' content, in this project's words): a system message with the reply
  protocol (``<delegate>`` only while it may delegate); a first message with its goal (the root: the task's
  description; a child: the goal its parent wrote), its engine observation (room, visible objects, gate, tool
  cooldowns, prepared counter, dish progress and the ``Shared steps remaining`` line) and its valid actions; after
  each command the new observation and valid actions (a rejected command says so); after its children return,
  their results and its observation now.

Child checks (RAO's child reward, SERA's labels) go through :mod:`agentjax.agents.judge`:
:class:`SyncVerifierJudge` is the programmatic default — the child's goal text read by
:func:`envs.textworld_sync.verifier.goal_from_text` and verified on the world as it was when the child stopped; a
goal the heuristic cannot read is a failed check, counted as ``judge/unparsed_goals``. The language-model judges
(:class:`~agentjax.agents.judge.SamplerJudge`, :class:`~agentjax.agents.judge.HTTPJudge`) take
``messages=sync_judge_messages, parse=parse_yes_no``: a short prompt (the goal, the child's trajectory, the final
state) answered yes or no. As in the released judge, every child is judged whether or not it finished
(``require_finish=False``): a child whose action ends the task does not get to finish.

:class:`SyncPlannerTeacher` is the ideal recursive agent (warm-start trees): the root, while it may delegate,
launches one child per dish in one reply (concurrent), each child follows the engine's subtask planner for its dish
(waiting with a free inventory lookup when its planner has nothing to do) and finishes once its dish is eaten; the
root then follows the planner for whatever is left and finishes.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import re
from typing import Any

from agentjax.agents.grammar import Delegation, Reply, parse_textworld
from agentjax.agents.judge import JudgeMetrics, JudgeRequest, Verdict, VerifierJudge
from agentjax.agents.tree import NO_PARENT, Goal, Node, Tree
from envs.base import Task
from envs.textworld_sync import LOOKUP_TEXTS, ROOT, TRAINING_BUDGET, World, build, planner, rules
from envs.textworld_sync.state import WorldState
from envs.textworld_sync.verifier import check, goal_from_text

_PROTOCOL = """You are one agent of a team playing a cooking text game. All agents act on one shared world: the rooms,
the ingredients, one shared inventory, the shared prepared counter, the kitchen gate, the tools and the dishes.
Each agent has its own location and its own history. Every environment command of any agent uses one step of a
budget shared by the whole team; when it is spent, or the task is done, the game ends for everyone.

Reply with exactly one of these blocks (you may think before it):
<action>command</action>
  Run one command from your Valid Actions. <action>inventory</action> shows the shared inventory without using a
  step.
<finish>message</finish>
  Stop and report to whoever gave you your goal. A sub-agent finishes when its goal is done."""
_DELEGATE = """
<delegate>{"goal": "a specific subtask"}</delegate>
  Start a sub-agent on the same world with that goal; you wait for its result. Several at once run concurrently:
  <delegate>{"delegations": [{"goal": "..."}, {"goal": "..."}]}</delegate>
  Give each sub-agent one concrete goal that does not compete with another's (e.g. one dish each);
  "max_steps" (at most 20) is optional."""


@dataclasses.dataclass(frozen=True)
class TextWorldTreeConfig:
    """The adapter's settings (module docstring)."""

    budget: int | None = TRAINING_BUDGET  # the shared step budget; None: the task's own (the evaluator's)
    lookup_style: str = "training"  # the inventory lookup's wording (envs.textworld_sync.world.LOOKUP_TEXTS)
    finish_message: str = "Done: my goal is complete."  # the finish reply of the planner teacher and the constrained
    # decoder

    def __post_init__(self):
        if self.budget is not None and (type(self.budget) is not int or self.budget <= 0):
            raise ValueError(f"TextWorldTreeConfig.budget: a positive int or None (the task's own), got "
                             f"{self.budget!r}")
        if self.lookup_style not in LOOKUP_TEXTS:
            raise ValueError(f"TextWorldTreeConfig.lookup_style: one of {sorted(LOOKUP_TEXTS)}, got "
                             f"{self.lookup_style!r}")

    @classmethod
    def training(cls) -> TextWorldTreeConfig:
        """The released training runtime: a shared budget of 100 steps."""
        return cls(budget=TRAINING_BUDGET, lookup_style="training")

    @classmethod
    def evaluation(cls) -> TextWorldTreeConfig:
        """The released evaluator: each task's own ``shared_environment_max_steps``."""
        return cls(budget=None, lookup_style="evaluation")


def dish_goal(dishes: list[str]) -> str:
    """A child's goal of preparing and eating ``dishes`` (what :func:`goal_from_text` reads as ``dish_eaten``)."""
    return f"Prepare and eat {' and '.join(dishes)}."


def dish_delegation(dishes: list[str], max_children: int) -> str:
    """One reply delegating ``dishes`` to at most ``max_children`` concurrent children (round-robin groups)."""
    k = min(len(dishes), max_children)
    return _delegate([dish_goal(dishes[i::k]) for i in range(k)])


def scope(state: WorldState, text: str) -> tuple[list[str], list[str]] | None:
    """The dishes and ingredients a goal text names (for the subtask planner), or None when it names neither."""
    spec = goal_from_text(state, text)
    if spec is None or spec["kind"] == "task_success":
        return None
    dishes, ingredients = [], []
    for g in spec["goals"] if spec["kind"] == "all" else [spec]:
        if "dish" in g:
            dishes.append(g["dish"])
        else:
            ingredients.append(g["ingredient"])
    return dishes, ingredients


def _actions(commands: list[str]) -> str:
    return "\n".join(f"- {c}" for c in commands) or "(none)"


class TextWorldTreeWorld:
    """The shared TextWorld-Sync world of one tree (module docstring)."""

    def __init__(self, task: Task, *, config: TextWorldTreeConfig = TextWorldTreeConfig()):
        self.task, self.config = task, config
        self.budget = int(task.meta.get("budget", TRAINING_BUDGET)) if config.budget is None else int(config.budget)
        self.world = World(build(task.meta, self.budget))
        self.world.add_agent(ROOT)
        self.agents: dict[int, str] = {}  # node id -> engine agent id

    # -- prompts and parsing -----------------------------------------------------------------------------------------
    def root_goal(self) -> Goal:
        return Goal(text=str(self.task.meta.get("description", "Prepare and eat every dish.")))

    def parse(self, text: str) -> Reply:
        return parse_textworld(text)

    def system_prompt(self, can_delegate: bool) -> str:
        return _PROTOCOL + (_DELEGATE if can_delegate else "")

    def agent(self, node: Node) -> str:
        return self.agents[node.id]

    def begin(self, node: Node) -> str:
        if node.parent == NO_PARENT:
            agent = ROOT
        else:
            agent = f"{self.agents[node.parent]}/subagent-{node.id}"
            self.world.add_agent(agent)  # where the root stands
        self.agents[node.id] = agent
        with self.world.locked() as s:
            node.start_state = {"agent": agent, "world_steps": s.steps}
            text, commands = rules.observation(s, agent), rules.valid_actions(s, agent)
        return (f"# Goal\n{node.goal.text}\n\n# Observation\n{text}\n\n# Valid Actions\n{_actions(commands)}\n\n"
                f"You have {node.budget} turns.")

    def status(self, node: Node) -> str:
        """What the node sees now: its observation and valid actions."""
        with self.world.locked() as s:
            agent = self.agent(node)
            return f"{rules.observation(s, agent)}\nValid Actions:\n{_actions(rules.valid_actions(s, agent))}"

    # -- acting --------------------------------------------------------------------------------------------------------
    def act(self, node: Node, reply: Reply) -> tuple[str, bool]:
        """The reply's one command, atomically: an inventory lookup (no world step) or an engine step."""
        (call,) = reply.calls
        agent = self.agent(node)
        with self.world.locked():
            r = self.world.act(agent, call.args["command"], style=self.config.lookup_style)
            if r.lookup:
                return f"{r.observation}\nValid Actions:\n{_actions(r.infos['validActions'])}", True
            head = "" if r.accepted else (f"Error: {call.args['command']!r} is not one of your valid actions (it "
                                          "still used a shared step).\n")
            return f"{head}{r.observation}\nValid Actions:\n{_actions(r.infos['validActions'])}", r.accepted

    def child_goal(self, node: Node, delegation: Delegation) -> tuple[Goal | None, str]:
        return Goal(text=delegation.goal), ""

    def end(self, node: Node) -> None:
        node.end_state = self.world.snapshot()  # what the verifier judges: the world when the node stopped

    def fork(self, node: Node) -> TextWorldTreeWorld:
        """An isolated clone of the shared world as it is now, whose fork tree's root (node 0) is ``node``'s engine
        agent (same place, history and shared inventory): SERA's counterfactual branches of a delegated child."""
        twin = copy.copy(self)
        twin.world = self.world.clone()
        twin.agents = {0: self.agents[node.id]}
        return twin

    def adopt(self, twin: TextWorldTreeWorld) -> None:
        """Takes over ``twin``'s whole state — inventory, objects, every agent's place and history, the shared step
        count (rubric-guided search commits the chosen candidate's world)."""
        self.world.restore(twin.world.snapshot())

    def ended(self) -> str:
        """Why the shared world has ended for every agent ("" while it runs)."""
        with self.world.locked() as s:
            if not s.done:
                return ""
            report = rules.score(s)
            if report["task_success"]:
                return "the task is complete; the game has ended for every agent"
            if s.failure or report["task_failure"]:
                return "the task has failed; the game has ended for every agent"
            return f"the shared step budget ({s.limit} steps) is spent; the game has ended for every agent"

    # -- checks -------------------------------------------------------------------------------------------------------
    def judge_request(self, node: Node) -> JudgeRequest:
        state: WorldState = node.end_state if node.end_state is not None else self.world.snapshot()
        # a child cut at the turn cap before its first turn never joined the world: judged from where its parent stands
        agent = self.agents.get(node.id) or self.agents[node.parent]
        lines = []
        for turn in node.turns:
            r = turn.reply
            what = (f"action: {r.calls[0].source}" if r.kind == "act" else
                    f"finish: {r.message}" if r.kind == "finish" else
                    "delegate: " + "; ".join(d.goal for d in r.delegations) if r.kind == "delegate" else
                    f"malformed reply ({r.error})")
            outcome = "not run" if not turn.executed else "ok" if turn.valid else "rejected"
            lines.append(f"{turn.step + 1}. {what} [{outcome}]")
        final = f"{rules.observation(state, agent)}\nShared inventory: {', '.join(state.inventory) or '(empty)'}"
        return JudgeRequest(goal=node.goal.text, finished=node.finished, finish_message=node.finish_message or "",
                            trajectory="\n".join(lines), final_state=final, state=state)

    def root_success(self, tree: Tree) -> bool:
        return self.world.won

    def finish_reply(self) -> str:
        """The reply that finishes a node with the configured message (the planner teacher's and the constrained
        decoder's finish)."""
        return f"<finish>{self.config.finish_message}</finish>"

    def admissible(self, tree: Tree, node: Node) -> list[str]:
        """For constrained decoding: the subtask planner's next command for the node's goal (the whole task when
        the goal names no dish nor ingredient; the inventory lookup when it would wait), the inventory lookup,
        ``look around``, the finish and, while the node may delegate, a delegation of each dish of its goal not yet
        eaten and one of all of them at once — so every reply of :class:`SyncPlannerTeacher` is among them when
        nothing changed since (its children's commands may run after a sibling's)."""
        agent = self.agent(node)
        with self.world.locked() as s:
            part = None if node.parent == NO_PARENT else scope(s, node.goal.text)
            dishes, ingredients = part if part is not None else (None, None)
            command = planner.next_command(s, agent, dishes, ingredients)
            todo = [d for d in (dishes if part is not None else s.dish_ids) if d not in s.eaten]
        replies = {f"<action>{'inventory' if command == planner.WAIT else command}</action>",
                   "<action>inventory</action>", "<action>look around</action>",
                   self.finish_reply()}
        if tree.limits.can_delegate(node.depth) and todo:
            replies |= {_delegate([dish_goal([d])]) for d in todo} | {dish_delegation(todo, tree.limits.max_children)}
        return sorted(replies)


def _delegate(goals: list[str]) -> str:
    if len(goals) == 1:
        return f"<delegate>{json.dumps({'goal': goals[0]})}</delegate>"
    return f"<delegate>{json.dumps({'delegations': [{'goal': g} for g in goals]})}</delegate>"


# ------------------------------------------------------------------------------------------------ judges


@dataclasses.dataclass
class SyncJudgeMetrics(JudgeMetrics):
    unparsed_goals: int = 0  # children whose goal text names nothing the verifier can check (failed checks)

    def as_dict(self, prefix: str = "judge/") -> dict[str, float]:
        return super().as_dict(prefix) | {prefix + "unparsed_goals": float(self.unparsed_goals)}


class SyncVerifierJudge(VerifierJudge):
    """The programmatic TextWorld-Sync child check (module docstring): ``goal_from_text`` over the child's goal,
    verified on the state when it stopped (``JudgeRequest.state``). An unreadable goal fails and is counted."""

    def __init__(self, *, require_finish: bool = False):
        super().__init__(self._verify, require_finish=require_finish)
        self.metrics = SyncJudgeMetrics()

    def _verify(self, goal: str, state: WorldState) -> bool:
        return self._check(goal, state).success

    def _check(self, goal: str, state: WorldState) -> Verdict:
        spec = goal_from_text(state, goal)
        if spec is None:
            self.metrics.add(unparsed_goals=1)
            return Verdict(False, True, "the goal names no dish or ingredient the verifier can check")
        v = check(state, spec)
        return Verdict(v.holds, True, v.reason)

    def _judge(self, requests: list[JudgeRequest]) -> list[Verdict]:
        self.metrics.add(calls=len(requests))
        return [self._check(r.goal, r.state) for r in requests]


SYNC_JUDGE_SYSTEM = ("You judge sub-agents in a shared cooking text game. A parent agent gave a sub-agent a goal. "
                     "From what it did and the final state of the world, decide whether the goal is done. "
                     "Answer with one word: yes or no.")


def sync_judge_messages(request: JudgeRequest) -> list[dict[str, str]]:
    """A short TextWorld-Sync judging prompt: the goal, the child's trajectory, the final state; yes or no."""
    finish = f"\nIts finish message: {request.finish_message}" if request.finished else ""
    user = (f"Goal: {request.goal}\n\nWhat the sub-agent did:\n{request.trajectory or '(nothing)'}{finish}\n\n"
            f"The world when it stopped:\n{request.final_state or '(not shown)'}\n\n"
            "Is the goal done? Answer yes or no.")
    return [dict(role="system", content=SYNC_JUDGE_SYSTEM), dict(role="user", content=user)]


_WORD = re.compile(r"\b(yes|no)\b", re.IGNORECASE)
_LEAD = re.compile(r"^\W*(?:(?:final\s+)?(?:answer|verdict)\s*[:\-]?\s*)?\W*(yes|no)\b", re.IGNORECASE)


def parse_yes_no(text: str) -> Verdict:
    """A yes/no answer (after the last ``</think>``): a leading ``yes`` / ``no`` (after ``Answer:`` and markup), else
    the last line's, else the one of the two the answer uses; an answer with neither, or both and no leading or
    final one, is a failed verdict (``ok=False``)."""
    text = (text or "").rsplit("</think>", 1)[-1].strip()
    lines = [line for line in text.splitlines() if line.strip()]
    for candidate in (text, lines[-1] if lines else ""):
        m = _LEAD.match(candidate)
        if m:
            return Verdict(m.group(1).lower() == "yes", True, text[:200])
    words = {w.lower() for w in _WORD.findall(text)}
    if len(words) == 1:
        return Verdict(words == {"yes"}, True, text[:200])
    return Verdict(False, False, "no yes/no answer" if not words else "both yes and no, no clear answer")


# ------------------------------------------------------------------------------------------------ the planner teacher


class SyncPlannerTeacher:
    """The ideal recursive agent's replies for the tree collector (``teacher=``; module docstring). It reads the
    live world, so the collector calls it as ``teacher(tree, node, world)`` just before the reply runs."""

    with_world = True

    def __call__(self, tree: Tree, node: Node, world: Any) -> str:
        """``world``: the tree's :class:`TextWorldTreeWorld` (or a wrapper that forwards to it)."""
        agent = world.agent(node)
        with world.world.locked() as s:
            root = node.parent == NO_PARENT
            if root and not node.turns and tree.limits.can_delegate(0) and s.dish_ids:
                return dish_delegation(s.dish_ids, tree.limits.max_children)
            part = None if root else scope(s, node.goal.text)
            dishes, ingredients = part if part is not None else (None, None)
            if planner.done(s, dishes, ingredients):
                return world.finish_reply()
            command = planner.next_command(s, agent, dishes, ingredients)
        return f"<action>{'inventory' if command == planner.WAIT else command}</action>"


__all__ = [
    "SYNC_JUDGE_SYSTEM",
    "SyncJudgeMetrics",
    "SyncPlannerTeacher",
    "SyncVerifierJudge",
    "TextWorldTreeConfig",
    "TextWorldTreeWorld",
    "dish_delegation",
    "dish_goal",
    "parse_yes_no",
    "scope",
    "sync_judge_messages",
]
