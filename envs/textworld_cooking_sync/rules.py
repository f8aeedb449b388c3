"""The game's rules: parse one agent's command, apply it to the shared state, list the admissible commands.

Commands (CookingWorld's language, TextWorld's command templates)::

    look | inventory | examine X | go north|south|east|west
    open X | close X | unlock X with K | lock X with K          (doors, containers; keys are a Sync addition)
    take X | take X from Y | drop X | put X on S | insert X into C
    eat X | drink X | cook X with stove|oven|BBQ | slice|dice|chop X with knife
    prepare D | eat D                                           (D: a dish name; "meal" in CookingWorld)

The rules are CookingWorld's (TextWorld 1.7.0's ``tw_cooking`` logic files and Inform 7 code): cooking a raw food
fries / roasts / grills it by the heat source (a food that needs cooking becomes edible), cooking anything already
cooked burns it; cutting needs a carried sharp knife and an uncut, cuttable, carried food; ``prepare`` needs the
kitchen and every ingredient of the dish carried, cooked and cut as the recipe says (checked ingredient by ingredient,
with CookingWorld's messages "You still miss something." / "Something still needs to be cooked." / "... cut.") and
puts the dish in the inventory; going through a door needs it open; a locked door or container opens only after
``unlock`` with its own key, carried.

Score and failure are CookingWorld's quests, per dish: one point for first holding each ingredient that did not
start in the inventory, one for each required cooking and cutting (when the food did not start that way), one for
preparing the dish and one for eating it. Processing an ingredient any other way than its recipe says (cooking one
the recipe wants raw, cutting one it wants uncut, the wrong heat or cut, burning it), eating or drinking it, or burning
the prepared dish
makes that dish impossible: the world is then lost (CookingWorld loses the game). The world is won when every dish is
eaten; each eaten dish is partial progress in the score.

Admissible commands are TextWorld's: the commands whose rule preconditions hold for that agent (its room, what it
carries), e.g. ``examine`` lists things in the room but not carried ones, ``cook`` lists every carried cookable food
that is not burned with every heat source in the room (cooking it again would burn it). One deviation:
``prepare D`` is admissible when the agent is in the kitchen and carries every ingredient of a pending dish
(TextWorld admits ``prepare meal`` as soon as the recipe's first ingredient is carried).

Invalid commands (unknown verb, unknown or out-of-reach object, failed precondition) leave the state unchanged and
answer with a message; they never raise.
"""

from __future__ import annotations

import dataclasses
import re

from envs.textworld_cooking_sync.data import CUT_OF_VERB, CUT_VERB, DIRECTIONS
from envs.textworld_cooking_sync.state import Agent, Item, WorldState
from envs.textworld_cooking_sync.text import a_item, examine_text, inventory_text, listing, room_text

_SPACES = re.compile(r"\s+")
UNKNOWN = "That's not a verb I recognise."
NOT_HERE = "You can't see any such thing."


@dataclasses.dataclass(frozen=True)
class Outcome:
    text: str
    valid: bool


def normalise(command: str) -> str:
    return _SPACES.sub(" ", command.strip().lower())


# -- scoring -----------------------------------------------------------------------------------------------------------
def init_points(state: WorldState) -> None:
    """CookingWorld's quests as score events (module docstring); call once on a fresh world."""
    points: dict[str, int] = {}
    for dish in state.dishes:
        for ing in dish.ingredients:
            food = state.items[ing.food]
            if food.where[0] != "held":
                points[f"take:{ing.food}"] = 1
            if ing.cooking != "raw" and food.cooking != ing.cooking:
                points[f"cook:{ing.food}"] = 1
            if ing.cutting != "uncut" and food.cutting != ing.cutting:
                points[f"cut:{ing.food}"] = 1
        points[f"prepare:{dish.name}"] = 1
        points[f"eat:{dish.name}"] = 1
    state.points = points


def update_progress(state: WorldState) -> None:
    """Records newly reached score events and newly failed dishes (after every committed command)."""
    reached = set(state.scored)
    for dish in state.dishes:
        if dish.name in state.failed:
            continue
        events = []
        if dish.status == "pending":
            for ing in dish.ingredients:
                food = state.items[ing.food]
                why = _ruined(food, ing.cooking, ing.cutting)
                if why:
                    state.failed[dish.name] = why
                    break
                if food.where[0] == "held":
                    events.append(f"take:{ing.food}")
                if food.cooking == ing.cooking:
                    events.append(f"cook:{ing.food}")
                if food.cutting == ing.cutting:
                    events.append(f"cut:{ing.food}")
        else:
            meal = state.items.get(dish.name)
            if meal is not None and meal.burned:
                state.failed[dish.name] = f"the {dish.name} was burned"
            events.append(f"prepare:{dish.name}")
            if dish.status == "eaten":
                events.append(f"eat:{dish.name}")
        for e in events:
            if e in state.points and e not in reached:
                state.scored.append(e)
                reached.add(e)


def _ruined(food: Item, cooking: str, cutting: str) -> str | None:
    if food.where == ("gone", ""):
        return f"the {food.name} was consumed"
    if food.burned:
        return f"the {food.name} was burned"
    if food.cooking not in ("raw", cooking):
        return f"the {food.name} was {food.cooking}, the recipe needs it {cooking}"
    if food.cutting not in ("uncut", cutting):
        return f"the {food.name} was {food.cutting}, the recipe needs it {cutting}"
    return None


# -- commands ----------------------------------------------------------------------------------------------------------
def execute(state: WorldState, agent_id: str, command: str) -> Outcome:
    """Applies one command of ``agent_id`` to ``state`` (in place) and returns the feedback."""
    agent = state.agents[agent_id]
    words = normalise(command)
    verb, _, rest = words.partition(" ")
    handler = _HANDLERS.get(verb)
    if handler is None:
        return Outcome(UNKNOWN, False)
    out = handler(state, agent, rest)
    if out.valid and verb not in _NO_PROGRESS:
        update_progress(state)
    return out


def _resolve(state: WorldState, text: str) -> str | None:
    return state.lookup(text.removeprefix("the "))


def _reachable(state: WorldState, agent: Agent, name: str) -> bool:
    """The thing is carried, visible in the agent's room, a furniture of the room or a door of the room."""
    if name in state.items:
        item = state.items[name]
        return state.holds(agent.id, name) or item in state.visible_items(agent.room)
    if name in state.furniture:
        return state.furniture[name].room == agent.room
    if name in state.doors:
        return agent.room in state.doors[name].rooms
    return False


def _target(state: WorldState, agent: Agent, text: str) -> str | None:
    name = _resolve(state, text)
    return name if name is not None and _reachable(state, agent, name) else None


def _look(state, agent, rest):
    if rest:
        return Outcome(UNKNOWN, False)
    return Outcome(room_text(state, agent.room, agent.id), True)


def _inventory(state, agent, rest):
    if rest:
        return Outcome(UNKNOWN, False)
    return Outcome(inventory_text(state, agent.id), True)


def _examine(state, agent, rest):
    name = _target(state, agent, rest)
    if name is None:
        return Outcome(NOT_HERE, False)
    if name in state.items and state.items[name].kind == "cookbook":
        agent.read_cookbook = True
    return Outcome(examine_text(state, name), True)


def _go(state, agent, rest):
    if rest not in DIRECTIONS:
        return Outcome(UNKNOWN if not rest else "You can't go that way.", False)
    room = state.rooms[agent.room]
    if rest not in room.exits:
        return Outcome("You can't go that way.", False)
    if rest in room.doors:
        door = state.doors[room.doors[rest]]
        if door.state != "open":
            return Outcome(f"You have to open the {door.name} first.", False)
    agent.room = room.exits[rest]
    return Outcome(room_text(state, agent.room, agent.id), True)


def _openable(state, name):
    if name in state.doors:
        return state.doors[name]
    f = state.furniture.get(name)
    return f if f is not None and f.kind == "container" and f.state is not None else None


def _open(state, agent, rest):
    name = _target(state, agent, rest)
    if name is None:
        return Outcome(NOT_HERE, False)
    thing = _openable(state, name)
    if thing is None:
        return Outcome("That's not something you can open.", False)
    if thing.state == "open":
        return Outcome("That's already open.", False)
    if thing.state == "locked":
        return Outcome(f"The {name} is locked.", False)
    thing.state = "open"
    if name in state.doors:
        return Outcome(f"You open {name}.", True)
    inside = state.contents("in", name)
    if inside:
        return Outcome(f"You open the {name}, revealing {listing([a_item(i) for i in inside])}.", True)
    return Outcome(f"You open the {name}.", True)


def _close(state, agent, rest):
    name = _target(state, agent, rest)
    if name is None:
        return Outcome(NOT_HERE, False)
    thing = _openable(state, name)
    if thing is None:
        return Outcome("That's not something you can close.", False)
    if thing.state != "open":
        return Outcome("That's already closed.", False)
    thing.state = "closed"
    return Outcome(f"You close {name}." if name in state.doors else f"You close the {name}.", True)


def _lock_or_unlock(lock: bool):
    def handler(state, agent, rest):
        target_text, sep, key_text = rest.partition(" with ")
        if not sep:
            return Outcome(UNKNOWN, False)
        name, key = _target(state, agent, target_text), _resolve(state, key_text)
        if name is None or key is None or not _reachable(state, agent, key):
            return Outcome(NOT_HERE, False)
        thing = _openable(state, name)
        if thing is None:
            return Outcome("That doesn't seem to be something with a lock.", False)
        if not state.holds(agent.id, key):
            return Outcome(f"You need to take the {key} first.", False)
        if state.items[key].kind != "key" or thing.key != key:
            return Outcome("That doesn't seem to fit the lock.", False)
        the = "" if name in state.doors else "the "
        if lock:
            if thing.state == "open":
                return Outcome(f"You have to close {the}{name} first.", False)
            if thing.state == "locked":
                return Outcome("That's already locked.", False)
            thing.state = "locked"
            return Outcome(f"You lock {the}{name}.", True)
        if thing.state != "locked":
            return Outcome("That's not locked.", False)
        thing.state = "closed"
        return Outcome(f"You unlock {the}{name}.", True)

    return handler


def _take(state, agent, rest):
    what, sep, source = rest.partition(" from ")
    name = _resolve(state, what)
    if name is None or name not in state.items:
        return Outcome(
            NOT_HERE if name is None or not _reachable(state, agent, name) else "That's fixed in place.", False
        )
    item = state.items[name]
    if state.holds(agent.id, name):
        return Outcome("You already have that.", False)
    if item not in state.visible_items(agent.room):
        return Outcome(NOT_HERE, False)
    kind, place = item.where
    if sep:
        src = _target(state, agent, source)
        if src is None:
            return Outcome(NOT_HERE, False)
        if src != place or kind == "room":
            return Outcome(f"The {name} is not there.", False)
    state.move(item, ("held", state.holder(agent.id)))
    if kind == "room":
        return Outcome(f"You pick up the {name} from the ground.", True)
    return Outcome(f"You take the {name} from the {place}.", True)


def _carried(state, agent, text) -> tuple[str | None, Outcome | None]:
    name = _resolve(state, text)
    if name is None or name not in state.items or not _reachable(state, agent, name):
        return None, Outcome(NOT_HERE, False)
    if not state.holds(agent.id, name):
        return None, Outcome(f"You need to take the {name} first.", False)
    return name, None


def _drop(state, agent, rest):
    name, err = _carried(state, agent, rest)
    if err:
        return err
    state.move(state.items[name], ("room", agent.room))
    return Outcome(f"You drop the {name} on the ground.", True)


def _put_into(kind: str, sep_word: str):
    def handler(state, agent, rest):
        what, sep, where = rest.partition(f" {sep_word} ")
        if not sep:
            return Outcome(UNKNOWN, False)
        name, err = _carried(state, agent, what)
        if err:
            return err
        dest = _target(state, agent, where)
        if dest is None or dest not in state.furniture:
            return Outcome(NOT_HERE, False)
        f = state.furniture[dest]
        wanted = "supporter" if kind == "on" else "container"
        if f.kind != wanted:
            return Outcome(f"You can't put things {sep_word} the {dest}.", False)
        if kind == "in" and f.state != "open":
            return Outcome(f"The {dest} is closed.", False)
        state.move(state.items[name], (kind, dest))
        return Outcome(f"You put the {name} {'on' if kind == 'on' else 'into'} the {dest}.", True)

    return handler


def _eat_or_drink(drink: bool):
    def handler(state, agent, rest):
        name, err = _carried(state, agent, rest)
        if err:
            return err
        item = state.items[name]
        if drink:
            if not item.drinkable:
                return Outcome(f"You cannot drink the {name}.", False)
        elif not item.is_food or item.drinkable:
            return Outcome("That's plainly inedible.", False)
        elif item.needs_cooking:
            return Outcome(f"You should cook the {name} first.", False)
        elif not item.edible:
            return Outcome("That's plainly inedible.", False)
        state.move(item, ("gone", ""))
        if item.kind == "meal":
            state.dish(name).status = "eaten"
        return Outcome(f"You {'drink' if drink else 'eat'} the {name}. Not bad.", True)

    return handler


def _cook(state, agent, rest):
    what, sep, heat_text = rest.partition(" with ")
    if not sep:
        return Outcome(UNKNOWN, False)
    name, err = _carried(state, agent, what)
    if err:
        return err
    heat = _target(state, agent, heat_text)
    if heat is None:
        return Outcome(NOT_HERE, False)
    item = state.items[name]
    if not item.is_food or not item.cookable:
        return Outcome("Can only cook food.", False)
    source = state.furniture.get(heat)
    if source is None or source.heat is None:
        return Outcome("Cooking requires a source of heat.", False)
    if item.burned:
        return Outcome(f"The {name} is already burned.", False)
    if item.cooking != "raw":
        item.burned, item.edible = True, False
        return Outcome(f"You burned the {name}!", True)
    item.cooking = source.heat
    if item.needs_cooking:
        item.needs_cooking, item.edible = False, True
    return Outcome(f"You {source.heat} the {name}.", True)


def _cut(verb: str):
    def handler(state, agent, rest):
        what, sep, tool_text = rest.partition(" with ")
        if not sep:
            return Outcome(UNKNOWN, False)
        name, err = _carried(state, agent, what)
        if err:
            return err
        tool, err = _carried(state, agent, tool_text)
        if err:
            return err
        item = state.items[name]
        if not item.is_food or not item.cuttable:
            return Outcome("Can only cut cuttable food.", False)
        if state.items[tool].kind != "knife":
            return Outcome("Cutting something requires a knife.", False)
        if item.cutting != "uncut":
            return Outcome(f"The {name} is already {item.cutting}.", False)
        item.cutting = CUT_OF_VERB[verb]
        return Outcome(f"You {verb} the {name}.", True)

    return handler


def _prepare(state, agent, rest):
    dish = state.dish(rest)
    if dish is None:
        names = listing([d.name for d in state.dishes])
        return Outcome(f"The cookbook has no recipe called {rest!r}; its dishes are {names}.", False)
    if agent.room != state.kitchen:
        return Outcome(f"Can only prepare {dish.name} in the {state.kitchen}.", False)
    if dish.status != "pending":
        return Outcome(f"The {dish.name} is already prepared.", False)
    for ing in dish.ingredients:
        food = state.items[ing.food]
        if not state.holds(agent.id, ing.food):
            return Outcome("You still miss something.", False)
        if food.cooking != ing.cooking:
            return Outcome("Something still needs to be cooked.", False)
        if food.cutting != ing.cutting:
            return Outcome("Something still needs to be cut.", False)
    for ing in dish.ingredients:
        state.move(state.items[ing.food], ("gone", ""))
    meal = state.items[dish.name] = Item(name=dish.name, kind="meal", where=("gone", ""), edible=True, cookable=True)
    state.move(meal, ("held", state.holder(agent.id)))
    dish.status = "prepared"
    return Outcome(f"Adding the {dish.name} to your inventory.", True)


_NO_PROGRESS = frozenset({"look", "inventory", "examine", "go", "open", "close", "lock", "unlock"})  # move no item
_HANDLERS = {
    "look": _look,
    "inventory": _inventory,
    "examine": _examine,
    "go": _go,
    "open": _open,
    "close": _close,
    "lock": _lock_or_unlock(True),
    "unlock": _lock_or_unlock(False),
    "take": _take,
    "drop": _drop,
    "put": _put_into("on", "on"),
    "insert": _put_into("in", "into"),
    "eat": _eat_or_drink(False),
    "drink": _eat_or_drink(True),
    "cook": _cook,
    "prepare": _prepare,
    **{verb: _cut(verb) for verb in CUT_VERB.values()},
}


# -- admissible commands -----------------------------------------------------------------------------------------------
def admissible(state: WorldState, agent_id: str) -> tuple[str, ...]:
    """The commands whose preconditions hold for ``agent_id`` (module docstring), sorted."""
    agent = state.agents[agent_id]
    room = agent.room
    out = {"look", "inventory"}
    r = state.rooms[room]
    for d in DIRECTIONS:
        if d in r.exits and (d not in r.doors or state.doors[r.doors[d]].state == "open"):
            out.add(f"go {d}")
    furniture = state.furniture_in(room)
    openables = [f for f in furniture if f.kind == "container"] + list(state.doors_of(room).values())
    carried = state.carried(agent_id)
    keys = [i for i in carried if i.kind == "key"]
    for thing in openables:
        if thing.state == "closed":
            out.add(f"open {thing.name}")
        elif thing.state == "open":
            out.add(f"close {thing.name}")
        for k in keys:
            if thing.key == k.name and thing.state in ("closed", "locked"):
                out.add(f"{'unlock' if thing.state == 'locked' else 'lock'} {thing.name} with {k.name}")
    for f in furniture:
        out.add(f"examine {f.name}")
    for item in state.visible_items(room):
        out.add(f"examine {item.name}")
        kind, place = item.where
        out.add(f"take {item.name}" if kind == "room" else f"take {item.name} from {place}")
    supporters = [f.name for f in furniture if f.kind == "supporter"]
    open_containers = [f.name for f in furniture if f.kind == "container" and f.state == "open"]
    heat = [f.name for f in furniture if f.heat]
    knives = [i.name for i in carried if i.kind == "knife"]
    for item in carried:
        out.add(f"drop {item.name}")
        out.update(f"put {item.name} on {s}" for s in supporters)
        out.update(f"insert {item.name} into {c}" for c in open_containers)
        if item.is_food:
            if item.edible and not item.drinkable:
                out.add(f"eat {item.name}")
            if item.drinkable:
                out.add(f"drink {item.name}")
            if item.cookable and not item.burned:
                out.update(f"cook {item.name} with {h}" for h in heat)
            if item.cuttable and item.cutting == "uncut":
                out.update(f"{v} {item.name} with {k}" for v in CUT_VERB.values() for k in knives)
    if room == state.kitchen:
        for dish in state.dishes:
            if dish.status == "pending" and all(state.holds(agent_id, i.food) for i in dish.ingredients):
                out.add(f"prepare {dish.name}")
    return tuple(sorted(out))
