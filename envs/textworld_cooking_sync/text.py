"""What agents read: room descriptions, the inventory, the cookbook, examine texts, the objective.

The wording follows CookingWorld's where it is fixed text in TextWorld's Inform 7 source: the cookbook's
"Recipe #1 ... Ingredients: ... Directions: ...", "You are carrying: a knife and a raw red potato.", "That's a sliced
fried carrot!", food names prefixed by their state, listings with the most recently moved thing first. Room
descriptions are deterministic, one template (CookingWorld draws each room's prose from a random grammar): header,
furniture with what is on or in it, exits and doors, the floor, and the other agents in the room. Examining a
furniture, door, knife or key gives a short factual sentence (CookingWorld's are drawn from the grammar).
"""

from __future__ import annotations

from envs.textworld_cooking_sync.data import COOK_VERB, CUT_VERB, DIRECTIONS
from envs.textworld_cooking_sync.state import Dish, Furniture, Item, WorldState

BOOK_TITLE = 'You open the copy of "Cooking: A Modern Approach (3rd Ed.)" and start reading:'


def article(name: str, some: bool = False) -> str:
    if some:
        return f"some {name}"
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"


def listing(words: list[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    if len(words) <= 1:
        return "".join(words)
    return ", ".join(words[:-1]) + " and " + words[-1]


def item_name(item: Item) -> str:
    """The name with the food's state in front, as CookingWorld prints it in listings."""
    if not item.is_food:
        return item.name
    prefix = []
    if item.cutting != "uncut":
        prefix.append(item.cutting)
    if item.burned:
        prefix.append("burned")
    elif item.needs_cooking:
        prefix.append("raw")
    elif item.cooking != "raw":
        prefix.append(item.cooking)
    return " ".join([*prefix, item.name])


def a_item(item: Item) -> str:
    return article(item_name(item), item.some)


def furniture_phrase(f: Furniture) -> str:
    if f.kind == "container":
        return article(f"{f.state} {f.name}" if f.state in ("closed", "locked") else f.name)
    return article(f.name)


def room_text(state: WorldState, room: str, viewer: str | None = None) -> str:
    r = state.rooms[room]
    lines = [f"-= {room[:1].upper() + room[1:]} =-", f"You are in the {room}."]
    furniture = state.furniture_in(room)
    if furniture:
        parts = [f"You see {listing([furniture_phrase(f) for f in furniture])}."]
        for f in furniture:
            if f.kind == "supporter":
                things = state.contents("on", f.name)
                if things:
                    parts.append(f"On the {f.name} you see {listing([a_item(i) for i in things])}.")
            elif f.state == "open":
                things = state.contents("in", f.name)
                parts.append(
                    f"The {f.name} contains {listing([a_item(i) for i in things])}."
                    if things
                    else f"The {f.name} is empty."
                )
        lines.append(" ".join(parts))
    exits = []
    for d in DIRECTIONS:
        if d not in r.exits:
            continue
        if d in r.doors:
            door = state.doors[r.doors[d]]
            exits.append(f"There is {article(door.state + ' ' + door.name)} leading {d}.")
        else:
            exits.append(f"There is an exit to the {d}.")
    lines.append(" ".join(exits) if exits else "There is no exit.")
    floor = state.contents("room", room)
    if floor:
        verb = "is" if len(floor) == 1 else "are"
        lines.append(f"There {verb} {listing([a_item(i) for i in floor])} on the floor.")
    others = state.agents_in(room, but=viewer)
    if others:
        lines.append(f"Also here: {listing(others)}.")
    return "\n".join(lines)


def inventory_text(state: WorldState, agent: str) -> str:
    carried = state.carried(agent)
    if not carried:
        return "You are carrying nothing."
    return f"You are carrying: {listing([a_item(i) for i in carried])}."


def recipe_text(state: WorldState) -> str:
    """The cookbook: CookingWorld's recipe card, one per dish (``Recipe #1: salad`` when there are several)."""
    cards = []
    single = len(state.dishes) == 1
    for k, dish in enumerate(state.dishes, 1):
        directions = []
        for ing in dish.ingredients:
            if ing.cutting in CUT_VERB:
                directions.append(f"{CUT_VERB[ing.cutting]} the {ing.food}")
            if ing.cooking in COOK_VERB:
                directions.append(f"{COOK_VERB[ing.cooking]} the {ing.food}")
        directions.append(f"prepare {dish.name}")
        title = f"Recipe #{k}" if single else f"Recipe #{k}: {dish.name}"
        cards.append(
            f"{title}\n---------\nGather all following ingredients and follow the directions to prepare this tasty "
            f"{'meal' if single else dish.name}.\n\nIngredients:\n  "
            + "\n  ".join(i.food for i in dish.ingredients)
            + "\n\nDirections:\n  "
            + "\n  ".join(directions)
        )
    return BOOK_TITLE + "\n\n" + "\n\n".join(cards)


def examine_text(state: WorldState, name: str) -> str:
    if name in state.furniture:
        f = state.furniture[name]
        heat = {
            "fried": " Useful for frying things.",
            "roasted": " Useful for roasting things.",
            "grilled": " Useful for grilling things.",
        }
        extra = heat.get(f.heat or "", "")
        if f.kind == "supporter":
            things = state.contents("on", f.name)
            body = (
                f"On the {f.name} you see {listing([a_item(i) for i in things])}."
                if things
                else f"The {f.name} is empty."
            )
            return body + extra
        if f.state == "open":
            things = state.contents("in", f.name)
            body = (
                f"The {f.name} is open. It contains {listing([a_item(i) for i in things])}."
                if things
                else f"The {f.name} is open and empty."
            )
            return body + extra
        if f.state is None:
            return f"The {f.name} is here." + extra
        return f"The {f.name} is {f.state}." + extra
    if name in state.doors:
        return f"The {name} is {state.doors[name].state}."
    item = state.items[name]
    if item.kind == "cookbook":
        return recipe_text(state)
    if item.kind == "knife":
        return f"The {item.name} is sharp."
    if item.kind == "key":
        return f"The {item.name} fits the {item.opens}." if item.opens else f"The {item.name} is a key."
    if item.kind == "meal":
        return f"The {item.name} is ready to eat." if not item.burned else f"The {item.name} is burned."
    return f"That's {a_item(item)}!"


def objective(dishes: list[Dish]) -> str:
    """CookingWorld's objective for one dish called "meal"; with several dishes, the same sentence in the plural."""
    if len(dishes) == 1 and dishes[0].name == "meal":
        return (
            "You are hungry! Let's cook a delicious meal. Check the cookbook in the kitchen for the recipe. "
            "Once done, enjoy your meal!"
        )
    names = listing([d.name for d in dishes])
    return (
        f"You are hungry! Let's cook {len(dishes)} delicious dishes: {names}. Check the cookbook in the kitchen for "
        "the recipes. Every dish must be prepared and eaten. Once done, enjoy your meals!"
    )
