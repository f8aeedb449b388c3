"""The released TextWorld-Sync world as plain data, built from a task (SERA's composite CookingWorld).

A re-implementation of the state that the authors' engine keeps (GitHub ``OliverLeeXZ/SERA``,
``Runtime/environments/textworld/composite_cooking.py``, ``CompositeCookingWorldCoordinator._reset_state``), as
read there; :mod:`envs.textworld_sync.rules` holds the transitions. What a task sets:

- rooms: the first ``max(4, min(11, numLocations))`` of :data:`ROOMS` (``numLocations`` defaults to 6);
- one item per recipe ingredient, in recipe order, lying in the room of its first ``candidate_source_locations``
  entry (the part before the dot: kitchen, pantry, garden or supermarket; anything else is the kitchen). Its
  *expected* preparation is the recipe's set of preparation words (lower-cased), or ``{raw, uncut}`` when empty;
  its *actual* preparation starts as the part of ``{raw, uncut}`` the expected set contains;
- the inventory capacity: ``limitInventorySize`` read as a number (the flag 0/1 becomes a capacity of 1), replaced
  by ``parallelism.resource_capacity.inventory`` when that is set; 0 means no limit;
- the tool cooldown ``parallelism.mechanisms.tool_cooldown_steps`` (0: tools never cool down);
- the shared kitchen gate: closed when ``includeDoors`` is set; the dishes behind it are the targets of the
  ``gate_1`` edges of ``parallelism.dependencies`` (their ingredients can be neither seen nor taken while it is
  closed);
- ``numDistractorItems`` distractor names, which the engine creates and never shows (kept for fidelity);
- the shared step budget (``limit``): the caller's (the task's ``shared_environment_max_steps`` at evaluation, 100 in
  the authors' training runtime; :mod:`envs.textworld_sync.env`).

Per agent: a location (every agent starts where the root agent is, the kitchen at reset) and a history of
``(command, observation)`` pairs; the engine's event log records every step of every agent in commit order.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import re
from collections.abc import Mapping
from typing import Any

ROOMS = ("kitchen", "pantry", "garden", "supermarket", "hallway", "dining room", "garage", "study", "basement", "attic",
         "courtyard")
DIRECTIONS = {"north": "pantry", "south": "dining room", "east": "garden", "west": "supermarket"}  # move <direction>
SOURCE_ROOMS = ("kitchen", "pantry", "garden", "supermarket")  # rooms a source location can name
COOK_TOOL = {"fried": "stove", "roasted": "oven", "grilled": "grill", "baked": "oven", "boiled": "stove"}
CUT_VERB = {"chopped": "chop", "sliced": "slice", "diced": "dice", "minced": "mince"}
NO_PREPARATION = frozenset({"raw", "uncut"})
START_ROOM = "kitchen"
ROOT = "root"  # the root agent's id: children start where it stands


def normalise(value: Any) -> str:
    """Stripped, lower-cased, whitespace runs collapsed (the engine's ``_normalise``)."""
    return re.sub(r"\s+", " ", str(value).strip().lower())


def source_room(source: str) -> str:
    """The room of a source location such as ``"pantry.shelf"``; unknown rooms are the kitchen."""
    room = normalise(source).split(".", 1)[0]
    return room if room in SOURCE_ROOMS else START_ROOM


def preparation_set(values: Any) -> frozenset[str]:
    """The engine's reading of a recipe's ``preparation``: a list, or a comma-separated string; lower-cased."""
    if isinstance(values, str):
        return frozenset(p.strip().lower() for p in values.split(",") if p.strip())
    if isinstance(values, list | tuple | set | frozenset):
        return frozenset(str(p).strip().lower() for p in values if str(p).strip())
    return frozenset()


@dataclasses.dataclass
class Item:
    """One ingredient of one dish."""

    name: str
    dish: str  # the dish_id it belongs to
    room: str  # where it lies until taken
    expected: frozenset[str]  # the preparation the recipe asks for (or {raw, uncut})
    actual: set[str]  # the preparation it has now
    collected: bool = False  # taken (or already on the counter)
    deleted: bool = False  # never set by any command (the scorer reads it)


@dataclasses.dataclass(frozen=True)
class Event:
    """One committed step of one agent (the engine's ``_Event``)."""

    sequence: int  # 1, 2, ... in commit order
    agent: str
    action: str
    accepted: bool
    reward: float
    done: bool
    observation: str
    before: str  # the agent's location before the step
    after: str  # and after it
    error: str | None


@dataclasses.dataclass
class WorldState:
    """The whole shared world: what the task fixed, what the agents changed, and the agents themselves."""

    dishes: list[dict[str, Any]]  # the task's dish specifications (a private copy): the scorer's reference
    rooms: tuple[str, ...]
    items: dict[str, Item]  # by name, in recipe order (the order of the take commands)
    capacity: int  # inventory capacity; 0: unlimited
    cooldown_steps: int  # steps a tool stays unavailable after use; 0: none
    gated: frozenset[str]  # dish_ids whose ingredients sit behind the closed gate
    limit: int  # the shared step budget of every agent together
    distractors: tuple[str, ...]
    gate_open: bool
    inventory: list[str] = dataclasses.field(default_factory=list)  # shared by every agent, in order taken
    counter: set[str] = dataclasses.field(default_factory=set)  # ingredients ready ("shared prepared counter")
    prepared: set[str] = dataclasses.field(default_factory=set)  # dish_ids prepared
    eaten: set[str] = dataclasses.field(default_factory=set)  # dish_ids eaten
    cooldowns: dict[str, int] = dataclasses.field(default_factory=dict)  # tool -> steps left (> 0)
    locations: dict[str, str] = dataclasses.field(default_factory=dict)  # agent -> room
    histories: dict[str, list[tuple[str, str]]] = dataclasses.field(default_factory=dict)  # agent -> (cmd, text)
    events: list[Event] = dataclasses.field(default_factory=list)
    steps: int = 0  # world steps taken by all agents (accepted or not)
    done: bool = False  # success, failure or the budget spent
    failure: bool = False

    @property
    def dish_ids(self) -> list[str]:
        return [str(d["dish_id"]) for d in self.dishes]

    def recipe(self, dish_id: str) -> list[str]:
        """The ingredient names of a dish, in recipe order ([] for an unknown dish)."""
        for d in self.dishes:
            if str(d["dish_id"]) == dish_id:
                return [str(r["name"]) for r in d.get("recipe", [])]
        return []

    def dish_ready(self, dish_id: str) -> bool:
        """Every ingredient of the dish is on the counter (False for an unknown dish)."""
        for d in self.dishes:
            if str(d["dish_id"]) == dish_id:
                return all(str(r["name"]) in self.counter for r in d.get("recipe", []))
        return False

    def accessible(self, item: Item) -> bool:
        return self.gate_open or item.dish not in self.gated

    def tool_available(self, tool: str) -> bool:
        return self.cooldowns.get(tool, 0) <= 0

    @property
    def budget_left(self) -> int:
        return max(self.limit - self.steps, 0)


def _params(meta: Mapping[str, Any]) -> dict[str, Any]:
    params = meta.get("game_params") or {}
    return json.loads(params) if isinstance(params, str) else dict(params)


def build(meta: Mapping[str, Any], limit: int) -> WorldState:
    """The fresh world of a task's ``meta`` (``dishes``, ``game_params`` as a dict or a JSON string,
    ``parallelism``), with the shared budget ``limit`` and no agents (module docstring)."""
    if not isinstance(limit, int) or limit <= 0:
        raise ValueError(f"the shared step budget must be a positive int, got {limit!r}")
    if "dishes" not in meta:
        raise ValueError("a textworld_sync task's meta needs 'dishes' (and 'game_params', 'parallelism')")
    params = _params(meta)
    parallelism = dict(meta.get("parallelism") or {})
    dishes = copy.deepcopy(list(meta["dishes"]))
    rooms = ROOMS[: max(4, min(len(ROOMS), int(params.get("numLocations", 6))))]
    capacity = int(params.get("limitInventorySize", 0) or 0)
    resources = parallelism.get("resource_capacity") or {}
    if isinstance(resources, Mapping) and resources.get("inventory"):
        capacity = int(resources["inventory"])
    cooldown = int(dict(parallelism.get("mechanisms") or {}).get("tool_cooldown_steps", 0) or 0)
    if cooldown < 0:
        raise ValueError(f"tool_cooldown_steps must be non-negative, got {cooldown}")
    gated = frozenset(str(e.get("to")) for e in parallelism.get("dependencies") or []
                      if isinstance(e, Mapping) and str(e.get("from")) == "gate_1")
    items: dict[str, Item] = {}
    for dish in dishes:
        for r in dish.get("recipe", []):
            expected = preparation_set(r.get("preparation", [])) or NO_PREPARATION
            sources = list(r.get("candidate_source_locations", []))
            items[str(r["name"])] = Item(str(r["name"]), str(dish["dish_id"]),
                                         source_room(sources[0] if sources else START_ROOM), expected,
                                         set(expected & NO_PREPARATION))
    distractors = tuple(f"distractor_{i + 1}" for i in range(int(params.get("numDistractorItems", 0) or 0)))
    return WorldState(dishes=dishes, rooms=rooms, items=items, capacity=capacity, cooldown_steps=cooldown,
                      gated=gated, limit=limit, distractors=distractors,
                      gate_open=not bool(params.get("includeDoors", 0)))
