"""Procedural multi-dish CookingWorld tasks: seven families of coordination structure, four difficulties.

SERA App. C.2-C.3: the generator samples several disjoint recipes per seed and assigns ingredients to dishes;
independent branches can be delegated in parallel subject to resource and dependency constraints; seven families
vary branch dependencies, workload allocation, resource constraints and recursion; Easy / Medium / Hard / Extreme
grow with the number and scale of constraints. The paper does not list its families; ours are:

=================  ================================================================================================
``parallel``       independent branches: each dish's ingredients in its own room; no locks.
``sequential``     a chain of branch dependencies: dish i+1's ingredients are locked away and the key lies with
                   dish i's ingredients, so the branches unlock one another in order.
``dag``            cross-branch dependencies: each later dish's ingredients are locked in one or two stores whose
                   keys lie with earlier dishes (a random DAG of branches).
``imbalanced``     workload allocation: one heavy dish (many far, fully processed ingredients, some locked) next to
                   light one-ingredient dishes in the kitchen.
``shared_tools``   a shared-resource conflict: one knife, locked away, and every ingredient needs cutting and
                   cooking (with per-agent inventories only one agent can hold the knife at a time).
``bottleneck``     a shared gate: every ingredient lies behind one lock (a locked door or container) whose key
                   is itself behind a chain of locks: all branches wait on one prerequisite, then fan out.
``nested``         nested dependencies (recursion): some ingredients lie behind chains of locks, key inside
                   locked store inside ..., as deep as the difficulty.
=================  ================================================================================================

Difficulty (:data:`LEVELS`): number of dishes, ingredients per dish, rooms (CookingWorld's 6 / 9 / 12-room houses),
closed doors, distractor foods, and the family's constraint scale (chain length, lock depth, number of locks).

Worlds are built from CookingWorld's vocabulary (data.py) on CookingWorld's house map rules (rooms placed on a grid,
only allowed neighbours connected, CookingWorld's doors), with locks and keys added by the families. Locks go on
containers and on doors that are bridges of the map (the only way into the rooms behind them), so "behind a lock"
is well defined; every lock is added only if the world stays solvable (:func:`solvable`: a fixpoint over reachable
rooms and keys). Generation is deterministic in ``(family, difficulty, seed)``.
"""

from __future__ import annotations

import collections
import dataclasses
import random
from collections.abc import Callable

from envs.textworld_cooking_sync.data import (
    DIRECTIONS,
    DISH_NAMES,
    DOOR_NAMES,
    FOODS,
    FURNITURE,
    KEY_NAMES,
    NEIGHBOURS,
    OPPOSITE,
    ROOM_GROUPS,
    STEP,
    STORAGE,
)
from envs.textworld_cooking_sync.rules import init_points
from envs.textworld_cooking_sync.state import Dish, Door, Furniture, Ingredient, Item, Room, WorldState
from envs.textworld_cooking_sync.text import objective

DIFFICULTIES = ("easy", "medium", "hard", "extreme")
FAMILIES = ("parallel", "sequential", "dag", "imbalanced", "shared_tools", "bottleneck", "nested")
Spot = tuple[str, str]  # an Item.where that is not "held"


@dataclasses.dataclass(frozen=True)
class Level:
    dishes: tuple[int, int]  # min, max number of dishes
    ingredients: tuple[int, int]  # min, max ingredients per dish
    rooms: int  # 6, 9 or 12 (CookingWorld's house sizes)
    closed_doors: bool
    scale: int  # the family's constraint scale: chain length, lock depth, number of locked stores
    distractors: int
    spread: float  # probability that a free ingredient is placed away from its usual CookingWorld place
    max_steps: int  # the single-agent step limit of the Env wrapper


LEVELS: dict[str, Level] = {
    "easy": Level((2, 2), (1, 2), 6, False, 1, 2, 0.3, 60),
    "medium": Level((2, 3), (2, 3), 9, True, 2, 4, 0.5, 100),
    "hard": Level((3, 4), (2, 3), 12, True, 3, 6, 0.7, 150),
    "extreme": Level((4, 5), (3, 4), 12, True, 4, 8, 0.85, 200),
}


def generate(family: str, difficulty: str, seed: int, *, shared_inventory: bool = True) -> WorldState:
    """A fresh world (no agents yet) for ``(family, difficulty, seed)``."""
    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; families are {FAMILIES}")
    if difficulty not in LEVELS:
        raise ValueError(f"unknown difficulty {difficulty!r}; difficulties are {DIFFICULTIES}")
    # The seed string keeps the package's first name (textworld_sync): renaming it would change every world.
    rng = random.Random(f"textworld_sync/{family}/{difficulty}/{seed}")
    for _ in range(100):
        b = _Builder(rng, LEVELS[difficulty])
        if b.build(_FAMILY_BUILDERS[family]):
            return b.finish(shared_inventory)
    raise RuntimeError(f"could not generate a solvable world for {(family, difficulty, seed)} in 100 attempts")


# -- solvability ------------------------------------------------------------------------------------------------------
def reachable_rooms(state: WorldState, start: str, keys: set[str] | frozenset[str] = frozenset()) -> set[str]:
    """Rooms reachable from ``start`` through doors that are not locked or whose key is in ``keys``."""
    seen, todo = {start}, [start]
    while todo:
        room = todo.pop()
        r = state.rooms[room]
        for d, nxt in r.exits.items():
            door = state.doors.get(r.doors.get(d, ""))
            if nxt not in seen and (door is None or door.state != "locked" or door.key in keys):
                seen.add(nxt)
                todo.append(nxt)
    return seen


def accessible(state: WorldState, start: str) -> tuple[set[str], set[str]]:
    """The fixpoint of (rooms reachable, keys obtainable) from ``start`` with nothing in hand: the rooms and the
    items (by name) a single agent can eventually reach."""
    keys: set[str] = set()
    while True:
        rooms = reachable_rooms(state, start, keys)
        items = set()
        for item in state.items.values():
            kind, place = item.where
            if kind == "held" or (kind == "room" and place in rooms):
                items.add(item.name)
            elif kind in ("on", "in"):
                f = state.furniture[place]
                if f.room in rooms and (f.state != "locked" or f.key in keys):
                    items.add(item.name)
        new = {i for i in items if state.items[i].kind == "key"} - keys
        if not new:
            return rooms, items
        keys |= new


def solvable(state: WorldState, start: str | None = None, *, partial: bool = False) -> bool:
    """Every ingredient, a knife (if anything needs cutting), the cookbook, the kitchen and every needed heat source
    can be reached from ``start`` (default: the kitchen). ``partial``: only the ingredients already placed count
    (while a world is being built)."""
    rooms, items = accessible(state, start or state.kitchen)
    needed = {i.food for d in state.dishes for i in d.ingredients} | {"cookbook"}
    if partial:
        needed &= set(state.items)
    if any(i.cutting != "uncut" for d in state.dishes for i in d.ingredients):
        needed.add("knife")
    heat_rooms = {f.room for f in state.furniture.values() if f.heat}
    return needed <= items and state.kitchen in rooms and heat_rooms <= rooms


# -- the builder -------------------------------------------------------------------------------------------------------
class _Builder:
    def __init__(self, rng: random.Random, level: Level):
        self.rng, self.level = rng, level
        self.rooms: dict[str, Room] = {}
        self.doors: dict[str, Door] = {}
        self.furniture: dict[str, Furniture] = {}
        self.items: dict[str, Item] = {}
        self.dishes: list[Dish] = []
        self.keys = list(KEY_NAMES)
        rng.shuffle(self.keys)
        self.lock_count = 0

    # the state view used by the solvability checks
    @property
    def state(self) -> WorldState:
        return WorldState(self.rooms, self.doors, self.furniture, self.items, self.dishes)

    def build(self, family: Callable[[_Builder], None]) -> bool:
        if not self._layout():
            return False
        self._doors()
        for f in FURNITURE.values():
            if f.room in self.rooms:
                state = ("closed" if f.closed else "open") if f.kind == "container" and f.openable else None
                self.furniture[f.name] = Furniture(f.name, f.room, f.kind, state, heat=f.heat)
        self.add_item(Item("cookbook", "cookbook", ("on", self.rng.choice(["table", "counter"]))))
        self.add_item(Item("knife", "knife", ("on", self.rng.choice(["table", "counter"]))))
        family(self)
        if not self.dishes or not solvable(self.state):
            return False
        used = {n for n in self.items}
        spare = [n for n in sorted(FOODS) if n not in used]
        for name in self.rng.sample(spare, min(len(spare), self.level.distractors)):
            self.add_food(name, self.usual_spot(name))
        return True

    def finish(self, shared_inventory: bool) -> WorldState:
        s = self.state
        s.shared_inventory = shared_inventory
        free = sorted(reachable_rooms(s, s.kitchen))
        s.start_room = self.rng.choice(free)
        s.objective = objective(s.dishes)
        init_points(s)
        return s

    # -- map -------------------------------------------------------------------------------------------------------
    def _layout(self) -> bool:
        """CookingWorld's house: rooms of the first 1-4 groups placed on a grid, each next to an allowed neighbour;
        extra connections between grid neighbours that may neighbour (so the map can have cycles)."""
        groups = {6: 2, 9: 3, 12: 4}[self.level.rooms]
        names = [r for g in ROOM_GROUPS[:groups] for r in g]
        for _ in range(50):
            pos = {"kitchen": (0, 0)}
            cells = {(0, 0): "kitchen"}
            edges: set[frozenset[str]] = set()
            todo = [r for r in names if r != "kitchen"]
            while todo:
                options = []
                for room in todo:
                    for other in NEIGHBOURS[room]:
                        if other in pos:
                            for d in DIRECTIONS:
                                x, y = pos[other][0] + STEP[d][0], pos[other][1] + STEP[d][1]
                                if (x, y) not in cells and max(abs(x), abs(y)) <= 2:
                                    options.append((room, other, (x, y)))
                if not options:
                    break
                room, other, cell = self.rng.choice(sorted(options))
                pos[room], cells[cell] = cell, room
                edges.add(frozenset((room, other)))
                todo.remove(room)
            if todo:
                continue
            for room, (x, y) in sorted(pos.items()):
                for d in DIRECTIONS:
                    other = cells.get((x + STEP[d][0], y + STEP[d][1]))
                    pair = frozenset((room, other))
                    if other and other in NEIGHBOURS[room] and pair not in edges and self.rng.random() < 0.3:
                        edges.add(pair)
            self.rooms = {r: Room(r, {}, {}) for r in sorted(pos)}
            for pair in sorted(edges, key=sorted):
                a, b = sorted(pair)
                dx, dy = pos[b][0] - pos[a][0], pos[b][1] - pos[a][1]
                d = next(d for d in DIRECTIONS if STEP[d] == (dx, dy))
                self.rooms[a].exits[d] = b
                self.rooms[b].exits[OPPOSITE[d]] = a
            return True
        return False

    def _doors(self) -> None:
        used: set[str] = set()
        for a in sorted(self.rooms):
            for d, b in sorted(self.rooms[a].exits.items()):
                pair = frozenset((a, b))
                if a < b and pair in DOOR_NAMES:
                    name = self.rng.choice([n for n in DOOR_NAMES[pair] if n not in used])
                    used.add(name)
                    state = "closed" if self.level.closed_doors else "open"
                    self.doors[name] = Door(name, (a, b), state)
                    self.rooms[a].doors[d] = name
                    self.rooms[b].doors[OPPOSITE[d]] = name

    def distance(self) -> dict[str, int]:
        dist, todo = {"kitchen": 0}, collections.deque(["kitchen"])
        while todo:
            room = todo.popleft()
            for nxt in self.rooms[room].exits.values():
                if nxt not in dist:
                    dist[nxt] = dist[room] + 1
                    todo.append(nxt)
        return dist

    def behind(self, door: str) -> set[str]:
        """The rooms a door is the only way into from the kitchen (empty when it is not a bridge of the map)."""
        seen, todo = {"kitchen"}, ["kitchen"]
        while todo:
            room = todo.pop()
            for d, nxt in self.rooms[room].exits.items():
                if nxt not in seen and self.rooms[room].doors.get(d) != door:
                    seen.add(nxt)
                    todo.append(nxt)
        return set(self.rooms) - seen

    # -- things ----------------------------------------------------------------------------------------------------
    def add_item(self, item: Item) -> Item:
        assert item.name not in self.items, item.name
        self.items[item.name] = item
        return item

    def add_food(self, name: str, spot: Spot) -> Item:
        k = FOODS[name]
        return self.add_item(
            Item(
                name,
                "food",
                spot,
                edible=k.edible,
                drinkable=k.drinkable,
                cookable=k.cookable,
                needs_cooking=k.needs_cooking,
                cuttable=k.cuttable,
                some=k.some,
            )
        )

    def usual_spot(self, food: str) -> Spot:
        """One of the food's CookingWorld places that exists in this house."""
        spots = []
        for place in FOODS[food].places:
            room, _, furniture = place.partition(".")
            if room in self.rooms:
                spots.append(
                    ("in" if FURNITURE[furniture].kind == "container" else "on", furniture)
                    if furniture
                    else ("room", room)
                )
        return self.rng.choice(spots)

    def spots(self, room: str) -> list[Spot]:
        """Where things can lie in a room: the floor, supporters, unlocked containers (not heat sources)."""
        out: list[Spot] = [("room", room)]
        for f in self.furniture.values():
            if f.room == room and not f.heat and f.state != "locked":
                out.append(("on", f.name) if f.kind == "supporter" else ("in", f.name))
        return out

    def storage(self, room: str) -> str:
        """The room's lockable container, added (closed) if the house has none there yet."""
        name = STORAGE[room]
        if name not in self.furniture:
            self.furniture[name] = Furniture(name, room, "container", "closed")
        return name

    def free_spot(self, far: bool = False) -> Spot:
        """A spot outside the kitchen (far: among the farthest rooms), not behind any lock."""
        dist = self.distance()
        rooms = sorted(r for r in reachable_rooms(self.state, "kitchen") if r != "kitchen")
        if far:
            top = max(dist[r] for r in rooms)
            rooms = [r for r in rooms if dist[r] >= top - 1]
        return self.rng.choice(self.spots(self.rng.choice(rooms)))

    def lock(self, target: str, key_spot: Spot) -> bool:
        """Locks a container or door with a new key lying at ``key_spot``; undone (False) if that makes the world
        unsolvable or no key name is left."""
        if not self.keys:
            return False
        thing = self.doors.get(target) or self.furniture[target]
        if thing.state == "locked":
            return False
        key = self.keys.pop()
        saved = thing.state
        thing.state, thing.key = "locked", key
        self.add_item(Item(key, "key", key_spot, opens=target))
        if solvable(self.state, partial=True):
            self.lock_count += 1
            return True
        thing.state, thing.key = saved, None
        del self.items[key]
        self.keys.append(key)
        return False

    def stores(self) -> list[tuple[str, list[Spot]]]:
        """Candidate lock targets, shuffled: (target, the spots it guards). Containers (each room's storage) and
        bridge doors (the spots of the rooms behind them)."""
        out: list[tuple[str, list[Spot]]] = []
        for room in sorted(self.rooms):
            f = self.furniture.get(STORAGE[room])
            if f is None or f.state != "locked":
                out.append((STORAGE[room], [("in", STORAGE[room])]))
        for door in sorted(self.doors):
            region = self.behind(door)
            if region and self.doors[door].state != "locked":
                out.append((door, [s for r in sorted(region) for s in self.spots(r)]))
        self.rng.shuffle(out)
        return out

    def lock_store(self, key_spot: Spot) -> tuple[str, list[Spot]] | None:
        """Locks the first candidate store that keeps the world solvable, its key at ``key_spot``; returns the store
        (target, spots inside) or None."""
        for target, spots in self.stores():
            if key_spot in spots:
                continue
            room = next((r for r, n in STORAGE.items() if n == target), None)
            added = target not in self.doors and target not in self.furniture
            if added:
                self.storage(room)
            if self.lock(target, key_spot):
                return target, spots
            if added:
                del self.furniture[target]
        return None

    # -- dishes ----------------------------------------------------------------------------------------------------
    def dish_sizes(self, n: int | None = None) -> list[int]:
        lo, hi = self.level.dishes
        n = n or self.rng.randint(lo, hi)
        return [self.rng.randint(*self.level.ingredients) for _ in range(n)]

    def choose_dishes(
        self, sizes: list[int], *, processed: set[int] = frozenset(), simple: set[int] = frozenset()
    ) -> list[Dish]:
        """Disjoint recipes of the given sizes. Dishes in ``processed``: every ingredient must be cut and cooked;
        dishes in ``simple``: the least processing their food allows."""
        grill = "BBQ" in self.furniture
        pool = sorted(FOODS)
        self.rng.shuffle(pool)
        names = list(DISH_NAMES)
        self.rng.shuffle(names)
        dishes = []
        for k, size in enumerate(sizes):
            ingredients = []
            while len(ingredients) < size and pool:
                food = pool.pop()
                preps = [p for p in FOODS[food].preparations() if grill or p[0] != "grilled"]
                if k in processed:
                    preps = [p for p in preps if p[0] != "raw" and p[1] != "uncut"]
                if k in simple:
                    fewest = min(sum(x not in ("raw", "uncut") for x in p) for p in preps)
                    preps = [p for p in preps if sum(x not in ("raw", "uncut") for x in p) == fewest]
                if preps:
                    cooking, cutting = self.rng.choice(preps)
                    ingredients.append(Ingredient(food, cooking, cutting))
            dishes.append(Dish(names[k], tuple(ingredients)))
        self.dishes.extend(dishes)
        return dishes

    def place(self, dish: Dish, spots: list[Spot] | None = None) -> list[Spot]:
        """Puts a dish's ingredients at random ``spots`` (default: usual place, or away from it with the level's
        spread probability); returns where each went."""
        out = []
        for ing in dish.ingredients:
            if spots:
                spot = self.rng.choice(spots)
            elif self.rng.random() < self.level.spread:
                spot = self.free_spot()
            else:
                spot = self.usual_spot(ing.food)
            self.add_food(ing.food, spot)
            out.append(spot)
        return out


# -- the families ------------------------------------------------------------------------------------------------------
def _parallel(b: _Builder) -> None:
    dishes = b.choose_dishes(b.dish_sizes())
    rooms = sorted(r for r in b.rooms if r != "kitchen")
    b.rng.shuffle(rooms)
    for k, dish in enumerate(dishes):
        home = rooms[k % len(rooms)]
        b.place(dish, b.spots(home) if b.rng.random() < b.level.spread else None)


def _sequential(b: _Builder) -> None:
    dishes = b.choose_dishes(b.dish_sizes())
    spots = b.place(dishes[0])
    for dish in dishes[1:]:
        store = b.lock_store(b.rng.choice(spots))
        spots = b.place(dish, store[1] if store else None)


def _dag(b: _Builder) -> None:
    dishes = b.choose_dishes(b.dish_sizes())
    areas = [b.place(dishes[0])]
    for dish in dishes[1:]:
        n_parents = min(len(areas), len(dish.ingredients), 2 if b.level.scale >= 3 else 1)
        inside = []
        for parent in b.rng.sample(range(len(areas)), n_parents):
            store = b.lock_store(b.rng.choice(areas[parent]))
            if store:
                inside.append(store[1])
        if not inside:
            areas.append(b.place(dish))
            continue
        area = []
        for k, ing in enumerate(dish.ingredients):
            spot = b.rng.choice(inside[k % len(inside)])
            b.add_food(ing.food, spot)
            area.append(spot)
        areas.append(area)


def _imbalanced(b: _Builder) -> None:
    n = b.rng.randint(*b.level.dishes)
    heavy = min(5, b.level.ingredients[1] + 1)
    dishes = b.choose_dishes([heavy] + [1] * (n - 1), processed={0}, simple=set(range(1, n)))
    for ing in dishes[0].ingredients:
        b.add_food(ing.food, b.free_spot(far=True))
    for food in b.rng.sample([i.food for i in dishes[0].ingredients], min(heavy, b.level.scale - 1)):
        store = b.lock_store(b.free_spot())
        if store:
            _move_into(b, food, store[1])
    for dish in dishes[1:]:
        b.place(dish, [s for s in b.spots("kitchen") if s != ("room", "kitchen")])


def _shared_tools(b: _Builder) -> None:
    for dish in b.choose_dishes(sizes := b.dish_sizes(), processed=set(range(len(sizes)))):
        b.place(dish)
    b.items["knife"].where = b.free_spot(far=True)
    _chain(b, "knife", b.level.scale - 1)


def _bottleneck(b: _Builder) -> None:
    dishes = b.choose_dishes(b.dish_sizes())
    for dish in dishes:
        b.place(dish)
    gate = b.lock_store(b.free_spot())
    if gate is None:
        return
    for ing in (i for d in dishes for i in d.ingredients):
        _move_into(b, ing.food, gate[1])
    key = next(i for i in b.items.values() if i.kind == "key" and i.opens == gate[0])
    _chain(b, key.name, b.level.scale - 1)


def _nested(b: _Builder) -> None:
    dishes = b.choose_dishes(b.dish_sizes())
    for dish in dishes:
        b.place(dish)
    foods = [i.food for d in dishes for i in d.ingredients]
    for food in b.rng.sample(foods, min(len(foods), 1 if b.level.scale <= 2 else 2)):
        _chain(b, food, b.level.scale)


def _move_into(b: _Builder, name: str, spots: list[Spot]) -> bool:
    """Moves an item to a random spot of ``spots`` unless that makes the world unsolvable."""
    item = b.items[name]
    saved, item.where = item.where, b.rng.choice(spots)
    if solvable(b.state, partial=True):
        return True
    item.where = saved
    return False


def _chain(b: _Builder, name: str, depth: int) -> None:
    """Puts the item ``name`` behind ``depth`` nested locks: it goes into store d, whose key lies in store d-1, ...,
    whose key lies at a free spot."""
    key_spot = b.free_spot()
    inner = None
    for _ in range(depth):
        store = b.lock_store(key_spot)
        if store is None:
            break
        inner = store[1]
        key_spot = b.rng.choice(inner)
    if inner is not None:
        _move_into(b, name, inner)


_FAMILY_BUILDERS: dict[str, Callable[[_Builder], None]] = {
    "parallel": _parallel,
    "sequential": _sequential,
    "dag": _dag,
    "imbalanced": _imbalanced,
    "shared_tools": _shared_tools,
    "bottleneck": _bottleneck,
    "nested": _nested,
}
