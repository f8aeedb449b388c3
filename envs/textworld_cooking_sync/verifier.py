"""A program verifier for subtasks given as structured goals: does the goal hold in the world state?

SERA labels TextWorld-Sync subtasks with an LLM judge because the root check (every dish eaten) does not label
arbitrary subtasks; this verifier answers the subtasks that can be stated as a goal over the shared state, read
atomically (``World.read``). Goals are dicts with a ``kind``:

=========================  ================================================================================
``all_dishes_eaten``       the root task: every dish prepared and eaten (the world is won)
``dish_prepared``          ``dish``: prepared (or already eaten), and not failed
``dish_eaten``             ``dish``: eaten
``ingredient_processed``   ``ingredient``, optional ``how``: the food is ``how`` (sliced / diced / chopped /
                           fried / roasted / grilled; raw / uncut: not cooked / not cut), not burned; without
                           ``how``, cooked and cut exactly as its recipe says. Holds also after the food went
                           into its dish (it keeps its state).
``ingredient_ready``       ``ingredient``: processed as its recipe says and carried (by ``agent`` if given),
                           or already in its prepared dish
``has``                    ``item``, optional ``agent``: the item is carried (by that agent; by anyone if not
                           given; with a shared inventory by the team)
``at``                     ``agent``, ``room``: the agent stands in the room
``located``                ``item``, ``room``: the item lies in the room (floor, on or in its furniture)
``open`` / ``unlocked``    ``target``: a door or container is open / not locked
``cookbook_read``          ``agent``: the agent has examined the cookbook
``all`` / ``any``          ``goals``: a list of goals; ``not``: ``goal``
=========================  ================================================================================

A goal that names an unknown kind, dish, food, item, room, agent or target, or lacks a field, raises ValueError
naming the problem and the valid choices.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from envs.textworld_cooking_sync.data import COOK_VERB, COOKING, CUT_VERB, CUTTING
from envs.textworld_cooking_sync.state import WorldState
from envs.textworld_cooking_sync.world import World

Goal = Mapping[str, Any]


@dataclasses.dataclass(frozen=True)
class Verdict:
    holds: bool
    reason: str  # a sentence saying why (what was checked, what was found)


def verify(world: World | WorldState, goal: Goal) -> bool:
    """Whether ``goal`` holds now (module docstring)."""
    return check(world, goal).holds


def check(world: World | WorldState, goal: Goal) -> Verdict:
    """:func:`verify` with the reason."""
    if isinstance(world, World):
        return world.read(lambda s: _check(s, goal))
    if isinstance(world, WorldState):
        return _check(world, goal)
    raise TypeError(f"verify() takes a World or a WorldState, got {type(world).__name__}")


def _field(goal: Goal, name: str) -> Any:
    if name not in goal:
        raise ValueError(f"goal {dict(goal)!r} of kind {goal.get('kind')!r} needs the field {name!r}")
    return goal[name]


def _dish(s: WorldState, goal: Goal):
    name = _field(goal, "dish")
    dish = s.dish(name)
    if dish is None:
        raise ValueError(f"unknown dish {name!r}; the world's dishes are {[d.name for d in s.dishes]}")
    return dish


def _named(s: WorldState, goal: Goal, field: str, pool: Mapping[str, Any], what: str) -> str:
    name = _field(goal, field)
    if name not in pool:
        raise ValueError(f"unknown {what} {name!r} in goal field {field!r}; known: {sorted(pool)}")
    return name


def _ingredient(s: WorldState, goal: Goal):
    name = _field(goal, "ingredient")
    for dish in s.dishes:
        for ing in dish.ingredients:
            if ing.food == name:
                return dish, ing
    foods = sorted(i.food for d in s.dishes for i in d.ingredients)
    raise ValueError(f"{name!r} is not an ingredient of any dish; the ingredients are {foods}")


def _all_dishes_eaten(s: WorldState, goal: Goal) -> Verdict:
    left = [d.name for d in s.dishes if d.status != "eaten"]
    if s.failed:
        return Verdict(False, f"the task failed: {s.failed}")
    return Verdict(not left, "every dish is eaten" if not left else f"not eaten yet: {left}")


def _dish_prepared(s: WorldState, goal: Goal) -> Verdict:
    dish = _dish(s, goal)
    if dish.name in s.failed:
        return Verdict(False, f"the {dish.name} failed: {s.failed[dish.name]}")
    return Verdict(dish.status in ("prepared", "eaten"), f"the {dish.name} is {dish.status}")


def _dish_eaten(s: WorldState, goal: Goal) -> Verdict:
    dish = _dish(s, goal)
    return Verdict(dish.status == "eaten", f"the {dish.name} is {dish.status}")


HOW = tuple(COOKING) + tuple(CUTTING)


def _processed(s: WorldState, goal: Goal) -> Verdict:
    _, ing = _ingredient(s, goal)
    food = s.items[ing.food]
    state = f"{food.cutting}, {'burned' if food.burned else food.cooking}"
    if food.burned:
        return Verdict(False, f"the {ing.food} is burned")
    how = goal.get("how")
    if how is None:
        ok = food.cooking == ing.cooking and food.cutting == ing.cutting
        return Verdict(ok, f"the {ing.food} is {state}; the recipe says {ing.cutting}, {ing.cooking}")
    how = {**{v: k for k, v in COOK_VERB.items()}, **{v: k for k, v in CUT_VERB.items()}}.get(how, how)
    if how not in HOW:
        raise ValueError(f"unknown processing {goal['how']!r}; use one of {HOW} (or the verbs slice, fry, ...)")
    ok = food.cooking == how if how in COOKING else food.cutting == how
    return Verdict(ok, f"the {ing.food} is {state}")


def _ready(s: WorldState, goal: Goal) -> Verdict:
    dish, ing = _ingredient(s, goal)
    if dish.status != "pending" and dish.name not in s.failed:
        return Verdict(True, f"the {ing.food} is in the prepared {dish.name}")
    processed = _processed(s, {"ingredient": ing.food})
    if not processed.holds:
        return processed
    agent = goal.get("agent")
    holder = s.holder(agent) if agent is not None else None
    if agent is not None and agent not in s.agents:
        raise ValueError(f"unknown agent {agent!r}; agents are {sorted(s.agents)}")
    where = s.items[ing.food].where
    ok = where[0] == "held" and (holder is None or where[1] == holder)
    return Verdict(ok, processed.reason + ("; it is carried" if ok else "; it is not carried"))


def _has(s: WorldState, goal: Goal) -> Verdict:
    name = _named(s, goal, "item", s.items, "item")
    where = s.items[name].where
    agent = goal.get("agent")
    if agent is not None:
        if agent not in s.agents:
            raise ValueError(f"unknown agent {agent!r}; agents are {sorted(s.agents)}")
        ok = where == ("held", s.holder(agent))
        return Verdict(ok, f"the {name} is {'carried by ' + agent if ok else 'not carried by ' + agent}")
    return Verdict(where[0] == "held", f"the {name} is {'carried' if where[0] == 'held' else 'not carried'}")


def _at(s: WorldState, goal: Goal) -> Verdict:
    agent = _named(s, goal, "agent", s.agents, "agent")
    room = _named(s, goal, "room", s.rooms, "room")
    return Verdict(s.agents[agent].room == room, f"{agent} is in the {s.agents[agent].room}")


def _located(s: WorldState, goal: Goal) -> Verdict:
    name = _named(s, goal, "item", s.items, "item")
    room = _named(s, goal, "room", s.rooms, "room")
    here = s.room_of(s.items[name])
    return Verdict(here == room, f"the {name} is {'in the ' + here if here else 'not lying in any room'}")


def _openness(want: str) -> Callable[[WorldState, Goal], Verdict]:
    def fn(s: WorldState, goal: Goal) -> Verdict:
        pool = {**s.doors, **{k: f for k, f in s.furniture.items() if f.kind == "container" and f.state}}
        name = _named(s, goal, "target", pool, "door or container")
        state = pool[name].state
        ok = state == "open" if want == "open" else state != "locked"
        return Verdict(ok, f"the {name} is {state}")

    return fn


def _cookbook_read(s: WorldState, goal: Goal) -> Verdict:
    agent = _named(s, goal, "agent", s.agents, "agent")
    ok = s.agents[agent].read_cookbook
    return Verdict(ok, f"{agent} has {'' if ok else 'not '}read the cookbook")


def _combine(kind: str) -> Callable[[WorldState, Goal], Verdict]:
    def fn(s: WorldState, goal: Goal) -> Verdict:
        if kind == "not":
            inner = _check(s, _field(goal, "goal"))
            return Verdict(not inner.holds, f"not ({inner.reason})")
        goals = _field(goal, "goals")
        if not isinstance(goals, list | tuple):
            raise ValueError(f"goal field 'goals' must be a list of goals, got {type(goals).__name__}")
        verdicts = [_check(s, g) for g in goals]
        ok = all(v.holds for v in verdicts) if kind == "all" else any(v.holds for v in verdicts)
        return Verdict(ok, "; ".join(v.reason for v in verdicts))

    return fn


_KINDS: dict[str, Callable[[WorldState, Goal], Verdict]] = {
    "all_dishes_eaten": _all_dishes_eaten,
    "dish_prepared": _dish_prepared,
    "dish_eaten": _dish_eaten,
    "ingredient_processed": _processed,
    "ingredient_ready": _ready,
    "has": _has,
    "at": _at,
    "located": _located,
    "open": _openness("open"),
    "unlocked": _openness("unlocked"),
    "cookbook_read": _cookbook_read,
    "all": _combine("all"),
    "any": _combine("any"),
    "not": _combine("not"),
}
KINDS = tuple(_KINDS)


def _check(s: WorldState, goal: Goal) -> Verdict:
    if not isinstance(goal, Mapping):
        raise ValueError(f"a goal is a dict with a 'kind', got {type(goal).__name__}: {goal!r}")
    kind = goal.get("kind")
    if kind not in _KINDS:
        raise ValueError(f"unknown goal kind {kind!r}; kinds are {KINDS}")
    return _KINDS[kind](s, goal)


def subgoals(world: World | WorldState) -> list[dict[str, Any]]:
    """The root task's natural subgoals, in recipe order: per dish, each ingredient ready, then the dish prepared
    and eaten; last, every dish eaten."""

    def make(s: WorldState) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for dish in s.dishes:
            out += [{"kind": "ingredient_ready", "ingredient": i.food} for i in dish.ingredients]
            out += [{"kind": "dish_prepared", "dish": dish.name}, {"kind": "dish_eaten", "dish": dish.name}]
        return out + [{"kind": "all_dishes_eaten"}]

    return world.read(make) if isinstance(world, World) else make(world)


def describe(goal: Goal) -> str:
    """A goal as an instruction sentence (for prompts, rubric-training subtasks)."""
    kind = goal.get("kind")
    if kind == "all_dishes_eaten":
        return "Prepare and eat every dish in the cookbook."
    if kind == "dish_prepared":
        return f"Prepare the {goal['dish']}."
    if kind == "dish_eaten":
        return f"Prepare and eat the {goal['dish']}."
    if kind == "ingredient_processed":
        how = goal.get("how")
        return (
            f"Make the {goal['ingredient']} {how}." if how else f"Process the {goal['ingredient']} as its recipe says."
        )
    if kind == "ingredient_ready":
        return f"Fetch the {goal['ingredient']} and process it as its recipe says."
    if kind == "has":
        return f"Take the {goal['item']}."
    if kind == "at":
        return f"Go to the {goal['room']}."
    if kind == "located":
        return f"Bring the {goal['item']} to the {goal['room']}."
    if kind in ("open", "unlocked"):
        return f"{'Open' if kind == 'open' else 'Unlock'} the {goal['target']}."
    if kind == "cookbook_read":
        return "Read the cookbook."
    if kind in ("all", "any"):
        return (" " if kind == "all" else " Or: ").join(describe(g) for g in goal["goals"])
    if kind == "not":
        return f"Make sure this does not happen: {describe(goal['goal'])}"
    raise ValueError(f"unknown goal kind {kind!r}; kinds are {KINDS}")
