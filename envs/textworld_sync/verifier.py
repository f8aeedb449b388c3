"""A programmatic subtask verifier over the released TextWorld-Sync engine's state.

SERA labels TextWorld-Sync children with an external LLM judge; this verifier is the offline default behind the
project's judge interface: it decides structured goals over the shared state, read atomically (``World.read``).
Goals are dicts with a ``kind``:

========================  ===============================================================================
``task_success``          the root check (the engine's scorer): every ingredient collected and processed
                          exactly as required, every dish prepared and eaten
``dish_complete``         ``dish``: the scorer's per-dish success (its ingredients complete, prepared, eaten)
``dish_prepared``         ``dish``: prepared (eaten or not)
``dish_eaten``            ``dish``: eaten
``ingredient_ready``      ``ingredient``: collected and processed exactly as its recipe says (then it is on
                          the shared prepared counter)
``ingredient_collected``  ``ingredient``: taken (in the inventory or already on the counter)
``ingredient_processed``  ``ingredient``, ``how``: the ingredient has the preparation ``how`` (sliced, diced,
                          chopped, minced, fried, roasted, grilled, baked, boiled; or a verb: slice, fry, ...)
``gate_open``             the shared kitchen gate is open
``at``                    ``agent``, ``room``: the agent stands in the room
``all`` / ``any``         ``goals``: a list of goals; ``not``: ``goal``
========================  ===============================================================================

A goal naming an unknown kind, dish, ingredient, agent or room, or lacking a field, raises ValueError naming the
problem and the valid choices. :func:`goal_from_text` reads a child's natural-language goal into such a dict (a
heuristic over the task's own dish ids and ingredient names; None when it names none of them);
:func:`verify_goal` is the ``verify(goal, state)`` callable the judge interface takes.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from typing import Any

from envs.textworld_sync import rules
from envs.textworld_sync.state import COOK_TOOL, CUT_VERB, WorldState
from envs.textworld_sync.world import World

Goal = Mapping[str, Any]
VERBS = {"slice": "sliced", "dice": "diced", "chop": "chopped", "mince": "minced", "fry": "fried",
         "roast": "roasted", "grill": "grilled", "bake": "baked", "boil": "boiled"}
PREPARATIONS = tuple(CUT_VERB) + tuple(COOK_TOOL)


@dataclasses.dataclass(frozen=True)
class Verdict:
    holds: bool
    reason: str  # a sentence saying what was checked and found


def check(world: World | WorldState, goal: Goal) -> Verdict:
    """Whether ``goal`` holds now, with the reason (module docstring)."""
    if isinstance(world, World):
        return world.read(lambda s: _check(s, goal))
    if isinstance(world, WorldState):
        return _check(world, goal)
    raise TypeError(f"check() takes a World or a WorldState, got {type(world).__name__}")


def verify(world: World | WorldState, goal: Goal) -> bool:
    return check(world, goal).holds


def _field(goal: Goal, name: str) -> Any:
    if name not in goal:
        raise ValueError(f"goal {dict(goal)!r} of kind {goal.get('kind')!r} needs the field {name!r}")
    return goal[name]


def _named(goal: Goal, field: str, pool: list[str] | tuple[str, ...], what: str) -> str:
    name = _field(goal, field)
    if name not in pool:
        raise ValueError(f"unknown {what} {name!r} in goal field {field!r}; known: {list(pool)}")
    return name


def _task_success(s: WorldState, goal: Goal) -> Verdict:
    report = rules.score(s)
    return Verdict(report["task_success"], f"{report['completed_dishes']}/{report['total_dishes']} dishes complete"
                   + ("; the task failed" if report["task_failure"] else ""))


def _dish_complete(s: WorldState, goal: Goal) -> Verdict:
    dish = _named(goal, "dish", s.dish_ids, "dish")
    row = next(r for r in rules.score(s)["dish_results"] if r["dish_id"] == dish)
    return Verdict(row["task_success"], f"{dish}: {row['completed_ingredients']}/{row['total_ingredients']} "
                   f"ingredients complete, prepared={row['meal_prepared']}, eaten={row['meal_eaten']}")


def _dish_flag(which: str) -> Callable[[WorldState, Goal], Verdict]:
    def fn(s: WorldState, goal: Goal) -> Verdict:
        dish = _named(goal, "dish", s.dish_ids, "dish")
        holds = dish in (s.prepared if which == "prepared" else s.eaten)
        return Verdict(holds, f"{dish} is {'' if holds else 'not '}{which}")

    return fn


def _ingredient(s: WorldState, goal: Goal):
    return s.items[_named(goal, "ingredient", list(s.items), "ingredient")]


def _ready(s: WorldState, goal: Goal) -> Verdict:
    item = _ingredient(s, goal)
    holds = item.collected and not item.deleted and item.actual == item.expected
    return Verdict(holds, f"the {item.name} is {'collected' if item.collected else 'not collected'} and "
                   f"{', '.join(sorted(item.actual)) or 'unprocessed'}; the recipe says "
                   f"{', '.join(sorted(item.expected))}")


def _collected(s: WorldState, goal: Goal) -> Verdict:
    item = _ingredient(s, goal)
    return Verdict(item.collected, f"the {item.name} is {'' if item.collected else 'not '}collected")


def _processed(s: WorldState, goal: Goal) -> Verdict:
    item = _ingredient(s, goal)
    how = VERBS.get(str(_field(goal, "how")), str(goal["how"]))
    if how not in PREPARATIONS:
        raise ValueError(f"unknown preparation {goal['how']!r}; use one of {PREPARATIONS} or a verb {list(VERBS)}")
    return Verdict(how in item.actual, f"the {item.name} is {', '.join(sorted(item.actual)) or 'unprocessed'}")


def _gate_open(s: WorldState, goal: Goal) -> Verdict:
    return Verdict(s.gate_open, f"the gate is {'open' if s.gate_open else 'closed'}")


def _at(s: WorldState, goal: Goal) -> Verdict:
    agent = _named(goal, "agent", list(s.locations), "agent")
    room = _named(goal, "room", s.rooms, "room")
    return Verdict(s.locations[agent] == room, f"{agent} is in the {s.locations[agent]}")


def _combine(kind: str) -> Callable[[WorldState, Goal], Verdict]:
    def fn(s: WorldState, goal: Goal) -> Verdict:
        if kind == "not":
            inner = _check(s, _field(goal, "goal"))
            return Verdict(not inner.holds, f"not ({inner.reason})")
        goals = _field(goal, "goals")
        if not isinstance(goals, list | tuple):
            raise ValueError(f"goal field 'goals' must be a list of goals, got {type(goals).__name__}")
        verdicts = [_check(s, g) for g in goals]
        holds = all(v.holds for v in verdicts) if kind == "all" else any(v.holds for v in verdicts)
        return Verdict(holds, "; ".join(v.reason for v in verdicts))

    return fn


_KINDS: dict[str, Callable[[WorldState, Goal], Verdict]] = {
    "task_success": _task_success, "dish_complete": _dish_complete, "dish_prepared": _dish_flag("prepared"),
    "dish_eaten": _dish_flag("eaten"), "ingredient_ready": _ready, "ingredient_collected": _collected,
    "ingredient_processed": _processed, "gate_open": _gate_open, "at": _at,
    "all": _combine("all"), "any": _combine("any"), "not": _combine("not"),
}
KINDS = tuple(_KINDS)


def _check(s: WorldState, goal: Goal) -> Verdict:
    if not isinstance(goal, Mapping):
        raise ValueError(f"a goal is a dict with a 'kind', got {type(goal).__name__}: {goal!r}")
    if goal.get("kind") not in _KINDS:
        raise ValueError(f"unknown goal kind {goal.get('kind')!r}; kinds are {KINDS}")
    return _KINDS[goal["kind"]](s, goal)


def subgoals(world: World | WorldState) -> list[dict[str, Any]]:
    """The root task's natural subgoals: per dish, each ingredient ready, then the dish complete; last the task."""

    def make(s: WorldState) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for d in s.dish_ids:
            out += [{"kind": "ingredient_ready", "ingredient": n} for n in s.recipe(d)]
            out.append({"kind": "dish_complete", "dish": d})
        return out + [{"kind": "task_success"}]

    return world.read(make) if isinstance(world, World) else make(world)


def describe(goal: Goal) -> str:
    """A goal as an instruction sentence (prompts, counterfactual subtasks)."""
    kind = goal.get("kind")
    text = {
        "task_success": lambda: "Prepare and eat every dish, with every ingredient processed as its recipe says.",
        "dish_complete": lambda: f"Get every ingredient of {goal['dish']} ready, then prepare and eat {goal['dish']}.",
        "dish_prepared": lambda: f"Prepare {goal['dish']}.",
        "dish_eaten": lambda: f"Prepare and eat {goal['dish']}.",
        "ingredient_ready": lambda: f"Collect the {goal['ingredient']} and process it exactly as its recipe says.",
        "ingredient_collected": lambda: f"Take the {goal['ingredient']}.",
        "ingredient_processed": lambda: f"Make the {goal['ingredient']} {VERBS.get(goal['how'], goal['how'])}.",
        "gate_open": lambda: "Open the kitchen gate.",
        "at": lambda: f"Go to the {goal['room']}.",
        "all": lambda: " ".join(describe(g) for g in goal["goals"]),
        "any": lambda: " Or: ".join(describe(g) for g in goal["goals"]),
        "not": lambda: f"Make sure this does not happen: {describe(goal['goal'])}",
    }.get(kind)
    if text is None:
        raise ValueError(f"unknown goal kind {kind!r}; kinds are {KINDS}")
    return text()


def goal_from_text(world: World | WorldState, text: str) -> dict[str, Any] | None:
    """A structured goal for a child's natural-language goal, or None when it names no dish nor ingredient of the
    task. Each ingredient named must be ready; each dish named must be eaten when the text says "eat", prepared when
    it says "prepare <dish>" (and not "eat"), else have every ingredient ready; without a dish or ingredient, "every
    dish" / "all dishes" / "the whole task" means the root check."""

    def make(s: WorldState) -> dict[str, Any] | None:
        low = " ".join(str(text).lower().split())
        pattern = {d: re.escape(d).replace("_", "[_ ]?") for d in s.dish_ids}
        dishes = [d for d in s.dish_ids if re.search(rf"\b{pattern[d]}\b", low)]
        names = [n for n in s.items if re.search(rf"\b{re.escape(n)}\b", low)]
        goals: list[dict[str, Any]] = [{"kind": "ingredient_ready", "ingredient": n} for n in names]
        for d in dishes:
            if re.search(r"\beat\b", low):
                goals.append({"kind": "dish_eaten", "dish": d})
            elif re.search(rf"\bprepare\s+(?:the\s+)?(?:meal\s+|dish\s+)?{pattern[d]}\b", low):
                goals.append({"kind": "dish_prepared", "dish": d})
            else:
                goals += [{"kind": "ingredient_ready", "ingredient": n} for n in s.recipe(d) if n not in names]
        if not goals and re.search(r"\b(every dish|all (the )?dishes|whole task|entire task)\b", low):
            return {"kind": "task_success"}
        if not goals:
            return None
        return goals[0] if len(goals) == 1 else {"kind": "all", "goals": goals}

    return world.read(make) if isinstance(world, World) else make(world)


def verify_goal(goal: str | Goal, state: World | WorldState) -> bool:
    """The judge interface's ``verify(goal, state)``: a structured goal, or a child's goal text read by
    :func:`goal_from_text` (a text naming nothing the verifier can check is not verified: False)."""
    if isinstance(goal, str):
        parsed = goal_from_text(state, goal)
        return parsed is not None and verify(state, parsed)
    return verify(state, goal)
