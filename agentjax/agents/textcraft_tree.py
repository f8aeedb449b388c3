"""Recursive agents on TextCraft(-Synth): the tree world, the program judge's requests, the planner-made tree.

:class:`TextCraftTreeWorld` is the :class:`~agentjax.agents.tree.TreeWorld` of one tree: one shared inventory
(:class:`envs.textcraft.shared.SharedCraft`) that every node crafts from and into (the released runtime shares the
parent's inventory with its children by reference), the call grammar (:func:`~agentjax.agents.grammar.parse_textcraft`),
the prompts and the child checks. A node's first message holds its goal, its parent's context, the recipes of its
goal's recipe tree (``show_recipes``; the released agents look them up with ``get_info``, which stays available) and
the inventory when it starts. A child's success (:class:`~agentjax.agents.judge.ProgramJudge`): it finished and its
targets' counts rose by the targets while it ran. The root's success: the task's targets are held when the root stops
and (``root_needs_finish``, the released check) it finished.

:func:`planner_tree` is what an ideal recursive agent would reply on a task (the warm start's trees): the recipe
planner's plan (``envs/textcraft/planner.py``) split over a tree. A node delegates each *top-level ingredient* (an
ingredient of its targets' recipes that only its targets consume) to its own child while its depth allows; the
child owns every item that only that ingredient's subtree consumes. Items shared between subtrees stay with the node,
which crafts them before launching its children, so concurrent siblings never compete for an intermediate item and
every craft finds its inputs whatever order the siblings act in. A node's replies: its own crafts, one delegation
(``asyncio.gather`` over its children), the crafts of its targets, ``finish``; crafts are packed several to a reply
only where the budget needs it. :class:`PlannerTeacher` serves those replies to the tree collector by node path.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Mapping

from agentjax.agents.grammar import Delegation, Reply, format_call, parse_textcraft, textcraft_goal
from agentjax.agents.judge import JudgeRequest
from agentjax.agents.tree import Goal, Node, Tree, TreeLimits
from envs.base import Task
from envs.textcraft.env import TextCraftSynthEnv
from envs.textcraft.planner import Craft, plan
from envs.textcraft.recipes import RecipeBook
from envs.textcraft.shared import SharedCraft

_FUNCTIONS = """Reply with Python code in a <python>...</python> block (you may think first in <thought>...</thought>).
The code may only call these functions, one call per line, with literal arguments:
1. craft(ingredients: dict, target: tuple[str, int]) -> str
   Craft from the shared inventory. ingredients: {item: count} consumed; target: (item, total count produced),
   a multiple of the recipe's result count. Example: craft({"m0_ore": 2}, ("m0_i1", 4))
2. get_info(items: list) -> list[dict]: recipes, crafting depth and count held of each item.
3. view_inventory() -> dict: the shared inventory.
4. finish(message: str): stop and report to whoever gave you the goal. Call it when your goal is done."""
_LAUNCH = """
5. launch_subagent(targets: dict, context: str = "") -> str
   Give a sub-agent the goal of crafting {item: count} from the same shared inventory; you wait for its finish
   message. Several at once run concurrently: await asyncio.gather(launch_subagent({"a": 2}), launch_subagent({"b": 1}))
   Write the delegation as the last statement of your code."""


@dataclasses.dataclass(frozen=True)
class TextCraftTreeConfig:
    show_recipes: bool = True  # the goal's recipe tree in each node's first message
    root_needs_finish: bool = True  # root success also needs a finish (the released check); else the targets only
    finish_message: str = "Done: the items are crafted."  # the constrained decoder's finish reply
    planner_replies: bool = False  # admissible() also offers the planner tree's reply (planner_tree) at the node


class TextCraftTreeWorld:
    """The shared world of one TextCraft(-Synth) tree (module docstring)."""

    def __init__(self, task: Task, *, env: object | None = None, config: TextCraftTreeConfig = TextCraftTreeConfig()):
        self.config = config
        self.world = SharedCraft(env if env is not None else TextCraftSynthEnv(), task)
        self.book: RecipeBook = self.world.book
        self._plan: PlannedNode | None | bool = False  # planner_tree of the task (None: no plan), made on first use

    # -- prompts and parsing -----------------------------------------------------------------------------------------
    def root_goal(self) -> Goal:
        targets = dict(self.world.targets)
        return Goal(text=textcraft_goal(targets), targets=targets)

    def parse(self, text: str) -> Reply:
        return parse_textcraft(text)

    def system_prompt(self, can_delegate: bool) -> str:
        who = "You are one agent of a team crafting items in a text crafting game. The team shares one inventory.\n"
        return who + _FUNCTIONS + (_LAUNCH if can_delegate else "")

    def begin(self, node: Node) -> str:
        node.start_state = self.world.counts(sorted(node.goal.targets))
        parts = [f"Goal: {node.goal.text}"]
        if self.config.show_recipes:
            recipes = sorted(self.book.tree(tuple(node.goal.targets)), key=lambda r: r.output)
            parts.append("Recipes:\n" + "\n".join(
                f"{r.output} (makes {r.count}) <- {', '.join(f'{s.count} {s.name}' for s in r.inputs)}"
                for r in recipes))
        parts.append(f"Inventory (shared): {json.dumps(self.world.inventory())}")
        parts.append(f"You have {node.budget} steps.")
        return "\n\n".join(parts)

    # -- acting --------------------------------------------------------------------------------------------------------
    def act(self, node: Node, reply: Reply) -> tuple[str, bool]:
        lines, valid = [], True
        for call in reply.calls:
            if call.name == "craft":
                text, ok = self.world.craft(call.args["ingredients"], call.args["target"])
            elif call.name == "get_info":
                text, ok = json.dumps(self.world.recipe_info(call.args["items"])), True
            else:
                text, ok = json.dumps(self.world.inventory()), True
            lines.append(f"{call.source} -> {text}")
            valid &= ok
        return "\n".join(lines), valid

    def child_goal(self, node: Node, delegation: Delegation) -> tuple[Goal | None, str]:
        unknown = [item for item in delegation.targets if item not in self.book.items]
        if unknown:
            return None, f"unknown item(s) {', '.join(unknown)}"
        return Goal(text=delegation.goal, targets=dict(delegation.targets), context=delegation.context), ""

    def end(self, node: Node) -> None:
        node.end_state = self.world.counts(sorted(node.goal.targets))

    def fork(self, node: Node) -> TextCraftTreeWorld:
        """An isolated copy of the shared inventory as it is now, whose fork tree's root (node 0) plays ``node`` from
        its start (SERA's counterfactual branches of a delegated child)."""
        del node  # every agent of a TextCraft tree acts on the one inventory: nothing is per node
        twin = copy.copy(self)
        twin.world = self.world.fork()
        return twin

    def adopt(self, twin: TextCraftTreeWorld) -> None:
        """Takes over ``twin``'s whole state (rubric-guided search commits the chosen candidate's world)."""
        self.world.restore(twin.world.snapshot())

    # -- checks -------------------------------------------------------------------------------------------------------
    def judge_request(self, node: Node) -> JudgeRequest:
        trajectory = "\n".join(f"{t.reply.text}\n=> {t.feedback}" for t in node.turns)
        return JudgeRequest(goal=node.goal.text, finished=node.finished, finish_message=node.finish_message or "",
                            trajectory=trajectory, final_state=f"Inventory: {json.dumps(self.world.inventory())}",
                            targets=dict(node.goal.targets), start_counts=dict(node.start_state or {}),
                            end_counts=dict(node.end_state or {}), state=self.world.snapshot())

    def root_success(self, tree: Tree) -> bool:
        return self.world.won and (tree.root.finished or not self.config.root_needs_finish)

    def planned_reply(self, tree: Tree, node: Node) -> str | None:
        """The planner tree's reply (:func:`planner_tree` with the tree's limits) at the node's path and turn, if the
        tree has followed the plan to this node (the planned node there has the node's targets)."""
        if self._plan is False:
            try:
                self._plan = planner_tree(tree.task, book=self.book, limits=tree.limits)
            except ValueError:
                self._plan = None
        if self._plan is None:
            return None
        try:
            planned = self._plan.at(node_path(tree, node))
        except IndexError:
            return None
        turn = len(node.turns)
        if dict(planned.targets) != dict(node.goal.targets) or turn >= len(planned.replies):
            return None
        return planned.replies[turn]

    def finish_reply(self) -> str:
        """The reply that finishes a node with the configured message (the constrained decoder's finish)."""
        return _code(format_call("finish", self.config.finish_message))

    def admissible(self, tree: Tree, node: Node) -> list[str]:
        """For constrained decoding: the planner's next craft toward the node's goal, view_inventory, finish and,
        while the node may delegate, a launch of each ingredient of its targets still short; with
        ``planner_replies`` also the planner tree's reply (:meth:`planned_reply`), so that a policy warm-started on
        planner trees can reproduce them under the constraint."""
        inventory = self.world.inventory()
        wanted = {item: n + (node.start_state or {}).get(item, 0) for item, n in node.goal.targets.items()}
        steps = plan(self.book, inventory, wanted, allow_get=False)
        replies = [_code(format_call("view_inventory")), self.finish_reply()]
        crafts = [a for a in steps if isinstance(a, Craft)]
        if crafts:
            replies.append(_code(_craft_call(crafts[0])))
        if tree.limits.can_delegate(node.depth) and crafts:
            top = {c.recipe.output: c for c in crafts}
            for item in wanted:
                if item in top:
                    for slot, member in zip(top[item].recipe.inputs, top[item].members, strict=True):
                        if member in top:
                            n = slot.count * top[item].times
                            replies.append(_code(f"await {format_call('launch_subagent', {member: n})}"))
        planned = self.planned_reply(tree, node) if self.config.planner_replies else None
        if planned is not None:
            replies.append(planned)
        return sorted(set(replies))


def _code(body: str) -> str:
    return f"<python>\n{body}\n</python>"


def _craft_call(craft: Craft) -> str:
    ingredients = {m: s.count * craft.times for s, m in zip(craft.recipe.inputs, craft.members, strict=True)}
    return format_call("craft", ingredients, (craft.recipe.output, craft.recipe.count * craft.times))


# ------------------------------------------------------------------------------------------------ the planner tree


@dataclasses.dataclass(frozen=True)
class PlannedNode:
    """A node of a planner-made tree: its targets, its replies in order, its children in launch order."""

    targets: Mapping[str, int]
    replies: tuple[str, ...]
    children: tuple[PlannedNode, ...] = ()

    def at(self, path: tuple[int, ...]) -> PlannedNode:
        node = self
        for i in path:
            node = node.children[i]
        return node

    def count(self) -> int:
        return 1 + sum(c.count() for c in self.children)


def planner_tree(task: Task, *, book: RecipeBook | None = None, limits: TreeLimits | None = None,
                 max_calls: int = 16, finish: str = "Done: {goal}.") -> PlannedNode:
    """The replies of an ideal recursive agent on ``task`` from its initial inventory (module docstring).

    Raises ValueError when the task needs a base item the inventory lacks (no plan without ``get``), when a node's
    replies cannot fit its budget with ``max_calls`` calls per reply, or when the tree passes ``limits.max_nodes``.
    """
    book = book if book is not None else TextCraftSynthEnv().book
    limits = limits if limits is not None else TreeLimits()
    inventory = dict(task.meta.get("initial_inventory", {}))
    targets = dict(task.meta["target_items"])
    actions = plan(book, inventory, targets, allow_get=False)
    if any(not isinstance(a, Craft) for a in actions):
        raise ValueError(f"planner_tree: task {task.task_id} needs base items its inventory lacks")
    crafts: dict[str, Craft] = {a.recipe.output: a for a in actions}
    order = list(crafts)  # ingredients before the items that consume them
    consumers: dict[str, set[str]] = {x: set() for x in order}
    for x, c in crafts.items():
        for m in c.members:
            if m in consumers:
                consumers[m].add(x)
    demand = {x: targets.get(x, 0) + sum(crafts[c].times * s.count for c in consumers[x]
                                         for s, m in zip(crafts[c].recipe.inputs, crafts[c].members, strict=True)
                                         if m == x) for x in order}
    short = {x: demand[x] - inventory.get(x, 0) for x in order}

    def build(goal: Mapping[str, int], owned: set[str], depth: int) -> PlannedNode:
        mine = [x for x in order if x in owned and x in goal]
        top: list[str] = []
        if limits.can_delegate(depth):
            for t in mine:
                for m in crafts[t].members:
                    if m in owned and m not in goal and m not in top and consumers[m] <= set(goal):
                        top.append(m)
            top = top[: limits.max_children]
        owner: dict[str, str | None] = {}
        for x in reversed(order):  # consumers before their ingredients
            if x not in owned:
                continue
            if x in goal or x in top:
                owner[x] = None if x in goal else x
            else:
                owners = {owner[c] for c in consumers[x]}
                owner[x] = owners.pop() if len(owners) == 1 else None
        children = tuple(build({i: short[i]}, {x for x in owned if owner[x] == i}, depth + 1) for i in top)
        before = [_craft_call(crafts[x]) for x in order if x in owned and owner[x] is None and x not in goal]
        after = [_craft_call(crafts[x]) for x in mine]
        fixed = (1 if children else 0) + 1  # the delegation and the finish
        per = 1
        while -(-len(before) // per) + -(-len(after) // per) + fixed > limits.max_steps:
            per += 1
            if per > max_calls:
                raise ValueError(f"planner_tree: a node of task {task.task_id} needs more than {limits.max_steps} "
                                 f"replies with {max_calls} calls each")
        replies = [_code("\n".join(before[i:i + per])) for i in range(0, len(before), per)]
        if children:
            launches = [format_call("launch_subagent", dict(c.targets)) for c in children]
            replies.append(_code(f"await {launches[0]}" if len(launches) == 1 else
                                 "await asyncio.gather(\n" + "".join(f"    {x},\n" for x in launches) + ")"))
        replies += [_code("\n".join(after[i:i + per])) for i in range(0, len(after), per)]
        text = ", ".join(f"{n}x {item}" for item, n in goal.items())
        replies.append(_code(format_call("finish", finish.format(goal=f"crafted {text}"))))
        return PlannedNode(targets=dict(goal), replies=tuple(replies), children=children)

    root = build(targets, set(order), 0)
    if root.count() > limits.max_nodes:
        raise ValueError(f"planner_tree: {root.count()} nodes for task {task.task_id}, more than "
                         f"limits.max_nodes={limits.max_nodes}")
    return root


def node_path(tree: Tree, node: Node) -> tuple[int, ...]:
    """The ranks from the root down to ``node`` (:meth:`Tree.path <agentjax.agents.tree.Tree.path>`)."""
    return tree.path(node)


class PlannerTeacher:
    """Serves planner-made replies to the tree collector (``teacher=``): the planned node at the runtime node's path,
    its reply at the node's turn. ``plans`` maps a task id to its :func:`planner_tree`; missing ones are planned
    on first use with ``limits`` (default: the tree's, i.e. the collector's)."""

    def __init__(self, plans: Mapping[str, PlannedNode] | None = None, *, limits: TreeLimits | None = None,
                 book: RecipeBook | None = None):
        self.plans = dict(plans or {})
        self.limits, self.book = limits, book

    def __call__(self, tree: Tree, node: Node) -> str:
        if tree.task.task_id not in self.plans:
            self.plans[tree.task.task_id] = planner_tree(tree.task, book=self.book, limits=self.limits or tree.limits)
        planned = self.plans[tree.task.task_id].at(node_path(tree, node))
        turn = len(node.turns)
        return planned.replies[turn] if turn < len(planned.replies) else _code(format_call("view_inventory"))


__all__ = [
    "PlannedNode",
    "PlannerTeacher",
    "TextCraftTreeConfig",
    "TextCraftTreeWorld",
    "node_path",
    "planner_tree",
]
