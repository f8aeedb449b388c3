"""One crafting world shared by the agents of a recursive-agent tree (SERA on TextCraft-Synth).

In SERA's TextCraft-Synth runtime (the released code's platoon executor) a child agent does not get a copy of its
parent's inventory: every node of a tree crafts from, and into, the same inventory. :class:`SharedCraft` is that
inventory: one TextCraft(-Synth) engine (``envs/textcraft/env.py``) behind a lock, with the calls of the tree
agents' grammar (``agentjax/agents/grammar.py``) as methods::

    world = SharedCraft(TextCraftSynthEnv(), task)
    world.craft({"m0_ore": 4}, ("m0_i1", 4))   # -> ("Crafted 4 m0_i1", True)
    world.recipe_info(["m0_i1"])               # recipes, depth, count held (a read)
    world.inventory()                          # a copy of {item: count}

Every read and every transition takes the lock and finishes before the next one starts, so agents that act
concurrently (threads, or the tree collector's nodes stepped one after another within a turn) see a sequence of
whole calls, never half a craft. Each method returns ``(text, valid)`` like the engine.

``craft(ingredients, (item, count))``: the inputs are the engine's command ``craft count item using n a, m b`` (the
engine's rules: exact multiples of the one recipe, all in the inventory). The engine ignores the stated output
count; here it must equal what the inputs make (the released executor's rule: the count is the total produced), or
the craft is undone and refused. The engine's own step counter and step limit are not used: budgets belong to the
tree's nodes, and the world never ends (the root's success is :attr:`won`, read when the root stops).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

from envs.base import Task
from envs.textcraft.env import TextCraftState, _CraftEnv


class SharedCraft:
    """A TextCraft(-Synth) inventory that several agents share, each call atomic (module docstring)."""

    def __init__(self, env: _CraftEnv, task: Task):
        self._env = env
        self._lock = threading.RLock()
        self.transitions = 0  # successful crafts
        self.calls = 0  # every read and transition
        env.reset(task)
        self.listing = env.text  # the first observation: crafting commands and the goal

    # -- reads -------------------------------------------------------------------------------------------------------
    @property
    def task(self) -> Task:
        return self._env.task

    @property
    def book(self):
        return self._env.book

    @property
    def targets(self) -> Mapping[str, int]:
        return dict(self._env.targets)

    def inventory(self) -> dict[str, int]:
        """A copy of the inventory, ``{item: count}`` with counts > 0, in name order."""
        with self._lock:
            self.calls += 1
            return dict(sorted(self._env.inventory.items()))

    def counts(self, items: Sequence[str]) -> dict[str, int]:
        """The counts held of ``items`` (0 when absent), in one atomic read."""
        with self._lock:
            self.calls += 1
            return {item: self._env.inventory.get(item, 0) for item in items}

    @property
    def won(self) -> bool:
        """The task's targets are all held (the engine's success check)."""
        with self._lock:
            return self._env.won

    def recipe_info(self, items: Sequence[str]) -> list[dict[str, Any]]:
        """Per item: whether it has a recipe, is a base item, how many are held, its crafting depth (0 for a base
        item, 1 + the deepest ingredient otherwise) and its recipes (``ingredients``, ``result_count``)."""
        book = self.book
        with self._lock:
            self.calls += 1
            out = []
            for item in items:
                recipes = book.recipes.get(item, ())
                out.append({
                    "item": item,
                    "can_craft": bool(recipes),
                    "is_base": item in book.items and not recipes,
                    "in_inventory": self._env.inventory.get(item, 0),
                    "crafting_depth": crafting_depth(book, item),
                    "recipes": [{"ingredients": {s.name: s.count for s in r.inputs}, "result_count": r.count}
                                for r in recipes],
                })
            return out

    # -- transitions -------------------------------------------------------------------------------------------------
    def craft(self, ingredients: Mapping[str, int], target: tuple[str, int]) -> tuple[str, bool]:
        """Consumes ``ingredients`` and makes ``target = (item, count)`` atomically (module docstring)."""
        if not ingredients:
            return "Error: craft needs at least one ingredient", False
        item, count = target
        book = self.book
        inputs = ", ".join(f"{n} {book.display(name)}" for name, n in ingredients.items())
        command = f"craft {count} {book.display(item)} using {inputs}"
        with self._lock:
            self.calls += 1
            env = self._env
            before = dict(env.inventory)
            text, valid = env._execute(command)  # the engine's rules; no step counter (module docstring)
            if valid:
                made = env.inventory.get(item, 0) - before.get(item, 0)
                if made != count:
                    env._set_inventory(before)
                    text, valid = f"Error: these ingredients make {made} {item}, not {count}", False
                else:
                    self.transitions += 1
            env.text = text
            return text, valid

    def snapshot(self) -> TextCraftState:
        with self._lock:
            return self._env.snapshot()

    def restore(self, snapshot: TextCraftState) -> None:
        with self._lock:
            self._env.restore(snapshot)

    def fork(self) -> SharedCraft:
        """An isolated copy of this world as it is now: a fresh engine of the same kind with the same inventory
        (SERA's counterfactual branches act on it without touching this one)."""
        with self._lock:
            twin = SharedCraft(type(self._env)(), self.task)
            twin.restore(self.snapshot())
            return twin


def crafting_depth(book, item: str, memo: dict[str, int] | None = None) -> int:
    """0 for an item without a recipe, else 1 + the largest depth among the ingredients of its first recipe (the
    recipe books are acyclic)."""
    memo = {} if memo is None else memo
    if item not in memo:
        recipes = book.recipes.get(item, ())
        memo[item] = 1 + max((crafting_depth(book, s.name, memo) for s in recipes[0].inputs), default=0) \
            if recipes else 0
    return memo[item]


__all__ = ["SharedCraft", "crafting_depth"]
