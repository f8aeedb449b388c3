"""Cross-check of the Sync engine's rules against TextWorld's CookingWorld (``tw-cooking``, textworld 1.7.0).

:func:`cooking_game` generates a single-dish CookingWorld game in-process (``textworld.challenges.tw_cooking``'s
``make``, the function behind ``tw-make tw-cooking``; no Inform 7 compilation). :func:`world_from_game` reads the
game's facts (rooms and exits, doors and their states, containers and supporters, heat sources, objects and where
they are, each food's properties, the recipe's ingredients with their cooking and cutting, the cooking location and
the player's start room) into the equivalent Sync world: one dish called "meal", one agent. :func:`compare` then
steps a command list through both TextWorld's own engine (``textworld.envs.tw.TextWorldEnv``: the game's logic
rules and quests, the engine that computes TextWorld's admissible commands, score and won/lost) and the Sync world,
and records every difference in

- the admissible commands before each step (``prepare meal`` excepted: rules.py states the deviation; and after a
  ``prepare meal``, the commands that mention the recipe's ingredients: TextWorld's logic engine applies its
  one-ingredient rule ``make/recipe/1`` and leaves the other ingredients in the inventory, where the compiled game,
  like Sync, removes them all),
- whether the command was executable (admissible in TextWorld, ``valid`` in Sync),
- the score, won and lost after each step.

How far it reaches: the walkthrough of each game (inventory, go, open doors and containers, take from floor /
supporter / container, examine cookbook, cook with stove / oven / BBQ, chop / slice / dice with the knife, drop,
prepare meal, eat meal) must win in both with equal scores, and random walks over TextWorld's admissible commands
(every command type TextWorld admits in these games: also close, put, insert, eating any food, burning, wrong cuts
and cooking, eating ingredients, which lose the game; ``drink`` only where a game has milk or water, which the walks
of the tests and the benchmark did not reach) must agree step by step. Not reached: keys and
locks (CookingWorld has none; rules.py follows TextWorld's ``lock``/``unlock`` rules), limited inventory (``--drop``),
the Inform 7 texts (TextWorld's logic engine has no text; the feedback strings follow its Inform 7 source), and the
Inform 7 checks of ``prepare meal`` (the logic engine prepares with any carried ingredients; Sync checks cooking and
cutting as the compiled game does, so random walks leave ``prepare meal`` out).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import random
import re
import tempfile
import warnings
from collections.abc import Iterable
from typing import Any

from envs.textworld_cooking_sync.data import COOKING, CUTTING, DIRECTIONS
from envs.textworld_cooking_sync.rules import init_points
from envs.textworld_cooking_sync.state import TEAM, Dish, Door, Furniture, Ingredient, Item, Room, WorldState
from envs.textworld_cooking_sync.text import objective
from envs.textworld_cooking_sync.world import World

AGENT = "player"
SETTINGS = {"recipe": 2, "take": 2, "go": 6, "open": True, "cook": True, "cut": True, "drop": False}


def cooking_game(seed: int, **settings: Any):
    """A ``tw-make tw-cooking --seed <seed>`` game (settings as its flags; default ``--recipe 2 --take 2 --go 6
    --open --cook --cut``), as a ``textworld.Game``. Takes a few seconds (TextWorld parses its text grammars)."""
    from textworld.challenges.tw_cooking import cooking
    from textworld.generator.game import GameOptions

    unknown = set(settings) - {*SETTINGS, "recipe_seed", "split"}
    if unknown:
        raise ValueError(f"unknown tw-cooking settings {sorted(unknown)}; use {sorted(SETTINGS)}, recipe_seed, split")
    options = GameOptions()
    options.seeds = seed
    kb, tmp = cooking.KnowledgeBase, tempfile.tempdir
    cooking.KnowledgeBase = _CachedKB  # the same knowledge base, parsed once per process (half of make's time)
    with tempfile.TemporaryDirectory(prefix="sync_twcheck_") as scratch:
        # make() compiles and replays the walkthrough in a temporary folder that TextWorld sometimes leaves behind;
        # keep it inside one we remove (single-threaded use: tempfile.tempdir is process-wide)
        tempfile.tempdir = scratch
        try:
            with warnings.catch_warnings():  # jericho: "not fully supported" (it replays the walkthrough)
                warnings.simplefilter("ignore")
                return cooking.make({**SETTINGS, "recipe_seed": 0, "split": None, **settings}, options)
        finally:
            cooking.KnowledgeBase, tempfile.tempdir = kb, tmp


class _CachedKB:
    @staticmethod
    @functools.cache
    def load(**paths: str):
        from textworld.generator.data import KnowledgeBase

        return KnowledgeBase.load(**paths)


def world_from_game(game) -> WorldState:
    """The Sync world equivalent to a tw-cooking ``textworld.Game`` (module docstring)."""
    names = {k: v.name for k, v in game.infos.items()}
    facts = [(f.name, [(a.name, a.type) for a in f.arguments]) for f in game.world.facts]
    props: dict[str, set[str]] = {}
    for name, args in facts:
        if len(args) == 1:
            props.setdefault(args[0][0], set()).add(name)
    types = {a: t for _, args in facts for a, t in args}

    rooms = {names[v]: Room(names[v], {}, {}) for v, t in types.items() if t == "r"}
    kitchen, start = "kitchen", None
    for name, args in facts:
        if name in ("north_of", "south_of", "east_of", "west_of"):  # north_of(a, b): a is north of b
            (a, _), (b, _) = args
            rooms[names[b]].exits[name.removesuffix("_of")] = names[a]
        elif name == "cooking_location":
            kitchen = names[args[0][0]]
        elif name == "at" and args[0][0] == "P":
            start = names[args[1][0]]

    doors = {}
    for name, args in facts:
        if name == "link":
            (a, _), (d, _), (b, _) = args
            door = names[d]
            state = next(s for s in ("open", "closed", "locked") if s in props.get(d, ()))
            doors[door] = Door(door, tuple(sorted((names[a], names[b]))), state)
            room = rooms[names[a]]
            room.doors[next(x for x in DIRECTIONS if room.exits.get(x) == names[b])] = door

    furniture, items = {}, {}
    container_types, supporter_types = {"c", "oven", "toaster"}, {"s", "stove"}
    heat = {"oven": "roasted", "stove": "fried", "toaster": "grilled"}
    order = [v for v in game.infos if v in types]  # TextWorld's entity order: Inform 7 lists things in it
    for var in order:
        t = types[var]
        if t in container_types | supporter_types:
            p = props.get(var, set())
            state = next((s for s in ("open", "closed", "locked") if s in p), None)
            kind = "container" if t in container_types else "supporter"
            furniture[names[var]] = Furniture(
                names[var], "", kind, state if kind == "container" else None, heat=heat.get(t)
            )
    recipe: list[tuple[int, str]] = []
    for var in order:
        t = types[var]
        if t not in ("o", "f", "k"):
            continue
        p = props.get(var, set())
        if t == "f":
            cooking = next((c for c in COOKING[1:] if c in p), "raw")
            cutting = next((c for c in CUTTING[1:] if c in p), "uncut")
            item = Item(
                names[var],
                "food",
                ("gone", ""),
                edible="edible" in p,
                drinkable="drinkable" in p,
                cookable="cookable" in p,
                needs_cooking="needs_cooking" in p,
                cooking=cooking,
                burned="burned" in p,
                cuttable="cuttable" in p or "uncut" in p,
                cutting=cutting,
            )
            order = [int(x.removeprefix("ingredient_")) for x in p if x.startswith("ingredient_")]
            if order:
                recipe.append((order[0], names[var]))
        else:
            kind = "knife" if "sharp" in p else "key" if t == "k" else "cookbook"
            item = Item(names[var], kind, ("gone", ""))
        items[item.name] = item
    for name, args in facts:
        if name not in ("at", "on", "in") or args[0][0] not in names or names[args[0][0]] not in items | furniture:
            continue
        thing, (place, place_type) = names[args[0][0]], args[1]
        if name == "at" and thing in furniture:
            furniture[thing].room = names[place]
        elif name == "at":
            items[thing].where = ("room", names[place])
        elif place_type == "I":
            items[thing].where = ("held", TEAM)
        elif thing in items:
            items[thing].where = (name, names[place])

    required = {}
    for name, args in facts:
        if name == "base":
            required[names[args[0][0]]] = args[1][0]
    ingredients = []
    for _, food in sorted(recipe):
        p = props.get(required[food], set())
        cooking = next((c for c in COOKING if c in p), "raw")
        cutting = next((c for c in CUTTING if c in p), "uncut")
        ingredients.append(Ingredient(food, cooking, cutting))
    dishes = [Dish("meal", tuple(ingredients))]
    state = WorldState(rooms, doors, furniture, items, dishes, kitchen=kitchen, start_room=start or kitchen)
    state.objective = objective(dishes)
    init_points(state)
    return state


@dataclasses.dataclass
class Report:
    """What :func:`compare` found: ``mismatches`` is empty when both engines agree on every step."""

    steps: int = 0
    verbs: set[str] = dataclasses.field(default_factory=set)
    mismatches: list[str] = dataclasses.field(default_factory=list)
    won: tuple[bool, bool] = (False, False)  # (TextWorld, Sync) at the end
    lost: tuple[bool, bool] = (False, False)
    score: tuple[int, int] = (0, 0)
    max_score: tuple[int, int] = (0, 0)


def _comparable(commands: Iterable[str], stale: set[str]) -> set[str]:
    """Commands both engines should agree on: not ``prepare``, and none that mention a stale ingredient."""
    return {c for c in commands if not c.startswith("prepare ") and not any(f in c for f in stale)}


def compare(game, commands: list[str] | None = None, *, random_steps: int = 0, seed: int = 0) -> Report:
    """Steps ``commands`` (default: the game's walkthrough), then ``random_steps`` commands drawn from TextWorld's
    admissible list (``prepare meal`` left out), through TextWorld's engine and the Sync world, comparing each step
    (module docstring). Stops when either engine's game is over."""
    from textworld import EnvInfos
    from textworld.envs.tw import TextWorldEnv

    commands = list(game.metadata["walkthrough"] if commands is None else commands)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "game.json")
        game.save(path)
        tw = TextWorldEnv(EnvInfos(admissible_commands=True, score=True, won=True, lost=True, max_score=True))
        tw.load(path)
        gs = tw.reset()
    world = World(world_from_game(game))
    world.add_agent(AGENT)
    rng = random.Random(seed)
    report = Report(max_score=(int(gs["max_score"]), world.score[1]))

    stale: set[str] = set()  # ingredients TextWorld's logic engine still carries after "prepare meal"

    def step(command: str) -> bool:
        nonlocal gs
        theirs, ours = _comparable(gs["admissible_commands"], stale), _comparable(world.admissible(AGENT), stale)
        if theirs != ours:
            report.mismatches.append(
                f"step {report.steps} before {command!r}: admissible only in TextWorld {sorted(theirs - ours)}, "
                f"only in Sync {sorted(ours - theirs)}"
            )
        admissible = command in gs["admissible_commands"]
        gs, _, done = tw.step(command)
        r = world.step(AGENT, command)
        report.steps += 1
        report.verbs.add(command.split()[0])
        if _comparable([command], stale) and admissible != r.valid:
            report.mismatches.append(
                f"step {report.steps} {command!r}: TextWorld admissible={admissible}, Sync valid={r.valid} ({r.text})"
            )
        if command.startswith("prepare ") and r.valid:
            stale.update(i.food for d in world.read(lambda s: s.dishes) for i in d.ingredients)
        if (gs["score"], gs["won"], gs["lost"]) != (r.score, r.won, r.lost):
            report.mismatches.append(
                f"step {report.steps} {command!r}: TextWorld score/won/lost {gs['score']}/{gs['won']}/{gs['lost']}, "
                f"Sync {r.score}/{r.won}/{r.lost}"
            )
        report.won, report.lost, report.score = (gs["won"], r.won), (gs["lost"], r.lost), (gs["score"], r.score)
        return done or r.done

    for command in commands:
        if step(command):
            return report
    for _ in range(random_steps):
        options = sorted(_comparable(gs["admissible_commands"], set()))
        if not options or step(rng.choice(options)):
            break
    return report


TEXT_VERBS = (
    "inventory",
    "take",
    "drop",
    "put",
    "insert",
    "open",
    "close",
    "eat",
    "drink",
    "cook",
    "slice",
    "dice",
    "chop",
    "prepare",
)  # their feedback is fixed text in TextWorld's Inform 7 source (rooms' is generated)
_PROMPT = re.compile(r"\n>.*", re.S)
_SCORE = re.compile(r"Your score has just gone up by one point\.|\*\*\* (The End|You lost!) \*\*\*.*", re.S)


def compile_game(game, path: str) -> str:
    """Compiles a game to a playable Inform 7 story file (``.z8``) at ``path`` (about two seconds)."""
    from textworld.generator import compile_game as compile_
    from textworld.generator.game import GameOptions

    options = GameOptions()
    options.path, options.force_recompile = path, True
    return compile_(game, options)


def _clean(text: str) -> str:
    return re.sub(r"\s+", " ", _SCORE.sub("", _PROMPT.sub("", text))).strip()


def compare_text(
    game, story: str, commands: list[str] | None = None, *, random_steps: int = 0, seed: int = 0
) -> Report:
    """Like :func:`compare`, against the compiled game (``story``, from :func:`compile_game`) and on the feedback
    text: for the commands of :data:`TEXT_VERBS` and ``examine cookbook`` (rooms and other descriptions come from
    TextWorld's random grammar), the Sync feedback must equal the game's, whitespace aside. Random steps draw from
    the game's admissible commands, ``prepare meal`` left out."""
    import textworld
    from textworld import EnvInfos

    commands = list(game.metadata["walkthrough"] if commands is None else commands)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        env = textworld.start(story, request_infos=EnvInfos(admissible_commands=True, score=True, won=True, lost=True))
        gs = env.reset()
    world = World(world_from_game(game))
    world.add_agent(AGENT)
    rng = random.Random(seed)
    report = Report(max_score=(int(gs["max_score"] or 0), world.score[1]))

    def step(command: str) -> bool:
        nonlocal gs
        gs, _, done = env.step(command)
        r = world.step(AGENT, command)
        report.steps += 1
        verb = command.split()[0]
        if verb in TEXT_VERBS or command == "examine cookbook":
            report.verbs.add(verb)
            theirs, ours = _clean(gs.feedback), _clean(r.text)
            if theirs != ours:
                report.mismatches.append(f"step {report.steps} {command!r}: TextWorld {theirs!r}, Sync {ours!r}")
        report.won, report.lost, report.score = (gs["won"], r.won), (gs["lost"], r.lost), (gs["score"], r.score)
        return done or r.done

    for command in commands:
        if step(command):
            break
    else:
        for _ in range(random_steps):
            options = sorted(c for c in gs["admissible_commands"] if not c.startswith("prepare "))
            if not options or step(rng.choice(options)):
                break
    env.close()
    return report
