"""The shared world's state as plain data: rooms, doors, furniture, items, dishes, agents, score.

Everything an episode needs lives in one :class:`WorldState` of dataclasses, dicts, lists and strings, so a
``copy.deepcopy`` or a pickle round trip is an exact snapshot, and the rules (rules.py) are plain functions of
``(state, agent, command)``. Names are unique within a world and are how commands refer to things.

Where things are (``Item.where``): ``("room", r)`` on the floor of room ``r``, ``("on", s)`` on a supporter,
``("in", c)`` in a container, ``("held", h)`` carried by holder ``h``, ``("gone", "")`` out of play (eaten, drunk,
or used in a dish). The holder is the agent's id, or :data:`TEAM` when the world shares one inventory among all
agents (``WorldState.shared_inventory``).

Food state follows CookingWorld's predicates: ``cooking`` is raw / fried / roasted / grilled, ``burned`` is set by a
second cooking, ``needs_cooking`` foods (meat, fish, potatoes, egg) are inedible until cooked; ``cutting`` is uncut /
chopped / sliced / diced. A prepared dish is an item of kind ``"meal"`` named like the dish.
"""

from __future__ import annotations

import dataclasses

TEAM = "*team*"  # the holder of everything carried when agents share one inventory


@dataclasses.dataclass
class Door:
    name: str
    rooms: tuple[str, str]
    state: str  # "open" | "closed" | "locked"
    key: str | None = None  # the key that locks and unlocks it


@dataclasses.dataclass
class Room:
    name: str
    exits: dict[str, str]  # direction -> neighbouring room
    doors: dict[str, str]  # direction -> door name, for the exits that have a door


@dataclasses.dataclass
class Furniture:
    name: str
    room: str
    kind: str  # "container" | "supporter"
    state: str | None = None  # containers: "open" | "closed" | "locked"; supporters: None
    key: str | None = None
    heat: str | None = None  # "fried" (stove) | "roasted" (oven) | "grilled" (BBQ)


@dataclasses.dataclass
class Item:
    name: str
    kind: str  # "food" | "meal" | "knife" | "cookbook" | "key"
    where: tuple[str, str]
    edible: bool = False
    drinkable: bool = False
    cookable: bool = False
    needs_cooking: bool = False
    cooking: str = "raw"
    burned: bool = False
    cuttable: bool = False
    cutting: str = "uncut"
    some: bool = False  # "some milk"
    opens: str | None = None  # keys: the door or container it fits
    moved: int = 0  # WorldState.clock when it last moved: listings show the most recently moved first (Inform 7)

    @property
    def is_food(self) -> bool:
        return self.kind in ("food", "meal")


@dataclasses.dataclass(frozen=True)
class Ingredient:
    food: str
    cooking: str  # the required cooking ("raw": must not be cooked)
    cutting: str  # the required cutting ("uncut": must not be cut)


@dataclasses.dataclass
class Dish:
    name: str
    ingredients: tuple[Ingredient, ...]
    status: str = "pending"  # "pending" | "prepared" | "eaten"


@dataclasses.dataclass
class Agent:
    id: str
    room: str
    max_steps: int | None  # the agent's own step budget (None: unlimited)
    steps: int = 0
    parent: str | None = None
    read_cookbook: bool = False
    history: list[tuple[str, str]] = dataclasses.field(default_factory=list)  # (command, feedback)


@dataclasses.dataclass
class WorldState:
    rooms: dict[str, Room]
    doors: dict[str, Door]
    furniture: dict[str, Furniture]
    items: dict[str, Item]
    dishes: list[Dish]
    kitchen: str = "kitchen"  # where dishes are prepared (CookingWorld's cooking location)
    start_room: str = "kitchen"  # where new agents start (CookingWorld: the player's start room)
    shared_inventory: bool = True
    agents: dict[str, Agent] = dataclasses.field(default_factory=dict)
    points: dict[str, int] = dataclasses.field(default_factory=dict)  # score event -> points (1 each)
    scored: list[str] = dataclasses.field(default_factory=list)  # score events reached, in order
    failed: dict[str, str] = dataclasses.field(default_factory=dict)  # dish -> why it can no longer be made
    log: list[tuple[str, str]] = dataclasses.field(default_factory=list)  # committed (agent, command), in order
    objective: str = ""
    clock: int = 0  # counts item moves (Item.moved)
    names: dict[str, str] = dataclasses.field(default_factory=dict, compare=False, repr=False)  # lower -> name cache

    # -- queries --------------------------------------------------------------------------------------------------
    def lookup(self, text: str) -> str | None:
        """The name of the item, furniture or door called ``text`` (any case), or None."""
        if len(self.names) != len(self.items) + len(self.furniture) + len(self.doors):
            self.names = {n.lower(): n for pool in (self.items, self.furniture, self.doors) for n in pool}
        return self.names.get(text)

    @property
    def score(self) -> int:
        return sum(self.points.get(e, 0) for e in self.scored)

    @property
    def max_score(self) -> int:
        return sum(self.points.values())

    @property
    def won(self) -> bool:
        return not self.failed and all(d.status == "eaten" for d in self.dishes)

    @property
    def lost(self) -> bool:
        return bool(self.failed)

    @property
    def over(self) -> bool:
        return self.won or self.lost

    def dish(self, name: str) -> Dish | None:
        return next((d for d in self.dishes if d.name == name), None)

    def holder(self, agent: str) -> str:
        return TEAM if self.shared_inventory else agent

    def carried(self, agent: str) -> list[Item]:
        """What ``agent`` carries (everything the team carries when inventories are shared), latest first."""
        return self.contents("held", self.holder(agent))

    def holds(self, agent: str, item: str) -> bool:
        return item in self.items and self.items[item].where == ("held", self.holder(agent))

    def room_of(self, item: Item) -> str | None:
        """The room an item is in (None when carried or gone)."""
        kind, place = item.where
        if kind == "room":
            return place
        if kind in ("on", "in"):
            return self.furniture[place].room
        return None

    def furniture_in(self, room: str) -> list[Furniture]:
        return [f for f in self.furniture.values() if f.room == room]

    def contents(self, kind: str, place: str) -> list[Item]:
        """The items at ``(kind, place)``, the most recently moved first (as Inform 7 lists them)."""
        return sorted((i for i in self.items.values() if i.where == (kind, place)), key=lambda i: -i.moved)

    def move(self, item: Item, where: tuple[str, str]) -> None:
        self.clock += 1
        item.where, item.moved = where, self.clock

    def visible_items(self, room: str) -> list[Item]:
        """Items an agent in ``room`` can see and reach: on the floor, on supporters, in open containers."""
        out = self.contents("room", room)
        for f in self.furniture_in(room):
            if f.kind == "supporter":
                out += self.contents("on", f.name)
            elif f.state == "open":
                out += self.contents("in", f.name)
        return out

    def doors_of(self, room: str) -> dict[str, Door]:
        """Direction -> door, for the exits of ``room`` that have one."""
        return {d: self.doors[name] for d, name in self.rooms[room].doors.items()}

    def agents_in(self, room: str, but: str | None = None) -> list[str]:
        return [a.id for a in self.agents.values() if a.room == room and a.id != but]
