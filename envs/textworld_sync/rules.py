"""The released TextWorld-Sync engine's transitions: valid actions, commands, score, observation and infos.

A re-implementation of the authors' ``CompositeCookingWorldCoordinator`` (GitHub ``OliverLeeXZ/SERA``,
``Runtime/environments/textworld/composite_cooking.py``) and ``score_task`` (``composite_scorer.py``), as read
there, on a :class:`~envs.textworld_sync.state.WorldState`. Function by function:

- :func:`valid_actions` (``_valid_actions``): ``look around``, ``inventory``, ``read cookbook``; ``go to <room>``
  for every other room; ``move north|south|east|west`` towards pantry / dining room / garden / supermarket when that
  room exists and is not the current one; ``open door`` while the gate is closed; ``take knife`` in the kitchen;
  ``take <item>`` for every item lying here, not yet collected, not behind the closed gate, while the inventory has
  room; then for each inventory item, in inventory order, the cuts (chop / slice / dice / mince) and cooks
  (``cook <item> in stove|oven``, ``cook <item> on grill``) its recipe still needs whose tool is not cooling down;
  ``prepare <dish>`` once every ingredient of the dish is on the counter; ``eat <dish>`` once prepared.
- :func:`transition` (``_step_locked``): a command is *accepted* when it is one of the valid actions exactly
  (after stripping) or, in any case and spacing, ``look around`` / ``inventory`` / ``view inventory`` / ``check
  inventory``. Every command, accepted or not, uses one step of the shared budget; then the score is computed
  (success: reward 1 and done; failure: done), the budget checked (done when spent) and the tool cooldowns advance.
  The observation is the agent's status text (:func:`observation`), whatever the command was: the engine writes no
  feedback sentence.
- :func:`apply` (``_apply``): ``take`` marks the item collected and puts it in the inventory; an item that needs no
  preparation goes at once to the prepared counter. A cut or cook adds the preparations of that verb or tool that
  the recipe expects (a cook also drops ``uncut`` unless the recipe keeps it); an item whose preparation equals the
  recipe's leaves the inventory for the counter. ``open door`` opens the gate for everyone; ``prepare`` / ``eat``
  mark the dish. ``take knife``, ``read cookbook``, ``look around`` and the inventory commands change nothing (the
  knife is never needed: cuts only need the knife's cooldown to be over). A tool used with cooldown c > 0 is
  unavailable for the next c steps of any agent.
- :func:`score` (``score_task`` over ``getObjectTree``): an ingredient is complete when collected, not deleted and
  its preparation equals the recipe's; a dish succeeds when its ingredients are complete and it is prepared and
  eaten; the task succeeds (score 1.0, else 0.0) when every dish does; it fails when an ingredient is deleted or has
  a preparation outside its recipe (which no valid command can cause).
"""

from __future__ import annotations

import re
from typing import Any

from envs.textworld_sync.state import (
    COOK_TOOL,
    CUT_VERB,
    DIRECTIONS,
    NO_PREPARATION,
    Event,
    WorldState,
    normalise,
)

LOOK_COMMANDS = frozenset({"look around", "inventory", "view inventory", "check inventory"})  # accepted in any case
NO_OPS = LOOK_COMMANDS | {"read cookbook"}
REJECTED = "Action is not valid in the current composite world state."
_COOK = re.compile(r"cook (.+?) (?:in|on) (.+)$")


# -- valid actions ---------------------------------------------------------------------------------------------------
def item_actions(s: WorldState, name: str) -> list[str]:
    """The cut and cook commands an inventory item still needs and whose tool is free, in the engine's order."""
    item = s.items[name]
    out = [f"{verb} {name}" for prep, verb in CUT_VERB.items()
           if prep in item.expected and prep not in item.actual and s.tool_available("knife")]
    for prep, tool in COOK_TOOL.items():
        if prep in item.expected and prep not in item.actual and s.tool_available(tool):
            out.append(f"cook {name} {'on' if tool == 'grill' else 'in'} {tool}")
    return out


def valid_actions(s: WorldState, agent: str) -> list[str]:
    """The agent's valid actions now (module docstring), in the engine's order."""
    here = s.locations[agent]
    actions = ["look around", "inventory", "read cookbook"]
    actions += [f"go to {room}" for room in s.rooms if room != here]
    actions += [f"move {d}" for d, room in DIRECTIONS.items() if room in s.rooms and room != here]
    if not s.gate_open:
        actions.append("open door")
    if here == "kitchen":
        actions.append("take knife")
    full = bool(s.capacity) and len(s.inventory) >= s.capacity
    for item in s.items.values():
        if item.deleted or item.collected or item.name in s.counter or item.room != here or not s.accessible(item):
            continue
        if not full:
            actions.append(f"take {item.name}")
    for name in list(s.inventory):
        actions += item_actions(s, name)
    actions += [f"prepare {d}" for d in s.dish_ids if s.dish_ready(d) and d not in s.prepared]
    actions += [f"eat {d}" for d in s.dish_ids if d in s.prepared and d not in s.eaten]
    return actions


def accepted(s: WorldState, agent: str, action: str) -> bool:
    """Whether the engine accepts ``action`` (stripped) from ``agent`` now."""
    return action in valid_actions(s, agent) or normalise(action) in LOOK_COMMANDS


# -- commands --------------------------------------------------------------------------------------------------------
def _mark_ready(s: WorldState, name: str) -> None:
    item = s.items.get(name)
    if item is None:
        return
    item.collected = True
    s.counter.add(name)
    s.inventory[:] = [n for n in s.inventory if n != name]


def _consume(s: WorldState, tool: str) -> None:
    if s.cooldown_steps > 0:
        s.cooldowns[tool] = s.cooldown_steps + 1  # the end of this step takes one off


def _prepare_item(s: WorldState, name: str, tool: str) -> None:
    item = s.items.get(name)
    if item is None:
        return
    for prep, t in COOK_TOOL.items():
        if t == tool and prep in item.expected:
            if "uncut" not in item.expected:
                item.actual.discard("uncut")
            item.actual.add(prep)
    for prep, verb in CUT_VERB.items():
        if verb == tool and prep in item.expected:
            item.actual.discard("uncut")
            item.actual.add(prep)
    if item.actual == item.expected:
        _mark_ready(s, item.name)


def apply(s: WorldState, agent: str, action: str) -> None:
    """The effect of an accepted command (module docstring)."""
    n = normalise(action)
    if n in NO_OPS:
        return
    if n == "open door":
        s.gate_open = True
    elif n.startswith("go to "):
        if n[6:].strip() in s.rooms:
            s.locations[agent] = n[6:].strip()
    elif n.startswith("move "):
        room = DIRECTIONS.get(n[5:].strip())
        if room in s.rooms:
            s.locations[agent] = room
    elif n.startswith("take "):
        name = action[5:].strip()
        item = s.items.get(name) or s.items.get(normalise(name))
        if item is not None:
            item.collected = True
            if name not in s.inventory:
                s.inventory.append(item.name)
            if item.expected <= NO_PREPARATION:
                _mark_ready(s, item.name)
    elif n.startswith("place ") and " on counter" in n:  # never a valid action: unreachable, kept for fidelity
        _mark_ready(s, action[6:].lower().split(" on counter", 1)[0].strip())
    elif n.startswith("cook "):
        m = _COOK.match(n)
        if m:
            _consume(s, m.group(2))
            _prepare_item(s, m.group(1), m.group(2))
    elif any(n.startswith(verb + " ") for verb in CUT_VERB.values()):
        verb = next(v for v in CUT_VERB.values() if n.startswith(v + " "))
        _consume(s, "knife")
        _prepare_item(s, n[len(verb) + 1:], verb)
    elif n.startswith("prepare "):
        if s.dish_ready(n[8:].strip()):
            s.prepared.add(n[8:].strip())
    elif n.startswith("eat "):
        if n[4:].strip() in s.prepared:
            s.eaten.add(n[4:].strip())


# -- score -----------------------------------------------------------------------------------------------------------
def object_tree(s: WorldState) -> dict[str, Any]:
    """The engine's ``getObjectTree``: the per-dish state the scorer reads."""
    dishes = {}
    for d in s.dish_ids:
        ingredients = {name: {"collected": s.items[name].collected, "deleted": s.items[name].deleted,
                              "preparation": sorted(s.items[name].actual), "ready": name in s.counter}
                       for name in s.recipe(d)}
        dishes[d] = {"ingredients": ingredients, "meal_prepared": d in s.prepared, "meal_eaten": d in s.eaten}
    return {"dishes": dishes, "inventory": list(s.inventory), "prepared_on_counter": sorted(s.counter),
            "agent_locations": dict(s.locations), "steps": s.steps, "gate_open": s.gate_open,
            "tool_cooldowns": dict(s.cooldowns)}


def _scorer_set(value: Any) -> frozenset[str]:
    """The scorer's own reading of a preparation (not lower-cased, unlike the engine's)."""
    if isinstance(value, str):
        return frozenset(p.strip() for p in value.split(",") if p.strip())
    if isinstance(value, list | tuple | set | frozenset):
        return frozenset(str(p) for p in value)
    return frozenset()


def score_task(dishes: list[dict[str, Any]], tree: dict[str, Any]) -> dict[str, Any]:
    """The authors' ``score_task``: per dish and per ingredient completeness, success, failure, score."""
    results, invalid = [], False
    for dish in dishes:
        d = str(dish["dish_id"])
        current = tree.get("dishes", {}).get(d, {})
        rows, dish_invalid = [], False
        for required in dish.get("recipe", []):
            name = str(required["name"])
            actual = current.get("ingredients", {}).get(name, {})
            collected, deleted = bool(actual.get("collected", False)), bool(actual.get("deleted", False))
            expected, observed = _scorer_set(required.get("preparation", [])), _scorer_set(actual.get("preparation"))
            dish_invalid = dish_invalid or deleted or bool((observed - NO_PREPARATION) - expected)
            rows.append({"name": name, "collected": collected, "deleted": deleted,
                         "preparation_matches": observed == expected,
                         "complete": collected and not deleted and observed == expected})
        complete = all(r["complete"] for r in rows)
        prepared, eaten = bool(current.get("meal_prepared", False)), bool(current.get("meal_eaten", False))
        invalid = invalid or dish_invalid
        results.append({"dish_id": d, "ingredients_complete": complete, "meal_prepared": prepared,
                        "meal_eaten": eaten, "task_success": complete and prepared and eaten,
                        "invalid_or_deleted": dish_invalid, "completed_ingredients": sum(r["complete"] for r in rows),
                        "total_ingredients": len(rows), "ingredients": rows})
    completed = sum(r["task_success"] for r in results)
    success = bool(results) and completed == len(results)
    return {"task_success": success, "task_failure": invalid, "score": 1.0 if success else 0.0,
            "completed_dishes": completed, "total_dishes": len(results), "dish_results": results}


def score(s: WorldState) -> dict[str, Any]:
    """The score report of the state (``_score_report``)."""
    return score_task(s.dishes, object_tree(s))


# -- what an agent reads ---------------------------------------------------------------------------------------------
def infos(s: WorldState, agent: str) -> dict[str, Any]:
    """The engine's ``infos`` for ``agent`` (``validActions``, ``inventory``, ``score``, ``tasksuccess``, ...)."""
    report = score(s)
    return {"validActions": valid_actions(s, agent),
            "inventory": ", ".join(s.inventory) if s.inventory else "(empty)",
            "score": report["score"], "tasksuccess": report["task_success"],
            "taskfailure": s.failure or report["task_failure"], "done": s.done, "steps": s.steps,
            "remaining_shared_steps": s.budget_left, "agent_location": s.locations[agent],
            "completed_dishes": report["completed_dishes"], "total_dishes": report["total_dishes"]}


def observation(s: WorldState, agent: str) -> str:
    """The engine's observation text for ``agent`` (``_observation``)."""
    here = s.locations[agent]
    visible = [i.name for i in s.items.values() if i.room == here and not i.collected and s.accessible(i)]
    progress = [f"{d}: {sum(n in s.counter for n in s.recipe(d))}/{len(s.recipe(d))} ingredients prepared, "
                f"meal_prepared={d in s.prepared}, meal_eaten={d in s.eaten}" for d in s.dish_ids]
    cooldowns = ", ".join(f"{tool}:{left}" for tool, left in sorted(s.cooldowns.items())) or "none"
    return (f"You are in the {here}.\n"
            f"Visible objects: {', '.join(visible) if visible else '(none)'}\n"
            f"Shared kitchen gate: {'open' if s.gate_open else 'closed'}.\n"
            f"Shared tool cooldowns: {cooldowns}.\n"
            f"Shared prepared counter: {', '.join(sorted(s.counter)) if s.counter else '(empty)'}\n"
            "Dish progress:\n- " + "\n- ".join(progress) + "\n"
            f"Shared steps remaining: {s.budget_left}\n"
            "Valid Actions are listed below.")


# -- one step --------------------------------------------------------------------------------------------------------
def transition(s: WorldState, agent: str, action: str) -> tuple[str, float, bool, dict[str, Any], bool]:
    """One step of ``agent`` (``_step_locked``): ``(observation, reward, done, infos, accepted)``."""
    action = str(action or "").strip()
    before = s.locations[agent]
    ok = accepted(s, agent, action)
    if ok:
        apply(s, agent, action)
    s.steps += 1
    report = score(s)
    reward = 0.0
    if report["task_success"]:
        s.done, reward = True, 1.0
    if report["task_failure"]:
        s.failure = s.done = True
    if s.steps >= s.limit:
        s.done = True
    s.cooldowns = {tool: left - 1 for tool, left in s.cooldowns.items() if left > 1}
    info = infos(s, agent)
    text = observation(s, agent)
    s.events.append(Event(len(s.events) + 1, agent, action, ok, reward, s.done, text, before, s.locations[agent],
                          None if ok else REJECTED))
    return text, reward, s.done, info, ok

