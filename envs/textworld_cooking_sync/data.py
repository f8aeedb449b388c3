"""CookingWorld's fixed vocabulary: foods and how each can be prepared, furniture, the house map, door names.

The facts are TextWorld's ``tw-cooking`` challenge (``textworld.challenges.tw_cooking.cooking``, textworld 1.7.0),
re-stated here as data: the same 38 foods with the same properties (edible or needs cooking, cookable, cuttable,
drinkable) and usual places, the same furniture per room, the same 12 rooms and which rooms may neighbour which,
the same door names per room pair. A food's possible preparations are CookingWorld's ``get_food_preparations``:
a cookable food is grilled, fried or roasted (or left raw when it does not need cooking), a cuttable food is
chopped, sliced or diced (or left uncut).

TextWorld-Sync additions (not in CookingWorld): lockable storage furniture per room (``STORAGE``) and key names
(``KEY_NAMES``), used by the task families that put ingredients or tools behind locks (generate.py); dish names
(``DISH_NAMES``) for worlds with several recipes (CookingWorld has one, called "meal").
"""

from __future__ import annotations

import dataclasses
import itertools

COOKING = ("raw", "fried", "roasted", "grilled")  # CookingWorld's TYPES_OF_COOKING
CUTTING = ("uncut", "chopped", "sliced", "diced")  # CookingWorld's TYPES_OF_CUTTING
COOK_VERB = {"fried": "fry", "roasted": "roast", "grilled": "grill"}  # as the cookbook's directions say them
CUT_VERB = {"chopped": "chop", "sliced": "slice", "diced": "dice"}
CUT_OF_VERB = {v: k for k, v in CUT_VERB.items()}
DIRECTIONS = ("north", "south", "east", "west")
OPPOSITE = {"north": "south", "south": "north", "east": "west", "west": "east"}
STEP = {"north": (0, 1), "south": (0, -1), "east": (1, 0), "west": (-1, 0)}


@dataclasses.dataclass(frozen=True)
class FoodKind:
    """A CookingWorld food: its properties at the start of a game and where it is usually found."""

    name: str
    edible: bool  # can be eaten as found (False: inedible, or needs cooking first)
    cookable: bool
    needs_cooking: bool  # inedible until cooked (meat, fish, potatoes, egg)
    cuttable: bool
    drinkable: bool = False
    some: bool = False  # "some milk" rather than "a milk"
    places: tuple[str, ...] = ()  # "room" (the floor) or "room.furniture"

    def preparations(self) -> list[tuple[str, str]]:
        """Every (cooking, cutting) this food can be asked for (CookingWorld's ``get_food_preparations``)."""
        cookings = (
            ["grilled", "fried", "roasted"] + ([] if self.needs_cooking else ["raw"]) if self.cookable else ["raw"]
        )
        cuttings = list(CUTTING) if self.cuttable else ["uncut"]
        return list(itertools.product(cookings, cuttings))


def _foods() -> dict[str, FoodKind]:
    fridge, shop, shelf, garden, counter = (
        "kitchen.fridge",
        "supermarket.showcase",
        "pantry.shelf",
        "garden",
        "kitchen.counter",
    )
    meat = dict(edible=False, cookable=True, needs_cooking=True)
    veg = dict(edible=True, cookable=True, needs_cooking=False, cuttable=True)
    kinds = [
        FoodKind("egg", cuttable=False, places=(fridge, shop), **meat),
        FoodKind("milk", False, False, False, False, drinkable=True, some=True, places=(fridge, shop)),
        FoodKind("water", False, False, False, False, drinkable=True, some=True, places=(fridge, shop)),
        *(
            FoodKind(n, False, False, False, False, some=True, places=(shelf, shop))
            for n in ("vegetable oil", "peanut oil", "olive oil")
        ),
        *(
            FoodKind(n, cuttable=False, places=(fridge, shop), **meat)
            for n in ("chicken wing", "chicken leg", "chicken breast")
        ),
        *(FoodKind(n, cuttable=True, places=(fridge, shop), **meat) for n in ("pork chop", "red tuna", "white tuna")),
        *(
            FoodKind(n, places=(fridge, garden), **veg)
            for n in ("carrot", "red onion", "white onion", "yellow onion", "lettuce")
        ),
        *(
            FoodKind(n, cuttable=True, places=(counter, garden), **meat)
            for n in ("red potato", "yellow potato", "purple potato")
        ),
        *(
            FoodKind(n, places=(counter, garden), **veg)
            for n in (
                "red apple",
                "yellow apple",
                "green apple",
                "banana",
                "tomato",
                "red hot pepper",
                "green hot pepper",
            )
        ),
        *(
            FoodKind(n, places=(fridge, garden), **veg)
            for n in ("red bell pepper", "yellow bell pepper", "green bell pepper", "orange bell pepper")
        ),
        *(
            FoodKind(n, True, False, False, False, places=(shelf, shop))
            for n in ("black pepper", "flour", "salt", "sugar")
        ),
        FoodKind("block of cheese", places=(fridge, shop), **veg),
        *(FoodKind(n, True, False, False, True, places=(fridge, garden)) for n in ("cilantro", "parsley")),
    ]
    return {k.name: k for k in kinds}


FOODS: dict[str, FoodKind] = _foods()


@dataclasses.dataclass(frozen=True)
class FurnitureKind:
    """A fixed piece of furniture: a container (can be opened, closed, locked) or a supporter."""

    name: str
    room: str
    kind: str  # "container" | "supporter"
    closed: bool = False  # containers start closed in CookingWorld (with --open)
    heat: str | None = None  # the cooking it does: stove fries, oven roasts, BBQ grills
    openable: bool = True  # False: a container that is never open nor closed (TextWorld's BBQ, a "toaster")


FURNITURE: dict[str, FurnitureKind] = {
    f.name: f
    for f in (
        FurnitureKind("fridge", "kitchen", "container", closed=True),
        FurnitureKind("oven", "kitchen", "container", closed=True, heat="roasted"),
        FurnitureKind("table", "kitchen", "supporter"),
        FurnitureKind("counter", "kitchen", "supporter"),
        FurnitureKind("stove", "kitchen", "supporter", heat="fried"),
        FurnitureKind("shelf", "pantry", "supporter"),
        FurnitureKind("BBQ", "backyard", "container", heat="grilled", openable=False),
        FurnitureKind("patio table", "backyard", "supporter"),
        FurnitureKind("patio chair", "backyard", "supporter"),
        FurnitureKind("showcase", "supermarket", "supporter"),
        FurnitureKind("sofa", "livingroom", "supporter"),
        FurnitureKind("bed", "bedroom", "supporter"),
        FurnitureKind("toilet", "bathroom", "supporter"),
        FurnitureKind("workbench", "shed", "supporter"),
        FurnitureKind("toolbox", "shed", "container", closed=True),
    )
}

# TextWorld-Sync: lockable storage that task families may add to a room (one per room).
STORAGE: dict[str, str] = {
    "bedroom": "chest",
    "livingroom": "cabinet",
    "corridor": "locker",
    "pantry": "cupboard",
    "garden": "crate",
    "backyard": "cooler",
    "bathroom": "medicine cabinet",
    "driveway": "car trunk",
    "street": "mailbox",
    "supermarket": "freezer",
    "shed": "toolbox",
    "kitchen": "fridge",
}

ROOM_GROUPS: tuple[tuple[str, ...], ...] = (  # CookingWorld's ROOMS: 1, 6, 9 or 12 rooms take the first 1-4 groups
    ("kitchen",),
    ("pantry", "livingroom", "corridor", "bedroom", "bathroom"),
    ("shed", "garden", "backyard"),
    ("driveway", "street", "supermarket"),
)

NEIGHBOURS: dict[str, tuple[str, ...]] = {  # CookingWorld's NEIGHBORS: which rooms may share an exit
    "kitchen": ("livingroom", "backyard", "corridor", "pantry"),
    "pantry": ("kitchen",),
    "livingroom": ("kitchen", "bedroom", "driveway", "corridor"),
    "bathroom": ("corridor",),
    "bedroom": ("livingroom", "corridor"),
    "backyard": ("kitchen", "garden", "shed", "corridor"),
    "garden": ("backyard",),
    "shed": ("backyard",),
    "driveway": ("livingroom", "street", "corridor"),
    "street": ("driveway", "supermarket"),
    "corridor": ("livingroom", "kitchen", "bedroom", "bathroom", "driveway", "backyard"),
    "supermarket": ("street",),
}

DOOR_NAMES: dict[frozenset[str], tuple[str, ...]] = {  # CookingWorld's DOORS: the exits that have a door
    frozenset(("pantry", "kitchen")): ("frosted-glass door", "plain door"),
    frozenset(("kitchen", "backyard")): ("sliding patio door", "patio door", "screen door"),
    frozenset(("corridor", "backyard")): ("sliding patio door", "patio door", "screen door"),
    frozenset(("backyard", "shed")): ("barn door", "wooden door"),
    frozenset(("livingroom", "driveway")): ("front door", "fiberglass door"),
    frozenset(("corridor", "driveway")): ("front door", "fiberglass door"),
    frozenset(("supermarket", "street")): ("sliding door", "commercial glass door"),
}

KEY_NAMES = (
    "brass key",
    "iron key",
    "copper key",
    "silver key",
    "golden key",
    "rusty key",
    "steel key",
    "bronze key",
    "small key",
    "old key",
    "tiny key",
    "heavy key",
)

DISH_NAMES = ("salad", "soup", "stew", "omelette", "curry", "casserole", "sandwich", "risotto", "pie", "gratin")
