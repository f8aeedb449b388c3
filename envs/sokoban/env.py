"""Sokoban 6×6 with one box: RAGEN's text environment over gym-sokoban rooms (DESIGN.md, environments).

Observation: RAGEN's grid text (:func:`envs.sokoban.room.render_room`); ``Obs.text`` and ``Obs.anchor`` are both
exactly that grid (no step counter, no history, no feedback line: prompt templating belongs to the agents
layer). ``Obs.admissible`` is always ``("Up", "Down", "Left", "Right")``: a move into a wall, or a push against
a wall or another box, is a *valid* action that leaves the state unchanged (gym-sokoban) and costs the step
penalty like any other move (``info["effective"]`` is False, RAGEN's ``action_is_effective``).

Reward (gym-sokoban ``_calc_reward``, which RAGEN passes through unchanged)::

    r_t = -0.1                                  # penalty_for_step, every valid action
          + 1    if a box was pushed onto a target   (reward_box_on_target)
          - 1    if a box was pushed off a target    (penalty_box_off_target)
          + 10   if every box is now on a target     (reward_finished; the episode terminates, won)

so the winning push of the single box scores ``-0.1 + 1 + 10 = 10.9``.

Actions: the four words, matched case-insensitively after stripping surrounding white space ("up", "UP",
" Left "). Anything else ("jump", "", "<action>up", "Up Up") is *invalid*: the state does not change,
``info["valid"]`` is False and the environment reward is 0.0. That is RAGEN's behaviour: an action it cannot
parse is never sent to the environment, and the invalid-format penalty is the trainer's (from
``info["valid"]``, envs/base.py). An invalid action still counts towards the step limit (the base class counts
every call of ``step``).

Episodes end when the box is on its target (``won``) or at ``max_steps`` = 15 (``truncated``; RAGEN's 6×6
setting caps an episode at a handful of turns of a few actions each; 15 is this project's budget). Every
task's room is solvable within 15 moves (generation filter, :mod:`envs.sokoban.generate`).

Tasks (fixed manifests, the rooms are generated lazily at reset from the seed):

    split    seeds                          task ids
    train    0 .. 9_999                     sokoban-6x6-<seed>
    valid    1_000_000 .. 1_000_499         sokoban-6x6-<seed>
    test     2_000_000 .. 2_000_499         sokoban-6x6-<seed>

A task whose ``meta`` has a ``"room"`` entry (a grid in the rendering's symbols) resets to that room instead
(hand-built rooms in tests and demos).
"""

from __future__ import annotations

import functools
from typing import Any, ClassVar, NamedTuple

from envs.base import Env, Obs, Task
from envs.sokoban.generate import RoomConfig, generate_room
from envs.sokoban.room import (  # noqa: F401  (the reward constants are part of this module's interface)
    ACTIONS,
    BOX_ON_TARGET,
    PENALTY_BOX_OFF_TARGET,
    PENALTY_FOR_STEP,
    REWARD_BOX_ON_TARGET,
    REWARD_FINISHED,
    RoomStep,
    SokobanState,
    make_state,
    parse_room,
    render_room,
    step_room,
)
from envs.sokoban.solver import oracle_action

INVALID_ACTION_REWARD = 0.0  # the trainer applies the invalid penalty from info["valid"]

INSTRUCTION = (
    "You are solving the Sokoban puzzle. You are the player and you need to push all boxes to targets. "
    "When you are right next to a box, you can push it by moving in the same direction. "
    "You cannot push a box through a wall, and you cannot pull a box. "
    "The meaning of each symbol in the state is: #: wall, _: empty, O: target, √: box on target, X: box, "
    "P: player, S: player on target. "
    "Your available actions are: Up, Down, Left, Right."
)

SPLITS: dict[str, range] = {
    "train": range(0, 10_000),
    "valid": range(1_000_000, 1_000_500),
    "test": range(2_000_000, 2_000_500),
}

_ACTION_OF_WORD = {action.lower(): action for action in ACTIONS}


class SokobanSnapshot(NamedTuple):
    """Everything :meth:`SokobanEnv.restore` needs; picklable and immutable."""

    task: Task  # the task the episode was reset to
    state: SokobanState  # layout, player, boxes
    steps: int  # actions taken so far (valid or not)
    done: bool  # the episode has ended
    episode_return: float  # sum of the rewards so far


class SokobanEnv(Env):
    """RAGEN's Sokoban (6×6, one box, 15 steps) on the protocol of :class:`envs.base.Env`."""

    name: ClassVar[str] = "sokoban"

    def __init__(self, max_steps: int = 15, room: RoomConfig | None = None):
        super().__init__(max_steps)
        self.room = room if room is not None else RoomConfig()
        self.state: SokobanState | None = None
        self.episode_return = 0.0

    # -- the protocol ----------------------------------------------------------------------------------------------
    def _reset(self, task: Task) -> Obs:
        if "room" in task.meta:
            self.state = parse_room(task.meta["room"])
        else:
            self.state = _generated_room(task.seed, self.room)
        self.episode_return = 0.0
        return self._obs()

    def _step(self, action: str) -> tuple[Obs, float, bool, dict[str, Any]]:
        word = _ACTION_OF_WORD.get(action.strip().lower())
        if word is None:
            obs, on_target = _view(self.state)
            info = {"won": False, "truncated": False, "valid": False, "effective": False, "boxes_on_target": on_target}
            return obs, INVALID_ACTION_REWARD, False, info
        (state, reward, won, moved, on_target), obs = _transition(self.state, word)
        self.state = state
        self.episode_return += reward
        info = {"won": won, "truncated": False, "valid": True, "effective": moved, "boxes_on_target": on_target}
        return obs, reward, won, info

    def snapshot(self) -> SokobanSnapshot:
        if self.task is None or self.state is None:
            raise RuntimeError("sokoban: snapshot() before reset()")
        return SokobanSnapshot(self.task, self.state, self.steps, self.done, self.episode_return)

    def restore(self, snapshot: SokobanSnapshot) -> Obs:
        task, state, steps, done, episode_return = snapshot
        if task.env != self.name:
            raise ValueError(f"snapshot of a {task.env!r} task, not {self.name!r}")
        self.state = make_state(state.layout, state.player, state.boxes)  # re-validated
        self.task, self.steps, self.done, self.episode_return = task, int(steps), bool(done), float(episode_return)
        return self._obs()

    def oracle(self) -> str:
        """First action of the BFS shortest solution from the current state (``"Up"`` if none exists)."""
        if self.state is None:
            raise RuntimeError("sokoban: oracle() before reset()")
        return oracle_action(self.state)

    @classmethod
    def tasks(cls, split: str) -> list[Task]:
        """The fixed manifest of a split (see the module docstring); rooms are generated at reset."""
        if split not in SPLITS:
            raise ValueError(f"unknown sokoban split {split!r}; one of {sorted(SPLITS)}")
        return list(_manifest(split))

    # -- helpers -------------------------------------------------------------------------------------------------------
    def _obs(self) -> Obs:
        return _view(self.state)[0]


# Per-state memos: pure functions of immutable values, so a hit returns exactly what recomputing would (the cached
# values are immutable too); bounded LRUs, 13 MiB for both when full (measured with tracemalloc). An episode revisits
# states (wall bumps, back-and-forth moves), and the rollouts of a group replay the same room from the same start
# (``envs.pool.group_tasks`` puts them on neighbouring slots).
@functools.lru_cache(maxsize=1 << 14)
def _view(state: SokobanState) -> tuple[Obs, int]:
    """The observation of a state (rendering is most of a step's cost) and its count of boxes on targets (the grid's
    ``√`` cells, which ``room.boxes_on_target(state)`` counts at ten times the cost)."""
    grid = render_room(state)
    return Obs(grid, grid, ACTIONS, INSTRUCTION), grid.count(BOX_ON_TARGET)  # text, anchor, admissible, instruction


@functools.lru_cache(maxsize=1 << 14)
def _transition(state: SokobanState, word: str) -> tuple[RoomStep, Obs]:
    """``step_room(state, word)`` and the next state's observation. A hit is one lookup instead of the push rule,
    the reward, the done check and a second lookup: ``SokobanEnv.step`` takes 0.7 µs on replayed episodes (2.5 µs
    before these memos), and 3.1 µs over rooms not seen before (3.4 µs before)."""
    room_step = step_room(state, word)
    return room_step, _view(room_step.state)[0]


@functools.lru_cache(maxsize=8)
def _manifest(split: str) -> tuple[Task, ...]:
    return tuple(Task(env="sokoban", task_id=f"sokoban-6x6-{seed}", split=split, seed=seed) for seed in SPLITS[split])


@functools.lru_cache(maxsize=1 << 14)
def _generated_room(seed: int, config: RoomConfig) -> SokobanState:
    return generate_room(seed, config)
