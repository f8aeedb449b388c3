"""The oracle of the released TextWorld-Sync engine: a greedy planner, for the whole task or one subtask.

:func:`next_command` gives an agent's next command towards a goal of dishes (each to be prepared and eaten) and/or
ingredients (each to be collected and processed as its recipe says, i.e. on the prepared counter); by default the
whole task. It reads the state only and always returns a valid action of the agent, in this order of preference:

1. a cut or cook that a goal ingredient in the shared inventory still needs (its tool free);
2. ``take`` a goal ingredient lying here;
3. ``eat`` / ``prepare`` a goal dish;
4. when the inventory is full and a goal ingredient still has to be taken: any cut or cook of what it holds (an item
   leaves the inventory once ready, which frees the room);
5. ``open door`` when a goal ingredient is behind the closed gate;
6. ``go to`` the room holding the most goal ingredients still to take, when none is left here;
7. otherwise ``look around``: a wait (a tool cooling down, or another agent holding what is needed), or nothing
   left to do.

Every command of 1-3 is one the task needs anyway and 4-6 are only taken when nothing needed is possible, so a
single agent solves a task in (takes + cuts + cooks + 2 per dish + moves + gate) commands plus the waits that tool
cooldowns force; the tests run it on a sample of every family and difficulty within the task's own budget, and the
benchmark over the splits. With several agents on one world, each calling it for its own subtask (disjoint
dishes), the team solves the task too (tests). Any interleaving is safe: a command is chosen from the state it will
be applied to when the caller holds the world's lock across both (:meth:`World.locked`).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable

from envs.textworld_sync import rules
from envs.textworld_sync.state import WorldState

WAIT = "look around"


class Unknown(ValueError):
    """A goal names a dish or ingredient the task does not have."""


def goal_ingredients(s: WorldState, dishes: Iterable[str] | None, ingredients: Iterable[str] | None) -> list[str]:
    """The ingredient names a goal needs on the counter, in recipe order; both None: the whole task."""
    dishes = list(dishes) if dishes is not None else (None if ingredients is not None else s.dish_ids)
    unknown = sorted(set(dishes or ()) - set(s.dish_ids)) + sorted(set(ingredients or ()) - set(s.items))
    if unknown:
        raise Unknown(f"unknown dish(es) or ingredient(s) {unknown}; dishes {s.dish_ids}, ingredients "
                      f"{list(s.items)}")
    names = {n for d in dishes or () for n in s.recipe(d)} | set(ingredients or ())
    return [n for n in s.items if n in names]


def next_command(s: WorldState, agent: str, dishes: Iterable[str] | None = None,
                 ingredients: Iterable[str] | None = None) -> str:
    """The agent's next command towards the goal (module docstring); ``look around`` when nothing is to be done."""
    dish_goal = list(dishes) if dishes is not None else (s.dish_ids if ingredients is None else [])
    needed = goal_ingredients(s, dish_goal, ingredients)
    valid = rules.valid_actions(s, agent)
    allowed = set(valid)
    for name in s.inventory:  # 1
        if name in needed:
            for command in rules.item_actions(s, name):
                return command
    for name in needed:  # 2
        if f"take {name}" in allowed:
            return f"take {name}"
    for dish in dish_goal:  # 3
        for command in (f"eat {dish}", f"prepare {dish}"):
            if command in allowed:
                return command
    to_take = [s.items[n] for n in needed if not s.items[n].collected]
    if to_take and s.capacity and len(s.inventory) >= s.capacity:  # 4
        for name in s.inventory:
            for command in rules.item_actions(s, name):
                return command
    if "open door" in allowed and any(not s.accessible(i) for i in to_take):  # 5
        return "open door"
    here = s.locations[agent]
    rooms = [i.room for i in to_take if s.accessible(i)]
    if rooms and here not in rooms:  # 6
        return f"go to {max(dict.fromkeys(rooms), key=rooms.count)}"
    return WAIT  # 7


def done(s: WorldState, dishes: Iterable[str] | None = None, ingredients: Iterable[str] | None = None) -> bool:
    """Whether the goal holds: its dishes eaten and its ingredients on the counter (both None: the task won)."""
    if dishes is None and ingredients is None:
        return rules.score(s)["task_success"]
    return (all(d in s.eaten for d in dishes or ())
            and all(n in s.counter for n in goal_ingredients(s, [], ingredients)))


def plan(s: WorldState, agent: str, dishes: Iterable[str] | None = None, ingredients: Iterable[str] | None = None,
         *, max_commands: int | None = None) -> list[str]:
    """The commands :func:`next_command` issues from ``s`` (a copy; ``s`` is not changed) until the goal holds, the
    world is done or ``max_commands`` (default: the budget left) are issued, the agent acting alone."""
    s = copy.deepcopy(s)
    dishes = list(dishes) if dishes is not None else None
    ingredients = list(ingredients) if ingredients is not None else None
    out: list[str] = []
    for _ in range(s.budget_left if max_commands is None else max_commands):
        if s.done or done(s, dishes, ingredients):
            break
        command = next_command(s, agent, dishes, ingredients)
        out.append(command)
        rules.transition(s, agent, command)
    return out
